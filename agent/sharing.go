package agent

import (
	"fmt"
	"math"
	"time"

	"sluice/bpf"
	"sluice/engine"
	"sluice/plan"
	"sluice/share"
	"sluice/stats"
	"sluice/tc"
	"sluice/units"
)

// controller is one running sharing controller: its plan, the share
// package's state, and what it last decided.
type controller struct {
	dev   string
	cfg   plan.Controller
	c     *share.Controller
	last  time.Time
	drops map[string]uint64 // per child, at the last step
	// EDT: each child's delay histogram totals at the last step: all
	// packets, and those held back more than heldBack.
	packets, held map[string]uint64
	decided       []*stats.Share
}

// heldBack is the delay beyond which an EDT aggregate's packet counts as
// held back by its cap; an aggregate is held back when at least
// heldShare of its packets were (or it dropped some at the horizon).
// Below its cap a flow's packets leave at once (delay 0, or within the
// burst); at its cap they wait a frame's time at the cap or more.
const (
	heldBack  = 100 * time.Microsecond
	heldShare = 0.2
)

func controllerKey(dev string, c plan.Controller) string { return dev + "\x00" + c.Owner }

// sameConfig: a reload that leaves a controller's configuration alone
// keeps its measurements and limits.
func sameConfig(a, b plan.Controller) bool {
	if a.Owner != b.Owner || a.Quantum != b.Quantum || a.ApplyAbove != b.ApplyAbove || a.Capacity != b.Capacity ||
		a.Horizon != b.Horizon || a.Assure != b.Assure || len(a.Children) != len(b.Children) {
		return false
	}
	for i := range a.Children {
		if a.Children[i] != b.Children[i] {
			return false
		}
	}
	return true
}

// minQuantum is the shortest quantum of the plan's controllers (0: none).
func minQuantum(p *plan.Plan) time.Duration {
	var q time.Duration
	for _, d := range p.Devices {
		for _, c := range d.Controllers {
			if q == 0 || c.Quantum < q {
				q = c.Quantum
			}
		}
	}
	return q
}

// runControllers steps every controller of p whose quantum has passed,
// on the pass's reading, writes the ceils they decide, and records their
// decisions in the reading (stats.Tree.Sharing). It runs with the
// namespace locked (inside the pass), so no apply interleaves.
func (a *Agent) runControllers(p *engine.Prepared, s *stats.Sample) {
	live := map[string]*controller{}
	planned := map[tc.Handle]*tc.Class{}
	for _, d := range p.Plan.Devices {
		if len(d.Controllers) == 0 {
			continue
		}
		clear(planned)
		for _, o := range d.Objects {
			if c, ok := o.(*tc.Class); ok {
				planned[c.Handle] = c
			}
		}
		tree := treeOf(s, d.Name)
		for _, cfg := range d.Controllers {
			key := controllerKey(d.Name, cfg)
			ctl := a.ctls[key]
			if ctl == nil || !sameConfig(ctl.cfg, cfg) {
				ctl = newController(d, cfg)
			}
			live[key] = ctl
			if tree == nil {
				continue
			}
			// A step is due once a quantum has passed, less half the
			// pass interval (passes do not land exactly).
			if !ctl.last.IsZero() && s.At.Sub(ctl.last) < cfg.Quantum-a.tick/2 {
				tree.Sharing = append(tree.Sharing, ctl.decided...)
				continue
			}
			a.step(p, ctl, tree, planned, s.At)
			tree.Sharing = append(tree.Sharing, ctl.decided...)
		}
	}
	a.ctls = live
}

func newController(d *plan.Device, cfg plan.Controller) *controller {
	ctl := &controller{dev: d.Name, cfg: cfg, drops: map[string]uint64{},
		packets: map[string]uint64{}, held: map[string]uint64{},
		c: &share.Controller{Capacity: units.Rate(cfg.Capacity).BitsFloat(), ApplyAbove: cfg.ApplyAbove, Assure: cfg.Assure}}
	for _, ch := range cfg.Children {
		ctl.c.Children = append(ctl.c.Children, share.Child{Name: ch.Name, Weight: ch.Weight,
			Rate: ch.Rate.BitsFloat(), Ceil: ch.Ceil.BitsFloat(), Prod: ch.Prod})
	}
	return ctl
}

func treeOf(s *stats.Sample, dev string) *stats.Tree {
	for _, t := range s.Trees {
		if t.Device == dev && !t.Missing {
			return t
		}
	}
	return nil
}

// step reads the children's counters (each with its descendants: a
// tenant's subclasses and hosts queue for it), decides, and writes the
// ceils that differ from the kernel's.
func (a *Agent) step(p *engine.Prepared, ctl *controller, tree *stats.Tree, planned map[tc.Handle]*tc.Class, now time.Time) {
	byID := map[string]*stats.Class{}
	for _, c := range tree.Classes {
		byID[c.ID] = c
	}
	child := map[string]int{}
	for i, ch := range ctl.cfg.Children {
		child[ch.ID] = i
	}
	edt := tree.Backend == "edt"
	n := len(ctl.cfg.Children)
	bytes := make([]uint64, n)
	backlog := make([]uint64, n)
	drops := make([]uint64, n)
	liveRate, liveCeil := make([]float64, n), make([]float64, n)
	found := make([]bool, n)
	for _, c := range tree.Classes {
		// Walk up to the controlled child this class belongs to, if any.
		for x, depth := c, 0; x != nil && depth < 16; x, depth = byID[x.Parent], depth+1 {
			i, ok := child[x.ID]
			if !ok {
				continue
			}
			if x == c {
				bytes[i], liveRate[i], liveCeil[i], found[i] = c.Bytes, float64(c.Rate), float64(c.Ceil), true
			}
			backlog[i] += uint64(c.Backlog)
			drops[i] += uint64(c.Drops)
			break
		}
	}
	rs := make([]share.Reading, n)
	for i, ch := range ctl.cfg.Children {
		rs[i] = share.Reading{Bytes: bytes[i], Queued: backlog[i] > 0 || drops[i] > ctl.drops[ch.Name]}
		ctl.drops[ch.Name] = drops[i]
	}
	var prog *bpf.Program
	var targets []bpf.Target
	if edt {
		// An aggregate has no queue of its own: what its packets waited
		// for their departure time says whether its cap held it back.
		for _, dl := range tree.Delays {
			i, ok := byName(ctl.cfg.Children, dl.Class)
			if !ok {
				continue
			}
			var all, held uint64
			for k, c := range dl.Packets {
				all += c
				if k > 0 && (dl.UpperNS[k] == 0 || dl.UpperNS[k] > uint64(heldBack)) {
					held += c
				}
			}
			dAll, dHeld := all-min(all, ctl.packets[dl.Class]), held-min(held, ctl.held[dl.Class])
			ctl.packets[dl.Class], ctl.held[dl.Class] = all, held
			if dAll > 0 && float64(dHeld) >= heldShare*float64(dAll) {
				rs[i].Queued = true
			}
		}
		var err error
		if prog, err = p.Kernel().OpenHook(ctl.dev, false); err != nil || prog == nil {
			a.logFailure("sharing: reading the EDT program failed", "sharing", fmt.Errorf("%s: %v", ctl.dev, err))
			return
		}
		defer prog.Close()
		if targets, _, err = prog.Targets(); err != nil {
			a.logFailure("sharing: reading the EDT program failed", "sharing", err)
			return
		}
		for i, ch := range ctl.cfg.Children {
			if int(ch.Target) < len(targets) {
				liveCeil[i] = units.Rate(targets[ch.Target].Rate).BitsFloat()
			}
		}
	}
	for i := range found {
		if !found[i] {
			ctl.c.Reset() // a class missing: measure afresh once it is back
			ctl.last, ctl.decided = now, nil
			return
		}
	}
	ds := ctl.c.Step(now, rs)
	ctl.last = now
	if ds == nil {
		return
	}
	ctl.decided = ctl.decided[:0]
	k := p.Kernel()
	for i, d := range ds {
		ch := ctl.cfg.Children[i]
		sh := &stats.Share{Class: ch.Name, Owner: ctl.cfg.Owner, Weight: ch.Weight, Prod: ch.Prod, Usage: d.Usage,
			Demand: d.Demand, Hungry: d.Hungry, Share: d.Share, Limit: d.Limit, Applied: d.Applied, Assured: ctl.cfg.Assure,
			Rate: liveRate[i], Ceil: liveCeil[i]}
		ctl.decided = append(ctl.decided, sh)
		if ch.Prod {
			continue
		}
		want := units.FromBits(d.Ceil)
		if edt {
			if math.Abs(float64(want)-float64(units.FromBits(liveCeil[i]))) < 1 {
				continue
			}
			if int(ch.Target) >= len(targets) {
				continue
			}
			tg := targets[ch.Target]
			tg.Rate, tg.Horizon = uint64(max(want, 1)), plan.HorizonFor(ctl.cfg.Horizon, want)
			if err := prog.SetTarget(ch.Target, tg); err != nil {
				a.logFailure("sharing: writing a cap failed", "sharing", fmt.Errorf("%s aggregate %s: %w", ctl.dev, ch.Name, err))
				continue
			}
			a.metrics.shareWrites.Inc()
			sh.Ceil = units.Rate(tg.Rate).BitsFloat()
			continue
		}
		pc := planned[ch.Handle]
		if pc == nil {
			continue
		}
		// Kept between the planned rate and ceil, as the reconciler
		// expects of a controlled class (kernel.Options.KeepCeils).
		cl := *pc
		cl.Ceil = min(max(want, pc.Rate), pc.Ceil)
		cl.Rate = min(max(units.FromBits(d.Rate), pc.Rate), cl.Ceil)
		if same(cl.Rate, liveRate[i]) && same(cl.Ceil, liveCeil[i]) {
			continue
		}
		if err := k.Conn.ClassChange(&cl); err != nil {
			a.logFailure("sharing: writing a class's rate and ceil failed", "sharing", fmt.Errorf("%s class %s: %w", ctl.dev, ch.Name, err))
			continue
		}
		a.metrics.shareWrites.Inc()
		sh.Rate, sh.Ceil = cl.Rate.BitsFloat(), cl.Ceil.BitsFloat()
		a.log.Debug("sharing: class", "device", ctl.dev, "class", ch.Name, "rate_bps", sh.Rate, "ceil_bps", sh.Ceil,
			"usage_bps", d.Usage, "share_bps", d.Share, "applied", d.Applied)
	}
}

// same: a planned rate and a live one read back in bits/s agree (the
// kernel keeps bytes/s).
func same(r units.Rate, live float64) bool {
	return math.Abs(float64(r)-float64(units.FromBits(live))) < 1
}

func byName(cs []plan.Controlled, name string) (int, bool) {
	for i, c := range cs {
		if c.Name == name {
			return i, true
		}
	}
	return 0, false
}
