package e2e

import (
	"strings"
	"testing"

	"sluice/testutil"
)

// TestU32BlocksAreIdempotent: u32 filters on one HTB share their hash
// tables across the classes they hang on, and a dump lists every table
// of its prio, so two blocks sharing a prio read each other's filters
// back as their own. Two per_host classes and a gate class with port
// rules and a default: a second apply and a plan change nothing, and
// each host's packets reach its own class.
func TestU32BlocksAreIdempotent(t *testing.T) {
	p := testutil.NewPair(t)
	testutil.AddAddr(t, p.B, p.DevB, "10.9.0.10")
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    egress:
      rate: 100mbit
      classifier: u32
      default: rest
      classes:
        - name: a
          rate: 30mbit
          per_host: {by: dst, cidr: 10.9.0.0/29, rate: 1mbit, ceil: 40mbit}
        - name: b
          rate: 30mbit
          per_host: {by: dst, cidr: 10.9.0.8/29, rate: 1mbit, ceil: 40mbit}
        - name: gate
          rate: 30mbit
          match: [{proto: udp}]
          default: other
          classes:
            - {name: dns, rate: 10mbit, match: [{dport: 53}, {sport: 53}]}
            - {name: other, rate: 20mbit}
        - name: rest
          rate: 10mbit
`))
	must(t, "--netns", p.A, "apply", "-q", pol)
	for _, cmd := range []string{"apply", "plan"} {
		if r := sluice(t, "--netns", p.A, cmd, pol); r.code != 0 || !strings.Contains(r.stdout, "no changes") {
			t.Fatalf("%s again (code %d): want no changes:\n%s%s", cmd, r.code, r.stdout, r.stderr)
		}
	}
	testutil.NS(t, p.A, "ping", "-c", "3", "-i", "0.1", "-W", "2", "10.9.0.2")
	testutil.NS(t, p.A, "ping", "-c", "4", "-i", "0.1", "-W", "2", "10.9.0.10")
	got := map[string]uint64{}
	for _, tr := range showJSON(t, p.A).Trees {
		for _, c := range tr.Classes {
			got[c.Name] = c.Packets
		}
	}
	if got["a/10.9.0.2"] < 3 || got["b/10.9.0.10"] < 4 {
		t.Fatalf("pings did not reach their hosts' classes: %v", got)
	}
}
