package plan

import (
	"fmt"
	"math"
	"strings"

	"sluice/policy"
	"sluice/units"
)

// How HTB shares spare capacity. A class above its rate borrows from its
// parent, and the classes borrowing at one prio take turns by deficit
// round robin, each sending its quantum per turn. Quanta in proportion to
// the siblings' weights therefore split the spare capacity by weight
// (tc's rate/r2q default does this by rate). A quantum must hold the
// packets HTB sees (quantumFloor: below them DRR counts packets, not
// bytes), so a group's scale comes from its members' floors: the anchor
// gets its floor, the others their multiple of it.
//
// The anchor is the lightest member whose weight is at least 1/15 of the
// heaviest's, not the lightest of all: a small default class (100kbit
// beside 1, 2 and 4mbit) made every other quantum 10 to 40 times its
// floor, rounds of 200 ms, and a class with one TCP flow then lost half
// its share, its queue emptying before its long turn did (measured:
// 10.6% of the link where the reference says 20%). A member lighter than
// the anchor's fifteenth gets its weight's quantum too, below the floor:
// while it borrows it sends at least a packet per turn, more than its
// weight's share, and plan says so (measured: a busy 100kbit default
// class beside 1, 2 and 4mbit got 3.4% of 21mbit where the reference says
// 1.6%).
//
// The quanta of a group depend on its anchor: the anchor changing (a
// member lighter than it but above the fifteenth joining, or the anchor
// leaving) rescales its siblings' quanta (apply changes them in place).
// Any other edit changes the edited class alone, as apply's fast path
// wants.
//
// Two kinds of member stand outside the scale. A class that can never
// borrow (its ceil, or what its children may use together, at most its
// rate) never joins DRR at this level, whatever its weight: it gets its
// own floor. Counted, subscribers of 800mbit whose hosts' ceils add up
// to 450mbit made business (100mbit) the anchor of a 1gbit tree, and
// voice, other and guests (50, 30 and 20mbit) fell below the floor
// (docs/sharing.md, the examples). And the members of an inner class
// that borrows take their turns as one: HTB's round at the parent's
// level moves past the inner class once every one of its busy leaves
// has had its quantum, so the class's turn is the sum of its busy
// children's quanta, not its own. Its children's quanta therefore add
// up to at least the class's own (turn), split by weight, so that the
// class takes its weight's share beside its siblings when its children
// are busy (measured before: business's two hosts, with quanta sized
// within business alone, took 129 of their 200 Mbit/s).
//
// Quanta stop at maxQuantumW: a turn of the heaviest class is a burst
// the others wait behind, and at 30mbit quanta of 0.64, 1.3 and 2 MB
// (1:2:3 from 640 KB) gave the lightest 2.4 instead of 4.9 Mbit/s with
// 13% retransmits and a 0.7 s ping.
const (
	maxQuantumW = 1 << 20
	anchorRange = 15 // below maxQuantumW over the GSO floor: the heaviest fits
)

// sibling is one child of a parent class as DRR sees it.
type sibling struct {
	name   string
	rate   units.Rate // bytes/s, as planned (a shard's part)
	weight float64
	prio   uint32
	fixed  bool // an explicit quantum: kept, and not part of the scale
	leaf   Leaf // what its leaf hands HTB (the floor: quantumFloor)
	// bounded: it can never borrow (what it may use is at most its
	// rate): its floor, outside the scale.
	bounded bool
}

// shareQuanta returns each sibling's quantum and, per prio group whose
// weights the quanta cannot follow exactly, a note. Within one prio group
// the quanta are base*weight, base the smallest scale that gives every
// member within anchorRange of the heaviest at least its own floor
// (QuantumFor its rate) and, where the siblings take their turns as one
// of turn bytes (an inner class that borrows; 0: none), gives them
// together at least turn; capped at maxQuantumW. Lighter members get
// base*weight, at least a frame; bounded ones their floor.
func shareQuanta(sibs []sibling, link units.Rate, turn uint32) (q []uint32, notes []string) {
	q = make([]uint32, len(sibs))
	var heaviest, base, weights [8]float64
	scaled := func(s sibling) bool { return !s.fixed && !s.bounded }
	for _, s := range sibs {
		if scaled(s) {
			heaviest[s.prio&7] = max(heaviest[s.prio&7], s.weight)
			weights[s.prio&7] += s.weight
		}
	}
	for _, s := range sibs {
		if p := s.prio & 7; scaled(s) && s.weight*anchorRange >= heaviest[p] {
			base[p] = max(base[p], float64(QuantumFor(s.rate, link, s.leaf))/s.weight)
		}
	}
	for p := range base {
		if weights[p] > 0 {
			base[p] = max(base[p], float64(turn)/weights[p])
		}
	}
	var capped, light [8][]string
	for i, s := range sibs {
		p := s.prio & 7
		if s.fixed {
			continue
		}
		if s.bounded {
			q[i] = QuantumFor(s.rate, link, s.leaf)
			continue
		}
		v := math.Ceil(base[p] * s.weight)
		switch {
		case v > maxQuantumW:
			v = maxQuantumW
			capped[p] = append(capped[p], s.name)
		case s.weight*anchorRange < heaviest[p]:
			v = max(v, frameBytes)
			light[p] = append(light[p], s.name)
		default:
			v = max(v, float64(QuantumFor(s.rate, link, s.leaf)))
		}
		q[i] = uint32(v)
	}
	list := func(names []string) string {
		more := ""
		if len(names) > 3 {
			more = fmt.Sprintf(" and %d more", len(names)-3)
			names = names[:3]
		}
		return strings.Join(names, ", ") + more
	}
	for prio := range capped {
		if names := capped[prio]; len(names) > 0 {
			notes = append(notes, fmt.Sprintf("prio %d: the weight of %s is too far above the lightest sibling's for HTB's quanta (at most %d bytes): less than its weight's share of spare capacity (sharing: controller follows any weights)",
				prio, list(names), maxQuantumW))
		}
		if names := light[prio]; len(names) > 0 {
			notes = append(notes, fmt.Sprintf("prio %d: the weight of %s is less than 1/%d of the heaviest sibling's: while it borrows it sends at least a packet per turn, more than its weight's share of spare capacity (sharing: controller follows any weights)",
				prio, list(names), anchorRange))
		}
	}
	return q, notes
}

// shareGroup sets b.quanta for the children of owner (nil: the top of the
// tree, whose children are cs): its classes and its hosts (per_host
// addresses, hosts_file entries) share its spare capacity by weight, a
// host's weight being its rate. turn is owner's quantum where owner
// borrows (its children then take their turns as one), else 0.
func (b *builder) shareGroup(owner *policy.Class, cs []*policy.Class, turn uint32) {
	var sibs []sibling
	for _, c := range cs {
		rate := max(c.RateBps/b.div, 1)
		sibs = append(sibs, sibling{name: c.Name, rate: rate, weight: c.ShareWeight(),
			prio: uint32(c.Prio), fixed: c.Quantum != nil, leaf: b.leafOf(c), bounded: b.reach(c) <= rate})
	}
	if owner != nil {
		if ph := owner.PerHost; ph != nil {
			for _, h := range b.hostsOf(owner)[b.shard] {
				sibs = append(sibs, sibling{name: h.name, rate: h.rate, weight: float64(h.rate), prio: h.prio, leaf: b.leafKind(ph.Leaf), bounded: h.ceil <= h.rate})
			}
		}
		for _, e := range owner.Hosts {
			sibs = append(sibs, sibling{name: entryName(e.Owner, e), rate: e.RateBps, weight: float64(e.RateBps), prio: entryPrio(e),
				leaf: b.leafKind(e.Owner.PerHost.Leaf), bounded: e.CeilBps <= e.RateBps})
		}
	}
	if len(sibs) < 2 && turn == 0 {
		return // nothing to share with: QuantumFor the rate, as ever
	}
	q, notes := shareQuanta(sibs, b.groupRate(owner), turn)
	if b.quanta == nil {
		b.quanta = map[string]uint32{}
	}
	for i, s := range sibs {
		if !s.fixed {
			b.quanta[s.name] = q[i]
		}
	}
	if b.shard == 0 {
		under := "top"
		if owner != nil {
			under = owner.Name
		}
		for _, f := range notes {
			b.dev.Sharing = append(b.dev.Sharing, fmt.Sprintf("under %s, %s", under, f))
		}
	}
}

// reach is the most class c can ever use: its ceil, or less where its
// children's ceils (classes and hosts of this shard) add up to less. A
// class whose reach is at most its rate never borrows.
func (b *builder) reach(c *policy.Class) units.Rate {
	if c.IsLeaf() {
		return c.CeilBps
	}
	var sum units.Rate
	for _, ch := range c.Classes {
		sum += b.reach(ch)
	}
	if c.PerHost != nil {
		for _, h := range b.hostsOf(c)[b.shard] {
			sum += h.ceil
		}
	}
	for _, e := range c.Hosts {
		sum += e.CeilBps
	}
	return min(c.CeilBps, sum)
}

// groupRate is what the children of owner (nil: the top of the tree)
// share when they are all busy: owner's rate (a shard's part of it), or
// the tree's. Their packets' sizes, and so their quanta's floor, follow
// from it: hosts under a 95mbit class of a 1gbit tree share about
// 95mbit, and quanta sized for 1gbit made their rounds last 340 ms.
func (b *builder) groupRate(owner *policy.Class) units.Rate {
	if owner == nil {
		return b.tree.RateBps / b.div
	}
	return max(min(owner.RateBps/b.div, b.tree.RateBps/b.div), 1)
}

// hostPrio is the prio of per_host class c's hosts.
func hostPrio(c *policy.Class) uint32 {
	if ph := c.PerHost; ph != nil && ph.Prio != nil {
		return uint32(*ph.Prio)
	}
	return uint32(c.Prio)
}

// entryPrio is the prio of hosts_file entry e: its prio column's, else
// its per_host class's hosts'.
func entryPrio(e *policy.HostEntry) uint32 {
	if e.Prio != nil {
		return uint32(*e.Prio)
	}
	return hostPrio(e.Owner)
}
