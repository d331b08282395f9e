package conform

import (
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sluice/bpf"
	"sluice/lab"
	"sluice/policy"
	"sluice/stats"
)

func parse(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, _, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const office = `interfaces:
  - name: eth0
    egress:
      rate: 19mbit
      default: bulk
      classes:
        - name: interactive
          rate: 2mbit
          ceil: 19mbit
          prio: 0
          match: [{proto: icmp}, {dport: 22}, {dscp: EF}, {tcp_ack: true}]
        - name: web
          rate: 8mbit
          prio: 1
          match: [{proto: tcp, dport: [80, 443]}]
        - name: bulk
          rate: 9mbit
          prio: 2
  - name: eth1
    egress:
      rate: 1gbit
      default: local
      classes:
        - name: internet
          rate: 95mbit
          match: [{not_src: 192.168.1.0/24}]
          per_host: {by: dst, cidr: 192.168.1.0/24, rate: 1mbit, ceil: 95mbit}
        - name: local
          rate: 900mbit
`

func byName(ss []*Subject) map[string]*Subject {
	m := map[string]*Subject{}
	for _, s := range ss {
		m[s.Name] = s
	}
	return m
}

// Every subject's flows land in its class, by the model; classes whose
// rules no bulk flow can match say why.
func TestSubjectsOffice(t *testing.T) {
	p := parse(t, office)
	eth0 := subjects(p.Interfaces[0].Egress, 8)
	if len(eth0) != 3 {
		t.Fatalf("eth0: %d subjects", len(eth0))
	}
	m := byName(eth0)
	// interactive: icmp is not TCP or UDP, so its second entry (dport 22).
	if f := m["interactive"].Flows; len(f) == 0 || f[0].Dst.Port() != 22 || f[0].Proto != "tcp" {
		t.Errorf("interactive: %+v (%s)", f, m["interactive"].NotDriven)
	}
	if f := m["web"].Flows; len(f) != maxFlows || f[0].Dst.Port() != 80 {
		t.Errorf("web: %+v", f)
	}
	seen := map[[2]uint16]bool{}
	for _, f := range m["web"].Flows {
		k := [2]uint16{f.Src.Port(), f.Dst.Port()}
		if seen[k] {
			t.Errorf("web: two flows share %v", k)
		}
		seen[k] = true
	}
	if f := m["bulk"].Flows; len(f) == 0 || f[0].Dst.Port() == 22 || f[0].Dst.Port() == 80 || f[0].Dst.Port() == 443 {
		t.Errorf("bulk: %+v", f)
	}
	if m["web"].UDP != nil {
		t.Errorf("web is tcp only, got a UDP flow %+v", m["web"].UDP)
	}
	if m["bulk"].UDP == nil {
		t.Error("bulk takes UDP too")
	}

	eth1 := subjects(p.Interfaces[1].Egress, 4)
	if len(eth1) != 5 || eth1[0].Name != "internet/192.168.1.1" || eth1[3].Name != "internet/192.168.1.4" || eth1[4].Name != "local" {
		var names []string
		for _, s := range eth1 {
			names = append(names, s.Name)
		}
		t.Fatalf("eth1 subjects %v", names)
	}
	h := eth1[1]
	want := netip.MustParseAddr("192.168.1.2")
	if len(h.Flows) == 0 || h.Flows[0].Dst.Addr() != want || netip.MustParsePrefix("192.168.1.0/24").Contains(h.Flows[0].Src.Addr()) {
		t.Errorf("host: %+v", h.Flows)
	}
	if h.Rate != 1e6 || h.Ceil != 95e6 {
		t.Errorf("host rate %v ceil %v", h.Rate, h.Ceil)
	}
	for _, s := range append(eth0, eth1...) {
		tree := p.Interfaces[0].Egress
		if strings.Contains(s.Name, "/") || s.Name == "local" {
			tree = p.Interfaces[1].Egress
		}
		for _, f := range s.Flows {
			pk := packet{src: f.Src.Addr(), dst: f.Dst.Addr(), proto: protoTCP, sport: f.Src.Port(), dport: f.Dst.Port(), dscp: f.DSCP}
			if f.Proto == "udp" {
				pk.proto = protoUDP
			}
			if got := classOf(tree, pk); got != s.Name {
				t.Errorf("%s: flow %v lands in %s", s.Name, f, got)
			}
		}
	}
}

func TestSubjectsNotDriven(t *testing.T) {
	p := parse(t, `interfaces:
  - name: eth0
    egress:
      rate: 10mbit
      default: rest
      classes:
        - {name: acks, rate: 1mbit, match: [{tcp_ack: true}]}
        - {name: syns, rate: 1mbit, match: [{tcp_syn: true, dport: 443}]}
        - {name: ping, rate: 1mbit, match: [{proto: icmp}]}
        - {name: dns, rate: 1mbit, match: [{proto: udp, dport: 53}]}
        - {name: shadow, rate: 1mbit, match: [{proto: udp, dport: 53}]}
        - {name: gate, rate: 2mbit, match: [{src: 10.3.0.0/16}], default: g2, classes: [{name: g1, rate: 1mbit, match: [{dscp: EF}]}, {name: g2, rate: 1mbit}]}
        - {name: rest, rate: 1mbit}
`)
	m := byName(subjects(p.Interfaces[0].Egress, 8))
	for name, why := range map[string]string{"ping": "no TCP or UDP", "shadow": "lands in class dns first"} {
		if s := m[name]; len(s.Flows) > 0 || !strings.Contains(s.NotDriven, why) {
			t.Errorf("%s: flows %v, not driven %q (want %q)", name, s.Flows, s.NotDriven, why)
		}
	}
	if s := m["dns"]; len(s.Flows) != 1 || s.Flows[0].Proto != "udp" || s.Flows[0].Dst.Port() != 53 {
		// One UDP port and one source port: flows differ by source port.
		if len(s.Flows) == 0 {
			t.Errorf("dns: %+v %s", s.Flows, s.NotDriven)
		}
	}
	for _, name := range []string{"g1", "g2"} {
		s := m[name]
		if len(s.Flows) == 0 || !netip.MustParsePrefix("10.3.0.0/16").Contains(s.Flows[0].Src.Addr()) {
			t.Errorf("%s (behind the gate): %+v %s", name, s.Flows, s.NotDriven)
		}
	}
	if m["g1"].Flows[0].DSCP != 46 {
		t.Errorf("g1's DSCP %d", m["g1"].Flows[0].DSCP)
	}
	// Small pure ACKs are sent raw, at a rate: one flow.
	if f := m["acks"].Flows; len(f) != 1 || f[0].Proto != "ack" || f[0].Greedy() || m["acks"].UDP != nil {
		t.Errorf("acks: %+v udp %+v (%s)", f, m["acks"].UDP, m["acks"].NotDriven)
	}
	// So are bare SYNs, to the port the rule names.
	if f := m["syns"].Flows; len(f) != 1 || f[0].Proto != "syn" || f[0].Greedy() || f[0].Dst.Port() != 443 {
		t.Errorf("syns: %+v (%s)", f, m["syns"].NotDriven)
	}
}

// Rules users write that the bed's first choice of addresses and ports
// does not reach: each subject is found where its rules put it, by the
// model, and a rule the bed cannot drive says why.
func TestSubjectsOfEveryRuleKind(t *testing.T) {
	p := parse(t, `interfaces:
  - name: eth0
    egress:
      rate: 12mbit
      default: rest
      classes:
        - {name: voip, rate: 1mbit, match: [{proto: udp, dport: 5060}]}
        - {name: marked, rate: 1mbit, match: [{mark: 0x10/0xf0}]}
        - {name: v6, rate: 1mbit, match: [{dst: 2001:db8:9::/48}]}
        - {name: smtp, rate: 1mbit, match: [{sport: 25}]}
        - {name: af41, rate: 1mbit, match: [{dscp: AF41}]}
        - {name: tos, rate: 1mbit, match: [{tos: 0x20/0xe0}]}
        - {name: narrow, rate: 1mbit, match: [{dst: 10.1.0.0/25}]}
        - {name: wide, rate: 1mbit, match: [{dst: 10.1.0.0/24}]}
        - {name: ports-low, rate: 1mbit, match: [{dport: 1000-1003}]}
        - {name: ports, rate: 1mbit, match: [{dport: 1000-2000}]}
        - {name: rest, rate: 500kbit}
    ingress:
      rate: 10mbit
      default: rest
      classes:
        - {name: marked, rate: 1mbit, match: [{mark: 7}]}
        - {name: rest, rate: 1mbit}
  - name: eth1
    egress:
      rate: 100mbit
      default: local
      classes:
        - name: internet
          rate: 60mbit
          match: [{not_src: 192.168.1.0/24}]
          per_host: {by: dst, cidr: 192.168.1.0/28}
        - {name: other, rate: 10mbit, match: [{not_dst: 192.168.1.0/24}]}
        - {name: local, rate: 30mbit, match: [{src: 192.168.1.0/24}]}
`)
	eg := p.Interfaces[0].Egress
	m := byName(subjects(eg, 8))
	check := func(name string, ok func(f Flow) bool) {
		t.Helper()
		s := m[name]
		if len(s.Flows) == 0 || !ok(s.Flows[0]) {
			t.Errorf("%s: %+v (%s)", name, s.Flows, s.NotDriven)
		}
	}
	check("voip", func(f Flow) bool { return f.Proto == "udp" && f.Dst.Port() == 5060 })
	check("marked", func(f Flow) bool { return f.Mark&0xf0 == 0x10 })
	check("v6", func(f Flow) bool { return f.Dst.Addr().Is6() && f.Src.Addr().Is6() })
	check("smtp", func(f Flow) bool { return f.Src.Port() == 25 })
	check("af41", func(f Flow) bool { return f.DSCP == 34 })
	check("tos", func(f Flow) bool { return (f.DSCP<<2)&0xe0 == 0x20 })
	// Past the narrower prefix an earlier class names.
	check("wide", func(f Flow) bool {
		return netip.MustParsePrefix("10.1.0.0/24").Contains(f.Dst.Addr()) && !netip.MustParsePrefix("10.1.0.0/25").Contains(f.Dst.Addr())
	})
	check("ports", func(f Flow) bool { return f.Dst.Port() > 1003 && f.Dst.Port() <= 2000 })
	if s := m["voip"]; s.UDP == nil || len(s.Flows) != 1 {
		t.Errorf("voip: one UDP flow, %+v udp %+v", s.Flows, s.UDP)
	}
	for _, s := range m {
		for _, f := range s.Flows {
			pk := packet{src: f.Src.Addr(), dst: f.Dst.Addr(), proto: protoTCP, sport: f.Src.Port(), dport: f.Dst.Port(), dscp: f.DSCP, mark: f.Mark, ack: f.Proto == "ack", syn: f.Proto == "syn"}
			if f.Proto == "udp" {
				pk.proto = protoUDP
			}
			if got := classOf(eg, pk); got != s.Name {
				t.Errorf("%s: flow %+v lands in %s", s.Name, f, got)
			}
		}
	}
	in := byName(subjects(p.Interfaces[0].Ingress, 8))
	if s := in["marked"]; len(s.Flows) > 0 || !strings.Contains(s.NotDriven, "nothing sets on an arriving packet") {
		t.Errorf("ingress mark: %+v %q", s.Flows, s.NotDriven)
	}
	// A LAN-to-LAN class behind `not_src: LAN` and `not_dst: LAN`: from
	// the LAN to the LAN, at addresses no host subject takes.
	lan := subjects(p.Interfaces[1].Egress, 4)
	lm := byName(lan)
	lp := netip.MustParsePrefix("192.168.1.0/24")
	if s := lm["local"]; len(s.Flows) == 0 || !lp.Contains(s.Flows[0].Src.Addr()) || !lp.Contains(s.Flows[0].Dst.Addr()) {
		t.Fatalf("local: %+v (%s)", s.Flows, s.NotDriven)
	}
	// No address at both ends: the bed routes each to one side.
	side := map[netip.Addr]bool{}
	for _, s := range lan {
		for _, f := range append(s.Flows, s.flowUDP()...) {
			for a, src := range map[netip.Addr]bool{f.Src.Addr(): true, f.Dst.Addr(): false} {
				if was, ok := side[a]; ok && was != src {
					t.Errorf("%s: %v is used at both ends", s.Name, a)
				}
				side[a] = src
			}
		}
	}
}

// Marks that contradict (one entry's bits against a gate's) cannot be
// driven, and say so.
func TestPickMark(t *testing.T) {
	a := &policy.Match{Mark: &policy.Masked32{Val: 0x10, Mask: 0xf0}}
	b := &policy.Match{Mark: &policy.Masked32{Val: 0x3, Mask: 0xf}}
	c := &policy.Match{Mark: &policy.Masked32{Val: 0x20, Mask: 0xff}}
	if v, ok := pickMark([]*policy.Match{a, b}); !ok || v != 0x13 {
		t.Errorf("a, b: %#x %v", v, ok)
	}
	if _, ok := pickMark([]*policy.Match{a, c}); ok {
		t.Error("a and c contradict")
	}
}

// Hosts from a hosts_file: in file order, each with its own rate, hung
// below its parent column's class in the reference.
func TestSubjectsHostsFile(t *testing.T) {
	p := loadFiles(t, `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      default: rest
      classes:
        - {name: subs, rate: 10mbit, per_host: {by: dst, hosts_file: h.csv}}
        - {name: gold, rate: 8mbit}
        - {name: rest, rate: 1mbit}
`, map[string]string{"h.csv": "name,addresses,rate,ceil,parent\na,10.0.0.1,2mbit,20mbit,\nb,10.0.1.0/28,4mbit,20mbit,gold\nc,2001:db8::5,2mbit,20mbit,\n"})
	tr := p.Interfaces[0].Egress
	ss := subjects(tr, 8)
	m := byName(ss)
	if len(ss) != 4 || m["subs/a"] == nil || m["subs/b"] == nil || m["subs/c"] == nil || m["rest"] == nil {
		t.Fatalf("subjects %v", m)
	}
	if m["gold"] != nil {
		t.Error("gold holds hosts, not packets: not a subject")
	}
	if f := m["subs/b"].Flows; len(f) == 0 || f[0].Dst.Addr() != netip.MustParseAddr("10.0.1.1") {
		t.Errorf("b: %+v", f)
	}
	if f := m["subs/c"].Flows; len(f) == 0 || !f[0].Dst.Addr().Is6() || !f[0].Src.Addr().Is6() {
		t.Errorf("c (IPv6): %+v", f)
	}
	// b hangs below gold (8mbit guaranteed), a and c below subs (10):
	// with b, a and c busy, b gets gold's 8 and what gold may borrow.
	ideal, err := Reference(tr, ss, Cell{Demands: []Demand{{Subject: "subs/a", Proto: "tcp"}, {Subject: "subs/b", Proto: "tcp"}, {Subject: "subs/c", Proto: "tcp"}}})
	if err != nil {
		t.Fatal(err)
	}
	// Root 20: subs guaranteed 10, gold 8, rest 1 idle; the 2 left go by
	// rate 10:8, subs's 11.11 to a and c by their rates (equal).
	for name, want := range map[string]float64{"subs/a": 50e6 / 9, "subs/c": 50e6 / 9, "subs/b": 80e6 / 9} {
		if math.Abs(ideal[name]-want) > 1 {
			t.Errorf("%s: ideal %.0f, want %.0f (%v)", name, ideal[name], want, ideal)
		}
	}
}

func TestAutoCells(t *testing.T) {
	p := parse(t, office)
	tr := p.Interfaces[0].Egress
	ss := subjects(tr, 8)
	cells := autoCells(tr, "eth0/egress", ss)
	var names []string
	for _, c := range cells {
		names = append(names, c.Name)
	}
	want := []string{"all", "interactive alone", "web alone", "bulk alone", "interactive + web", "interactive + bulk", "web + bulk",
		"interactive with 8 flows", "interactive udp at half its share"}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Fatalf("cells %q\nwant %q", names, want)
	}
	// The UDP cell's demand is half of interactive's ideal with all busy
	// (its DSCP entry takes UDP): it gets its 2mbit then (the rates add
	// up to the link, nothing is spare), so 1mbit.
	last := cells[len(cells)-1]
	if d := last.Demands[0]; d.Proto != "udp" || math.Abs(d.Rate-1e6) > 1 {
		t.Errorf("udp demand %+v", d)
	}
	// Many hosts: four alone, four subsets, the same for the same tree.
	p1 := parse(t, office)
	tr1 := p1.Interfaces[1].Egress
	big := subjects(tr1, 8)
	c1, c2 := autoCells(tr1, "eth1/egress", big), autoCells(tr1, "eth1/egress", big)
	if len(c1) != 1+4+4+1+1 || c1[5].Name != c2[5].Name {
		t.Errorf("%d cells; %q vs %q", len(c1), c1[5].Name, c2[5].Name)
	}
}

// The reference through a parsed policy: the weights case.
func TestReferenceWeights(t *testing.T) {
	p := parse(t, `interfaces:
  - name: lan
    egress:
      rate: 21mbit
      default: d
      classes:
        - {name: a, rate: 1mbit, ceil: 21mbit, match: [{dport: 1}]}
        - {name: b, rate: 2mbit, ceil: 21mbit, match: [{dport: 2}]}
        - {name: c, rate: 4mbit, ceil: 21mbit, match: [{dport: 3}]}
        - {name: d, rate: 100kbit, ceil: 21mbit}
`)
	tr := p.Interfaces[0].Egress
	ss := subjects(tr, 8)
	abc := Cell{Demands: []Demand{{Subject: "a", Proto: "tcp"}, {Subject: "b", Proto: "tcp"}, {Subject: "c", Proto: "tcp"}}}
	ideal, err := Reference(tr, ss, abc)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"a": 3e6, "b": 6e6, "c": 12e6, "d": 0} {
		if math.Abs(ideal[name]-want) > 1 {
			t.Errorf("%s: %.0f, want %.0f", name, ideal[name], want)
		}
	}
}

// A groups_file's groups are classes beside the per_host class's own
// hosts, each weighed by its rate in one unit (as HTB's quanta weigh
// them): with a capped group (4mbit, ceil 6) full, another group of
// 4mbit and two 1mbit hosts share the rest 4:1:1 beyond their rates.
// groupsPolicy is a per_host class whose hosts (h.csv) fall in groups
// (g.csv): a1 and a2 in acme (4mbit, capped at 6), b1 in beta (4mbit),
// c1 and c2 in none.
const groupsPolicy = `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      default: rest
      classes:
        - {name: users, rate: 19mbit, per_host: {by: dst, hosts_file: h.csv, groups_file: g.csv, rate: 1mbit}}
        - {name: rest, rate: 1mbit}
`

func groupsFiles() map[string]string {
	return map[string]string{
		"h.csv": "name,addresses,rate,ceil,parent\na1,10.0.0.2,,,acme\na2,10.0.0.3,,,acme\nb1,10.0.0.5,,,beta\nc1,10.0.0.6,,,\nc2,10.0.0.7,,,\n",
		"g.csv": "name,rate,ceil\nacme,4mbit,6mbit\nbeta,4mbit,\n",
	}
}

// The groups shape's reference, at the tree's rate and at 95% of it: a
// bed that carries 95% of the root's rate still gives a capped group
// all of its ceil, so the reference at what the tree carried keeps the
// cap and shares out the rest. Judged by it that cell is exact; against
// the nominal reference the group's hosts read 5% high.
func TestReferenceGroups(t *testing.T) {
	p := loadFiles(t, groupsPolicy, groupsFiles())
	tr := p.Interfaces[0].Egress
	ss := subjects(tr, 8)
	var all Cell
	for _, n := range []string{"users/a1", "users/a2", "users/b1", "users/c1", "users/c2"} {
		all.Demands = append(all.Demands, Demand{Subject: n, Proto: "tcp"})
	}
	ideal, err := Reference(tr, ss, all)
	if err != nil {
		t.Fatal(err)
	}
	// acme takes its cap (6: 3 each); the rest of what users carries
	// goes 4, 1, 1 by rate and what is beyond by weight 4:1:1.
	want := func(beyond float64) map[string]float64 {
		return map[string]float64{"users/a1": 3e6, "users/a2": 3e6, "users/b1": 4e6 + beyond*4/6, "users/c1": 1e6 + beyond/6, "users/c2": 1e6 + beyond/6}
	}
	for _, c := range []struct {
		name     string
		capacity float64
		want     map[string]float64
	}{
		{"at the rate", 20e6, want(8e6)},
		{"at 95% of it", 19e6, want(7e6)},
	} {
		t.Run(c.name, func(t *testing.T) {
			at, err := ReferenceAt(tr, ss, all, c.capacity)
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range c.want {
				if math.Abs(at[name]-want) > 1e3 || c.capacity == 20e6 && at[name] != ideal[name] {
					t.Errorf("%s: %.0f, want %.0f (Reference: %.0f)", name, at[name], want, ideal[name])
				}
			}
			if c.capacity == 20e6 {
				return
			}
			if v := Judge(all, ideal, at, at, nil, 0.95); !v.Pass || v.Worst > 1e-9 {
				t.Errorf("judged by what the tree carried: pass %v, worst %s %.4f (%s)", v.Pass, v.WorstSubject, v.Worst, v.Why)
			}
			if v := Judge(all, ideal, nil, at, nil, 0.95); v.Pass || v.Worst < 0.05 {
				t.Errorf("judged by the nominal reference: pass %v, worst %s %.4f; want acme's hosts 5%% high", v.Pass, v.WorstSubject, v.Worst)
			}
		})
	}
}

func TestJudge(t *testing.T) {
	c := Cell{Demands: []Demand{{Subject: "a", Proto: "tcp", Flows: 1}, {Subject: "b", Proto: "tcp", Flows: 1}, {Subject: "tiny", Proto: "tcp", Flows: 1}}}
	ideal := map[string]float64{"a": 6e6, "b": 12e6, "tiny": 0.2e6}
	for _, tc := range []struct {
		name     string
		measured map[string]float64
		eff      float64
		pass     bool
		worst    string
	}{
		{"exact", map[string]float64{"a": 6e6, "b": 12e6, "tiny": 0.2e6}, 1, true, ""},
		// The bed carries 90%: shares exact, total 90%, efficiency 0.9.
		{"slow bed", map[string]float64{"a": 5.4e6, "b": 10.8e6, "tiny": 0.18e6}, 0.9, true, ""},
		{"slow bed not corrected", map[string]float64{"a": 5.4e6, "b": 10.8e6, "tiny": 0.18e6}, 1, false, ""},
		{"a 6% low", map[string]float64{"a": 5.64e6, "b": 12.36e6, "tiny": 0.2e6}, 1, false, "a"},
		// tiny's share 1.6% instead of 1.1%: 0.5% of the total, within 5%
		// of a quarter of an equal share (8.3%): 0.42%... just beyond.
		{"tiny over its floor", map[string]float64{"a": 6e6, "b": 12e6, "tiny": 0.3e6}, 1, false, "tiny"},
		{"tiny within its floor", map[string]float64{"a": 6e6, "b": 12e6, "tiny": 0.26e6}, 1, true, ""},
		{"nothing measured", map[string]float64{}, 1, false, ""},
		// A reference run that dipped (93%) is no reason to fail a cell
		// that carried the nominal rate; more than the nominal is.
		{"more than a dipped reference", map[string]float64{"a": 6e6, "b": 12e6, "tiny": 0.2e6}, 0.93, true, ""},
		{"more than the nominal", map[string]float64{"a": 6.6e6, "b": 13.2e6, "tiny": 0.22e6}, 1, false, ""},
	} {
		v := Judge(c, ideal, nil, tc.measured, nil, tc.eff)
		if v.Pass != tc.pass || tc.worst != "" && v.WorstSubject != tc.worst {
			t.Errorf("%s: pass %v worst %s %.3f util %.3f (%s)", tc.name, v.Pass, v.WorstSubject, v.Worst, v.Utilisation, v.Why)
		}
		if !v.Pass && v.Why == "" {
			t.Errorf("%s: failed without a reason", tc.name)
		}
	}
	// NaN never passes.
	if v := Judge(c, ideal, nil, map[string]float64{"a": math.NaN(), "b": 12e6, "tiny": 0.2e6}, nil, 1); v.Pass {
		t.Error("NaN passed")
	}
}

func TestClassOf(t *testing.T) {
	p := parse(t, office)
	eth0, eth1 := p.Interfaces[0].Egress, p.Interfaces[1].Egress
	a := netip.MustParseAddr
	for _, c := range []struct {
		tree *policy.Tree
		p    packet
		want string
	}{
		{eth0, packet{src: a("10.0.0.1"), dst: a("10.0.0.2"), proto: protoTCP, sport: 1000, dport: 22}, "interactive"},
		{eth0, packet{src: a("10.0.0.1"), dst: a("10.0.0.2"), proto: protoUDP, sport: 1000, dport: 80}, "bulk"},
		{eth0, packet{src: a("10.0.0.1"), dst: a("10.0.0.2"), proto: protoTCP, sport: 1000, dport: 443}, "web"},
		{eth0, packet{src: a("10.0.0.1"), dst: a("10.0.0.2"), proto: protoUDP, sport: 1000, dport: 5000, dscp: 46}, "interactive"},
		{eth1, packet{src: a("8.8.8.8"), dst: a("192.168.1.7"), proto: protoTCP, sport: 1, dport: 2}, "internet/192.168.1.7"},
		{eth1, packet{src: a("192.168.1.3"), dst: a("192.168.1.7"), proto: protoTCP, sport: 1, dport: 2}, "local"},
		{eth1, packet{src: a("8.8.8.8"), dst: a("192.168.1.255"), proto: protoTCP, sport: 1, dport: 2}, "local"},
		{eth1, packet{src: a("8.8.8.8"), dst: a("10.9.9.9"), proto: protoTCP, sport: 1, dport: 2}, "local"},
	} {
		if got := classOf(c.tree, c.p); got != c.want {
			t.Errorf("%v: %s, want %s", c.p, got, c.want)
		}
	}
}

// A policed class carries at most the rate its policer drops above: the
// reference gives it no more, and the others what it cannot take.
func TestReferencePoliced(t *testing.T) {
	for _, tc := range []struct {
		police string
		want   float64
	}{
		{"{cir: 2mbit, pir: 4mbit, red: drop}", 4e6},
		{"{cir: 2mbit, pir: 4mbit, yellow: drop, red: drop}", 2e6},
		{"{cir: 3mbit, cbs: 10kb, ebs: 20kb}", 3e6},
		{"{cir: 3mbit, red: remark:AF12}", 10e6},
	} {
		p := parse(t, `interfaces:
  - name: lan
    egress:
      rate: 20mbit
      classifier: bpf
      default: b
      classes:
        - {name: a, rate: 10mbit, ceil: 20mbit, match: [{dport: 1}], police: `+tc.police+`}
        - {name: b, rate: 10mbit, ceil: 20mbit}
`)
		tr := p.Interfaces[0].Egress
		ss := subjects(tr, 8)
		ideal, err := Reference(tr, ss, Cell{Demands: []Demand{{Subject: "a", Proto: "tcp"}, {Subject: "b", Proto: "tcp"}}})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(ideal["a"]-tc.want) > 1 || math.Abs(ideal["b"]-(20e6-tc.want)) > 1 {
			t.Errorf("police %s: a %.0f, b %.0f; want a %.0f", tc.police, ideal["a"], ideal["b"], tc.want)
		}
	}
}

// A cell measured twice says so under its total, with what the first
// measurement found, and a short one with what the plain limit carried
// between the two.
func TestReportShowsSecondMeasurements(t *testing.T) {
	v := Verdict{Pass: true, Worst: 0.021, IdealTotal: 1e7, MeasuredTotal: 9.9e6, Utilisation: 1}
	slow := v
	slow.Efficiency = 0.91
	r := &Report{Policy: "p.yaml", Trees: []*TreeReport{{Interface: "eth0", Direction: "egress", Device: "eth0", Pass: true,
		Cells: []*CellReport{
			{Cell: Cell{Name: "short"}, Verdict: slow, FirstTotal: 8.1e6, ReferenceAgain: 9.1e6, SecondWindow: 10},
			{Cell: Cell{Name: "off"}, Verdict: v, FirstWorst: 0.068},
		}}}}
	var b strings.Builder
	r.WriteText(&b, false)
	for _, want := range []string{"8.10 Mbit/s (measured twice, the second over 10 s: the first carried this in all)", "9.10 Mbit/s (a plain limit between the two: at this bed's 91% then)",
		"(measured twice: the first was 6.8% from the reference)"} {
		if !strings.Contains(strings.Join(strings.Fields(b.String()), " "), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// A limit the caller names counts only where the tree's plan says it
// (a tree that does not say it must be measured again like any other),
// and the report names it under the cell.
func TestKnownLimit(t *testing.T) {
	r := &runner{opt: Options{Limit: func(tree, cell string) string {
		if tree == "w0/egress" && cell == "with the default" {
			return "less than 1/15 of the heaviest sibling's"
		}
		return ""
	}}}
	notes := []string{"under top, prio 0: the weight of d is less than 1/15 of the heaviest sibling's: while it borrows ..."}
	for _, c := range []struct {
		tree, cell string
		notes      []string
		want       bool
	}{
		{"w0/egress", "with the default", notes, true},
		{"w0/egress", "with the default", nil, false},
		{"w0/egress", "4 flows each", notes, false},
		{"h0/egress", "with the default", notes, false},
	} {
		if got := r.knownLimit(c.tree, c.cell, c.notes) != ""; got != c.want {
			t.Errorf("%s %q with %d notes: known %v, want %v", c.tree, c.cell, len(c.notes), got, c.want)
		}
	}
	if (&runner{}).knownLimit("w0/egress", "with the default", notes) != "" {
		t.Error("a limit without Options.Limit")
	}
	v := Verdict{Worst: 1.27, Why: "d: 8.3% of the total, the reference says 0.4%"}
	rep := &Report{Trees: []*TreeReport{{Interface: "w0", Direction: "egress", Cells: []*CellReport{{Cell: Cell{Name: "with the default"}, Verdict: v, Limit: "less than 1/15"}}}}}
	for quiet, want := range map[bool]string{false: "(a limit the plan notes: less than 1/15)", true: "FAIL: d: 8.3% of the total, the reference says 0.4% (a limit the plan notes)"} {
		var b strings.Builder
		rep.WriteText(&b, quiet)
		if !strings.Contains(strings.Join(strings.Fields(b.String()), " "), want) {
			t.Errorf("quiet %v: report lacks %q:\n%s", quiet, want, b.String())
		}
	}
}

// A cell's window holds 200 full-size packets of the smallest share it
// judges, in whole seconds: the measure time at 100 Mbit/s, 5 s for two
// shares of 500 kbit/s, 8 s for a 200 kbit/s class beside 3.8 Mbit/s
// (judged to a quarter of an equal share of the 4 Mbit/s, not to its
// own sliver: 13 s), never beyond 2 minutes, and the measure time
// where no share is known. A subject alone has no share to judge, only
// its total: 50 packets of it (7 s at 100 kbit/s, not 25).
func TestWindowHoldsPackets(t *testing.T) {
	c := Cell{Demands: []Demand{{Subject: "a"}, {Subject: "b"}, {Subject: "idle"}}}
	for _, tc := range []struct {
		ideal map[string]float64
		want  time.Duration
	}{
		{map[string]float64{"a": 50e6, "b": 50e6}, 3 * time.Second},
		{map[string]float64{"a": 500e3, "b": 500e3, "idle": 0}, 5 * time.Second},
		{map[string]float64{"a": 3.8e6, "b": 200e3}, 8 * time.Second},
		{map[string]float64{"a": 150e3, "b": 10e3}, 2 * time.Minute},
		{map[string]float64{}, 3 * time.Second},
	} {
		if got := Window(3*time.Second, c, tc.ideal); got != tc.want {
			t.Errorf("%v: window %v, want %v", tc.ideal, got, tc.want)
		}
	}
	alone := Cell{Demands: []Demand{{Subject: "a"}}}
	if got := Window(3*time.Second, alone, map[string]float64{"a": 100e3}); got != 7*time.Second {
		t.Errorf("a 100 kbit/s subject alone: window %v, want 7s", got)
	}
	if got := Window(3*time.Second, alone, map[string]float64{"a": 3e6}); got != 3*time.Second {
		t.Errorf("a 3 Mbit/s subject alone: window %v, want the measure time", got)
	}
}

// Only the measured device's classes count: the ingress tree on the
// interface's ifb has classes of the same names, which a reading of the
// interface holds too.
func TestClassRatesCountOnlyTheMeasuredDevice(t *testing.T) {
	c0 := map[string]float64{"eth0\x00interactive": 0, "eth0\x00(root)": 0, "ifb-eth0\x00interactive": 0, "eth0\x00bulk": 100}
	c1 := map[string]float64{"eth0\x00interactive": 1000, "eth0\x00(root)": 5000, "ifb-eth0\x00interactive": 700, "eth0\x00bulk": 4100,
		"eth0\x00new": 10} // not in the first reading: no rate
	classes, total := classRates(c0, c1, 2, []string{"eth0"})
	if classes["interactive"] != 4000 || classes["bulk"] != 16000 || total["eth0"] != 20000 || len(classes) != 2 || len(total) != 1 {
		t.Errorf("classes %v, total %v: want interactive 4000 (not its ingress namesake's 2800 too), bulk 16000, eth0 20000", classes, total)
	}
}

// A run that measured nothing (every tree skipped) is no pass: it says
// so rather than PASS.
func TestNothingMeasuredIsNoPass(t *testing.T) {
	r := &Report{Policy: "p.yaml", Trees: []*TreeReport{{Interface: "eth0", Direction: "egress", Skipped: "no subject can be driven"}}}
	if r.Measured() != 0 {
		t.Fatalf("measured %d", r.Measured())
	}
	var b strings.Builder
	r.WriteText(&b, false)
	if !strings.Contains(b.String(), "verdict: NOTHING MEASURED") || strings.Contains(b.String(), "verdict: PASS") {
		t.Errorf("report:\n%s", b.String())
	}
}

// loadFiles loads policy src with files (name: content) beside it, all
// in a new directory.
func loadFiles(t *testing.T, src string, files map[string]string) *policy.Policy {
	t.Helper()
	dir := t.TempDir()
	files["p.yaml"] = src
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, _, err := policy.Load(filepath.Join(dir, "p.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The agent a controlled run starts reads the policy from a directory
// of its own: every file the policy names must still be found, with
// what it lists (a groups_file left relative was not: the agent of an
// HTB tree with groups failed to start).
func TestEffectivePolicyKeepsItsFiles(t *testing.T) {
	p := loadFiles(t, groupsPolicy, groupsFiles())
	file, cleanup, err := writeEffective(p)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if filepath.Dir(file) == filepath.Dir(p.File) {
		t.Fatalf("written beside the policy (%s): the test proves nothing", file)
	}
	q, _, err := policy.Load(file)
	if err != nil {
		t.Fatalf("the effective policy does not load: %v", err)
	}
	ph := q.Interfaces[0].Egress.Classes[0].PerHost
	var names []string
	for _, e := range ph.Entries {
		parent := ""
		if e.ParentCls != nil {
			parent = e.ParentCls.Name
		}
		names = append(names, e.Name+">"+parent)
	}
	if got, want := strings.Join(names, " "), "a1>users:acme a2>users:acme b1>users:beta c1>users c2>users"; got != want {
		t.Errorf("hosts and their groups: %q, want %q", got, want)
	}
	cleanup()
	if _, err := os.Stat(filepath.Dir(file)); !os.IsNotExist(err) {
		t.Errorf("cleanup left %s: %v", filepath.Dir(file), err)
	}
}

// A neutral port is never 0 and never one the rules name, also where the
// rules name every port from 1024 up (a generated policy's sport:
// 1024-65535 once gave a flow from port 0, which connect refuses).
func TestNeutralPortNeverZero(t *testing.T) {
	p := loadFiles(t, `interfaces:
  - name: eth0
    egress:
      rate: 10mbit
      default: c1
      classes:
        - {name: c1, rate: 9mbit, match: [{proto: tcp, sport: 1024-65535, dport: 3478}]}
`, map[string]string{})
	nb := newNeutral(p.Interfaces[0].Egress)
	seen := map[uint16]bool{}
	for i := 0; i < 2000; i++ {
		port := nb.port(&nb.nextSource)
		if port == 0 || port >= 1024 || seen[port] {
			t.Fatalf("port %d (after %d)", port, i)
		}
		seen[port] = true
		if i == 1022 {
			break // 1..1023 handed out
		}
	}
	f := referenceFlow(p.Interfaces[0].Egress, nil)
	if f.Src.Port() == 0 || f.Dst.Port() == 0 {
		t.Fatalf("reference flow %v", f)
	}
}

// A cell's round trips per subject: what each class's histograms gained
// between the cell's two readings, its copies on several devices or
// shards added up; a class that timed nothing has none.
func TestClassRTTs(t *testing.T) {
	hist := func(count uint64, at int) *bpf.RTTHist {
		h := &bpf.RTTHist{Count: count, Sum: count * 20e6}
		h.B[at] = count
		return h
	}
	h0 := map[string]*bpf.RTTHist{"eth0\x00a": hist(100, 200), "eth0\x00idle": hist(7, 200)}
	h1 := map[string]*bpf.RTTHist{"eth0\x00a": hist(150, 200), "eth1\x00a": hist(30, 200), "eth0\x00idle": hist(7, 200), "eth0\x00new": hist(12, 210)}
	got := classRTTs(h0, h1)
	if _, ok := got["idle"]; ok || len(got) != 2 {
		t.Fatalf("classes %v, want a and new (idle timed nothing between the readings)", got)
	}
	a := got["a"]
	want := hist(80, 200) // 50 more on eth0, 30 on eth1
	if p, _ := bpf.Quantile(want, 0.5); a.Samples != 80 || a.P50 != p.Seconds() {
		t.Errorf("a: %d samples, p50 %v; want 80, %v", a.Samples, a.P50, p)
	}
	if n := got["new"]; n.Samples != 12 || !(n.P50 > a.P50) {
		t.Errorf("new: %+v", n)
	}
	// Reported: the quantiles where there are enough samples, and the
	// responsiveness the median gives.
	bed := 5 * time.Millisecond
	if s := subjectRTT(a, bed); s.Samples != 80 || s.P50 != a.P50 || s.RPM != 60/a.P50 ||
		math.Abs(s.Added-(a.P50-bed.Seconds())) > 1e-12 || s.Grade != lab.Grade(1000*s.Added) {
		t.Errorf("subjectRTT(a) = %+v", s)
	}
	if s := subjectRTT(a, time.Second); s.Added != 0 || s.Grade != "A+" {
		t.Errorf("a round trip under the bed's adds nothing: %+v", s)
	}
	few := subjectRTT(stats.NewRTT(hist(5, 200)), bed)
	if few.P50 != 0 || few.Text() != "few (5)" {
		t.Errorf("5 samples: %+v %q, want no quantiles", few, few.Text())
	}
	if subjectRTT(nil, bed) != nil || (*SubjectRTT)(nil).Text() != "-" {
		t.Error("no round trips must report none")
	}
}

// The report gives each subject's round trips beside its share, in the
// text and on the page.
func TestReportShowsRoundTrips(t *testing.T) {
	v := Verdict{Pass: true, Worst: 0.01, IdealTotal: 1e7, MeasuredTotal: 1e7, Utilisation: 1, Subjects: []SubjectResult{
		{Name: "bulk", Demand: "tcp x4", Ideal: 5e6, Measured: 5e6, RTT: &SubjectRTT{Samples: 400, P50: 0.0213, P95: 0.025, RPM: 60 / 0.0213, Grade: "A"}},
		{Name: "few", Demand: "tcp x1", Ideal: 3e6, Measured: 3e6, RTT: &SubjectRTT{Samples: 4}},
		{Name: "voip", Demand: "udp 2mbit", Ideal: 2e6, Measured: 2e6},
	}}
	r := &Report{Policy: "p.yaml", Trees: []*TreeReport{{Interface: "eth0", Direction: "egress", Device: "eth0", Pass: true,
		Cells: []*CellReport{{Cell: Cell{Name: "load"}, Verdict: v}}}}}
	var b strings.Builder
	r.WriteText(&b, false)
	text := b.String()
	for _, want := range []string{"ROUND TRIP p50 / p95", "21.3 / 25.0 ms (A)", "few (4)"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if !regexp.MustCompile(`voip\s.*%\s+-\n`).MatchString(text) {
		t.Errorf("voip (UDP, nothing timed) must read -:\n%s", text)
	}
	b.Reset()
	if err := r.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "<td>21.3 / 25.0 ms (A)</td>") || !strings.Contains(b.String(), "<td>-</td>") {
		t.Errorf("page lacks the round trips:\n%s", b.String())
	}
}

// A run times the interfaces whose trees sluice's BPF program classifies
// (no work added to a packet's way), keeps an interface's own `rtt:`,
// and leaves u32 trees untimed.
func TestTimedPolicy(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	src := "interfaces:\n" +
		"  - name: eth0\n    egress: {rate: 10mbit, classifier: bpf}\n" +
		"  - name: eth1\n    rtt: off\n    egress: {rate: 10mbit, classifier: bpf}\n" +
		"  - name: eth2\n    egress: {rate: 10mbit, classifier: u32}\n" +
		"  - name: eth3\n    egress: {rate: 10mbit, classifier: bpf}\n    ingress: {rate: 10mbit, classifier: u32}\n"
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := LoadPolicy(file, "")
	if err != nil {
		t.Fatal(err)
	}
	names := timeable(pol)
	if !names["eth0"] || !names["eth1"] || names["eth2"] || names["eth3"] {
		t.Errorf("timeable %v, want eth0 and eth1 (BPF classifies every tree), not eth2 or eth3 (u32)", names)
	}
	got, err := timed(pol, names)
	if err != nil {
		t.Fatal(err)
	}
	if got.Interfaces[0].RTT == nil || got.Interfaces[1].RTT != nil || got.Interfaces[2].RTT != nil || got.Interfaces[3].RTT != nil {
		t.Errorf("timed: %v %v %v %v; want eth0 alone timed (eth1 says off)", got.Interfaces[0].RTT, got.Interfaces[1].RTT,
			got.Interfaces[2].RTT, got.Interfaces[3].RTT)
	}
	if !strings.Contains(string(got.Source(file)), "rtt: on") {
		t.Errorf("the agent's copy (the source) is not timed:\n%s", got.Source(file))
	}
	if same, _ := timed(pol, map[string]bool{"eth2": false}); same != pol {
		t.Error("a run that times nothing must keep the policy as it is")
	}
}
