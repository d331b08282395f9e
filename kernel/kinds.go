package kernel

import (
	"fmt"

	"sluice/bpf"
	"sluice/tc"
)

// kind is what the kernel layer knows about one kind of tc object, in
// one place: where it goes in the order of creation (rank: deletion goes
// in reverse), what the kernel deletes it with (containers), what it
// refers to and so must outlive (needs), whether a live object already is
// the desired one and whether the kernel can change it in place
// (compare), what of it the records fingerprint (hash), whether its write
// may wait in a batched send (holdable), and how it is written (do). A
// new kind of object is a new implementation here, not a case added to
// switches in the diff, the records and the executor.
type kind interface {
	rank(g *graph, o tc.Object, dev int) []int
	containers(g *graph, o tc.Object) []string
	needs(o tc.Object) []string
	compare(live, want tc.Object, g *graph) (equal, changeable bool, why string)
	hash(h *fingerprint, o tc.Object)
	holdable() bool
	do(k *Kernel, op tc.Op) error
}

// kindOf returns o's kind, nil for an object the kernel layer does not
// know.
func kindOf(o tc.Object) kind {
	switch o.(type) {
	case *tc.Link:
		return linkKind{}
	case *tc.Qdisc:
		return qdiscKind{}
	case *tc.Class:
		return classKind{}
	case *tc.Filter:
		return filterKind{}
	case *bpf.Hook:
		return hookKind{}
	case *HostSwap:
		return hostSwapKind{}
	}
	return nil
}

// linkKind is a network device sluice may create (an ifb).
type linkKind struct{}

func (linkKind) rank(g *graph, o tc.Object, dev int) []int {
	return []int{0, dev}
}

func (linkKind) containers(g *graph, o tc.Object) []string {
	return nil
}

func (linkKind) needs(o tc.Object) []string {
	return nil
}

func (linkKind) compare(live, want tc.Object, D *graph) (equal, changeable bool, why string) {
	w := want.(*tc.Link)
	l := live.(*tc.Link)
	if l.Kind != w.Kind {
		return false, false, fmt.Sprintf("is a %s device, not %s", l.Kind, w.Kind)
	}
	if w.TxQueues > 0 && l.TxQueues != w.TxQueues {
		return false, false, fmt.Sprintf("has %d transmit queues, not %d", l.TxQueues, w.TxQueues)
	}
	return !w.Up || l.Up, true, ""
}

func (linkKind) hash(h *fingerprint, o tc.Object) {
	x := o.(*tc.Link)
	h.u64(1)
	h.str(x.Name)
	h.str(x.Kind)
	h.u64(uint64(x.MTU))
	h.u64(uint64(x.TxQueues))
	h.flag(x.Up)
}

func (linkKind) holdable() bool { return false }

func (linkKind) do(k *Kernel, op tc.Op) error {
	o := op.Obj.(*tc.Link)
	c := k.conn
	switch op.Verb {
	case tc.Add:
		return c.LinkAdd(o)
	case tc.Change:
		return c.LinkUp(o.Name)
	}
	return c.LinkDel(o.Name)
}

// qdiscKind is a qdisc: a root, an HTB shard under mq, a leaf, or the ingress hook qdisc.
type qdiscKind struct{}

func (qdiscKind) rank(g *graph, o tc.Object, dev int) []int {
	x := o.(*tc.Qdisc)
	switch x.Parent {
	case tc.HandleRoot:
		return []int{1, dev}
	case tc.HandleIngress:
		return []int{5, dev}
	}
	if x.Kind == "htb" { // a shard of a tree under mq
		return []int{1, dev, 1, int(x.Parent)}
	}
	return []int{3, dev, int(x.Parent)}
}

func (qdiscKind) containers(g *graph, o tc.Object) []string {
	x := o.(*tc.Qdisc)
	switch x.Parent {
	case tc.HandleRoot:
		return []string{(&tc.Link{Name: x.Dev}).Key()}
	case tc.HandleIngress:
		return nil
	}
	return []string{classKey(x.Dev, x.Parent), qdiscKey(x.Dev, tc.HandleRoot)}
}

func (qdiscKind) needs(o tc.Object) []string {
	return nil
}

func (qdiscKind) compare(live, want tc.Object, D *graph) (equal, changeable bool, why string) {
	w := want.(*tc.Qdisc)
	l := live.(*tc.Qdisc)
	if w.Parent == tc.HandleIngress && (l.Kind == "clsact" || l.Kind == "ingress") {
		return true, false, "" // any ingress hook will do, and is shared
	}
	if l.Kind != w.Kind || l.Handle != w.Handle {
		return false, false, fmt.Sprintf("%s %s becomes %s %s", l.Kind, l.Handle, w.Kind, w.Handle)
	}
	sameStab := stabEqual(l.Stab, w.Stab)
	if qdiscOptionsEqual(l, w) {
		if !sameStab {
			return false, true, "size table"
		}
		return true, false, ""
	}
	if w.Kind == "htb" {
		if l.HTB != nil && w.HTB != nil && l.HTB.Default == w.HTB.Default {
			return false, false, "HTB cannot change its r2q in place"
		}
		return false, false, "HTB cannot change its default class in place"
	}
	if w.Kind == "mqprio" {
		return false, false, "mqprio cannot change its queue mapping in place"
	}
	if w.FqCodel != nil && w.FqCodel.Flows != 0 && (l.FqCodel == nil || l.FqCodel.Flows != w.FqCodel.Flows) {
		return false, false, "fq_codel cannot change its flows in place"
	}
	return false, true, ""
}

// stabEqual compares size tables as the kernel keeps them: what tc
// derives from overhead, link layer and mpu.
func stabEqual(l, w *tc.Stab) bool {
	if l == nil || w == nil {
		return l == w
	}
	return *l == *w
}

func (qdiscKind) hash(h *fingerprint, o tc.Object) {
	x := o.(*tc.Qdisc)
	h.u64(2)
	h.str(x.Dev)
	h.u64(uint64(x.Parent))
	h.u64(uint64(x.Handle))
	h.str(x.Kind)
	h.str(x.Owner)
	if present(h, x.Stab) {
		h.u64(uint64(uint32(x.Stab.Overhead)))
		h.u64(uint64(x.Stab.Linklayer))
		h.u64(uint64(x.Stab.MPU))
	}
	if present(h, x.Tbf) {
		h.u64(uint64(x.Tbf.Rate))
		h.u64(uint64(x.Tbf.Burst)<<32 | uint64(x.Tbf.Limit))
	}
	if present(h, x.HTB) {
		h.u64(uint64(x.HTB.Default))
		h.u64(uint64(x.HTB.R2Q))
	}
	if present(h, x.Fifo) {
		h.u64(uint64(x.Fifo.Limit))
	}
	if present(h, x.FqCodel) {
		h.u64(uint64(x.FqCodel.Limit))
		h.u64(uint64(x.FqCodel.Flows))
		h.u64(uint64(x.FqCodel.Target))
		h.u64(uint64(x.FqCodel.Interval))
	}
	if present(h, x.Sfq) {
		h.u64(uint64(x.Sfq.Limit))
		h.u64(uint64(x.Sfq.Perturb))
	}
	if present(h, x.Fq) {
		h.u64(uint64(x.Fq.Limit))
		h.u64(uint64(x.Fq.FlowLimit))
		h.u64(uint64(x.Fq.OrphanMask))
	}
	if present(h, x.MQPrio) {
		m := x.MQPrio
		h.u64(uint64(m.NumTC))
		for i := range m.Map {
			h.u64(uint64(m.Map[i])<<32 | uint64(m.Count[i])<<16 | uint64(m.Offset[i]))
		}
	}
	if present(h, x.Cake) {
		h.flag(x.Cake.SplitGSO)
		h.u64(uint64(x.Cake.RTT))
		h.u64(uint64(x.Cake.Target))
	}
}

func (qdiscKind) holdable() bool { return true }

func (qdiscKind) do(k *Kernel, op tc.Op) error {
	o := op.Obj.(*tc.Qdisc)
	c := k.conn
	switch op.Verb {
	case tc.Add:
		return c.QdiscAdd(o, o.Parent != tc.HandleRoot && o.Parent != tc.HandleIngress || op.Force)
	case tc.Change:
		return c.QdiscChange(o)
	}
	return c.QdiscDel(o)
}

// classKind is an HTB class.
type classKind struct{}

func (classKind) rank(g *graph, o tc.Object, dev int) []int {
	x := o.(*tc.Class)
	return []int{2, dev, g.depth[x.Key()], int(x.Handle)}
}

func (classKind) containers(g *graph, o tc.Object) []string {
	x := o.(*tc.Class)
	if q, ok := g.qdiscs[handleKey(x.Dev, tc.MakeHandle(x.Handle.Major(), 0))]; ok && q != qdiscKey(x.Dev, tc.HandleRoot) {
		return []string{q, qdiscKey(x.Dev, tc.HandleRoot)} // a shard's class
	}
	return []string{qdiscKey(x.Dev, tc.HandleRoot)}
}

func (classKind) needs(o tc.Object) []string {
	x := o.(*tc.Class)
	if x.Parent.Minor() != 0 {
		return []string{classKey(x.Dev, x.Parent)}
	}
	return nil
}

func (classKind) compare(live, want tc.Object, D *graph) (equal, changeable bool, why string) {
	w := want.(*tc.Class)
	l := live.(*tc.Class)
	if l.Parent != w.Parent {
		return false, false, fmt.Sprintf("moves from parent %s to %s", l.Parent, w.Parent)
	}
	eq := l.Rate == w.Rate && l.Ceil == w.Ceil &&
		l.BufferTicks == tc.XmitTicks(w.Rate, w.Burst) && l.CbufferTicks == tc.XmitTicks(w.Ceil, w.Cburst)
	if !D.parent[w.Key()] { // HTB applies prio and quantum to leaves only
		eq = eq && l.Prio == w.Prio && l.Quantum == w.Quantum
	}
	return eq, true, ""
}

func (classKind) hash(h *fingerprint, o tc.Object) {
	x := o.(*tc.Class)
	h.u64(3)
	h.str(x.Dev)
	h.u64(uint64(x.Parent))
	h.u64(uint64(x.Handle))
	h.str(x.Kind)
	h.u64(uint64(x.Rate))
	h.u64(uint64(x.Ceil))
	h.u64(uint64(x.Burst))
	h.u64(uint64(x.Cburst))
	h.u64(uint64(x.Prio))
	h.u64(uint64(x.Quantum))
	h.str(x.Name)
	if x.Controlled {
		h.u64(1)
	}
}

func (classKind) holdable() bool { return true }

func (classKind) do(k *Kernel, op tc.Op) error {
	o := op.Obj.(*tc.Class)
	c := k.conn
	switch op.Verb {
	case tc.Add:
		return c.ClassAdd(o)
	case tc.Change:
		return c.ClassChange(o)
	}
	return c.ClassDel(o)
}

// filterKind is a filter: u32 node, hash table or tcf_proto head, or a BPF filter.
type filterKind struct{}

func (filterKind) rank(g *graph, o tc.Object, dev int) []int {
	x := o.(*tc.Filter)
	layer := 4
	if x.Parent == tc.HandleIngressHook || x.Parent == tc.HandleEgressHook {
		layer = 6
	}
	head := []int{layer, dev, int(x.Parent), int(x.Prio)}
	switch {
	case x.IsTP():
		return append(head, 0)
	case x.IsTable():
		return append(head, 1, -g.depth[x.Key()])
	}
	td := 0
	if t := tc.U32HTID(x.Handle); t != 0 {
		td = g.depth[tableKey(x, t)]
	}
	return append(head, 2, -td, int(x.Handle))
}

func (filterKind) containers(g *graph, o tc.Object) []string {
	x := o.(*tc.Filter)
	// ffff: is the ingress qdisc's own handle: a filter another tool
	// put there (`parent ffff:`) hangs on the hook, not on the root.
	if x.Parent == tc.HandleIngressHook || x.Parent == tc.HandleEgressHook || x.Parent == tc.MakeHandle(0xffff, 0) {
		return []string{qdiscKey(x.Dev, tc.HandleIngress)}
	}
	out := []string{qdiscKey(x.Dev, tc.HandleRoot)}
	if t := tc.U32HTID(x.Handle); t != 0 && !x.IsTable() {
		out = append(out, tableKey(x, t))
	}
	return out
}

func (filterKind) needs(o tc.Object) []string {
	x := o.(*tc.Filter)
	var out []string
	if x.Parent.Minor() != 0 && x.Parent != tc.HandleIngressHook && x.Parent != tc.HandleEgressHook {
		out = append(out, classKey(x.Dev, x.Parent)) // a class's filter block
	}
	if x.IsTP() {
		return out
	}
	out = append(out, tpKey(x))
	if x.U32 != nil {
		if x.U32.Link != 0 {
			out = append(out, tableKey(x, x.U32.Link))
		}
		if x.U32.ClassID != 0 {
			out = append(out, classKey(x.Dev, x.U32.ClassID))
		}
		if x.U32.RedirectDev != "" {
			out = append(out, (&tc.Link{Name: x.U32.RedirectDev}).Key())
		}
	}
	return out
}

func (filterKind) compare(live, want tc.Object, D *graph) (equal, changeable bool, why string) {
	w := want.(*tc.Filter)
	l := live.(*tc.Filter)
	if l.Kind != w.Kind || l.Proto != w.Proto {
		return false, false, "kind or protocol differs"
	}
	if w.IsTP() {
		return true, false, ""
	}
	if filterEqual(l.U32, w.U32) {
		return true, false, ""
	}
	return false, false, "u32 cannot change a node's keys in place"
}

func (filterKind) hash(h *fingerprint, o tc.Object) {
	x := o.(*tc.Filter)
	h.u64(4)
	h.str(x.Dev)
	h.u64(uint64(x.Parent))
	h.u64(uint64(x.Prio))
	h.u64(uint64(x.Proto))
	h.str(x.Kind)
	h.u64(uint64(x.Handle))
	h.str(x.Note)
	if present(h, x.BPF) {
		h.str(x.BPF.Name)
		h.flag(x.BPF.DA)
	}
	if u := x.U32; present(h, u) {
		h.u64(uint64(u.Divisor))
		h.u64(uint64(u.ClassID))
		h.u64(uint64(u.Link))
		h.str(u.RedirectDev)
		if present(h, u.Mark) {
			h.u64(uint64(u.Mark.Val))
			h.u64(uint64(u.Mark.Mask))
		}
		if s := u.Sel; present(h, s) {
			h.u64(uint64(s.Flags))
			h.u64(uint64(s.Offshift))
			h.u64(uint64(s.Offmask))
			h.u64(uint64(s.Off))
			h.u64(uint64(s.Offoff))
			h.u64(uint64(s.Hoff))
			h.u64(uint64(s.Hmask))
			h.u64(uint64(len(s.Keys)))
			for _, k := range s.Keys {
				h.u64(uint64(k.Mask))
				h.u64(uint64(k.Val))
				h.u64(uint64(k.Off))
				h.flag(k.NextHdr)
			}
		}
	}
}

func (filterKind) holdable() bool { return true }

func (filterKind) do(k *Kernel, op tc.Op) error {
	o := op.Obj.(*tc.Filter)
	c := k.conn
	if op.Verb == tc.Add {
		if o.IsTP() {
			return nil // created with its first table or node
		}
		return c.FilterAdd(o)
	}
	return c.FilterDel(o)
}

// hookKind is sluice's BPF classifier or policer program with its maps.
type hookKind struct{}

func (hookKind) rank(g *graph, o tc.Object, dev int) []int {
	x := o.(*bpf.Hook)
	parent := tc.HandleEgressHook
	if x.Ingress {
		parent = tc.HandleIngressHook
	}
	return []int{6, dev, int(parent), int(x.Prio)}
}

func (hookKind) containers(g *graph, o tc.Object) []string {
	x := o.(*bpf.Hook)
	return []string{qdiscKey(x.Dev, tc.HandleIngress)}
}

func (hookKind) needs(o tc.Object) []string {
	return nil
}

func (hookKind) compare(live, want tc.Object, D *graph) (equal, changeable bool, why string) {
	w := want.(*bpf.Hook)
	l := live.(*bpf.Hook)
	if why := l.Replaceable(w); why != "" {
		return false, false, why
	}
	return l.Content.Equal(w.Content), true, ""
}

func (hookKind) hash(h *fingerprint, o tc.Object) {
	x := o.(*bpf.Hook)
	h.u64(5)
	h.str(x.Dev)
	h.flag(x.Ingress)
	h.u64(uint64(x.Prio))
	h.str(x.Note)
	if present(h, x.Content) {
		h.u64(contentFingerprint(x.Content))
	}
	for _, i := range x.Controlled {
		h.u64(uint64(i) + 1)
	}
	for _, s := range x.Siblings {
		h.str(s.Dev)
		h.flag(s.Ingress)
	}
}

func (hookKind) holdable() bool { return false }

func (hookKind) do(k *Kernel, op tc.Op) error {
	o := op.Obj.(*bpf.Hook)
	c := k.conn
	switch op.Verb {
	case tc.Add:
		return k.attachHook(o)
	case tc.Change:
		return k.syncHook(o.ProgID, o.Content, o.Base)
	}
	return c.FilterDel(hookFilter(o))
}

// hostSwapKind is host entries changed in place (HostSwap): only ever
// in a patch's diff (WriteHosts), never planned or read back.
type hostSwapKind struct{}

func (hostSwapKind) rank(g *graph, o tc.Object, dev int) []int {
	return append(hookKind{}.rank(g, o.(*HostSwap).Hook, dev), 1)
}
func (hostSwapKind) containers(g *graph, o tc.Object) []string { return nil }
func (hostSwapKind) needs(o tc.Object) []string                { return nil }
func (hostSwapKind) compare(live, want tc.Object, D *graph) (equal, changeable bool, why string) {
	return false, true, ""
}
func (hostSwapKind) hash(h *fingerprint, o tc.Object) { h.str(o.Key()) }
func (hostSwapKind) holdable() bool                   { return false }

func (hostSwapKind) do(k *Kernel, op tc.Op) error {
	if op.Verb != tc.Change {
		return fmt.Errorf("cannot %s %s", op.Verb, op.Obj.Describe())
	}
	return k.swapHosts(op.Obj.(*HostSwap))
}
