package tc

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
)

func flowerOpts(attrs ...*nl.RtAttr) []byte {
	var b []byte
	for _, a := range attrs {
		b = append(b, a.Serialize()...)
	}
	return b
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func TestDecodeFlower(t *testing.T) {
	classid := make([]byte, 4)
	native.PutUint32(classid, uint32(MakeHandle(1, 0x10)))
	f := decodeFlower(flowerOpts(
		nl.NewRtAttr(nl.TCA_FLOWER_CLASSID, classid),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_ETH_TYPE, be16(0x0800)),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_IP_PROTO, []byte{6}),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_IPV4_DST, []byte{10, 1, 2, 3}),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_IPV4_DST_MASK, []byte{255, 255, 255, 0}),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_TCP_DST, be16(1024)),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_TCP_DST_MASK, be16(0xfc00)),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_IP_TOS, []byte{0xb8}),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_IP_TOS_MASK, []byte{0xfc}),
		nl.NewRtAttr(nl.TCA_FLOWER_FLAGS, []byte{0, 0, 0, 0}),
		nl.NewRtAttr(nl.TCA_FLOWER_IN_HW_COUNT, []byte{0, 0, 0, 0}), // the kernel's dump has it
	))
	if f.ClassID != MakeHandle(1, 0x10) || f.EthType != 0x0800 || f.IPProto == nil || *f.IPProto != 6 ||
		f.Dst != netip.MustParsePrefix("10.1.2.0/24") || f.Src.IsValid() || f.DstPort == nil || *f.DstPort != (Masked16{1024, 0xfc00}) ||
		f.TOS == nil || *f.TOS != (Masked8{0xb8, 0xfc}) || len(f.Unknown) != 0 || f.Actions {
		t.Errorf("decoded %+v", f)
	}
	// Keys sluice has no field for are named; a mask that is no prefix
	// is not read as one.
	f = decodeFlower(flowerOpts(
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_VLAN_ID, be16(7)),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_IPV4_SRC, []byte{10, 0, 0, 1}),
		nl.NewRtAttr(nl.TCA_FLOWER_KEY_IPV4_SRC_MASK, []byte{255, 0, 255, 0}),
	))
	if len(f.Unknown) != 2 || f.Unknown[0] != "vlan_id" || f.Src.IsValid() {
		t.Errorf("unknown keys %q, src %v", f.Unknown, f.Src)
	}
}
