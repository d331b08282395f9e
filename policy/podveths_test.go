package policy

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// pod_veths: each line of the file the agent writes becomes an
// interface: the veth's egress at what the pod may receive, its ingress
// (an ifb) at what it may send. Until the file is written, no pods.
func TestPodVeths(t *testing.T) {
	const uplink = `interfaces:
  - name: eth0
    egress: {rate: 1gbit}
`
	cases := []struct {
		name, policy, file string
		write              bool
		err                string
		want               []string // device: egress/ingress rates in bit/s, "-" for none
	}{
		{name: "no file yet", policy: uplink + "pod_veths: {file: v.csv}\n", want: []string{"eth0"}},
		{name: "alone, no file yet", policy: "pod_veths: {file: v.csv}\n"},
		{name: "the key alone", policy: uplink + "pod_veths:\n", want: []string{"eth0"}},
		{name: "header only", policy: uplink + "pod_veths: {file: v.csv}\n", write: true, file: PodVethsHeader + "\n", want: []string{"eth0"}},
		{name: "two pods", policy: uplink + "pod_veths: {file: v.csv, leaf: bfifo}\n", write: true,
			file: PodVethsHeader + "\ncali0a,shop.web,5mbit,\ncali0b,shop.db,10mbit,2mbit\nlxc1,shop.up,,1mbit\n",
			want: []string{"eth0", "cali0a 5000000/-", "cali0b 10000000/2000000", "lxc1 -/1000000"}},
		{name: "only pods", policy: "pod_veths: {file: v.csv}\n", write: true,
			file: PodVethsHeader + "\ncali0a,shop.web,5mbit,\n", want: []string{"cali0a 5000000/-"}},
		{name: "a bad header", policy: uplink + "pod_veths: {file: v.csv}\n", write: true, file: "name,addresses,rate,ceil\n",
			err: `v.csv:1:1: pod_veths file: header "name,addresses,rate,ceil"; expected device,pod,ingress,egress`},
		{name: "a bad cap", policy: uplink + "pod_veths: {file: v.csv}\n", write: true, file: PodVethsHeader + "\ncali0a,shop.web,ten,\n",
			err: "v.csv:2:17: pod_veths file: ingress cap: "},
		{name: "a percentage", policy: uplink + "pod_veths: {file: v.csv}\n", write: true, file: PodVethsHeader + "\ncali0a,shop.web,,10%\n",
			err: "v.csv:2:18: pod_veths file: egress cap 10%: a rate (10mbit), not a percentage"},
		{name: "no cap", policy: uplink + "pod_veths: {file: v.csv}\n", write: true, file: PodVethsHeader + "\ncali0a,shop.web,,\n",
			err: "pod_veths file: pod shop.web has no cap in either direction"},
		{name: "a device twice", policy: uplink + "pod_veths: {file: v.csv}\n", write: true, file: PodVethsHeader + "\ncali0a,shop.web,1mbit,\ncali0a,shop.db,1mbit,\n",
			err: "v.csv:3:1: pod_veths file: device cali0a appears twice (first at line 2)"},
		{name: "a device name too long", policy: uplink + "pod_veths: {file: v.csv}\n", write: true, file: PodVethsHeader + "\ncali0123456789ab,shop.web,1mbit,\n",
			err: `device "cali0123456789ab": must be 1 to 15 bytes`},
		{name: "a device the policy shapes", policy: uplink + "pod_veths: {file: v.csv}\n", write: true, file: PodVethsHeader + "\neth0,shop.web,1mbit,\n",
			err: "v.csv:2:1: pod_veths file: pod shop.web: device eth0 is shaped by the policy already"},
		{name: "a pods class's file", policy: "interfaces:\n  - name: eth0\n    egress:\n      rate: 1gbit\n      default: rest\n      classes:\n        - {name: pods, rate: 1mbit, per_host: {pods: egress, hosts_file: v.csv}}\n        - {name: rest, rate: 1mbit}\npod_veths: {file: v.csv}\n",
			err: "p.yaml:9:19: pod_veths.file "},
		{name: "an unknown key", policy: uplink + "pod_veths: {files: v.csv}\n", err: `pod_veths: unknown key "files" (did you mean "file"?)`},
		{name: "a bad leaf", policy: uplink + "pod_veths: {file: v.csv, leaf: red}\n", write: true, file: PodVethsHeader + "\ncali0a,shop.web,1mbit,\n",
			err: "red"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("SLUICE_STATE_DIR", dir)
			file := filepath.Join(dir, "p.yaml")
			os.WriteFile(file, []byte(c.policy), 0o644)
			if c.write {
				os.WriteFile(filepath.Join(dir, "v.csv"), []byte(c.file), 0o644)
			}
			p, _, err := Load(file)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, in := range p.Interfaces {
				if in.Generated == "" {
					got = append(got, in.Name)
					continue
				}
				r := func(tr *Tree) string {
					if tr == nil {
						return "-"
					}
					if tr.Leaf != p.PodVeths.Leaf {
						t.Errorf("%s %s: leaf %q, want pod_veths' %q", in.Name, tr.Dir, tr.Leaf, p.PodVeths.Leaf)
					}
					return strconv.FormatUint(tr.Rate.Bps.Bits(), 10)
				}
				got = append(got, in.Name+" "+r(in.Egress)+"/"+r(in.Ingress))
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("interfaces %q, want %q", got, c.want)
			}
			veths := filepath.Join(dir, "v.csv")
			if strings.Contains(c.policy, "pod_veths:\n") {
				veths = filepath.Join(dir, "pods", "veths.csv") // PodVethsFile under the state directory
			}
			if files := p.Files(); !slices.Contains(files, veths) {
				t.Errorf("Files() %q: the pod_veths file %s not among them", files, veths)
			}
		})
	}
}
