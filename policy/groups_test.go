package policy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sluice/units"
)

// groupsPolicy is a 1gbit egress tree whose per_host class subs (400mbit,
// ceil 800mbit) lists hosts.csv and groups.csv; opts go under the tree,
// perHost into per_host.
const groupsPolicy = `interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      default: rest%s
      classes:
        - {name: subs, rate: 400mbit, ceil: 800mbit, per_host: {by: dst, hosts_file: hosts.csv%s}}
        - {name: gold, rate: 100mbit}
        - {name: rest, rate: 100mbit}
`

const groupsHosts = "name,addresses,rate,ceil,parent\na,10.0.0.2,,,acme\nb,10.0.0.3,30mbit,,acme\nc,10.0.0.4,,,beta\nd,10.0.0.5,,,\ne,10.0.0.6,,,gold\n"

// loadGroups writes the policy (tree options opts, per_host options
// perHost), hosts and groups (when not "") into a directory and loads it.
func loadGroups(t *testing.T, opts, perHost, hosts, groups string) (*Policy, Errors, error, string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(strings.Replace(strings.Replace(groupsPolicy, "%s", opts, 1), "%s", perHost, 1)), 0o644)
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(hosts), 0o644)
	if groups != "" {
		os.WriteFile(filepath.Join(dir, "groups.csv"), []byte(groups), 0o644)
	}
	p, warns, err := Load(file)
	return p, warns, err, dir
}

// A groups_file's lines are classes below the per_host class, named
// CLASS:GROUP; the hosts whose parent column names one hang below it, the
// others where they did. An empty rate is a host's default share, an
// empty ceil the class's; percentages are of the class's.
func TestGroupsFile(t *testing.T) {
	p, _, err, dir := loadGroups(t, "", ", groups_file: groups.csv", groupsHosts, "name,rate,ceil\nacme,20mbit,50mbit\nbeta,,30%\n")
	if err != nil {
		t.Fatal(err)
	}
	subs := p.Interfaces[0].Egress.Classes[0]
	if len(subs.Classes) != 2 {
		t.Fatalf("subs has %d classes, want its 2 groups", len(subs.Classes))
	}
	acme, beta := subs.Classes[0], subs.Classes[1]
	if acme.Name != "subs:acme" || beta.Name != "subs:beta" || acme.Group != "acme" || acme.Parent != subs {
		t.Fatalf("groups %q (group %q, parent %v) and %q", acme.Name, acme.Group, acme.Parent, beta.Name)
	}
	share := units.FromBits(400e6) / 5 // five hosts: a host's default share
	for _, c := range []struct {
		g          *Class
		rate, ceil units.Rate
		hosts      []string
	}{
		{acme, units.FromBits(20e6), units.FromBits(50e6), []string{"a", "b"}},
		{beta, share, units.FromBits(240e6), []string{"c"}},
	} {
		var names []string
		for _, e := range c.g.Hosts {
			names = append(names, e.Name)
			if e.ParentCls != c.g || e.Owner != subs || e.ClassName != "subs/"+e.Name {
				t.Errorf("host %s: parent %s, owner %s, class %s", e.Name, e.ParentCls.Name, e.Owner.Name, e.ClassName)
			}
		}
		if c.g.RateBps != c.rate || c.g.CeilBps != c.ceil || !slices.Equal(names, c.hosts) {
			t.Errorf("%s: rate %s ceil %s hosts %v, want %s %s %v", c.g.Name, c.g.RateBps, c.g.CeilBps, names, c.rate, c.ceil, c.hosts)
		}
	}
	ents := subs.PerHost.Entries
	if ents[3].ParentCls != subs || ents[4].ParentCls.Name != "gold" {
		t.Errorf("d below %s, e below %s; want subs and gold", ents[3].ParentCls.Name, ents[4].ParentCls.Name)
	}
	// A group's hosts fit its rate, or its ceil would not hold (HTB lets
	// a class within its rate send whatever its parent's state): a's even
	// part of acme's 20mbit (10) and b's 30mbit are cut to add up to 20;
	// c has beta's rate; d keeps a host's default share.
	for i, want := range []units.Rate{units.FromBits(5e6), units.FromBits(15e6), share, share} {
		if ents[i].RateBps != want {
			t.Errorf("%s: rate %s, want %s", ents[i].Name, ents[i].RateBps, want)
		}
	}
	// The agent watches the groups file as it watches the hosts file.
	gf := filepath.Join(dir, "groups.csv")
	if !slices.Contains(p.Files(), gf) || p.Source(gf) == nil {
		t.Errorf("files %v, source of %s %q", p.Files(), gf, p.Source(gf))
	}
	// rate: auto and a slower bed resolve the groups again, as classes.
	at := p.Interfaces[0].Egress.AtRate(units.FromBits(500e6))
	g := at.Classes[0].Classes
	if g[0].RateBps != units.FromBits(20e6) || g[1].RateBps != at.Classes[0].PerHost.RateBps || g[1].CeilBps != at.Classes[0].CeilBps*3/10 {
		t.Errorf("at 500mbit: acme %s, beta %s ceil %s", g[0].RateBps, g[1].RateBps, g[1].CeilBps)
	}
	if g[0].Hosts[0].ParentCls != g[0] {
		t.Errorf("at 500mbit: acme's hosts hang below the original group")
	}
}

// A groups file that cannot be used is refused at its line and column,
// and so is one the tree cannot have.
func TestGroupsFileErrors(t *testing.T) {
	cases := []struct {
		name, opts, perHost, hosts, groups, err string
	}{
		{"header", "", ", groups_file: groups.csv", groupsHosts, "name,rate\nacme,1mbit\n", `groups.csv:1:1: groups file: header "name,rate": expected name,rate,ceil`},
		{"twice", "", ", groups_file: groups.csv", groupsHosts, "name,rate,ceil\nacme,,\nbeta,,\nacme,,\n", `groups.csv:4:1: groups file: group "acme" appears twice (first on line 2)`},
		{"a bad name", "", ", groups_file: groups.csv", groupsHosts, "name,rate,ceil\nac/me,,\n", `groups.csv:2:1: groups file: group name "ac/me"`},
		{"a bad rate", "", ", groups_file: groups.csv", groupsHosts, "name,rate,ceil\nacme,fast,\n", `groups.csv:2:6: groups file: group acme: rate:`},
		{"fields", "", ", groups_file: groups.csv", groupsHosts, "name,rate,ceil\nacme,1mbit\n", `groups.csv:2:1: groups file: 2 fields, the header has 3`},
		{"ceil below rate", "", ", groups_file: groups.csv", groupsHosts, "name,rate,ceil\nacme,20mbit,10mbit\nbeta,,\n", `groups.csv:2:1: groups file: group acme: ceil 10mbit is below rate 20mbit`},
		{"a host's name", "", ", groups_file: groups.csv", groupsHosts + "acme,10.0.0.9,,,\n", "name,rate,ceil\nacme,,\nbeta,,\n", `groups.csv:2:1: groups file: group acme has the name of host acme`},
		{"missing", "", ", groups_file: groups.csv", groupsHosts, "", "groups_file"},
		{"without hosts_file", "", ", groups_file: groups.csv", groupsHosts, "name,rate,ceil\n", ""},
		{"an unknown group", "", ", groups_file: groups.csv", groupsHosts, "name,rate,ceil\nacme,,\n", `hosts.csv:4:1: hosts file: host c: parent class "beta" does not exist`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			perHost, want := c.perHost, c.err
			if c.name == "without hosts_file" {
				// cidr hosts and a groups file: nothing could name a group.
				p := strings.Replace(groupsPolicy, "%s", "", 1)
				p = strings.Replace(p, "hosts_file: hosts.csv%s", "cidr: 10.0.0.0/28, groups_file: groups.csv", 1)
				dir := t.TempDir()
				os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(p), 0o644)
				_, _, err := Load(filepath.Join(dir, "p.yaml"))
				if err == nil || !strings.Contains(err.Error(), "p.yaml:7:") || !strings.Contains(err.Error(), "groups are named by a hosts_file's parent column") {
					t.Fatalf("err %v", err)
				}
				return
			}
			_, _, err, _ := loadGroups(t, c.opts, perHost, c.hosts, c.groups)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("err %v, want %q", err, want)
			}
		})
	}
}

// A pods class reads the agent's groups file beside its pods file: none
// is no groups, never a refused policy; an EDT tree has them as HTB does.
func TestPodsGroupsFile(t *testing.T) {
	const pods = "name,addresses,rate,ceil,parent\nns1.a,10.0.0.2,,5mbit,ns1\nns2.b,10.0.0.3,,,\n"
	if f := PodsGroupsFile("/run/sluice/pods/egress.csv"); f != "/run/sluice/pods/egress.namespaces.csv" {
		t.Errorf("PodsGroupsFile = %s", f)
	}
	for _, c := range []struct {
		name, opts, groups, warn string
		groups2                  int
	}{
		{"none written", "", "", `pods.csv:2:1: warning: hosts file: host ns1.a: parent "ns1" is no group or class of eth0 egress: the host hangs below subs`, 0},
		{"one namespace", "", "name,rate,ceil\nns1,100mbit,50mbit\n", "", 1},
		{"edt", "\n      backend: edt", "name,rate,ceil\nns1,100mbit,50mbit\n", "", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "p.yaml")
			p := strings.Replace(groupsPolicy, "%s", c.opts, 1)
			p = strings.Replace(p, "by: dst, hosts_file: hosts.csv%s", "pods: egress, hosts_file: pods.csv", 1)
			os.WriteFile(file, []byte(p), 0o644)
			os.WriteFile(filepath.Join(dir, "pods.csv"), []byte(pods), 0o644)
			gf := filepath.Join(dir, "pods.namespaces.csv")
			if c.groups != "" {
				os.WriteFile(gf, []byte(c.groups), 0o644)
			}
			pol, warns, err := Load(file)
			if err != nil {
				t.Fatal(err)
			}
			if c.warn != "" && !strings.Contains(warns.Error(), c.warn) || c.warn == "" && len(warns) > 0 {
				t.Errorf("warnings %v, want %q", warns, c.warn)
			}
			subs := pol.Interfaces[0].Egress.Classes[0]
			if len(subs.Classes) != c.groups2 {
				t.Fatalf("%d groups, want %d", len(subs.Classes), c.groups2)
			}
			if src := pol.Source(gf); src == nil || string(src) != c.groups {
				t.Errorf("source %q, want %q (watched, empty while missing)", src, c.groups)
			}
			a := subs.PerHost.Entries[0]
			if c.groups2 == 1 {
				// A pods group's guarantee is held at its cap, as a pod's is.
				g := subs.Classes[0]
				if g.RateBps != units.FromBits(50e6) || g.CeilBps != g.RateBps || a.ParentCls != g {
					t.Errorf("ns1: rate %s ceil %s, a below %s", g.RateBps, g.CeilBps, a.ParentCls.Name)
				}
			} else if a.ParentCls != subs {
				t.Errorf("a below %s, want subs", a.ParentCls.Name)
			}
		})
	}
}

// A pods group's hosts divide its guarantee by their weights' parts
// (the pods file's percentages), each then held at its own cap; a pod
// without a part gets an even one.
func TestPodsGroupDividedByWeight(t *testing.T) {
	for _, c := range []struct {
		name, pods string
		want       map[string]float64 // Mbit/s
	}{
		{"weights 3:1, the heavier capped above its part",
			"name,addresses,rate,ceil,parent\nns1.web,10.0.0.2,75%,10mbit,ns1\nns1.db,10.0.0.3,25%,,ns1\n",
			map[string]float64{"ns1.web": 1.5, "ns1.db": 0.5}},
		{"weights 3:1, the heavier capped below its part",
			"name,addresses,rate,ceil,parent\nns1.web,10.0.0.2,75%,1mbit,ns1\nns1.db,10.0.0.3,25%,,ns1\n",
			map[string]float64{"ns1.web": 1, "ns1.db": 0.5}},
		{"even",
			"name,addresses,rate,ceil,parent\nns1.web,10.0.0.2,,10mbit,ns1\nns1.db,10.0.0.3,,,ns1\n",
			map[string]float64{"ns1.web": 1, "ns1.db": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "p.yaml")
			p := strings.Replace(groupsPolicy, "%s", "", 1)
			p = strings.Replace(p, "by: dst, hosts_file: hosts.csv%s", "pods: egress, hosts_file: pods.csv", 1)
			os.WriteFile(file, []byte(p), 0o644)
			os.WriteFile(filepath.Join(dir, "pods.csv"), []byte(c.pods), 0o644)
			os.WriteFile(filepath.Join(dir, "pods.namespaces.csv"), []byte("name,rate,ceil\nns1,2mbit,6mbit\n"), 0o644)
			pol, _, err := Load(file)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, e := range pol.Interfaces[0].Egress.Classes[0].PerHost.Entries {
				got[e.Name] = e.RateBps.BitsFloat() / 1e6
			}
			for name, want := range c.want {
				if got[name] < want*0.999 || got[name] > want*1.001 {
					t.Errorf("%s: rate %.3f Mbit/s, want %.3f (all: %v)", name, got[name], want, got)
				}
			}
		})
	}
}
