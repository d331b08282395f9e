package agent

import (
	"fmt"
	"reflect"
	"time"

	"sluice/bpf"
	"sluice/engine"
	"sluice/kernel"
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
	// limits are what it decided last, laid over the plan by the
	// engine session (plan.Limits).
	limits plan.Limits
	// leafBytes: a sharded tree's leaves' byte counters at the last
	// step (which hosts are active).
	leafBytes map[string]uint64
	// stepBytes: each child's bytes at the last step, against which a
	// load start is seen (loadStarted); early: one was, so the next
	// pass steps before the quantum is up.
	stepBytes []uint64
	early     bool
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
func sameConfig(a, b plan.Controller) bool { return reflect.DeepEqual(a, b) }

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

// runControllers steps every controller of pl (the plan in force) whose
// quantum has passed, on the pass's reading, has the engine session
// write the limits they decide, and records their decisions in the
// reading (stats.Tree.Sharing). p is the pass, holding the namespace's
// lock; a steady pass (nil p) prepares one only when the limits change
// or their lease needs renewing, which is seldom once shares settle.
func (a *Agent) runControllers(p *engine.Prepared, pl *plan.Plan, k *kernel.Reader, s *stats.Sample) {
	live := map[string]*controller{}
	var wrote []written
	planned := map[tc.Handle]*tc.Class{}
	for _, d := range pl.Devices {
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
			if !ctl.early && !ctl.last.IsZero() && s.At.Sub(ctl.last) < cfg.Quantum-a.tick/2 {
				tree.Sharing = append(tree.Sharing, ctl.decided...)
				continue
			}
			ctl.early = false
			wrote = append(wrote, a.step(k, d, ctl, tree, planned, s.At)...)
			tree.Sharing = append(tree.Sharing, ctl.decided...)
		}
	}
	a.ctls = live
	limits := a.allLimits() // the auto rates' too: SetLimits sets them all
	if p == nil {
		if a.sess.LimitsHold(limits) {
			return
		}
		var err error
		if p, err = a.sess.PrepareLimits(); err != nil {
			a.logFailure("sharing: writing the limits failed", "sharing", err)
			return
		}
		defer p.Close()
	}
	res, err := a.sess.SetLimits(p, limits)
	if err != nil {
		a.logFailure("sharing: writing the limits failed", "sharing", err)
		return
	}
	a.markWritten()
	a.metrics.shareWrites.Add(float64(res.Changes))
	for _, w := range wrote {
		w.share.Rate, w.share.Ceil = w.rate, w.ceil
	}
}

// written is a share whose limits the step decided: once they are
// written, the share shows them.
type written struct {
	share      *stats.Share
	rate, ceil units.Rate
}

func newController(d *plan.Device, cfg plan.Controller) *controller {
	ctl := &controller{dev: d.Name, cfg: cfg, drops: map[string]uint64{},
		packets: map[string]uint64{}, held: map[string]uint64{},
		c: &share.Controller{Capacity: cfg.Capacity, ApplyAbove: cfg.ApplyAbove, Assure: cfg.Assure, Bound: cfg.Bound, Hard: cfg.Shards}}
	for _, ch := range cfg.Children {
		ctl.c.Children = append(ctl.c.Children, share.Child{Name: ch.Name, Weight: ch.Weight,
			Rate: ch.Rate, Ceil: ch.Ceil, Prod: ch.Prod, Capped: ch.Capped, Standby: ch.Standby})
	}
	return ctl
}

// leafWeight is what a balanced shard's leaf adds to the shard's
// weight: its rate while it queues or sends in earnest (at least
// busyFrames full frames a second since its bytes were prev, dt seconds
// ago), and for a trickle only what it sent at, up to its rate. Counted
// at its whole rate, one stray packet (a neighbour probe, a DNS query
// in the shard's copy of the default class) weighed the shard as if a
// busy class had woken, and a lone host's shard got up to a third of
// the link for the step (measured: 10.4% where the reference gives
// 9.1%, one host against ten). A busy leaf need not queue at the
// instant of a reading, so what it sent decides, not its backlog alone.
func leafWeight(c *stats.Class, prev uint64, seen bool, dt float64) float64 {
	rate := float64(max(c.Rate, 1))
	switch {
	case c.Backlog > 0:
		return rate
	case !seen || c.Bytes <= prev:
		return 0
	case dt <= 0:
		return rate
	}
	sent := float64(c.Bytes-prev) / dt
	if sent >= busyFrames*frameBytes {
		return rate
	}
	return min(rate, sent)
}

// busyFrames is the pace, in full frames a second, from which a leaf
// counts as busy: above ARP, DNS and keepalives, below any transfer.
const (
	busyFrames = 8
	frameBytes = 1514
)

func treeOf(s *stats.Sample, dev string) *stats.Tree {
	for _, t := range s.Trees {
		if t.Device == dev && !t.Missing {
			return t
		}
	}
	return nil
}

// step reads the children's counters (each with its descendants: a
// tenant's subclasses and hosts queue for it) and decides the
// children's limits (ctl.limits), which runControllers has written.
func (a *Agent) step(k *kernel.Reader, dev *plan.Device, ctl *controller, tree *stats.Tree, planned map[tc.Handle]*tc.Class, now time.Time) []written {
	edt := tree.Backend == "edt"
	n := len(ctl.cfg.Children)
	sums := sumChildren(ctl.cfg.Children, tree)
	bytes, backlog, drops := sums.bytes, sums.backlog, sums.drops
	liveRate, liveCeil := make([]units.Rate, n), make([]units.Rate, n)
	found := make([]bool, n)
	// A sharded tree's shards weigh what their active hosts (leaves
	// that sent since the last step, or queue) weigh: their rates.
	active := make([]float64, n)
	if ctl.cfg.Shards && ctl.leafBytes == nil {
		ctl.leafBytes = map[string]uint64{}
	}
	for k, c := range tree.Classes {
		i := sums.owner[k]
		if i < 0 {
			continue
		}
		if ctl.cfg.Children[i].ID == c.ID {
			liveRate[i], liveCeil[i], found[i] = c.Rate, c.Ceil, true
		}
		if ctl.cfg.Shards && !sums.parent[c.ID] {
			prev, seen := ctl.leafBytes[c.ID]
			ctl.leafBytes[c.ID] = c.Bytes
			active[i] += leafWeight(c, prev, seen, now.Sub(ctl.last).Seconds())
		}
	}
	rs := make([]share.Reading, n)
	for i, ch := range ctl.cfg.Children {
		// An EDT aggregate's backlog is its clock running ahead, which
		// one packet at a low cap does: its delays say below whether
		// the cap held it back.
		rs[i] = share.Reading{Bytes: bytes[i], Queued: !edt && backlog[i] > 0 || drops[i] > ctl.drops[ch.Name]}
		ctl.drops[ch.Name] = drops[i]
	}
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
		prog, err := k.OpenHook(ctl.dev, false)
		if err != nil || prog == nil {
			a.logFailure("sharing: reading the EDT program failed", "sharing", fmt.Errorf("%s: %v", ctl.dev, err))
			return nil
		}
		targets, _, err = prog.Targets()
		var hosts map[bpf.HostKey]bpf.Target
		if err == nil {
			hosts, err = prog.LookupHosts(hostKeys(ctl.cfg.Children))
		}
		prog.Close()
		if err != nil {
			a.logFailure("sharing: reading the EDT program failed", "sharing", err)
			return nil
		}
		for i, ch := range ctl.cfg.Children {
			switch {
			case len(ch.Hosts) > 0: // a group's host
				if t, ok := hosts[ch.Hosts[0]]; ok {
					liveCeil[i] = t.Rate
				}
			case int(ch.Target) < len(targets):
				liveCeil[i] = targets[ch.Target].Rate
			}
		}
	}
	for i := range found {
		if !found[i] {
			ctl.c.Reset() // a class missing: measure afresh once it is back
			ctl.last, ctl.decided, ctl.limits = now, nil, nil
			return nil
		}
	}
	if ctl.cfg.Shards {
		for i := range ctl.c.Children {
			ctl.c.Children[i].Weight = max(active[i], 1) // an idle shard weighs next to nothing
		}
	}
	ds := ctl.c.Step(now, rs)
	ctl.last, ctl.stepBytes = now, bytes
	if ds == nil {
		return nil
	}
	ctl.decided = ctl.decided[:0]
	ctl.limits = plan.Limits{}
	var out []written
	hook := &bpf.Hook{Dev: ctl.dev}
	for i, d := range ds {
		ch := ctl.cfg.Children[i]
		sh := &stats.Share{Class: ch.Name, Owner: ctl.cfg.Owner, Weight: ch.Weight, Prod: ch.Prod, Usage: d.Usage,
			Demand: d.Demand, Hungry: d.Hungry, Share: d.Share, Limit: d.Limit, Applied: d.Applied, Assured: ctl.cfg.Assure,
			Rate: liveRate[i], Ceil: liveCeil[i]}
		ctl.decided = append(ctl.decided, sh)
		if ch.Prod {
			continue
		}
		want := d.Ceil
		if edt {
			// The engine holds a cap at most the planned one (the child's ceil).
			switch {
			case len(ch.Hosts) > 0:
				ctl.limits[plan.HostLimit(hook, ch.Name)] = plan.Limit{Ceil: want}
			case int(ch.Target) < len(targets):
				ctl.limits[plan.TargetLimit(hook, ch.Target)] = plan.Limit{Ceil: want}
			default:
				continue
			}
			out = append(out, written{sh, liveRate[i], min(max(want, 1), ch.Ceil)})
			if want != liveCeil[i] {
				a.log.Debug("sharing: aggregate", "device", ctl.dev, "class", ch.Name, "cap_bps", want.BitsFloat(),
					"usage_bps", d.Usage.BitsFloat(), "share_bps", d.Share.BitsFloat(), "applied", d.Applied)
			}
			continue
		}
		pc := planned[ch.Handle]
		if pc == nil {
			continue
		}
		// plan.WithLimits holds them between the planned rate and ceil;
		// the share shows what it will hold.
		lim := plan.Limit{Rate: d.Rate, Ceil: want}
		ctl.limits[plan.ClassLimit(pc)] = lim
		rate, ceil := dev.Held(pc, lim) // what the engine will hold
		out = append(out, written{sh, rate, ceil})
		// A balanced shard's copies of the other classes get their part
		// of its share as rates (plan.Scaled).
		if part := float64(d.Rate) / float64(ctl.c.Capacity); len(ch.Scaled) > 0 && ctl.c.Capacity > 0 {
			for _, sc := range ch.Scaled {
				if rc := planned[sc.Handle]; rc != nil {
					ctl.limits[plan.ClassLimit(rc)] = plan.Limit{Rate: units.Rate(float64(sc.Rate) * part), Ceil: rc.Ceil}
				}
			}
		}
		if rate != liveRate[i] || ceil != liveCeil[i] {
			a.log.Debug("sharing: class", "device", ctl.dev, "class", ch.Name, "rate_bps", rate.BitsFloat(), "ceil_bps", ceil.BitsFloat(),
				"usage_bps", d.Usage.BitsFloat(), "share_bps", d.Share.BitsFloat(), "applied", d.Applied)
		}
	}
	return out
}

// StartWatch is how often the agent reads the counters between a
// sharing controller's steps for a load start (loadStarted): a class
// that starts is given its share within about this long, not at the
// next quantum (1 s by default). Only the counters of the trees in
// force are read, and only while nothing changed (engine's Steady);
// the watch slows down where a read is slow (watchStarts).
const StartWatch = 100 * time.Millisecond

// watchCost is how many reads' time the watch waits at least: 1/watchCost
// of a core at most.
const watchCost = 50

// watchStarts steps, at once, each controller one of whose children
// started sending since its last step, and returns when to look again:
// StartWatch, or 50 reads' time where a read takes longer than 2 ms (a
// tree of a thousand hosts and more), so that the watch costs at most
// about 2% of a core (measured: the agent idle at 1,000 hosts under a
// controller took 1.0% of a core without the watch, 6.5% at 20 reads'
// time, 3.8% at 50).
func (a *Agent) watchStarts() time.Duration {
	if a.inForce == nil || !a.recorded || len(a.ctls) == 0 {
		return StartWatch
	}
	t0 := time.Now()
	s, ok := a.sess.Steady(a.pol)
	next := max(StartWatch, watchCost*time.Since(t0))
	if !ok {
		return next // the next pass reads everything
	}
	started := false
	for _, ctl := range a.ctls {
		if ctl.cfg.Quantum <= StartWatch {
			continue // steps as often as the watch would look
		}
		if tree := treeOf(s, ctl.dev); tree != nil && ctl.loadStarted(tree) {
			ctl.early, started = true, true
			a.metrics.earlySteps.Inc()
		}
	}
	if started {
		if k, err := a.sess.Reader(); err == nil {
			a.runControllers(nil, a.inForce, k, s)
		}
	}
	return next
}

// childSums are a controller's children's counters in one reading.
type childSums struct {
	// owner[k] is the child tree.Classes[k] is or descends from (-1:
	// none); parent holds the IDs of classes with children.
	owner  []int
	parent map[string]bool
	// A child's bytes are its leaves' (itself, if it is one): the
	// kernel's HTB counts an inner class's bytes in bursts, a second
	// or two apart, which would read as a class that stopped and
	// started. Backlog and drops are its whole subtree's.
	bytes, backlog, drops []uint64
}

func sumChildren(children []plan.Controlled, tree *stats.Tree) childSums {
	byID := make(map[string]*stats.Class, len(tree.Classes))
	s := childSums{owner: make([]int, len(tree.Classes)), parent: map[string]bool{},
		bytes: make([]uint64, len(children)), backlog: make([]uint64, len(children)), drops: make([]uint64, len(children))}
	for _, c := range tree.Classes {
		byID[c.ID] = c
		s.parent[c.Parent] = true
	}
	child := make(map[string]int, len(children))
	for i, ch := range children {
		child[ch.ID] = i
	}
	for k, c := range tree.Classes {
		s.owner[k] = -1
		// Walk up to the controlled child this class belongs to, if any.
		for x, depth := c, 0; x != nil && depth < 16; x, depth = byID[x.Parent], depth+1 {
			i, ok := child[x.ID]
			if !ok {
				continue
			}
			s.owner[k] = i
			if !s.parent[c.ID] {
				s.bytes[i] += c.Bytes
			}
			s.backlog[i] += uint64(c.Backlog)
			s.drops[i] += uint64(c.Drops)
			break
		}
	}
	return s
}

// loadStarted reports whether a child that was idle at ctl's last step
// (using less than busyFrames full frames a second, not held back) has
// started since: it queues or drops, or has sent busyFrames full frames.
// A load start is what a quantum's wait costs most at: the sibling
// keeps the whole capacity and the newcomer gets what HTB's own split
// gives it until the next step (measured in on-off: b at 5 to 6 Mbit/s
// for a second where its share is 14.6). A trickle (ARP, DNS) is no
// start; a burst below apply_above still gets no limit: the early step
// is an ordinary one, only sooner.
func (ctl *controller) loadStarted(tree *stats.Tree) bool {
	n := len(ctl.cfg.Children)
	if ctl.cfg.Shards || len(ctl.decided) != n || len(ctl.stepBytes) != n {
		return false
	}
	sums := sumChildren(ctl.cfg.Children, tree)
	for i, ch := range ctl.cfg.Children {
		d := ctl.decided[i]
		if ch.Prod || d.Hungry || d.Usage >= busyFrames*frameBytes {
			continue // not idle at the last step
		}
		queued := tree.Backend != "edt" && sums.backlog[i] > 0 // an EDT clock's lead is no queue
		if queued || sums.drops[i] > ctl.drops[ch.Name] ||
			sums.bytes[i] >= ctl.stepBytes[i]+busyFrames*frameBytes {
			return true
		}
	}
	return false
}

// hostKeys lists the host entries of the children that are hosts of
// an EDT group.
func hostKeys(cs []plan.Controlled) []bpf.HostKey {
	var out []bpf.HostKey
	for _, c := range cs {
		out = append(out, c.Hosts...)
	}
	return out
}

func byName(cs []plan.Controlled, name string) (int, bool) {
	for i, c := range cs {
		if c.Name == name {
			return i, true
		}
	}
	return 0, false
}
