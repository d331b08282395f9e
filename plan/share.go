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
	aqm    bool // its leaf has an AQM (a lower floor: quantumFloor)
}

// shareQuanta returns each sibling's quantum and, per prio group whose
// weights the quanta cannot follow exactly, a note. Within one prio group
// the quanta are base*weight, base the smallest scale that gives every
// member within anchorRange of the heaviest at least its own floor
// (QuantumFor its rate), capped at maxQuantumW; lighter members get
// base*weight, at least a frame.
func shareQuanta(sibs []sibling, link units.Rate) (q []uint32, notes []string) {
	q = make([]uint32, len(sibs))
	var heaviest, base [8]float64
	for _, s := range sibs {
		if !s.fixed {
			heaviest[s.prio&7] = max(heaviest[s.prio&7], s.weight)
		}
	}
	for _, s := range sibs {
		if p := s.prio & 7; !s.fixed && s.weight*anchorRange >= heaviest[p] {
			base[p] = max(base[p], float64(QuantumFor(s.rate, link, s.aqm))/s.weight)
		}
	}
	var capped, light [8][]string
	for i, s := range sibs {
		p := s.prio & 7
		if s.fixed {
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
			v = max(v, float64(QuantumFor(s.rate, link, s.aqm)))
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
// host's weight being its rate.
func (b *builder) shareGroup(owner *policy.Class, cs []*policy.Class) {
	var sibs []sibling
	for _, c := range cs {
		sibs = append(sibs, sibling{name: c.Name, rate: max(c.RateBps/b.div, 1), weight: c.ShareWeight(),
			prio: uint32(c.Prio), fixed: c.Quantum != nil, aqm: c.IsLeaf() && b.aqmLeaf(c.Leaf)})
	}
	if owner != nil {
		if ph := owner.PerHost; ph != nil {
			prio := hostPrio(owner)
			for _, h := range b.hostsOf(owner)[b.shard] {
				sibs = append(sibs, sibling{name: h.name, rate: h.rate, weight: float64(h.rate), prio: prio, aqm: b.aqmLeaf(ph.Leaf)})
			}
		}
		for _, e := range owner.Hosts {
			sibs = append(sibs, sibling{name: entryName(e.Owner, e), rate: e.RateBps, weight: float64(e.RateBps), prio: hostPrio(e.Owner),
				aqm: b.aqmLeaf(e.Owner.PerHost.Leaf)})
		}
	}
	if len(sibs) < 2 {
		return // nothing to share with: QuantumFor the rate, as ever
	}
	q, notes := shareQuanta(sibs, b.groupRate(owner))
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
