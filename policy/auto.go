package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"gopkg.in/yaml.v3"

	"sluice/units"
)

// Auto is a direction's `rate: auto`: the agent moves the direction's
// rate between Min and Max as the delay to the reflectors says
// (docs/autorate.md); without the agent the tree is shaped at Base.
type Auto struct {
	Pos            Pos
	Min, Base, Max *Rate
	// Reflectors are the hosts pinged (IPv4; DefaultReflectors when
	// none are given).
	Reflectors    []netip.Addr
	ReflectorsPos Pos
	// DelayThreshold: a sample this far above its reflector's baseline
	// counts toward bufferbloat. Zero (`auto`, the default): the agent
	// fits it to the path's own delay variation (docs/autorate.md).
	DelayThreshold    time.Duration
	DelayThresholdPos Pos
	// Probe is "echo" (the round trip, halved: every reflector answers)
	// or "timestamp" (ICMP timestamps: each way's delay apart; needs a
	// raw socket and reflectors that answer them).
	Probe    string
	ProbePos Pos

	// Resolved by validation (and scaled as the tree's rates are).
	MinBps, BaseBps, MaxBps units.Rate
}

// Defaults of `auto:`.
const (
	MinDelayThreshold = time.Millisecond
	MaxDelayThreshold = time.Second
	MaxReflectors     = 32
)

// DefaultReflectors are pinged when a policy names none: anycast
// resolvers of three operators, which answer ICMP echo from anywhere
// (cake-autorate's defaults include them).
var DefaultReflectors = []netip.Addr{
	netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("1.0.0.1"),
	netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("8.8.4.4"),
	netip.MustParseAddr("9.9.9.9"), netip.MustParseAddr("9.9.9.10"),
}

// IsAuto reports whether the direction's rate is `auto`.
func (t *Tree) IsAuto() bool { return t.Rate != nil && t.Rate.Auto }

// auto reads a direction's `auto:` block.
func (p *parser) auto(n *yaml.Node, dir string) *Auto {
	what := dir + " auto"
	a := &Auto{Pos: pos(n)}
	if n.Kind != yaml.MappingNode {
		p.d.Errorf(pos(n), "%s: expected a mapping like {min: 5mbit, base: 20mbit, max: 80mbit}, found %s", what, describe(n))
		return nil
	}
	p.fields(n, what, map[string]func(*yaml.Node){
		"min":  func(v *yaml.Node) { a.Min = p.rate(v, what+": min") },
		"base": func(v *yaml.Node) { a.Base = p.rate(v, what+": base") },
		"max":  func(v *yaml.Node) { a.Max = p.rate(v, what+": max") },
		"reflectors": func(v *yaml.Node) {
			a.ReflectorsPos = pos(v)
			if v.Kind != yaml.SequenceNode {
				p.d.Errorf(pos(v), "%s: reflectors: expected a list of IPv4 addresses, found %s", what, describe(v))
				return
			}
			for _, e := range v.Content {
				s, ok := p.str(e, what+": reflectors")
				if !ok {
					continue
				}
				ip, err := netip.ParseAddr(s)
				switch {
				case err != nil:
					p.d.Errorf(pos(e), "%s: reflectors: %q is not an IP address", what, s)
				case !ip.Is4():
					p.d.Errorf(pos(e), "%s: reflectors: %s: IPv4 addresses only (the prober sends ICMP, not ICMPv6)", what, s)
				case slices.Contains(a.Reflectors, ip):
					p.d.Errorf(pos(e), "%s: reflectors: %s is listed twice", what, s)
				default:
					a.Reflectors = append(a.Reflectors, ip)
				}
			}
			if len(v.Content) == 0 {
				p.d.Errorf(pos(v), "%s: reflectors: empty; leave the key out for the defaults", what)
			}
			if len(a.Reflectors) > MaxReflectors {
				p.d.Errorf(pos(v), "%s: reflectors: %d; at most %d", what, len(a.Reflectors), MaxReflectors)
			}
		},
		"delay_threshold": func(v *yaml.Node) {
			a.DelayThresholdPos = pos(v)
			if v.Kind == yaml.ScalarNode && v.Value == "auto" {
				a.DelayThreshold = 0
				return
			}
			d, err := time.ParseDuration(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || d < MinDelayThreshold || d > MaxDelayThreshold {
				p.d.Errorf(pos(v), "%s: delay_threshold: expected auto or a time from %s to %s (like 10ms), found %s", what, MinDelayThreshold, MaxDelayThreshold, describe(v))
				return
			}
			a.DelayThreshold = d
		},
		"probe": func(v *yaml.Node) {
			s, _ := p.str(v, what+": probe")
			if s != "echo" && s != "timestamp" {
				p.d.Errorf(pos(v), "%s: probe: expected echo or timestamp, found %q", what, s)
			}
			a.Probe, a.ProbePos = s, pos(v)
		},
	})
	return a
}

// validateAuto checks a direction's `rate: auto` and its `auto:`, and
// sets the tree's rate to the base.
func validateAuto(where string, t *Tree, d *Diag) bool {
	a := t.Auto
	if !t.IsAuto() {
		if a != nil {
			d.Errorf(a.Pos, "%s: auto: is the settings of rate: auto, and this direction's rate is %s", where, t.Rate.Text)
		}
		return true
	}
	if a == nil {
		d.Errorf(t.Rate.Pos, "%s: rate: auto needs auto: {min, base, max} (the lowest rate, the usual one, the highest)", where)
		return false
	}
	ok := true
	for _, r := range []struct {
		r    *Rate
		name string
		out  *units.Rate
	}{{a.Min, "min", &a.MinBps}, {a.Base, "base", &a.BaseBps}, {a.Max, "max", &a.MaxBps}} {
		switch {
		case r.r == nil:
			d.Errorf(a.Pos, "%s: auto: %s is required (like %s)", where, r.name, map[string]string{"min": "5mbit", "base": "20mbit", "max": "80mbit"}[r.name])
			ok = false
		case r.r.Percent > 0:
			d.Errorf(r.r.Pos, "%s: auto: %s must be absolute (like 20mbit)", where, r.name)
			ok = false
		case r.r.Bps == 0:
			d.Errorf(r.r.Pos, "%s: auto: %s comes to less than 1 byte/s", where, r.name)
			ok = false
		default:
			*r.out = r.r.Bps
		}
	}
	if !ok {
		return false
	}
	if a.MinBps > a.BaseBps || a.BaseBps > a.MaxBps {
		d.Errorf(a.Pos, "%s: auto: want min <= base <= max, found min %s, base %s, max %s", where, a.Min.Text, a.Base.Text, a.Max.Text)
		return false
	}
	if len(a.Reflectors) == 0 && a.ReflectorsPos == (Pos{}) {
		a.Reflectors = slices.Clone(DefaultReflectors)
	}
	if a.Probe == "" {
		a.Probe = "echo"
	}
	if t.EDT() {
		t.Exempt = append(t.Exempt, t.ProbeMatch()) // never paced
	}
	if t.Sharing != nil {
		d.Errorf(t.Sharing.Pos, "%s: sharing: controller with rate: auto is not supported yet: the controller shares a fixed rate", where)
	}
	var walk func(cs []*Class)
	walk = func(cs []*Class) {
		for _, c := range cs {
			if c.Sharing != nil {
				d.Errorf(c.Sharing.Pos, "%s: class %s: sharing: controller with rate: auto is not supported yet: the controller shares a fixed rate", where, c.Name)
			}
			if pl := c.Police; pl != nil && (pl.CIR != nil && pl.CIR.Percent > 0 || pl.PIR != nil && pl.PIR.Percent > 0) {
				d.Errorf(pl.Pos, "%s: class %s: police: with rate: auto, cir and pir must be absolute (like 2mbit): a meter's buckets are not resized at run time", where, c.Name)
			}
			walk(c.Classes)
		}
	}
	walk(t.Classes)
	return true
}

// ProbeMatch matches rate: auto's probes on the tree's device: ICMP to
// the reflectors (egress), from them (ingress). The planner sends them
// past the tree's queues (HTB's direct queue, EDT's exemption): the
// delay they measure must be the link's beyond the shaper, not the
// shaper's own queue, which a bulk class holds full by design.
func (t *Tree) ProbeMatch() *Match {
	if t.Auto == nil || len(t.Auto.Reflectors) == 0 {
		return nil
	}
	m := &Match{Pos: t.Auto.Pos, Proto: []uint8{1}, Fields: map[string]Pos{"proto": t.Auto.Pos}}
	var ps []netip.Prefix
	for _, r := range t.Auto.Reflectors {
		ps = append(ps, netip.PrefixFrom(r, 32))
	}
	if t.Dir == Ingress {
		m.Src, m.Fields["src"] = ps, t.Auto.Pos
	} else {
		m.Dst, m.Fields["dst"] = ps, t.Auto.Pos
	}
	return m
}

// checkAutoFloor checks that the classes' rates fit the lowest rate
// rate: auto may set: percentages follow the rate, absolute rates do
// not, so a guarantee that fits the base may not fit min.
func checkAutoFloor(where string, t *Tree, d *Diag) {
	a := t.Auto
	at := t.AtRate(a.MinBps)
	var walk func(cs []*Class, parent *Class, rate units.Rate)
	walk = func(cs []*Class, parent *Class, rate units.Rate) {
		var sum units.Rate
		for _, c := range cs {
			sum += c.RateBps
			walk(c.Classes, c, c.RateBps)
		}
		if sum > rate && len(cs) > 0 {
			owner := "the " + t.Dir + " rate"
			if parent != nil {
				owner = "class " + parent.Name
			}
			d.Errorf(a.Min.Pos, "%s: at auto's min %s, children's rates add up to %s, above %s (%s): absolute rates do not follow rate: auto; lower them, use percentages, or raise min: %s",
				where, a.Min.Text, sum.String(), owner, rate.String(), rateList(cs))
		}
	}
	walk(at.Classes, nil, at.RateBps)
}

// AtRate returns t with its rates resolved at rate instead of its own
// (RateBps): what the agent shapes when rate: auto moves the
// direction's rate. Percentages follow the new rate; absolute rates
// stay as written (scaled as ScaleRates scaled the tree). t is not
// changed: the copy's classes, hosts and hosts_file entries are its own.
// A rate given in terms of t's (after any scaling) is what AtRate
// takes.
func (t *Tree) AtRate(rate units.Rate) *Tree {
	rate = max(rate, 1)
	out := *t
	out.RateBps = rate
	cls := map[*Class]*Class{}
	ents := map[*HostEntry]*HostEntry{}
	var copyAll func(cs []*Class, parent *Class) []*Class
	copyAll = func(cs []*Class, parent *Class) []*Class {
		if cs == nil {
			return nil
		}
		out := make([]*Class, len(cs))
		for i, c := range cs {
			n := *c
			n.Parent = parent
			cls[c] = &n
			if c.PerHost != nil {
				ph := *c.PerHost
				n.PerHost = &ph
			}
			n.Classes = copyAll(c.Classes, &n)
			out[i] = &n
		}
		return out
	}
	out.Classes = copyAll(t.Classes, nil)
	entry := func(e *HostEntry) *HostEntry {
		if n, ok := ents[e]; ok {
			return n
		}
		n := *e
		if c := cls[e.ParentCls]; c != nil {
			n.ParentCls = c
		}
		if c := cls[e.Owner]; c != nil {
			n.Owner = c
		}
		ents[e] = &n
		return &n
	}
	for _, n := range cls {
		if n.PerHost != nil && n.PerHost.Entries != nil {
			es := make([]*HostEntry, len(n.PerHost.Entries))
			for i, e := range n.PerHost.Entries {
				es[i] = entry(e)
			}
			n.PerHost.Entries = es
		}
		if n.Hosts != nil {
			hs := make([]*HostEntry, len(n.Hosts))
			for i, e := range n.Hosts {
				hs[i] = entry(e)
			}
			n.Hosts = hs
		}
	}
	if t.Sharing != nil {
		sh := *t.Sharing
		out.Sharing = &sh
	}
	out.resolveAt(rate)
	return &out
}

// resolveAt resolves the classes' rates against rate as validation
// does (hostRates, validateClass), without its checks.
func (t *Tree) resolveAt(rate units.Rate) {
	scale := t.Scale
	if scale == 0 {
		scale = 1
	}
	abs := func(r *Rate, parent units.Rate) units.Rate {
		if r.Percent > 0 {
			return r.Resolve(parent)
		}
		if scale == 1 {
			return r.Bps
		}
		return max(units.Rate(float64(r.Bps)*scale), 1)
	}
	var walk func(cs []*Class, parent *Class, pr, pc units.Rate)
	walk = func(cs []*Class, parent *Class, pr, pc units.Rate) {
		for _, c := range cs {
			if c.Group != "" && c.Rate == nil {
				c.RateBps = parent.PerHost.RateBps // groupRates' default: a host's
			} else {
				c.RateBps = max(abs(c.Rate, pr), 1)
			}
			c.CeilBps = pc
			if c.Ceil != nil {
				c.CeilBps = abs(c.Ceil, pc)
			}
			if c.Group != "" && parent.PerHost.Pods != "" {
				c.RateBps = min(c.RateBps, c.CeilBps) // as groupRates holds a namespace's guarantee
			}
			c.CeilBps = max(c.CeilBps, c.RateBps)
			if c.Group != "" {
				fitGroup(c, parent.PerHost.Pods != "")
			}
			if ph := c.PerHost; ph != nil {
				n := uint64(len(ph.Entries))
				if ph.CIDR.IsValid() {
					n += uint64(ph.HostCount())
				}
				ph.RateBps = c.RateBps / units.Rate(max(n, 1))
				if ph.Rate != nil {
					ph.RateBps = abs(ph.Rate, c.RateBps)
				}
				ph.RateBps = max(ph.RateBps, 1)
				ph.CeilBps = c.CeilBps
				if ph.Ceil != nil {
					ph.CeilBps = abs(ph.Ceil, c.CeilBps)
				}
				ph.CeilBps = max(ph.CeilBps, ph.RateBps)
				for _, e := range ph.Entries {
					e.RateBps, e.CeilBps = ph.RateBps, ph.CeilBps
					if e.Rate != nil {
						e.RateBps = max(abs(e.Rate, c.RateBps), 1)
					}
					if e.Ceil != nil {
						e.CeilBps = abs(e.Ceil, c.CeilBps)
					}
					e.CeilBps = max(e.CeilBps, e.RateBps)
				}
			}
			walk(c.Classes, c, c.RateBps, c.CeilBps)
		}
	}
	walk(t.Classes, nil, rate, rate)
	if sh := t.Sharing; sh != nil {
		sh.CapBps = rate
		if sh.Cap != nil {
			sh.CapBps = abs(sh.Cap, rate)
		}
	}
}

// String describes a's range.
func (a *Auto) String() string {
	return fmt.Sprintf("auto %s..%s (base %s)", a.MinBps.String(), a.MaxBps.String(), a.BaseBps.String())
}
