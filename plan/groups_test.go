package plan

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/policy"
	"sluice/units"
)

// A per_host class's groups (groups_file) are HTB classes below it, and
// the hosts whose parent column names one hang below it; the others stay
// below the per_host class. On u32 and on the BPF classifier alike, a
// group holds no packets of its own: no leaf, no filter.
func TestGroupsPlan(t *testing.T) {
	for _, tree := range []string{"", "classifier: bpf"} {
		p := loadGroups(t, `interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      `+tree+`
      default: rest
      classes:
        - {name: subs, rate: 500mbit, per_host: {by: dst, hosts_file: hosts.csv, groups_file: groups.csv}}
        - {name: rest, rate: 100mbit}
`)
		pl, err := Build(p, Everything, nil)
		if err != nil {
			t.Fatalf("%q: %v", tree, err)
		}
		d := pl.Devices[0]
		byName := map[string]ClassInfo{}
		for _, c := range d.Classes {
			byName[c.Name] = c
		}
		subs, acme := byName["subs"], byName["subs:acme"]
		if acme.Handle == 0 || acme.Parent != subs.Handle || acme.Rate != units.FromBits(20e6) || acme.Ceil != units.FromBits(50e6) || acme.Leaf != "" {
			t.Fatalf("%q: subs/acme %+v below subs %v", tree, acme, subs.Handle)
		}
		for name, parent := range map[string]ClassInfo{"subs/a": acme, "subs/b": acme, "subs/d": subs} {
			if c := byName[name]; c.Parent != parent.Handle || c.Leaf == "" {
				t.Errorf("%q: %s below %v with leaf %q, want below %s", tree, name, c.Parent, c.Leaf, parent.Name)
			}
		}
	}
}

// On EDT a group is an aggregate of its own, capped at its ceil, and
// each of its hosts names it (Target.Group, its index + 1) to take slots
// on its clock too; a host outside a group names none. A group is of
// its hosts' kind: its default prio 0 makes no prod aggregate in a tree
// of one prio.
func TestGroupsPlanEDT(t *testing.T) {
	p := loadGroups(t, `interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      backend: edt
      default: rest
      classes:
        - {name: subs, rate: 500mbit, prio: 2, per_host: {by: dst, hosts_file: hosts.csv, groups_file: groups.csv, rate: 10mbit, ceil: 100mbit}}
        - {name: rest, rate: 100mbit, prio: 2}
`)
	feats := Everything
	feats.Qdiscs = map[string]bool{"fq": true, "clsact": true}
	pl, err := Build(p, feats, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := pl.Devices[0]
	hook, _ := edtOf(t, d)
	c := hook.Content
	counter := map[string]uint32{}
	for _, ci := range d.Classes {
		counter[ci.Name] = ci.Counter
	}
	group := -1
	for i, tg := range c.Targets {
		if tg.Counter == counter["subs:acme"] && tg.Counter != 0 {
			group = i
			if tg.Rate != units.FromBits(50e6) || tg.Prod != 0 {
				t.Errorf("group target %+v, want capped at 50mbit, nonprod", tg)
			}
		}
		if tg.Prod != 0 {
			t.Errorf("target %d is prod in a tree of one prio", i)
		}
	}
	if group < 0 {
		t.Fatalf("no target for subs:acme (counter %d) in %+v", counter["subs:acme"], c.Targets)
	}
	for _, tg := range c.Hosts {
		want := uint32(0)
		if tg.Counter == counter["subs/a"] || tg.Counter == counter["subs/b"] {
			want = uint32(group) + 1
		}
		if tg.Group != want || tg.Rate != units.FromBits(100e6) {
			t.Errorf("host target %+v: group %d, want %d, capped at 100mbit", tg, tg.Group, want)
		}
	}
	if len(c.Hosts) != 3 {
		t.Errorf("%d host entries, want 3", len(c.Hosts))
	}
	noted := false
	for _, n := range d.Notes {
		noted = noted || strings.Contains(n, "edt: 1 groups (groups_file) cap their hosts together")
	}
	if !noted {
		t.Errorf("notes %q: none says what a group does on EDT", d.Notes)
	}

	// The group's controller: its hosts share its cap by their rates,
	// each seen through a delay histogram of its own.
	var ctl *Controller
	for i := range d.Controllers {
		if d.Controllers[i].Owner == "subs:acme" {
			ctl = &d.Controllers[i]
		}
	}
	if ctl == nil || len(d.Controllers) != 1 {
		t.Fatalf("controllers %+v, want one, for subs:acme", d.Controllers)
	}
	if ctl.Capacity != units.FromBits(50e6) || ctl.Assure || len(ctl.Children) != 2 {
		t.Fatalf("controller %+v: want the group's 50mbit shared by its 2 hosts, as caps", ctl)
	}
	hists := map[uint16]string{}
	for _, ch := range ctl.Children {
		if len(ch.Hosts) != 1 || ch.Weight != float64(units.FromBits(10e6)) || ch.Ceil != units.FromBits(100e6) || ch.ID != fmt.Sprintf("edt:%d", counter[ch.Name]) {
			t.Errorf("child %+v: want one host entry, weight its 10mbit rate, ceil 100mbit, edt:%d", ch, counter[ch.Name])
		}
		tg := c.Hosts[ch.Hosts[0]]
		if tg.Counter != counter[ch.Name] {
			t.Errorf("child %s's host entry is counter %d's", ch.Name, tg.Counter)
		}
		if other, dup := hists[tg.Hist]; dup || tg.Hist == 0 {
			t.Errorf("host %s: delay histogram %d (also %q's): want one of its own", ch.Name, tg.Hist, other)
		}
		hists[tg.Hist] = ch.Name
	}
	if d.Alloc.Hists["subs/a"] == 0 || d.Alloc.Hists["subs/d"] != 0 {
		t.Errorf("histograms %v: want subs/a's (grouped), not subs/d's", d.Alloc.Hists)
	}

	// A host limit caps that host's entries only, held at its planned
	// cap, and leaves the plan as it was.
	a := ctl.Children[0]
	lim := pl.WithLimits(Limits{HostLimit(hook, a.Name): {Ceil: units.FromBits(5e6)},
		HostLimit(hook, ctl.Children[1].Name): {Ceil: units.FromBits(900e6)}})
	lh, _ := edtOf(t, lim.Devices[0])
	got := lh.Content.Hosts[a.Hosts[0]]
	if got.Rate != units.FromBits(5e6) || got.Horizon != HorizonFor(d.tree.Horizon, units.FromBits(5e6)) {
		t.Errorf("limited host %+v: want capped at 5mbit with its horizon", got)
	}
	if b := lh.Content.Hosts[ctl.Children[1].Hosts[0]]; b.Rate != units.FromBits(100e6) {
		t.Errorf("host b %+v: a limit above its cap must hold at 100mbit", b)
	}
	if c.Hosts[a.Hosts[0]].Rate != units.FromBits(100e6) {
		t.Error("WithLimits changed the plan's own host entries")
	}
}

// loadGroups loads policy src beside hosts.csv (a and b in group acme,
// d in none) and groups.csv (acme: rate 20mbit, ceil 50mbit).
func loadGroups(t *testing.T, src string) *policy.Policy {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte("name,addresses,rate,ceil,parent\na,10.0.0.2,,,acme\nb,10.0.0.3,,,acme\nd,10.0.0.5,,,\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "groups.csv"), []byte("name,rate,ceil\nacme,20mbit,50mbit\n"), 0o644)
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(src), 0o644)
	return load(t, file)
}
