package conform

import (
	"fmt"
	"net/netip"
	"sort"

	"sluice/policy"
)

// How a subject's flows are found: every field a rule can name
// (protocol, addresses of either family, ports, DSCP, mark, a pure
// ACK) gets a short list of candidates that satisfy the subject's own
// entry and the gate above it, and the search keeps the first packet the
// tree's first-match order (classOf) sends to the subject. Candidates
// come from the rules themselves, addresses just beside every prefix the
// tree names (a per-host class inside a LAN rule's prefix), and neutral
// addresses and ports no rule names; so a class reached only from one
// side of an earlier rule (a LAN-to-LAN class after `not_src: LAN`) is
// found on the side where it is reachable.

// maxTries bounds the packets tried for one entry of one subject.
const maxTries = 4000

// neutral hands out addresses and ports that no rule of a tree names, so
// that a flow built for one class matches nothing else by accident, and
// remembers at which end each address is used (the bed routes an
// address to one side only).
type neutral struct {
	prefixes   []netip.Prefix
	ports      []policy.PortRange
	next4      netip.Addr
	next6      netip.Addr
	nextPort   uint16
	nextSource uint16
	// side is where an address is used: true at the source.
	side map[netip.Addr]bool
}

func newNeutral(t *policy.Tree) *neutral {
	n := &neutral{next4: netip.MustParseAddr("198.18.0.1"), next6: netip.MustParseAddr("2001:db8:5ee::1"),
		nextPort: 20000, nextSource: 40000, side: map[netip.Addr]bool{}}
	var walk func(cs []*policy.Class)
	walk = func(cs []*policy.Class) {
		for _, c := range cs {
			for _, m := range c.Match {
				for _, l := range [][]netip.Prefix{m.Src, m.Dst, m.NotSrc, m.NotDst} {
					for _, p := range l {
						// A /0 names a family, not an address: every
						// address would be named (an import's
						// `src: 0.0.0.0/0`, "IPv4 alone").
						if p.Bits() > 0 {
							n.prefixes = append(n.prefixes, p.Masked())
						}
					}
				}
				n.ports = append(n.ports, m.Sport...)
				n.ports = append(n.ports, m.Dport...)
			}
			if ph := c.PerHost; ph != nil {
				if ph.CIDR.IsValid() {
					n.prefixes = append(n.prefixes, ph.CIDR.Masked())
				}
				for _, e := range ph.Entries {
					n.prefixes = append(n.prefixes, e.Addrs...)
				}
			}
			walk(c.Classes)
		}
	}
	walk(t.Classes)
	return n
}

func (n *neutral) named(a netip.Addr) bool {
	for _, p := range n.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// use records that a is used at the source (src) or the destination.
func (n *neutral) use(a netip.Addr, src bool) {
	if a.IsValid() {
		n.side[a] = src
	}
}

// free reports whether a may be used at the source (src) or the
// destination: it is not used at the other end.
func (n *neutral) free(a netip.Addr, src bool) bool {
	s, ok := n.side[a]
	return !ok || s == src
}

// addr is a fresh address of the family of v6 that no rule names.
func (n *neutral) addr(v6 bool) netip.Addr {
	for i := 0; i < 1<<16; i++ {
		a := n.next4
		if v6 {
			a, n.next6 = n.next6, n.next6.Next()
		} else {
			n.next4 = n.next4.Next()
			if n.next4.As4()[3] == 255 {
				n.next4 = n.next4.Next().Next() // no .255 or .0
			}
		}
		if _, used := n.side[a]; !used && !n.named(a) {
			return a
		}
	}
	return netip.Addr{}
}

// port is a fresh port no rule names, from base upward.
func (n *neutral) port(next *uint16) uint16 {
	// From next on, wrapping past 65535 to 1 (0 is no port): rules
	// that name most ports (sport: 1024-65535) leave the low ones.
	first := *next
	for i := 0; i < 1<<16; i++ {
		p := *next
		*next++
		if *next == 0 {
			*next = 1
		}
		if p != 0 && !inRanges(n.ports, p) {
			return p
		}
	}
	return first // every port is named: the first, named or not
}

// solve finds flows whose packets land in s's class (by the model of
// classOf), trying each of the class's match entries in turn; of
// protocol only if not 0, else TCP where the rules allow it.
func solve(t *policy.Tree, s *Subject, nb *neutral, only uint8) ([]Flow, string) {
	var gates []*policy.Match // the entries of the gates above s, any of which must match
	for c := s.class.Parent; c != nil; c = c.Parent {
		if len(c.Match) > 0 && len(c.Classes) > 0 {
			gates = append(gates, c.Match...)
			break // the nearest gate sorts; its own entry already passed
		}
	}
	entries := s.class.Match
	if len(entries) == 0 {
		entries = []*policy.Match{{}}
	}
	var why string
	for _, own := range entries {
		for _, g := range append([]*policy.Match{nil}, gates...) {
			if g == nil && len(gates) > 0 {
				continue
			}
			flows, reason := solveEntry(t, s, own, g, nb, only)
			if len(flows) > 0 {
				for _, f := range flows {
					nb.use(f.Src.Addr(), true)
					nb.use(f.Dst.Addr(), false)
				}
				return flows, ""
			}
			if why == "" {
				why = reason
			}
		}
	}
	return nil, why
}

// kind is how a packet of a flow is sent: its protocol, and for TCP
// whether it is a small pure ACK or a bare SYN.
type kind struct {
	proto uint8
	ack   bool
	syn   bool
}

func (k kind) name() string {
	switch {
	case k.ack:
		return "ack"
	case k.syn:
		return "syn"
	case k.proto == protoUDP:
		return "udp"
	}
	return "tcp"
}

// solveEntry searches packets satisfying own (and gate, if any) for one
// the tree's first match sends to s, then builds flows around it.
func solveEntry(t *policy.Tree, s *Subject, own, gate *policy.Match, nb *neutral, only uint8) ([]Flow, string) {
	ms := []*policy.Match{own}
	if gate != nil {
		ms = append(ms, gate)
	}
	kinds := flowKinds(ms, only)
	if len(kinds) == 0 {
		if only == protoUDP {
			return nil, "its rules match no UDP packet"
		}
		return nil, "its rules match no TCP or UDP packet (only " + protoNames(ms) + ")"
	}
	mark, ok := pickMark(ms)
	if !ok {
		return nil, "no firewall mark satisfies its rules"
	}
	if mark != 0 && t.Dir == policy.Ingress {
		return nil, "its rules match a firewall mark, which nothing sets on an arriving packet before the shaper sees it (only a tc action on the device could)"
	}
	var fixedSrc, fixedDst netip.Addr
	fams := []bool{false, true}
	if wantV6(ms) {
		fams = []bool{true, false}
	}
	if s.host {
		a := s.hostAddr()
		fams = []bool{a.Is6()}
		if s.class.PerHost.By == "src" {
			fixedSrc = a
		} else {
			fixedDst = a
		}
	}
	dscps := dscpCands(ms)
	if len(dscps) == 0 {
		return nil, "no DSCP satisfies its rules"
	}
	why, tries := "", 0
	for _, k := range kinds {
		for _, v6 := range fams {
			srcs := addrCands(ms, true, v6, fixedSrc, nb)
			dsts := addrCands(ms, false, v6, fixedDst, nb)
			if len(srcs) == 0 || len(dsts) == 0 {
				if why == "" {
					why = "no " + family(v6) + " address satisfies its rules"
				}
				continue
			}
			sports, dports := portCands(ms, true, nb), portCands(ms, false, nb)
			if len(sports) == 0 || len(dports) == 0 {
				return nil, "no port satisfies its rules"
			}
			for _, src := range srcs {
				for _, dst := range dsts {
					if src == dst {
						continue
					}
					for _, dscp := range dscps {
						for _, sp := range sports[:min(3, len(sports))] {
							for _, dp := range dports[:min(3, len(dports))] {
								p := packet{src: src, dst: dst, proto: k.proto, sport: sp, dport: dp, dscp: dscp, mark: mark, ack: k.ack, syn: k.syn}
								got := classOf(t, p)
								if got == s.Name {
									return flowsAround(t, s, p, k, sports, dports), ""
								}
								if why == "" || tries == 0 {
									if got == "" {
										got = "none"
									}
									why = fmt.Sprintf("a packet built from its rules (%s) lands in class %s first", p, got)
								}
								if tries++; tries >= maxTries {
									return nil, why
								}
							}
						}
					}
				}
			}
		}
	}
	return nil, why
}

// flowsAround builds up to maxFlows flows like p (one for a flow sent at
// a rate), told apart by their ports, each landing in s's class.
func flowsAround(t *policy.Tree, s *Subject, p packet, k kind, sports, dports []uint16) []Flow {
	mk := func(p packet) Flow {
		return Flow{Proto: k.name(), Src: netip.AddrPortFrom(p.src, p.sport), Dst: netip.AddrPortFrom(p.dst, p.dport), DSCP: p.dscp, Mark: p.mark}
	}
	flows := []Flow{mk(p)}
	if k.proto != protoTCP || k.ack || k.syn {
		return flows
	}
	seen := map[[2]uint16]bool{{p.sport, p.dport}: true}
	for i := 0; len(flows) < maxFlows && i < 4*maxFlows; i++ {
		q := p
		q.sport, q.dport = sports[i%len(sports)], dports[(i/len(sports))%len(dports)]
		if seen[[2]uint16{q.sport, q.dport}] {
			continue
		}
		seen[[2]uint16{q.sport, q.dport}] = true
		if classOf(t, q) == s.Name {
			flows = append(flows, mk(q))
		}
	}
	return flows
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

func (p packet) String() string {
	s := fmt.Sprintf("%s %s:%d > %s:%d dscp %d", kind{p.proto, p.ack, p.syn}.name(), p.src, p.sport, p.dst, p.dport, p.dscp)
	if p.mark != 0 {
		s += fmt.Sprintf(" mark %#x", p.mark)
	}
	return s
}

func protoNames(ms []*policy.Match) string {
	var out string
	for _, m := range ms {
		for _, p := range m.Proto {
			if out != "" {
				out += ", "
			}
			out += fmt.Sprint("protocol ", p)
		}
	}
	return out
}

// flowKinds lists how the entries may be driven: TCP before UDP (a
// greedy sender is what a share is about), only only if not 0; small
// pure ACKs or bare SYNs where an entry asks for them.
func flowKinds(ms []*policy.Match, only uint8) []kind {
	ack, syn := false, false
	for _, m := range ms {
		ack = ack || m.TCPAck
		syn = syn || m.TCPSyn
	}
	if ack && syn {
		return nil // a gate's tcp_ack over a child's tcp_syn: no packet is both
	}
	var out []kind
	for _, p := range []uint8{protoTCP, protoUDP} {
		if only != 0 && p != only || (ack || syn) && p != protoTCP {
			continue
		}
		ok := true
		for _, m := range ms {
			if len(m.Proto) > 0 && !has(m.Proto, p) {
				ok = false
			}
		}
		if ok {
			out = append(out, kind{proto: p, ack: ack, syn: syn})
		}
	}
	return out
}

// pickMark is the mark every entry's mark rule allows (0 where none
// asks), false where two contradict.
func pickMark(ms []*policy.Match) (uint32, bool) {
	var v, set uint32
	for _, m := range ms {
		if m.Mark == nil {
			continue
		}
		want := m.Mark.Val & m.Mark.Mask
		if (v^want)&set&m.Mark.Mask != 0 {
			return 0, false
		}
		v |= want
		set |= m.Mark.Mask
	}
	return v, true
}

// wantV6 is true when the entries name IPv6 addresses (or icmpv6).
func wantV6(ms []*policy.Match) bool {
	for _, m := range ms {
		for _, l := range [][]netip.Prefix{m.Src, m.Dst} {
			for _, p := range l {
				return p.Addr().Is6()
			}
		}
	}
	for _, m := range ms {
		for _, l := range [][]netip.Prefix{m.NotSrc, m.NotDst} {
			for _, p := range l {
				return p.Addr().Is6()
			}
		}
	}
	return false
}

// maxAddrs bounds the candidates of one address.
const maxAddrs = 12

// addrCands lists source (or destination) addresses of the family of v6
// that every entry allows and the bed can route at that end: fixed if
// given; else addresses of the prefixes the entries require (first,
// middle, last, and beside every prefix the tree names inside them);
// else neutral ones, then addresses of the prefixes the tree names
// (where a gate's negation sends a packet only from inside them).
func addrCands(ms []*policy.Match, src, v6 bool, fixed netip.Addr, nb *neutral) []netip.Addr {
	lists := func(m *policy.Match) (in, out []netip.Prefix) {
		if src {
			return m.Src, m.NotSrc
		}
		return m.Dst, m.NotDst
	}
	ok := func(a netip.Addr) bool {
		if !a.IsValid() || a.Is6() != v6 || !routable(a) || !nb.free(a, src) {
			return false
		}
		for _, m := range ms {
			in, out := lists(m)
			if len(in) > 0 && !containsAny(in, a) || containsAny(out, a) {
				return false
			}
		}
		return true
	}
	if fixed.IsValid() {
		if ok(fixed) {
			return []netip.Addr{fixed}
		}
		return nil
	}
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	add := func(a netip.Addr) {
		if len(out) < maxAddrs && !seen[a] && ok(a) {
			seen[a] = true
			out = append(out, a)
		}
	}
	var required []netip.Prefix
	for _, m := range ms {
		in, _ := lists(m)
		for _, p := range in {
			if p.Addr().Is6() == v6 && p.Bits() > 0 {
				required = append(required, p.Masked())
			}
		}
	}
	for _, p := range required {
		for _, a := range inside(p) {
			add(a)
		}
		// Beside each narrower prefix the tree names in it: an earlier
		// class's subnet of this class's prefix.
		for _, q := range nb.prefixes {
			if q.Addr().Is6() == v6 && q.Bits() > p.Bits() && p.Overlaps(q) {
				add(q.Masked().Addr().Prev())
				add(lastAddr(q).Next())
			}
		}
	}
	if len(required) > 0 {
		return out
	}
	for i := 0; i < 2; i++ {
		add(nb.addr(v6))
	}
	for _, q := range nb.prefixes {
		if q.Addr().Is6() == v6 {
			for _, a := range inside(q) {
				add(a)
			}
		}
	}
	return out
}

// inside is a few usable addresses of p: its first, middle and last.
func inside(p netip.Prefix) []netip.Addr {
	first := firstAddr(p)
	last := lastAddr(p)
	if p.Addr().Is4() && p.Bits() <= 30 {
		last = last.Prev() // not the broadcast
	}
	out := []netip.Addr{first}
	if p.Bits() < p.Addr().BitLen()-1 {
		mid := addAt(p.Masked().Addr(), p.Bits()+1)
		if mid.IsValid() && mid != first {
			out = append(out, mid)
		}
	}
	if last.IsValid() && last != first {
		out = append(out, last)
	}
	return out
}

// routable reports whether the bed can give a to a namespace and route
// it: no loopback, multicast, link-local, unspecified or broadcast
// address.
func routable(a netip.Addr) bool {
	return a.IsValid() && !a.IsLoopback() && !a.IsMulticast() && !a.IsLinkLocalUnicast() && !a.IsUnspecified() &&
		a != netip.AddrFrom4([4]byte{255, 255, 255, 255}) && !(a.Is4() && a.As4()[0] == 0)
}

func containsAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// dscpCands lists DSCPs every entry allows: those they name, then 0,
// then others (at most four).
func dscpCands(ms []*policy.Match) []uint8 {
	var cands []uint8
	for _, m := range ms {
		cands = append(cands, m.DSCP...)
	}
	cands = append(cands, 0)
	for d := uint8(1); d < 64; d++ {
		cands = append(cands, d)
	}
	var out []uint8
	seen := map[uint8]bool{}
	for _, d := range cands {
		if seen[d] || len(out) == 4 {
			continue
		}
		seen[d] = true
		good := true
		for _, m := range ms {
			if len(m.DSCP) > 0 && !has(m.DSCP, d) || m.TOS != nil && (d<<2)&m.TOS.Mask != m.TOS.Val&m.TOS.Mask {
				good = false
			}
		}
		if good {
			out = append(out, d)
		}
	}
	return out
}

// portCands lists the ports flows may use for the source (or
// destination) port: of those the entries require (every entry allowing
// them), first those no other rule names, up to maxFlows; else neutral
// ones.
func portCands(ms []*policy.Match, src bool, nb *neutral) []uint16 {
	ranges := func(m *policy.Match) []policy.PortRange {
		if src {
			return m.Sport
		}
		return m.Dport
	}
	var want []policy.PortRange
	for _, m := range ms {
		if r := ranges(m); len(r) > 0 {
			want = append([]policy.PortRange(nil), r...)
			break
		}
	}
	allowed := func(p uint16) bool {
		for _, m := range ms {
			if r := ranges(m); len(r) > 0 && !inRanges(r, p) {
				return false
			}
		}
		return true
	}
	var out []uint16
	if len(want) > 0 {
		sort.Slice(want, func(i, j int) bool { return want[i].Lo < want[j].Lo })
		var named []uint16
		for _, r := range want {
			for p := int(r.Lo); p <= int(r.Hi) && len(out) < maxFlows; p++ {
				if p == 0 || !allowed(uint16(p)) {
					continue
				}
				if nb.namedPort(uint16(p), r) {
					if len(named) < maxFlows {
						named = append(named, uint16(p))
					}
					continue
				}
				out = append(out, uint16(p))
			}
		}
		for _, p := range named {
			if len(out) < maxFlows {
				out = append(out, p)
			}
		}
		return out
	}
	next := &nb.nextPort
	if src {
		next = &nb.nextSource
	}
	for len(out) < maxFlows {
		out = append(out, nb.port(next))
	}
	return out
}

// namedPort reports whether a rule other than the range own names p.
func (n *neutral) namedPort(p uint16, own policy.PortRange) bool {
	for _, r := range n.ports {
		if r != own && p >= r.Lo && p <= r.Hi {
			return true
		}
	}
	return false
}
