package e2e

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"sluice/testutil"
)

// TestOfficeExample runs examples/office.yaml in the lab (the office
// scenario, whose shaped policy must be the example with the lab's
// names) and checks what its comments promise: the per-user queues on
// the LAN side decide, so two users with two flows and one flow get
// equal shares, and pings stay fast through downloads and uploads.
func TestOfficeExample(t *testing.T) {
	testutil.RequireRoot(t)
	ex, err := os.ReadFile("../examples/office.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := os.ReadFile("../lab/scenarios/office.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var scenario struct {
		Variants []struct{ Name, Policy string }
	}
	if err := yaml.Unmarshal(sc, &scenario); err != nil {
		t.Fatal(err)
	}
	var lab, want any
	for _, v := range scenario.Variants {
		if v.Name == "shaped" {
			if err := yaml.Unmarshal([]byte(v.Policy), &lab); err != nil {
				t.Fatal(err)
			}
		}
	}
	named := strings.NewReplacer("name: eth0", "name: wan", "name: eth1", "name: lan", "192.168.1.0/24", "10.77.0.0/24").Replace(string(ex))
	if err := yaml.Unmarshal([]byte(named), &want); err != nil {
		t.Fatal(err)
	}
	if lab == nil || !reflect.DeepEqual(lab, want) {
		t.Fatalf("the office scenario's shaped policy is not examples/office.yaml with the lab's names:\n%v\n%v", lab, want)
	}
	dir := t.TempDir()
	r := sluice(t, "lab", "run", "office", "--out", dir, "--name", strings.TrimPrefix(testutil.Unique("off"), testutil.Prefix))
	if r.code != 0 {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if n := strings.Count(r.stdout, "PASS  "); n != 6 {
		t.Fatalf("%d of 6 expectations passed:\n%s", n, r.stdout)
	}
	t.Logf("\n%s", r.stdout)
}
