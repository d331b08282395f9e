package bpf_test

import (
	"net/netip"
	"testing"
	"time"

	"sluice/bpf"
	"sluice/bpf/bpftest"
	"sluice/testutil"
)

// rttPair loads the two hooks of an interface: out records the packets
// it classifies (TCP to port 80 in class 1's histogram, to 443 in 2's,
// to 8080 in a per-host class whose hosts count in 3's, client4 with
// counter hostCounter, anything else in the default's, 0), back ends
// the samples (echoes only); they share one flow map.
func rttPair(t *testing.T, observe bool) (out, back *bpf.Writer) {
	t.Helper()
	testutil.RequireRoot(t)
	c := &bpf.Content{L2Len: 14, TestClock: true, SetPriority: !observe, RTT: &bpf.RTT{Record: true, Observe: observe},
		Targets: []bpf.Target{{Classid: 0x10010, Counter: 1}, {Classid: 0x10011, Counter: 2, Rtt: 1}, {Classid: 0x10012, Counter: 3, Rtt: 2}},
		Rules: []bpf.Rule{
			{Family: 4, Flags: bpf.RuleL4, SportHi: 0xffff, DportLo: 80, DportHi: 80, Kind: bpf.KindClass, Target: 1},
			{Family: 6, Flags: bpf.RuleL4, SportHi: 0xffff, DportLo: 80, DportHi: 80, Kind: bpf.KindClass, Target: 1},
			{Family: 4, Flags: bpf.RuleL4, SportHi: 0xffff, DportLo: 443, DportHi: 443, Kind: bpf.KindClass, Target: 2},
			{Family: 4, Flags: bpf.RuleL4, SportHi: 0xffff, DportLo: 8080, DportHi: 8080, Kind: bpf.KindHosts, Aux: bpf.HostsBySrc},
		},
		Blocks: []bpf.Block{{First: 0, Count: 4}},
		Hosts:  map[bpf.HostKey]bpf.Target{bpf.HostKeyOf(0, netip.PrefixFrom(client4, 32)): {Classid: 0x10020, Counter: hostCounter, Rtt: 3}}}
	var err error
	if out, err = bpftest.Writable(bpf.Load(c)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(out.Close)
	e := &bpf.Content{L2Len: 14, TestClock: true, RTT: &bpf.RTT{Echo: true, Observe: true},
		Targets: []bpf.Target{{Counter: 1}}, Blocks: []bpf.Block{{}}}
	if back, err = bpftest.Writable(bpf.LoadShared(e, out.Program)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(back.Close)
	return out, back
}

const hostCounter = 9

var (
	client4, server4 = netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("203.0.113.5")
	client6, server6 = netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("2001:db8:1::5")
)

// seg is a TCP segment from client to server (reply: the other way),
// with timestamps val and ecr unless untimed.
func seg(v6, reply bool, dport uint16, flags uint8, val, ecr uint32, untimed bool) []byte {
	p := testutil.Packet{Src: client4, Dst: server4, Proto: 6, Sport: 40000, Dport: dport, TCPFlags: flags, Payload: 100}
	if v6 {
		p.Src, p.Dst = client6, server6
	}
	if reply {
		p.Src, p.Dst, p.Sport, p.Dport = p.Dst, p.Src, p.Dport, p.Sport
		p.Payload = 0
	}
	if !untimed {
		p.TCPOptions = testutil.TCPTimestamps(val, ecr)
	}
	return p.Frame()
}

const ms = uint64(time.Millisecond)

func run(t *testing.T, p *bpf.Writer, frame []byte, at uint64) bpf.Result {
	t.Helper()
	r, err := p.Run(bpf.Packet{Frame: frame, Time: at})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// samples reads histogram i: its count and median.
func samples(t *testing.T, p *bpf.Writer, i uint32) (uint64, time.Duration) {
	t.Helper()
	hs, err := p.RTT([]uint32{i})
	if err != nil {
		t.Fatal(err)
	}
	h := hs[i]
	med, _ := bpf.Quantile(h, 0.5)
	return h.Count, med
}

func near(got, want time.Duration) bool {
	d := got - want
	return d < 0 && -d <= want/16 || d >= 0 && d <= want/16
}

// A data packet's TSval is echoed by the reply's TSecr: one sample, the
// time between them, in the packet's class; the same value again (later
// segments of the same millisecond, a retransmission) starts none, nor
// does an older echo end one.
func TestRTTTimestampEchoes(t *testing.T) {
	// One pair of programs for both families (a load takes 13 s on the
	// 6.1 lane's emulated guest): their flows differ, the counts add up.
	out, back := rttPair(t, false)
	for i, v6 := range []bool{false, true} {
		n0 := uint64(2 * i)
		run(t, out, seg(v6, false, 80, 0x18, 100, 7, false), 1*ms)
		run(t, out, seg(v6, false, 80, 0x10, 100, 7, false), 3*ms) // same TSval: not a new sample
		run(t, back, seg(v6, true, 80, 0x10, 8, 99, false), 10*ms) // an older echo: ours is still out
		run(t, back, seg(v6, true, 80, 0x10, 9, 100, false), 21*ms)
		if n, med := samples(t, out, 1); n != n0+1 || i == 0 && !near(med, 20*time.Millisecond) {
			t.Errorf("v6 %v: %d samples, median %v; want %d, of 20ms", v6, n, med, n0+1)
		}
		// The same echo again (a duplicate ACK) ends nothing more; the
		// same TSval again (a retransmission) starts nothing.
		run(t, back, seg(v6, true, 80, 0x10, 9, 100, false), 25*ms)
		run(t, out, seg(v6, false, 80, 0x10, 100, 9, false), 26*ms)
		run(t, back, seg(v6, true, 80, 0x10, 10, 100, false), 40*ms)
		// A reordered segment with an older TSval starts nothing either.
		run(t, out, seg(v6, false, 80, 0x10, 99, 9, false), 41*ms)
		run(t, back, seg(v6, true, 80, 0x10, 10, 99, false), 42*ms)
		// The next value does: 5 ms.
		run(t, out, seg(v6, false, 80, 0x10, 101, 10, false), 50*ms)
		run(t, back, seg(v6, true, 80, 0x10, 11, 101, false), 55*ms)
		if n, med := samples(t, out, 1); n != n0+2 {
			t.Errorf("v6 %v: %d samples after duplicates, reordering and a 5 ms round trip; want %d (median %v)", v6, n, n0+2, med)
		}
		c, err := out.RTTCounts()
		if err != nil {
			t.Fatal(err)
		}
		e, _ := back.RTTCounts()
		if c.Recorded != n0+2 || e.Matched != n0+2 || e.Missed != 0 {
			t.Errorf("v6 %v: recorded %d, matched %d, missed %d; want %d, %d, 0", v6, c.Recorded, e.Matched, e.Missed, n0+2, n0+2)
		}
	}
}

// A pure ACK starts no sample: its echo waits for whenever the peer next
// has data to send, which is no round trip of the path.
func TestRTTPureACKsStartNone(t *testing.T) {
	out, back := rttPair(t, false)
	ack := testutil.Packet{Src: client4, Dst: server4, Proto: 6, Sport: 40000, Dport: 80, TCPFlags: 0x10,
		TCPOptions: testutil.TCPTimestamps(100, 7)}
	run(t, out, ack.Frame(), 1*ms)
	run(t, back, seg(false, true, 80, 0x18, 9, 100, false), 300*ms)
	if n, _ := samples(t, out, 1); n != 0 {
		t.Errorf("%d samples from a pure ACK's echo", n)
	}
	if c, _ := out.RTTCounts(); c.Recorded != 0 {
		t.Errorf("recorded %d", c.Recorded)
	}
}

// An echo whose timestamps come after a SACK block (the options walked,
// not the usual two NOPs first) ends its sample like any other.
func TestRTTEchoAfterSACK(t *testing.T) {
	out, back := rttPair(t, false)
	run(t, out, seg(false, false, 80, 0x18, 700, 1, false), 1*ms)
	sack := []byte{1, 1, 5, 10, 0, 0, 0x10, 0, 0, 0, 0x20, 0}
	ack := testutil.Packet{Src: server4, Dst: client4, Proto: 6, Sport: 80, Dport: 40000, TCPFlags: 0x10,
		TCPOptions: append(sack, testutil.TCPTimestamps(5, 700)...)}
	run(t, back, ack.Frame(), 31*ms)
	if n, med := samples(t, out, 1); n != 1 || !near(med, 30*time.Millisecond) {
		t.Errorf("%d samples, median %v; want 1 of 30ms", n, med)
	}
}

// Samples go to the class of the packet that started them, whichever
// class the reply would be in.
func TestRTTByClass(t *testing.T) {
	out, back := rttPair(t, false)
	run(t, out, seg(false, false, 443, 0x18, 500, 1, false), 0)
	run(t, back, seg(false, true, 443, 0x10, 2, 500, false), 30*ms)
	run(t, out, seg(false, false, 22, 0x18, 700, 1, false), 0) // no rule: the default class's (0)
	run(t, back, seg(false, true, 22, 0x10, 2, 700, false), 2*ms)
	for i, want := range map[uint32]time.Duration{0: 2 * time.Millisecond, 1: 0, 2: 30 * time.Millisecond} {
		n, med := samples(t, out, i)
		if want == 0 && n != 0 || want != 0 && (n != 1 || !near(med, want)) {
			t.Errorf("histogram %d: %d samples, median %v; want %v", i, n, med, want)
		}
	}
}

// A host's samples count in its class's histogram at once, and in its
// own (by its counter, on the hook that started them) on its flow's
// next packet; the host's quantiles are a quarter octave coarse.
func TestRTTByHost(t *testing.T) {
	out, back := rttPair(t, false)
	for i, d := range []uint64{12, 14, 16, 40} {
		at := uint64(i) * 100 * ms
		run(t, out, seg(false, false, 8080, 0x18, uint32(100+i), 1, false), at)
		run(t, back, seg(false, true, 8080, 0x10, 2, uint32(100+i), false), at+d*ms)
	}
	if n, _ := samples(t, out, 3); n != 4 {
		t.Fatalf("the per-host class's histogram has %d samples; want 4", n)
	}
	// Three are folded in by the packets that started the next ones; the
	// last waits for the flow's next packet.
	hs, err := out.HostRTT([]uint32{hostCounter, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	h := hs[hostCounter]
	if h == nil || h.Count != 3 || len(hs) != 1 {
		t.Fatalf("host histograms %v; want the host's only, with 3 samples", hs)
	}
	run(t, out, seg(false, false, 8080, 0x18, 200, 1, false), 1000*ms)
	hs, _ = out.HostRTT([]uint32{hostCounter})
	h = hs[hostCounter]
	if h.Count != 4 || h.Sum < 82*ms-1000 || h.Sum > 82*ms { // a clock of 0 reads as 1 ns
		t.Fatalf("after the next packet the host has %d samples summing to %v; want 4, 82ms", h.Count, time.Duration(h.Sum))
	}
	// p50 is 15 ms within the quarter-octave bucket's interpolation (the
	// class's is within a sixteenth), the largest in its bucket of 33.5
	// to 39.8 ms: the bucket's own bounds hold it.
	med, _ := bpf.HostQuantile(h, 0.5)
	top, _ := bpf.HostQuantile(h, 1)
	if d := med - 15*time.Millisecond; d < -2*time.Millisecond || d > 2*time.Millisecond {
		t.Errorf("host p50 %v; want 15ms within a quarter octave's interpolation", med)
	}
	if top < 33*time.Millisecond || top > 48*time.Millisecond {
		t.Errorf("host max %v; want the bucket that holds 40ms", top)
	}
}

// Flows without timestamps are counted untimed and give no sample but
// their handshake's (SYN to SYN-ACK); an echo of a later value than the
// one outstanding (its echo lost, or never seen: an asymmetric route)
// gives up the sample rather than read a wrong one, and so does a
// sample nothing answers within its expiry, when the flow's next value
// comes.
func TestRTTUntimedAndUnanswered(t *testing.T) {
	out, back := rttPair(t, false)
	run(t, out, seg(false, false, 80, 0x18, 0, 0, true), 0)
	run(t, back, seg(false, true, 80, 0x10, 0, 0, true), 5*ms)
	if n, _ := samples(t, out, 1); n != 0 {
		t.Fatalf("untimed data: %d samples", n)
	}
	// A handshake without timestamps (another port: another flow).
	syn := testutil.Packet{Src: client4, Dst: server4, Proto: 6, Sport: 40001, Dport: 443, TCPFlags: 0x02}
	synack := testutil.Packet{Src: server4, Dst: client4, Proto: 6, Sport: 443, Dport: 40001, TCPFlags: 0x12}
	run(t, out, syn.Frame(), 100*ms)
	run(t, back, synack.Frame(), 112*ms)
	if n, med := samples(t, out, 2); n != 1 || !near(med, 12*time.Millisecond) {
		t.Errorf("handshake: %d samples, median %v; want 1 of 12ms", n, med)
	}
	// The echo moves past the outstanding value.
	run(t, out, seg(false, false, 80, 0x18, 300, 0, false), 200*ms)
	run(t, back, seg(false, true, 80, 0x10, 1, 301, false), 220*ms)
	// Nothing answers 302: it stays out until its expiry.
	run(t, out, seg(false, false, 80, 0x18, 302, 1, false), 230*ms)
	run(t, out, seg(false, false, 80, 0x18, 303, 1, false), 240*ms) // still out: starts none
	run(t, out, seg(false, false, 80, 0x18, 400, 1, false), 5000*ms)
	run(t, back, seg(false, true, 80, 0x10, 2, 400, false), 5007*ms)
	n, med := samples(t, out, 1)
	if n != 1 || !near(med, 7*time.Millisecond) {
		t.Errorf("after a lost echo and an expiry: %d samples, median %v; want 1 of 7ms", n, med)
	}
	c, _ := out.RTTCounts()
	e, _ := back.RTTCounts()
	if c.Untimed != 2 || c.Missed != 1 || e.Missed != 1 || e.Matched != 2 {
		t.Errorf("counts: out %+v, back %+v; want 2 untimed (data, SYN), a miss each side, 2 matched", c, e)
	}
}

// An observing hook (HTB's u32 filters classify) records by the same
// rules but leaves the packet alone and lets later filters run; the
// options may come in any order, after others (a SYN's MSS, SACK and
// window scale).
func TestRTTObserveChangesNothing(t *testing.T) {
	out, back := rttPair(t, true)
	p := testutil.Packet{Src: client4, Dst: server4, Proto: 6, Sport: 40000, Dport: 443, TCPFlags: 0x02,
		TCPOptions: []byte{2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 3, 0xe8, 0, 0, 0, 0, 1, 3, 3, 7}}
	r := run(t, out, p.Frame(), 0)
	if r.Verdict != 0xffffffff || r.Priority != 0 {
		t.Errorf("observing: verdict %#x, priority %#x; want TC_ACT_UNSPEC and none", r.Verdict, r.Priority)
	}
	r = run(t, back, seg(false, true, 443, 0x12, 5, 1000, false), 9*ms)
	if r.Verdict != 0xffffffff {
		t.Errorf("echo hook: verdict %#x; want TC_ACT_UNSPEC", r.Verdict)
	}
	if n, med := samples(t, out, 2); n != 1 || !near(med, 9*time.Millisecond) {
		t.Errorf("%d samples, median %v; want 1 of 9ms", n, med)
	}
}

// The histogram's buckets are a sixteenth of an octave: any round trip
// reads back within 1/16 of itself, from microseconds to seconds.
func TestRTTQuantileResolution(t *testing.T) {
	out, back := rttPair(t, false)
	for i, d := range []time.Duration{30 * time.Microsecond, 700 * time.Microsecond, 3 * time.Millisecond, 47 * time.Millisecond, 1300 * time.Millisecond} {
		val := uint32(1000 + i)
		at := uint64(i) * 10 * uint64(time.Second)
		run(t, out, seg(false, false, 80, 0x18, val, 1, false), at)
		run(t, back, seg(false, true, 80, 0x10, 1, val, false), at+uint64(d))
		hs, err := out.RTT([]uint32{1})
		if err != nil {
			t.Fatal(err)
		}
		// The newest sample is the highest so far: the top quantile.
		got, _ := bpf.Quantile(hs[1], 1)
		if !near(got, d) {
			t.Errorf("%v reads %v", d, got)
		}
	}
}
