package plan

import "net/netip"

// subtract returns p minus every prefix in holes, as a list of disjoint
// prefixes covering exactly the remaining addresses (at most one prefix
// per bit of difference per hole). u32 cannot negate a key, so not_src
// and not_dst become this exact complement.
func subtract(p netip.Prefix, holes []netip.Prefix) []netip.Prefix {
	out := []netip.Prefix{p}
	for _, h := range holes {
		if h.Addr().Is4() != p.Addr().Is4() {
			continue
		}
		var next []netip.Prefix
		for _, q := range out {
			next = append(next, subtractOne(q, h)...)
		}
		out = next
	}
	return out
}

func subtractOne(p, h netip.Prefix) []netip.Prefix {
	switch {
	case !p.Overlaps(h):
		return []netip.Prefix{p}
	case h.Bits() <= p.Bits(): // h covers p
		return nil
	}
	// p strictly contains h: split p and keep the half without h.
	var out []netip.Prefix
	for cur := p; cur.Bits() < h.Bits(); {
		lo, hi := halves(cur)
		if lo.Contains(h.Addr()) {
			out = append(out, hi)
			cur = lo
		} else {
			out = append(out, lo)
			cur = hi
		}
	}
	return out
}

// halves splits a prefix into its two children.
func halves(p netip.Prefix) (lo, hi netip.Prefix) {
	bits := p.Bits() + 1
	lo = netip.PrefixFrom(p.Addr(), bits)
	b := p.Addr().AsSlice()
	i := p.Bits() / 8
	b[i] |= 0x80 >> uint(p.Bits()%8)
	a, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(a, bits)
}

// intersect keeps the parts of ps inside within.
func intersect(ps []netip.Prefix, within netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is4() != within.Addr().Is4() || !p.Overlaps(within) {
			continue
		}
		if p.Bits() >= within.Bits() {
			out = append(out, p)
		} else {
			out = append(out, within)
		}
	}
	return out
}

// universe is 0.0.0.0/0 or ::/0.
func universe(v4 bool) netip.Prefix {
	if v4 {
		return netip.MustParsePrefix("0.0.0.0/0")
	}
	return netip.MustParsePrefix("::/0")
}

// valueMask is one u32-style match: (x & Mask) == Val.
type valueMask struct{ Val, Mask uint16 }

// portMasks covers [lo, hi] exactly with aligned power-of-two blocks, the
// fewest value/mask pairs that do.
func portMasks(lo, hi uint16) []valueMask {
	var out []valueMask
	l, h := uint32(lo), uint32(hi)
	for l <= h {
		size := uint32(1)
		for l%(size*2) == 0 && l+size*2-1 <= h && size < 1<<16 {
			size *= 2
		}
		out = append(out, valueMask{Val: uint16(l), Mask: uint16(^(size - 1))})
		l += size
	}
	return out
}
