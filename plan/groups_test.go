package plan

import (
	"os"
	"path/filepath"
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
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte("name,addresses,rate,ceil,parent\na,10.0.0.2,,,acme\nb,10.0.0.3,,,acme\nd,10.0.0.5,,,\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "groups.csv"), []byte("name,rate,ceil\nacme,20mbit,50mbit\n"), 0o644)
		file := filepath.Join(dir, "p.yaml")
		os.WriteFile(file, []byte(`interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      `+tree+`
      default: rest
      classes:
        - {name: subs, rate: 500mbit, per_host: {by: dst, hosts_file: hosts.csv, groups_file: groups.csv}}
        - {name: rest, rate: 100mbit}
`), 0o644)
		p, _, err := policy.Load(file)
		if err != nil {
			t.Fatal(err)
		}
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
