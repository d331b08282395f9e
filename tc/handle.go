// Package tc models the traffic-control objects sluice manages (links,
// qdiscs, classes, u32 filters) in the kernel's own terms, and translates
// them both ways: to and from rtnetlink messages, and to tc(8) batch lines.
//
// Every other package speaks these types: the planner produces them, the
// kernel layer reads them back from the live system and diffs the two, and
// export renders them as a script. Keeping one model for all three is what
// makes "export reproduces apply" checkable.
package tc

import (
	"fmt"
	"strconv"
	"strings"
)

// Handle is a qdisc or class handle, major:minor in 16+16 bits, as tc
// writes them in hexadecimal ("1:10" is major 1, minor 0x10).
type Handle uint32

// Well-known parents, from include/uapi/linux/pkt_sched.h.
const (
	HandleRoot    Handle = 0xFFFFFFFF // TC_H_ROOT
	HandleIngress Handle = 0xFFFFFFF1 // TC_H_INGRESS (also TC_H_CLSACT)
	// HandleIngressHook is the filter parent for the ingress hook of an
	// ingress or clsact qdisc (TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)).
	HandleIngressHook Handle = 0xFFFFFFF2
	// HandleEgressHook is clsact's egress hook.
	HandleEgressHook Handle = 0xFFFFFFF3
)

// MakeHandle builds major:minor.
func MakeHandle(major, minor uint16) Handle { return Handle(uint32(major)<<16 | uint32(minor)) }

// Major returns the upper 16 bits.
func (h Handle) Major() uint16 { return uint16(h >> 16) }

// Minor returns the lower 16 bits.
func (h Handle) Minor() uint16 { return uint16(h) }

// String formats the handle as tc does.
func (h Handle) String() string {
	switch h {
	case HandleRoot:
		return "root"
	case HandleIngress:
		return "ingress"
	case HandleIngressHook:
		return "ffff:fff2"
	case HandleEgressHook:
		return "ffff:fff3"
	case 0:
		return "0:"
	}
	// One allocation, not fmt's or three of strconv's: keys of every
	// object, and the ids of 10,000 classes a pass, go through here.
	var buf [10]byte
	return string(h.AppendText(buf[:0]))
}

// AppendText appends String's text to b (without its allocation).
func (h Handle) AppendText(b []byte) []byte {
	switch h {
	case HandleRoot, HandleIngress, HandleIngressHook, HandleEgressHook, 0:
		return append(b, h.String()...)
	}
	b = strconv.AppendUint(b, uint64(h.Major()), 16)
	b = append(b, ':')
	if h.Minor() == 0 {
		return b
	}
	return strconv.AppendUint(b, uint64(h.Minor()), 16)
}

// ParseHandle reads "1:", "1:10", "root", "ingress" or "ffff:fff2".
func ParseHandle(s string) (Handle, error) {
	switch s {
	case "root":
		return HandleRoot, nil
	case "ingress", "clsact":
		return HandleIngress, nil
	}
	maj, min, ok := strings.Cut(s, ":")
	if !ok {
		return 0, fmt.Errorf("handle %q: want MAJOR:MINOR in hex", s)
	}
	M, err := strconv.ParseUint(maj, 16, 16)
	if err != nil {
		return 0, fmt.Errorf("handle %q: bad major", s)
	}
	var m uint64
	if min != "" {
		if m, err = strconv.ParseUint(min, 16, 16); err != nil {
			return 0, fmt.Errorf("handle %q: bad minor", s)
		}
	}
	return MakeHandle(uint16(M), uint16(m)), nil
}

// U32Handle formats a u32 filter handle (htid:bucket:node) the way tc's
// "handle" and "ht" arguments read it.
func U32Handle(h uint32) string {
	htid, bucket, node := h>>20, (h>>12)&0xFF, h&0xFFF
	switch {
	case htid == 0 && bucket == 0:
		return fmt.Sprintf("::%x", node)
	case node == 0:
		return fmt.Sprintf("%x:%x:", htid, bucket)
	}
	return fmt.Sprintf("%x:%x:%x", htid, bucket, node)
}

// U32 handle parts.
func U32HTID(h uint32) uint32   { return h & 0xFFF00000 }
func U32Bucket(h uint32) uint32 { return (h >> 12) & 0xFF }
func U32Node(h uint32) uint32   { return h & 0xFFF }

// MakeU32Handle builds htid:bucket:node from a table id (0..0xFFF).
func MakeU32Handle(table, bucket, node uint32) uint32 {
	return table<<20 | (bucket&0xFF)<<12 | node&0xFFF
}

// MarshalText writes the handle as tc does.
func (h Handle) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (h *Handle) UnmarshalText(b []byte) error {
	v, err := ParseHandle(string(b))
	*h = v
	return err
}
