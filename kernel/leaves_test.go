package kernel_test

import (
	"regexp"
	"strings"
	"testing"

	"sluice/tc"
	"sluice/testutil"
)

// TestLeavesAsTCMakesThem: every leaf qdisc sluice plans, applied
// through netlink, is the qdisc tc(8) makes from the exported script's
// line: the same options (fq_codel's targets, from its class's rate)
// and the same derived state (cake's target,
// which the kernel does not derive from the rtt: sent alone, the rtt
// left cake's target at its 5 ms while the script's said 20 ms).
func TestLeavesAsTCMakesThem(t *testing.T) {
	feats := kernelFeatures(t)
	for _, kind := range []string{"fq_codel", "sfq", "cake", "fq", "bfifo"} {
		t.Run(kind, func(t *testing.T) {
			testutil.NeedFeature(t, kind, feats.Qdiscs[kind])
			b := newBed(t, "e0", "e1")
			pol := parse(t, `interfaces:
  - name: e0
    egress:
      rate: 10mbit
      default: bulk
      classes:
        - {name: web, rate: 2mbit, leaf: `+kind+`, match: [{dport: 443}]}
        - {name: bulk, rate: 1mbit, leaf: `+kind+`}
`)
			if _, err := b.apply(t, pol, false); err != nil {
				t.Fatal(err)
			}
			var ops []tc.Op
			for _, o := range b.plan(t, pol).Objects() {
				switch o.(type) {
				case *tc.Qdisc, *tc.Class:
					ops = append(ops, tc.Op{Verb: tc.Add, Obj: o})
				}
			}
			script := strings.ReplaceAll(tc.Batch(ops), "dev e0", "dev e1")
			testutil.NS(t, b.ns, "sh", "-c", "tc -batch - <<'EOF'\n"+script+"EOF")
			show := func(dev string) string {
				out := testutil.NS(t, b.ns, "tc", "-d", "qdisc", "show", "dev", dev)
				// What follows the device differs, and so may HTB's count
				// of packets sent before a class took them (an IPv6
				// neighbour solicitation as the link came up: 1 against
				// 0 in the 6.1 lane once).
				return regexp.MustCompile(`refcnt \d+ |direct_qlen \d+|direct_packets_stat \d+ |dev e[01] `).ReplaceAllString(out, "")
			}
			a, c := show("e0"), show("e1")
			if a != c {
				t.Fatalf("sluice's leaves:\n%s\ntc's from the script:\n%s", a, c)
			}
			if !strings.Contains(a, "qdisc "+kind+" ") {
				t.Fatalf("no %s leaf:\n%s", kind, a)
			}
			if kind == "fq_codel" {
				// A frame and a half at each class's rate: 2mbit 9.1 ms
				// (10 ms), 1mbit 18.2 ms (19 ms); intervals of ten
				// targets, at least 100 ms.
				for _, want := range []string{`target 10(\.0)?ms.*interval 100(\.0)?ms`, `target 19(\.0)?ms.*interval 190(\.0)?ms`} {
					if !regexp.MustCompile(want).MatchString(a) {
						t.Errorf("no fq_codel leaf with %s:\n%s", want, a)
					}
				}
			}
			if kind == "cake" {
				// The planned rtt is 400 ms, so the target is 20 ms: the
				// kernel says what it uses in its statistics, per tin.
				for _, dev := range []string{"e0", "e1"} {
					out := testutil.NS(t, b.ns, "tc", "-s", "qdisc", "show", "dev", dev)
					rows := regexp.MustCompile(`(?m)^\s*target\s+(.*)$`).FindAllStringSubmatch(out, -1)
					if len(rows) != 2 {
						t.Fatalf("%s: %d target rows, want one per cake:\n%s", dev, len(rows), out)
					}
					for _, r := range rows {
						if f := strings.Fields(r[1]); len(f) != 3 || f[0] != "20ms" || f[1] != "20ms" || f[2] != "20ms" {
							t.Fatalf("%s: cake's targets %q, want 20ms in each of its three tins:\n%s", dev, r[1], out)
						}
					}
				}
			}
		})
	}
}
