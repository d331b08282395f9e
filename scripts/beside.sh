#!/usr/bin/env bash
# The CPU work of `make test` that has no clock to keep, run beside the
# host suite at the lowest CPU and I/O priority: the host suite's traffic
# mostly waits on the clock, and nice 19 takes only what it leaves.
# Nice ranks processes within their session's autogroup only (kernels
# built with SCHED_AUTOGROUP, Debian's among them, schedule each session
# as one group): the chain, a session of its own, sets its group's nice
# to 19 too, or it would take half of the CPU from the timed tests.
#
#   beside.sh start   start the chain in the background and return
#   beside.sh wait    wait for it; print each step's result; fail if one failed
#   beside.sh stop    end it (the host suite failed: nothing more runs)
#
# The chain, one step at a time:
#   kubeapi  the API server and etcd for test-kubernetes (scripts/kubeapi.sh);
#   race     the unit tests' race-detector builds, so that `make unit`
#            afterwards only links and runs them (a cold race build is
#            most of its five minutes);
#   lane     the stock-kernel lane's kernel, tools and test binaries
#            (vmlane/vmtest.sh with VM_BUILD_ONLY=1, KERNEL as make's),
#            which `make vmtest VM_PREBUILT=1` afterwards takes when the
#            tree has not changed since;
#   arm64    the arm64 smoke lane (vmlane/arm64.sh): an emulated guest
#            whose steps keep no clock but a generous timeout;
#   fuzz     every fuzz target for FUZZTIME (default 10s). A fuzzer has no
#            deadline to miss: starved, it only runs fewer inputs.
# No test that measures time runs here: the unit tests run after the host
# suite, in the foreground. The host suite's tests held to the tightest
# references stop the chain (SIGSTOP to its process group, whose leader's
# pid is out/beside/pid) while they measure, and continue it after
# (testutil.Quiet); wait and stop continue it too, should a test binary
# have died between the two.
#
# Each step writes out/beside/STEP.log and STEP.rc. The chain holds a
# lock on out/beside/.lock while it runs; wait takes it.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=out/beside
MAKE=${MAKE:-make}
GO=${GO:-go}

case ${1:-} in
start)
	mkdir -p "$dir"
	exec 9>"$dir/.lock"
	flock -n 9 || { echo "beside.sh: a chain is already running (out/beside/.lock)" >&2; exit 1; }
	rm -f "$dir"/*.log "$dir"/*.rc "$dir/pid"
	# The child inherits the locked descriptor: the lock lasts as long as
	# the chain, whatever happens to this shell.
	setsid nice -n 19 ionice -c 3 bash "$0" run 9>&9 </dev/null >"$dir/chain.log" 2>&1 &
	echo $! >"$dir/pid"
	# The chain says what priority it got before its first step.
	for _ in $(seq 50); do
		grep -q '^priority:' "$dir/chain.log" 2>/dev/null && break
		sleep 0.1
	done
	prio=$(grep '^priority:' "$dir/chain.log" 2>/dev/null)
	if [[ $prio != "priority: nice 19, autogroup nice 19" && $prio != "priority: nice 19, no autogroup" ]]; then
		"$0" stop
		echo "beside.sh: the chain did not get the lowest priority (${prio:-no answer}): it would slow the timed tests" >&2
		exit 1
	fi
	echo "beside: kubeapi, race, lane, arm64 and fuzz started at ${prio#priority: } (out/beside/)"
	;;
run)
	# setsid made this chain a session, so an autogroup of its own where
	# the kernel has them: its nice is what ranks it beside the suite.
	ag="no autogroup"
	if [[ -e /proc/self/autogroup ]]; then
		echo 19 >/proc/self/autogroup 2>/dev/null || true
		ag="autogroup $(sed -n 's/.* nice \(-*[0-9]*\)$/nice \1/p' /proc/self/autogroup)"
	fi
	echo "priority: nice $(nice), $ag"
	step() {
		local name=$1 start=$SECONDS
		shift
		"$@" >"$dir/$name.log" 2>&1
		local rc=$?
		echo "$rc" >"$dir/$name.rc"
		echo "$name: exit $rc after $((SECONDS - start))s"
	}
	step kubeapi ./scripts/kubeapi.sh
	step race "$GO" test -race -short -count=1 -run '^$' ./...
	step lane env VM_BUILD_ONLY=1 ./vmlane/vmtest.sh "${KERNEL:-6.1}"
	step arm64 env GO="$GO" ./vmlane/arm64.sh "${KERNEL:-6.1}"
	step fuzz "$MAKE" --no-print-directory fuzz FUZZTIME="${FUZZTIME:-10s}" GO="$GO"
	;;
wait)
	[[ -f $dir/pid ]] || { echo "beside.sh: no chain was started" >&2; exit 1; }
	kill -CONT -- -"$(cat "$dir/pid")" 2>/dev/null || true
	exec 9>"$dir/.lock"
	start=$SECONDS
	flock 9
	echo "beside: waited $((SECONDS - start))s for the chain"
	rc=0
	for s in kubeapi race lane arm64 fuzz; do
		r=$(cat "$dir/$s.rc" 2>/dev/null || echo missing)
		echo "beside: $s: $([[ $r == 0 ]] && echo ok || echo "FAILED ($r)")"
		if [[ $r != 0 ]]; then
			rc=1
			echo "--- the end of out/beside/$s.log:"
			tail -n 60 "$dir/$s.log" 2>/dev/null
		fi
	done
	exit $rc
	;;
stop)
	pid=$(cat "$dir/pid" 2>/dev/null) || exit 0
	kill -- -"$pid" 2>/dev/null || true
	kill -CONT -- -"$pid" 2>/dev/null || true # a stopped chain gets its TERM
	;;
*)
	echo "usage: beside.sh start|wait|stop" >&2
	exit 2
	;;
esac
