package plan

import (
	"os"
	"path/filepath"
	"testing"

	"sluice/policy"
)

// A pods class on a node without such pods yet plans, on every data
// plane: the first pod then comes as any host does.
func TestPodsClassWithoutPods(t *testing.T) {
	for _, tree := range []string{"", "classifier: bpf", "backend: edt"} {
		dir := t.TempDir()
		file := filepath.Join(dir, "p.yaml")
		os.WriteFile(file, []byte(`interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      `+tree+`
      default: rest
      classes:
        - {name: pods, rate: 500mbit, per_host: {pods: egress, hosts_file: pods.csv}}
        - {name: rest, rate: 100mbit}
`), 0o644)
		p, _, err := policy.Load(file)
		if err != nil {
			t.Fatalf("%q: %v", tree, err)
		}
		pl, err := Build(p, Everything, nil)
		if err != nil {
			t.Fatalf("%q: %v", tree, err)
		}
		if len(pl.Devices) != 1 || len(pl.Devices[0].Objects) == 0 {
			t.Fatalf("%q: %d devices", tree, len(pl.Devices))
		}
	}
}
