#!/usr/bin/env bash
# The stock-kernel lane: runs sluice's privileged tests inside qemu on a
# Debian kernel, the kernels users run (every qdisc a module), with this
# checkout and the host's root filesystem shared (virtme-ng). `make
# vmtest` runs it; `sluice lab run --kernel` runs a scenario the same way
# (this script is embedded in the binary, package vmlane).
#
#   vmlane/vmtest.sh [KERNEL]       KERNEL: 6.1 (default: Debian 12's),
#                                   6.12 (bookworm's backport), a package
#                                   version (6.1.0-56), or a vmlinuz path
#                                   whose tree holds lib/modules/VERSION
#
# Environment: VM_CACHE (default /var/lib/sluice-vm: kernels and the
# virtme-ng venv; never /boot, never the host's initramfs), VM_TIMEOUT
# (seconds for the whole guest run, default 2700: the 6.1 lane under TCG
# takes 25 to 45 minutes), VM_DEADLINE (a time in seconds since the
# epoch by which the lane must have ended, as CI's own limit: each boot
# may then run until 60 s before it, VM_TIMEOUT given or not; not for
# VM_RUN_ONLY), VM_CPUS (2), VM_MEM
# (4G), VM_KVM (auto | 0 | 1), VM_SUITES (which suites the guest runs,
# see vmlane/vmtest-guest.sh), VM_E2E_RUN (a -test.run regexp narrowing
# the lane's end-to-end tests, to rerun one), VM_PHASES (together: only
# the guest's two-at-once phase, to repeat it; both, the default),
# VM_FAULT_KILL_QEMU (seconds: kill the first boot's qemu then, to see
# the lane resume), VM_STALL (seconds the guest may write nothing
# before it counts as stalled, default 240), VM_FAULT_STALL (seconds:
# stop the first boot's watch then, to see a stall), VM_FAULT_LATE
# (seconds: the first boot's kernel then reports a soft lockup and
# restarts, to see the lane resume after a kernel that ran late),
# VM_RUN_ONLY (a command to run in the
# guest instead of the suites, for `sluice lab run --kernel`, with
# SLUICE_VM_BIN the sluice binary to use, VM_CWD its directory and
# VM_RWDIR a directory the guest may write).
#
# Exit status: the guest's (0 only when every suite passed and no test
# skipped for a feature the kernel has), 1 on a panic, a missing module
# or a stalled VM, 125 when no VM ran (a kernel argument that names no
# kernel, a download that failed), each said plainly. Output passes
# through as it comes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ -z ${VM_RUN_ONLY:-} ]]; then
  cd "$here/.."
  repo=$(pwd)
else
  repo=${VM_CWD:-$(pwd)}
fi
kernel=${1:-${KERNEL:-6.1}}
cache=${VM_CACHE:-/var/lib/sluice-vm}
timeout_s=${VM_TIMEOUT:-2700}
deadline=${VM_DEADLINE:-}
cpus=${VM_CPUS:-2}
mem=${VM_MEM:-4G}
say() { echo "vmtest: $*" >&2; }
die() { say "$*"; exit 1; }
novm() { say "$*"; exit 125; }
[[ -z $deadline || $deadline =~ ^[0-9]+$ ]] || novm "VM_DEADLINE=$deadline: want seconds since the epoch (date +%s)"
if [[ -n $deadline && -z ${VM_RUN_ONLY:-} ]] && ((deadline - $(date +%s) < 360)); then
  novm "VM_DEADLINE is $((deadline - $(date +%s)))s away: too little to run the lane (it takes 25 minutes and more)"
fi

[[ $(id -u) -eq 0 ]] || novm "needs root (network namespaces inside the guest, apt-get for what is missing)"

# --- what the lane needs on the host -------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v depmod >/dev/null || need+=(kmod)
command -v file >/dev/null || need+=(file)
command -v busybox >/dev/null || need+=(busybox-static)
command -v dpkg-deb >/dev/null || need+=(dpkg)
if ((${#need[@]})); then
  say "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p "$cache"
# virtme-ng mounts a tmpfs on /var/cache, /var/tmp and /var/log in the
# guest: the kernels must live elsewhere to be seen there.
case "$cache" in /var/cache/*|/var/tmp/*|/var/log/*|/tmp/*) novm "VM_CACHE=$cache is hidden inside the guest; use another directory";; esac
venv=$cache/venv
if [[ ! -x $venv/bin/vng ]]; then
  say "installing virtme-ng in $venv"
  python3 -m venv "$venv" 2>/dev/null || { apt-get install -y -qq python3-venv >/dev/null; python3 -m venv "$venv"; }
  "$venv/bin/pip" install -q "virtme-ng==1.42"
fi

# --- the kernel ------------------------------------------------------------
# The argument is never handed to apt as it is: a pattern (6.1*, .*)
# would fetch every kernel that matches.
if [[ $kernel == */* ]]; then
  [[ -f $kernel ]] || novm "kernel $kernel: no such file (a vmlinuz path)"
  vmlinuz=$(readlink -f "$kernel")
else
  case $kernel in
    6.1) meta=linux-image-amd64 ;;
    6.12) meta=linux-image-6.12-amd64 ;;
    *)
      [[ $kernel =~ ^[0-9]+\.[0-9]+\.[0-9]+-[0-9]+$ ]] ||
        novm "kernel $kernel: want 6.1, 6.12, a Debian package version like 6.1.0-56, or a vmlinuz path"
      meta="" ; pkg=linux-image-$kernel-amd64 ;;
  esac
  if [[ -n $meta ]]; then
    pkg=$(apt-cache show "$meta" 2>/dev/null | awk -F': ' '/^Depends:/ {print $2; exit}' | sed 's/ (.*//; s/,.*//')
    if [[ -z $pkg ]]; then
      apt-get update -qq
      pkg=$(apt-cache show "$meta" | awk -F': ' '/^Depends:/ {print $2; exit}' | sed 's/ (.*//; s/,.*//')
    fi
  fi
  [[ -n $pkg ]] || novm "no Debian kernel package for $kernel"
  ver=${pkg#linux-image-}
  dir=$cache/$ver
  if [[ ! -f $dir/boot/vmlinuz-$ver ]]; then
    say "fetching $pkg"
    (cd "$cache" && rm -f "$pkg"_*.deb && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
    deb=$(ls "$cache/$pkg"_*.deb 2>/dev/null | head -1 || true)
    [[ -n $deb ]] || novm "could not download $pkg (apt-get download; is the version one Debian has?)"
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    dpkg-deb -x "$deb" "$dir.tmp"
    rm -rf "$dir" && mv "$dir.tmp" "$dir" && rm -f "$deb"
  fi
  vmlinuz=$dir/boot/vmlinuz-$ver
fi
kver=$(file -b "$vmlinuz" | sed -n 's/.*version \([^ ,]*\).*/\1/p')
[[ -n $kver ]] || novm "$vmlinuz: not a kernel image file(1) can read"
root=$(dirname "$(dirname "$vmlinuz")")
config=$root/boot/config-$kver
[[ -f $config ]] || config=""
say "kernel $kver ($vmlinuz)"

# What the kernel has, from its own config: the guest fails a test that
# skips for one of these (scripts/vmtest-guest.sh, testutil.Feature).
features=""
if [[ -n $config ]]; then
  for f in fq:NET_SCH_FQ fq_codel:NET_SCH_FQ_CODEL sfq:NET_SCH_SFQ cake:NET_SCH_CAKE netem:NET_SCH_NETEM \
           prio:NET_SCH_PRIO mqprio:NET_SCH_MQPRIO fw:NET_CLS_FW flower:NET_CLS_FLOWER matchall:NET_CLS_MATCHALL police:NET_ACT_POLICE u32mark:CLS_U32_MARK \
           bbr:TCP_CONG_BBR cbq:NET_SCH_CBQ; do
    grep -Eq "^CONFIG_${f#*:}=(y|m)" "$config" && features+="${f%%:*},"
  done
fi
features=${features%,}
say "features per its config: ${features:-unknown (no config beside the image)}"

# --- build on the host (the guest cannot link Go programs on 9p) ----------
# VM_BUILD_ONLY=1 builds the test binaries and stops (`make test` builds
# them beside the host suite: scripts/beside.sh); VM_PREBUILT=1 then
# takes them when they were built from this very tree (the commit and
# the changes the stamp names), and builds them again otherwise. The
# package is built here, always: the host suite's package tests run
# `make deb` too, in the same directories.
if [[ -z ${VM_RUN_ONLY:-} ]]; then
  out=$repo/out/vm/$kver
  stamp="$(git -C "$repo" rev-parse HEAD 2>/dev/null) $( (git -C "$repo" status --porcelain; git -C "$repo" diff) 2>/dev/null | sha256sum | cut -c1-16)"
  if [[ ${VM_PREBUILT:-} == 1 && -f $out/.built && $(cat "$out/.built") == "$stamp" ]]; then
    say "tests built beside the host suite ($out)"
    # Only the build stays: what an earlier guest left goes.
    find "$out" -mindepth 1 -maxdepth 1 ! -name '*.test' ! -name sluice ! -name sluice-faults ! -name .built -exec rm -rf {} +
  else
    rm -rf "$out" && mkdir -p "$out"
    say "building tests"
    for p in kernel bpf e2e; do go test -c -o "$out/$p.test" "./$p"; done
    CGO_ENABLED=0 go build -o "$out/sluice" ./cmd/sluice
    CGO_ENABLED=0 go build -tags faults -o "$out/sluice-faults" ./cmd/sluice
    echo "$stamp" >"$out/.built"
  fi
  if [[ ${VM_BUILD_ONLY:-} == 1 ]]; then
    say "built in $out (VM_BUILD_ONLY)"
    exit 0
  fi
  # The package, installed and its units started in the guest
  # (TestDebUnitsStartUnderSystemd).
  deb=$(make -s deb 2>&1 | sed -n "s/^package: \(.*\.deb\)$/\1/p")
  [[ -n $deb ]] || die "make deb built no package"
  mv "$deb" "$out/sluice.deb"
else
  out=$cache/run/$kver-$$
  rm -rf "$out" && mkdir -p "$out"
  cp "${SLUICE_VM_BIN:?the sluice binary to run in the guest}" "$out/sluice"
fi

{
  for v in "SLUICE_VM_OUT=$out" "SLUICE_VM_REPO=$repo" "SLUICE_VM_KERNEL=$kver" "SLUICE_EXPECT_FEATURES=$features" \
           "SLUICE_VM_SUITES=${VM_SUITES:-}" "SLUICE_VM_E2E_RUN=${VM_E2E_RUN:-}" "SLUICE_VM_RUN_ONLY=${VM_RUN_ONLY:-}" \
           "SLUICE_VM_PHASES=${VM_PHASES:-both}" "SLUICE_VM_FAULT_STALL=${VM_FAULT_STALL:-}" \
           "SLUICE_VM_FAULT_LATE=${VM_FAULT_LATE:-}" \
           "SLUICE_MATRIX_FULL=${SLUICE_MATRIX_FULL:-}" \
           "SLUICE_TEST_DEB=$([[ -f $out/sluice.deb ]] && echo "$out/sluice.deb")"; do
    printf 'export %s=%q\n' "${v%%=*}" "${v#*=}"
  done
} >"$out/env"

export PATH=$venv/bin:$PATH
vng_args=(--run "$vmlinuz" --cpus "$cpus" --memory "$mem" --rwdir="$out")
# The kernel's console is kept (console.log): without --verbose virtme-ng
# sends it to /dev/null with loglevel=0, and a panic (panic=-1, qemu
# -no-reboot: the VM just ends) left nothing to read but exit 255
# (2026-11-28's CI). Warnings and worse only (loglevel=5): the lane's
# thousands of veth and addrconf lines are info, and a serial console is
# slow under emulation.
run_args=(--verbose --append "loglevel=5")
# A guest that stalls is asked what it is doing before it is killed
# (stall_evidence): qemu's machine protocol on a socket, the kernel
# unrandomised so that the vCPUs' instruction pointers name functions
# in the kallsyms it copies out at boot (Debian's System.map is a
# placeholder), and every SysRq allowed (the keys the socket presses).
run_args+=(--append "nokaslr sysrq_always_enabled")
# Lab reports (lab run --kernel) land in a directory of the caller's.
[[ -n ${VM_RWDIR:-} ]] && vng_args+=(--rwdir="$VM_RWDIR")

# --- KVM when it works, TCG otherwise ---------------------------------------
# Nested KVM on this project's VMs cannot run a stock kernel (qemu aborts
# on MSR 0x10a with -cpu host; other models hang before the first line):
# a short boot decides. A kernel that boots prints its first line within
# a second under KVM; one that hangs prints nothing, and is given up
# after 10 s instead of the whole 45 (every lane run paid them).
# Without vmx or svm among the CPU's flags, /dev/kvm is at most PVM
# (this project's VMs), which boots only kernels built for it: no trial.
kvm=${VM_KVM:-auto}
if [[ $kvm == auto ]]; then
  kvm=0
  if [[ -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
    rm -f "$out/kvm-ok" "$out/kvm-probe.log"
    timeout 45 vng "${vng_args[@]}" --verbose --qemu-opts="-cpu host,-arch-capabilities" --exec "touch $out/kvm-ok" >"$out/kvm-probe.log" 2>&1 &
    probe=$!
    for _ in $(seq 100); do
      grep -q 'Linux version' "$out/kvm-probe.log" 2>/dev/null && break
      kill -0 "$probe" 2>/dev/null || break
      sleep 0.1
    done
    grep -q 'Linux version' "$out/kvm-probe.log" 2>/dev/null || kill "$probe" 2>/dev/null || true
    wait "$probe" 2>/dev/null || true
    [[ -f $out/kvm-ok ]] && kvm=1
    pkill -f "qemu-system-x86_64.*$vmlinuz" 2>/dev/null || true
  fi
  say "KVM $([[ $kvm == 1 ]] && echo works || echo 'does not boot this kernel here: emulating (TCG), expect 5-15x the host times')"
fi
[[ $kvm == 1 ]] && vng_args+=(--qemu-opts="-cpu host,-arch-capabilities") || vng_args+=(--disable-kvm)
# Timing checks compare with a reference run in the same test where the
# machine is emulated (its timers fire late: every shaper loses a few %).
echo "export SLUICE_EMULATED=$((1 - kvm))" >>"$out/env"

# --- run ---------------------------------------------------------------------
log=$out/guest.log
: > "$log"
tail -n +1 -f "$log" &
tailer=$!
qmpdir=$(mktemp -d /tmp/sluice-vm.XXXXXX)
qmp=$qmpdir/qmp
run_args+=(--qemu-opts="-qmp unix:$qmp,server=on,wait=off")
# qemu's own log names a triple fault ("Triple fault", of its reset
# log). A restart is not logged as a reset under -no-reboot: the
# SHUTDOWN event below tells it. 2026-11-28's CI lost a guest 20 s
# after a kernel report, with no panic on the console and nothing else
# to tell why.
qemulog=$qmpdir/qemu.log
run_args+=(--qemu-opts="-d cpu_reset,guest_errors -D $qemulog")
# And its events, on a second machine-protocol socket (one client
# each): SHUTDOWN says why qemu ended (guest-reset: the kernel
# restarted, after a panic or on a triple fault; guest-shutdown: it
# powered off; host-signal: qemu was told to end). No event at all is
# qemu killed outright or crashed.
qmpev=$qmpdir/events
run_args+=(--qemu-opts="-qmp unix:$qmpev,server=on,wait=off")
# qemu_events: connects as soon as qemu listens, then appends each
# event to $out/qemu-events.log until qemu ends.
qemu_events() {
  "$venv/bin/python3" - "$qmpev" "$out/qemu-events.log" <<'PY'
import json, socket, sys, time
path, log = sys.argv[1], sys.argv[2]
for _ in range(1200):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit(0)
f = s.makefile("rwb")
f.readline()
f.write(b'{"execute": "qmp_capabilities"}\n'); f.flush()
with open(log, "a") as out:
    for line in f:
        m = json.loads(line)
        if "event" in m:
            out.write(json.dumps({"event": m["event"], "data": m.get("data", {})}) + "\n")
            out.flush()
PY
}
trap 'kill $tailer 2>/dev/null || true; rm -rf "$qmpdir"' EXIT
cp "$here/vmtest-guest.sh" "$out/guest.sh"
stall_s=${VM_STALL:-240}
[[ $stall_s =~ ^[1-9][0-9]*$ ]] || die "VM_STALL=$stall_s: want seconds"
# stall_evidence: where a stalled guest's CPUs are (twice, 10 s apart:
# halted, in the kernel at a function of the kallsyms the guest copied
# out, or in a program), and its
# kernel's word through SysRq keys pressed on its keyboard: 9 (the
# console at every level), w (the tasks blocked, with their stacks),
# l (each CPU's backtrace). qemu's own silence means qemu hung.
stall_evidence() {
  "$venv/bin/python3" - "$qmp" "$out/kallsyms" <<'PY'
import bisect, json, re, socket, sys, time
sock, kallsyms = sys.argv[1], sys.argv[2]
addrs, names = [], []
try:
    for line in open(kallsyms):
        a, t, n = line.split()[:3]
        if t in "tTwW":
            addrs.append(int(a, 16)); names.append(n)
    order = sorted(range(len(addrs)), key=addrs.__getitem__)
    addrs = [addrs[i] for i in order]; names = [names[i] for i in order]
except OSError:
    pass
def where(rip):
    i = bisect.bisect_right(addrs, rip) - 1
    return f"{names[i]}+{rip - addrs[i]:#x}" if i >= 0 and rip - addrs[i] < 1 << 20 else f"{rip:#x}"
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(sock)
    f = s.makefile("rwb")
    def cmd(name, **args):
        msg = {"execute": name}
        if args:
            msg["arguments"] = args
        f.write(json.dumps(msg).encode() + b"\n"); f.flush()
        while True:
            m = json.loads(f.readline())
            if "return" in m or "error" in m:
                return m.get("return", m.get("error"))
    f.readline()
    cmd("qmp_capabilities")
    hmp = lambda line: cmd("human-monitor-command", **{"command-line": line})
    print("vmtest: qemu:", hmp("info status").strip())
    def cpus():
        for cpu, body in re.findall(r"CPU#(\d+)\n(.*?)(?=\nCPU#|\Z)", hmp("info registers -a").replace("\r", ""), re.S):
            rip = int(re.search(r"RIP=([0-9a-f]+)", body).group(1), 16)
            cpl = re.search(r"CPL=(\d)", body).group(1)
            hlt = re.search(r"HLT=(\d)", body).group(1)
            state = "halted" if hlt == "1" else ("in a program" if cpl == "3" else "in the kernel")
            print(f"vmtest:   CPU {cpu}: {state}, at {where(rip) if cpl == '0' else hex(rip)}")
    cpus()
    for key in "9wl":
        cmd("send-key", keys=[{"type": "qcode", "data": k} for k in ("alt", "sysrq", key)])
        time.sleep(2)
    time.sleep(8)
    cpus()
except (OSError, ValueError) as e:
    print(f"vmtest: qemu's monitor did not answer ({e}): qemu hung, or ended meanwhile")
PY
}
# The kernel's reports by their first line: those that only say the
# kernel ran late (a soft lockup, an RCU stall, a task blocked for
# minutes) are what an emulated CPU that falls behind its timers
# produces; any other (a panic, an oops, a WARN, an OOM) is the
# kernel's own failure.
headline='Kernel panic|BUG:|Oops|general protection fault|WARNING: CPU|watchdog:|INFO: task .* blocked|rcu: INFO|detected stalls|Out of memory|invoked oom-killer|kernel BUG at|invalid opcode'
late='soft lockup|workqueue lockup|rcu: INFO: rcu_(preempt|sched) (self-)?detected|detected stalls on CPUs|INFO: task .* blocked for more than'
# What the kernel says that a test would not: those reports, and any
# trace whose first line was below the console's level.
oops="$headline|RIP:|Call Trace"
# ending_summary: after a guest that left no status, the short account
# that ends the lane's output (what CI shows first): the kernel's
# reports' first lines, what qemu logged of the end, the test that was
# running. Sets slow_only=1 when every report only says the kernel ran
# late.
ending_summary() {
  local heads reason lastrun s
  heads=$(sed '/sysrq: Changing Loglevel/,$d' "$out/console.log" 2>/dev/null | grep -aE "$headline" | head -8 || true)
  slow_only=0
  if [[ -n $heads ]] && ! grep -qvE "$late" <<<"$heads"; then
    slow_only=1
  fi
  if [[ -n $heads ]]; then
    say "the guest's kernel reported (first lines):"
    sed 's/^/vmtest:   /' <<<"$heads" >&2
  elif [[ -n $said ]]; then
    say "the guest's kernel printed a trace whose first line was below the console's level (loglevel=5)"
  else
    say "the guest's kernel reported nothing"
  fi
  # (|| true: a qemu killed outright logged no SHUTDOWN, and grep's
  # status would end the lane here, before the second boot; 2026-12-06.)
  reason=$(grep '"SHUTDOWN"' "$out/qemu-events.log" 2>/dev/null | tail -1 | sed -n 's/.*"reason": "\([^"]*\)".*/\1/p' || true)
  case $reason in
    guest-reset) reason="the guest restarted (its kernel after a panic, SysRq b, or a triple fault)";;
    guest-shutdown) reason="the guest powered off";;
    guest-panic) reason="the guest panicked";;
    host-signal) reason="qemu was sent a signal to end";;
    "") reason="no shutdown event: qemu was killed outright or crashed";;
  esac
  grep -q "Triple fault" "$out/qemu.log" 2>/dev/null && reason="the guest triple-faulted"
  say "qemu: $reason ($out/qemu-events.log, $out/qemu.log)"
  for s in kernel bpf e2e-imports e2e-checks e2e; do
    [[ -f $out/$s.log && ! -f $out/$s.rc ]] || continue
    lastrun=$(grep -E '^=== RUN' "$out/$s.log" | tail -1 | awk '{print $3}' || true)
    say "suite $s was running${lastrun:+; its last test started: $lastrun}"
  done
}
# A guest that ends with no status and nothing on its kernel's console
# was not ended by its kernel (which prints a panic, an oops, a lockup
# there) but by the emulator: the suites it did not finish run again in
# a new VM, once (the guest skips those with an exit status), as do
# those of a guest whose kernel only reported that it ran late. A lab
# run (VM_RUN_ONLY) is not resumed.
boots=1
[[ -z ${VM_RUN_ONLY:-} ]] && boots=2
for boot in $(seq "$boots"); do
  start=$(date +%s)
  # Under a deadline (CI's limit) a boot runs as long as it leaves: a
  # slow machine's lane then ends by the deadline, not by a guess.
  if [[ -n $deadline && -z ${VM_RUN_ONLY:-} ]]; then
    timeout_s=$((deadline - start - 60))
    ((timeout_s >= 300)) || die "VM_DEADLINE leaves ${timeout_s}s for boot $boot: too little to run the lane"
    say "boot $boot may run ${timeout_s}s (VM_DEADLINE)"
  fi
  # The guest sizes its timed suite's go test limit to this boot's.
  echo "export SLUICE_VM_TIMEOUT=$timeout_s" >>"$out/env"
  # VM_FAULT_KILL_QEMU=SECONDS kills the first boot's qemu that long
  # after it starts: the emulator's end, injected (docs/kernels.md).
  if [[ -n ${VM_FAULT_KILL_QEMU:-} && $boot == 1 ]]; then
    (sleep "$VM_FAULT_KILL_QEMU"; pkill -KILL -f "qemu-system-x86_64.*$out" || true) &
  fi
  rm -f "$qmp" "$qmpev" "$out/qemu-events.log"
  # The stall clock reads this boot's watch, not the last one's.
  [[ -f $out/watch.log ]] && mv "$out/watch.log" "$out/watch.$((boot - 1)).log"
  timeout --kill-after=10 "$timeout_s" vng "${vng_args[@]}" "${run_args[@]}" --exec "bash $out/guest.sh $out/env" >"$out/console.log" 2>&1 &
  vm=$!
  qemu_events &
  events=$!
  # The guest's watch writes every 30 s: silence for VM_STALL seconds
  # is a stall, asked about and ended here instead of at VM_TIMEOUT
  # (2026-11-28's CI waited 24 minutes on a silent guest). Lab runs
  # have no watch.
  stalled=0
  while kill -0 "$vm" 2>/dev/null; do
    sleep 5
    [[ -n ${VM_RUN_ONLY:-} || -f $out/status ]] && continue
    last=$start
    [[ -f $out/watch.log ]] && last=$(stat -c %Y "$out/watch.log")
    if (( $(date +%s) - last > stall_s )); then
      stalled=1
      say "the guest wrote nothing for ${stall_s}s (VM_STALL): asking its kernel what it is doing, then ending it"
      stall_evidence >&2 || true
      pkill -KILL -f "qemu-system-x86_64.*$qmp" || true
      break
    fi
  done
  set +e
  wait "$vm"
  rc=$?
  set -e
  sleep 1
  took=$(( $(date +%s) - start ))
  cp "$qemulog" "$out/qemu.log" 2>/dev/null || true
  kill "$events" 2>/dev/null || true
  # A panic ends the run here; the rest is printed and the guest's own
  # status decides. What the SysRq keys of a stall made the kernel say
  # is evidence, printed, and not the kernel's own word.
  said=$(sed '/sysrq: Changing Loglevel/,$d' "$out/console.log" 2>/dev/null | grep -E -B2 -A40 "$oops" | head -150 || true)
  if [[ -n $said ]]; then
    say "the kernel's console ($out/console.log) has:"
    echo "$said" >&2
  fi
  if [[ -n $said ]] && grep -q "Kernel panic" "$out/console.log"; then
    die "kernel $kver panicked (after ${took}s)"
  fi
  # What the guest was doing last (vmtest-guest.sh's watch), where it
  # did not finish.
  if [[ ! -f $out/status && -f $out/watch.log ]]; then
    say "the guest's last readings ($out/watch.log):"
    tail -n 40 "$out/watch.log" >&2
  fi
  if ((stalled)); then
    say "what the guest's kernel said when asked ($out/console.log, from its SysRq lines):"
    # Less the info lines the lab's namespaces add at every level.
    sed -n '/sysrq: Changing Loglevel/,$p' "$out/console.log" |
      grep -vE 'renamed from|entered (disabled|blocking|forwarding) state|promiscuous mode|ADDRCONF|tx_queue_len zero' | head -300 >&2
  fi
  if [[ $rc == 124 || $rc == 137 ]]; then
    die "the VM stalled: killed after ${timeout_s}s (${deadline:+VM_DEADLINE, }VM_TIMEOUT); the guest's log is $log"
  fi
  [[ -f $out/status ]] && break
  tail -30 "$out/console.log" >&2
  # qemu itself killed or crashed (the host's OOM killer, a segfault)
  # says so in the host's log, not the guest's.
  host=$(dmesg 2>/dev/null | grep -iE 'qemu|out of memory|oom-kill|killed process' | tail -5 || true)
  [[ -n $host ]] && say "the host's kernel log: $host"
  ending_summary
  if ((boot < boots)) && [[ -z $said || $slow_only == 1 ]]; then
    if ((stalled)); then
      say "the guest stalled after ${took}s with nothing on its kernel's console. Booting again for the tests it did not finish (the first boot's console: $out/console.$boot.log)"
    elif [[ -n $said ]]; then
      say "the guest ended without a status (qemu exit $rc after ${took}s) after its kernel reported only that it ran late (above): the emulator fell behind. Booting again for the suites it did not finish (the first boot's console: $out/console.$boot.log)"
    else
      say "the guest ended without a status (qemu exit $rc after ${took}s) and its kernel said nothing: the emulator ended it. Booting again for the suites it did not finish (the first boot's console: $out/console.$boot.log)"
    fi
    mv "$out/console.log" "$out/console.$boot.log"
    [[ -f $out/qemu.log ]] && mv "$out/qemu.log" "$out/qemu.$boot.log"
    [[ -f $out/qemu-events.log ]] && mv "$out/qemu-events.log" "$out/qemu-events.$boot.log"
    echo "export SLUICE_VM_RESUME=1" >>"$out/env"
    continue
  fi
  die "the guest ended without a status (qemu exit $rc after ${took}s): see $out/console.log"
done
kill $tailer 2>/dev/null || true
status=$(cat "$out/status")
say "kernel $kver: guest done in ${took}s, status $status"
exit "$status"
