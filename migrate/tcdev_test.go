package migrate

import (
	"net/netip"
	"strings"
	"testing"

	"sluice/tc"
	"sluice/units"
)

// snapshot builds a device as a hand-written script leaves it: an HTB
// root 1: with default 30, class 1:1 and leaves 1:10 and 1:30, and the
// given u32 filters on the root.
func snapshot(filters ...*tc.Filter) *tc.Snapshot {
	h := func(minor uint16) tc.Handle { return tc.MakeHandle(1, minor) }
	class := func(minor, parent uint16, mbit float64, prio uint32) *tc.Class {
		r := units.FromBits(mbit * 1e6)
		return &tc.Class{Dev: "eth0", Handle: h(minor), Parent: h(parent), Kind: "htb", Rate: r, Ceil: units.FromBits(10e6), Prio: prio, Burst: 1600, Cburst: 1600}
	}
	s := &tc.Snapshot{Dev: "eth0", Filters: map[tc.Handle][]*tc.Filter{}}
	s.Qdiscs = []*tc.Qdisc{
		{Dev: "eth0", Parent: tc.HandleRoot, Handle: h(0), Kind: "htb", HTB: &tc.HTBQdisc{Default: 0x30}},
		{Dev: "eth0", Parent: h(0x30), Handle: tc.MakeHandle(0x30, 0), Kind: "bfifo", Fifo: &tc.Fifo{Limit: 200 << 10}},
	}
	s.Classes = []*tc.Class{class(1, 0, 10, 0), class(0x10, 1, 2, 0), class(0x30, 1, 8, 2)}
	s.Classes[0].Parent = h(0)
	for i, f := range filters {
		f.Dev, f.Parent = "eth0", h(0)
		if f.Prio == 0 {
			f.Prio = uint16(i + 1)
		}
		if f.Kind == "" {
			f.Kind = "u32"
		}
		if f.Handle == 0 {
			f.Handle, f.Raw = 0x80000800+uint32(i), 0x80000800+uint32(i)
		}
		s.Filters[h(0)] = append(s.Filters[h(0)], f)
	}
	return s
}

func ptr8(v uint8) *uint8 { return &v }

func u32(proto uint16, classid uint16, keys ...tc.Key) *tc.Filter {
	return &tc.Filter{Proto: proto, U32: &tc.U32{Sel: &tc.Sel{Keys: keys}, ClassID: tc.MakeHandle(1, classid)}}
}

func TestTCReadsU32Keys(t *testing.T) {
	for _, tc0 := range []struct {
		name string
		f    *tc.Filter
		want string // the entry as rendered, or the refusal's text
	}{
		{"dscp", u32(0x0800, 0x10, tc.Key{Off: 0, Mask: 0x00fc0000, Val: 0x00b80000}), "{src: 0.0.0.0/0, dscp: 46}"},
		{"tos", u32(0x0800, 0x10, tc.Key{Off: 0, Mask: 0x00ff0000, Val: 0x00100000}), "{src: 0.0.0.0/0, tos: 0x10/0xff}"},
		{"protocol and port", u32(0x0800, 0x10, tc.Key{Off: 8, Mask: 0x00ff0000, Val: 0x00060000}, tc.Key{Off: 20, Mask: 0x0000ffff, Val: 22}), "{src: 0.0.0.0/0, proto: tcp, dport: 22}"},
		{"port range", u32(0x0800, 0x10, tc.Key{Off: 20, Mask: 0xfc000000, Val: 0x04000000}), "{src: 0.0.0.0/0, sport: 1024-2047}"},
		{"prefixes", u32(0x0800, 0x10, tc.Key{Off: 12, Mask: 0xffffff00, Val: 0xc0a80100}, tc.Key{Off: 16, Mask: 0xffffffff, Val: 0x0a000001}), "{src: 192.168.1.0/24, dst: 10.0.0.1}"},
		{"icmp", u32(0x0800, 0x10, tc.Key{Off: 8, Mask: 0x00ff0000, Val: 0x00010000}), "{proto: icmp}"},
		{"everything", u32(tc.ProtoAll, 0x10, tc.Key{}), "{src: 0.0.0.0/0}"},
		{"ipv6 prefix", u32(0x86dd, 0x10, tc.Key{Off: 24, Mask: 0xffffffff, Val: 0x20010db8}, tc.Key{Off: 28, Mask: 0xffff0000, Val: 0x00010000}), "{dst: '2001:db8:1::/48'}"},
		{"small acks", u32(0x0800, 0x10, tc.Key{Off: 8, Mask: 0x00ff0000, Val: 0x00060000}, tc.Key{Off: 0, Mask: 0x0f00ffc0, Val: 0x05000000}, tc.Key{Off: 32, Mask: 0x00ff0000, Val: 0x00100000}), "{src: 0.0.0.0/0, tcp_ack: true}"},
		{"mark", &tc.Filter{Proto: tc.ProtoAll, U32: &tc.U32{Sel: &tc.Sel{Keys: []tc.Key{{}}}, ClassID: tc.MakeHandle(1, 0x10), Mark: &tc.Mark{Val: 0x10, Mask: 0xff}}}, "{mark: 0x10/0xff}"},
		{"nexthdr", u32(0x0800, 0x10, tc.Key{Off: 0, Mask: 0x0000ffff, Val: 22, NextHdr: true}), "refused: a nexthdr+ key"},
		{"payload byte", u32(0x0800, 0x10, tc.Key{Off: 48, Mask: 0xff000000, Val: 0x47000000}), "refused: a key at offset 48"},
		{"odd port mask", u32(0x0800, 0x10, tc.Key{Off: 20, Mask: 0x0000f0f0, Val: 0x10}), "refused: port mask 0xf0f0"},
		{"hash table", &tc.Filter{Proto: 0x0800, U32: &tc.U32{Divisor: 256}}, "refused: hash tables"},
		{"basic", &tc.Filter{Proto: 0x0800, Kind: "basic"}, "refused: only u32, fw, flower and matchall filters"},
		{"no such class", u32(0x0800, 0x99, tc.Key{}), "refused: no such class"},
		// fw: (mark & mask) == handle; its protocol keeps the family.
		{"fw", &tc.Filter{Proto: 0x0800, Kind: "fw", Handle: 0x10, FW: &tc.FW{Mask: 0xff, ClassID: tc.MakeHandle(1, 0x10)}}, "{src: 0.0.0.0/0, mark: 0x10/0xff}"},
		{"fw both families", &tc.Filter{Proto: tc.ProtoAll, Kind: "fw", Handle: 7, FW: &tc.FW{Mask: 0xffffffff, ClassID: tc.MakeHandle(1, 0x10)}}, "{mark: 7}"},
		{"fw with a policer", &tc.Filter{Proto: 0x0800, Kind: "fw", Handle: 7, FW: &tc.FW{Mask: 0xffffffff, ClassID: tc.MakeHandle(1, 0x10), Actions: true}}, "refused: actions or a policer"},
		{"fw without classid", &tc.Filter{Proto: 0x0800, Kind: "fw", Handle: 7, FW: &tc.FW{Mask: 0xffffffff}}, "refused: no classid"},
		// flower: keys as sluice's fields, masks of leading ones as ranges.
		{"flower", &tc.Filter{Proto: 0x0800, Kind: "flower", Handle: 1, Flower: &tc.Flower{ClassID: tc.MakeHandle(1, 0x10), EthType: 0x0800, IPProto: ptr8(17),
			Dst: netip.MustParsePrefix("10.1.2.0/24"), DstPort: &tc.Masked16{Val: 1024, Mask: 0xfc00}, TOS: &tc.Masked8{Val: 0xb8, Mask: 0xfc}}}, "{dst: 10.1.2.0/24, proto: udp, dport: 1024-2047, dscp: 46}"},
		{"flower host", &tc.Filter{Proto: 0x0800, Kind: "flower", Handle: 1, Flower: &tc.Flower{ClassID: tc.MakeHandle(1, 0x10), EthType: 0x0800,
			Src: netip.MustParsePrefix("192.0.2.7/32"), TOS: &tc.Masked8{Val: 0x10, Mask: 0x1e}}}, "{src: 192.0.2.7, tos: 0x10/0x1e}"},
		{"flower family", &tc.Filter{Proto: 0x0800, Kind: "flower", Handle: 1, Flower: &tc.Flower{ClassID: tc.MakeHandle(1, 0x10), EthType: 0x0800, IPProto: ptr8(1)}}, "{src: 0.0.0.0/0, proto: icmp}"},
		{"flower vlan", &tc.Filter{Proto: 0x0800, Kind: "flower", Handle: 1, Flower: &tc.Flower{ClassID: tc.MakeHandle(1, 0x10), Unknown: []string{"vlan_id"}}}, "refused: no field for: vlan_id"},
		{"flower port mask", &tc.Filter{Proto: 0x0800, Kind: "flower", Handle: 1, Flower: &tc.Flower{ClassID: tc.MakeHandle(1, 0x10), IPProto: ptr8(6), DstPort: &tc.Masked16{Val: 0x10, Mask: 0xf0f0}}}, "refused: port mask 0xf0f0"},
		// A matchall of one family is a rule (the other family goes on).
		{"matchall ipv6", &tc.Filter{Proto: 0x86dd, Kind: "matchall", Handle: 1, Matchall: &tc.Matchall{ClassID: tc.MakeHandle(1, 0x10)}}, "{src: '::/0'}"},
	} {
		t.Run(tc0.name, func(t *testing.T) {
			d, err := TC(&Live{Dev: snapshot(tc0.f)}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(tc0.want, "refused: ") {
				if err := d.Report.Refusals(); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(tc0.want, "refused: ")) {
					t.Errorf("refusals %v, want %q", err, tc0.want)
				}
				return
			}
			if err := d.Report.Refusals(); err != nil {
				t.Fatal(err)
			}
			if y := string(d.Render()); !strings.Contains(y, "- "+tc0.want+"\n") {
				t.Errorf("want entry %s in:\n%s", tc0.want, y)
			}
		})
	}
}

// A matchall for every protocol after the other filters takes what
// they leave: the tree's default, whatever the qdisc's says.
func TestTCFinalMatchallIsTheDefault(t *testing.T) {
	s := snapshot(
		u32(0x0800, 0x30, tc.Key{Off: 20, Mask: 0x0000ffff, Val: 80}),
		&tc.Filter{Proto: tc.ProtoAll, Kind: "matchall", Handle: 1, Matchall: &tc.Matchall{ClassID: tc.MakeHandle(1, 0x10)}},
	)
	d, err := TC(&Live{Dev: s}, Options{})
	if err != nil || d.Report.Refusals() != nil {
		t.Fatal(err, d.Report.Refusals())
	}
	tr := d.Interfaces[0].Egress
	if tr.Default != "class-10" || len(tr.Classes[0].Match)+len(tr.Classes[1].Match) != 1 {
		t.Errorf("default %s, want class-10 (the matchall's) with no rule of its own:\n%s", tr.Default, d.Render())
	}
	wantFinding(t, d, Exact, `pref 2`, `the tree's default`)
	// Before another filter it is a rule, and the order note says what
	// sluice's class order changes.
	s = snapshot(
		&tc.Filter{Proto: tc.ProtoAll, Kind: "matchall", Handle: 1, Matchall: &tc.Matchall{ClassID: tc.MakeHandle(1, 0x10)}},
		u32(0x0800, 0x30, tc.Key{Off: 20, Mask: 0x0000ffff, Val: 80}),
	)
	if d, err = TC(&Live{Dev: s}, Options{}); err != nil || d.Report.Refusals() != nil {
		t.Fatal(err, d.Report.Refusals())
	}
	if y := string(d.Render()); !strings.Contains(y, "- {src: 0.0.0.0/0}\n") || !strings.Contains(y, "- {src: '::/0'}\n") {
		t.Errorf("a matchall before other filters: every packet of both families, as rules:\n%s", y)
	}
}

// An fw filter orders its class as a u32 filter does: by its prio.
func TestTCFwFilterOrdersItsClass(t *testing.T) {
	s := snapshot(
		&tc.Filter{Proto: 0x0800, Kind: "fw", Handle: 0x10, FW: &tc.FW{Mask: 0xff, ClassID: tc.MakeHandle(1, 0x30)}},
		u32(0x0800, 0x10, tc.Key{Off: 20, Mask: 0x0000ffff, Val: 22}),
	)
	d, err := TC(&Live{Dev: s}, Options{})
	if err != nil || d.Report.Refusals() != nil {
		t.Fatal(err, d.Report.Refusals())
	}
	if cs := d.Interfaces[0].Egress.Classes; cs[0].Name != "class-30" || cs[0].Match[0].Mark != "0x10/0xff" {
		t.Errorf("the fw filter (prio 1) comes first, its class first:\n%s", d.Render())
	}
}

// The tree's shape: one root class is the tree's rate, the default
// comes from the qdisc, bfifo limits and leaf prios carry over, tc's
// one-MTU bursts are left to sluice, filter order orders siblings.
func TestTCTree(t *testing.T) {
	s := snapshot(
		u32(0x0800, 0x30, tc.Key{Off: 20, Mask: 0x0000ffff, Val: 80}),
		u32(0x0800, 0x10, tc.Key{Off: 20, Mask: 0x0000ffff, Val: 22}),
	)
	d, err := TC(&Live{Dev: s}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr := d.Interfaces[0].Egress
	if tr.Rate != "10mbit" || tr.Default != "class-30" || len(tr.Classes) != 2 {
		t.Fatalf("tree: rate %s default %s, %d classes", tr.Rate, tr.Default, len(tr.Classes))
	}
	if c := tr.Classes[0]; c.Name != "class-30" || c.Leaf != "bfifo" || c.Limit != "200kb" || *c.Prio != 2 || c.Burst != "" {
		t.Errorf("first class %+v: want class-30 (its filter comes first), bfifo 200kb, prio 2, no burst", c)
	}
	if c := tr.Classes[1]; c.Leaf != "pfifo" || c.Prio != nil {
		t.Errorf("class-10: leaf %q prio %v, want HTB's own pfifo and prio 0", c.Leaf, c.Prio)
	}
	wantFinding(t, d, Approximated, `dev eth0$`, `3 class\(es\) had tc's default burst`)
	// A root sluice does not build is refused, not ignored.
	s.Qdiscs[0].Kind = "tbf"
	if d, err := TC(&Live{Dev: s}, Options{}); err != nil || d.Report.Refusals() == nil || !strings.Contains(d.Report.Refusals().Error(), "root qdisc tbf") {
		t.Errorf("a tbf root: %v %v", err, d.Report.Refusals())
	}
	// An ingress hook with a policer on it is refused at its filter.
	s.Qdiscs[0].Kind = "htb"
	s.Filters[tc.MakeHandle(0xffff, 0)] = []*tc.Filter{{Dev: "eth0", Parent: tc.MakeHandle(0xffff, 0), Prio: 49152, Kind: "u32", Handle: 0x80000800, Raw: 0x80000800,
		U32: &tc.U32{Sel: &tc.Sel{Keys: []tc.Key{{}}}, RedirectDev: "?unsupported-action"}}}
	if d, _ := TC(&Live{Dev: s}, Options{}); d.Report.Refusals() == nil || !strings.Contains(d.Report.Refusals().Error(), "pref 49152 handle 800:0:800: ingress filter") {
		t.Errorf("a policer on the ingress hook: %v", d.Report.Refusals())
	}
}

// Any u32 keys a kernel may hold: refused, or a policy that validates.
func FuzzTCKeys(f *testing.F) {
	f.Add(uint16(0x0800), int32(20), uint32(0x0000ffff), uint32(22), int32(12), uint32(0xffffff00), uint32(0x0a000000), false)
	f.Add(uint16(0x86dd), int32(24), uint32(0xffffffff), uint32(0x20010db8), int32(4), uint32(0x0000ff00), uint32(0x00000600), false)
	f.Fuzz(func(t *testing.T, proto uint16, off1 int32, m1, v1 uint32, off2 int32, m2, v2 uint32, nh bool) {
		f := u32(proto, 0x10, tc.Key{Off: off1, Mask: m1, Val: v1}, tc.Key{Off: off2, Mask: m2, Val: v2, NextHdr: nh})
		d, err := TC(&Live{Dev: snapshot(f)}, Options{})
		if err != nil || d.Report.Refusals() != nil {
			return
		}
		if err := d.Check(); err != nil {
			t.Fatalf("an import without refusals does not validate: %v\n%s", err, d.Render())
		}
	})
}
