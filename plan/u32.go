package plan

import (
	"fmt"
	"net/netip"
	"sort"

	"sluice/policy"
	"sluice/tc"
)

// Offsets into the IP headers, relative to the network header as u32
// reads them. IPv4 transport fields are reached through u32's next-header
// offset (IHL*4), so ports are found behind IPv4 options; IPv6 transport
// fields sit at 40 (packets with extension headers do not match port,
// protocol or tcp_ack rules and fall through to later rules).
const (
	v4Src, v4Dst = 12, 16
	v6Src, v6Dst = 8, 24
	v6L4         = 40
)

// keyset accumulates u32 keys, merging keys that read the same word as
// tc's pack_key does; bad records a contradiction (no packet can match).
type keyset struct {
	keys []tc.Key
	bad  bool
}

func (k keyset) clone() keyset {
	return keyset{keys: append([]tc.Key(nil), k.keys...), bad: k.bad}
}

func (k *keyset) add(off int32, mask, val uint32, nexthdr bool) {
	val &= mask
	for i := range k.keys {
		e := &k.keys[i]
		if e.Off == off && e.NextHdr == nexthdr {
			if (e.Val^val)&(e.Mask&mask) != 0 {
				k.bad = true
			}
			e.Val |= val
			e.Mask |= mask
			return
		}
	}
	k.keys = append(k.keys, tc.Key{Off: off, Mask: mask, Val: val, NextHdr: nexthdr})
}

// prefix adds keys matching address prefix p stored at base.
func (k *keyset) prefix(base int32, p netip.Prefix) {
	b := p.Addr().AsSlice()
	for w := 0; w*32 < p.Bits(); w++ {
		bits := min(32, p.Bits()-w*32)
		mask := ^uint32(0) << (32 - bits)
		val := uint32(b[4*w])<<24 | uint32(b[4*w+1])<<16 | uint32(b[4*w+2])<<8 | uint32(b[4*w+3])
		k.add(base+int32(4*w), mask, val, false)
	}
}

// rootNode is one node of a u32 root table; for IPv4 matches on transport
// fields it descends into a table of transport nodes.
type rootNode struct {
	keys  []tc.Key
	mark  *tc.Mark
	table [][]tc.Key // non-nil: link with next-header offset into these nodes
	note  string
}

// compileMatch turns one match entry into u32 nodes with the same
// meaning. The result is exact: ranges, lists and negations become sets
// of value/mask keys, never approximations.
func compileMatch(m *policy.Match) []rootNode {
	var mark *tc.Mark
	if m.Mark != nil {
		mark = &tc.Mark{Val: m.Mark.Val, Mask: m.Mark.Mask}
	}
	onlyMark := true
	for f := range m.Fields {
		if f != "mark" {
			onlyMark = false
		}
	}
	if onlyMark {
		// No IP field: match every packet (IP or not) carrying the mark.
		return []rootNode{{keys: []tc.Key{{}}, mark: mark, note: "mark"}}
	}
	var out []rootNode
	for _, a := range alternatives(m) {
		out = append(out, a.u32Nodes(mark)...)
	}
	return out
}

func familyPrefixes(list, holes []netip.Prefix, v4 bool) ([]netip.Prefix, bool) {
	var in []netip.Prefix
	for _, p := range list {
		if p.Addr().Is4() == v4 {
			in = append(in, p)
		}
	}
	if len(list) > 0 && len(in) == 0 {
		return nil, false // the entry names only the other family
	}
	var holesF []netip.Prefix
	for _, h := range holes {
		if h.Addr().Is4() == v4 {
			holesF = append(holesF, h)
		}
	}
	if len(in) == 0 {
		if len(holesF) == 0 {
			return []netip.Prefix{{}}, true // unconstrained
		}
		in = []netip.Prefix{universe(v4)}
	}
	var out []netip.Prefix
	for _, p := range in {
		out = append(out, subtract(p, holesF)...)
	}
	return out, len(out) > 0
}

// alt is one alternative of a match entry: a single address family and
// at most one prefix per direction and one protocol. Lists of DSCPs and
// of port ranges stay lists: u32 expands them further, BPF does not.
type alt struct {
	v4       bool
	src, dst netip.Prefix // zero: any
	proto    int          // -1: any
	dscps    []int        // empty: any
	tos      *policy.Masked8
	sports   []policy.PortRange // empty: any
	dports   []policy.PortRange
	tcpAck   bool
	tcpSyn   bool
	needL4   bool
}

// alternatives expands an entry into alternatives whose union is exactly
// the entry: lists, both families, negated prefixes as their complement,
// protocol defaults (ports alone mean tcp and udp).
func alternatives(m *policy.Match) []alt {
	var out []alt
	for _, v4 := range []bool{true, false} {
		out = append(out, familyAlts(m, v4)...)
	}
	return out
}

func familyAlts(m *policy.Match, v4 bool) []alt {
	srcs, ok1 := familyPrefixes(m.Src, m.NotSrc, v4)
	dsts, ok2 := familyPrefixes(m.Dst, m.NotDst, v4)
	if !ok1 || !ok2 {
		return nil
	}
	hasPorts := len(m.Sport) > 0 || len(m.Dport) > 0
	var protos []int
	for _, p := range m.Proto {
		if p == 1 && !v4 || p == 58 && v4 {
			continue
		}
		protos = append(protos, int(p))
	}
	switch {
	case len(m.Proto) > 0 && len(protos) == 0:
		return nil // icmp in IPv6 or icmpv6 in IPv4
	case len(protos) == 0 && (m.TCPAck || m.TCPSyn):
		protos = []int{6}
	case len(protos) == 0 && hasPorts:
		protos = []int{6, 17}
	case len(protos) == 0:
		protos = []int{-1}
	}
	var dscps []int
	for _, d := range m.DSCP {
		dscps = append(dscps, int(d))
	}
	var out []alt
	for _, s := range srcs {
		for _, d := range dsts {
			for _, pr := range protos {
				out = append(out, alt{v4: v4, src: s, dst: d, proto: pr, dscps: dscps, tos: m.TOS,
					sports: m.Sport, dports: m.Dport, tcpAck: m.TCPAck, tcpSyn: m.TCPSyn, needL4: hasPorts || m.TCPAck || m.TCPSyn})
			}
		}
	}
	return out
}

// u32Nodes renders an alternative as u32 root nodes (one per DSCP).
func (a alt) u32Nodes(mark *tc.Mark) []rootNode {
	v4 := a.v4
	l4 := []keyset{{}}
	l4off, nh := int32(0), v4
	if !v4 {
		l4off = v6L4
	}
	if len(a.sports) > 0 {
		l4 = crossPorts(l4, a.sports, l4off, nh, true)
	}
	if len(a.dports) > 0 {
		l4 = crossPorts(l4, a.dports, l4off, nh, false)
	}
	if a.tcpAck {
		for i := range l4 {
			// Only ACK among URG ACK PSH RST SYN FIN (CWR/ECE may be set).
			l4[i].add(l4off+12, 0x003f0000, 0x00100000, nh)
		}
	}
	if a.tcpSyn {
		for i := range l4 {
			l4[i].add(l4off+12, 0x00020000, 0x00020000, nh) // SYN, whatever else is set
		}
	}
	dscps := a.dscps
	if len(dscps) == 0 {
		dscps = []int{-1}
	}
	var out []rootNode
	for _, ds := range dscps {
		var k keyset
		if v4 {
			k.add(0, 0xf0000000, 0x40000000, false)
		} else {
			k.add(0, 0xf0000000, 0x60000000, false)
		}
		if ds >= 0 {
			if v4 {
				k.add(0, 0x00fc0000, uint32(ds)<<18, false)
			} else {
				k.add(0, 0x0fc00000, uint32(ds)<<22, false)
			}
		}
		if t := a.tos; t != nil {
			if v4 {
				k.add(0, uint32(t.Mask)<<16, uint32(t.Val)<<16, false)
			} else {
				k.add(0, uint32(t.Mask)<<20, uint32(t.Val)<<20, false)
			}
		}
		if a.tcpAck { // small: total (v4) or payload (v6) length below 128
			if v4 {
				k.add(0, 0x0000ff80, 0, false)
			} else {
				k.add(4, 0xff800000, 0, false)
			}
		}
		if v4 && a.needL4 {
			k.add(4, 0x00001fff, 0, false) // first fragment: has the ports
		}
		if a.proto >= 0 {
			if v4 {
				k.add(8, 0x00ff0000, uint32(a.proto)<<16, false)
			} else {
				k.add(4, 0x0000ff00, uint32(a.proto)<<8, false)
			}
		}
		if a.src.IsValid() {
			k.prefix(pick(v4, v4Src, v6Src), a.src)
		}
		if a.dst.IsValid() {
			k.prefix(pick(v4, v4Dst, v6Dst), a.dst)
		}
		if k.bad {
			continue
		}
		note := describeAlt(v4, a.src, a.dst, a.proto, ds)
		switch {
		case !a.needL4:
			out = append(out, rootNode{keys: k.keys, mark: mark, note: note})
		case v4:
			n := rootNode{keys: k.keys, mark: mark, note: note}
			for _, t := range l4 {
				if !t.bad {
					n.table = append(n.table, t.keys)
				}
			}
			out = append(out, n)
		default:
			for _, t := range l4 {
				kk := k.clone()
				for _, key := range t.keys {
					kk.add(key.Off, key.Mask, key.Val, false)
				}
				if !kk.bad {
					out = append(out, rootNode{keys: kk.keys, mark: mark, note: note})
				}
			}
		}
	}
	return out
}

func pick(v4 bool, a, b int32) int32 {
	if v4 {
		return a
	}
	return b
}

func crossPorts(in []keyset, ranges []policy.PortRange, off int32, nexthdr, src bool) []keyset {
	var out []keyset
	for _, k := range in {
		for _, r := range ranges {
			for _, vm := range portMasks(r.Lo, r.Hi) {
				kk := k.clone()
				if src {
					kk.add(off, uint32(vm.Mask)<<16, uint32(vm.Val)<<16, nexthdr)
				} else {
					kk.add(off, uint32(vm.Mask), uint32(vm.Val), nexthdr)
				}
				out = append(out, kk)
			}
		}
	}
	return out
}

func describeAlt(v4 bool, s, d netip.Prefix, proto, dscp int) string {
	n := "ipv6"
	if v4 {
		n = "ipv4"
	}
	if s.IsValid() {
		n += " src " + s.String()
	}
	if d.IsValid() {
		n += " dst " + d.String()
	}
	if proto >= 0 {
		n += fmt.Sprintf(" proto %d", proto)
	}
	if dscp >= 0 {
		n += fmt.Sprintf(" dscp %d", dscp)
	}
	return n
}

// hostAddr is a host's address and class name.
type hostAddr struct {
	p    netip.Prefix
	name string
}

// hostsFileU32 is the u32 form of a per_host hosts_file class (the BPF
// classifier's LPM tries, as tc users write them): at the class's own
// prio in the enclosing block, per family a link into a 256-bucket
// table hashed on the address's last byte holding the full-length
// addresses, then the shorter prefixes longest first. An address found
// nowhere falls through to the next prio, as in BPF.
func (b *builder) hostsFileU32(parent tc.Handle, prio uint16, c *policy.Class) {
	ph := c.PerHost
	base := tc.Filter{Dev: b.dev.Name, Parent: parent, Prio: prio, Proto: tc.ProtoAll, Kind: "u32"}
	tp := base
	tp.Note = "hosts of " + c.Name
	b.filters = append(b.filters, &tp)
	var full [2][]hostAddr // [v4, v6] full-length addresses
	var short []hostAddr
	for _, e := range ph.Entries {
		for _, a := range e.Addrs {
			h := hostAddr{a.Masked(), entryName(c, e)}
			if a.Bits() == a.Addr().BitLen() {
				full[pick6(a.Addr().Is6())] = append(full[pick6(a.Addr().Is6())], h)
			} else {
				short = append(short, h)
			}
		}
	}
	sort.SliceStable(short, func(i, j int) bool { return short[i].p.Bits() > short[j].p.Bits() })
	node := uint32(0)
	var tables, nodes []tc.Object
	for fam, hs := range full {
		if len(hs) == 0 {
			continue
		}
		v4 := fam == 0
		off := pick(v4, v4Dst, v6Dst)
		if ph.By == "src" {
			off = pick(v4, v4Src, v6Src)
		}
		hb := hashByte(hs)
		word := int16(off) + int16(hb/4*4) // the word holding that byte
		key := fmt.Sprintf("%s/hosts%d", c.Name, pick(v4, 4, 6))
		id, ok := b.tables.get(key)
		if !ok {
			b.d.Errorf(ph.Pos, "class %s: ran out of u32 table ids", c.Name)
			return
		}
		tid := uint32(id)
		t := base
		t.Handle = tc.MakeU32Handle(tid, 0, 0)
		t.U32 = &tc.U32{Divisor: 256}
		t.Note = "hash table " + key
		tables = append(tables, &t)
		inBucket := map[uint32]uint32{}
		for _, h := range hs {
			a := h.p.Addr().AsSlice()
			bucket := uint32(a[hb])
			inBucket[bucket]++
			if inBucket[bucket] > 0xFFF {
				b.d.Errorf(ph.Pos, "class %s: more than 4095 IPv%d hosts have %d as byte %d of their address, the byte that spreads them best; a u32 hash bucket holds at most 4095 (the BPF classifier has no such limit)",
					c.Name, pick(v4, 4, 6), bucket, hb+1)
				return
			}
			var k keyset
			k.prefix(off, h.p)
			n := base
			n.Handle = tc.MakeU32Handle(tid, bucket, inBucket[bucket])
			n.U32 = &tc.U32{Sel: &tc.Sel{Keys: k.keys}, ClassID: b.classID(h.name)}
			tables = append(tables, &n)
		}
		node++
		var k keyset
		k.add(0, 0xf0000000, uint32(pick(v4, 0x40000000, 0x60000000)), false)
		n := base
		n.Handle = node
		n.U32 = &tc.U32{Sel: &tc.Sel{Keys: k.keys, Hoff: word, Hmask: 0xff << (8 * (3 - hb%4))}, Link: t.Handle}
		n.Note = fmt.Sprintf("IPv%d hosts of %s by %s", pick(v4, 4, 6), c.Name, ph.By)
		nodes = append(nodes, &n)
	}
	for _, h := range short {
		v4 := h.p.Addr().Is4()
		off := pick(v4, v4Dst, v6Dst)
		if ph.By == "src" {
			off = pick(v4, v4Src, v6Src)
		}
		node++
		if node > 0xFFF {
			b.d.Errorf(ph.Pos, "class %s: more than 4095 prefixes; use classifier bpf", c.Name)
			return
		}
		var k keyset
		k.add(0, 0xf0000000, uint32(pick(v4, 0x40000000, 0x60000000)), false)
		k.prefix(off, h.p)
		n := base
		n.Handle = node
		n.U32 = &tc.U32{Sel: &tc.Sel{Keys: k.keys}, ClassID: b.classID(h.name)}
		n.Note = h.name + " " + h.p.String()
		nodes = append(nodes, &n)
	}
	b.filters = append(b.filters, tables...)
	b.filters = append(b.filters, nodes...)
}

// hashByte picks the byte of the addresses that u32 hashes hosts on:
// the one that spreads them best over 256 buckets (the smallest fullest
// bucket), the last byte on ties. For IPv4 hosts that is usually the
// last byte; for IPv6 subscribers numbered ::1 in a /64 each, a byte of
// the prefix.
func hashByte(hs []hostAddr) int {
	if len(hs) == 0 {
		return 0
	}
	n := hs[0].p.Addr().BitLen() / 8
	best, bestMax := n-1, len(hs)+1
	var count [256]int
	for i := n - 1; i >= 0; i-- {
		count = [256]int{}
		fullest := 0
		for _, h := range hs {
			a := h.p.Addr().As16()
			c := &count[a[16-n+i]]
			*c++
			fullest = max(fullest, *c)
		}
		if fullest < bestMax {
			best, bestMax = i, fullest
		}
	}
	return best
}

func pick6(v6 bool) int {
	if v6 {
		return 1
	}
	return 0
}

// U32Inexpressible says why a BPF tree has no u32 equivalent ("" when it
// has one): policers exist only in BPF, and u32 cannot combine a hosts
// file's lookup with match rules.
func U32Inexpressible(t *policy.Tree) string {
	if t.Police != nil {
		return "it polices"
	}
	var why string
	var walk func([]*policy.Class)
	walk = func(cs []*policy.Class) {
		for _, c := range cs {
			switch {
			case c.Police != nil:
				why = "class " + c.Name + " polices"
			case c.PerHost != nil && c.PerHost.HostsFile != "" && len(c.Match) > 0:
				why = "class " + c.Name + " combines a hosts_file with match rules"
			}
			walk(c.Classes)
		}
	}
	walk(t.Classes)
	return why
}
