package migrate

import (
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sluice/tc"
)

// Live is what `sluice import tc` reads: the device's snapshot and, when
// its ingress is redirected to an ifb, the ifb's.
type Live struct {
	Dev     *tc.Snapshot
	Ingress *tc.Snapshot // the ifb's, or nil
	// IfbName is the ifb the ingress is redirected to ("" if none).
	IfbName string
}

// TC imports a device's live HTB tree, leaves and u32 filters (what a
// hand-written tc script built) as the policy that reproduces it.
func TC(live *Live, opt Options) (*Draft, error) {
	dev := live.Dev.Dev
	d := &Draft{Tool: "tc (the live device " + dev + ")"}
	at := At{File: "dev " + dev}
	ifc := &Interface{At: at, Name: dev}
	d.Interfaces = []*Interface{ifc}
	t, err := tcTree(&d.Report, live.Dev, at)
	if err != nil {
		return nil, err
	}
	ifc.Egress = t
	// The ingress hook: a redirect of everything to an ifb is sluice's
	// own ingress; anything else there is refused at its filter.
	for parent, fs := range live.Dev.Filters {
		if parent != tc.MakeHandle(0xffff, 0) && parent != tc.HandleIngressHook {
			continue
		}
		for _, f := range fs {
			if f.Handle == 0 || f.U32 != nil && f.U32.Divisor > 0 {
				continue
			}
			fat := filterAt(dev, f)
			switch {
			case f.U32 == nil:
				d.Report.Refuse(fat, f.Kind+" filter on the ingress hook", "only a u32 redirect of every packet to an ifb imports (this filter would still run before sluice's ingress redirect)")
			case f.U32.RedirectDev != "" && f.U32.RedirectDev == live.IfbName && matchesAll(f):
				r := &d.Report
				r.Exact(fat, "redirect to "+live.IfbName, "the ingress tree, on sluice's own ifb (ifb-%s); this redirect (prio %d) would run before sluice's: `apply --force` removes it, and %s is left as it is, with nothing sent to it", dev, f.Prio, live.IfbName)
			default:
				d.Report.Refuse(fat, "ingress filter", "only a redirect of every packet to an ifb imports (policers and partial redirects do not yet)")
			}
		}
	}
	if live.Ingress != nil {
		it, err := tcTree(&d.Report, live.Ingress, At{File: "dev " + live.IfbName})
		if err != nil {
			return nil, err
		}
		ifc.Ingress = it
	}
	if ifc.Egress == nil && ifc.Ingress == nil {
		if d.Report.Refusals() != nil {
			return d, nil // the report says what could not be read
		}
		return nil, fmt.Errorf("%s: no HTB tree (root qdisc) and no ingress tree: nothing to import", dev)
	}
	d.settle(at)
	return d, nil
}

func filterAt(dev string, f *tc.Filter) At {
	return At{File: fmt.Sprintf("dev %s filter parent %s pref %d handle %s", dev, f.Parent, f.Prio, u32Handle(f.Raw))}
}

func u32Handle(h uint32) string {
	return fmt.Sprintf("%x:%x:%x", h>>20, (h>>12)&0xff, h&0xfff)
}

// matchesAll: a u32 node with no key but "match u32 0 0".
func matchesAll(f *tc.Filter) bool {
	if f.U32.Sel == nil {
		return true
	}
	for _, k := range f.U32.Sel.Keys {
		if k.Mask != 0 {
			return false
		}
	}
	return true
}

type tcNode struct {
	c        *tc.Class
	children []*tcNode
	draft    *Class
	filters  []*tc.Filter // inner filters (attached at this class)
	first    int          // the position of the first filter sending packets here
}

// tcTree imports one device's HTB tree (nil if the device has no root
// qdisc).
func tcTree(r *Report, s *tc.Snapshot, at At) (*Tree, error) {
	var root *tc.Qdisc
	leaves := map[tc.Handle]*tc.Qdisc{}
	for _, q := range s.Qdiscs {
		switch {
		case q.Parent == tc.HandleRoot:
			root = q
		case q.Parent != tc.HandleIngress && q.Parent.Minor() != 0:
			leaves[q.Parent] = q
		}
	}
	if root == nil || root.Kind == "noqueue" || root.Kind == "pfifo_fast" || root.Kind == "mq" && len(s.Classes) == 0 {
		return nil, nil
	}
	if root.Kind != "htb" {
		r.Refuse(at, "root qdisc "+root.Kind, "only HTB trees import (a tbf, prio, hfsc or cake root does not yet)")
		return nil, nil
	}
	if root.Stab != nil {
		r.Approx(at, "size table", "the root's stab (overhead %d) is not read yet: set overhead and linklayer by hand", root.Stab.Overhead)
	}
	nodes := map[tc.Handle]*tcNode{}
	for _, c := range s.Classes {
		nodes[c.Handle] = &tcNode{c: c, first: 1 << 30}
	}
	var tops []*tcNode
	for _, c := range s.Classes {
		n := nodes[c.Handle]
		if p := nodes[c.Parent]; p != nil {
			p.children = append(p.children, n)
		} else {
			tops = append(tops, n)
		}
	}
	// Filter order: the kernel tries prios in order and a prio's nodes in
	// order; sluice tries classes in file order. Siblings are ordered by
	// the first filter that sends packets into their subtree.
	pos := 0
	var mark func(h tc.Handle, p int)
	mark = func(h tc.Handle, p int) {
		for n := nodes[h]; n != nil; n = nodes[n.c.Parent] {
			n.first = min(n.first, p)
		}
	}
	rootFilters := s.Filters[root.Handle]
	for _, f := range rootFilters {
		if id := f.ClassID(); id != 0 {
			mark(id, pos)
			pos++
		}
	}
	for h, fs := range s.Filters {
		if n := nodes[h]; n != nil {
			n.filters = fs
			for _, f := range fs {
				if id := f.ClassID(); id != 0 {
					mark(id, pos)
					pos++
				}
			}
		}
	}
	var order func(ns []*tcNode)
	order = func(ns []*tcNode) {
		sort.SliceStable(ns, func(i, j int) bool {
			if ns[i].first != ns[j].first {
				return ns[i].first < ns[j].first
			}
			return ns[i].c.Handle < ns[j].c.Handle
		})
		for _, n := range ns {
			order(n.children)
		}
	}
	order(tops)

	taken := map[string]bool{}
	defaultBursts := 0
	var build func(n *tcNode) *Class
	build = func(n *tcNode) *Class {
		c := n.c
		cl := &Class{At: at, Origin: c.Handle.String(),
			Name:     uniqueName(fmt.Sprintf("class-%x", c.Handle.Minor()), taken),
			rateBits: c.Rate.BitsFloat(), ceilBits: c.Ceil.BitsFloat()}
		cl.Rate, cl.Ceil = bitRate(cl.rateBits), bitRate(cl.ceilBits)
		if c.Prio != 0 && len(n.children) == 0 {
			// HTB never reads an inner class's prio.
			cl.Prio = intp(int(c.Prio))
		}
		// tc's own burst is one MTU (1600 bytes, a byte either way from
		// the kernel's ticks): left to sluice, whose bursts carry the
		// rate where one MTU undershoots it (docs/policy.md).
		tcDefault := func(b uint32) bool { return b >= 1598 && b <= 1602 }
		if !tcDefault(c.Burst) {
			cl.Burst = byteSize(uint64(c.Burst))
		}
		if !tcDefault(c.Cburst) {
			cl.Cburst = byteSize(uint64(c.Cburst))
		}
		if tcDefault(c.Burst) || tcDefault(c.Cburst) {
			defaultBursts++
		}
		n.draft = cl
		for _, ch := range n.children {
			cl.Classes = append(cl.Classes, build(ch))
		}
		if len(n.children) == 0 {
			tcLeaf(r, cl, leaves[c.Handle])
		}
		return cl
	}
	if len(tops) == 0 {
		r.Refuse(at, "root qdisc htb", "the tree has no classes")
		return nil, nil
	}
	t := &Tree{At: at}
	var top []*Class
	for _, n := range tops {
		top = append(top, build(n))
	}
	if defaultBursts > 0 {
		r.Approx(at, "burst 1600b", "%d class(es) had tc's default burst (one MTU): sluice sizes theirs (1 ms of the rate, at least two frames), which holds the rate where one MTU undershoots it", defaultBursts)
	}
	rootsToTree(r, t, at, top, "class "+tops[0].c.Handle.String())
	// Filters: each u32 node sending packets to a class becomes an entry
	// of that class's match list.
	var catchAll *tcNode // the class a final matchall sends the rest to
	addFilters := func(fs []*tc.Filter, scope string) {
		for i, f := range fs {
			if f.Handle == 0 || f.Kind == "" {
				continue
			}
			fat := filterAt(s.Dev, f)
			if f.FW != nil || f.Matchall != nil || f.Flower != nil {
				last := !slices.ContainsFunc(fs[i+1:], func(g *tc.Filter) bool { return g.ClassID() != 0 })
				if n := tcOtherFilter(r, fat, f, nodes, scope == "at the root" && last); n != nil {
					catchAll = n
				}
				continue
			}
			if f.Kind != "u32" || f.U32 == nil {
				r.Refuse(fat, f.Kind+" filter", "only u32, fw, flower and matchall filters import (basic, bpf and route do not yet)")
				continue
			}
			u := f.U32
			switch {
			case u.Divisor > 0:
				r.Refuse(fat, "u32 hash table", "hash tables and links are not read yet: a per-host table becomes a per_host class or a hosts_file by hand")
				continue
			case u.Link != 0:
				r.Refuse(fat, "u32 link", "links into hash tables are not read yet")
				continue
			case u.RedirectDev != "":
				r.Refuse(fat, "u32 action", "a filter with actions (%s) on the tree", u.RedirectDev)
				continue
			case u.ClassID == 0:
				r.Refuse(fat, "u32 node", "it sends packets nowhere (no classid)")
				continue
			}
			n := nodes[u.ClassID]
			if n == nil {
				r.Refuse(fat, "flowid "+u.ClassID.String(), "no such class")
				continue
			}
			m, err := u32Match(r, fat, f)
			if err != nil {
				r.Refuse(fat, "u32 match", "%v", err)
				continue
			}
			n.draft.Match = append(n.draft.Match, m)
			r.Exact(fat, "u32 match "+scope, "a rule of %s", n.draft.Name)
		}
	}
	addFilters(rootFilters, "at the root")
	for _, n := range nodes {
		if len(n.filters) > 0 {
			if len(n.children) == 0 {
				r.Refuse(filterAt(s.Dev, n.filters[0]), "filters on leaf class "+n.c.Handle.String(), "HTB never reads them")
				continue
			}
			addFilters(n.filters, "inside "+n.draft.Name)
		}
	}
	// Default.
	def := uint32(0)
	if root.HTB != nil {
		def = root.HTB.Default
	}
	dn := nodes[tc.MakeHandle(root.Handle.Major(), uint16(def))]
	switch {
	case catchAll != nil:
		t.Default = catchAll.draft.Name
		if dn != nil && dn != catchAll {
			r.Exact(at, fmt.Sprintf("default %x", def), "never used: the final matchall filter sends every packet no earlier filter took to %s", catchAll.draft.Name)
		}
	case dn != nil && len(dn.children) == 0 && !(len(tops) == 1 && dn == tops[0]):
		t.Default = dn.draft.Name
		r.Exact(at, fmt.Sprintf("default %x", def), "default: %s", dn.draft.Name)
	default:
		addUnclassified(r, t, at, taken, fmt.Sprintf("default %x", def), "traffic no filter sends to a class")
	}
	// Rules on inner classes reached from the root make them gates; an
	// inner class matched with no inner filters sends its packets to the
	// default class, which sluice's rules cannot say.
	for _, n := range nodes {
		if len(n.children) > 0 && len(n.draft.Match) > 0 && len(n.filters) == 0 {
			r.Refuse(n.draft.At, "filters to inner class "+n.c.Handle.String(), "it has no filters of its own: HTB sends those packets to the default class, which sluice's rules cannot say")
		}
	}
	tcOrderNotes(r, rootFilters, nodes)
	fitRates(r, at, t.rateBits(), t.Classes)
	return t, nil
}

// tcOrderNotes reports where class order cannot keep the kernel's filter
// order: a filter tried later by the kernel that sluice tries earlier.
func tcOrderNotes(r *Report, fs []*tc.Filter, nodes map[tc.Handle]*tcNode) {
	pos := map[*Class]int{}
	i := 0
	var walk func(c *Class)
	walk = func(c *Class) {
		pos[c] = i
		i++
		for _, ch := range c.Classes {
			walk(ch)
		}
	}
	for _, n := range nodes {
		if nodes[n.c.Parent] == nil {
			walk(n.draft)
		}
	}
	last := -1
	var lastClass *Class
	var lastProto uint16
	for _, f := range fs {
		if f.ClassID() == 0 || nodes[f.ClassID()] == nil || f.Matchall != nil && len(nodes[f.ClassID()].draft.Match) == 0 {
			continue // a final matchall became the default
		}
		c := nodes[f.ClassID()].draft
		// Filters of two families never see the same packet.
		otherFamily := f.Proto != tc.ProtoAll && lastProto != tc.ProtoAll && f.Proto != lastProto
		if p := pos[c]; p < last && c != lastClass && !otherFamily {
			r.Approx(filterAt(f.Dev, f), "filter order", "the kernel tries this filter (to %s) after one to %s, sluice tries %s's rules first: a packet both match changes class", c.Name, lastClass.Name, c.Name)
		} else {
			last, lastClass, lastProto = p, c, f.Proto
		}
	}
}

// tcOtherFilter reads an fw, flower or matchall filter into its
// class's rules.
// A matchall at the end of the root's filters that every protocol
// reaches is the tree's default instead (returned): rules would put
// its class ahead of every later class in sluice's order.
func tcOtherFilter(r *Report, at At, f *tc.Filter, nodes map[tc.Handle]*tcNode, final bool) *tcNode {
	id := f.ClassID()
	actions := f.FW != nil && f.FW.Actions || f.Matchall != nil && f.Matchall.Actions || f.Flower != nil && f.Flower.Actions
	switch {
	case actions:
		r.Refuse(at, f.Kind+" filter", "it has actions or a policer, which sluice does not import")
		return nil
	case id == 0 && f.FW != nil:
		r.Refuse(at, "fw filter", "no classid: the mark itself names the class (fw's old mode); give each mark a classid")
		return nil
	case f.Flower != nil && len(f.Flower.Unknown) > 0:
		r.Refuse(at, "flower filter", "keys sluice's rules have no field for: %s", strings.Join(f.Flower.Unknown, ", "))
		return nil
	case id == 0:
		r.Refuse(at, f.Kind+" filter", "no classid: it sends packets nowhere")
		return nil
	case nodes[id] == nil:
		r.Refuse(at, "flowid "+id.String(), "no such class")
		return nil
	}
	n := nodes[id]
	if f.Matchall != nil && final && f.Proto == tc.ProtoAll && len(n.children) == 0 {
		r.Exact(at, "matchall filter", "everything no earlier filter took goes to %s: the tree's default", n.draft.Name)
		return n
	}
	m := &Match{At: at}
	switch f.Proto {
	case 0x0800:
		m.Src = []string{"0.0.0.0/0"}
	case 0x86dd:
		m.Src = []string{"::/0"}
	case tc.ProtoAll:
	default:
		r.Refuse(at, f.Kind+" filter", "protocol 0x%04x: only ip, ipv6 and all classify", f.Proto)
		return nil
	}
	what := "matchall filter"
	if fl := f.Flower; fl != nil {
		what = "flower filter"
		if !flowerMatch(r, at, fl, m) {
			return nil
		}
	}
	if f.FW != nil {
		what = "fw filter"
		if f.FW.Mask == 0xffffffff {
			m.Mark = strconv.FormatUint(uint64(f.Handle), 10)
		} else {
			m.Mark = fmt.Sprintf("0x%x/0x%x", f.Handle, f.FW.Mask)
		}
	}
	if m.Mark == "" && len(m.Src)+len(m.Dst) == 0 && m.Proto == "" && m.TOS == "" && m.DSCP == "" {
		// Every packet, both families (sluice has no empty rule).
		n.draft.Match = append(n.draft.Match, &Match{At: at, Src: []string{"0.0.0.0/0"}})
		m.Src = []string{"::/0"}
	}
	n.draft.Match = append(n.draft.Match, m)
	r.Exact(at, what, "a rule of %s", n.draft.Name)
	return nil
}

// flowerMatch reads a flower filter's keys into m (whose Src already
// keeps the filter's protocol's family, if any).
func flowerMatch(r *Report, at At, fl *tc.Flower, m *Match) bool {
	if fl.EthType != 0 && fl.EthType != 0x0800 && fl.EthType != 0x86dd {
		r.Refuse(at, "flower filter", "eth_type 0x%04x: only ip and ipv6 classify", fl.EthType)
		return false
	}
	addr := func(p netip.Prefix) []string {
		if p.Bits() == p.Addr().BitLen() {
			return []string{p.Addr().String()}
		}
		return []string{p.String()}
	}
	if fl.Src.IsValid() {
		m.Src = addr(fl.Src)
	}
	if fl.Dst.IsValid() {
		m.Dst = addr(fl.Dst)
	}
	if fl.IPProto != nil {
		names := map[uint8]string{1: "icmp", 6: "tcp", 17: "udp", 47: "gre", 58: "icmpv6", 132: "sctp"}
		m.Proto = names[*fl.IPProto]
		if m.Proto == "" {
			m.Proto = strconv.Itoa(int(*fl.IPProto))
		}
	}
	for _, p := range []struct {
		k   *tc.Masked16
		out *[]string
	}{{fl.SrcPort, &m.Sport}, {fl.DstPort, &m.Dport}} {
		if p.k == nil {
			continue
		}
		ones, ok := leadingOnes16(p.k.Mask)
		if !ok {
			r.Refuse(at, "flower filter", "port mask 0x%04x is not a range", p.k.Mask)
			return false
		}
		lo := p.k.Val & p.k.Mask
		hi := lo | ^p.k.Mask
		*p.out = []string{strconv.Itoa(int(lo))}
		if ones < 16 {
			*p.out = []string{fmt.Sprintf("%d-%d", lo, hi)}
		}
	}
	if t := fl.TOS; t != nil {
		if t.Mask == 0xfc {
			m.DSCP = strconv.Itoa(int(t.Val >> 2))
		} else {
			m.TOS = fmt.Sprintf("0x%02x/0x%02x", t.Val&t.Mask, t.Mask)
		}
	}
	if (m.Proto != "" || len(m.Sport)+len(m.Dport) > 0) && fl.EthType != 0x0800 {
		r.Approx(at, "flower filter", "flower finds IPv6 transport fields behind extension headers; sluice's rules read them at offset 40, so such a packet falls to later rules")
	}
	if fl.Dst.IsValid() && !fl.Src.IsValid() {
		m.Src = nil // the address says the family
	}
	return true
}

// leadingOnes16 is a 16-bit mask's prefix length, and whether it is
// one.
func leadingOnes16(m uint16) (int, bool) {
	n := bits.LeadingZeros16(^m)
	return n, m<<n == 0
}

func tcLeaf(r *Report, cl *Class, q *tc.Qdisc) {
	if q == nil {
		cl.Leaf = "pfifo" // HTB's own when none is attached
		return
	}
	switch q.Kind {
	case "pfifo", "bfifo":
		cl.Leaf = q.Kind
		if q.Fifo != nil && q.Fifo.Limit > 0 {
			if q.Kind == "bfifo" {
				cl.Limit = byteSize(uint64(q.Fifo.Limit))
			} else {
				cl.Limit = strconv.Itoa(int(q.Fifo.Limit))
			}
		}
	case "sfq", "fq_codel", "cake", "fq":
		cl.Leaf = q.Kind
		r.Approx(cl.At, "leaf "+q.Kind, "its own settings are not read: sluice's defaults for %s", q.Kind)
	default:
		r.Refuse(cl.At, "leaf "+q.Kind, "sluice's leaves are fq_codel, sfq, fq, cake, pfifo and bfifo")
	}
}

// u32Match reads one u32 node's keys (IPv4 or IPv6 header fields at
// fixed offsets, u32's mark) as a match entry. Keys it cannot read are
// an error naming them.
func u32Match(r *Report, at At, f *tc.Filter) (*Match, error) {
	u := f.U32
	m := &Match{At: at}
	if u.Mark != nil {
		if u.Mark.Mask == 0xffffffff {
			m.Mark = strconv.FormatUint(uint64(u.Mark.Val), 10)
		} else {
			m.Mark = fmt.Sprintf("0x%x/0x%x", u.Mark.Val, u.Mark.Mask)
		}
	}
	v6 := f.Proto == 0x86dd
	if f.Proto != 0x0800 && !v6 && f.Proto != tc.ProtoAll {
		return nil, fmt.Errorf("protocol 0x%04x: only ip, ipv6 and all classify", f.Proto)
	}
	var ihl5, small, ackOnly bool
	var keys []tc.Key
	if u.Sel != nil {
		keys = u.Sel.Keys
	}
	for _, k := range keys {
		if k.Mask == 0 {
			continue
		}
		if k.NextHdr {
			return nil, fmt.Errorf("a nexthdr+ key (at %d): u32's transport offsets are not read yet", k.Off)
		}
		var err error
		if v6 {
			err = u32Key6(m, k)
		} else {
			ihl5, small, ackOnly, err = u32Key4(m, k, ihl5, small, ackOnly)
		}
		if err != nil {
			return nil, err
		}
	}
	if small {
		if m.Proto != "tcp" || !ihl5 {
			return nil, fmt.Errorf("a total-length key without tcp and IHL 5: no sluice match says the same")
		}
		m.TCPAck, m.Proto = true, ""
		what := "every TCP packet under 64 bytes without IP options"
		if ackOnly {
			what = "ACK-only TCP packets under 64 bytes without IP options"
		}
		r.Approx(at, "small TCP packets", "tcp_ack: pure ACKs under 128 bytes; the filter took %s", what)
	} else if ihl5 || ackOnly {
		return nil, fmt.Errorf("IHL or TCP-flag keys outside the small-packet pattern")
	}
	if (len(m.Sport) > 0 || len(m.Dport) > 0) && m.Proto == "" {
		r.Approx(at, "port match", "matches TCP and UDP ports here, found behind IP options and in first fragments only; the filter read those bytes at a fixed offset in any packet without options")
	}
	if (len(m.Sport) > 0 || len(m.Dport) > 0) && m.Proto != "" && m.Proto != "tcp" && m.Proto != "udp" && m.Proto != "sctp" {
		return nil, fmt.Errorf("ports with protocol %s", m.Proto)
	}
	noAddr := len(m.Src)+len(m.Dst) == 0
	switch {
	case f.Proto == 0x0800 && noAddr && m.Proto != "icmp":
		m.Src = []string{"0.0.0.0/0"} // protocol ip: IPv4 alone
	case v6 && noAddr && m.Proto != "icmpv6":
		m.Src = []string{"::/0"}
	case f.Proto == tc.ProtoAll && (m.Proto != "" || len(m.Sport)+len(m.Dport) > 0 || m.TOS != "" || m.DSCP != ""):
		r.Approx(at, "protocol all", "IPv4 header fields read in every packet; here they match IPv4 (and IPv6 where they mean the same)")
	}
	if m.empty() {
		m.Src = []string{"0.0.0.0/0"} // match u32 0 0 on every packet: as close as rules come
	}
	return m, nil
}

func (m *Match) empty() bool {
	return len(m.Src)+len(m.Dst)+len(m.NotSrc)+len(m.NotDst)+len(m.Sport)+len(m.Dport) == 0 &&
		m.Proto == "" && m.DSCP == "" && m.TOS == "" && !m.TCPAck && !m.TCPSyn && m.Mark == ""
}

var protoNames = map[int]string{1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp"}

func protoName(p int) string {
	if n, ok := protoNames[p]; ok {
		return n
	}
	return strconv.Itoa(p)
}

// leadingOnes reports whether mask is ones then zeros, and how many ones.
func leadingOnes(mask uint32, width int) (int, bool) {
	n := 0
	for i := width - 1; i >= 0 && mask&(1<<i) != 0; i-- {
		n++
	}
	return n, mask == ((1<<n)-1)<<(width-n)
}

// portField is a u32 port match (value, 16-bit mask) in sluice's port
// syntax: a mask of leading ones is a range.
func portField(v, mask uint32) ([]string, error) {
	n, ok := leadingOnes(mask, 16)
	if !ok {
		return nil, fmt.Errorf("port mask 0x%04x is not leading ones: no port range says the same", mask)
	}
	lo := v & mask
	hi := lo | (0xffff >> n)
	if lo == hi {
		return []string{strconv.Itoa(int(lo))}, nil
	}
	return []string{fmt.Sprintf("%d-%d", lo, hi)}, nil
}

func prefixField(b []byte, bits int) string {
	a, _ := netip.AddrFromSlice(b)
	return prefixText(netip.PrefixFrom(a, bits).Masked())
}

func u32Key4(m *Match, k tc.Key, ihl5, small, ackOnly bool) (bool, bool, bool, error) {
	bad := fmt.Errorf("a key at offset %d mask 0x%08x: no sluice match says the same", k.Off, k.Mask)
	v, mask := k.Val&k.Mask, k.Mask
	word := func(x uint32) []byte { return []byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)} }
	switch k.Off {
	case 0:
		if mask&0xf0000000 != 0 {
			return ihl5, small, ackOnly, bad
		}
		if hl := mask & 0x0f000000; hl != 0 {
			if hl != 0x0f000000 || v&0x0f000000 != 0x05000000 {
				return ihl5, small, ackOnly, bad
			}
			ihl5 = true
		}
		if tm := (mask >> 16) & 0xff; tm != 0 {
			tv := (v >> 16) & 0xff
			if tm == 0xfc {
				m.DSCP = strconv.Itoa(int(tv >> 2))
			} else {
				m.TOS = fmt.Sprintf("0x%02x/0x%02x", tv, tm)
			}
		}
		if lm := mask & 0xffff; lm != 0 {
			if lm != 0xffc0 || v&0xffff != 0 {
				return ihl5, small, ackOnly, bad
			}
			small = true
		}
	case 8:
		if mask&^0x00ff0000 != 0 {
			return ihl5, small, ackOnly, bad
		}
		if mask&0x00ff0000 == 0x00ff0000 {
			m.Proto = protoName(int(v>>16) & 0xff)
		} else {
			return ihl5, small, ackOnly, bad
		}
	case 12, 16:
		n, ok := leadingOnes(mask, 32)
		if !ok {
			return ihl5, small, ackOnly, bad
		}
		p := prefixField(word(v), n)
		if k.Off == 12 {
			m.Src = []string{p}
		} else {
			m.Dst = []string{p}
		}
	case 20:
		if sm := mask >> 16; sm != 0 {
			ps, err := portField(v>>16, sm)
			if err != nil {
				return ihl5, small, ackOnly, err
			}
			m.Sport = ps
		}
		if dm := mask & 0xffff; dm != 0 {
			ps, err := portField(v&0xffff, dm)
			if err != nil {
				return ihl5, small, ackOnly, err
			}
			m.Dport = ps
		}
	case 32:
		// TCP flags at 33, without IP options: the small-ACK pattern.
		if mask != 0x00ff0000 || v != 0x00100000 {
			return ihl5, small, ackOnly, bad
		}
		ackOnly = true
	default:
		return ihl5, small, ackOnly, bad
	}
	return ihl5, small, ackOnly, nil
}

func u32Key6(m *Match, k tc.Key) error {
	bad := fmt.Errorf("an IPv6 key at offset %d mask 0x%08x: no sluice match says the same", k.Off, k.Mask)
	switch {
	case k.Off == 4 && k.Mask == 0x0000ff00:
		m.Proto = protoName(int(k.Val>>8) & 0xff)
	case k.Off >= 8 && k.Off < 40:
		// Addresses come as up to four words each; prefixes longer
		// than a word arrive as whole-word keys first.
		base, list := int32(8), &m.Src
		if k.Off >= 24 {
			base, list = 24, &m.Dst
		}
		n, ok := leadingOnes(k.Mask, 32)
		if !ok {
			return bad
		}
		var cur netip.Prefix
		var b [16]byte
		bits := 0
		if len(*list) == 1 {
			p, err := netip.ParsePrefix((*list)[0])
			if err != nil {
				a, _ := netip.ParseAddr((*list)[0])
				p = netip.PrefixFrom(a, 128)
			}
			cur, bits = p, p.Bits()
			b = cur.Addr().As16()
		}
		w := int(k.Off-base) / 4
		if bits != w*32 {
			return bad // words out of order, or a gap
		}
		b[4*w], b[4*w+1], b[4*w+2], b[4*w+3] = byte(k.Val>>24), byte(k.Val>>16), byte(k.Val>>8), byte(k.Val)
		*list = []string{prefixText(netip.PrefixFrom(netip.AddrFrom16(b), bits+n).Masked())}
	case k.Off == 40:
		if sm := k.Mask >> 16; sm != 0 {
			ps, err := portField(k.Val>>16, sm)
			if err != nil {
				return err
			}
			m.Sport = ps
		}
		if dm := k.Mask & 0xffff; dm != 0 {
			ps, err := portField(k.Val&0xffff, dm)
			if err != nil {
				return err
			}
			m.Dport = ps
		}
	default:
		return bad
	}
	return nil
}
