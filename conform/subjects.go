package conform

import (
	"net/netip"

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
	// Misplaced names the flows the kernel put in another class than
	// the model said (left out of the run; the subject is driven by the
	// others).
	Misplaced []string `json:"misplaced,omitempty"`
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

// Flow is the 5-tuple (and DSCP and firewall mark) of one flow of a
// subject.
type Flow struct {
	// Proto is how the flow is sent: "tcp" a greedy TCP connection,
	// "udp" datagrams at a rate, "ack" small pure TCP ACKs at a rate
	// (what a tcp_ack rule matches: a download's ACKs, sent raw), "syn"
	// bare TCP SYNs at a rate (what a tcp_syn rule matches, sent raw).
	Proto string         `json:"proto"`
	Src   netip.AddrPort `json:"src"`
	Dst   netip.AddrPort `json:"dst"`
	DSCP  uint8          `json:"dscp,omitempty"`
	// Mark is the firewall mark the bed's gateway sets on the flow's
	// packets (nftables, as a gateway's firewall would), 0 for none.
	Mark uint32 `json:"mark,omitempty"`
}

// Greedy reports whether the flow takes what it is given (TCP), not a
// rate it is sent at.
func (f Flow) Greedy() bool { return f.Proto == "tcp" }

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
	// A host's address is its own: no other subject's flow may use it
	// at the other end (the bed routes an address to one side).
	for _, s := range out {
		if s.host {
			nb.use(s.hostAddr(), s.class.PerHost.By == "src")
		}
	}
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

// flowUDP is the subject's UDP flow, as a list of none or one.
func (s *Subject) flowUDP() []Flow {
	if s.UDP == nil {
		return nil
	}
	return []Flow{*s.UDP}
}

// rated is the subject's flow that a demand sent at a rate of proto
// uses: its UDP flow, or its pure ACK flow; nil for none.
func (s *Subject) rated(proto string) *Flow {
	switch {
	case proto == "udp":
		return s.UDP
	case len(s.Flows) > 0 && s.Flows[0].Proto == proto:
		return &s.Flows[0]
	}
	return nil
}
