package tc

import (
	"fmt"

	"github.com/vishvananda/netlink/nl"
)

// Stab is a qdisc's size table: the packet size its scheduler counts,
// for a link that adds bytes to every packet (PPPoE, VLAN, an ADSL
// modem's AAL5 trailer) or carries it in cells (ATM: 48 bytes of each
// 53). Set on the root qdisc, it is what every class under it charges
// and shapes by. sluice sends it as tc(8) computes it from `stab
// overhead N linklayer L [mpu M]`, so that an exported script makes the
// same table.
type Stab struct {
	// Overhead is added to every packet's length (may be negative).
	Overhead int32
	// Linklayer: LinkEthernet (bytes as they are) or LinkATM (rounded
	// up to whole 48-byte cells, 53 bytes each).
	Linklayer uint32
	// MPU is the least size a packet counts as (0: none).
	MPU uint32
}

// Link layers of a size table (tc's enum link_layer).
const (
	LinkEthernet = 1
	LinkATM      = 2
)

const (
	tcaStab     = 8 // TCA_STAB
	tcaStabBase = 1 // TCA_STAB_BASE: struct tc_sizespec
	tcaStabData = 2 // TCA_STAB_DATA: the table, u16 each

	stabMTU   = 2047 // tc's defaults
	stabTSize = 512
)

// String renders s as tc's arguments.
func (s *Stab) String() string {
	ll := "ethernet"
	if s.Linklayer == LinkATM {
		ll = "atm"
	}
	out := fmt.Sprintf("stab overhead %d linklayer %s", s.Overhead, ll)
	if s.MPU > 0 {
		out += fmt.Sprintf(" mpu %d", s.MPU)
	}
	return out
}

// Size is the length s makes a packet of n bytes count as.
func (s *Stab) Size(n int) int {
	spec, table := s.table()
	return stabLen(spec, table, n)
}

// sizeSpec is struct tc_sizespec.
type sizeSpec struct {
	cellLog, sizeLog uint8
	cellAlign        int16
	overhead         int32
	linklayer        uint32
	mpu, mtu, tsize  uint32
}

// table computes the size table as tc_calc_size_table does: none for
// Ethernet without an mpu (the kernel adds the overhead alone); else
// 512 entries over 2047 bytes, each entry the size of a packet as long
// as the entry's upper end.
func (s *Stab) table() (sizeSpec, []uint16) {
	spec := sizeSpec{overhead: s.Overhead, linklayer: s.Linklayer, mpu: s.MPU}
	if s.Linklayer <= LinkEthernet && s.MPU == 0 {
		return spec, nil
	}
	spec.mtu, spec.tsize = stabMTU, stabTSize
	for spec.mtu>>spec.cellLog > spec.tsize-1 {
		spec.cellLog++
	}
	table := make([]uint16, spec.tsize)
again:
	for i := int(spec.tsize) - 1; i >= 0; i-- {
		sz := uint32(i+1) << spec.cellLog
		sz = max(sz, s.MPU)
		if s.Linklayer == LinkATM {
			sz = (sz + 47) / 48 * 53
		}
		if sz>>spec.sizeLog > 0xffff {
			spec.sizeLog++
			goto again
		}
		table[i] = uint16(sz >> spec.sizeLog)
	}
	spec.cellAlign = -1
	return spec, table
}

// stabLen is qdisc_calculate_pkt_len: what a packet of n bytes counts
// as under the table.
func stabLen(spec sizeSpec, table []uint16, n int) int {
	l := n + int(spec.overhead)
	if spec.tsize == 0 {
		return max(l, 1)
	}
	slot := l + int(spec.cellAlign)
	if slot < 0 {
		slot = 0
	}
	slot >>= spec.cellLog
	var pkt int
	if slot < int(spec.tsize) {
		pkt = int(table[slot])
	} else {
		pkt = int(table[spec.tsize-1])*(slot/int(spec.tsize)) + int(table[slot%int(spec.tsize)])
	}
	pkt <<= spec.sizeLog
	return max(pkt, 1)
}

// attr encodes s as TCA_STAB.
func (s *Stab) attr() *nl.RtAttr {
	spec, table := s.table()
	b := make([]byte, 24)
	b[0], b[1] = spec.cellLog, spec.sizeLog
	native.PutUint16(b[2:], uint16(spec.cellAlign))
	native.PutUint32(b[4:], uint32(spec.overhead))
	native.PutUint32(b[8:], spec.linklayer)
	native.PutUint32(b[12:], spec.mpu)
	native.PutUint32(b[16:], spec.mtu)
	native.PutUint32(b[20:], spec.tsize)
	a := nl.NewRtAttr(tcaStab, nil)
	a.AddRtAttr(tcaStabBase, b)
	if len(table) > 0 {
		d := make([]byte, 2*len(table))
		for i, v := range table {
			native.PutUint16(d[2*i:], v)
		}
		a.AddRtAttr(tcaStabData, d)
	}
	return a
}

// decodeStab reads TCA_STAB as the kernel dumps it (the spec alone).
func decodeStab(b []byte) *Stab {
	base := parseAttrs(b)[tcaStabBase]
	if len(base) < 24 {
		return nil
	}
	return &Stab{Overhead: int32(native.Uint32(base[4:])), Linklayer: native.Uint32(base[8:]), MPU: native.Uint32(base[12:])}
}
