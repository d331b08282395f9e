#!/usr/bin/env bash
# Runs go test verbosely into out/test.log and prints what matters: each
# package's result, every failure with its output, every skip with its
# reason, and how many tests ran, skipped and failed. The exit status is
# go test's. Arguments go to go test.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
log=out/test.log
${GO:-go} test -v "$@" >"$log" 2>&1
rc=$?
grep -E '^(ok|FAIL|---|panic:)|^\?' "$log" | grep -vE '^\s*--- (PASS|SKIP)' | grep -v '^?' || true
if ((rc != 0)); then
  echo "--- output of the failures:"
  awk -v keep=120 -f scripts/failed-output.awk "$log" | head -1200
  grep -E -A40 '^panic:' "$log" | head -200
fi
ran=$(grep -cE '^\s*--- (PASS|FAIL)' "$log")
skipped=$(grep -cE '^\s*--- SKIP' "$log")
failed=$(grep -cE '^\s*--- FAIL' "$log")
echo "host kernel $(uname -r): $ran tests ran, $skipped skipped, $failed failed"
if ((skipped > 0)); then
  # A skip's reason is the last line its test logged before it ended.
  awk '/^=== (RUN|CONT)/ {cur = $3}
       /^[ \t]+[A-Za-z0-9_]+\.go:[0-9]+: / {m = $0; sub(/^[ \t]+/, "", m); msg[cur] = m}
       /--- SKIP: / {print "  skipped: " $3 ": " msg[$3]}' "$log"
fi
exit $rc
