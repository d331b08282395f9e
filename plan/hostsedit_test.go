package plan

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sluice/policy"
)

// hostsEditCase writes a policy (src, with hosts.csv beside it) and
// loads it.
func hostsEditCase(t *testing.T, src, hosts string) (*policy.Policy, string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(src), 0o644)
	hf := filepath.Join(dir, "hosts.csv")
	os.WriteFile(hf, []byte(hosts), 0o644)
	p, _, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	return p, hf
}

func hostsCSV(n int, rate func(i int) string) string {
	var b strings.Builder
	b.WriteString("name,addresses,rate,ceil\n")
	for i := range n {
		fmt.Fprintf(&b, "s%d,10.1.%d.%d,1mbit,%s\n", i, i/250, i%250+1, rate(i))
	}
	return b.String()
}

const edtHostsPolicy = `interfaces:
  - name: eth0
    egress:
      backend: edt
      rate: %s
      default: rest
      classes:
        - {name: voice, rate: 10mbit, prio: 0, match: [{dscp: EF}]}
        - {name: subs, rate: 500mbit, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 100mbit}
    ingress:
      backend: edt
      rate: 1gbit
      default: rest
      classes:
        - {name: subs, rate: 500mbit, per_host: {by: src, hosts_file: hosts.csv}}
        - {name: rest, rate: 100mbit}
`

// A patched plan is the plan of the edited policy: the same host
// entries and aggregates, in both directions, for the hosts whose cap
// changed; and the kernel is told exactly what each entry held before.
func TestPatchHostsMatchesBuild(t *testing.T) {
	feats := Everything
	before := hostsCSV(300, func(int) string { return "10mbit" })
	after := hostsCSV(300, func(i int) string {
		if i == 7 || i == 123 {
			return "40mbit"
		}
		return "10mbit"
	})
	p, hf := hostsEditCase(t, fmt.Sprintf(edtHostsPolicy, "10gbit"), before)
	pl, err := Build(p, feats, nil)
	if err != nil {
		t.Fatal(err)
	}
	prev := map[string]*Alloc{}
	for _, d := range pl.Devices {
		prev[d.Name] = d.Alloc
	}
	edits, ok, err := p.EditHosts(hf, []byte(before), []byte(after))
	if err != nil || !ok || len(edits) != 4 {
		t.Fatalf("%d edits, ok %v, err %v", len(edits), ok, err)
	}
	hp, ok := pl.PatchHosts(edits)
	if !ok || len(hp.Writes) != 2 || hp.Entries() != 4 {
		t.Fatalf("ok %v, %d writes of %d entries", ok, len(hp.Writes), hp.Entries())
	}
	for _, w := range hp.Writes {
		for k, old := range w.Old {
			if w.Hook.Content.Hosts[k] != old {
				t.Errorf("%s: old entry is not the plan's", w.Hook.Dev)
			}
			if w.New[k].Rate != 40e6/8 || old.Rate != 10e6/8 {
				t.Errorf("%s: cap %d -> %d, want 10mbit -> 40mbit", w.Hook.Dev, old.Rate, w.New[k].Rate)
			}
		}
	}
	for _, e := range edits {
		e.Apply()
	}
	hp.Apply()
	os.WriteFile(hf, []byte(after), 0o644)
	q, _, err := policy.Load(p.File)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Build(q, feats, prev)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range want.Devices {
		got := pl.Devices[i]
		if !reflect.DeepEqual(got.Hook().Content, d.Hook().Content) {
			t.Errorf("%s: patched program content differs from the plan's", d.Name)
		}
		if !reflect.DeepEqual(got.Classes, d.Classes) {
			t.Errorf("%s: patched aggregates differ from the plan's", d.Name)
		}
	}
}

// Where an edit reaches beyond its hosts' entries, the policy is
// planned in full.
func TestPatchHostsDefers(t *testing.T) {
	feats := Everything
	before := hostsCSV(20, func(int) string { return "10mbit" })
	for _, c := range []struct {
		name, policy string
		after        string
	}{
		// 20 hosts of 10mbit and two classes fit 400mbit; one host at
		// 300mbit makes the caps exceed it: the rate becomes a shared cap.
		{"the shared cap", `interfaces:
  - name: eth0
    egress:
      backend: edt
      rate: 400mbit
      default: rest
      classes:
        - {name: voice, rate: 10mbit, ceil: 10mbit, prio: 0, match: [{dscp: EF}]}
        - {name: subs, rate: 200mbit, ceil: 300mbit, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 100mbit, ceil: 100mbit}
`, hostsCSV(20, func(i int) string {
			if i == 3 {
				return "300mbit"
			}
			return "10mbit"
		})},
		{"an HTB tree", strings.ReplaceAll(fmt.Sprintf(edtHostsPolicy, "10gbit"), "backend: edt", "backend: htb"), hostsCSV(20, func(i int) string {
			if i == 3 {
				return "30mbit"
			}
			return "10mbit"
		})},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, hf := hostsEditCase(t, c.policy, before)
			pl, err := Build(p, feats, nil)
			if err != nil {
				t.Fatal(err)
			}
			edits, ok, err := p.EditHosts(hf, []byte(before), []byte(c.after))
			if err != nil || !ok {
				t.Fatalf("ok %v, err %v", ok, err)
			}
			if _, ok := pl.PatchHosts(edits); ok {
				t.Error("patched, want a full plan")
			}
		})
	}
}
