package kernel

import (
	"fmt"
	"reflect"
	"sort"

	"sluice/tc"
)

// Change is one planned step: an operation and, for rollback, the live
// objects it removes without naming them (a class's leaf qdisc, a hash
// table's nodes, everything under a root qdisc).
type Change struct {
	tc.Op
	// Old is the live object a Change or Delete acts on.
	Old tc.Object
	// Implied are live objects the kernel deletes along with Old.
	Implied []tc.Object
	// Reason explains a replacement ("HTB cannot change ...").
	Reason string
}

// Diff is the ordered difference between live and desired state.
type Diff struct {
	Changes []Change
}

// Empty reports whether nothing needs to change.
func (d *Diff) Empty() bool { return len(d.Changes) == 0 }

// Ops returns the operations in order.
func (d *Diff) Ops() []tc.Op {
	out := make([]tc.Op, 0, len(d.Changes))
	for _, c := range d.Changes {
		out = append(out, c.Op)
	}
	return out
}

type status int

const (
	keep status = iota
	add
	del
	change
	replace
)

// graph indexes a set of objects by key and knows how they depend on
// each other.
type graph struct {
	objs   map[string]tc.Object
	order  []string
	devs   map[string]int // device -> order of first appearance
	depth  map[string]int // class depth; table depth (1 = linked from a root-table node)
	parent map[string]bool
	qdiscs map[string]string // dev and handle -> key (keys go by parent)
}

func handleKey(dev string, h tc.Handle) string { return dev + "/" + h.String() }

func newGraph(objs []tc.Object) *graph {
	g := &graph{objs: map[string]tc.Object{}, depth: map[string]int{}, parent: map[string]bool{}, devs: map[string]int{},
		qdiscs: map[string]string{}}
	for _, o := range objs {
		if q, ok := o.(*tc.Qdisc); ok {
			g.qdiscs[handleKey(q.Dev, q.Handle)] = q.Key()
		}
		if _, ok := g.devs[o.Device()]; !ok {
			g.devs[o.Device()] = len(g.devs)
		}
		k := o.Key()
		if _, dup := g.objs[k]; !dup {
			g.order = append(g.order, k)
		}
		g.objs[k] = o
	}
	for _, o := range objs {
		if c, ok := o.(*tc.Class); ok {
			g.parent[classKey(c.Dev, c.Parent)] = true
		}
	}
	var classDepth func(c *tc.Class, n int) int
	classDepth = func(c *tc.Class, n int) int {
		p, ok := g.objs[classKey(c.Dev, c.Parent)].(*tc.Class)
		if !ok || n > 16 {
			return 0
		}
		return 1 + classDepth(p, n+1)
	}
	for _, o := range objs {
		if c, ok := o.(*tc.Class); ok {
			g.depth[o.Key()] = classDepth(c, 0)
		}
	}
	// Table depth: follow links from root-table nodes down.
	for changed := true; changed; {
		changed = false
		for _, o := range objs {
			f, ok := o.(*tc.Filter)
			if !ok || f.U32 == nil || f.U32.Link == 0 {
				continue
			}
			from := 0
			if t := tc.U32HTID(f.Handle); t != 0 {
				from = g.depth[tableKey(f, t)]
				if from == 0 {
					continue // its own table not placed yet
				}
			}
			tk := tableKey(f, f.U32.Link)
			if g.depth[tk] < from+1 {
				g.depth[tk] = from + 1
				changed = true
			}
		}
	}
	return g
}

func classKey(dev string, h tc.Handle) string { return (&tc.Class{Dev: dev, Handle: h}).Key() }
func qdiscKey(dev string, parent tc.Handle) string {
	return (&tc.Qdisc{Dev: dev, Parent: parent}).Key()
}
func tableKey(f *tc.Filter, htid uint32) string {
	return (&tc.Filter{Dev: f.Dev, Parent: f.Parent, Prio: f.Prio, Handle: htid & 0xFFF00000}).Key()
}
func tpKey(f *tc.Filter) string {
	return (&tc.Filter{Dev: f.Dev, Parent: f.Parent, Prio: f.Prio}).Key()
}

// rank orders objects for creation; deletion goes in reverse. Layers
// come first (links, root qdiscs, classes by depth, leaves, filters,
// ingress hooks), so that whatever an object refers to exists before
// it; within a layer, objects are grouped by device and filter block.
func (g *graph) rank(o tc.Object) []int {
	dev := g.devs[o.Device()]
	if k := kindOf(o); k != nil {
		return k.rank(g, o, dev)
	}
	return []int{9}
}

func lessRank(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// containers are the objects whose deletion makes the kernel delete o.
func containers(o tc.Object, g *graph) []string {
	if k := kindOf(o); k != nil {
		return k.containers(g, o)
	}
	return nil
}

// needs are the objects o must be deleted before and re-created after.
func needs(o tc.Object) []string {
	if k := kindOf(o); k != nil {
		return k.needs(o)
	}
	return nil
}

// Options adjust a diff.
type Options struct {
	// Replace names live objects to replace even if they look right (a
	// root qdisc sluice did not create, taken over with --force).
	Replace map[string]bool
	// Shared names live objects sluice uses but did not create (an
	// existing clsact): they satisfy the plan but are never deleted.
	Shared map[string]bool
}

// Compute diffs live against desired.
func Compute(live, desired []tc.Object, opt Options) *Diff {
	L, D := newGraph(live), newGraph(desired)
	st := map[string]status{}
	reason := map[string]string{}
	for _, k := range D.order {
		lo, inLive := L.objs[k]
		switch {
		case !inLive:
			st[k] = add
		case opt.Replace[k]:
			st[k] = replace
			reason[k] = "not created by sluice (--force)"
		default:
			eq, canChange, why := compare(lo, D.objs[k], D)
			switch {
			case eq:
				st[k] = keep
			case canChange:
				st[k] = change
			default:
				st[k] = replace
				reason[k] = why
			}
		}
	}
	for _, k := range L.order {
		if _, ok := D.objs[k]; !ok && !opt.Shared[k] {
			st[k] = del
		}
	}
	// Propagate: whatever needs or lives inside a removed object goes too.
	gone := func(k string) bool { s, ok := st[k]; return ok && (s == del || s == replace) }
	for changed := true; changed; {
		changed = false
		for _, k := range L.order {
			if gone(k) || opt.Shared[k] {
				continue
			}
			o := L.objs[k]
			for _, dep := range append(containers(o, L), needs(o)...) {
				if _, live := L.objs[dep]; live && gone(dep) {
					if _, want := D.objs[k]; want {
						st[k] = replace
						reason[k] = "follows " + dep
					} else {
						st[k] = del
					}
					changed = true
					break
				}
			}
		}
	}
	// Deletions, last-created first; objects inside a deleted container
	// go with it.
	var dels []string
	for _, k := range L.order {
		if gone(k) {
			dels = append(dels, k)
		}
	}
	sort.SliceStable(dels, func(i, j int) bool { return lessRank(L.rank(L.objs[dels[j]]), L.rank(L.objs[dels[i]])) })
	var implied map[string]string // key -> the container deleted explicitly
	implied = map[string]string{}
	var containerOf func(k string, n int) string
	containerOf = func(k string, n int) string {
		if n > 32 {
			return ""
		}
		for _, c := range containers(L.objs[k], L) {
			if _, live := L.objs[c]; live && gone(c) {
				if top := containerOf(c, n+1); top != "" {
					return top
				}
				return c
			}
		}
		return ""
	}
	d := &Diff{}
	idx := map[string]int{}
	for _, k := range dels {
		if c := containerOf(k, 0); c != "" {
			implied[k] = c
		}
	}
	for _, k := range dels {
		if _, imp := implied[k]; imp {
			continue
		}
		o := L.objs[k]
		idx[k] = len(d.Changes)
		d.Changes = append(d.Changes, Change{Op: tc.Op{Verb: tc.Delete, Obj: o}, Old: o, Reason: reason[k]})
	}
	// Record implied objects (in creation order) for rollback.
	for _, k := range L.order {
		if c, ok := implied[k]; ok {
			i := idx[c]
			d.Changes[i].Implied = append(d.Changes[i].Implied, L.objs[k])
		}
	}
	for i := range d.Changes {
		sort.SliceStable(d.Changes[i].Implied, func(a, b int) bool {
			return lessRank(L.rank(d.Changes[i].Implied[a]), L.rank(d.Changes[i].Implied[b]))
		})
	}
	// Creations and in-place changes, first-created first.
	var adds []string
	for _, k := range D.order {
		if s := st[k]; s == add || s == replace || s == change {
			adds = append(adds, k)
		}
	}
	sort.SliceStable(adds, func(i, j int) bool { return lessRank(D.rank(D.objs[adds[i]]), D.rank(D.objs[adds[j]])) })
	for _, k := range adds {
		c := Change{Op: tc.Op{Verb: tc.Add, Obj: D.objs[k]}, Reason: reason[k]}
		if st[k] == change {
			c.Verb, c.Old = tc.Change, L.objs[k]
		}
		d.Changes = append(d.Changes, c)
	}
	return d
}

// compare says whether live already is desired, and if not, whether the
// kernel can change it in place.
func compare(live, want tc.Object, D *graph) (equal, changeable bool, why string) {
	if k := kindOf(want); k != nil {
		return k.compare(live, want, D)
	}
	return false, false, "unknown object"
}

func qdiscOptionsEqual(l, w *tc.Qdisc) bool {
	switch {
	case w.HTB != nil:
		return l.HTB != nil && *l.HTB == *w.HTB
	case w.Fifo != nil:
		return w.Fifo.Limit == 0 || l.Fifo != nil && l.Fifo.Limit == w.Fifo.Limit
	case w.FqCodel != nil:
		return l.FqCodel != nil && (w.FqCodel.Limit == 0 || l.FqCodel.Limit == w.FqCodel.Limit) &&
			(w.FqCodel.Flows == 0 || l.FqCodel.Flows == w.FqCodel.Flows) &&
			codelTimeEqual(l.FqCodel.Target, w.FqCodel.Target) && codelTimeEqual(l.FqCodel.Interval, w.FqCodel.Interval)
	case w.Sfq != nil:
		return l.Sfq != nil && (w.Sfq.Limit == 0 || l.Sfq.Limit == w.Sfq.Limit) &&
			(w.Sfq.Perturb == 0 || l.Sfq.Perturb == w.Sfq.Perturb)
	case w.Fq != nil:
		return l.Fq != nil && (w.Fq.Limit == 0 || l.Fq.Limit == w.Fq.Limit) &&
			(w.Fq.FlowLimit == 0 || l.Fq.FlowLimit == w.Fq.FlowLimit) &&
			(w.Fq.OrphanMask == 0 || l.Fq.OrphanMask == w.Fq.OrphanMask)
	case w.MQPrio != nil:
		return l.MQPrio != nil && *l.MQPrio == *w.MQPrio
	case w.Cake != nil:
		return l.Cake != nil && *l.Cake == *w.Cake
	}
	return true
}

// codelTimeEqual compares a codel time as the kernel says it (live)
// with the one sluice sent (want; 0: the qdisc's default, any).
func codelTimeEqual(live, want uint32) bool {
	return want == 0 || tc.SameCodelTime(live, want)
}

func filterEqual(l, w *tc.U32) bool {
	if l == nil || w == nil {
		return l == w
	}
	if l.Divisor != w.Divisor || l.ClassID != w.ClassID || l.Link != w.Link || l.RedirectDev != w.RedirectDev ||
		!reflect.DeepEqual(l.Mark, w.Mark) {
		return false
	}
	if w.Divisor > 0 {
		return true
	}
	ls, ws := *l.Sel, *w.Sel
	ls.Flags &^= tc.SelTerminal
	ws.Flags &^= tc.SelTerminal
	if len(ls.Keys) == 0 && len(ws.Keys) == 0 {
		ls.Keys, ws.Keys = nil, nil
	}
	return reflect.DeepEqual(ls, ws)
}

// ID names a change by what it does and to what, both objects
// fingerprinted: the desired one and, for a change or delete, the live
// one it acts on. A saved plan (engine.SavedPlan) is still good when the
// kernel needs the very changes of the same IDs.
//
// A root HTB's r2q is left out: it carries the tag a device's first
// apply draws at random (plan.Alloc.Tag), which a plan and the apply
// that follows it draw apart.
func (c Change) ID() string {
	id := fmt.Sprintf("%s %s %016x", c.Verb, c.Obj.Key(), untagged(c.Obj))
	if c.Old != nil {
		id += fmt.Sprintf(" from %016x", untagged(c.Old))
	}
	return id
}

func untagged(o tc.Object) uint64 {
	if q, ok := o.(*tc.Qdisc); ok && q.HTB != nil {
		c, h := *q, *q.HTB
		h.R2Q, c.HTB = 0, &h
		o = &c
	}
	return fingerprintOf(o)
}
