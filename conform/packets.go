package conform

import (
	"net/netip"

	"sluice/plan"
	"sluice/policy"
)

// A packet as the policy's rules see it: the fields a flow of the bed
// can choose.
type packet struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
	dscp         uint8
	mark         uint32 // the firewall mark the bed's gateway sets
	ack          bool   // a small pure TCP ACK (else a full-size segment)
	syn          bool   // a bare TCP SYN
}

const (
	protoTCP = 6
	protoUDP = 17
)

// portProtos are the protocols with ports (docs/policy.md: a port rule
// matches only these).
var portProtos = map[uint8]bool{protoTCP: true, protoUDP: true, 132: true, 33: true, 136: true}

// entryMatches reads one match entry as docs/policy.md defines it.
func entryMatches(m *policy.Match, p packet) bool {
	in := func(ps []netip.Prefix, a netip.Addr) (inAny, sameFamily bool) {
		for _, pr := range ps {
			if pr.Addr().Is4() == a.Is4() {
				sameFamily = true
				if pr.Contains(a) {
					return true, true
				}
			}
		}
		return false, sameFamily
	}
	for _, c := range []struct {
		ps  []netip.Prefix
		a   netip.Addr
		not bool
	}{{m.Src, p.src, false}, {m.Dst, p.dst, false}, {m.NotSrc, p.src, true}, {m.NotDst, p.dst, true}} {
		if len(c.ps) == 0 {
			continue
		}
		hit, fam := in(c.ps, c.a)
		if c.not && hit || !c.not && !hit {
			return false
		}
		if !c.not && !fam {
			return false
		}
	}
	if len(m.Proto) > 0 && !has(m.Proto, p.proto) {
		return false
	}
	for _, pr := range m.Proto {
		if pr == 1 && p.src.Is6() || pr == 58 && p.src.Is4() {
			return false // icmp is IPv4's, icmpv6 IPv6's
		}
	}
	if (len(m.Sport) > 0 || len(m.Dport) > 0) && !portProtos[p.proto] {
		return false
	}
	if len(m.Sport) > 0 && !inRanges(m.Sport, p.sport) || len(m.Dport) > 0 && !inRanges(m.Dport, p.dport) {
		return false
	}
	if len(m.DSCP) > 0 && !has(m.DSCP, p.dscp) {
		return false
	}
	if m.TOS != nil && (p.dscp<<2)&m.TOS.Mask != m.TOS.Val&m.TOS.Mask {
		return false
	}
	if m.TCPAck && !(p.ack && p.proto == protoTCP) {
		return false
	}
	if m.TCPSyn && !(p.syn && p.proto == protoTCP) {
		return false
	}
	if m.Mark != nil && p.mark&m.Mark.Mask != m.Mark.Val&m.Mark.Mask {
		return false
	}
	return true
}

func has(xs []uint8, x uint8) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func inRanges(rs []policy.PortRange, p uint16) bool {
	for _, r := range rs {
		if p >= r.Lo && p <= r.Hi {
			return true
		}
	}
	return false
}

// matches reports whether any of a class's entries matches p (a class
// without entries matches everything, as a per_host class without match
// does before its cidr narrows it).
func matches(ms []*policy.Match, p packet) bool {
	if len(ms) == 0 {
		return true
	}
	for _, m := range ms {
		if entryMatches(m, p) {
			return true
		}
	}
	return false
}

// classOf is the class a packet lands in, by docs/policy.md: classes in
// file order, first match wins; a grouping class's children join its
// block; a gate sorts among its children, then its default child, then
// the tree's default; a per_host class finds the host by address (the
// longest prefix of its hosts_file, else its cidr's host). The kernel
// has the last word: a run checks each subject's flow by its counters
// before it measures anything.
func classOf(t *policy.Tree, p packet) string {
	if c := blockOf(t.Classes, p); c != "" {
		return c
	}
	return t.Default
}

func blockOf(cs []*policy.Class, p packet) string {
	for _, c := range cs {
		switch {
		case len(c.Match) > 0 || c.PerHost != nil:
			if !matches(c.Match, p) {
				continue
			}
			if ph := c.PerHost; ph != nil {
				if name, ok := hostOf(c, p); ok {
					return name
				}
				if ph.CIDR.IsValid() && ph.CIDR.Contains(addrBy(ph, p)) {
					return "" // the cidr's address without a class: the default
				}
				continue // not listed: on to the next rules
			}
			if len(c.Classes) > 0 {
				if r := blockOf(c.Classes, p); r != "" {
					return r
				}
				return c.Default
			}
			return c.Name
		case len(c.Classes) > 0:
			if r := blockOf(c.Classes, p); r != "" {
				return r
			}
		}
	}
	return ""
}

func addrBy(ph *policy.PerHost, p packet) netip.Addr {
	if ph.By == "src" {
		return p.src
	}
	return p.dst
}

// hostOf finds the host class of per_host class c for p's address.
func hostOf(c *policy.Class, p packet) (string, bool) {
	ph := c.PerHost
	a := addrBy(ph, p)
	best, name := -1, ""
	for _, e := range ph.Entries {
		for _, pr := range e.Addrs {
			if pr.Contains(a) && pr.Bits() > best {
				best, name = pr.Bits(), e.ClassName
			}
		}
	}
	if best >= 0 {
		return name, true
	}
	if ph.CIDR.IsValid() && ph.CIDR.Contains(a) && ph.Prefix >= ph.CIDR.Bits() {
		h, _ := a.Prefix(ph.Prefix)
		if a.Is4() && ph.Prefix == 32 && ph.CIDR.Bits() <= 30 {
			first, last := ph.CIDR.Masked().Addr(), lastAddr(ph.CIDR)
			if a == first || a == last {
				return "", false // network and broadcast have no class
			}
		}
		return plan.HostClassName(c, h), true
	}
	return "", false
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
