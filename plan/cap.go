package plan

import (
	"fmt"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
	"sluice/units"
)

// A sharing's cap is held twice. The controller shares it out (cap
// minus what prod used, by weight), and, on an HTB tree, the plan puts
// the controlled children under one class whose ceil is the cap: HTB
// then holds their sum at the cap from the first packet, before the
// controller has measured anything. The controller's limits are
// delayed (a child gets one once it uses it), so without that class
// the tenants of prod-nonprod started at their ceils, the link, for the
// first one to three quanta of every load: the modem queued and prod's
// ping p95 over the loaded phase was 129 to 174 ms for 21 ms idle.

// CapClassName names the class that holds the cap of the sharing block
// of owner ("" for the direction's): "(cap)" or "OWNER/(cap)". The
// parentheses keep it apart from every policy name.
func CapClassName(owner string) string {
	if owner == "" {
		return "(cap)"
	}
	return owner + "/(cap)"
}

// capped reports whether the sharing block over cs (owned by owner, nil
// for the direction's) has a cap for a class to hold, and which
// children the class holds: those its controller limits (not prod).
func (b *builder) capped(owner *policy.Class, cs []*policy.Class) (sh *policy.Sharing, held []bool) {
	if b.edt != nil || b.div > 1 || len(cs) == 0 {
		return nil, nil
	}
	sh = b.tree.Sharing
	if owner != nil {
		sh = owner.Sharing
	}
	if sh == nil || sh.Cap == nil || sh.CapBps == 0 {
		return nil, nil
	}
	prod := prodOf(cs)
	held = make([]bool, len(cs))
	any := false
	for i := range cs {
		held[i] = !prod[i]
		any = any || held[i]
	}
	if !any {
		return nil, nil
	}
	return sh, held
}

// prodOf marks the prod children of a sharing block: prio 0 beside
// children of other prios (never limited; their use comes off the
// capacity).
func prodOf(cs []*policy.Class) []bool {
	prios := map[int]bool{}
	for _, c := range cs {
		prios[c.Prio] = true
	}
	out := make([]bool, len(cs))
	for i, c := range cs {
		out[i] = len(prios) > 1 && c.Prio == 0
	}
	return out
}

// capNames calls add with the name of every cap class t's plan makes.
func (b *builder) capNames(t *policy.Tree, add func(string)) {
	eachSharing(t, func(owner string, _ *policy.Sharing, cs []*policy.Class) {
		var o *policy.Class
		if owner != "" {
			o = b.byName[owner]
		}
		if sh, _ := b.capped(o, cs); sh != nil {
			add(CapClassName(owner))
		}
	})
}

// capClass emits the class holding the cap of the sharing block over
// cs under parent, and returns its handle.
func (b *builder) capClass(owner *policy.Class, cs []*policy.Class, held []bool, sh *policy.Sharing, parent tc.Handle) tc.Handle {
	name := CapClassName("")
	if owner != nil {
		name = CapClassName(owner.Name)
	}
	ceil := min(sh.CapBps, b.parentCeil(owner))
	var rate units.Rate
	for i, c := range cs {
		if held[i] {
			rate += c.RateBps
		}
	}
	// Its rate is what its children are guaranteed together (HTB wants
	// an inner class's rate to cover its children's), never over the cap.
	rate = max(min(rate, ceil), 1)
	id := b.classID(name)
	cl := &tc.Class{Dev: b.dev.Name, Parent: parent, Handle: id, Kind: "htb", Rate: rate, Ceil: ceil, Name: name}
	setBursts(cl, b.tree.Dir, b.groupRate(owner), LeafFIFO, nil, nil, nil)
	turnBurst(cl, nil, b.parentCeil(owner), true)
	b.objs = append(b.objs, cl)
	b.dev.Classes = append(b.dev.Classes, ClassInfo{Name: name, Handle: id, Parent: parent, Rate: rate, Ceil: ceil})
	return id
}

// edtCap gives an EDT tree's capped sharing an aggregate of its own at
// the cap: each child the controller limits (a leaf class's aggregate)
// takes a slot on its clock too, as a group's hosts take one on the
// group's, so their sum is held from the first packet. Only the
// direction's sharing has one (an EDT tree's classes are its leaves),
// and a per_host child's hosts are not bound to it: their aggregates
// are their own (a groups_file's may belong to a group already).
func (b *builder) edtCap(c *bpf.Content) {
	t := b.tree
	sh := t.Sharing
	if sh == nil || sh.Cap == nil || sh.CapBps == 0 {
		return
	}
	index := map[uint32]int{} // counter -> target
	for i, tg := range c.Targets {
		if tg.Counter != 0 {
			index[tg.Counter] = i
		}
	}
	prod := prodOf(t.Classes)
	var held []int
	var rate units.Rate
	skipped := 0
	for i, cl := range t.Classes {
		if prod[i] {
			continue
		}
		k, ok := index[b.counter(cl.Name)]
		if !ok || cl.PerHost != nil || c.Targets[k].Group != 0 {
			skipped++
			continue
		}
		held = append(held, k)
		rate += cl.RateBps
	}
	if len(held) == 0 {
		return
	}
	name := CapClassName("")
	capT := bpf.Target{Counter: b.counter(name)}
	setPace(&capT, t, t.Burst.NS(sh.CapBps), min(rate, sh.CapBps), sh.CapBps)
	c.Targets = append(c.Targets, capT)
	for _, k := range held {
		c.Targets[k].Group = uint32(len(c.Targets))
	}
	b.dev.Classes = append(b.dev.Classes, ClassInfo{Name: name, Rate: min(rate, sh.CapBps), Ceil: sh.CapBps, Prio: 1, Counter: capT.Counter})
	if skipped > 0 {
		b.dev.Notes = append(b.dev.Notes, fmt.Sprintf("edt: %d of the capped sharing's children are per_host classes: their hosts' aggregates do not take a slot on the (cap) aggregate, and only the controller holds them to the cap", skipped))
	}
}
