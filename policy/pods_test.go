package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/units"
)

// A per_host class whose hosts are pods: told apart by the pod's own
// address in its direction, listed in a file the agent writes (none
// until it does: no hosts, no error), each pod's rate held at its cap.
func TestPodsClass(t *testing.T) {
	const pol = `interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      default: rest
      classes:
        - {name: pods, rate: 500mbit, per_host: {%s}}
        - {name: gold, rate: 100mbit}
        - {name: rest, rate: 100mbit}
`
	cases := []struct {
		name, perHost, file string
		write               bool
		err, warn           string
		by                  string
		hosts               int
	}{
		{name: "egress: by src", perHost: "pods: egress, hosts_file: pods.csv", by: "src"},
		{name: "ingress: by dst", perHost: "pods: ingress, hosts_file: pods.csv", by: "dst"},
		{name: "by given to match", perHost: "by: src, pods: egress, hosts_file: pods.csv", by: "src"},
		{name: "by the other way", perHost: "by: dst, pods: egress, hosts_file: pods.csv", err: "p.yaml:7:54: class pods: per_host: pods: egress caps what the pods send, so the pod is the packet's src: by: src"},
		{name: "not a direction", perHost: "pods: both, hosts_file: pods.csv", err: `pods: expected egress (what the pods send, by src) or ingress (what they receive, by dst), found "both"`},
		{name: "with a cidr", perHost: "pods: egress, cidr: 10.0.0.0/24, hosts_file: pods.csv", err: "pods and cidr"},
		{name: "written, none yet", perHost: "pods: egress, hosts_file: pods.csv", write: true, file: "name,addresses,rate,ceil,parent\n", by: "src"},
		{name: "two pods, one below its share", perHost: "pods: egress, hosts_file: pods.csv", write: true, by: "src", hosts: 2,
			file: "name,addresses,rate,ceil,parent\ndefault.a,10.1.0.2 fd00::2,,1mbit,\ndefault.b,10.1.0.3,,300mbit,gold\n"},
		// The agent writes a namespace's group before its pods: a pod
		// naming a group not (yet) listed hangs below the pods class.
		{name: "an unknown parent", perHost: "pods: egress, hosts_file: pods.csv", write: true, by: "src", hosts: 1,
			file: "name,addresses,rate,ceil,parent\ndefault.a,10.1.0.2,,1mbit,silver\n", warn: `pods.csv:2:1: warning: hosts file: host default.a: parent "silver" is no group or class of eth0 egress: the host hangs below pods`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "p.yaml")
			os.WriteFile(file, []byte(strings.Replace(pol, "%s", c.perHost, 1)), 0o644)
			if c.write {
				os.WriteFile(filepath.Join(dir, "pods.csv"), []byte(c.file), 0o644)
			}
			p, warns, err := Load(file)
			if c.warn != "" && !strings.Contains(warns.Error(), c.warn) {
				t.Errorf("warnings %v, want %q", warns, c.warn)
			}
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ph := p.Interfaces[0].Egress.Classes[0].PerHost
			if ph.By != c.by || len(ph.Entries) != c.hosts {
				t.Fatalf("by %s with %d hosts, want %s and %d", ph.By, len(ph.Entries), c.by, c.hosts)
			}
			// What the agent watches: the file, empty while it is missing.
			src := p.Source(filepath.Join(dir, "pods.csv"))
			if src == nil || string(src) != c.file {
				t.Errorf("source %q, want %q", src, c.file)
			}
			if c.hosts == 1 && ph.Entries[0].ParentCls.Name != "pods" {
				t.Errorf("the pod hangs below %s, want pods", ph.Entries[0].ParentCls.Name)
			}
			if c.hosts == 2 {
				a, b := ph.Entries[0], ph.Entries[1]
				if a.CeilBps != units.FromBits(1e6) || a.RateBps != a.CeilBps {
					t.Errorf("a pod capped below its share: rate %v ceil %v, want both 1mbit", a.RateBps, a.CeilBps)
				}
				if b.RateBps != units.FromBits(250e6) || b.ParentCls.Name != "gold" || len(a.Addrs) != 2 {
					t.Errorf("b: rate %v below %s; a's addresses %v", b.RateBps, b.ParentCls.Name, a.Addrs)
				}
			}
		})
	}
	if f := PodsFile(Egress); !strings.HasSuffix(f, "/pods/egress.csv") {
		t.Errorf("PodsFile(egress) = %s", f)
	}
}
