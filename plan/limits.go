package plan

import (
	"maps"
	"slices"
	"strings"
	"time"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
	"sluice/units"
)

// Limits are the runtime layer: what the agent's sharing controllers
// decide over the policy while it runs (a controlled class's rate and
// ceil, a controlled EDT aggregate's cap). The engine lays them over
// the plan (WithLimits) and applies the result as it applies any plan,
// so that a reconcile pass keeps them and only the executor writes
// them. Later run-time features (autorate, shard balancing) add their
// own entries here.
type Limits map[LimitKey]Limit

// LimitKey names what a limit applies to: a class (its key, Target 0),
// an EDT aggregate (its hook's key and index in the targets) or a host
// of an EDT group (its hook's key and the host's class name).
type LimitKey struct {
	Object string
	Target uint32
	Host   string
}

// Limit is a class's rate and ceil, or an aggregate's cap (Ceil; Rate
// unused).
type Limit struct {
	Rate, Ceil units.Rate
}

// RateLimit keys the rate of device d's tree, for a tree whose rate is
// auto (Device.Auto): the Limit's Rate, held between auto's min and
// max. The device is planned again at it, so that what follows the
// rate (percentages, bursts, quanta, queue limits) follows.
func RateLimit(d *Device) LimitKey { return RateLimitOn(d.Name) }

// RateLimitOn is RateLimit of the tree on device dev.
func RateLimitOn(dev string) LimitKey { return LimitKey{Object: rateKeyPrefix + dev} }

const rateKeyPrefix = "rate "

// RateLimited returns the device whose tree's rate key names (a
// RateLimit), or "".
func RateLimited(key string) string {
	dev, ok := strings.CutPrefix(key, rateKeyPrefix)
	if !ok {
		return ""
	}
	return dev
}

// ClassLimit keys a limit on class c.
func ClassLimit(c *tc.Class) LimitKey { return LimitKey{Object: c.Key()} }

// TargetLimit keys a limit on target t of hook h.
func TargetLimit(h *bpf.Hook, t uint32) LimitKey { return LimitKey{Object: h.Key(), Target: t} }

// HostLimit keys a limit on host (its class name) of hook h: a host of
// an EDT group, whose cap the group's controller sets.
func HostLimit(h *bpf.Hook, host string) LimitKey { return LimitKey{Object: h.Key(), Host: host} }

// Equal reports whether l and m hold the same limits.
func (l Limits) Equal(m Limits) bool { return maps.Equal(l, m) }

// Objects returns the keys of the objects l limits, sorted.
func (l Limits) Objects() []string {
	seen := map[string]bool{}
	var out []string
	for k := range l {
		if !seen[k.Object] {
			seen[k.Object] = true
			out = append(out, k.Object)
		}
	}
	slices.Sort(out)
	return out
}

// WithLimits returns p with l laid over the objects its controllers
// control. Each limit is held within what the policy allows: a class's
// ceil between its planned rate and ceil, its rate between its planned
// rate and that ceil (a balanced shard's root: from its floor, not its
// planned rate); an aggregate's cap above zero and at most its
// planned one, with the horizon that goes with it (HorizonFor). Limits
// on anything else are ignored. p is not changed: devices and objects
// that a limit changes are copies.
func (p *Plan) WithLimits(l Limits) *Plan {
	if len(l) == 0 {
		return p
	}
	out := &Plan{Devices: make([]*Device, len(p.Devices))}
	for i, d := range p.Devices {
		if lim, ok := l[RateLimit(d)]; ok && d.Auto != nil {
			d = d.AtRate(lim.Rate)
		}
		out.Devices[i] = d
		var objs []tc.Object
		for j, o := range d.Objects {
			n := limited(d, o, l)
			if n == nil {
				continue
			}
			if objs == nil {
				objs = slices.Clone(d.Objects)
			}
			objs[j] = n
		}
		if objs != nil {
			c := *d
			c.Objects = objs
			out.Devices[i] = &c
		}
	}
	return out
}

// AtRate returns d planned again with its tree at rate (held between
// its auto's min and max), or d itself where that changes nothing or
// d's rate is not auto. Handles stay: the device's allocation is the
// new plan's previous one.
func (d *Device) AtRate(rate units.Rate) *Device {
	if d.Auto == nil {
		return d
	}
	rate = min(max(rate, d.Auto.MinBps), d.Auto.MaxBps)
	if rate == d.tree.RateBps {
		return d
	}
	diag := &policy.Diag{}
	n := planTree(diag, d.feats, d.in, d.tree.AtRate(rate), d.Name, d.Alloc)
	if diag.Err() != nil || len(n.Objects) != len(d.Objects) {
		return d // cannot happen: validation checked the tree at min
	}
	n.Alloc = d.Alloc
	return n
}

// Rate is the rate d's tree is planned at.
func (d *Device) Rate() units.Rate {
	if d.tree == nil {
		return 0
	}
	return d.tree.RateBps
}

// limited returns o with its limits from l, or nil where they change
// nothing.
func limited(d *Device, o tc.Object, l Limits) tc.Object {
	switch x := o.(type) {
	case *tc.Class:
		lim, ok := l[ClassLimit(x)]
		if !ok || !x.Controlled {
			return nil
		}
		c := *x
		c.Rate, c.Ceil = d.Held(x, lim)
		if c.Ceil == x.Ceil && c.Rate == x.Rate {
			return nil
		}
		return &c
	case *bpf.Hook:
		if x.Content == nil {
			return nil
		}
		var content *bpf.Content
		edit := func() *bpf.Content {
			if content == nil {
				c := *x.Content
				content = &c
			}
			return content
		}
		targetsCloned := false
		for _, t := range x.Controlled {
			lim, ok := l[TargetLimit(x, t)]
			if !ok || int(t) >= len(x.Content.Targets) {
				continue
			}
			planned := x.Content.Targets[t]
			rate := min(max(lim.Ceil, 1), planned.Rate)
			horizon := HorizonFor(d.horizonOf(t), rate)
			if rate == planned.Rate && horizon == planned.Horizon {
				continue
			}
			if !targetsCloned {
				edit().Targets = slices.Clone(x.Content.Targets)
				targetsCloned = true
			}
			content.Targets[t].Rate, content.Targets[t].Horizon = rate, horizon
		}
		// A group's hosts: each host's entries (one per address) get its
		// cap, held as an aggregate's is.
		cloned := false
		for _, ctl := range d.Controllers {
			for _, ch := range ctl.Children {
				lim, ok := l[HostLimit(x, ch.Name)]
				if !ok || ch.Prod || len(ch.Hosts) == 0 {
					continue
				}
				for _, k := range ch.Hosts {
					planned, ok := x.Content.Hosts[k]
					if !ok {
						continue
					}
					rate := min(max(lim.Ceil, 1), planned.Rate)
					horizon := HorizonFor(ctl.Horizon, rate)
					if rate == planned.Rate && horizon == planned.Horizon {
						continue
					}
					if !cloned {
						edit().Hosts = maps.Clone(x.Content.Hosts)
						cloned = true
					}
					t := planned
					t.Rate, t.Horizon = rate, horizon
					content.Hosts[k] = t
				}
			}
		}
		if content == nil {
			return nil
		}
		h := *x
		h.Content = content
		return &h
	}
	return nil
}

// horizonOf is the configured horizon of the controller that owns
// target t.
func (d *Device) horizonOf(t uint32) time.Duration {
	for _, c := range d.Controllers {
		for _, ch := range c.Children {
			if !ch.Prod && ch.Target == t && ch.Handle == 0 && len(ch.Hosts) == 0 {
				return c.Horizon
			}
		}
	}
	return 0
}

// Held returns the rate and ceil that lim gives planned class x of d,
// held within what the policy allows: the ceil between the class's
// planned rate (or its floor, for a balanced shard's classes) and its
// planned ceil, the rate between that and the ceil.
func (d *Device) Held(x *tc.Class, lim Limit) (rate, ceil units.Rate) {
	lo := x.Rate
	if f := d.floors[x.Handle]; f > 0 {
		lo = f
	}
	ceil = min(max(lim.Ceil, lo), x.Ceil)
	return min(max(lim.Rate, lo), ceil), ceil
}
