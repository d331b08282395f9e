#!/usr/bin/env bash
# Fuzzes each PKG:FuzzName target for FUZZTIME (default 30s). A target
# fails when the fuzzer found an input (it writes it under
# PKG/testdata/fuzz/NAME and says "Failing input written"), panicked or
# failed any other way. One failure is not the target's: Go 1.26's fuzz
# coordinator can report "context deadline exceeded" when -fuzztime
# expires while a worker is mid-call (go.dev/issue/75804, fixed in Go
# 1.27). That bare report, with no input written, is retried once with
# an execution count, which has no deadline to race.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}
RETRY=${FUZZ_RETRY:-2000x}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# deadline_only LOG: the run's only failure is the coordinator's deadline.
deadline_only() {
  grep -q '^    context deadline exceeded$' "$1" || return 1
  grep -qiE 'failing input|^panic:' "$1" && return 1
  # Any other line (a t.Error, a stack) is a real failure.
  ! grep -vqE '^(fuzz: elapsed|--- FAIL: Fuzz[A-Za-z0-9_]+ \(|    context deadline exceeded$|FAIL$|FAIL\s|exit status |ok\s|PASS$|warning: )' "$1"
}

# --self-test: the classifier on the three shapes of failing output.
if [[ ${1:-} == --self-test ]]; then
  f=$(mktemp -d) && trap 'rm -rf "$f" "$log"' EXIT
  printf '%s\n' 'fuzz: elapsed: 21s, execs: 15595 (0/sec), new interesting: 41 (total: 220)' \
    '--- FAIL: FuzzX (21.03s)' '    context deadline exceeded' FAIL 'exit status 1' $'FAIL\tsluice/migrate\t21.046s' >"$f/race"
  printf '%s\n' '--- FAIL: FuzzX (21.03s)' '    x_test.go:40: boom' '    context deadline exceeded' FAIL >"$f/error"
  printf '%s\n' '--- FAIL: FuzzX (3.10s)' '    Failing input written to testdata/fuzz/FuzzX/0a1b' \
    '    context deadline exceeded' FAIL >"$f/found"
  deadline_only "$f/race" && ! deadline_only "$f/error" && ! deadline_only "$f/found" ||
    { echo "fuzz.sh: the classifier is wrong" >&2; exit 1; }
  echo "fuzz.sh: classifier ok"
  exit 0
fi

for t in "$@"; do
  pkg=${t%%:*} name=${t#*:}
  echo "fuzz $t for $FUZZTIME"
  before=$(ls "$pkg/testdata/fuzz/$name" 2>/dev/null | sort)
  $GO test -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 2s "./$pkg" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) && continue
  after=$(ls "$pkg/testdata/fuzz/$name" 2>/dev/null | sort)
  if [[ $before == "$after" ]] && deadline_only "$log"; then
    echo "fuzz $t: the coordinator's deadline race (go.dev/issue/75804), no input written: again for $RETRY"
    $GO test -run '^$' -fuzz "^$name\$" -fuzztime "$RETRY" -fuzzminimizetime 2s "./$pkg" && continue
  fi
  echo "fuzz $t failed" >&2
  exit 1
done
