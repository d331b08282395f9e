package conform

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/testutil"
)

// A cell whose total falls short of the bed's first reading is measured
// again, twice as long, beside a plain limit measured again. A bed that
// slowed since (the fault: a first reading 15% above what the bed
// carries, as on a CI machine whose emulated guest slowed a minute into
// the run) passes by the second reading; a tree that wastes the link (the fault: its root
// class changed to 6 of its 8 Mbit/s after each apply) fails beside a
// plain limit that does not.
func TestShortCellMeasuresThePlainLimitAgain(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	for _, tc := range []struct {
		name  string
		waste bool
		pass  bool
	}{
		{"the bed slowed", false, true},
		{"the tree wastes the link", true, false},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "-"), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "p.yaml")
			src := "interfaces:\n  - name: rc0\n    egress:\n      rate: 8mbit\n      default: a\n      classes:\n" +
				"        - {name: a, rate: 4mbit, ceil: 8mbit}\n"
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			pol, err := LoadPolicy(file, "")
			if err != nil {
				t.Fatal(err)
			}
			var first float64
			rep, err := Run(context.Background(), pol, Options{
				Name: strings.TrimPrefix(testutil.Unique("rc"), testutil.Prefix), Queues: 1, Scale: 1, RTT: DefaultRTT,
				Settle: time.Second, Measure: 2 * time.Second,
				Cells: func(tree string, ss []*Subject) []Cell {
					return []Cell{{Name: "a alone", Demands: []Demand{{Subject: "a", Proto: "tcp", Flows: 1}}}}
				},
				afterCalibrate: func(trees []*tree) {
					first = trees[0].rep.Efficiency
					trees[0].rep.Efficiency *= 1.15
				},
				afterApply: func(gw string) {
					if tc.waste {
						testutil.NS(t, gw, "tc", "class", "change", "dev", "rc0", "parent", "1:", "classid", "1:1", "htb", "rate", "6mbit", "ceil", "6mbit")
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Trees) != 1 || len(rep.Trees[0].Cells) != 1 {
				t.Fatalf("want one tree of one cell: %+v", rep.Trees)
			}
			c := rep.Trees[0].Cells[0]
			var out strings.Builder
			rep.WriteText(&out, false)
			t.Logf("a plain limit carried %.0f%% at first\n%s", 100*first, out.String())
			if c.FirstTotal == 0 || c.ReferenceAgain == 0 {
				t.Fatalf("a cell short of the (raised) first reading was not measured again beside a plain limit: first total %.0f, reference again %.0f", c.FirstTotal, c.ReferenceAgain)
			}
			if c.SecondWindow != 4 {
				t.Errorf("the second measurement took %.0f s; want 4, twice the first's", c.SecondWindow)
			}
			if again := c.ReferenceAgain / 8e6; again < first-0.05 || again > first+0.05 {
				t.Errorf("the plain limit read %.0f%% again, %.0f%% at first: the same bed", 100*again, 100*first)
			}
			if c.Verdict.Pass != tc.pass {
				t.Errorf("pass %v, want %v: %s", c.Verdict.Pass, tc.pass, c.Verdict.Why)
			}
		})
	}
}
