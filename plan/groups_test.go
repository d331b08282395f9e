package plan

import (
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
