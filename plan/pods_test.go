package plan

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"sluice/policy"
)

// A pods class on a node without such pods yet plans, on every data
// plane: the first pod then comes as any host does.
func TestPodsClassWithoutPods(t *testing.T) {
	for _, tree := range dataPlanes {
		pl := planWith(t, tree, "", `
        - {name: pods, rate: 500mbit, per_host: {pods: egress, hosts_file: pods.csv}}
        - {name: rest, rate: 100mbit}
`)
		if len(pl.Devices) != 1 || len(pl.Devices[0].Objects) == 0 {
			t.Fatalf("%q: %d devices", tree, len(pl.Devices))
		}
	}
}

// A hosts file's prio column (a pod's sluice.io/priority) is its host's
// prio: the HTB class's on an HTB tree, prod or not on an EDT tree;
// a host without one takes its class's.
func TestHostsPrioColumn(t *testing.T) {
	for _, tree := range dataPlanes {
		pl := planWith(t, tree, "name,addresses,rate,ceil,prio\na,10.0.0.2,,,0\nb,10.0.0.3,,,\nc,10.0.0.4,,,5\n", `
        - {name: subs, rate: 500mbit, prio: 3, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 100mbit, prio: 3}
`)
		want := map[string]uint32{"subs/a": 0, "subs/b": 3, "subs/c": 5}
		if tree == "backend: edt" {
			want = map[string]uint32{"subs/a": 0, "subs/b": 1, "subs/c": 1} // prod or not
		}
		got := map[string]uint32{}
		for _, c := range pl.Devices[0].Classes {
			if _, ok := want[c.Name]; ok {
				got[c.Name] = c.Prio
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%q: prios %v, want %v", tree, got, want)
		}
	}
}

// dataPlanes are the trees a plan test runs on: HTB with u32, HTB with
// the BPF classifier, EDT.
var dataPlanes = []string{"", "classifier: bpf", "backend: edt"}

// planWith plans a 1gbit egress tree of eth0 with tree's options,
// classes (YAML lines) and default rest, hosts (when set) as its
// hosts.csv.
func planWith(t *testing.T, tree, hosts, classes string) *Plan {
	t.Helper()
	dir := t.TempDir()
	if hosts != "" {
		os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(hosts), 0o644)
	}
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte("interfaces:\n  - name: eth0\n    egress:\n      rate: 1gbit\n      "+tree+"\n      default: rest\n      classes:"+classes), 0o644)
	p, _, err := policy.Load(file)
	if err != nil {
		t.Fatalf("%q: %v", tree, err)
	}
	pl, err := Build(p, Everything, nil)
	if err != nil {
		t.Fatalf("%q: %v", tree, err)
	}
	return pl
}
