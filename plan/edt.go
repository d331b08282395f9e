package plan

import (
	"fmt"
	"time"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
	"sluice/units"
)

// The EDT backend (seeds 000 and 001): no HTB. Every leaf class and
// every host is an aggregate paced by the BPF classifier, which gives
// each packet its earliest departure time; fq on every transmit queue
// holds packets until then. The tree's objects are the root (fq on a
// single-queue device; mq, or mqprio when prod and nonprod classes
// share the device, with an fq per queue), the clsact hook with the
// program, and for ingress the ifb and redirect as for HTB.

// FqTag is the orphan_mask an EDT tree's fq qdiscs carry: the tree's
// tag above fq's default mask (1023), so that a root of the same kind
// and handle made by someone else is told apart, as HTB's r2q does for
// HTB trees. The wider mask only hashes forwarded flows more finely.
func FqTag(tag uint32) uint32 { return tag<<10 | 1023 }

// prodPriority is the skb->priority the program gives prod packets
// (TC_PRIO_INTERACTIVE; nonprod get TC_PRIO_BESTEFFORT, 0), which an
// mqprio root maps to traffic class 0 (nonprod: 1).
const prodPriority = 6

// poolName is the counter name of the direction's shared clock (class
// names cannot hold parentheses).
const poolName = "(link)"

// edtPlan is what the builder needs while compiling an EDT tree.
type edtPlan struct {
	hists *idPool[uint16]
	// split: the tree has prod (prio 0) and nonprod aggregates. Only
	// then is prio 0 prod: when every aggregate has one prio, all of them
	// wait for the direction's shared clock (with all of them prod, at
	// the default prio 0, the direction's rate bound nothing: three
	// aggregates capped at 21mbit sent 63 Mbit/s through a 21mbit
	// direction).
	split bool
	// groups are the groups (groups_file) with hosts, in plan order,
	// and their hosts as their controllers' children.
	groups     []*policy.Class
	groupHosts map[*policy.Class][]Controlled
}

// groupHost adds host ch to group g's controller.
func (e *edtPlan) groupHost(g *policy.Class, ch Controlled) {
	if e.groupHosts == nil {
		e.groupHosts = map[*policy.Class][]Controlled{}
	}
	if _, ok := e.groupHosts[g]; !ok {
		e.groups = append(e.groups, g)
	}
	e.groupHosts[g] = append(e.groupHosts[g], ch)
}

// groupControllers plans a sharing controller for each group of the
// tree's per_host classes: its hosts share the group's cap by weighted
// max-min (their rates, which are their weights' parts of the group's),
// each held at its share by its own cap. Without them the group's clock
// alone shares it, per flow, as fq does. The agent runs them.
func (b *builder) groupControllers() {
	for _, g := range b.edt.groups {
		ctl := Controller{Owner: g.Name, Quantum: policy.DefaultSharingQuantum, ApplyAbove: policy.DefaultApplyAbove,
			Capacity: g.CeilBps, Horizon: b.tree.Horizon, Children: b.edt.groupHosts[g]}
		b.dev.Controllers = append(b.dev.Controllers, ctl)
	}
}

func buildEDT(d *policy.Diag, feats Features, in *policy.Interface, t *policy.Tree, devName string, prev *Alloc) *Device {
	if prev == nil {
		prev = newAlloc()
	}
	dev := &Device{Name: devName, Interface: in.Name, Dir: t.Dir, Ifb: t.Dir == policy.Ingress, Alloc: newAlloc(), EDT: true, tree: t}
	dev.Alloc.Tag = prev.Tag
	where := in.Name + " " + t.Dir
	if !feats.Qdiscs["fq"] {
		d.Errorf(t.BackendPos, "%s: backend edt needs the fq qdisc (sch_fq), which this kernel lacks; see sluice doctor", where)
		return dev
	}
	b := &builder{d: d, feats: feats, dev: dev, tree: t, prev: prev, byName: map[string]*policy.Class{}, major: 1, div: 1,
		edt: &edtPlan{hists: newPool(prev.Hists, 1, bpf.MaxHists-1)}}
	b.rttSetup(in, t)
	b.counters = newPool(prev.Counters, 1, 1<<22)
	b.tables = newPool(prev.Tables, 1, 0x7FF)
	b.counter(poolName)
	b.walkNames(t.Classes, func(name string, _ bool) { b.counter(name) })

	queues := feats.TxQueues[devName]
	if dev.Ifb {
		queues = t.Queues
		if queues == 0 {
			queues = policy.DefaultIfbQueues
		}
		b.objs = append(b.objs, &tc.Link{Name: devName, Kind: "ifb", Up: true, TxQueues: queues})
	}
	queues = max(queues, 1)
	hasProd, hasNon := kinds(t.Classes)
	b.edt.split = hasProd && hasNon
	e := &bpf.EDT{Horizon: uint64(t.Horizon), Link: bpf.Link{Overhead: int32(t.Overhead), MPU: uint16(t.MPU), ATM: t.Linklayer == "atm"}}
	nonQ := 0
	if hasProd && hasNon && queues >= 2 {
		nonQ = max(1, queues/8) // seed 000's 7:1
	}
	prodQ := queues - nonQ
	switch {
	case queues == 1:
	case nonQ == 0:
		all := bpf.QueueRange{Count: uint16(queues)}
		e.Queues = [2]bpf.QueueRange{all, all}
	default:
		e.Queues = [2]bpf.QueueRange{{Count: uint16(prodQ)}, {First: uint16(prodQ), Count: uint16(nonQ)}}
	}
	if feats.XPS[devName] && queues > 1 {
		dev.Notes = append(dev.Notes, fmt.Sprintf("transmit packet steering (XPS) is configured on %s and picks queues before sluice does: prod and nonprod traffic may share queues, and a flow may change queue (reordering); clear /sys/class/net/%s/queues/tx-*/xps_cpus", devName, devName))
	}
	fq := func() *tc.Fq {
		return &tc.Fq{Limit: fqLimit(t), FlowLimit: fqLimit(t), OrphanMask: FqTag(dev.Alloc.R2Q())}
	}
	if queues == 1 {
		b.objs = append(b.objs, &tc.Qdisc{Dev: devName, Parent: tc.HandleRoot, Handle: RootHandle, Kind: "fq", Fq: fq()})
	} else {
		root := &tc.Qdisc{Dev: devName, Parent: tc.HandleRoot, Handle: RootHandle, Kind: "mq"}
		if nonQ > 0 && feats.Qdiscs["mqprio"] {
			m := &tc.MQPrio{NumTC: 2}
			for p := range m.Map {
				m.Map[p] = 1
			}
			m.Map[prodPriority] = 0
			m.Count[0], m.Count[1], m.Offset[1] = uint16(prodQ), uint16(nonQ), uint16(prodQ)
			root.Kind, root.MQPrio, e.Prio = "mqprio", m, true
		}
		b.objs = append(b.objs, root)
		for q := 0; q < queues; q++ {
			b.objs = append(b.objs, &tc.Qdisc{Dev: devName, Parent: tc.MakeHandle(1, uint16(q+1)),
				Handle: tc.MakeHandle(uint16(0x100+q), 0), Kind: "fq", Fq: fq()})
		}
	}

	hook := b.bpfHook()
	c := hook.Content
	c.SetPriority = false
	if len(t.Exempt) > 0 {
		first := len(c.Rules)
		for _, m := range t.Exempt {
			c.Rules = append(c.Rules, bpfRules(m)...)
		}
		c.Blocks = append(c.Blocks, bpf.Block{First: uint32(first), Count: uint32(len(c.Rules) - first)})
		e.Exempt = uint32(len(c.Blocks))
	}
	e.FromIngress = dev.Ifb
	// The direction's rate is a shared cap only when the aggregates'
	// caps add up to more: otherwise it could never bind, and would
	// cost every packet a second atomic.
	var caps units.Rate
	for _, ci := range b.dev.Classes {
		caps += ci.Ceil
	}
	// A per_host class is no aggregate, but show and the metrics sum its
	// hosts under its name (Counter 0: no counter of its own).
	var groups func(cs []*policy.Class)
	groups = func(cs []*policy.Class) {
		for _, cl := range cs {
			if cl.PerHost != nil {
				prio := uint32(1)
				if b.edt.split && cl.Prio == 0 {
					prio = 0
				}
				hist, _ := b.edt.hists.get(cl.Name)
				b.dev.Classes = append(b.dev.Classes, ClassInfo{Name: cl.Name, Rate: cl.RateBps, Ceil: cl.CeilBps, Prio: prio, Hist: hist})
			}
			groups(cl.Classes)
		}
	}
	groups(t.Classes)
	if n := groupCount(t.Classes); n > 0 {
		dev.Notes = append(dev.Notes, fmt.Sprintf("edt: %d groups (groups_file) cap their hosts together, each with a clock of its own; within a group the agent's sharing controller divides its cap among the hosts by their rates (without an agent running they share it as fq does, per flow), and a group's rate is not guaranteed", n))
	}
	if caps > t.RateBps {
		e.Pool, e.PoolRate, e.PoolBurst = b.counter(poolName), t.RateBps, uint64(t.Burst.NS(t.RateBps))
		if !hasSharing(t) {
			dev.Notes = append(dev.Notes, fmt.Sprintf("edt: the aggregates' caps add up to more than the direction's %s: when it binds they share it as fq does, per flow, not by rate, weight or host, and no rate is guaranteed (sharing: controller shares it by weight; docs/sharing.md)",
				t.RateBps.String()))
		}
	}
	if b.edt.split {
		var prod units.Rate
		for _, ci := range b.dev.Classes {
			if ci.Prio == 0 && ci.Counter != 0 {
				prod += ci.Ceil
			}
		}
		dev.Notes = append(dev.Notes, fmt.Sprintf("edt: prod aggregates (prio 0) never wait for the others: sending up to their caps (together %s of the direction's %s) they leave the nonprod ones what they do not use, whatever their rates",
			prod.String(), t.RateBps.String()))
	}
	c.EDT = e
	b.edtCap(c)
	b.edtControllers(hook)
	b.groupControllers()
	if err := c.Validate(); err != nil && len(d.Errs) == 0 {
		d.Errorf(t.Pos, "%s: %v", where, err)
	}
	hook.Note = fmt.Sprintf("EDT pacing on %s, %d queues", devName, queues)
	b.objs = append(b.objs, clsact(devName), hook)
	if dev.Ifb {
		b.objs = append(b.objs, redirect(in.Name, devName)...)
	}
	dev.Objects = b.objs
	dev.Alloc.Counters, dev.Alloc.Tables, dev.Alloc.Hists = b.counters.next, b.tables.next, b.edt.hists.next
	return dev
}

// fqLimit is the packet limit (per qdisc and per flow) of an EDT
// tree's fq: the horizon is the queue bound, so fq's own limits (10,000
// packets, 100 per flow) must not bind first. The tree holds at most a
// horizon of its rate, counted here in 256-byte packets.
func fqLimit(t *policy.Tree) uint32 {
	n := t.Horizon.Seconds() * float64(t.RateBps) / 256
	return uint32(min(max(n, 10000), 1<<20))
}

// horizonFor is an aggregate's horizon: the tree's, but never less than
// the time one maximal GSO/GRO packet (64 KB) and three frames take at
// the aggregate's cap, for the reason bfifo leaves get that floor
// (MinBfifoBytes): a 64 KB packet pushes a 2mbit aggregate's clock 262 ms
// ahead, and with a 100 ms horizon the packets after it were dropped in
// runs that TCP only recovers from by timeout (measured in the lane:
// 2mbit hosts at 0.78 to 0.87 of their cap; at or above it with the
// floor).
//
// That floor waits at most gsoFloorMax, and the horizon never holds less
// than minHorizonFrames full frames. Below 560 kbit/s a 64 KB packet
// takes longer than a second, and TCP's packets are small there (it
// sizes them to a millisecond of its pacing rate, two segments at
// least); the full floor made a queue of seconds that TCP fills: at
// 18.7 kbit/s (a light default class the sharing controller held to its
// share) it reached the 10 s bound, the flow's RTT 8 s and its
// retransmission timeout 24 s, and one loss at the horizon left it
// silent for a whole 16 s measurement (the 6.1 lane, 2026-12-04).
func horizonFor(h time.Duration, limit units.Rate) uint64 {
	return HorizonFor(h, limit)
}

// gsoFloorMax and minHorizonFrames bound an aggregate's horizon floor
// (horizonFor).
const (
	gsoFloorMax      = time.Second
	minHorizonFrames = 4
)

// HorizonFor is horizonFor, for the sharing controller when it moves an
// aggregate's cap.
func HorizonFor(h time.Duration, limit units.Rate) uint64 {
	ns := uint64(h)
	if limit > 0 {
		gso := min(uint64(float64(MinBfifoBytes)*1e9/float64(limit)), uint64(gsoFloorMax))
		frames := uint64(float64(minHorizonFrames*frameBytes) * 1e9 / float64(limit))
		ns = max(ns, gso, frames)
	}
	return min(ns, uint64(policy.MaxHorizon))
}

// groupCount counts the groups (groups_file lines) of the per_host
// classes in cs.
func groupCount(cs []*policy.Class) int {
	n := 0
	for _, c := range cs {
		if c.PerHost != nil {
			n += len(c.PerHost.Groups)
		}
		n += groupCount(c.Classes)
	}
	return n
}

// kinds reports whether the tree has prod (prio 0) and nonprod leaves
// (hosts included: a hosts file's prio column).
func kinds(cs []*policy.Class) (prod, non bool) {
	see := func(prio uint32) {
		prod, non = prod || prio == 0, non || prio != 0
	}
	for _, c := range cs {
		switch ph := c.PerHost; {
		case c.Group != "": // a groups_file's: its hosts are the aggregates
		case ph != nil:
			see(hostPrio(c)) // the class's, kept as pods come and go
			for _, e := range ph.Entries {
				see(entryPrio(e))
			}
		case c.IsLeaf():
			see(uint32(c.Prio))
		}
		p, n := kinds(c.Classes)
		prod, non = prod || p, non || n
	}
	return prod, non
}

// pace fills in the EDT part of target t of an aggregate (class cl, or
// a host of per_host class cl) of prio prio capped at limit, and
// records it for show.
func (b *builder) pace(t *bpf.Target, name string, cl *policy.Class, rate, limit units.Rate, host bool, prio uint32) {
	hist, _ := b.edt.hists.get(cl.Name)
	burst := b.tree.Burst.NS(limit)
	if cl.Burst != nil && !host {
		burst = (&policy.Burst{Bytes: cl.Burst.Bytes}).NS(limit)
	}
	t.Classid, t.Hist = 0, hist
	setPace(t, b.tree, burst, rate, limit)
	shown := uint32(1) // show's prio: 0 prod, 1 nonprod
	t.Prod = 0
	if b.edt.split && prio == 0 {
		t.Prod, shown = 1, 0
	}
	b.dev.Classes = append(b.dev.Classes, ClassInfo{Name: name, Rate: rate, Ceil: limit, Prio: shown, Leaf: "edt",
		Counter: t.Counter, Default: name == b.tree.Default, Hist: hist})
}

// setPace sets what paces an aggregate of tree at rate (its weight)
// capped at limit, with burst.
func setPace(t *bpf.Target, tree *policy.Tree, burst uint32, rate, limit units.Rate) {
	t.Rate, t.Burst = limit, burst
	t.Horizon = horizonFor(tree.Horizon, limit)
	t.Weight = uint32(min(uint64(rate), 1<<32-1))
}

// redirect is the ingress hook of iface sending everything to ifb.
func redirect(iface, ifb string) []tc.Object {
	return []tc.Object{
		clsact(iface),
		&tc.Filter{Dev: iface, Parent: tc.HandleIngressHook, Prio: HookPrio, Proto: tc.ProtoAll, Kind: "u32"},
		&tc.Filter{Dev: iface, Parent: tc.HandleIngressHook, Prio: HookPrio, Proto: tc.ProtoAll, Kind: "u32",
			Handle: 1, U32: &tc.U32{Sel: &tc.Sel{Keys: []tc.Key{{}}}, RedirectDev: ifb},
			Note: "ingress of " + iface + " -> " + ifb},
	}
}
