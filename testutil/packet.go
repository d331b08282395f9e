package testutil

import (
	"encoding/binary"
	"net/netip"
)

// Packet describes a crafted IPv4 or IPv6 packet for classification
// tests. Checksums are left zero: the packets only have to reach a qdisc.
type Packet struct {
	Src, Dst   netip.Addr
	Proto      uint8 // IP protocol / IPv6 next header of the transport
	TOS        uint8 // IPv4 TOS byte or IPv6 traffic class
	Sport      uint16
	Dport      uint16
	TCPFlags   uint8
	TCPOptions []byte // TCP options after the fixed header (padded with EOL to 4 bytes)
	Payload    int    // bytes after the transport header
	IPOptions  int    // bytes of IPv4 options (multiple of 4, up to 40)
	FragOffset int    // IPv4 fragment offset in 8-byte units (0: first or only)
	MoreFrags  bool   // IPv4 MF flag
	ExtHeader  bool   // IPv6: a destination-options header before the transport
}

// V6 reports whether the packet is IPv6.
func (p *Packet) V6() bool { return p.Src.Is6() && !p.Src.Is4In6() }

// L4Len is the length of the transport header.
func (p *Packet) L4Len() int {
	switch p.Proto {
	case 6:
		return 20 + (len(p.TCPOptions)+3)/4*4
	case 17:
		return 8
	case 1, 58:
		return 8
	}
	return 4
}

func (p *Packet) transport() []byte {
	b := make([]byte, p.L4Len()+p.Payload)
	switch p.Proto {
	case 6:
		binary.BigEndian.PutUint16(b[0:], p.Sport)
		binary.BigEndian.PutUint16(b[2:], p.Dport)
		b[12] = byte(p.L4Len()/4) << 4
		b[13] = p.TCPFlags
		binary.BigEndian.PutUint16(b[14:], 65535)
		copy(b[20:], p.TCPOptions)
	case 17:
		binary.BigEndian.PutUint16(b[0:], p.Sport)
		binary.BigEndian.PutUint16(b[2:], p.Dport)
		binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	case 1, 58:
		b[0] = 8
		if p.Proto == 58 {
			b[0] = 128
		}
	default:
		binary.BigEndian.PutUint16(b[0:], p.Sport)
		binary.BigEndian.PutUint16(b[2:], p.Dport)
	}
	return b
}

// IPLength is the IPv4 total length or the IPv6 payload length.
func (p *Packet) IPLength() int {
	l4 := p.L4Len() + p.Payload
	if p.V6() {
		if p.ExtHeader {
			l4 += 8
		}
		return l4
	}
	return 20 + p.IPOptions + l4
}

// Frame returns the packet with an Ethernet header.
func (p *Packet) Frame() []byte {
	eth := make([]byte, 14)
	copy(eth[0:6], []byte{0x02, 0, 0, 0, 0, 2})
	copy(eth[6:12], []byte{0x02, 0, 0, 0, 0, 1})
	if p.V6() {
		binary.BigEndian.PutUint16(eth[12:], 0x86DD)
		h := make([]byte, 40)
		binary.BigEndian.PutUint32(h[0:], 6<<28|uint32(p.TOS)<<20|0x12345)
		binary.BigEndian.PutUint16(h[4:], uint16(p.IPLength()))
		h[6] = p.Proto
		h[7] = 64
		s, d := p.Src.As16(), p.Dst.As16()
		copy(h[8:], s[:])
		copy(h[24:], d[:])
		out := append(eth, h...)
		if p.ExtHeader {
			h[6] = 60 // destination options
			ext := make([]byte, 8)
			ext[0] = p.Proto
			ext[2] = 1 // PadN filling the rest
			ext[3] = 4
			out = append(eth, h...)
			out = append(out, ext...)
		}
		return append(out, p.transport()...)
	}
	binary.BigEndian.PutUint16(eth[12:], 0x0800)
	h := make([]byte, 20+p.IPOptions)
	h[0] = 4<<4 | byte(5+p.IPOptions/4)
	h[1] = p.TOS
	binary.BigEndian.PutUint16(h[2:], uint16(p.IPLength()))
	frag := uint16(p.FragOffset & 0x1fff)
	if p.MoreFrags {
		frag |= 0x2000
	}
	binary.BigEndian.PutUint16(h[6:], frag)
	h[8] = 64
	h[9] = p.Proto
	s, d := p.Src.As4(), p.Dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	for i := 20; i < len(h); i++ {
		h[i] = 1 // NOP options
	}
	// A later fragment carries payload, not a transport header; it gets
	// the same bytes anyway, so that a rule reading ports from a
	// fragment would be caught matching.
	return append(append(eth, h...), p.transport()...)
}

// TCPTimestamps is the timestamps option (RFC 7323) as Linux sends it
// on data and ACKs: two NOPs, then kind 8 with TSval and TSecr.
func TCPTimestamps(val, ecr uint32) []byte {
	b := []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[4:], val)
	binary.BigEndian.PutUint32(b[8:], ecr)
	return b
}
