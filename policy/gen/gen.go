// Package gen writes random valid policies: every match key, leaf,
// per_host form, nesting, weights, default placement, direction and classifier
// the grammar allows, from a seed, as YAML a user could have written.
// A property test runs each through validate, plan, apply and export;
// when one fails, Shrink cuts the policy down to a small one that still
// fails, which is the one to read.
//
//	p := gen.New(rand.New(rand.NewPCG(seed, 0)), gen.Options{Interfaces: []string{"veth0"}})
//	yaml := p.YAML()
package gen

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Options says what the policies may use.
type Options struct {
	// Interfaces the policies shape (one tree or two each).
	Interfaces []string
	// Leaves a class may name ("auto", "none", "pfifo", "bfifo" when
	// empty: what every kernel has). Add fq_codel, sfq, cake, fq where
	// the kernel has them.
	Leaves []string
	// MaxClasses bounds the classes of a tree (default 8).
	MaxClasses int
	// NoIngress leaves ingress trees out.
	NoIngress bool
	// NoU32Mark: the kernel's u32 cannot match marks (no
	// CONFIG_CLS_U32_MARK), so a tree set to classifier u32 has no mark
	// rules (sluice refuses them there).
	NoU32Mark bool
	// EDT lets a tree take backend edt (the kernel has fq): classes
	// paced in BPF, no leaves or weights, classified in BPF.
	EDT bool
	// NoPolice leaves policers out (police on a leaf class, or a
	// direction policed in place of a tree).
	NoPolice bool
	// NoHostsFile leaves per_host blocks over a hosts_file out (Files
	// holds the files the policy names).
	NoHostsFile bool
}

// Policy is a generated policy: its parts can be cut (Shrink).
type Policy struct {
	Interfaces []*Interface
}

// Interface is one device's trees.
type Interface struct {
	Name            string
	Egress, Ingress *Tree
	// RTT is the interface's rtt: ("" none, "on", or a flow table size).
	RTT string
}

// Tree is one direction: a tree, or a policer in its place (Police
// set, nothing else).
type Tree struct {
	Police     *Police
	Kbit       int
	Backend    string // "" (htb) or edt
	Classifier string // "", u32, bpf, auto
	Leaf       string
	Default    string
	Classes    []*Class
}

// Class is a class: its children, or its rules and hosts.
type Class struct {
	Name       string
	Kbit, Ceil int // Ceil 0: unset
	Prio       int
	Weight     int // 0: unset (set on every sibling or none)
	Leaf       string
	Match      []Match
	Classes    []*Class
	PerHost    *PerHost
	Police     *Police // on a leaf only
}

// Police is an RFC 2697 meter (PIR 0) or an RFC 2698 one.
type Police struct {
	CIR, PIR    int // kbit
	CBS, EBS    int // bytes; 0: the default
	Aware       bool
	Yellow, Red string // "": the default action
}

// Match is one rule: its keys in the order written.
type Match []KV

// KV is one key of a rule.
type KV struct{ Key, Value string }

// PerHost is a per_host block over a cidr, or over a hosts_file
// (Hosts set: the file's lines; CIDR may be set too).
type PerHost struct {
	By     string
	CIDR   string
	Prefix int
	Kbit   int
	Ceil   int
	Hosts  []Host
	Groups []Group // a groups_file's lines (with Hosts only)
}

// Host is a line of a hosts_file.
type Host struct {
	Name, Addrs string
	Kbit, Ceil  int    // 0: empty (the per_host's)
	Group       string // its parent: a group of the groups_file, or ""
}

// Group is a line of a groups_file.
type Group struct {
	Name       string
	Kbit, Ceil int // 0: empty
}

// New generates a policy from r.
func New(r *rand.Rand, o Options) *Policy {
	if len(o.Leaves) == 0 {
		o.Leaves = []string{"auto", "none", "pfifo", "bfifo"}
	}
	if o.MaxClasses == 0 {
		o.MaxClasses = 8
	}
	g := &generator{r: r, o: o}
	p := &Policy{}
	for _, name := range o.Interfaces {
		ifc := &Interface{Name: name, Egress: g.direction()}
		if !o.NoIngress && r.IntN(2) == 0 {
			ifc.Ingress = g.direction()
		}
		if ifc.Ingress != nil && r.IntN(4) == 0 {
			ifc.Egress = nil // ingress alone
		}
		p.Interfaces = append(p.Interfaces, ifc)
	}
	// Drawn last, so that a seed's trees stay what they were before
	// round trips were drawn.
	for _, ifc := range p.Interfaces {
		switch r.IntN(8) {
		case 0, 1:
			ifc.RTT = "on"
		case 2:
			ifc.RTT = "{flows: 4096}"
		}
	}
	return p
}

type generator struct {
	u32   bool // the tree being made is classifier u32
	edt   bool // the tree being made is backend edt
	r     *rand.Rand
	o     Options
	n     int // classes named so far
	cidrs int // per_host blocks so far (each gets its own prefix)
}

func (g *generator) pick(xs ...string) string { return xs[g.r.IntN(len(xs))] }

// direction is a tree, or now and then a policer in its place.
func (g *generator) direction() *Tree {
	if !g.o.NoPolice && g.r.IntN(10) == 0 {
		return &Tree{Police: g.police()}
	}
	return g.tree()
}

// police makes a meter: either RFC, either mode, each colour's action.
func (g *generator) police() *Police {
	p := &Police{CIR: g.pick2(256, 1000, 8000)}
	if g.r.IntN(2) == 0 {
		p.CBS = g.pick2(3028, 20000)
	}
	if g.r.IntN(2) == 0 {
		p.PIR = p.CIR * g.pick2(1, 2, 4)
	} else if g.r.IntN(2) == 0 {
		p.EBS = g.pick2(3028, 10000)
	}
	p.Aware = g.r.IntN(3) == 0
	p.Yellow = g.pick("", "", "pass", "drop", "remark:AF12")
	p.Red = g.pick("", "", "drop", "pass", "remark:CS1")
	return p
}

func (g *generator) tree() *Tree {
	rates := []int{512, 2000, 10000, 50000, 100000}
	t := &Tree{Kbit: rates[g.r.IntN(len(rates))], Classifier: g.pick("", "", "u32", "bpf", "auto")}
	if g.o.EDT && g.r.IntN(4) == 0 {
		t.Backend, t.Classifier = "edt", g.pick("", "bpf")
	}
	g.u32, g.edt = t.Classifier == "u32", t.Backend == "edt"
	if g.r.IntN(3) == 0 && !g.edt {
		t.Leaf = g.pick(g.o.Leaves...)
	}
	budget := 1 + g.r.IntN(g.o.MaxClasses)
	t.Classes = g.classes(t.Kbit, t.Kbit, &budget, 0)
	var leaves []string
	walk(t.Classes, func(c *Class) {
		if len(c.Classes) == 0 && c.PerHost == nil {
			leaves = append(leaves, c.Name)
		}
	})
	if len(leaves) == 0 {
		// Every leaf is per_host: a plain class for the rest.
		c := g.class(max(t.Kbit/10, 8), t.Kbit, 0)
		c.Match, c.PerHost = nil, nil
		if t.Classes[0].Weight > 0 {
			c.Weight = 1 // weights on every sibling, or none
		}
		t.Classes = append(t.Classes, c)
		leaves = append(leaves, c.Name)
	}
	t.Default = leaves[g.r.IntN(len(leaves))]
	return t
}

// classes makes up to *budget classes sharing kbit under a parent whose
// ceil is ceil.
func (g *generator) classes(kbit, ceil int, budget *int, depth int) []*Class {
	n := 1 + g.r.IntN(min(*budget, 4))
	*budget -= n
	var out []*Class
	// Rates add up to at most the parent's: shares of 90%.
	share := kbit * 9 / 10 / n
	weighted := g.r.IntN(5) == 0 && !g.edt
	for i := 0; i < n; i++ {
		c := g.class(max(share, 8), ceil, depth)
		if depth < 2 && *budget > 0 && g.r.IntN(3) == 0 {
			c.Match, c.PerHost, c.Leaf, c.Police = nil, nil, "", nil
			c.Classes = g.classes(c.Kbit, c.ceil(ceil), budget, depth+1)
		}
		if weighted {
			c.Weight = 1 + g.r.IntN(10)
		}
		out = append(out, c)
	}
	return out
}

func (c *Class) ceil(parent int) int {
	if c.Ceil > 0 {
		return c.Ceil
	}
	return parent
}

func (g *generator) class(kbit, ceil, depth int) *Class {
	g.n++
	c := &Class{Name: fmt.Sprintf("c%d", g.n), Kbit: kbit, Prio: g.r.IntN(8)}
	if g.r.IntN(3) == 0 {
		c.Ceil = kbit + g.r.IntN(ceil-kbit+1)
	}
	if g.r.IntN(3) == 0 && !g.edt {
		c.Leaf = g.pick(g.o.Leaves...)
	}
	for i, n := 0, g.r.IntN(3); i < n; i++ {
		c.Match = append(c.Match, g.match())
	}
	if g.r.IntN(6) == 0 {
		g.cidrs++
		ph := &PerHost{By: g.pick("dst", "src")}
		if g.r.IntN(2) == 0 {
			ph.CIDR = fmt.Sprintf("10.%d.%d.0/%d", 100+g.cidrs, g.r.IntN(200), g.pick2(28, 27, 26)) // below hostsFile's
		} else {
			ph.CIDR = fmt.Sprintf("2001:db8:%x::/%d", 0x100+g.cidrs, 56)
			ph.Prefix = 60
		}
		hosts := 16
		if ph.Prefix == 0 {
			hosts = 1 << (32 - atoiSuffix(ph.CIDR))
		}
		ph.Kbit = max(c.Kbit/hosts/2, 8)
		if g.r.IntN(2) == 0 {
			ph.Ceil = c.ceil(ceil)
		}
		if !g.o.NoHostsFile && g.r.IntN(2) == 0 {
			g.hostsFile(ph, c.Kbit)
			if g.u32 {
				c.Match = nil // u32 cannot look a host up after other tests
			}
		}
		c.PerHost = ph
		c.Leaf = ""
	}
	// Policers need the BPF classifier, and backend edt paces alone.
	if c.PerHost == nil && !g.u32 && !g.edt && !g.o.NoPolice && g.r.IntN(6) == 0 {
		c.Police = g.police()
	}
	return c
}

// hostsFile gives ph a hosts_file's lines: addresses and prefixes of
// both families, some with their own rates, and now and then no cidr.
func (g *generator) hostsFile(ph *PerHost, kbit int) {
	n := 1 + g.r.IntN(6)
	for i := 0; i < n; i++ {
		h := Host{Name: fmt.Sprintf("h%d", i+1)}
		v4 := fmt.Sprintf("10.%d.%d.%d", 100+g.cidrs, 200+i, 1+g.r.IntN(250))
		v6 := fmt.Sprintf("2001:db8:%x:%x::/64", 0x100+g.cidrs, 0x200+i)
		switch g.r.IntN(3) {
		case 0:
			h.Addrs = v4
		case 1:
			h.Addrs = v6
		default:
			h.Addrs = v4 + " " + v6
		}
		if g.r.IntN(2) == 0 {
			h.Kbit = max(kbit/n/2, 8)
			if g.r.IntN(2) == 0 {
				h.Ceil = h.Kbit * 2
			}
		}
		ph.Hosts = append(ph.Hosts, h)
	}
	if g.r.IntN(2) == 0 {
		ph.CIDR, ph.Prefix = "", 0
	}
	if g.r.IntN(3) == 0 {
		for i, n := 0, 1+g.r.IntN(3); i < n; i++ {
			gr := Group{Name: fmt.Sprintf("g%d", i+1)}
			if g.r.IntN(3) > 0 {
				gr.Kbit = max(kbit/(n+1), 8)
			}
			if g.r.IntN(2) == 0 {
				gr.Ceil = max(gr.Kbit, kbit/(n+1), 8) * 2
			}
			ph.Groups = append(ph.Groups, gr)
		}
		for i := range ph.Hosts {
			if g.r.IntN(3) > 0 {
				ph.Hosts[i].Group = ph.Groups[g.r.IntN(len(ph.Groups))].Name
			}
		}
	}
}

func (g *generator) pick2(xs ...int) int { return xs[g.r.IntN(len(xs))] }

func atoiSuffix(cidr string) int {
	var n int
	fmt.Sscanf(cidr[strings.LastIndex(cidr, "/")+1:], "%d", &n)
	return n
}

// match makes one rule from the keys that go together: an address
// family, a protocol the ports and flags need.
func (g *generator) match() Match {
	var m Match
	add := func(k, v string) { m = append(m, KV{k, v}) }
	v6 := g.r.IntN(3) == 0
	addr := func() string {
		if v6 {
			return g.pick("2001:db8:1::/48", "2001:db8:2::5", "fd00:7::/64")
		}
		return g.pick("192.168.1.0/24", "10.0.0.7", "172.16.0.0/12", "198.51.100.0/25")
	}
	proto := g.pick("", "tcp", "udp", "icmp", "47")
	if v6 && proto == "icmp" {
		proto = "icmpv6"
	}
	switch g.r.IntN(9) {
	case 0:
		add("src", addr())
	case 1:
		add("dst", addr())
	case 2:
		add("dst", addr())
		add("not_src", addr())
	case 3:
		add("not_dst", addr())
	}
	if proto != "" {
		add("proto", proto)
	}
	if proto == "tcp" || proto == "udp" || proto == "" && g.r.IntN(3) == 0 {
		switch g.r.IntN(4) {
		case 0:
			add("dport", g.pick("22", "443", "5060", "1000-1999", "[80, 8080]"))
		case 1:
			add("sport", g.pick("53", "60000-61000"))
		case 2:
			add("sport", "1024-65535")
			add("dport", "3478")
		}
	}
	if proto == "tcp" {
		switch g.r.IntN(8) {
		case 0, 1:
			add("tcp_ack", "true")
		case 2:
			add("tcp_syn", "true")
		}
	}
	switch g.r.IntN(8) {
	case 0:
		add("dscp", g.pick("EF", "AF41", "CS1", "46"))
	case 1:
		if !hasKey(m, "dscp") {
			add("tos", g.pick("0x10", "0x10/0xfc"))
		}
	case 2:
		if !g.u32 || !g.o.NoU32Mark {
			add("mark", g.pick("0x10", "0x100/0xf00", "7"))
		}
	}
	if len(m) == 0 {
		add("proto", "udp")
		add("dport", "53")
	}
	return m
}

func hasKey(m Match, k string) bool {
	for _, kv := range m {
		if kv.Key == k {
			return true
		}
	}
	return false
}

func walk(cs []*Class, f func(*Class)) {
	for _, c := range cs {
		f(c)
		walk(c.Classes, f)
	}
}

// YAML writes the policy.
func (p *Policy) YAML() string {
	var b strings.Builder
	b.WriteString("interfaces:\n")
	for _, ifc := range p.Interfaces {
		fmt.Fprintf(&b, "  - name: %s\n", ifc.Name)
		if ifc.RTT != "" {
			fmt.Fprintf(&b, "    rtt: %s\n", ifc.RTT)
		}
		for _, d := range []struct {
			dir string
			t   *Tree
		}{{"egress", ifc.Egress}, {"ingress", ifc.Ingress}} {
			if d.t == nil {
				continue
			}
			t := d.t
			if t.Police != nil {
				fmt.Fprintf(&b, "    %s:\n      police: %s\n", d.dir, t.Police.yaml())
				continue
			}
			fmt.Fprintf(&b, "    %s:\n      rate: %dkbit\n", d.dir, t.Kbit)
			if t.Backend != "" {
				fmt.Fprintf(&b, "      backend: %s\n", t.Backend)
			}
			if t.Classifier != "" {
				fmt.Fprintf(&b, "      classifier: %s\n", t.Classifier)
			}
			if t.Leaf != "" {
				fmt.Fprintf(&b, "      leaf: %s\n", t.Leaf)
			}
			fmt.Fprintf(&b, "      default: %s\n      classes:\n", t.Default)
			writeClasses(&b, t.Classes, "        ")
		}
	}
	return b.String()
}

func writeClasses(b *strings.Builder, cs []*Class, ind string) {
	for _, c := range cs {
		fmt.Fprintf(b, "%s- name: %s\n%s  rate: %dkbit\n", ind, c.Name, ind, c.Kbit)
		if c.Ceil > 0 {
			fmt.Fprintf(b, "%s  ceil: %dkbit\n", ind, c.Ceil)
		}
		if c.Prio > 0 {
			fmt.Fprintf(b, "%s  prio: %d\n", ind, c.Prio)
		}
		if c.Weight > 0 {
			fmt.Fprintf(b, "%s  weight: %d\n", ind, c.Weight)
		}
		if c.Leaf != "" {
			fmt.Fprintf(b, "%s  leaf: %s\n", ind, c.Leaf)
		}
		if len(c.Match) > 0 {
			fmt.Fprintf(b, "%s  match:\n", ind)
			for _, m := range c.Match {
				var kv []string
				for _, e := range m {
					kv = append(kv, e.Key+": "+e.Value)
				}
				fmt.Fprintf(b, "%s    - {%s}\n", ind, strings.Join(kv, ", "))
			}
		}
		if c.Police != nil {
			fmt.Fprintf(b, "%s  police: %s\n", ind, c.Police.yaml())
		}
		if ph := c.PerHost; ph != nil {
			fmt.Fprintf(b, "%s  per_host:\n%s    by: %s\n", ind, ind, ph.By)
			if ph.CIDR != "" {
				fmt.Fprintf(b, "%s    cidr: %s\n", ind, ph.CIDR)
			}
			if len(ph.Hosts) > 0 {
				fmt.Fprintf(b, "%s    hosts_file: %s\n", ind, hostsFileName(c))
			}
			if len(ph.Groups) > 0 {
				fmt.Fprintf(b, "%s    groups_file: %s\n", ind, groupsFileName(c))
			}
			if ph.Prefix > 0 {
				fmt.Fprintf(b, "%s    prefix: %d\n", ind, ph.Prefix)
			}
			fmt.Fprintf(b, "%s    rate: %dkbit\n", ind, ph.Kbit)
			if ph.Ceil > 0 {
				fmt.Fprintf(b, "%s    ceil: %dkbit\n", ind, ph.Ceil)
			}
		}
		if len(c.Classes) > 0 {
			fmt.Fprintf(b, "%s  classes:\n", ind)
			writeClasses(b, c.Classes, ind+"    ")
		}
	}
}

func (p *Police) yaml() string {
	kv := []string{fmt.Sprintf("cir: %dkbit", p.CIR)}
	if p.CBS > 0 {
		kv = append(kv, fmt.Sprintf("cbs: %d", p.CBS))
	}
	if p.PIR > 0 {
		kv = append(kv, fmt.Sprintf("pir: %dkbit", p.PIR))
	}
	if p.EBS > 0 {
		kv = append(kv, fmt.Sprintf("ebs: %d", p.EBS))
	}
	if p.Aware {
		kv = append(kv, "mode: aware")
	}
	if p.Yellow != "" {
		kv = append(kv, "yellow: "+p.Yellow)
	}
	if p.Red != "" {
		kv = append(kv, "red: "+p.Red)
	}
	return "{" + strings.Join(kv, ", ") + "}"
}

// NoU32Equivalent reports whether t's classification has no u32
// equivalent, so export refuses it: a class polices, or looks hosts of
// a hosts_file up after match rules.
func (t *Tree) NoU32Equivalent() bool {
	found := t.Police != nil
	walk(t.Classes, func(c *Class) {
		found = found || c.Police != nil || c.PerHost != nil && len(c.PerHost.Hosts) > 0 && len(c.Match) > 0
	})
	return found
}

func hostsFileName(c *Class) string  { return "hosts-" + c.Name + ".csv" }
func groupsFileName(c *Class) string { return "groups-" + c.Name + ".csv" }

func kbitOrEmpty(k int) string {
	if k == 0 {
		return ""
	}
	return fmt.Sprintf("%dkbit", k)
}

// Files is the files the policy names beside it (hosts_file), by name
// relative to the policy file.
func (p *Policy) Files() map[string]string {
	out := map[string]string{}
	for _, ifc := range p.Interfaces {
		for _, t := range []*Tree{ifc.Egress, ifc.Ingress} {
			if t == nil {
				continue
			}
			walk(t.Classes, func(c *Class) {
				if c.PerHost == nil || len(c.PerHost.Hosts) == 0 {
					return
				}
				var b strings.Builder
				groups := len(c.PerHost.Groups) > 0
				b.WriteString("name,addresses,rate,ceil")
				if groups {
					b.WriteString(",parent")
				}
				b.WriteString("\n")
				for _, h := range c.PerHost.Hosts {
					fmt.Fprintf(&b, "%s,%s,%s,%s", h.Name, h.Addrs, kbitOrEmpty(h.Kbit), kbitOrEmpty(h.Ceil))
					if groups {
						b.WriteString("," + h.Group)
					}
					b.WriteString("\n")
				}
				out[hostsFileName(c)] = b.String()
				if groups {
					var gb strings.Builder
					gb.WriteString("name,rate,ceil\n")
					for _, gr := range c.PerHost.Groups {
						fmt.Fprintf(&gb, "%s,%s,%s\n", gr.Name, kbitOrEmpty(gr.Kbit), kbitOrEmpty(gr.Ceil))
					}
					out[groupsFileName(c)] = gb.String()
				}
			})
		}
	}
	return out
}
