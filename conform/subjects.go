package conform

import (
	"fmt"
	"net/netip"
	"sort"

	"sluice/plan"
	"sluice/policy"
	"sluice/units"
)

// Subject is one thing a conformance run drives and measures: a leaf
// class, or one host of a per_host class (a cidr's address or a
// hosts_file line).
type Subject struct {
	// Name is the class's name as plans, records and counters have it
	// (a host's is its per_host class's name, a slash, the host).
	Name string `json:"name"`
	// Rate, Ceil (bits/s), Prio and Weight are what the policy gives it.
	Rate   float64 `json:"rate_bps"`
	Ceil   float64 `json:"ceil_bps"`
	Prio   int     `json:"prio"`
	Weight float64 `json:"weight"`
	// Flows are packets that land in the class, one per parallel flow
	// the run may open (each its own 5-tuple), and NotDriven says why
	// there are none.
	Flows     []Flow `json:"flows,omitempty"`
	NotDriven string `json:"not_driven,omitempty"`
	// UDP is a UDP flow that lands in the class, nil where its rules
	// want another protocol.
	UDP *Flow `json:"udp,omitempty"`
	// Shard is the host's shard (from 1) in a sharded tree, 0 otherwise.
	Shard int `json:"shard,omitempty"`

	class      *policy.Class // the leaf class, or a host's per_host class
	parent     *policy.Class // a host's parent class (its per_host class, or its line's parent column)
	host       bool
	entry      *policy.HostEntry // a hosts_file host's line
	hostPrefix netip.Prefix      // a cidr host's prefix
}

// Flow is the 5-tuple (and DSCP) of one flow of a subject.
type Flow struct {
	Proto string         `json:"proto"` // tcp or udp
	Src   netip.AddrPort `json:"src"`
	Dst   netip.AddrPort `json:"dst"`
	DSCP  uint8          `json:"dscp,omitempty"`
}

// maxFlows is the most parallel flows a subject is given (the heavy
// cells' 8).
const maxFlows = 8

// subjects lists the subjects of tree t, at most hosts hosts of each
// per_host class, in policy order, each with its flows or the reason it
// has none.
func subjects(t *policy.Tree, hosts int) []*Subject {
	var out []*Subject
	nb := newNeutral(t)
	var walk func(cs []*policy.Class)
	walk = func(cs []*policy.Class) {
		for _, c := range cs {
			switch {
			case c.PerHost != nil:
				out = append(out, hostSubjects(t, c, hosts)...)
			case c.IsLeaf():
				out = append(out, &Subject{Name: c.Name, class: c})
			}
			walk(c.Classes)
		}
	}
	walk(t.Classes)
	for _, s := range out {
		if s.host {
			s.Prio = hostPrio(s.class)
		} else {
			s.Rate, s.Ceil, s.Prio, s.Weight = bits(s.class.RateBps), classCeil(s.class), s.class.Prio, s.class.ShareWeight()
		}
		s.Flows, s.NotDriven = solve(t, s, nb, 0)
		if u, _ := solve(t, s, nb, protoUDP); len(u) > 0 {
			s.UDP = &u[0]
		}
	}
	return out
}

func bits(r units.Rate) float64 { return r.BitsFloat() }

// classCeil is the most class c can carry: its ceil, or less where its
// policer drops above a rate (a police block drops what exceeds at once:
// red beyond pir for RFC 2698, beyond cir for RFC 2697, and yellow
// beyond cir). Without it the reference hands a policed class what its
// ceil allows, and the others' shares are judged against a policer's.
func classCeil(c *policy.Class) float64 {
	ceil := bits(c.CeilBps)
	p := c.Police
	if p == nil {
		return ceil
	}
	switch {
	case p.Actions[1].Kind == "drop" || p.Actions[2].Kind == "drop" && !p.TwoRate():
		ceil = min(ceil, bits(p.CIRBps))
	case p.Actions[2].Kind == "drop":
		ceil = min(ceil, bits(p.PIRBps))
	}
	return ceil
}

func hostPrio(c *policy.Class) int {
	if ph := c.PerHost; ph != nil && ph.Prio != nil {
		return *ph.Prio
	}
	return c.Prio
}

// hostSubjects picks up to n hosts of per_host class c: its hosts_file
// lines in file order, then its cidr's hosts from the first.
func hostSubjects(t *policy.Tree, c *policy.Class, n int) []*Subject {
	ph := c.PerHost
	var out []*Subject
	for _, e := range ph.Entries {
		if len(out) == n {
			return out
		}
		if e.Owner != c || len(e.Addrs) == 0 {
			continue
		}
		out = append(out, &Subject{Name: e.ClassName, class: c, parent: e.ParentCls, host: true, entry: e,
			Rate: bits(e.RateBps), Ceil: bits(e.CeilBps), Weight: float64(e.RateBps)})
	}
	if !ph.CIDR.IsValid() {
		return out
	}
	taken := map[string]bool{}
	for _, s := range out {
		taken[s.Name] = true
	}
	// Walk the cidr without listing it (a /16 of IPv6 /64s is large).
	a := ph.CIDR.Masked().Addr()
	for i := 0; len(out) < n && i < ph.HostCount()+2 && ph.CIDR.Contains(a); i++ {
		h := netip.PrefixFrom(a, ph.Prefix)
		next := addAt(a, ph.Prefix)
		if hostOK(ph, h) {
			name := plan.HostClassName(c, h)
			if !taken[name] {
				out = append(out, &Subject{Name: name, class: c, parent: c, host: true, hostPrefix: h,
					Rate: bits(ph.RateBps), Ceil: bits(ph.CeilBps), Weight: float64(ph.RateBps)})
			}
		}
		if !next.IsValid() {
			break
		}
		a = next
	}
	return out
}

// hostOK leaves out an IPv4 /32 host's network and broadcast addresses.
func hostOK(ph *policy.PerHost, h netip.Prefix) bool {
	if h.Addr().Is4() && ph.Prefix == 32 && ph.CIDR.Bits() <= 30 {
		return h.Addr() != ph.CIDR.Masked().Addr() && h.Addr() != lastAddr(ph.CIDR)
	}
	return true
}

// addAt adds one at prefix length bits of a (the next host), invalid on
// overflow.
func addAt(a netip.Addr, bits int) netip.Addr {
	b := a.AsSlice()
	i := (bits - 1) / 8
	inc := byte(1) << (7 - uint((bits-1)%8))
	for ; i >= 0; i-- {
		old := b[i]
		b[i] += inc
		if b[i] > old {
			r, _ := netip.AddrFromSlice(b)
			return r
		}
		inc = 1
	}
	return netip.Addr{}
}

// hostAddr is an address of a host subject: the cidr host's (its first
// address for a shorter prefix), or the first of its hosts_file line.
func (s *Subject) hostAddr() netip.Addr {
	if s.entry != nil {
		return firstAddr(s.entry.Addrs[0])
	}
	return firstAddr(s.hostPrefix)
}

// firstAddr is a usable address of p: the address itself for a full
// length prefix, else the one after the network's.
func firstAddr(p netip.Prefix) netip.Addr {
	if !p.IsValid() {
		return netip.Addr{}
	}
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr()
	}
	return p.Masked().Addr().Next()
}

// neutral hands out addresses and ports that no rule of a tree names, so
// that a flow built for one class matches nothing else by accident.
type neutral struct {
	prefixes   []netip.Prefix
	ports      []policy.PortRange
	next4      netip.Addr
	next6      netip.Addr
	nextPort   uint16
	nextSource uint16
}

func newNeutral(t *policy.Tree) *neutral {
	n := &neutral{next4: netip.MustParseAddr("198.18.0.1"), next6: netip.MustParseAddr("2001:db8:5ee::1"),
		nextPort: 20000, nextSource: 40000}
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
							n.prefixes = append(n.prefixes, p)
						}
					}
				}
				n.ports = append(n.ports, m.Sport...)
				n.ports = append(n.ports, m.Dport...)
			}
			if ph := c.PerHost; ph != nil {
				if ph.CIDR.IsValid() {
					n.prefixes = append(n.prefixes, ph.CIDR)
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
		if !n.named(a) {
			return a
		}
	}
	return netip.Addr{}
}

// port is a fresh port no rule names, from base upward.
func (n *neutral) port(next *uint16) uint16 {
	for {
		p := *next
		*next++
		if !inRanges(n.ports, p) {
			return p
		}
	}
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
				return flows, ""
			}
			if why == "" {
				why = reason
			}
		}
	}
	return nil, why
}

// solveEntry builds flows satisfying own (and gate, if any), then keeps
// those the tree's first match sends to s.
func solveEntry(t *policy.Tree, s *Subject, own, gate *policy.Match, nb *neutral, only uint8) ([]Flow, string) {
	ms := []*policy.Match{own}
	if gate != nil {
		ms = append(ms, gate)
	}
	for _, m := range ms {
		switch {
		case m.TCPAck:
			return nil, "its rules match only small pure TCP ACKs, which no bulk flow sends"
		case m.Mark != nil && m.Mark.Val&m.Mark.Mask != 0:
			return nil, "its rules match a firewall mark, which only the gateway's firewall sets"
		}
	}
	proto, ok := pickProto(ms, only)
	if !ok {
		return nil, "its rules match no TCP or UDP packet (only " + protoNames(ms) + ")"
	}
	v6 := wantV6(ms)
	var fixedSrc, fixedDst netip.Addr
	if s.host {
		a := s.hostAddr()
		v6 = a.Is6()
		if s.class.PerHost.By == "src" {
			fixedSrc = a
		} else {
			fixedDst = a
		}
	}
	src := pickAddr(ms, true, v6, fixedSrc, nb)
	dst := pickAddr(ms, false, v6, fixedDst, nb)
	if !src.IsValid() || !dst.IsValid() {
		return nil, "no address satisfies its rules"
	}
	dscp, ok := pickDSCP(ms)
	if !ok {
		return nil, "no DSCP satisfies its rules"
	}
	sports := portsFor(ms, true, nb)
	dports := portsFor(ms, false, nb)
	var flows []Flow
	seen := map[[2]uint16]bool{}
	for i := 0; len(flows) < maxFlows && i < 4*maxFlows; i++ {
		sp, dp := sports[i%len(sports)], dports[(i/len(sports))%len(dports)]
		if seen[[2]uint16{sp, dp}] {
			continue
		}
		seen[[2]uint16{sp, dp}] = true
		p := packet{src: src, dst: dst, proto: proto, sport: sp, dport: dp, dscp: dscp}
		if got := classOf(t, p); got != s.Name {
			if len(flows) == 0 && i == 0 {
				if got == "" {
					got = "none"
				}
				return nil, fmt.Sprintf("a packet built from its rules (%s) lands in class %s first", p, got)
			}
			continue
		}
		flows = append(flows, Flow{Proto: protoName(proto), Src: netip.AddrPortFrom(src, sp), Dst: netip.AddrPortFrom(dst, dp), DSCP: dscp})
	}
	return flows, ""
}

func (p packet) String() string {
	return fmt.Sprintf("%s %s:%d > %s:%d dscp %d", protoName(p.proto), p.src, p.sport, p.dst, p.dport, p.dscp)
}

func protoName(p uint8) string {
	if p == protoUDP {
		return "udp"
	}
	return "tcp"
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

// pickProto prefers TCP, then UDP, among what every entry allows (only
// only, if not 0).
func pickProto(ms []*policy.Match, only uint8) (uint8, bool) {
	for _, p := range []uint8{protoTCP, protoUDP} {
		if only != 0 && p != only {
			continue
		}
		ok := true
		for _, m := range ms {
			if len(m.Proto) > 0 && !has(m.Proto, p) {
				ok = false
			}
		}
		if ok {
			return p, true
		}
	}
	return 0, false
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

// pickAddr chooses the source (or destination) address: fixed if given,
// else the first usable address of the first prefix an entry requires
// that every entry allows, else a neutral one.
func pickAddr(ms []*policy.Match, src, v6 bool, fixed netip.Addr, nb *neutral) netip.Addr {
	lists := func(m *policy.Match) (in, out []netip.Prefix) {
		if src {
			return m.Src, m.NotSrc
		}
		return m.Dst, m.NotDst
	}
	ok := func(a netip.Addr) bool {
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
			return fixed
		}
		return netip.Addr{}
	}
	for _, m := range ms {
		in, _ := lists(m)
		for _, p := range in {
			if p.Bits() == 0 {
				continue // any address of the family: a neutral one below
			}
			if a := firstAddr(p); a.Is6() == v6 && ok(a) {
				return a
			}
		}
	}
	for i := 0; i < 64; i++ {
		if a := nb.addr(v6); a.IsValid() && ok(a) {
			return a
		}
	}
	return netip.Addr{}
}

func containsAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// pickDSCP chooses a DSCP every entry allows (0 when none asks).
func pickDSCP(ms []*policy.Match) (uint8, bool) {
	var cands []uint8
	for _, m := range ms {
		cands = append(cands, m.DSCP...)
	}
	cands = append(cands, 0)
	for d := uint8(1); d < 64; d++ {
		cands = append(cands, d)
	}
	for _, d := range cands {
		good := true
		for _, m := range ms {
			if len(m.DSCP) > 0 && !has(m.DSCP, d) || m.TOS != nil && (d<<2)&m.TOS.Mask != m.TOS.Val&m.TOS.Mask {
				good = false
			}
		}
		if good {
			return d, true
		}
	}
	return 0, false
}

// portsFor lists the ports flows may use for the source (or destination)
// port: those the entries require (up to maxFlows of the first range
// every entry allows), else neutral ones.
func portsFor(ms []*policy.Match, src bool, nb *neutral) []uint16 {
	var want []policy.PortRange
	for _, m := range ms {
		r := m.Dport
		if src {
			r = m.Sport
		}
		if len(r) > 0 {
			want = r
			break
		}
	}
	allowed := func(p uint16) bool {
		for _, m := range ms {
			r := m.Dport
			if src {
				r = m.Sport
			}
			if len(r) > 0 && !inRanges(r, p) {
				return false
			}
		}
		return true
	}
	var out []uint16
	if len(want) > 0 {
		sort.Slice(want, func(i, j int) bool { return want[i].Lo < want[j].Lo })
		for _, r := range want {
			for p := int(r.Lo); p <= int(r.Hi) && len(out) < maxFlows; p++ {
				if p > 0 && allowed(uint16(p)) {
					out = append(out, uint16(p))
				}
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
