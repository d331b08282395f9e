package kernel

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"sluice/bpf"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
)

// Reading back: the objects of the trees sluice plans or remembers, as
// the kernel holds them now.

// treeRef is a device whose tree sluice plans or remembers.
type treeRef struct {
	dev, iface string
	ifb        bool
	police     bool // a policer without a tree, on iface's hook in dir
	dir        string
	planned    bool
	rec        *records.Tree
}

func (k *Kernel) refs(p *plan.Plan, only map[string]bool) []treeRef {
	var out []treeRef
	seen := map[string]bool{}
	if p != nil {
		for _, d := range p.Devices {
			seen[d.Record()] = true
			out = append(out, treeRef{dev: d.Name, iface: d.Interface, ifb: d.Ifb, police: d.PoliceOnly, dir: d.Dir,
				planned: true, rec: k.recs.Devices[d.Record()]})
		}
	}
	for _, name := range k.recs.Names() {
		if seen[name] || only != nil && !only[name] {
			continue
		}
		r := k.recs.Devices[name]
		dev := name
		if r.PoliceOnly {
			dev = r.Interface
		}
		out = append(out, treeRef{dev: dev, iface: r.Interface, ifb: r.IsIfb(), police: r.PoliceOnly, dir: r.Dir, rec: r})
	}
	return out
}

// Live is the part of the kernel sluice manages, as read now.
type Live struct {
	Objects []tc.Object
	Opt     Options
	// Adopted names ifb devices that existed before sluice used them.
	Adopted map[string]bool
	// HookShared names interfaces whose ingress qdisc sluice did not create.
	HookShared map[string]bool
	// Foreign lists other tools' filters on an ingress hook that run
	// before sluice's redirect to its ifb: the packets they take never
	// reach the ingress tree. With force those that redirect elsewhere
	// (the shaping sluice's tree replaces) are in Objects, to be deleted.
	Foreign []ForeignFilter
	// deltas hold, per tree, how deltaPlan's fingerprints differ from
	// the recorded ones, when ReadTouched read only what the edit
	// touches: the records of that apply are the old ones plus these
	// (newRecords), not a fingerprint of every object again.
	deltas    map[string]*fpDelta
	deltaPlan *plan.Plan
}

// ReadLive reads the objects of every tree p plans or the records name
// (restricted to only, when non-nil). force allows taking over foreign
// root qdiscs on planned devices.
func (k *Kernel) ReadLive(p *plan.Plan, only map[string]bool, force bool) (*Live, error) {
	defer k.conn.Pin()()
	l := &Live{Opt: Options{Replace: map[string]bool{}, Shared: map[string]bool{}},
		Adopted: map[string]bool{}, HookShared: map[string]bool{}}
	for _, r := range k.refs(p, only) {
		if r.police {
			if !k.conn.LinkExists(r.dev) {
				continue
			}
			qs, err := k.conn.Qdiscs(r.dev)
			if err != nil {
				return nil, err
			}
			if err := k.readBPF(l, r.dev, qs, r.dir == policy.Ingress); err != nil {
				return nil, err
			}
			continue
		}
		qs, err := k.readTree(l, r, force)
		if err != nil {
			return nil, err
		}
		if err := k.readBPF(l, r.dev, qs, false); err != nil {
			return nil, err
		}
		if err := k.readEcho(l, r, qs); err != nil {
			return nil, err
		}
		if r.ifb {
			if err := k.readHook(l, r, force); err != nil {
				return nil, err
			}
		}
	}
	// A clsact two trees use (an ingress redirect and a BPF
	// classifier on one interface) was read twice.
	seen := make(map[string]bool, len(l.Objects))
	out := l.Objects[:0]
	for _, o := range l.Objects {
		switch o.(type) {
		case *tc.Qdisc, *bpf.Hook:
			key := o.Key()
			if seen[key] {
				continue
			}
			seen[key] = true
		}
		out = append(out, o)
	}
	l.Objects = out
	return l, nil
}

// readTree reads the tree on r's device and returns the device's qdiscs
// (nil when the device is missing), which readBPF reads on.
func (k *Kernel) readTree(l *Live, r treeRef, force bool) ([]*tc.Qdisc, error) {
	if r.ifb {
		link := k.conn.GetLink(r.dev)
		if link == nil {
			return nil, nil
		}
		if link.Kind != "ifb" {
			return nil, fmt.Errorf("device %s exists and is a %s, not an ifb; set ingress.ifb to another name", r.dev, link.Kind)
		}
		link.Kind = "ifb"
		l.Objects = append(l.Objects, link)
		if r.rec == nil || !r.rec.IfbCreated {
			l.Opt.Shared[link.Key()] = true
			l.Adopted[r.dev] = true
		}
	} else if !k.conn.LinkExists(r.dev) {
		return nil, nil
	}
	qs, err := k.conn.Qdiscs(r.dev)
	if err != nil {
		return nil, err
	}
	var root *tc.Qdisc
	for _, q := range qs {
		if q.Parent == tc.HandleRoot && q.Handle != 0 {
			root = q
		}
	}
	if root == nil {
		return qs, nil // the kernel's default qdisc: nothing of ours
	}
	owned := r.rec != nil && r.rec.Root == root.Handle.String() && tagged(qs, root, r.rec.R2Q())
	if !owned {
		switch {
		case !r.planned:
			return qs, nil // a stale record: the tree is gone, someone else's now
		case !force:
			return nil, &ForeignRootError{Dev: r.dev, Kind: root.Kind, At: root.Handle}
		}
		l.Objects = append(l.Objects, root)
		l.Opt.Replace[root.Key()] = true
		return qs, nil
	}
	l.Objects = append(l.Objects, root)
	var blocks []tc.Handle
	isClass := map[tc.Handle]bool{}
	for _, h := range TreeQdiscs(qs) {
		if h != root {
			l.Objects = append(l.Objects, h) // a shard, or an EDT tree's fq
		}
		if h.Kind != "htb" {
			continue
		}
		classes, err := k.conn.Classes(r.dev, h.Handle)
		if err != nil {
			return nil, err
		}
		blocks = append(blocks, h.Handle)
		for _, c := range classes {
			l.Objects = append(l.Objects, c)
			isClass[c.Handle] = true
			if c.Level > 0 {
				blocks = append(blocks, c.Handle)
			}
		}
	}
	for _, q := range qs {
		// Leaves sluice made; HTB's own default pfifos have automatic
		// handles (majors from 0x8000) and count as "no leaf".
		if isClass[q.Parent] && q.Handle.Major() < 0x8000 {
			l.Objects = append(l.Objects, q)
		}
	}
	for _, b := range blocks {
		fs, err := k.conn.Filters(r.dev, b)
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			l.Objects = append(l.Objects, f)
		}
	}
	return qs, nil
}

// TreeQdiscs returns the qdiscs that carry a tree in a device's qdiscs
// qs: the root, or, under mq or mqprio, the qdisc on each queue (an
// HTB shard, or an EDT tree's fq).
func TreeQdiscs(qs []*tc.Qdisc) []*tc.Qdisc {
	var root *tc.Qdisc
	for _, q := range qs {
		if q.Parent == tc.HandleRoot && q.Handle != 0 {
			root = q
		}
	}
	switch {
	case root == nil:
		return nil
	case root.Kind != "mq" && root.Kind != "mqprio":
		return []*tc.Qdisc{root}
	}
	var out []*tc.Qdisc
	for _, q := range qs {
		if (q.Kind == "htb" || q.Kind == "fq") && q.Parent != tc.HandleRoot && q.Parent.Major() == root.Handle.Major() {
			out = append(out, q)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Parent < out[j].Parent })
	return out
}

// tagged reports whether root (of a device whose qdiscs are qs) is the
// root of a tree that carries tag: an HTB with it (in r2q), an fq with
// it (EDT, in orphan_mask), or an mq or mqprio whose every queue's
// qdisc carries it. Anything else, whatever its handle, was made by
// someone else.
func tagged(qs []*tc.Qdisc, root *tc.Qdisc, tag uint32) bool {
	switch root.Kind {
	case "htb", "fq":
		return carriesTag(root, tag)
	case "mq", "mqprio":
		shards := TreeQdiscs(qs)
		for _, q := range shards {
			if !carriesTag(q, tag) {
				return false
			}
		}
		return len(shards) > 0
	}
	return false
}

// carriesTag reports whether q is a tree qdisc carrying tag.
func carriesTag(q *tc.Qdisc, tag uint32) bool {
	switch q.Kind {
	case "htb":
		return q.HTB != nil && q.HTB.R2Q == tag
	case "fq":
		return q.Fq != nil && q.Fq.OrphanMask == plan.FqTag(tag)
	}
	return false
}

// clsactOwned reports whether a record says sluice created the clsact
// qdisc on dev: as the ingress hook of an ifb tree, for a BPF
// classifier, or for a policer. Ownership belongs to the qdisc, not to
// one record: two trees may use one clsact.
func (k *Kernel) clsactOwned(dev string) bool {
	for name, r := range k.recs.Devices {
		if r.HookCreated && r.Interface == dev || r.ClsactCreated && r.Device(name) == dev {
			return true
		}
	}
	return false
}

func (k *Kernel) readHook(l *Live, r treeRef, force bool) error {
	if !k.conn.LinkExists(r.iface) {
		return nil
	}
	qs, err := k.conn.Qdiscs(r.iface)
	if err != nil {
		return err
	}
	var hook *tc.Qdisc
	for _, q := range qs {
		if q.Parent == tc.HandleIngress {
			hook = q
		}
	}
	if hook == nil {
		return nil
	}
	l.Objects = append(l.Objects, hook)
	if !k.clsactOwned(r.iface) {
		l.Opt.Shared[hook.Key()] = true
		l.HookShared[r.iface] = true
	}
	fs, err := k.conn.Filters(r.iface, tc.HandleIngressHook)
	if err != nil {
		return err
	}
	k.foreignFirst(l, r, hook, fs, force)
	// sluice's redirect is node 1 of the u32 instance at HookPrio (or,
	// left by an earlier sluice, at LegacyHookPrio), pointing at this
	// tree's ifb. Another tool's filter at the same prio shares the
	// instance: it is left alone, and so is the instance, which
	// deleting would take the other filter with it.
	for _, prio := range []uint16{plan.HookPrio, plan.LegacyHookPrio} {
		var mine []*tc.Filter
		var tp *tc.Filter
		foreign := false
		for _, f := range fs {
			switch {
			case f.Prio != prio:
			case f.IsTP():
				tp = f
			case f.Kind == "u32" && f.U32 != nil && f.Handle == 1 && f.U32.RedirectDev == r.dev:
				mine = append(mine, f)
			default:
				foreign = true
			}
		}
		if tp == nil || len(mine) == 0 && prio == plan.LegacyHookPrio {
			continue // nothing, or someone else's at tc's default prio
		}
		if len(mine) == 0 && foreign && (tp.Kind != "u32" || tp.Proto != tc.ProtoAll) {
			return fmt.Errorf("%s: the ingress hook's prio %d holds another tool's %s filter; sluice puts its redirect to %s there (move that filter to another prio)", r.iface, prio, tp.Kind, r.dev)
		}
		l.Objects = append(l.Objects, tp)
		if foreign {
			l.Opt.Shared[tp.Key()] = true
		}
		for _, f := range mine {
			l.Objects = append(l.Objects, f)
		}
	}
	return nil
}

// readBPF reads sluice's classifier on a hook of dev (and the clsact
// qdisc carrying it, shared unless the record says sluice created it).
func (k *Kernel) readBPF(l *Live, dev string, qs []*tc.Qdisc, ingress bool) error {
	var hook *tc.Qdisc
	for _, q := range qs {
		if q.Parent == tc.HandleIngress && q.Kind == "clsact" {
			hook = q
		}
	}
	if hook == nil {
		return nil
	}
	parent := tc.HandleEgressHook
	if ingress {
		parent = tc.HandleIngressHook
	}
	fs, err := k.conn.Filters(dev, parent)
	if err != nil {
		return err
	}
	found := ourFilter(fs)
	// An existing clsact serves the plan whoever made it; only one
	// sluice made may go when no tree needs it.
	l.Objects = append(l.Objects, hook)
	if !k.clsactOwned(dev) {
		l.Opt.Shared[hook.Key()] = true
	}
	if found == nil {
		return nil
	}
	h, err := readHookProgram(dev, ingress, found)
	if err != nil {
		return err
	}
	l.Objects = append(l.Objects, h)
	return nil
}

// readEcho reads the hook that ends the round trips of r's tree when it
// does nothing else (plan's rttEchoes: an egress tree's on its
// interface's ingress, an ingress tree's on the interface's egress): a
// hook that also classifies or polices is another tree's, read with it.
//
// devQdiscs are r's device's qdiscs (readTree's): for an egress tree the
// interface's own, read once.
func (k *Kernel) readEcho(l *Live, r treeRef, devQdiscs []*tc.Qdisc) error {
	qs := devQdiscs
	if r.ifb {
		if !k.conn.LinkExists(r.iface) {
			return nil
		}
		var err error
		if qs, err = k.conn.Qdiscs(r.iface); err != nil {
			return err
		}
	}
	if !slices.ContainsFunc(qs, func(q *tc.Qdisc) bool { return q.Parent == tc.HandleIngress && q.Kind == "clsact" }) {
		return nil // no hook at all: nothing to dump
	}
	ingress := !r.ifb
	parent := tc.HandleEgressHook
	if ingress {
		parent = tc.HandleIngressHook
	}
	fs, err := k.conn.Filters(r.iface, parent)
	if err != nil {
		return err
	}
	f := ourFilter(fs)
	if f == nil || !strings.HasSuffix(f.BPF.Name, bpf.Version) {
		return nil
	}
	prog, err := bpf.Open(f.BPF.ID)
	if err != nil {
		return nil
	}
	// Its settings alone: a classifier of 10,000 hosts is not read
	// through on every pass to learn that it is not an echo.
	m, err := prog.RTTMode()
	prog.Close()
	if err != nil || m == nil || !m.Echo || !m.Observe || m.Record {
		return nil
	}
	return k.readBPF(l, r.iface, qs, ingress)
}

func readHookProgram(dev string, ingress bool, f *tc.Filter) (*bpf.Hook, error) {
	h := &bpf.Hook{Dev: dev, Ingress: ingress, Prio: f.Prio, ProgID: f.BPF.ID,
		Version: strings.TrimPrefix(f.BPF.Name, bpf.NamePrefix)}
	prog, err := bpf.Open(f.BPF.ID)
	if err == nil {
		defer prog.Close()
		h.Capacity, h.HistCap, h.FlowCap = prog.CounterCap, prog.HistCap, prog.FlowCap
		h.Content, err = prog.Read()
	}
	if err != nil && h.Version != bpf.Version {
		// An earlier sluice's program (after an upgrade): its maps may
		// be laid out otherwise, and the diff replaces it (another
		// version) whatever they hold.
		h.Content = &bpf.Content{}
		return h, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dev, err)
	}
	return h, nil
}

// ForeignFilter is another tool's filter instance (one prio) on an
// interface's ingress hook, ahead of sluice's redirect.
type ForeignFilter struct {
	Iface string
	Prio  uint16
	Kind  string
	// What it does, in tc's words ("redirect to ifb0", "police").
	What string
	// Redirect: it sends packets to another device (an older ingress
	// shaper): what sluice's ingress tree replaces.
	Redirect bool
	// Removed: force put it in the objects to delete.
	Removed bool
}

// ForeignNote starts the note of another tool's filter that force
// deletes.
const ForeignNote = "another tool's "

func (f ForeignFilter) String() string {
	s := fmt.Sprintf(ForeignNote+"%s filter at ingress prio %d", f.Kind, f.Prio)
	if f.What != "" {
		s += " (" + f.What + ")"
	}
	return s
}

// foreignFirst records the filters of other tools on r's ingress hook
// at a prio before sluice's; with force, those that redirect to
// another device are taken over (deleted, their whole instance).
func (k *Kernel) foreignFirst(l *Live, r treeRef, hook *tc.Qdisc, fs []*tc.Filter, force bool) {
	byPrio := map[uint16][]*tc.Filter{}
	var prios []uint16
	for _, f := range fs {
		if f.Prio >= plan.HookPrio {
			continue // sluice's, or evaluated after it
		}
		if byPrio[f.Prio] == nil {
			prios = append(prios, f.Prio)
		}
		byPrio[f.Prio] = append(byPrio[f.Prio], f)
	}
	sort.Slice(prios, func(i, j int) bool { return prios[i] < prios[j] })
	for _, prio := range prios {
		ff := ForeignFilter{Iface: r.iface, Prio: prio}
		var tp *tc.Filter
		var what []string
		seen := map[string]bool{}
		add := func(s string) {
			if s != "" && !seen[s] {
				seen[s] = true
				what = append(what, s)
			}
		}
		mine, theirs, restorable := false, false, true
		var nodes []*tc.Filter
		for _, f := range byPrio[prio] {
			if f.IsTP() {
				tp = f
				continue
			}
			if f.U32 != nil && f.U32.RedirectDev == r.dev {
				mine = true // sluice's redirect where it used to put it
				continue
			}
			if f.U32 != nil && f.U32.Divisor > 0 {
				// u32's hash tables: its root (800:) comes with the
				// instance; one of the tool's own is not put back.
				if f.Handle != 0x80000000 {
					restorable = false
				}
				continue
			}
			theirs = true
			ff.Kind = f.Kind
			nodes = append(nodes, f)
			// What sluice deletes it must be able to put back should
			// the apply fail: u32 nodes whose only action is mirred.
			if f.U32 == nil || strings.HasPrefix(f.U32.RedirectDev, "?") {
				restorable = false
			}
			for _, a := range nodeActions(f) {
				if a != "mirred" {
					restorable = false
				}
			}
			switch {
			case f.U32 != nil:
				if d := f.U32.RedirectDev; d != "" && d[0] != '?' {
					ff.Redirect = true
					add("redirect to " + d)
				}
				for _, a := range f.U32.Actions {
					if a != "mirred" {
						add(a)
					}
				}
				if f.U32.ClassID != 0 && f.U32.Divisor == 0 {
					add("classid " + f.U32.ClassID.String())
				}
			case f.Matchall != nil && f.Matchall.Actions, f.FW != nil && f.FW.Actions:
				add("actions")
			case f.BPF != nil:
				add("bpf " + f.BPF.Name)
			}
		}
		if !theirs {
			continue
		}
		if ff.Kind == "" && tp != nil {
			ff.Kind = tp.Kind
		}
		ff.What = strings.Join(what, ", ")
		if force && ff.Redirect && restorable && tp != nil && !mine {
			ff.Removed = true
			t := *tp
			t.Note = ff.String()
			// On an ingress qdisc (not clsact) the tool wrote parent
			// ffff:, as it is put back should the apply fail.
			if hook.Kind == "ingress" {
				t.Parent = tc.MakeHandle(0xffff, 0)
			}
			l.Objects = append(l.Objects, &t)
			for _, n := range nodes {
				m := *n
				m.Parent = t.Parent
				m.Note = t.Note
				l.Objects = append(l.Objects, &m)
			}
		}
		l.Foreign = append(l.Foreign, ff)
	}
}

func nodeActions(f *tc.Filter) []string {
	if f.U32 != nil {
		return f.U32.Actions
	}
	return nil
}
