#!/bin/busybox sh
# The arm64 smoke lane's /init (vmlane/arm64.sh): busybox as the whole
# userland, the static sluice, and a dummy device to shape. Each step
# prints "smoke: ..."; the last line is "smoke: passed" or
# "smoke: FAILED: STEP". The guest powers off either way.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
mount -t tmpfs lib /var/lib
mount -t bpf bpf /sys/fs/bpf 2>/dev/null

end() {
  echo "smoke: $1"
  sync
  poweroff -f
}
fail() { end "FAILED: $*"; }
# want STEP FILE TEXT: FILE holds TEXT, else the step fails, showing it.
want() {
  grep -q -- "$3" "$2" && return
  cat "$2"
  fail "$1: no \"$3\" in its output"
}

echo "smoke: kernel $(uname -r) on $(uname -m)"
while read -r ko; do
  insmod "$ko" 2>/tmp/insmod || ! grep -qv "File exists" /tmp/insmod || fail "insmod $ko: $(cat /tmp/insmod)"
done </modules.load
ip link set lo up
ip link add d0 type dummy || fail "ip link add d0 type dummy"
ip link set d0 up
ip addr add 10.99.0.1/24 dev d0

cat >/etc/bpf.yaml <<'EOF'
interfaces:
  - name: d0
    egress:
      rate: 10mbit
      classifier: bpf
      default: bulk
      classes:
        - {name: voip, rate: 1mbit, prio: 0, match: [{proto: udp, dport: 5060}]}
        - {name: web, rate: 4mbit, ceil: 10mbit, match: [{proto: tcp, dport: 443}, {dst: 10.99.0.0/28}]}
        - {name: bulk, rate: 2mbit, ceil: 10mbit}
EOF
sed 's/classifier: bpf/classifier: u32/' /etc/bpf.yaml >/etc/u32.yaml

sluice version >/tmp/out 2>&1 || fail "version"
want version /tmp/out linux/arm64
echo "smoke: $(head -1 /tmp/out)"
sluice doctor >/tmp/out 2>&1 || { cat /tmp/out; fail "doctor"; }
want doctor /tmp/out htb
for p in bpf u32; do
  sluice apply /etc/$p.yaml >/tmp/out 2>&1 || { cat /tmp/out; fail "apply ($p)"; }
  sluice show d0 >/tmp/out 2>&1 || { cat /tmp/out; fail "show ($p)"; }
  want "show ($p)" /tmp/out voip
  want "show ($p)" /tmp/out web
  sluice plan /etc/$p.yaml >/tmp/out 2>&1 || { cat /tmp/out; fail "plan ($p)"; }
  want "plan after apply ($p)" /tmp/out "no changes"
  echo "smoke: $p tree applied, shown, planned again with no changes"
done
sluice export /etc/bpf.yaml --format tc >/tmp/out 2>&1 || { cat /tmp/out; fail "export"; }
want export /tmp/out "qdisc add dev d0 root"
sluice reset d0 >/tmp/out 2>&1 || { cat /tmp/out; fail "reset"; }
tc_left=$(sluice show d0 2>&1 | grep -c voip)
[ "$tc_left" = 0 ] || fail "reset left the tree in place"
echo "smoke: export and reset"

sluice agent /etc/bpf.yaml --listen 127.0.0.1:9464 >/tmp/agent.log 2>&1 &
agent=$!
ok=""
for i in $(seq 1 600); do
  if wget -q -O /tmp/metrics http://127.0.0.1:9464/metrics 2>/dev/null && grep -q 'sluice_reconcile_total{result="ok"}' /tmp/metrics; then
    ok=1
    break
  fi
  sleep 1
done
[ -n "$ok" ] || { cat /tmp/agent.log; fail "the agent served no reconciled /metrics in 600 s"; }
want "agent metrics" /tmp/metrics sluice_build_info
kill "$agent"
wait "$agent" 2>/dev/null
sluice show d0 >/tmp/out 2>&1
want "the agent's tree" /tmp/out voip
echo "smoke: the agent applied, reconciled and served /metrics"
end passed
