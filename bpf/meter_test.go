package bpf_test

import (
	"encoding/binary"
	"math/rand"
	"net/netip"
	"testing"

	"sluice/bpf"
	"sluice/bpf/bpftest"
	"sluice/testutil"
)

// policerContent is a classifier whose every packet goes to one class
// with policer p: green passes, yellow is remarked to DSCP 63 (no test
// packet carries it), red is dropped, so that each packet's colour can be
// read off the verdict and the DSCP that comes out.
func policerContent(p bpf.Policer) *bpf.Content {
	p.Act = [3]uint8{bpf.ActPass, bpf.ActRemark, bpf.ActDrop}
	p.DSCP = [3]uint8{0, 63, 0}
	return &bpf.Content{L2Len: 14, SetPriority: true, TestClock: true,
		Blocks:   []bpf.Block{{}},
		Targets:  []bpf.Target{{Classid: 0x10010, Counter: 1, Policer: 1}},
		Policers: []bpf.Policer{p}}
}

// ipv4Checksum computes the header checksum of the IPv4 header at h.
func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i < len(h); i += 2 {
		if i == 10 {
			continue
		}
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func testFrame(size int, dscp uint8, v6 bool) []byte {
	p := testutil.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
		Proto: 17, Sport: 1000, Dport: 2000, TOS: dscp<<2 | 1}
	if v6 {
		p.Src, p.Dst = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	}
	p.Payload = max(0, size-14-p.IPLength())
	f := p.Frame()
	if !v6 {
		binary.BigEndian.PutUint16(f[24:], ipv4Checksum(f[14:34]))
	}
	return f
}

func frameDSCP(f []byte) uint8 {
	if binary.BigEndian.Uint16(f[12:]) == 0x86DD {
		return uint8((binary.BigEndian.Uint16(f[14:])>>4)&0xff) >> 2
	}
	return f[15] >> 2
}

// TestMetersAgreeWithRFCReference runs thousands of random packet
// sequences through the BPF policers and through the Go reference meters
// (meter.go, from RFC 2697 and 2698) and demands the same colour for
// every packet, the right action for each colour, a valid IPv4 checksum
// after remarking, and per-colour counters that add up.
func TestMetersAgreeWithRFCReference(t *testing.T) {
	testutil.RequireRoot(t)
	rng := rand.New(rand.NewSource(2697))
	prog, err := bpftest.Writable(bpf.Load(policerContent(bpf.Policer{CIR: 1000, CBS: 1500, EBS: 1500})))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	sequences, packets := 2000, 0
	if testing.Short() {
		sequences = 300
	}
	var want [3]uint64
	for seq := 0; seq < sequences; seq++ {
		p := bpf.Policer{Mode: uint8(rng.Intn(2)), Aware: rng.Intn(2) == 0,
			CIR: uint64(1000 + rng.Intn(20_000_000)), CBS: uint64(64 + rng.Intn(60_000))}
		p.EBS = uint64(rng.Intn(60_000))
		if p.Mode == bpf.TrTCM {
			p.PIR = p.CIR + uint64(rng.Intn(20_000_000))
			p.EBS = p.CBS + uint64(rng.Intn(60_000))
		}
		if rng.Intn(20) == 0 {
			p.CBS = 0 // every packet exceeds C
		}
		c := policerContent(p)
		if err := prog.Write(c, nil); err != nil {
			t.Fatal(err)
		}
		ref := bpf.NewMeter(p)
		now := uint64(1 + rng.Intn(1e9))
		n := 5 + rng.Intn(40)
		for i := 0; i < n; i++ {
			switch rng.Intn(4) {
			case 0: // back to back
			case 1:
				now += uint64(rng.Intn(1000))
			case 2:
				now += uint64(rng.Intn(10_000_000))
			default:
				now += uint64(rng.Intn(2_000_000_000))
			}
			dscp := uint8(rng.Intn(63))
			v6 := rng.Intn(3) == 0
			f := testFrame(64+rng.Intn(1451), dscp, v6)
			pre := bpf.Green
			if p.Aware {
				pre = bpf.PreColour(dscp)
			}
			// Policers charge IP bytes (RFC 2697/2698), not the frame.
			wantColour := ref.Colour(now, uint32(len(f)-14), pre)
			res, err := prog.Run(bpf.Packet{Frame: f, Time: now})
			if err != nil {
				t.Fatal(err)
			}
			got := bpf.Green
			switch {
			case res.Verdict == bpf.VerdictShot:
				got = bpf.Red
			case frameDSCP(res.Frame) == 63:
				got = bpf.Yellow
			case frameDSCP(res.Frame) != dscp:
				t.Fatalf("seq %d packet %d: DSCP %d became %d", seq, i, dscp, frameDSCP(res.Frame))
			}
			if got != wantColour {
				t.Fatalf("seq %d packet %d (policer %+v, t=%d, %d bytes, pre-colour %d): BPF says colour %d, the RFC reference %d",
					seq, i, p, now, len(f), pre, got, wantColour)
			}
			if got == bpf.Yellow && !v6 {
				if sum := binary.BigEndian.Uint16(res.Frame[24:]); sum != ipv4Checksum(res.Frame[14:34]) {
					t.Fatalf("seq %d packet %d: IPv4 checksum %#x after remark, want %#x", seq, i, sum, ipv4Checksum(res.Frame[14:34]))
				}
				if res.Frame[15]&3 != 1 {
					t.Fatalf("remark lost the ECN bits: TOS %#x", res.Frame[15])
				}
			}
			if res.Priority != 0x10010 {
				t.Fatalf("priority %#x, want the class 1:10", res.Priority)
			}
			want[got]++
			packets++
		}
	}
	got, err := prog.Colours(1)
	if err != nil {
		t.Fatal(err)
	}
	for c := 0; c < 3; c++ {
		if got[c].Packets != want[c] {
			t.Errorf("colour %d counter: %d packets, want %d", c, got[c].Packets, want[c])
		}
	}
	if want[bpf.Green] == 0 || want[bpf.Yellow] == 0 || want[bpf.Red] == 0 {
		t.Errorf("the random sequences never produced some colour: %v", want)
	}
	t.Logf("%d sequences, %d packets: green %d yellow %d red %d", sequences, packets, want[0], want[1], want[2])
}

type meterStep struct {
	now  uint64
	size uint32
	pre  int
	want int
}

// TestMeterReference checks the reference itself on cases worked by hand
// from the RFCs' rules.
func TestMeterReference(t *testing.T) {
	run := func(name string, p bpf.Policer, steps []meterStep) {
		m := bpf.NewMeter(p)
		for i, s := range steps {
			if got := m.Colour(s.now, s.size, s.pre); got != s.want {
				t.Fatalf("%s step %d: colour %d, want %d", name, i, got, s.want)
			}
		}
	}
	// srTCM, CIR 1000 B/s, CBS 1000, EBS 500, both buckets full.
	run("srTCM", bpf.Policer{Mode: bpf.SrTCM, CIR: 1000, CBS: 1000, EBS: 500}, []meterStep{
		{1, 600, bpf.Green, bpf.Green},         // Tc 1000 -> 400
		{1, 600, bpf.Green, bpf.Red},           // Tc 400, Te 500: neither covers 600
		{1, 500, bpf.Green, bpf.Yellow},        // Te 500 -> 0
		{1 + 1e9, 1000, bpf.Green, bpf.Green},  // +1000: Tc to 1000 (600), the rest (400) to Te
		{1 + 1e9, 500, bpf.Green, bpf.Red},     // Tc 0, Te 400
		{1 + 1e9, 400, bpf.Yellow, bpf.Yellow}, // aware: yellow may only take E
		{1 + 2e9, 100, bpf.Red, bpf.Red},       // aware: red stays red
	})
	// trTCM, CIR 1000, CBS 1000, PIR 2000, PBS 2000.
	run("trTCM", bpf.Policer{Mode: bpf.TrTCM, CIR: 1000, CBS: 1000, PIR: 2000, EBS: 2000}, []meterStep{
		{1, 800, bpf.Green, bpf.Green},        // Tp 1200, Tc 200
		{1, 800, bpf.Green, bpf.Yellow},       // Tc short: Tp 400
		{1, 800, bpf.Green, bpf.Red},          // Tp short
		{1, 100, bpf.Yellow, bpf.Yellow},      // aware: yellow stays yellow, Tp 300
		{1, 100, bpf.Red, bpf.Red},            // red stays red
		{5e8 + 1, 600, bpf.Green, bpf.Green},  // 0.5 s: Tc 700, Tp 1300
		{5e8 + 1, 200, bpf.Green, bpf.Yellow}, // Tc 100 < 200, Tp 700
	})
	for d, want := range map[uint8]int{10: bpf.Green, 12: bpf.Yellow, 14: bpf.Red, 36: bpf.Yellow, 38: bpf.Red, 46: bpf.Green, 0: bpf.Green, 8: bpf.Green} {
		if got := bpf.PreColour(d); got != want {
			t.Errorf("PreColour(%d) = %d, want %d", d, got, want)
		}
	}
}

// A GSO packet bigger than the committed burst still conforms when its
// first segment does, and is charged in full: the next packet finds the
// bucket in debt.
func TestMeterGSOPacketsGoIntoDebt(t *testing.T) {
	testutil.RequireRoot(t)
	prog, err := bpftest.Writable(bpf.Load(policerContent(bpf.Policer{Mode: bpf.SrTCM, CIR: 1_000_000, CBS: 3000})))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	f := testFrame(1500, 0, false)
	steps := []struct {
		now        uint64
		wire, segs uint32
		want       uint32
	}{
		{1e9, 64000, 44, bpf.VerdictOK},        // first segment fits 3000: green, bucket at -61000
		{1e9 + 1, 0, 0, bpf.VerdictShot},       // in debt: red
		{1e9 + 60e6, 0, 0, bpf.VerdictShot},    // 60 ms at 1 MB/s pays back 60000: still short
		{1e9 + 64e6, 0, 0, bpf.VerdictOK},      // 64 ms: 3000 again
		{1e9 + 64e6, 64000, 44, bpf.VerdictOK}, // 1500 left covers a 1454-byte segment
		{1e9 + 64e6, 0, 0, bpf.VerdictShot},
	}
	for i, s := range steps {
		res, err := prog.Run(bpf.Packet{Frame: f, Time: s.now, WireLen: s.wire, GSOSegs: s.segs})
		if err != nil {
			t.Fatal(err)
		}
		if res.Verdict != s.want {
			t.Fatalf("step %d: verdict %d, want %d", i, res.Verdict, s.want)
		}
	}
}

// Policers charge the IP bytes of every packet a skb stands for, the
// same on an egress hook (where the stack's wire_len counts each GSO
// segment with its Ethernet header) and on an ingress hook (where a
// GRO packet carries its headers once): a 3-segment train of 1000-byte
// frames costs 3 x 986 bytes on both.
func TestPolicersChargeIPBytesOnEveryHook(t *testing.T) {
	testutil.RequireRoot(t)
	for _, ingress := range []bool{false, true} {
		c := policerContent(bpf.Policer{Mode: bpf.SrTCM, CIR: 1000, CBS: 986})
		c.Ingress = ingress
		prog, err := bpftest.Writable(bpf.Load(c))
		if err != nil {
			t.Fatal(err)
		}
		defer prog.Close()
		// One packet whose IP bytes exactly fill the committed burst.
		if res, err := prog.Run(bpf.Packet{Frame: testFrame(1000, 0, false), Time: 1e9}); err != nil || res.Verdict != bpf.VerdictOK {
			t.Fatalf("ingress %v: a 986-byte IP packet against CBS 986: verdict %d, %v (the frame's 1000 bytes were charged?)", ingress, res.Verdict, err)
		}
		// A train of 3 segments: on egress one 1000-byte frame standing
		// for a wire_len of 3 x 1000; on ingress one GRO packet holding
		// 3 x 958 bytes of payload behind one IP+UDP header.
		pkt := bpf.Packet{Frame: testFrame(1000, 0, false), Time: 100e9, WireLen: 3000, GSOSegs: 3}
		if ingress {
			pkt = bpf.Packet{Frame: testFrame(14+28+3*958, 0, false), Time: 100e9, GSOSegs: 3}
		}
		if _, err := prog.Run(pkt); err != nil {
			t.Fatal(err)
		}
		got, err := prog.Colours(1)
		if err != nil {
			t.Fatal(err)
		}
		if got[bpf.Green].Bytes != 986+3*986 || got[bpf.Green].Packets != 2 {
			t.Errorf("ingress %v: green %d packets, %d bytes; want 2 packets of 986 + 2958 IP bytes", ingress, got[bpf.Green].Packets, got[bpf.Green].Bytes)
		}
	}
}
