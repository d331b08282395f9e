#!/bin/bash
# Runs inside the stock-kernel lane's guest (vmlane/vmtest.sh): loads the
# modules the tests need, runs the suites built on the host, counts what
# ran, skipped and failed, and leaves the exit status in $OUT/status.
. "$1"
out=$SLUICE_VM_OUT
# The conformance matrix writes its rows here (docs/sharing.md).
export SLUICE_MATRIX_OUT=$out
exec >>"$out/guest.log" 2>&1
echo "guest: kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MB"
status=0
fail() { echo "guest: FAIL: $*"; status=1; }

# Every module a test may need, loaded up front so that a missing one is
# a failure that names it (the kernel would load most on demand).
declare -A expect
for f in ${SLUICE_EXPECT_FEATURES//,/ }; do expect[$f]=1; done
for m in sch_htb sch_tbf sch_ingress cls_u32 cls_bpf act_mirred ifb veth tun bridge nf_tables \
         sch_fq:fq sch_fq_codel:fq_codel sch_sfq:sfq sch_cake:cake sch_netem:netem sch_prio:prio \
         sch_mqprio:mqprio cls_fw:fw act_police:police tcp_bbr:bbr sch_cbq:cbq; do
  mod=${m%%:*} feat=${m#*:}
  [[ $feat == "$m" ]] && feat=""
  if ! modprobe "$mod" 2>/dev/null; then
    if [[ -z $feat || -n ${expect[$feat]:-} ]]; then
      fail "module $mod missing: the kernel's config has it, /lib/modules/$(uname -r) does not"
    else
      echo "guest: $mod not in this kernel (its config says so)"
    fi
  fi
done
# The kernel's functions, for the host to name where a stalled guest's
# CPUs are (vmtest.sh: Debian's System.map is a placeholder; the lane
# boots with nokaslr, so these addresses hold for the whole boot).
grep ' [tTwW] ' /proc/kallsyms >"$out/kallsyms" 2>/dev/null || true
sysctl -qw net.ipv4.tcp_available_congestion_control >/dev/null 2>&1 || true
echo "guest: congestion controls: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control)"

# The binaries run from the guest's memory, not from $out: the host's
# directories are 9p mounts without a page cache, so every exec read the
# whole binary again through the emulated virtio (sluice's start took
# 1.2 to 2.6 s from $out, 0.3 s from tmpfs, 2026-11-26), and the tests
# start sluice hundreds of times.
bin=/run/sluice-lane-bin
mkdir -p "$bin"
for f in "$out"/sluice "$out"/sluice-faults "$out"/*.test; do
  [[ -f $f ]] && cp "$f" "$bin/"
done
# tc and ip and their libraries too (libbpf, libelf: tc took 210 ms to
# start from 9p, 100 from memory; TestRollbackAtEveryStep, which reads
# the kernel back with tc after each of its 80 faults, 204 s -> 145 s),
# bound over their paths so that every caller gets them.
tools=/run/sluice-lane-tools
mkdir -p "$tools"
for f in $(command -v tc) $(command -v ip) $(ldd "$(command -v tc)" "$(command -v ip)" | awk '/=> \// {print $3}' | sort -u); do
  f=$(readlink -f "$f")
  copy=$tools/$(basename "$f")
  cp "$f" "$copy" && mount --bind "$copy" "$f" || echo "guest: $f stays on 9p"
done
export CI=true
export SLUICE_TEST_BIN=$bin/sluice SLUICE_TEST_FAULT_BIN=$bin/sluice-faults
export PATH=$bin:$out:$PATH
export TMPDIR=/tmp GOTMPDIR=/tmp

if [[ -n $SLUICE_VM_RUN_ONLY ]]; then
  cd "$SLUICE_VM_REPO"
  bash -c "$SLUICE_VM_RUN_ONLY"
  echo $? >"$out/status"
  exit 0
fi

# The lane runs what differs on a stock kernel: the kernel layer and BPF
# in full, and the end-to-end tests that use a feature the host lacks
# (leaves, marks, netem, congestion controls) or that check kernel
# semantics (classification, rollback, ownership, export), and the
# package installed and its units started under systemd.
#
# Two at a time, then one. The emulated machine runs a test on about one
# of its two CPUs, and most of the lane's tests measure nothing in time:
# they apply, kill, classify and read back. Those run in two processes at
# once (the kernel and BPF suites and the importers' tests beside the
# other checks); the tests that measure rates, delays or shares run
# after them, alone, as on the host. (Serial, the lane took 29.5 min,
# 12 of them in the checks; two at once, the checks took 7.5 min,
# 2026-11-27.)
e2e_imports='TestImported[A-Za-z]*'
# Of the importers' tests, LibreQoS's holds each circuit's rate to its
# original's, under six floods: beside the checks both trees fell short
# alike (2.09 against 2.47 Mbit/s where HTB gives 2.5 to 3.2, once), so
# it runs alone.
e2e_imports_timed='TestImportedLibreQoSClassifiesAsTheOriginal'
e2e_checks='TestFeaturesTheKernelMayLack|TestDoctorAgreesWithTC|TestPlanApplyShowReset|TestExportReproducesApply|TestExportBPFTreeAsU32|TestExportMarkRuleReproducesClassification|TestCraftedPacketsLandInTheirClass|TestBPFClassifierMatchesPolicy|TestBPFHostsFileAndMark|TestBPFOneHostChange|TestMarkedPacketsReachTheirClass|TestSharedClsactAndForeignFilters|TestReplacedRootIsForeign|TestMissingShardIsRepaired|TestEDTApplyPlanShowReset|TestEDTKilledApplyIsRecovered|TestEDTHostsPatchKilledAtEveryWrite|TestMigrationTakesOverTheIngress'
# The package's units run alone too: beside the other checks, systemd
# SIGKILLed the agent as it stopped (its stop timeout is 5 s), once.
e2e_timed='TestDebUnitsStartUnderSystemd|'"$e2e_imports_timed"'|TestBPFIngressPolicer|TestDelayLine|TestNetemDelayAndLoss|TestMatrixSkipsMissingLeaves|TestEgressLimit20mbit|TestIngressLimit20mbit|TestCCMatrixFillsEveryRow|TestDemoOnStockKernel|TestEDT[A-Za-z]*|TestFairShareScenario|TestVariableRateScenario|TestConformanceMatrix|TestConformanceDrivesEveryRuleKind|TestGeneratedPolicies|TestSharingCapHoldsWithoutTheAgent|TestSharingMeetsALoadStart|TestPassiveRTTAgreesWithPing|TestPassiveRTTAsymmetricRoute'
# A test named in both lists runs once, with the checks.
e2e_default="^($e2e_imports|$e2e_checks|$e2e_timed)\$"
# The delay line's loss runs on the host (its kernel lacks netem); here
# netem carries loss, and TestDelayLine covers the line's delay.
e2e_skip='TestNetemDelayAndLoss/line'
suites=${SLUICE_VM_SUITES:-kernel bpf e2e}

# What the guest is doing, every 30 s, in $out/watch.log: a stalled
# lane (run Q, 2026-11-28: both of the two-at-once suites silent for
# 8 minutes, both CPUs busy, no file written) leaves evidence behind.
watch() {
  local prev="" now
  while sleep 30; do
    {
      echo "--- $(date +%T) load $(cut -d' ' -f1-4 /proc/loadavg), MB available $(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo), in tmpfs $(awk '/Shmem:/ {print int($2/1024)}' /proc/meminfo)"
      ps -eo pid,stat,pcpu,etime,comm --sort=-pcpu | head -8
      now=$(awk '/NET_RX|NET_TX|TIMER|SCHED/ {s = 0; for (i = 2; i <= NF; i++) s += $i; printf "%s%s ", $1, s}' /proc/softirqs)
      echo "softirqs: $now (30 s before: ${prev:-none})"
      prev=$now
      dmesg | tail -n 5
    } >>"$out/watch.log" 2>&1
  done
}
watch &
watcher=$!
# VM_FAULT_STALL=SECONDS (vmtest.sh) stops the watch that long into the
# first boot: the host sees a stall while the kernel still answers.
if [[ -n ${SLUICE_VM_FAULT_STALL:-} && -z ${SLUICE_VM_RESUME:-} ]]; then
  (sleep "$SLUICE_VM_FAULT_STALL"; kill -STOP $watcher) &
fi
# VM_FAULT_LATE=SECONDS: that long into the first boot the kernel
# reports a soft lockup and restarts at once, as a guest whose emulated
# CPU fell behind did in 2026-11-28's CI: the host boots again for the
# rest.
if [[ -n ${SLUICE_VM_FAULT_LATE:-} && -z ${SLUICE_VM_RESUME:-} ]]; then
  (sleep "$SLUICE_VM_FAULT_LATE"
   echo "<4>watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [vmtest-fault:0]" >/dev/kmsg
   sleep 2; echo b >/proc/sysrq-trigger) &
fi

# run LOG PKG [ARGS...]: PKG's test binary, its output in $out/LOG.log,
# its exit status and seconds beside it. TIMEOUT (default 40m) is go
# test's: a suite that hangs panics with every goroutine's stack.
run() {
  local log=$1 pkg=$2 start=$(date +%s)
  shift 2
  # A second boot after the emulator ended the first (vmtest.sh) runs
  # only what did not finish.
  if [[ -n ${SLUICE_VM_RESUME:-} && -f $out/$log.rc ]]; then
    echo "guest: $log finished in the first boot"
    return
  fi
  # A suite the first boot left midway keeps what it finished: its log
  # up to the last test that ended, those tests skipped now. One that
  # failed there fails the suite.
  local done="" failed=0
  if [[ -n ${SLUICE_VM_RESUME:-} && -s $out/$log.log ]]; then
    mv "$out/$log.log" "$out/$log.1.log"
    local n
    n=$(grep -nE '^--- (PASS|FAIL|SKIP): ' "$out/$log.1.log" | tail -1 | cut -d: -f1)
    if [[ -n $n ]]; then
      head -n "$n" "$out/$log.1.log" >"$out/$log.log"
      done=$(sed -nE 's/^--- (PASS|FAIL|SKIP): ([^ ]+) .*/\2/p' "$out/$log.log" | paste -sd'|')
      grep -qE '^--- FAIL: ' "$out/$log.log" && failed=1
      echo "guest: $log: the first boot finished $(grep -cE '^--- (PASS|FAIL|SKIP): ' "$out/$log.log") of its tests; the rest run now"
    fi
    echo "guest: === resumed in a second boot" >>"$out/$log.log"
  else
    : >"$out/$log.log"
  fi
  if [[ -n $done ]]; then
    # -test.skip takes one pattern: the finished tests join any given.
    local args=() skip="^($done)\$" merged=0 next=0 a
    for a in "$@"; do
      if ((next)); then a="$a|$skip" merged=1 next=0; fi
      [[ $a == -test.skip ]] && next=1
      args+=("$a")
    done
    ((merged)) || args+=(-test.skip "$skip")
    set -- "${args[@]}"
  fi
  (cd "$SLUICE_VM_REPO/$pkg" && "$bin/$pkg.test" -test.v -test.count=1 -test.timeout="${TIMEOUT:-40m}" "$@") >>"$out/$log.log" 2>&1
  local rc=$?
  ((failed && rc == 0)) && rc=1
  echo $rc >"$out/$log.rc"
  echo $(( $(date +%s) - start )) >"$out/$log.secs"
}
# speed_probe: how fast this guest runs, before the tests that measure:
# their rates are sized for the guest's speed, and a CI machine that
# emulates slowly (2026-12-01: the whole guest took 2,256 s where five
# runs before took 1,367 to 1,432) fails them in ways that look like
# the shaper's. Two figures, each the best of its runs: the CPU (the
# SHA-256 of 16 MB, three times: what emulation slows most) and what
# one TCP flow carries between two namespaces (two 2 s runs). The line
# says how fast this guest was; $out/speed keeps it.
speed_probe() {
  local a=sllab-speed-a b=sllab-speed-b best=0 sha=0 i bps s e
  for i in 1 2 3; do
    s=$(date +%s%N)
    head -c 16M /dev/zero | sha256sum >/dev/null
    e=$(( ($(date +%s%N) - s) / 1000000 ))
    ((sha == 0 || e < sha)) && sha=$e
  done
  if ip netns add $a && ip netns add $b; then
    if ip link add sp0 netns $a type veth peer name sp1 netns $b &&
      ip -n $a addr add 10.254.77.1/30 dev sp0 && ip -n $b addr add 10.254.77.2/30 dev sp1 &&
      ip -n $a link set sp0 up && ip -n $b link set sp1 up && ip -n $b link set lo up; then
      for i in 1 2; do
        ip netns exec $b timeout 20 iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
        local server=$!
        sleep 1
        bps=$(ip netns exec $a timeout 15 iperf3 -c 10.254.77.2 -p 5299 -t 2 -J 2>/dev/null | awk -F'[:,]' '/"sum_received"/ {r = 1} r && /"bits_per_second"/ {print int($2); exit}')
        wait $server # only the server: a bare wait waits for the watch too
        [[ $bps =~ ^[0-9]+$ ]] && ((bps > best)) && best=$bps
      done
    fi
    ip netns del $a; ip netns del $b
  fi
  echo "sha256-16MB-ms $sha veth-tcp-mbit $((best / 1000000))" >"$out/speed"
  echo "guest: speed: the SHA-256 of 16 MB in $sha ms, one TCP flow between two namespaces $((best / 1000000)) Mbit/s (docs/kernels.md has what other runs read)"
}
# timed_timeout: go test's limit for the suite that measures: what this
# boot has left (vmtest.sh's limit, SLUICE_VM_TIMEOUT, since this script
# began) less two minutes for the summary, and 40 minutes at least. A
# slow machine (CI under a deadline) then gets the time it was given,
# and a test that hangs still ends in a panic with every stack.
timed_timeout() {
  local left=$(( ${SLUICE_VM_TIMEOUT:-2700} - SECONDS - 120 ))
  ((left < 2400)) && left=2400
  echo "${left}s"
}
has() { [[ " $suites " == *" $1 "* ]]; }
logs=()
if has e2e && [[ -z ${SLUICE_VM_E2E_RUN:-} ]]; then
  echo "guest: === two at once: $(for s in kernel bpf; do has $s && printf '%s, ' "$s"; done)the importers' tests | the other checks"
  # They take 2 to 6 minutes: 15 leaves the timed suite time to run
  # after a hang, inside the VM's own limit.
  (
    for s in kernel bpf; do has $s && TIMEOUT=15m run $s $s; done
    TIMEOUT=15m run e2e-imports e2e -test.run "^($e2e_imports)\$" -test.skip "^($e2e_imports_timed)\$"
  ) &
  first=$!
  TIMEOUT=15m run e2e-checks e2e -test.run "^($e2e_checks)\$" &
  wait $first $!
  for s in kernel bpf; do has $s && logs+=($s); done
  logs+=(e2e-imports e2e-checks)
  # SLUICE_VM_PHASES=together (VM_PHASES) stops here: the phase alone,
  # again and again, where it once ended the VM (2026-11-28).
  if [[ ${SLUICE_VM_PHASES:-both} != together ]]; then
    echo "guest: === alone: the tests that measure"
    speed_probe
    TIMEOUT=$(timed_timeout) run e2e e2e -test.run "^($e2e_timed)\$" -test.skip "^($e2e_checks)\$|$e2e_skip"
    logs+=(e2e)
  fi
else
  # SLUICE_VM_E2E_RUN (make vmtest VM_E2E_RUN=REGEXP) narrows e2e, to
  # rerun one test on a kernel: one suite at a time.
  for s in $suites; do
    if [[ $s == e2e ]]; then
      speed_probe
      run e2e e2e -test.run "${SLUICE_VM_E2E_RUN:-$e2e_default}" -test.skip "$e2e_skip"
    else
      run $s $s
    fi
    logs+=($s)
  done
fi

total_run=0 total_skip=0 total_fail=0
for s in "${logs[@]}"; do
  echo "guest: === suite $s"
  grep -E '^\s*--- (PASS|FAIL|SKIP)|^(PASS|FAIL|ok)|^panic:' "$out/$s.log"
  n=$(grep -cE '^\s*--- (PASS|FAIL)' "$out/$s.log" || true)
  k=$(grep -cE '^\s*--- SKIP' "$out/$s.log" || true)
  f=$(grep -cE '^\s*--- FAIL' "$out/$s.log" || true)
  total_run=$((total_run + n)) total_skip=$((total_skip + k)) total_fail=$((total_fail + f))
  echo "guest: suite $s: $n ran, $k skipped, $f failed, $(cat "$out/$s.secs")s"
  if ((k > 0)); then
    awk '/^=== (RUN|CONT)/ {cur = $3}
         /^[ \t]+[A-Za-z0-9_]+\.go:[0-9]+: / {m = $0; sub(/^[ \t]+/, "", m); msg[cur] = m}
         /--- SKIP: / {print "guest:   skipped: " $3 ": " msg[$3]}' "$out/$s.log"
  fi
  rc=$(cat "$out/$s.rc")
  if [[ $rc != 0 ]]; then
    fail "suite $s (exit $rc)"
    if [[ -f $SLUICE_VM_REPO/scripts/failed-output.awk ]]; then
      awk -v keep=60 -f "$SLUICE_VM_REPO/scripts/failed-output.awk" "$out/$s.log" | head -400
    else
      grep -E -B30 '^\s*--- FAIL' "$out/$s.log" | head -150
    fi
    grep -E -A30 '^panic:' "$out/$s.log" | head -100
  fi
done
echo "guest: kernel $(uname -r): $total_run tests ran, $total_skip skipped, $total_fail failed"
kill $watcher 2>/dev/null
echo $status >"$out/status"
