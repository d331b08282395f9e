package engine

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
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
~ class eth0/egress/web: rate 8mbit -> 7mbit
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

var update = flag.Bool("update", false, "rewrite golden files")

// The plan's lines for policy edits that replace kernel objects, each
// saying why in the policy's terms, and none listing a field that does
// not change (issue 57: a default change printed no reason; a rate edit
// printed "burst"). Golden: testdata/edits.golden (go test ./engine
// -update rewrites it; review the diff).
func TestSummaryOfEdits(t *testing.T) {
	const office = `interfaces:
  - name: wan0
    egress:
      rate: 11mbit
      default: bulk
      classes:
        - {name: voip, rate: 2mbit, prio: 0, match: [{proto: udp, dport: 5060}]}
        - name: staff
          rate: 6mbit
          classes:
            - {name: web, rate: 3mbit, match: [{dport: 443}]}
            - {name: mail, rate: 3mbit, match: [{dport: 25}]}
        - {name: bulk, rate: 2mbit, leaf: bfifo}
`
	edits := []struct{ name, from, to string }{
		{"a rate", "{name: voip, rate: 2mbit", "{name: voip, rate: 1mbit"},
		{"a ceil", "{name: voip, rate: 2mbit, prio: 0", "{name: voip, rate: 2mbit, ceil: 5mbit, prio: 0"},
		{"the default class", "default: bulk", "default: voip"},
		{"a leaf", "leaf: bfifo", "leaf: pfifo"},
		{"a class moved under another", "            - {name: mail, rate: 3mbit, match: [{dport: 25}]}\n        - {name: bulk, rate: 2mbit, leaf: bfifo}",
			"        - {name: bulk, rate: 2mbit, leaf: bfifo}\n        - {name: mail, rate: 1mbit, match: [{dport: 25}]}"},
		{"a rule", "dport: 5060", "dport: 5061"},
		{"the classifier", "      default: bulk\n", "      default: bulk\n      classifier: bpf\n"},
		{"the link's overhead", "      rate: 11mbit\n", "      rate: 11mbit\n      linklayer: atm\n      overhead: 26\n"},
		{"a class removed", "        - {name: voip, rate: 2mbit, prio: 0, match: [{proto: udp, dport: 5060}]}\n", ""},
	}
	var b strings.Builder
	for _, e := range edits {
		to := strings.Replace(office, e.from, e.to, 1)
		if to == office {
			t.Fatalf("%s: the edit changes nothing", e.name)
		}
		prev := map[string]*plan.Alloc{}
		build := func(src string) *plan.Plan {
			pol, _, err := policy.Parse("p.yaml", []byte(src))
			if err != nil {
				t.Fatalf("%s: %v", e.name, err)
			}
			p, err := plan.Build(pol, plan.Everything, prev)
			if err != nil {
				t.Fatalf("%s: %v", e.name, err)
			}
			for _, d := range p.Devices {
				prev[d.Name] = d.Alloc
			}
			return p
		}
		was, now := build(office), build(to)
		d := kernel.Compute(tc.AsDumped(was.Objects()), now.Objects(), kernel.Options{})
		fmt.Fprintf(&b, "# %s\n%s\n", e.name, summarize(d, now, nil))
	}
	got := b.String()
	golden := filepath.Join("testdata", "edits.golden")
	if *update {
		os.MkdirAll("testdata", 0o755)
		os.WriteFile(golden, []byte(got), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test ./engine -update)", err)
	}
	if got != string(want) {
		t.Errorf("plan lines differ from %s (go test ./engine -update, and review the diff):\n%s", golden, got)
	}
	for _, l := range strings.Split(got, "\n") {
		if strings.HasPrefix(l, "-/+") && !strings.Contains(l, "replaced: ") {
			t.Errorf("a replacement without its reason: %s", l)
		}
		if strings.Contains(l, "burst") && !strings.Contains(l, "burst ") || strings.Contains(l, "b -> 3028b") {
			t.Errorf("burst listed as changed: %s", l)
		}
	}
}
