package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"sluice/safefile"
)

// Limits on what a policy reads: a policy file is hand-written, a hosts
// file may list a million hosts. Beyond them (or from a FIFO, a device)
// reading is refused rather than exhausting memory or waiting forever.
const (
	MaxPolicyBytes    = 16 << 20
	MaxHostsFileBytes = 256 << 20
)

// Load reads and validates a policy file. Warnings come back even when
// the policy is valid.
func Load(file string) (*Policy, Errors, error) {
	b, err := safefile.ReadRegular(file, "policy", MaxPolicyBytes)
	if err != nil {
		return nil, nil, err
	}
	return Parse(file, b)
}

// Parse reads and validates a policy. On failure the error is an Errors
// listing every problem found, each as FILE:LINE:COL: message.
func Parse(file string, src []byte) (*Policy, Errors, error) {
	d := &Diag{File: file}
	p := &parser{d: d, dir: filepath.Dir(file), sources: map[string][]byte{file: src}}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(src))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) { // nothing but comments and blanks
			d.Errorf(Pos{1, 1}, "empty policy: expected \"interfaces:\" with at least one interface")
		} else {
			d.Errorf(yamlErrPos(err), "%s", yamlErrMsg(err))
		}
		return nil, d.Warnings, d.Err()
	}
	pol := &Policy{File: file}
	if len(doc.Content) == 0 || doc.Content[0].Tag == "!!null" {
		d.Errorf(Pos{1, 1}, "empty policy: expected \"interfaces:\" with at least one interface")
		return nil, d.Warnings, d.Err()
	}
	// One policy per file: a second document would be silently ignored.
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		d.Errorf(pos(&next), "a second YAML document (after ---): a policy file holds one; merge them or use two files")
		return nil, d.Warnings, d.Err()
	} else if !errors.Is(err, io.EOF) {
		d.Errorf(yamlErrPos(err), "%s", yamlErrMsg(err))
		return nil, d.Warnings, d.Err()
	}
	p.policy(pol, doc.Content[0])
	if len(d.Errs) == 0 {
		validate(pol, d)
	}
	d.Warnings.sort()
	if err := d.Err(); err != nil {
		return nil, d.Warnings, err
	}
	pol.sources = p.sources
	return pol, d.Warnings, nil
}

type parser struct {
	d       *Diag
	dir     string            // the policy file's directory, for hosts_file
	sources map[string][]byte // what each file read held
}

func pos(n *yaml.Node) Pos { return Pos{n.Line, n.Column} }

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func yamlErrPos(err error) Pos {
	// yaml.v3 reports "yaml: line N: ..." without a column.
	var line int
	if _, e := fmt.Sscanf(strings.TrimPrefix(err.Error(), "yaml: "), "line %d:", &line); e == nil {
		return Pos{line, 1}
	}
	return Pos{1, 1}
}

func yamlErrMsg(err error) string {
	m := strings.TrimPrefix(err.Error(), "yaml: ")
	if i := strings.Index(m, ": "); strings.HasPrefix(m, "line ") && i > 0 {
		m = m[i+2:]
	}
	return "invalid YAML: " + m
}

// fields walks a mapping, calling the handler for each known key and
// reporting unknown and repeated keys.
func (p *parser) fields(n *yaml.Node, what string, handlers map[string]func(v *yaml.Node)) bool {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.d.Errorf(pos(n), "%s: expected a mapping (key: value), found %s", what, describe(n))
		return false
	}
	seen := map[string]Pos{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], resolve(n.Content[i+1])
		if prev, dup := seen[k.Value]; dup {
			p.d.Errorf(pos(k), "%s: key %q repeated (first at line %d)", what, k.Value, prev.Line)
			continue
		}
		seen[k.Value] = pos(k)
		h, ok := handlers[k.Value]
		if !ok {
			names := keys(handlers)
			sort.Strings(names)
			msg := fmt.Sprintf("%s: unknown key %q", what, k.Value)
			if s := suggest(k.Value, names); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			p.d.Errorf(pos(k), "%s; expected one of: %s", msg, strings.Join(names, ", "))
			continue
		}
		h(v)
	}
	return true
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.d.Errorf(pos(n), "%s: expected a value, found %s", what, describe(n))
		return "", false
	}
	return n.Value, true
}

// flag reads rule field key (a boolean: only true and false, as
// written) and records where it was.
func (p *parser) flag(n *yaml.Node, what, key string, fields map[string]Pos) bool {
	fields[key] = pos(n)
	s, ok := p.str(n, what+"."+key)
	if !ok {
		return false
	}
	if s != "true" && s != "false" {
		p.d.Errorf(pos(n), "%s.%s: expected true or false, found %q", what, key, s)
	}
	return s == "true"
}

func (p *parser) intIn(n *yaml.Node, what string, lo, hi int) (int, bool) {
	s, ok := p.str(n, what)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil || v < int64(lo) || v > int64(hi) {
		p.d.Errorf(pos(n), "%s: expected a whole number from %d to %d, found %q", what, lo, hi, s)
		return 0, false
	}
	return int(v), true
}

// MinWeight and MaxWeight bound a class's weight: weights are
// relative, and a billion to one is far beyond what any share can show,
// while the controller's arithmetic stays exact (a weight of 1e-320,
// once accepted, gave two busy classes the whole link each).
const (
	MinWeight = 1e-3
	MaxWeight = 1e6
)

// MinApplyAbove is the lowest apply_above: a limit applied to a child
// that uses under 1% of it would hold back a child that is all but idle.
const MinApplyAbove = 0.01

// weight reads a positive number (a class's relative share).
func (p *parser) weight(n *yaml.Node, what string) float64 {
	s, ok := p.str(n, what)
	if !ok {
		return 0
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v >= MinWeight) || v > MaxWeight {
		p.d.Errorf(pos(n), "%s: expected a number from %g to %g (weights are relative: 1, 2, 3 or 10, 20, 30 mean the same), found %q", what, MinWeight, float64(MaxWeight), s)
		return 0
	}
	return v
}

// list accepts a sequence or a single value.
func (p *parser) list(n *yaml.Node) []*yaml.Node {
	n = resolve(n)
	if n.Kind == yaml.SequenceNode {
		out := make([]*yaml.Node, len(n.Content))
		for i, c := range n.Content {
			out[i] = resolve(c)
		}
		return out
	}
	return []*yaml.Node{n}
}

func (p *parser) rate(n *yaml.Node, what string) *Rate {
	s, ok := p.str(n, what)
	if !ok {
		return nil
	}
	r, warn, err := ParseRate(s)
	if err != nil {
		p.d.Errorf(pos(n), "%s: %v", what, err)
		return nil
	}
	if warn != "" {
		p.d.Warnf(pos(n), "%s: %s", what, warn)
	}
	r.Pos = pos(n)
	return &r
}

func (p *parser) size(n *yaml.Node, what string) *Size {
	s, ok := p.str(n, what)
	if !ok {
		return nil
	}
	b, err := ParseSize(s)
	if err != nil {
		p.d.Errorf(pos(n), "%s: %v", what, err)
		return nil
	}
	return &Size{Bytes: b, Pos: pos(n)}
}

func (p *parser) limit(n *yaml.Node, what string) *Limit {
	s, ok := p.str(n, what)
	if !ok {
		return nil
	}
	if v, err := strconv.ParseUint(s, 10, 32); err == nil {
		if v == 0 {
			p.d.Errorf(pos(n), "%s: must be at least 1 packet", what)
			return nil
		}
		return &Limit{Packets: uint32(v), Pos: pos(n)}
	}
	b, err := ParseSize(s)
	if err != nil {
		p.d.Errorf(pos(n), "%s: want a number of packets (1000) or a size in bytes (64kb): %v", what, err)
		return nil
	}
	return &Limit{Bytes: uint32(b), Pos: pos(n)}
}

func (p *parser) policy(pol *Policy, n *yaml.Node) {
	p.fields(n, "policy", map[string]func(*yaml.Node){
		"interfaces": func(v *yaml.Node) {
			if v.Kind != yaml.SequenceNode {
				p.d.Errorf(pos(v), "interfaces: expected a list of interfaces, found %s", describe(v))
				return
			}
			for _, in := range v.Content {
				if i := p.iface(resolve(in)); i != nil {
					pol.Interfaces = append(pol.Interfaces, i)
				}
			}
		},
		"pod_veths": func(v *yaml.Node) { pol.PodVeths = p.podVeths(v) },
		// The policy a package installs is a template: what it shapes
		// (eth0 at 19mbit) fits no real link, and enabling a unit
		// without editing it must not shape a box at a made-up rate.
		"template": func(v *yaml.Node) {
			if p.flag(v, "policy", "template", map[string]Pos{}) {
				p.d.Errorf(pos(v), "%s", TemplateRefused)
			}
		},
	})
	if len(pol.Interfaces) == 0 && pol.PodVeths == nil && len(p.d.Errs) == 0 {
		p.d.Errorf(pos(n), "policy: no interfaces; expected \"interfaces:\" with at least one entry (or pod_veths:)")
	}
	p.expandPodVeths(pol)
}

// TemplateRefused is the error for a policy that still says
// `template: true`, as the one installed in /etc/sluice does.
const TemplateRefused = "template: true: this is the template sluice installs, not a policy for your link; set the interface, its rate and the classes, then delete this line (nothing is shaped until then)"

func (p *parser) iface(n *yaml.Node) *Interface {
	i := &Interface{Pos: pos(n)}
	p.fields(n, "interface", map[string]func(*yaml.Node){
		"name": func(v *yaml.Node) {
			i.Name, _ = p.str(v, "interface name")
			i.NamePos = pos(v)
		},
		"egress":  func(v *yaml.Node) { i.Egress = p.tree(v, Egress) },
		"ingress": func(v *yaml.Node) { i.Ingress = p.tree(v, Ingress) },
		"rtt":     func(v *yaml.Node) { i.RTT = p.rtt(v) },
	})
	return i
}

// rtt reads an interface's `rtt:`: on or off, or a mapping of its
// settings (which turns it on).
func (p *parser) rtt(n *yaml.Node) *RTT {
	r := &RTT{Pos: pos(n)}
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case "on", "true":
			return r
		case "off", "false":
			return nil
		}
		p.d.Errorf(pos(n), "rtt: expected on, off or a mapping like {flows: 65536}, found %q", n.Value)
		return nil
	}
	p.fields(n, "rtt", map[string]func(*yaml.Node){
		"flows": func(v *yaml.Node) {
			if f, ok := p.intIn(v, "rtt flows", MinRTTFlows, MaxRTTFlows); ok {
				r.Flows, r.FlowsPos = uint32(f), pos(v)
			}
		},
	})
	return r
}

func (p *parser) tree(n *yaml.Node, dir string) *Tree {
	t := &Tree{Pos: pos(n), Dir: dir, Classifier: "auto"}
	h := map[string]func(*yaml.Node){
		"rate": func(v *yaml.Node) {
			if v.Kind == yaml.ScalarNode && v.Value == "auto" {
				t.Rate = &Rate{Auto: true, Text: "auto", Pos: pos(v)}
				return
			}
			t.Rate = p.rate(v, dir+" rate")
		},
		"auto": func(v *yaml.Node) { t.Auto = p.auto(v, dir) },
		"default": func(v *yaml.Node) {
			t.Default, _ = p.str(v, dir+" default")
			t.DefaultPos = pos(v)
		},
		"leaf": func(v *yaml.Node) {
			t.Leaf, _ = p.str(v, dir+" leaf")
			t.LeafPos = pos(v)
		},
		"classes": func(v *yaml.Node) { t.Classes = p.classes(v, dir+" classes") },
		"classifier": func(v *yaml.Node) {
			s, _ := p.str(v, dir+" classifier")
			if s != "u32" && s != "bpf" && s != "auto" {
				p.d.Errorf(pos(v), "%s classifier: expected u32, bpf or auto, found %q", dir, s)
			}
			t.Classifier, t.ClassifierPos = s, pos(v)
		},
		"police":  func(v *yaml.Node) { t.Police = p.police(v, dir) },
		"sharing": func(v *yaml.Node) { t.Sharing = p.sharing(v, dir+" sharing") },
		"shards": func(v *yaml.Node) {
			t.ShardsPos = pos(v)
			if v.Kind == yaml.ScalarNode && v.Value == "auto" {
				return
			}
			n, err := strconv.Atoi(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || n < 1 || n > MaxShards {
				p.d.Errorf(pos(v), "%s shards: expected auto or a number of transmit queues from 1 to %d, found %s", dir, MaxShards, describe(v))
				return
			}
			t.Shards = n
		},
	}
	h["backend"] = func(v *yaml.Node) {
		s, _ := p.str(v, dir+" backend")
		if s != "htb" && s != "edt" {
			p.d.Errorf(pos(v), "%s backend: expected htb or edt, found %q", dir, s)
		}
		t.Backend, t.BackendPos = s, pos(v)
	}
	h["horizon"] = func(v *yaml.Node) {
		t.HorizonPos = pos(v)
		d, err := time.ParseDuration(v.Value)
		if v.Kind != yaml.ScalarNode || err != nil || d < time.Millisecond || d > MaxHorizon {
			p.d.Errorf(pos(v), "%s horizon: expected a time from 1ms to %s (like 100ms), found %s", dir, MaxHorizon, describe(v))
			return
		}
		t.Horizon = d
	}
	h["burst"] = func(v *yaml.Node) { t.Burst = p.burst(v, dir+" burst") }
	h["overhead"] = func(v *yaml.Node) {
		t.Overhead, _ = p.intIn(v, dir+" overhead (bytes each packet gains on the link)", MinOverhead, MaxOverhead)
		t.OverheadPos = pos(v)
	}
	h["linklayer"] = func(v *yaml.Node) {
		s, _ := p.str(v, dir+" linklayer")
		if s != "ethernet" && s != "atm" && s != "ptm" {
			p.d.Errorf(pos(v), "%s linklayer: expected ethernet, atm (ADSL) or ptm (VDSL2), found %q", dir, s)
		}
		t.Linklayer, t.LinklayerPos = s, pos(v)
	}
	h["mpu"] = func(v *yaml.Node) {
		t.MPU, _ = p.intIn(v, dir+" mpu (the least bytes a packet counts as)", 0, MaxMPU)
		t.MPUPos = pos(v)
	}
	h["exempt"] = func(v *yaml.Node) {
		for _, m := range p.list(v) {
			if e := p.match(m, dir+" exempt"); e != nil {
				t.Exempt = append(t.Exempt, e)
			}
		}
	}
	if dir == Ingress {
		h["queues"] = func(v *yaml.Node) {
			t.Queues, _ = p.intIn(v, dir+" queues", 1, MaxIfbQueues)
			t.QueuesPos = pos(v)
		}
		h["ifb"] = func(v *yaml.Node) {
			t.Ifb, _ = p.str(v, "ifb")
			t.IfbPos = pos(v)
		}
	}
	p.fields(n, dir, h)
	return t
}

// sharing reads `sharing: controller` or its long form
// `sharing: {mode: controller, quantum: 1s, cap: 80%, apply_above: 80%}`.
func (p *parser) sharing(n *yaml.Node, what string) *Sharing {
	sh := &Sharing{Pos: pos(n), Quantum: DefaultSharingQuantum, ApplyAbove: DefaultApplyAbove}
	mode := func(v *yaml.Node) bool {
		s, ok := p.str(v, what)
		if ok && s != "controller" {
			p.d.Errorf(pos(v), "%s: expected controller (the agent's weighted max-min controller), found %q; without sharing, HTB's quanta share by weight", what, s)
			return false
		}
		return ok
	}
	if n.Kind == yaml.ScalarNode {
		if !mode(n) {
			return nil
		}
		return sh
	}
	seen := false
	p.fields(n, what, map[string]func(*yaml.Node){
		"mode": func(v *yaml.Node) { seen = mode(v) || seen },
		"quantum": func(v *yaml.Node) {
			sh.QuantumPos = pos(v)
			d, err := time.ParseDuration(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || d < MinSharingQuantum || d > MaxSharingQuantum {
				p.d.Errorf(pos(v), "%s: quantum: expected a time from %s to %s (like 1s), found %s", what, MinSharingQuantum, MaxSharingQuantum, describe(v))
				return
			}
			sh.Quantum = d
		},
		"cap": func(v *yaml.Node) { sh.Cap = p.rate(v, what+": cap") },
		"apply_above": func(v *yaml.Node) {
			sh.ApplyAbovePos = pos(v)
			s, _ := p.str(v, what+": apply_above")
			r, _, err := ParseRate(s)
			if err != nil || r.Percent < 100*MinApplyAbove {
				p.d.Errorf(pos(v), "%s: apply_above: expected a percentage from %g%% to 100%% (like 80%%), found %q", what, 100*MinApplyAbove, s)
				return
			}
			sh.ApplyAbove = r.Percent / 100
		},
	})
	if !seen && n.Kind == yaml.MappingNode {
		p.d.Errorf(pos(n), "%s: mode: controller is required (the one sharing mode there is)", what)
		return nil
	}
	return sh
}

// burst reads an EDT burst: a time (5ms) or a size (64kb).
func (p *parser) burst(n *yaml.Node, what string) *Burst {
	if n.Kind != yaml.ScalarNode {
		p.d.Errorf(pos(n), "%s: expected a time (5ms) or a size (64kb), found %s", what, describe(n))
		return nil
	}
	if d, err := time.ParseDuration(n.Value); err == nil {
		if d < 0 || d > MaxEDTBurst {
			p.d.Errorf(pos(n), "%s: %s is out of range; from 0 to %s", what, n.Value, MaxEDTBurst)
			return nil
		}
		return &Burst{Time: d, Pos: pos(n)}
	}
	b, err := ParseSize(n.Value)
	if err != nil {
		p.d.Errorf(pos(n), "%s: expected a time (5ms) or a size (64kb), found %q", what, n.Value)
		return nil
	}
	return &Burst{Bytes: b, Pos: pos(n)}
}

func (p *parser) classes(n *yaml.Node, what string) []*Class {
	if n.Kind != yaml.SequenceNode {
		p.d.Errorf(pos(n), "%s: expected a list of classes, found %s", what, describe(n))
		return nil
	}
	var out []*Class
	for _, cn := range n.Content {
		out = append(out, p.class(resolve(cn)))
	}
	return out
}

func (p *parser) class(n *yaml.Node) *Class {
	c := &Class{Pos: pos(n)}
	label := func() string {
		if c.Name != "" {
			return "class " + c.Name
		}
		return "class"
	}
	// Read the name first so that messages about other keys can use it.
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "name" {
				c.Name, _ = p.str(resolve(n.Content[i+1]), "class name")
				c.NamePos = pos(n.Content[i+1])
			}
		}
	}
	p.fields(n, label(), map[string]func(*yaml.Node){
		"name":    func(*yaml.Node) {},
		"rate":    func(v *yaml.Node) { c.Rate = p.rate(v, label()+": rate") },
		"ceil":    func(v *yaml.Node) { c.Ceil = p.rate(v, label()+": ceil") },
		"prio":    func(v *yaml.Node) { c.Prio, _ = p.intIn(v, label()+": prio", 0, MaxPrio); c.PrioPos = pos(v) },
		"burst":   func(v *yaml.Node) { c.Burst = p.size(v, label()+": burst") },
		"cburst":  func(v *yaml.Node) { c.Cburst = p.size(v, label()+": cburst") },
		"quantum": func(v *yaml.Node) { c.Quantum = p.size(v, label()+": quantum") },
		"classid": func(v *yaml.Node) {
			c.ClassIDPos = pos(v)
			s, ok := p.str(v, label()+": classid")
			if !ok {
				return
			}
			id, err := ParseClassID(s)
			if err != nil {
				p.d.Errorf(pos(v), "%s: classid: %v", label(), err)
				return
			}
			c.ClassID = id
		},
		"weight":  func(v *yaml.Node) { c.Weight = p.weight(v, label()+": weight"); c.WeightPos = pos(v) },
		"sharing": func(v *yaml.Node) { c.Sharing = p.sharing(v, label()+": sharing") },
		"leaf":    func(v *yaml.Node) { c.Leaf, _ = p.str(v, label()+": leaf"); c.LeafPos = pos(v) },
		"limit":   func(v *yaml.Node) { c.Limit = p.limit(v, label()+": limit") },
		"match": func(v *yaml.Node) {
			for _, m := range p.list(v) {
				if e := p.match(m, label()); e != nil {
					c.Match = append(c.Match, e)
				}
			}
		},
		"classes":  func(v *yaml.Node) { c.Classes = p.classes(v, label()+": classes") },
		"per_host": func(v *yaml.Node) { c.PerHost = p.perHost(v, label()) },
		"default":  func(v *yaml.Node) { c.Default, _ = p.str(v, label()+": default"); c.DefaultPos = pos(v) },
		"police":   func(v *yaml.Node) { c.Police = p.police(v, label()) },
	})
	return c
}

func (p *parser) perHost(n *yaml.Node, label string) *PerHost {
	ph := &PerHost{Pos: pos(n), By: "dst"}
	what := label + ": per_host"
	var byPos Pos
	p.fields(n, what, map[string]func(*yaml.Node){
		"by": func(v *yaml.Node) {
			byPos = pos(v)
			s, _ := p.str(v, what+".by")
			if s != "src" && s != "dst" {
				p.d.Errorf(pos(v), "%s.by: expected src or dst, found %q", what, s)
			}
			ph.By = s
		},
		"cidr": func(v *yaml.Node) {
			s, ok := p.str(v, what+".cidr")
			if !ok {
				return
			}
			pf, err := parsePrefix(s)
			if err != nil {
				p.d.Errorf(pos(v), "%s.cidr: %v", what, err)
				return
			}
			ph.CIDR, ph.CIDRPos = pf, pos(v)
		},
		"prefix": func(v *yaml.Node) {
			ph.Prefix, _ = p.intIn(v, what+".prefix", 1, 128)
			ph.PrefixPos = pos(v)
		},
		"rate": func(v *yaml.Node) { ph.Rate = p.rate(v, what+".rate") },
		"ceil": func(v *yaml.Node) { ph.Ceil = p.rate(v, what+".ceil") },
		"prio": func(v *yaml.Node) {
			if x, ok := p.intIn(v, what+".prio", 0, MaxPrio); ok {
				ph.Prio = &x
			}
		},
		"leaf":  func(v *yaml.Node) { ph.Leaf, _ = p.str(v, what+".leaf"); ph.LeafPos = pos(v) },
		"limit": func(v *yaml.Node) { ph.Limit = p.limit(v, what+".limit") },
		"hosts_file": func(v *yaml.Node) {
			ph.HostsFile, _ = p.str(v, what+".hosts_file")
			ph.HostsFilePos = pos(v)
		},
		"groups_file": func(v *yaml.Node) {
			ph.GroupsFile, _ = p.str(v, what+".groups_file")
			ph.GroupsFilePos = pos(v)
		},
		"pods": func(v *yaml.Node) {
			ph.Pods, _ = p.str(v, what+".pods")
			ph.PodsPos = pos(v)
			if ph.Pods != Egress && ph.Pods != Ingress {
				p.d.Errorf(pos(v), "%s.pods: expected egress (what the pods send, by src) or ingress (what they receive, by dst), found %q", what, ph.Pods)
				ph.Pods = ""
			}
		},
	})
	if ph.Pods != "" {
		p.pods(ph, what, byPos)
	}
	if ph.HostsFile != "" {
		ph.Entries = p.hostsFile(ph, what)
	}
	switch {
	case ph.GroupsFile != "" && ph.HostsFile == "":
		p.d.Errorf(ph.GroupsFilePos, "%s.groups_file: groups are named by a hosts_file's parent column; give hosts_file too", what)
	case ph.GroupsFile != "":
		ph.Groups = p.groupsFile(ph, what)
	}
	if !ph.CIDR.IsValid() && ph.HostsFile == "" {
		if len(p.d.Errs) == 0 {
			p.d.Errorf(ph.Pos, "%s: cidr or hosts_file is required", what)
		}
		return nil
	}
	return ph
}

// pods checks a per_host class whose hosts are pods: they are told
// apart by the address that is the pod's in that direction, and listed
// in PodsFile unless hosts_file says where.
func (p *parser) pods(ph *PerHost, what string, byPos Pos) {
	want := "src"
	if ph.Pods == Ingress {
		want = "dst"
	}
	switch {
	case byPos == (Pos{}):
		ph.By = want
	case ph.By != want:
		p.d.Errorf(byPos, "%s: pods: %s caps what the pods %s, so the pod is the packet's %s: by: %s", what, ph.Pods,
			map[string]string{Egress: "send", Ingress: "receive"}[ph.Pods], want, want)
	}
	if ph.CIDR.IsValid() {
		p.d.Errorf(ph.CIDRPos, "%s: pods and cidr: the hosts are the pods, listed by the agent; leave cidr out", what)
	}
	if ph.HostsFile == "" {
		ph.HostsFile, ph.HostsFilePos = PodsFile(ph.Pods), ph.PodsPos
	}
	if ph.GroupsFile == "" {
		ph.GroupsFile = PodsGroupsFile(ph.HostsFile)
	}
}

// PodsGroupsFile is where `sluice agent --kubernetes` lists the
// namespaces' aggregates of the pods of hosts file hostsFile (a pods
// class without groups_file): beside it, ".csv" replaced by
// ".namespaces.csv".
func PodsGroupsFile(hostsFile string) string {
	return strings.TrimSuffix(hostsFile, ".csv") + ".namespaces.csv"
}

// PodsFile is where `sluice agent --kubernetes` lists the pods of a
// per_host class with pods: dir and no hosts_file: under the state
// directory ($SLUICE_STATE_DIR, by default /run/sluice: records.Dir's,
// which this package does not import).
func PodsFile(dir string) string { return filepath.Join(stateBase(), "pods", dir+".csv") }

// stateBase is the state directory the agent writes its files under:
// $SLUICE_STATE_DIR, by default /run/sluice (records.Dir's base, which
// this package does not import).
func stateBase() string {
	if base := os.Getenv("SLUICE_STATE_DIR"); base != "" {
		return base
	}
	return "/run/sluice"
}

// Names accepted in match fields.
var (
	protoNames = map[string]uint8{
		"icmp": 1, "igmp": 2, "ipip": 4, "tcp": 6, "udp": 17, "ipv6": 41, "gre": 47,
		"esp": 50, "ah": 51, "icmpv6": 58, "ospf": 89, "sctp": 132, "udplite": 136,
	}
	dscpNames = map[string]uint8{
		"cs0": 0, "df": 0, "be": 0, "le": 1, "cs1": 8, "cs2": 16, "cs3": 24, "cs4": 32, "cs5": 40, "cs6": 48, "cs7": 56,
		"af11": 10, "af12": 12, "af13": 14, "af21": 18, "af22": 20, "af23": 22,
		"af31": 26, "af32": 28, "af33": 30, "af41": 34, "af42": 36, "af43": 38,
		"va": 44, "ef": 46,
	}
	// RFC 1349 type-of-service values, compared under mask 0x1e.
	tosNames = map[string]uint8{
		"minimize-delay": 0x10, "minimum-delay": 0x10, "lowdelay": 0x10,
		"maximize-throughput": 0x08, "throughput": 0x08,
		"maximize-reliability": 0x04, "reliability": 0x04,
		"minimize-cost": 0x02, "mincost": 0x02, "normal-service": 0, "normal": 0,
	}
)

// parsePrefix reads every address and CIDR of a policy or hosts file.
// An IPv4-mapped IPv6 address (::ffff:10.0.0.7) is the IPv4 address it
// maps: packets carry it as IPv4, so filed as IPv6 it would match
// nothing and its host would go unshaped, silently.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("bad CIDR %q: want an address/length like 192.168.1.0/24 or 2001:db8::/32", s)
		}
		if p.Masked() != p {
			return p, fmt.Errorf("bad CIDR %q: host bits are set; did you mean %s?", s, p.Masked())
		}
		// (A mapped prefix shorter than /96 has host bits set: refused above.)
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("bad address %q: want an IPv4 or IPv6 address or CIDR", s)
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("bad address %q: zones are not supported", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parsePorts(s string) ([]PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	a, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 32)
	if err != nil {
		return nil, fmt.Errorf("bad port %q: want a number, a range like 1000-2000, or a list", s)
	}
	b := a
	if isRange {
		if b, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 32); err != nil {
			return nil, fmt.Errorf("bad port range %q: want LOW-HIGH", s)
		}
	}
	if a > 65535 || b > 65535 {
		return nil, fmt.Errorf("port %q out of range: ports are 0 to 65535", s)
	}
	if b < a {
		return nil, fmt.Errorf("bad port range %q: %d is above %d", s, a, b)
	}
	return []PortRange{{uint16(a), uint16(b)}}, nil
}

func parseMasked(s string, bits int) (val, mask uint64, err error) {
	v, m, hasMask := strings.Cut(s, "/")
	max := uint64(1)<<bits - 1
	if val, err = strconv.ParseUint(strings.TrimSpace(v), 0, bits); err != nil {
		return 0, 0, fmt.Errorf("bad value %q: want a number up to %#x, optionally /MASK", s, max)
	}
	mask = max
	if hasMask {
		if mask, err = strconv.ParseUint(strings.TrimSpace(m), 0, bits); err != nil {
			return 0, 0, fmt.Errorf("bad mask in %q", s)
		}
	}
	return val, mask, nil
}

func (p *parser) match(n *yaml.Node, label string) *Match {
	m := &Match{Pos: pos(n), Fields: map[string]Pos{}}
	what := label + ": match"
	// An empty list would match nothing, and leaving the field out
	// matches everything: neither is what `dport: []` could mean.
	nonEmpty := func(v *yaml.Node, field string) bool {
		m.Fields[field] = pos(v)
		if v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
			p.d.Errorf(pos(v), "%s.%s: an empty list; give at least one value or leave the field out", what, field)
			return false
		}
		return true
	}
	prefixes := func(dst *[]netip.Prefix, field string) func(*yaml.Node) {
		return func(v *yaml.Node) {
			if !nonEmpty(v, field) {
				return
			}
			for _, e := range p.list(v) {
				s, ok := p.str(e, what+"."+field)
				if !ok {
					continue
				}
				pf, err := parsePrefix(s)
				if err != nil {
					p.d.Errorf(pos(e), "%s.%s: %v", what, field, err)
					continue
				}
				*dst = append(*dst, pf)
			}
		}
	}
	ports := func(dst *[]PortRange, field string) func(*yaml.Node) {
		return func(v *yaml.Node) {
			if !nonEmpty(v, field) {
				return
			}
			for _, e := range p.list(v) {
				s, ok := p.str(e, what+"."+field)
				if !ok {
					continue
				}
				r, err := parsePorts(s)
				if err != nil {
					p.d.Errorf(pos(e), "%s.%s: %v", what, field, err)
					continue
				}
				*dst = append(*dst, r...)
			}
		}
	}
	p.fields(n, what, map[string]func(*yaml.Node){
		"src":     prefixes(&m.Src, "src"),
		"dst":     prefixes(&m.Dst, "dst"),
		"not_src": prefixes(&m.NotSrc, "not_src"),
		"not_dst": prefixes(&m.NotDst, "not_dst"),
		"sport":   ports(&m.Sport, "sport"),
		"dport":   ports(&m.Dport, "dport"),
		"proto": func(v *yaml.Node) {
			if !nonEmpty(v, "proto") {
				return
			}
			for _, e := range p.list(v) {
				s, ok := p.str(e, what+".proto")
				if !ok {
					continue
				}
				if x, ok := protoNames[strings.ToLower(s)]; ok {
					m.Proto = append(m.Proto, x)
				} else if x, err := strconv.ParseUint(s, 10, 8); err == nil {
					m.Proto = append(m.Proto, uint8(x))
				} else {
					names := keys(protoNames)
					sort.Strings(names)
					hint := ""
					if sg := suggest(strings.ToLower(s), names); sg != "" {
						hint = fmt.Sprintf(" (did you mean %s?)", sg)
					}
					p.d.Errorf(pos(e), "%s.proto: unknown protocol %q%s; use %s or a number 0-255", what, s, hint, strings.Join(names, ", "))
				}
			}
		},
		"dscp": func(v *yaml.Node) {
			if !nonEmpty(v, "dscp") {
				return
			}
			for _, e := range p.list(v) {
				s, ok := p.str(e, what+".dscp")
				if !ok {
					continue
				}
				if x, err := parseDSCP(s); err == nil {
					m.DSCP = append(m.DSCP, x)
				} else {
					p.d.Errorf(pos(e), "%s.dscp: %v", what, err)
				}
			}
		},
		"tos": func(v *yaml.Node) {
			m.Fields["tos"] = pos(v)
			s, ok := p.str(v, what+".tos")
			if !ok {
				return
			}
			if x, ok := tosNames[strings.ToLower(s)]; ok {
				m.TOS = &Masked8{Val: x, Mask: 0x1e}
				return
			}
			val, mask, err := parseMasked(s, 8)
			if err != nil {
				p.d.Errorf(pos(v), "%s.tos: %v; or a name like minimize-delay", what, err)
				return
			}
			if !strings.Contains(s, "/") {
				mask = 0xfc // the whole TOS byte but the ECN bits
			}
			m.TOS = &Masked8{Val: uint8(val), Mask: uint8(mask)}
		},
		"tcp_ack": func(v *yaml.Node) { m.TCPAck = p.flag(v, what, "tcp_ack", m.Fields) },
		"tcp_syn": func(v *yaml.Node) { m.TCPSyn = p.flag(v, what, "tcp_syn", m.Fields) },
		"mark": func(v *yaml.Node) {
			m.Fields["mark"] = pos(v)
			s, ok := p.str(v, what+".mark")
			if !ok {
				return
			}
			val, mask, err := parseMasked(s, 32)
			if err != nil {
				p.d.Errorf(pos(v), "%s.mark: %v", what, err)
				return
			}
			m.Mark = &Masked32{Val: uint32(val), Mask: uint32(mask)}
		},
	})
	if len(m.Fields) == 0 && resolve(n).Kind == yaml.MappingNode {
		p.d.Errorf(pos(n), "%s: empty entry matches everything; remove it or make the class the default", what)
		return nil
	}
	return m
}

var _ = math.MaxInt

// parseDSCP reads a DSCP name (EF, AF41, CS1, ...) or number (0-63).
func parseDSCP(s string) (uint8, error) {
	if x, ok := dscpNames[strings.ToLower(s)]; ok {
		return x, nil
	}
	if x, err := strconv.ParseUint(s, 0, 8); err == nil && x < 64 {
		return uint8(x), nil
	}
	hint := ""
	if sg := suggest(strings.ToLower(s), keys(dscpNames)); sg != "" {
		hint = fmt.Sprintf(" (did you mean %s?)", strings.ToUpper(sg))
	}
	return 0, fmt.Errorf("unknown DSCP %q%s; use a name (EF, AF41, CS1, ...) or a number 0-63", s, hint)
}

// Class ids a policy may pin: sluice's tree is 1:, its own class 1:1.
const (
	MinClassID = 0x10
	MaxClassID = MaxClasses + 1
)

// ParseClassID reads a class id as tc writes it, "1:20" (the minor in
// hex), and returns its minor: sluice's trees have the handle 1:.
func ParseClassID(s string) (uint16, error) {
	major, minor, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok || major != "1" || minor == "" || len(minor) > 4 {
		return 0, fmt.Errorf("%q: write it as tc does, 1:MINOR with the minor in hex (1:20); sluice's trees have the handle 1:", s)
	}
	n, err := strconv.ParseUint(minor, 16, 16)
	if err != nil {
		return 0, fmt.Errorf("%q: the minor %q is not hex", s, minor)
	}
	if n < MinClassID || n > MaxClassID {
		return 0, fmt.Errorf("%q: the minor must be from %x to %x (1:1 is the tree's own class; sluice numbers its classes from 1:10)", s, MinClassID, MaxClassID)
	}
	return uint16(n), nil
}
