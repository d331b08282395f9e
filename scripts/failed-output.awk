# Prints each failed test's own output from a `go test -v` log: the lines
# it logged since its RUN line (the last `keep`), then its FAIL line. A
# test's messages come before its FAIL line, so grepping after it shows
# none of them. Used by scripts/gotest.sh and the lane's guest.
/^=== RUN/ {cur = $3; n[cur] = 0; next}
/^=== (NAME|CONT|PAUSE)/ {cur = $3; next}
/^[ \t]*--- FAIL: / {
  t = $3; from = n[t] > keep ? n[t] - keep : 0
  if (from > 0) print "    ... (" from " lines before)"
  for (i = from; i < n[t]; i++) print out[t, i]
  print; next
}
cur != "" {out[cur, n[cur]++] = $0}
