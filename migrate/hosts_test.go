package migrate

import (
	"fmt"
	"strings"
	"testing"
)

// hostDraft is a tree of n leaf classes matching one destination each,
// then a default class; mut changes class i.
func hostDraft(n int, mut func(i int, c *Class)) *Draft {
	var cs []*Class
	for i := 0; i < n; i++ {
		c := &Class{At: At{"script.sh", i + 1}, Origin: fmt.Sprintf("1:%x", 0x10+i), Name: fmt.Sprintf("c%d", i), Rate: "1mbit", Ceil: "10mbit",
			rateBits: 1e6, ceilBits: 1e7, Prio: intp(2), Match: []*Match{{Dst: []string{fmt.Sprintf("10.0.0.%d", i+1)}}}}
		if mut != nil {
			mut(i, c)
		}
		cs = append(cs, c)
	}
	rest := &Class{Name: "rest", Rate: "1mbit", Ceil: "20mbit", rateBits: 1e6, ceilBits: 2e7}
	t := &Tree{Rate: "20mbit", Default: "rest", Classes: append(cs, rest)}
	return &Draft{Tool: "test", Interfaces: []*Interface{{Name: "eth0", Egress: t}}}
}

func TestManySingleHostClassesBecomeAHostsFile(t *testing.T) {
	d := hostDraft(10, func(i int, c *Class) {
		if i == 9 {
			c.Match = append(c.Match, &Match{Dst: []string{"2001:db8::9"}}) // a host of both families
		}
	})
	d.collapseHosts()
	cs := d.Interfaces[0].Egress.Classes
	if len(cs) != 2 || cs[0].PerHost == nil || cs[0].Name != "hosts" {
		t.Fatalf("want the hosts class and rest:\n%s", d.Render())
	}
	h := cs[0]
	if h.PerHost.By != "dst" || *h.PerHost.Prio != 2 || h.Rate != "10mbit" || h.Ceil != "10mbit" || h.PerHost.HostsFile != "hosts-eth0-egress.csv" {
		t.Errorf("hosts class %+v per_host %+v", h, h.PerHost)
	}
	lines := string(RenderHosts(d.Hosts["hosts-eth0-egress.csv"]))
	for _, want := range []string{"c0,10.0.0.1,1mbit,10mbit,\n", "c9,10.0.0.10 2001:db8::9,1mbit,10mbit,\n", "# script.sh:1, class 1:10\n"} {
		if !strings.Contains(lines, want) {
			t.Errorf("hosts file lacks %q:\n%s", want, lines)
		}
	}
	if o := d.Origins()["eth0/egress"]["1:12"]; o != "hosts/c2" {
		t.Errorf("origin 1:12 is %q, want hosts/c2 (sluice's name for the host's class)", o)
	}
	if err := d.Check(); err != nil {
		t.Fatal(err)
	}
	wantFinding(t, d, Exact, `script.sh:1$`, `per_host class hosts \(by dst\)`)
}

// What must not collapse: too few, a run broken by another prio, an
// address in two classes, a default among them, rules other than
// addresses.
func TestSingleHostClassesThatStay(t *testing.T) {
	for _, c := range []struct {
		name string
		d    *Draft
	}{
		{"seven", hostDraft(7, nil)},
		{"prio breaks the run", hostDraft(12, func(i int, c *Class) {
			if i == 5 {
				c.Prio = intp(3)
			}
		})},
		{"overlap", hostDraft(10, func(i int, c *Class) {
			if i == 3 {
				c.Match[0].Dst = []string{"10.0.0.0/24"}
			}
		})},
		{"a default", hostDraft(10, func(i int, c *Class) {
			if i == 4 {
				c.Name = "rest-4"
			}
		})},
		{"a port", hostDraft(10, func(i int, c *Class) {
			if i == 4 {
				c.Match[0].Dport = []string{"80"}
			}
		})},
		{"a burst", hostDraft(10, func(i int, c *Class) {
			if i == 4 {
				c.Burst = "10kb"
			}
		})},
	} {
		if c.name == "a default" {
			c.d.Interfaces[0].Egress.Default = "rest-4"
		}
		n := len(c.d.Interfaces[0].Egress.Classes)
		c.d.collapseHosts()
		if got := len(c.d.Interfaces[0].Egress.Classes); got != n || len(c.d.Hosts) != 0 {
			t.Errorf("%s: %d classes became %d, hosts files %v", c.name, n, got, c.d.Hosts)
		}
	}
}
