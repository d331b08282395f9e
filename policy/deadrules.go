package policy

import (
	"fmt"
	"net/netip"
	"sort"
)

// Rules no packet can reach. Classification is first match wins, in
// file order (docs/policy.md): a rule every packet of which an earlier
// class's rule already takes never matches, and a class all of whose
// rules are so taken gets no traffic. Neither is an error (the policy
// still works), but almost always a mistake: two classes with the same
// rule, or a LAN prefix before a per-host class of that LAN. Found by
// coverage of one rule by one earlier rule (a rule covered only by
// several together is not reported).

// taker is a class that takes the packets its rules match, at one level
// of first-match order (a block): its rules as they act, a per-host
// class's narrowed to its hosts' addresses.
type taker struct {
	c     *Class
	rules []*Match
}

// deadRules warns of rules of tree t that an earlier class's rule
// covers, naming both.
func deadRules(where string, t *Tree, d *Diag) {
	var block func(cs []*Class)
	block = func(cs []*Class) {
		var earlier []taker
		var walk func(cs []*Class)
		walk = func(cs []*Class) {
			for _, c := range cs {
				switch {
				case len(c.Match) > 0 || c.PerHost != nil:
					tk := taker{c: c, rules: actingRules(c)}
					dead := 0
					for _, r := range tk.rules {
						if by, byRule := coveredBy(earlier, r); by != nil {
							dead++
							msg := fmt.Sprintf("%s: class %s: the rule at line %d can never match: class %s's rule at line %d takes every packet it matches first (first match wins)",
								where, c.Name, r.Pos.Line, by.Name, byRule.Pos.Line)
							if dead == len(tk.rules) {
								msg += fmt.Sprintf("; no rule of class %s can match, so it gets no traffic", c.Name)
							}
							d.Warnf(r.Pos, "%s", msg)
						}
					}
					earlier = append(earlier, tk)
					if len(c.Match) > 0 && len(c.Classes) > 0 && c.PerHost == nil {
						block(c.Classes) // a gate: its children sort among themselves
					}
				case len(c.Classes) > 0:
					walk(c.Classes) // a grouping class: its children join this block
				}
			}
		}
		walk(cs)
	}
	block(t.Classes)
}

// coveredBy finds an earlier taker's rule that matches every packet r
// matches.
func coveredBy(earlier []taker, r *Match) (*Class, *Match) {
	for _, tk := range earlier {
		for _, e := range tk.rules {
			if covers(e, r) {
				return tk.c, e
			}
		}
	}
	return nil, nil
}

// actingRules are class c's rules as they take packets: its match
// entries (one empty entry for a per-host class without any), a
// per-host class's narrowed to the addresses of its hosts.
func actingRules(c *Class) []*Match {
	rules := c.Match
	ph := c.PerHost
	if ph == nil {
		return rules
	}
	pos := c.Pos
	if ph.CIDR.IsValid() {
		pos = ph.CIDRPos
	}
	if len(rules) == 0 {
		rules = []*Match{{Pos: pos}}
	}
	var hosts []netip.Prefix
	if ph.CIDR.IsValid() {
		hosts = append(hosts, ph.CIDR.Masked())
	}
	for _, e := range ph.Entries {
		if e.Owner == c {
			hosts = append(hosts, e.Addrs...)
		}
	}
	var out []*Match
	for _, r := range rules {
		n := *r
		if ph.By == "src" {
			n.Src = narrow(r.Src, hosts)
		} else {
			n.Dst = narrow(r.Dst, hosts)
		}
		if len(hosts) > 0 && (ph.By == "src" && len(n.Src) == 0 || ph.By != "src" && len(n.Dst) == 0) {
			continue // no host of the class is among the rule's addresses
		}
		out = append(out, &n)
	}
	return out
}

// narrow is the addresses of ps (all, where empty) that are in one of
// to: prefix by prefix, the narrower of two that nest.
func narrow(ps, to []netip.Prefix) []netip.Prefix {
	if len(ps) == 0 {
		return append([]netip.Prefix(nil), to...)
	}
	var out []netip.Prefix
	for _, p := range ps {
		for _, q := range to {
			switch {
			case within(p, q):
				out = append(out, p)
			case within(q, p):
				out = append(out, q)
			}
		}
	}
	return out
}

// within reports whether prefix p lies inside prefix q.
func within(p, q netip.Prefix) bool {
	return p.Addr().Is4() == q.Addr().Is4() && q.Bits() <= p.Bits() && q.Contains(p.Masked().Addr())
}

// covers reports whether every packet rule b matches, rule a matches
// too (docs/policy.md's reading of each field). It errs towards false.
func covers(a, b *Match) bool {
	return prefixesCover(a.Src, b.Src) && prefixesCover(a.Dst, b.Dst) &&
		negationCovers(a.NotSrc, b.NotSrc, b.Src) && negationCovers(a.NotDst, b.NotDst, b.Dst) &&
		portsCover(a.Sport, b.Sport) && portsCover(a.Dport, b.Dport) &&
		valuesCover(a.Proto, b.Proto) && valuesCover(a.DSCP, b.DSCP) && tosCovers(a.TOS, b.TOS) &&
		(!a.TCPAck || b.TCPAck) && (!a.TCPSyn || b.TCPSyn) && markCovers(a.Mark, b.Mark)
}

// prefixesCover: a (any address where empty) holds every address of b.
func prefixesCover(a, b []netip.Prefix) bool {
	if len(a) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	for _, p := range b {
		in := false
		for _, q := range a {
			if within(p, q) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	return true
}

// negationCovers: no address b matches is one a excludes. b excludes it
// too, or b's addresses (bIn) keep clear of it.
func negationCovers(aNot, bNot, bIn []netip.Prefix) bool {
	for _, q := range aNot {
		ok := false
		for _, r := range bNot {
			if within(q, r) {
				ok = true
				break
			}
		}
		if !ok && len(bIn) > 0 {
			ok = true
			for _, p := range bIn {
				if p.Overlaps(q) {
					ok = false
					break
				}
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// portsCover: a (any port where empty) holds every port of b. A rule
// with ports matches only protocols with ports: b has ports too.
func portsCover(a, b []PortRange) bool {
	if len(a) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	if len(a) == 1 { // the common case, without allocating: every rule meets every earlier one
		for _, r := range b {
			if r.Lo < a[0].Lo || r.Hi > a[0].Hi {
				return false
			}
		}
		return true
	}
	rs := a
	if !sort.SliceIsSorted(a, func(i, j int) bool { return a[i].Lo < a[j].Lo }) {
		rs = append([]PortRange(nil), a...)
		sort.Slice(rs, func(i, j int) bool { return rs[i].Lo < rs[j].Lo })
	}
	for _, r := range b {
		next := int(r.Lo) // the first port of r not yet known covered
		for _, q := range rs {
			if int(q.Lo) <= next && int(q.Hi) >= next {
				next = int(q.Hi) + 1
			}
		}
		if next <= int(r.Hi) {
			return false
		}
	}
	return true
}

// valuesCover: a (any value where empty) holds every value of b.
func valuesCover(a, b []uint8) bool {
	if len(a) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	for _, x := range b {
		in := false
		for _, y := range a {
			in = in || x == y
		}
		if !in {
			return false
		}
	}
	return true
}

func tosCovers(a, b *Masked8) bool {
	return a == nil || b != nil && a.Mask&^b.Mask == 0 && (a.Val^b.Val)&a.Mask == 0
}

func markCovers(a, b *Masked32) bool {
	return a == nil || b != nil && a.Mask&^b.Mask == 0 && (a.Val^b.Val)&a.Mask == 0
}
