package e2e

import (
	"fmt"
	"strings"
	"testing"

	"sluice/features"
	"sluice/records"
	"sluice/testutil"
)

// TestApplyReadsTouchedOnly: after a first apply, a rate edit takes the
// fast path (timings show "read touched", the classes' changes); a class deleted
// behind sluice's back is not seen by it but is repaired by --full.
func TestApplyReadsTouchedOnly(t *testing.T) {
	p := testutil.NewPair(t)
	policy := func(rate string) string {
		return writePolicy(t, "p.yaml", policyFor(p.DevA, `    egress:
      rate: 50mbit
      classifier: bpf
      default: rest
      classes:
        - name: subs
          rate: 40mbit
          per_host: {by: dst, cidr: 10.5.0.0/29, rate: `+rate+`, ceil: 40mbit}
        - name: rest
          rate: 5mbit
`))
	}
	first := sluice(t, "--netns", p.A, "apply", "-q", "--timings", policy("1mbit"))
	if first.code != 0 || !strings.Contains(first.stderr, "timings: parse") || strings.Contains(first.stderr, "read touched") {
		t.Fatalf("first apply (code %d): full read expected:\n%s%s", first.code, first.stdout, first.stderr)
	}
	// Six classes change; where auto is fq_codel their leaves too (the
	// target follows the rate: 19 ms at 1mbit, 10 ms at 2mbit).
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	n := 6
	if rep.Features().Qdiscs["fq_codel"] {
		n = 12
	}
	edit := sluice(t, "--netns", p.A, "apply", "--timings", policy("2mbit"))
	if want := fmt.Sprintf("applied: %d change(s), %d netlink write(s)", n, n); edit.code != 0 || !strings.Contains(edit.stderr, "read touched") || !strings.Contains(edit.stdout, want) {
		t.Fatalf("rate edit (code %d): want the fast path and %q:\n%s%s", edit.code, want, edit.stdout, edit.stderr)
	}
	if out := testutil.NS(t, p.A, "tc", "class", "show", "dev", p.DevA); strings.Count(out, "rate 2Mbit") != 6 {
		t.Fatalf("the new rate is not in the kernel:\n%s", out)
	}
	var victim string
	for _, l := range strings.Split(testutil.NS(t, p.A, "tc", "class", "show", "dev", p.DevA), "\n") {
		if strings.Contains(l, "rate 2Mbit") {
			victim = strings.Fields(l)[2]
			break
		}
	}
	testutil.NS(t, p.A, "tc", "class", "del", "dev", p.DevA, "classid", victim)
	if r := sluice(t, "--netns", p.A, "apply", policy("2mbit")); r.code != 0 || !strings.Contains(r.stdout, "no changes") {
		t.Fatalf("unchanged policy: want no changes from the fast path (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := sluice(t, "--netns", p.A, "apply", "-q", "--full", policy("2mbit")); r.code != 0 || !strings.Contains(r.stdout, "applied: ") {
		t.Fatalf("--full: want the class put back (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := testutil.NS(t, p.A, "tc", "class", "show", "dev", p.DevA); strings.Count(out, "rate 2Mbit") != 6 {
		t.Fatalf("--full did not repair the tree:\n%s", out)
	}
}
