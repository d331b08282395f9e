package engine

import (
	"strings"
	"testing"

	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/tc"
	"sluice/units"
)

func mbit(n float64) units.Rate { return units.FromBits(n * 1e6) }

func class(dev string, minor uint16, name string, rate, ceil float64, prio uint32) *tc.Class {
	c := &tc.Class{Dev: dev, Parent: tc.MakeHandle(1, 1), Handle: tc.MakeHandle(1, minor), Kind: "htb",
		Rate: mbit(rate), Ceil: mbit(ceil), Prio: prio, Burst: 3028, Cburst: 3028, Quantum: 9000, Name: name}
	c.BufferTicks, c.CbufferTicks = tc.XmitTicks(c.Rate, c.Burst), tc.XmitTicks(c.Ceil, c.Cburst)
	return c
}

func op(v tc.Verb, o, old tc.Object) kernel.Change {
	return kernel.Change{Op: tc.Op{Verb: v, Obj: o}, Old: old}
}

// The summary names trees, classes and groups of hosts in the policy's
// units, claims every kernel object for one of them, and counts.
func TestSummaryInThePolicysTerms(t *testing.T) {
	desired := &plan.Plan{Devices: []*plan.Device{
		{Name: "eth0", Interface: "eth0", Dir: policy.Egress},
		{Name: "ifb-eth0", Interface: "eth0", Dir: policy.Ingress, Ifb: true},
	}}
	web0, web1 := class("eth0", 0x10, "web", 8, 19, 1), class("eth0", 0x10, "web", 7, 19, 1)
	leafOld := &tc.Qdisc{Dev: "eth0", Parent: tc.MakeHandle(1, 0x11), Handle: tc.MakeHandle(0x11, 0), Kind: "bfifo", Owner: "bulk"}
	leafNew := &tc.Qdisc{Dev: "eth0", Parent: tc.MakeHandle(1, 0x11), Handle: tc.MakeHandle(0x11, 0), Kind: "pfifo", Owner: "bulk"}
	root := &tc.Qdisc{Dev: "ifb-eth0", Parent: tc.HandleRoot, Handle: tc.MakeHandle(1, 0), Kind: "htb"}
	d := &kernel.Diff{Changes: []kernel.Change{
		op(tc.Change, web1, web0),
		op(tc.Delete, leafOld, leafOld),
		op(tc.Add, leafNew, nil),
		op(tc.Add, class("eth0", 0x20, "users/10.0.0.1", 1, 19, 0), nil),
		op(tc.Add, class("eth0", 0x21, "users/10.0.0.2", 1, 19, 0), nil),
		op(tc.Delete, class("eth0", 0x22, "users/10.0.0.3", 1, 19, 0), nil),
		op(tc.Add, &tc.Filter{Dev: "eth0", Parent: tc.MakeHandle(1, 0), Kind: "u32", Note: "class voip, match 1: udp"}, nil),
		op(tc.Add, class("eth0", 0x12, "voip", 1, 19, 0), nil),
		// A whole new ingress tree: its classes listed, its qdiscs not.
		op(tc.Add, &tc.Link{Name: "ifb-eth0", Kind: "ifb"}, nil),
		op(tc.Add, root, nil),
		op(tc.Add, class("ifb-eth0", 1, plan.RootClassName, 95, 95, 0), nil),
		op(tc.Add, class("ifb-eth0", 0x10, "all", 95, 95, 0), nil),
		// An object nothing claims shows on its tree's line.
		op(tc.Add, &tc.Qdisc{Dev: "eth0", Parent: tc.MakeHandle(1, 0x99), Handle: tc.MakeHandle(0x99, 0), Kind: "fq"}, nil),
	}}
	s := summarize(d, desired, nil)
	got := s.String()
	want := `~ tree eth0/egress: 1 other kernel object(s) (--tc lists them)
~ class eth0/egress/web: rate 8mbit -> 7mbit, burst
~ class eth0/egress/bulk: leaf bfifo -> pfifo
+ class eth0/egress/voip: rate 1mbit, ceil 19mbit, prio 0
~ hosts eth0/egress/users: 2 added, 1 removed
+ tree eth0/ingress: rate 95mbit, 1 class
+ class eth0/ingress/all: rate 95mbit, ceil 95mbit, prio 0
plan: trees 1 to add, 1 to change; classes 2 to add, 2 to change; hosts 2 to add, 1 to delete
`
	if got != want {
		t.Errorf("summary:\n%s\nwant:\n%s", got, want)
	}
	if e := summarize(&kernel.Diff{}, desired, nil); e.String() != "no changes\n" {
		t.Errorf("empty diff: %q", e.String())
	}
	// A deleted tree is one line: its classes go with it.
	del := &kernel.Diff{Changes: []kernel.Change{
		op(tc.Delete, root, root),
		op(tc.Delete, class("ifb-eth0", 0x10, "all", 95, 95, 0), nil),
	}}
	if g := summarize(del, &plan.Plan{}, nil).String(); !strings.HasPrefix(g, "- tree eth0/ingress\n") || strings.Contains(g, "class") {
		t.Errorf("a deleted tree:\n%s", g)
	}
}
