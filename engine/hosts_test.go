package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/bpf"
	"sluice/plan"
	"sluice/policy"
	"sluice/units"
)

// hostsPolicy is an EDT tree whose subscribers come from hosts.csv, and
// an HTB tree whose do (its hosts are classes: not editable in place).
const hostsPolicy = `interfaces:
  - name: eth0
    egress:
      backend: edt
      rate: 1gbit
      default: rest
      classes:
        - {name: subs, rate: 500mbit, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 100mbit}
  - name: eth1
    egress:
      rate: 1gbit
      default: rest
      classes:
        - {name: subs, rate: 500mbit, per_host: {by: dst, hosts_file: htb.csv}}
        - {name: rest, rate: 100mbit}
`

func hostsCSV(ceil3 string) []byte {
	var b strings.Builder
	b.WriteString("name,addresses,rate,ceil\n")
	for i := range 5 {
		ceil := "10mbit"
		if i == 3 {
			ceil = ceil3
		}
		fmt.Fprintf(&b, "s%d,10.1.0.%d,1mbit,%s\n", i, i+1, ceil)
	}
	return []byte(b.String())
}

// PlanHostsEdit takes a host's new ceil into the EDT program's entry
// and, once committed, into the policy and plan in force; what it
// cannot take in place asks for a full apply (ok false), and a line
// the policy refuses is bad input naming the policy, with nothing
// changed.
func TestPlanHostsEdit(t *testing.T) {
	was := hostsCSV("10mbit")
	cases := []struct {
		name    string
		file    string // which file changes: hosts.csv, htb.csv or p.yaml
		to      []byte
		ok      bool
		hosts   int
		refused string
	}{
		{name: "a host's ceil", file: "hosts.csv", to: hostsCSV("40mbit"), ok: true, hosts: 1},
		{name: "nothing changed", file: "hosts.csv", to: was, ok: true, hosts: 0},
		{name: "a line added", file: "hosts.csv", to: append(append([]byte{}, was...), "s9,10.1.0.9,1mbit,10mbit\n"...)},
		{name: "a host of an HTB tree", file: "htb.csv", to: hostsCSV("40mbit")},
		{name: "the policy file", file: "p.yaml", to: []byte(hostsPolicy + "\n")},
		{name: "a ceil under the rate", file: "hosts.csv", to: hostsCSV("100kbit"), refused: "problem(s)"},
		{name: "a rate that is not one", file: "hosts.csv", to: hostsCSV("fast"), refused: "problem(s)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "p.yaml")
			os.WriteFile(file, []byte(hostsPolicy), 0o644)
			os.WriteFile(filepath.Join(dir, "hosts.csv"), was, 0o644)
			os.WriteFile(filepath.Join(dir, "htb.csv"), was, 0o644)
			pol, _, err := policy.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			inForce, err := plan.Build(pol, plan.Everything, nil)
			if err != nil {
				t.Fatal(err)
			}
			old := []byte(hostsPolicy)
			if c.file != "p.yaml" {
				old = was
			}
			ed, ok, err := PlanHostsEdit(pol, inForce, []HostsChange{{File: filepath.Join(dir, c.file), Old: old, New: c.to}})
			var ie *InputError
			switch {
			case c.refused != "":
				if !errors.As(err, &ie) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), c.refused) {
					t.Fatalf("err %v, want bad input naming %s and %q", err, file, c.refused)
				}
				return
			case err != nil:
				t.Fatal(err)
			case ok != c.ok:
				t.Fatalf("ok %v, want %v", ok, c.ok)
			case !ok:
				return
			case ed.Hosts() != c.hosts:
				t.Fatalf("%d hosts edited, want %d", ed.Hosts(), c.hosts)
			}
			if c.hosts == 0 {
				if len(ed.Writes()) != 0 {
					t.Errorf("nothing changed, yet %d writes", len(ed.Writes()))
				}
				return
			}
			hook := inForce.Devices[0].Hook()
			if hook == nil || ed.Entries() != 1 || len(ed.Writes()) != 1 || ed.Writes()[0].Hook != hook {
				t.Fatalf("writes %+v, want one entry of eth0's program", ed.Writes())
			}
			var key bpf.HostKey
			for k := range ed.Writes()[0].New {
				key = k
			}
			before := hook.Content.Hosts[key]
			if got := ed.Writes()[0].Old[key]; got != before {
				t.Errorf("the write expects %+v, the plan holds %+v", got, before)
			}
			ed.Commit()
			after := hook.Content.Hosts[key]
			if after == before || after != ed.Writes()[0].New[key] {
				t.Errorf("committed: the plan holds %+v, want the write's %+v", after, ed.Writes()[0].New[key])
			}
			// The policy in force now says 40mbit for s3: a second edit
			// from there back to 10mbit is again one host.
			ceil := units.Rate(0)
			for _, cl := range pol.Interfaces[0].Egress.Classes {
				if cl.PerHost != nil {
					for _, h := range cl.PerHost.Entries {
						if h.Name == "s3" {
							ceil = h.CeilBps
						}
					}
				}
			}
			if ceil != units.FromBits(40e6) {
				t.Errorf("committed: the policy's s3 ceil is %v, want 40mbit", ceil)
			}
			back, ok, err := PlanHostsEdit(pol, inForce, []HostsChange{{File: filepath.Join(dir, c.file), Old: c.to, New: was}})
			if err != nil || !ok || back.Hosts() != 1 || back.Writes()[0].Old[key] != after {
				t.Errorf("edit back: %v %v %+v", ok, err, back)
			}
		})
	}
}
