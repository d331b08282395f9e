package migrate

import (
	"fmt"
	"math"
	"strings"
)

// fitRates makes children's rates fit their parent's, as sluice
// requires and the old tools did not: where they add up to more, each
// is scaled in the same proportion (what HTB could guarantee them
// anyway). Ceils above the parent's are lowered to it: HTB never lets
// a class send faster than its parent.
func fitRates(r *Report, at At, parentRate float64, cs []*Class) {
	fitLevel(r, at, "the link", parentRate, parentRate, cs)
}

func fitLevel(r *Report, at At, parent string, parentRate, parentCeil float64, cs []*Class) {
	sum := 0.0
	for _, c := range cs {
		sum += c.rateBits
	}
	if sum > parentRate*1.0000001 {
		f := parentRate / sum
		var was []string
		for _, c := range cs {
			was = append(was, fmt.Sprintf("%s %s -> ", c.Name, bitRate(c.rateBits)))
			c.rateBits *= f
			if c.rateBits >= 10000 {
				c.rateBits = math.Floor(c.rateBits/1000) * 1000 // whole kbit reads better, and still fits
			}
			if c.rateBits < 8 {
				c.rateBits = 8
			}
			c.Rate = bitRate(c.rateBits)
			was[len(was)-1] += c.Rate
		}
		r.Approx(at, "rates under "+parent, "they add up to %s, more than its %s, which sluice refuses: scaled by %.3f (%s); what each may borrow (its ceil) is unchanged",
			bitRate(sum), bitRate(parentRate), f, strings.Join(was, ", "))
	}
	for _, c := range cs {
		if c.ceilBits > parentCeil {
			c.ceilBits = parentCeil
			c.Ceil = bitRate(parentCeil)
		}
		if c.ceilBits < c.rateBits {
			c.ceilBits = c.rateBits
			c.Ceil = c.Rate
		}
		if len(c.Classes) > 0 {
			fitLevel(r, c.At, "class "+c.Name, c.rateBits, c.ceilBits, c.Classes)
		}
	}
}

// finishMatches notes what every IPv4 u32 rule of the old tools meant
// that sluice's rules say differently, and with IPv4Only keeps IPv6 out
// of rules without addresses.
//
// ipv6Was says where the old tool sent IPv6 ("to the default class").
func finishMatches(r *Report, at At, cs []*Class, opt Options, ipv6Was string) {
	open := 0
	for _, c := range allClasses(cs) {
		for _, m := range c.Match {
			if (len(m.Sport) > 0 || len(m.Dport) > 0) && m.Proto == "" {
				r.Approx(m.At, "port match", "matches TCP and UDP ports here, found behind IP options and in first fragments only; the old u32 rule read those bytes at a fixed offset in any IPv4 packet without options")
			}
			if len(m.Src)+len(m.Dst)+len(m.NotSrc)+len(m.NotDst) > 0 || m.Proto == "icmp" {
				continue
			}
			if opt.IPv4Only {
				m.Src = []string{"0.0.0.0/0"}
				continue
			}
			open++
		}
	}
	if open > 0 {
		r.Approx(at, "IPv6", "the old filters classified IPv4 alone (IPv6 went %s); here %d rule(s) without addresses match IPv6 too (--ipv4-only keeps the old behaviour)", ipv6Was, open)
	} else {
		r.Exact(at, "IPv6", "the rules classify IPv4 alone, as the old ones did; IPv6 goes to the default class")
	}
}

// rootsToTree hangs an HTB tree's root classes under t. One root class
// with children is the link: its rate becomes the tree's (HTB never
// lets a root class borrow, so its rate is what it sends), comment
// names it, and its children become the top-level classes. Several
// root classes lend nothing to each other: each keeps its rate as its
// ceil under a tree that is their sum.
func rootsToTree(r *Report, t *Tree, at At, top []*Class, comment string) {
	if len(top) == 1 && len(top[0].Classes) > 0 {
		root := top[0]
		t.Rate, t.Comment, t.Classes = root.Rate, comment, root.Classes
		r.Exact(root.At, "class "+root.Origin, "the egress tree's rate, %s", t.Rate)
		return
	}
	sum := 0.0
	for _, c := range top {
		sum += c.rateBits
		c.Ceil, c.ceilBits = c.Rate, c.rateBits
	}
	t.Rate, t.Classes = bitRate(sum), top
	r.Exact(at, "root classes", "%d root classes, none borrowing from another: each capped at its rate under a tree of %s", len(top), t.Rate)
}

// addUnclassified gives t a default class where the old tree sent
// unclassified traffic out unshaped (HTB's direct queue: no default,
// or one naming no leaf): 1% of the link, up to all of it, prio 7.
func addUnclassified(r *Report, t *Tree, at At, taken map[string]bool, what, comment string) {
	name := uniqueName("unclassified", taken)
	rate := max(t.rateBits()/100, 8000)
	t.Classes = append(t.Classes, &Class{At: at, Name: name, Comment: comment,
		Rate: bitRate(rate), Ceil: t.Rate, Prio: intp(7), rateBits: rate, ceilBits: t.rateBits()})
	t.Default = name
	r.Approx(at, what, "unclassified traffic went out unshaped (HTB's direct queue); here it goes to class %s (%s, up to the link, prio 7), so it counts against the link", name, bitRate(rate))
}
