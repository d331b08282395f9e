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
// (tc's rate/r2q default does this by rate). sluice keeps every quantum
// at least one 64 KB GSO packet (minQuantum: below it DRR counts packets,
// not bytes) and scales the group up from there: the lightest sibling
// gets the floor, the others their multiple of it.
//
// The quanta of a group depend on its lightest member: a sibling lighter
// than all the others joining, or the lightest leaving, rescales its
// siblings' quanta (apply changes them in place). Any other edit changes
// the edited class alone, as apply's fast path wants. (Rounding the scale
// to a power of two would make that rarer at the price of quanta up to
// twice the floor for every group, equal ones included: measured just as
// fair, 4.88, 9.46 and 14.34 Mbit/s from 128, 256 and 384 KB, but it
// would change every tree's quanta for little.)
//
// Quanta stop at maxQuantumW: a turn of the heaviest class is a burst
// the others wait behind, and at 30mbit quanta of 0.64, 1.3 and 2 MB
// (1:2:3 from 640 KB) gave the lightest 2.4 instead of 4.9 Mbit/s with
// 13% retransmits and a 0.7 s ping. Weights up to 15 times the
// lightest's are followed exactly (the sharing controller follows any).
const maxQuantumW = 1 << 20

// sibling is one child of a parent class as DRR sees it.
type sibling struct {
	name   string
	rate   units.Rate // bytes/s, as planned (a shard's part)
	weight float64
	prio   uint32
	fixed  bool // an explicit quantum: kept, and not part of the scale
}

// shareQuanta returns each sibling's quantum and, per prio group whose
// weights the quanta cannot follow exactly, a note. Within one prio group
// the quanta are base*weight, base the smallest scale that gives
// every member at least its own floor (QuantumFor its rate), capped at
// maxQuantumW.
func shareQuanta(sibs []sibling, link units.Rate) (q []uint32, flattened []string) {
	q = make([]uint32, len(sibs))
	var base [8]float64
	for _, s := range sibs {
		if !s.fixed {
			base[s.prio&7] = max(base[s.prio&7], float64(QuantumFor(s.rate, link))/s.weight)
		}
	}
	var capped [8][]string
	for i, s := range sibs {
		if s.fixed {
			continue
		}
		v := math.Ceil(base[s.prio&7] * s.weight)
		if v > maxQuantumW {
			v = maxQuantumW
			capped[s.prio&7] = append(capped[s.prio&7], s.name)
		}
		q[i] = max(uint32(v), QuantumFor(s.rate, link))
	}
	for prio, names := range capped {
		if len(names) > 0 {
			more := ""
			if len(names) > 3 {
				more = fmt.Sprintf(" and %d more", len(names)-3)
				names = names[:3]
			}
			flattened = append(flattened, fmt.Sprintf("prio %d: the weight of %s%s is too far above the lightest sibling's for HTB's quanta (at most %d bytes): less than its weight's share of spare capacity (sharing: controller follows any weights)",
				prio, strings.Join(names, ", "), more, maxQuantumW))
		}
	}
	return q, flattened
}

// shareGroup sets b.quanta for the children of owner (nil: the top of the
// tree, whose children are cs): its classes and its hosts (per_host
// addresses, hosts_file entries) share its spare capacity by weight, a
// host's weight being its rate.
func (b *builder) shareGroup(owner *policy.Class, cs []*policy.Class) {
	var sibs []sibling
	for _, c := range cs {
		sibs = append(sibs, sibling{name: c.Name, rate: max(c.RateBps/b.div, 1), weight: c.ShareWeight(),
			prio: uint32(c.Prio), fixed: c.Quantum != nil})
	}
	if owner != nil {
		if ph := owner.PerHost; ph != nil {
			prio := hostPrio(owner)
			for _, h := range b.hostsOf(owner)[b.shard] {
				sibs = append(sibs, sibling{name: h.name, rate: h.rate, weight: float64(h.rate), prio: prio})
			}
		}
		for _, e := range owner.Hosts {
			sibs = append(sibs, sibling{name: entryName(e.Owner, e), rate: e.RateBps, weight: float64(e.RateBps), prio: hostPrio(e.Owner)})
		}
	}
	if len(sibs) < 2 {
		return // nothing to share with: QuantumFor the rate, as ever
	}
	q, flattened := shareQuanta(sibs, b.tree.RateBps)
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
		for _, f := range flattened {
			b.dev.Sharing = append(b.dev.Sharing, fmt.Sprintf("under %s, %s", under, f))
		}
	}
}

// hostPrio is the prio of per_host class c's hosts.
func hostPrio(c *policy.Class) uint32 {
	if ph := c.PerHost; ph != nil && ph.Prio != nil {
		return uint32(*ph.Prio)
	}
	return uint32(c.Prio)
}
