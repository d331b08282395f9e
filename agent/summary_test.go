package agent

import (
	"testing"

	"sluice/kernel"
	"sluice/tc"
)

// One line for what a pass changed: counts by verb and kind, and the
// first objects.

func TestSummarize(t *testing.T) {
	cls := func(id string) kernel.Change {
		t.Helper()
		return kernel.Change{Op: tc.Op{Verb: tc.Add, Obj: &tc.Class{Dev: "eth1", Handle: handle(t, id)}}}
	}
	q := kernel.Change{Op: tc.Op{Verb: tc.Add, Obj: &tc.Qdisc{Dev: "eth1", Parent: handle(t, "1:11")}}}
	for _, c := range []struct {
		cs   []kernel.Change
		want string
	}{
		{[]kernel.Change{{Op: tc.Op{Verb: tc.Change, Obj: &tc.Class{Dev: "eth0", Handle: handle(t, "1:11")}}}}, "change 1 class: class/eth0/1:11"},
		{[]kernel.Change{cls("1:11"), q, cls("1:12"), cls("1:13")}, "add 3 class, add 1 qdisc: class/eth1/1:11, qdisc/eth1/1:11, class/eth1/1:12, and 1 more"},
	} {
		if got := summarize(c.cs); got != c.want {
			t.Errorf("summarize: %q, want %q", got, c.want)
		}
	}
}

func handle(t *testing.T, s string) tc.Handle {
	h, err := tc.ParseHandle(s)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
