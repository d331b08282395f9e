package tc

import (
	"encoding/binary"
	"net/netip"
	"strconv"

	"github.com/vishvananda/netlink/nl"
)

// Flower is a flower filter as read back: the keys sluice can express
// as a match entry, and those it cannot (Unknown). Read only: sluice
// imports the trees hand-written scripts built with flower; it never
// makes one.
type Flower struct {
	ClassID Handle
	// Actions: the filter has actions (not imported).
	Actions bool
	// EthType is the protocol the filter matches (0: any).
	EthType uint16
	// IPProto is the transport protocol, when matched.
	IPProto *uint8
	// Src and Dst are the addresses under their masks (invalid: not
	// matched). A mask that is not a prefix lands in Unknown.
	Src, Dst netip.Prefix
	// SrcPort and DstPort are the transport ports under their masks.
	SrcPort, DstPort *Masked16
	// TOS is the IPv4 TOS byte or IPv6 traffic class under its mask.
	TOS *Masked8
	// Unknown lists the keys present that sluice does not read, by
	// their kernel names.
	Unknown []string
}

// Masked16 is a 16-bit key and its mask.
type Masked16 struct{ Val, Mask uint16 }

// Masked8 is an 8-bit key and its mask.
type Masked8 struct{ Val, Mask uint8 }

// flowerNames are the kernel's names of flower keys sluice does not
// read, for the import's refusals.
var flowerNames = map[uint16]string{
	nl.TCA_FLOWER_INDEV: "indev", nl.TCA_FLOWER_KEY_ETH_DST: "dst_mac", nl.TCA_FLOWER_KEY_ETH_SRC: "src_mac",
	nl.TCA_FLOWER_KEY_VLAN_ID: "vlan_id", nl.TCA_FLOWER_KEY_VLAN_PRIO: "vlan_prio", nl.TCA_FLOWER_KEY_VLAN_ETH_TYPE: "vlan_ethtype",
	nl.TCA_FLOWER_KEY_ENC_KEY_ID: "enc_key_id", nl.TCA_FLOWER_KEY_ENC_IPV4_SRC: "enc_src_ip", nl.TCA_FLOWER_KEY_ENC_IPV4_DST: "enc_dst_ip",
	nl.TCA_FLOWER_KEY_ENC_IPV6_SRC: "enc_src_ip", nl.TCA_FLOWER_KEY_ENC_IPV6_DST: "enc_dst_ip", nl.TCA_FLOWER_KEY_FLAGS: "ip_flags",
	nl.TCA_FLOWER_KEY_ICMPV4_TYPE: "type", nl.TCA_FLOWER_KEY_ICMPV4_CODE: "code", nl.TCA_FLOWER_KEY_ICMPV6_TYPE: "type",
	nl.TCA_FLOWER_KEY_ICMPV6_CODE: "code", nl.TCA_FLOWER_KEY_ARP_SIP: "arp_sip", nl.TCA_FLOWER_KEY_ARP_TIP: "arp_tip",
	nl.TCA_FLOWER_KEY_ARP_OP: "arp_op", nl.TCA_FLOWER_KEY_MPLS_LABEL: "mpls_label", nl.TCA_FLOWER_KEY_TCP_FLAGS: "tcp_flags",
	nl.TCA_FLOWER_KEY_IP_TTL: "ip_ttl", nl.TCA_FLOWER_KEY_CVLAN_ID: "cvlan_id",
	nl.TCA_FLOWER_KEY_PORT_SRC_MIN: "src_port MIN-MAX", nl.TCA_FLOWER_KEY_PORT_DST_MIN: "dst_port MIN-MAX",
	nl.TCA_FLOWER_KEY_ENC_OPTS: "enc_opts",
}

// flowerRead are the attributes that are not Unknown: the keys sluice
// reads, their masks, hardware flags, and the masks of keys that are
// Unknown by their key.
var flowerRead = map[uint16]bool{
	nl.TCA_FLOWER_CLASSID: true, nl.TCA_FLOWER_ACT: true, nl.TCA_FLOWER_FLAGS: true, nl.TCA_FLOWER_KEY_ETH_TYPE: true,
	nl.TCA_FLOWER_KEY_IP_PROTO: true,
	nl.TCA_FLOWER_KEY_IPV4_SRC: true, nl.TCA_FLOWER_KEY_IPV4_SRC_MASK: true, nl.TCA_FLOWER_KEY_IPV4_DST: true, nl.TCA_FLOWER_KEY_IPV4_DST_MASK: true,
	nl.TCA_FLOWER_KEY_IPV6_SRC: true, nl.TCA_FLOWER_KEY_IPV6_SRC_MASK: true, nl.TCA_FLOWER_KEY_IPV6_DST: true, nl.TCA_FLOWER_KEY_IPV6_DST_MASK: true,
	nl.TCA_FLOWER_KEY_TCP_SRC: true, nl.TCA_FLOWER_KEY_TCP_DST: true, nl.TCA_FLOWER_KEY_UDP_SRC: true, nl.TCA_FLOWER_KEY_UDP_DST: true,
	nl.TCA_FLOWER_KEY_SCTP_SRC: true, nl.TCA_FLOWER_KEY_SCTP_DST: true,
	nl.TCA_FLOWER_KEY_TCP_SRC_MASK: true, nl.TCA_FLOWER_KEY_TCP_DST_MASK: true, nl.TCA_FLOWER_KEY_UDP_SRC_MASK: true,
	nl.TCA_FLOWER_KEY_UDP_DST_MASK: true, nl.TCA_FLOWER_KEY_SCTP_SRC_MASK: true, nl.TCA_FLOWER_KEY_SCTP_DST_MASK: true,
	nl.TCA_FLOWER_KEY_IP_TOS: true, nl.TCA_FLOWER_KEY_IP_TOS_MASK: true,
	// What the kernel reports of offload, not of matching.
	nl.TCA_FLOWER_IN_HW_COUNT: true,
	// Masks of keys that land in Unknown by their key (and a range's
	// other end).
	nl.TCA_FLOWER_KEY_PORT_SRC_MAX: true, nl.TCA_FLOWER_KEY_PORT_DST_MAX: true, nl.TCA_FLOWER_KEY_ENC_OPTS_MASK: true,
	nl.TCA_FLOWER_KEY_ETH_DST_MASK: true, nl.TCA_FLOWER_KEY_ETH_SRC_MASK: true, nl.TCA_FLOWER_KEY_FLAGS_MASK: true,
	nl.TCA_FLOWER_KEY_ENC_IPV4_SRC_MASK: true, nl.TCA_FLOWER_KEY_ENC_IPV4_DST_MASK: true, nl.TCA_FLOWER_KEY_ENC_IPV6_SRC_MASK: true,
	nl.TCA_FLOWER_KEY_ENC_IPV6_DST_MASK: true, nl.TCA_FLOWER_KEY_ICMPV4_CODE_MASK: true, nl.TCA_FLOWER_KEY_ICMPV4_TYPE_MASK: true,
	nl.TCA_FLOWER_KEY_ICMPV6_CODE_MASK: true, nl.TCA_FLOWER_KEY_ICMPV6_TYPE_MASK: true, nl.TCA_FLOWER_KEY_ARP_SIP_MASK: true,
	nl.TCA_FLOWER_KEY_ARP_TIP_MASK: true, nl.TCA_FLOWER_KEY_ARP_OP_MASK: true, nl.TCA_FLOWER_KEY_TCP_FLAGS_MASK: true,
	nl.TCA_FLOWER_KEY_IP_TTL_MASK: true,
}

// decodeFlower reads a flower filter's options (TCA_OPTIONS).
func decodeFlower(opts []byte) *Flower {
	f := &Flower{}
	a := map[uint16][]byte{}
	eachAttr(opts, func(typ uint16, v []byte) {
		a[typ] = v
		if !flowerRead[typ] {
			name := flowerNames[typ]
			if name == "" {
				name = "key " + strconv.Itoa(int(typ))
			}
			f.Unknown = append(f.Unknown, name)
		}
	})
	be16 := func(k uint16) (uint16, bool) {
		if b := a[k]; len(b) >= 2 {
			return binary.BigEndian.Uint16(b), true
		}
		return 0, false
	}
	if b := a[nl.TCA_FLOWER_CLASSID]; len(b) >= 4 {
		f.ClassID = Handle(native.Uint32(b))
	}
	f.Actions = a[nl.TCA_FLOWER_ACT] != nil
	f.EthType, _ = be16(nl.TCA_FLOWER_KEY_ETH_TYPE)
	if b := a[nl.TCA_FLOWER_KEY_IP_PROTO]; len(b) >= 1 {
		p := b[0]
		f.IPProto = &p
	}
	prefix := func(key, mask uint16, n int) netip.Prefix {
		k, m := a[key], a[mask]
		if len(k) < n {
			return netip.Prefix{}
		}
		addr, _ := netip.AddrFromSlice(k[:n])
		bits := n * 8
		if len(m) >= n {
			ones, ok := leadingOnes(m[:n])
			if !ok {
				f.Unknown = append(f.Unknown, "an address mask that is not a prefix")
				return netip.Prefix{}
			}
			bits = ones
		}
		return netip.PrefixFrom(addr, bits).Masked()
	}
	if p := prefix(nl.TCA_FLOWER_KEY_IPV4_SRC, nl.TCA_FLOWER_KEY_IPV4_SRC_MASK, 4); p.IsValid() {
		f.Src = p
	}
	if p := prefix(nl.TCA_FLOWER_KEY_IPV4_DST, nl.TCA_FLOWER_KEY_IPV4_DST_MASK, 4); p.IsValid() {
		f.Dst = p
	}
	if p := prefix(nl.TCA_FLOWER_KEY_IPV6_SRC, nl.TCA_FLOWER_KEY_IPV6_SRC_MASK, 16); p.IsValid() {
		f.Src = p
	}
	if p := prefix(nl.TCA_FLOWER_KEY_IPV6_DST, nl.TCA_FLOWER_KEY_IPV6_DST_MASK, 16); p.IsValid() {
		f.Dst = p
	}
	port := func(key, mask uint16) *Masked16 {
		v, ok := be16(key)
		if !ok {
			return nil
		}
		m, ok := be16(mask)
		if !ok {
			m = 0xffff
		}
		return &Masked16{Val: v, Mask: m}
	}
	for _, k := range [][4]uint16{
		{nl.TCA_FLOWER_KEY_TCP_SRC, nl.TCA_FLOWER_KEY_TCP_SRC_MASK, nl.TCA_FLOWER_KEY_TCP_DST, nl.TCA_FLOWER_KEY_TCP_DST_MASK},
		{nl.TCA_FLOWER_KEY_UDP_SRC, nl.TCA_FLOWER_KEY_UDP_SRC_MASK, nl.TCA_FLOWER_KEY_UDP_DST, nl.TCA_FLOWER_KEY_UDP_DST_MASK},
		{nl.TCA_FLOWER_KEY_SCTP_SRC, nl.TCA_FLOWER_KEY_SCTP_SRC_MASK, nl.TCA_FLOWER_KEY_SCTP_DST, nl.TCA_FLOWER_KEY_SCTP_DST_MASK},
	} {
		if p := port(k[0], k[1]); p != nil {
			f.SrcPort = p
		}
		if p := port(k[2], k[3]); p != nil {
			f.DstPort = p
		}
	}
	if b := a[nl.TCA_FLOWER_KEY_IP_TOS]; len(b) >= 1 {
		m := uint8(0xff)
		if mb := a[nl.TCA_FLOWER_KEY_IP_TOS_MASK]; len(mb) >= 1 {
			m = mb[0]
		}
		f.TOS = &Masked8{Val: b[0], Mask: m}
	}
	return f
}

// leadingOnes is the prefix length of a mask, and whether it is one.
func leadingOnes(m []byte) (int, bool) {
	n, done := 0, false
	for _, b := range m {
		for i := 7; i >= 0; i-- {
			one := b&(1<<i) != 0
			switch {
			case one && done:
				return 0, false
			case one:
				n++
			default:
				done = true
			}
		}
	}
	return n, true
}
