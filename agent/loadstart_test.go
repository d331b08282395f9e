package agent

import (
	"testing"

	"sluice/plan"
	"sluice/stats"
)

// loadStarted sees a child idle at the last step start sending (a queue,
// drops, or busyFrames full frames since), and nothing else: a trickle,
// prod, a child already busy, an EDT clock's lead, a sharded tree.
func TestLoadStarted(t *testing.T) {
	// Children a and b under 1:1, b with a leaf 1:21 below it; prod.
	children := []plan.Controlled{{Name: "a", ID: "1:11"}, {Name: "b", ID: "1:12"}, {Name: "prod", ID: "1:10", Prod: true}}
	tree := func(backend string, a, b21, prod uint64, aBacklog, b21Backlog uint32, b21Drops uint32) *stats.Tree {
		return &stats.Tree{Backend: backend, Classes: []*stats.Class{
			{ID: "1:1", Parent: "root", Bytes: 1 << 40, Backlog: 9000}, // the parent: never counted
			{ID: "1:11", Parent: "1:1", Bytes: a, Backlog: aBacklog},
			{ID: "1:12", Parent: "1:1", Bytes: 1 << 30}, // inner: its leaf's bytes count
			{ID: "1:21", Parent: "1:12", Bytes: b21, Backlog: b21Backlog, Drops: b21Drops},
			{ID: "1:10", Parent: "1:1", Bytes: prod},
		}}
	}
	ctl := func(busyA, hungryB bool) *controller {
		c := &controller{cfg: plan.Controller{Children: children}, drops: map[string]uint64{"b": 3},
			stepBytes: []uint64{1000, 5000, 0}}
		for _, ch := range children {
			c.decided = append(c.decided, &stats.Share{Class: ch.Name})
		}
		if busyA {
			c.decided[0].Usage = busyFrames * frameBytes
		}
		c.decided[1].Hungry = hungryB
		return c
	}
	frames := uint64(busyFrames * frameBytes)
	for _, tc := range []struct {
		name string
		ctl  *controller
		tree *stats.Tree
		want bool
	}{
		{"nothing sent", ctl(false, false), tree("htb", 1000, 5000, 0, 0, 0, 3), false},
		{"a trickle", ctl(false, false), tree("htb", 1000+frames-1, 5000, 0, 0, 0, 3), false},
		{"a starts", ctl(false, false), tree("htb", 1000+frames, 5000, 0, 0, 0, 3), true},
		{"b's leaf starts", ctl(false, false), tree("htb", 1000, 5000+frames, 0, 0, 0, 3), true},
		{"b's leaf queues", ctl(false, false), tree("htb", 1000, 5000, 0, 0, 1514, 3), true},
		{"b's leaf drops", ctl(false, false), tree("htb", 1000, 5000, 0, 0, 0, 4), true},
		{"prod starts", ctl(false, false), tree("htb", 1000, 5000, 1<<30, 0, 0, 3), false},
		{"a was busy", ctl(true, false), tree("htb", 1000+frames, 5000, 0, 1514, 0, 3), false},
		{"b was held back", ctl(false, true), tree("htb", 1000, 5000+frames, 0, 0, 1514, 3), false},
		{"an EDT clock's lead", ctl(false, false), tree("edt", 1000, 5000, 0, 1514, 0, 3), false},
		{"an EDT aggregate sends", ctl(false, false), tree("edt", 1000+frames, 5000, 0, 0, 0, 3), true},
	} {
		if got := tc.ctl.loadStarted(tc.tree); got != tc.want {
			t.Errorf("%s: loadStarted %v, want %v", tc.name, got, tc.want)
		}
	}
	// A sharded tree's controller balances shards: no early steps.
	c := ctl(false, false)
	c.cfg.Shards = true
	if c.loadStarted(tree("htb", 1000+frames, 5000, 0, 1514, 0, 3)) {
		t.Error("a sharded tree's controller saw a load start")
	}
	// Before its first decision (a limiting controller's first step
	// decides nothing) there is nothing to compare with.
	c = ctl(false, false)
	c.decided = nil
	if c.loadStarted(tree("htb", 1000+frames, 5000, 0, 1514, 0, 3)) {
		t.Error("a controller with no decision saw a load start")
	}
}
