package features

import (
	"strings"
	"testing"
)

// Without a probe, a kind exists when its module is loaded, built in or
// loadable, or it is part of the core; the rest is said to be unread. A
// kernel without a module list leaves the kinds unknown, and the plan
// says to probe rather than guess.
func TestInventory(t *testing.T) {
	r := inventory(&Report{Qdiscs: map[string]bool{}, Classifiers: map[string]bool{}, Actions: map[string]bool{},
		Modules: Modules{Loaded: []string{"sch_htb"}, Builtin: []string{"cls_u32", "sch_ingress"}, Loadable: []string{"sch_fq_codel", "act_mirred"},
			Absent: []string{"sch_cake", "cls_bpf"}}})
	for _, want := range []struct {
		m    map[string]bool
		name string
		has  bool
	}{{r.Qdiscs, "htb", true}, {r.Qdiscs, "fq_codel", true}, {r.Qdiscs, "pfifo", true}, {r.Qdiscs, "clsact", true},
		{r.Qdiscs, "cake", false}, {r.Classifiers, "u32", true}, {r.Classifiers, "bpf", false}, {r.Actions, "mirred", true}} {
		if want.m[want.name] != want.has {
			t.Errorf("%s: %v, want %v", want.name, want.m[want.name], want.has)
		}
	}
	if r.Probed || !r.KindsKnown() || len(r.Unread) != 3 || !strings.Contains(strings.Join(r.Plan, "\n"), "leaf: auto picks fq_codel") {
		t.Errorf("report: probed %v, unread %q, plan %q", r.Probed, r.Unread, r.Plan)
	}
	n := inventory(&Report{Qdiscs: map[string]bool{}, Classifiers: map[string]bool{}, Actions: map[string]bool{}, Modules: Modules{NoModules: true}})
	if n.KindsKnown() || n.Qdiscs["htb"] || len(n.Plan) != 1 || !strings.Contains(n.Plan[0], "run `sluice doctor` as root") || !strings.Contains(n.Unread[0], "unknown") {
		t.Errorf("no module list: known %v, plan %q, unread %q", n.KindsKnown(), n.Plan, n.Unread)
	}
}
