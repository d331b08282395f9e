package bpf_test

import (
	"errors"
	"math/rand"
	"net/netip"
	"sync"
	"testing"

	"sluice/bpf"
	"sluice/bpf/bpftest"
	"sluice/testutil"
	"sluice/units"
)

// edtContent sorts UDP packets to aggregates by destination port: port
// 1000+i goes to aggregate i (counter i+1, histogram i+1), anything else
// to the default (index 0). Port 5000 and up is exempt by rule.
func edtContent(rates []units.Rate, bursts []uint32, horizon uint64) *bpf.Content {
	c := &bpf.Content{L2Len: 14, TestClock: true, EDT: &bpf.EDT{Horizon: horizon, Exempt: 2, Pool: 9,
		Queues: [2]bpf.QueueRange{{First: 0, Count: 3}, {First: 3, Count: 1}}, Prio: true}}
	for i := range rates {
		c.Targets = append(c.Targets, bpf.Target{Classid: uint32(0x10010 + i), Counter: uint32(i + 1),
			Rate: rates[i], Burst: bursts[i], Hist: uint16(i + 1), Prod: uint8(i % 2)})
		if i > 0 {
			c.Rules = append(c.Rules, bpf.Rule{Family: 4, Flags: bpf.RuleL4, SportHi: 0xffff,
				DportLo: uint16(1000 + i), DportHi: uint16(1000 + i), Kind: bpf.KindClass, Target: uint32(i)})
		}
	}
	c.Rules = append(c.Rules, bpf.Rule{Family: 4, Flags: bpf.RuleL4, SportHi: 0xffff, DportLo: 5000, DportHi: 0xffff})
	n := uint32(len(c.Rules))
	c.Blocks = []bpf.Block{{First: 0, Count: n - 1}, {First: n - 1, Count: 1}}
	return c
}

func udpFrame(size int, sport, dport uint16) []byte {
	p := testutil.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
		Proto: 17, Sport: sport, Dport: dport}
	p.Payload = max(0, size-14-p.IPLength())
	return p.Frame()
}

// TestEDTAgreesWithReference runs random packet sequences (sizes, gaps
// from back-to-back to long idle, rates, bursts, horizons, three
// aggregates) through the BPF program and through the Go reference
// pacer, and demands for every packet the same verdict and departure
// time, and at the end the same departure clocks, horizon drops and
// delay histograms.
func TestEDTAgreesWithReference(t *testing.T) {
	testutil.RequireRoot(t)
	rng := rand.New(rand.NewSource(20010))
	const aggs = 3
	prog, err := bpftest.Writable(bpf.Load(edtContent(make([]units.Rate, aggs), make([]uint32, aggs), 1e9)))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	sequences := 400
	if testing.Short() {
		sequences = 80
	}
	now := uint64(1e12)
	idx := []uint32{1, 2, 3, 9}
	var wantHist [aggs + 1][bpf.DelayBuckets]uint64
	var wantSum [aggs + 1]uint64
	drops, stamped, packets := 0, 0, 0
	for seq := 0; seq < sequences; seq++ {
		rates, bursts, horizons := make([]units.Rate, aggs), make([]uint32, aggs), make([]uint64, aggs)
		for i := range rates {
			rates[i] = units.Rate(1000 + rng.Intn(200_000_000)) // 8 kbit/s to 1.6 Gbit/s
			if rng.Intn(10) == 0 {
				rates[i] = 0 // not paced
			}
			if rng.Intn(2) == 0 {
				bursts[i] = uint32(rng.Intn(20_000_000))
			}
			if rng.Intn(3) == 0 {
				horizons[i] = uint64(1e5 + rng.Intn(3e8)) // the aggregate's own
			}
		}
		horizon := uint64(1e6 + rng.Intn(2e9))
		if rng.Intn(2) == 0 {
			horizon = uint64(1e4 + rng.Intn(5e6))
		}
		c := edtContent(rates, bursts, horizon)
		for i := range c.Targets {
			c.Targets[i].Horizon = horizons[i]
		}
		if rng.Intn(2) == 0 { // a shared cap over the three
			c.EDT.PoolRate, c.EDT.PoolBurst = units.Rate(1000+rng.Intn(200_000_000)), uint64(rng.Intn(10_000_000))
		}
		if rng.Intn(2) == 0 { // a link layer
			c.EDT.Link = bpf.Link{Overhead: int32(rng.Intn(321) - 64), MPU: uint16(rng.Intn(3) * 64), ATM: rng.Intn(2) == 0}
		}
		if err := prog.Write(c, nil); err != nil {
			t.Fatal(err)
		}
		state, err := prog.Paces(idx)
		if err != nil {
			t.Fatal(err)
		}
		ref := make([]*bpf.Clock, aggs)
		for i := range ref {
			ref[i] = &bpf.Clock{TNext: state[uint32(i+1)].T_next, Drops: state[uint32(i+1)].Drops, Rate: state[uint32(i+1)].Rate}
		}
		model := &bpf.Pacing{Horizon: horizon, Pool: &bpf.Clock{TNext: state[9].T_next, Rate: state[9].Rate}, PoolRate: c.EDT.PoolRate, PoolBurst: c.EDT.PoolBurst}
		for n := 5 + rng.Intn(60); n > 0; n-- {
			switch rng.Intn(4) {
			case 0: // back to back
			case 1:
				now += uint64(rng.Intn(10_000))
			case 2:
				now += uint64(rng.Intn(10_000_000))
			default:
				now += uint64(rng.Intn(3e9))
			}
			a := rng.Intn(aggs)
			f := udpFrame(64+rng.Intn(1451), 4000, uint16(1000+a))
			var ts uint64 // TCP's own departure time, sometimes
			switch rng.Intn(4) {
			case 0:
				ts = now + uint64(rng.Intn(5e6))
			case 1:
				ts = now - uint64(rng.Intn(5e6))
			}
			pkt := bpf.Packet{Frame: f, Time: now, Tstamp: ts}
			if rng.Intn(4) == 0 { // a GSO packet of 2 to 43 segments (at most 64 KiB, as the kernel takes)
				pkt.GSOSegs = uint32(2 + rng.Intn(42))
				pkt.WireLen = pkt.GSOSegs*uint32(len(f)) - uint32(rng.Intn(len(f)-60))
			}
			n := uint32(len(f))
			if pkt.WireLen > 0 {
				n = pkt.WireLen
			}
			wantDepart, wantDrop := model.Stamp(now, ts, c.EDT.Link.Bytes(n, max(pkt.GSOSegs, 1)), ref[a], rates[a], uint64(bursts[a]), horizons[a], a%2 == 1)
			res, err := prog.Run(pkt)
			if err != nil {
				t.Fatal(err)
			}
			packets++
			if wantDrop {
				drops++
				if res.Verdict != bpf.VerdictShot {
					t.Fatalf("seq %d: aggregate %d (rate %d, horizon %d): packet at %d passed, the reference drops it", seq, a, rates[a], horizon, now)
				}
				continue
			}
			wantTs := ts
			if wantDepart > now {
				wantTs = wantDepart
			}
			if res.Verdict != bpf.VerdictOK || res.Tstamp != wantTs {
				t.Fatalf("seq %d: aggregate %d (rate %d, burst %d): packet of %d bytes at %d (tstamp %d): verdict %d departs %d, reference %d",
					seq, a, rates[a], bursts[a], len(f), now, ts, res.Verdict, res.Tstamp, wantTs)
			}
			if rates[a] != 0 {
				wantHist[a+1][bpf.DelayBucket(max(wantDepart, now)-now)]++
				wantSum[a+1] += max(wantDepart, now) - now
			}
			if wantDepart > now {
				stamped++
			}
			if wantPrio := uint32(6 * (a % 2)); res.Priority != wantPrio {
				t.Fatalf("aggregate %d: priority %d, want %d", a, res.Priority, wantPrio)
			}
		}
		state, err = prog.Paces(idx)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range ref {
			if got := state[uint32(i+1)]; got.T_next != r.TNext || got.Drops != r.Drops || got.Rate != r.Rate {
				t.Fatalf("seq %d: aggregate %d: t_next %d drops %d rate %d, reference %d, %d and %d", seq, i, got.T_next, got.Drops, got.Rate, r.TNext, r.Drops, r.Rate)
			}
		}
		if got := state[9].T_next; got != model.Pool.TNext {
			t.Fatalf("seq %d: pool t_next %d, reference %d", seq, got, model.Pool.TNext)
		}
	}
	for h := 1; h <= aggs; h++ {
		got, sum, err := prog.Delays(uint16(h))
		if err != nil {
			t.Fatal(err)
		}
		if got != wantHist[h] || sum != wantSum[h] {
			t.Fatalf("delay histogram %d: %v sum %d, reference %v sum %d", h, got, sum, wantHist[h], wantSum[h])
		}
	}
	if stamped < packets/4 || drops == 0 {
		t.Fatalf("the sequences exercised too little: %d of %d packets delayed, %d dropped", stamped, packets, drops)
	}
	t.Logf("%d sequences, %d packets: %d delayed, %d dropped beyond the horizon", sequences, packets, stamped, drops)
}

// TestEDTBurstThenPace: an aggregate idle for longer than its burst
// sends burst x rate bytes at once, then one packet per len/rate.
func TestEDTBurstThenPace(t *testing.T) {
	testutil.RequireRoot(t)
	const rate = 1_250_000 // 10 Mbit/s
	const burst = 5_000_000
	prog, err := bpftest.Writable(bpf.Load(edtContent([]units.Rate{rate}, []uint32{burst}, 2e9)))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	f := udpFrame(1250, 4000, 1000) // 1 ms at the rate
	now := uint64(10e9)
	var departs []uint64
	for i := 0; i < 10; i++ {
		res, err := prog.Run(bpf.Packet{Frame: f, Time: now})
		if err != nil || res.Verdict != bpf.VerdictOK {
			t.Fatalf("packet %d: %v verdict %d", i, err, res.Verdict)
		}
		departs = append(departs, max(res.Tstamp, now)) // untouched (0): at once
	}
	// 5 ms of credit: packets 0-4 use it, packet 5 takes the slot that
	// starts now (as after any idle time), then 1 ms apart.
	for i, d := range departs {
		want := now
		if i > 5 {
			want = now + uint64(i-5)*1e6
		}
		if d != want {
			t.Fatalf("packet %d departs %d ns after now, want %d (all: %v)", i, d-now, want-now, departs)
		}
	}
}

// TestEDTRaisedCapRescalesLead: a slow cap fills its horizon; raised 100
// times with a shorter horizon (the sharing controller releasing a
// light class), the next packet takes the slot the clock's lead stands
// for at the new rate, instead of a drop beyond the new horizon; a
// lowered cap keeps the lead.
func TestEDTRaisedCapRescalesLead(t *testing.T) {
	testutil.RequireRoot(t)
	const slow = 2_500 // 20 kbit/s: a 1250-byte frame every 500 ms
	c := edtContent([]units.Rate{slow}, []uint32{0}, 2e9)
	prog, err := bpftest.Writable(bpf.Load(c))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	f := udpFrame(1250, 4000, 1000)
	now := uint64(10e9)
	run := func(at uint64) bpf.Result {
		t.Helper()
		res, err := prog.Run(bpf.Packet{Frame: f, Time: at})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// Slots at +0, +0.5, ... +2.0 s (the horizon itself); the sixth's
	// would start at 2.5 s, beyond it.
	for i := 0; i < 5; i++ {
		if res := run(now); res.Verdict != bpf.VerdictOK {
			t.Fatalf("slow packet %d dropped", i)
		}
	}
	if res := run(now); res.Verdict != bpf.VerdictShot {
		t.Fatalf("the slow cap's sixth packet passed (departs %d ns on): its horizon is full", res.Tstamp-now)
	}
	// The lead is 2.5 s at 2500 bytes/s. Raised to 250000 bytes/s with a
	// 100 ms horizon: 25 ms at the new rate.
	c.Targets[0].Rate, c.Targets[0].Horizon = 250_000, 100e6
	if err := prog.Write(c, nil); err != nil {
		t.Fatal(err)
	}
	res := run(now)
	if res.Verdict != bpf.VerdictOK {
		t.Fatalf("after the raise the packet was dropped: the slow cap's lead was kept")
	}
	if d := res.Tstamp - now; d < 24e6 || d > 26e6 {
		t.Fatalf("after the raise the packet departs %d ns on, want the lead at the new rate, 25 ms", d)
	}
	// Lowered again, the lead (now 30 ms: the raised packet's 5 ms slot
	// added) is kept, and a packet takes its 500 ms slot after it.
	c.Targets[0].Rate, c.Targets[0].Horizon = slow, 2e9
	if err := prog.Write(c, nil); err != nil {
		t.Fatal(err)
	}
	if res := run(now); res.Verdict != bpf.VerdictOK || res.Tstamp-now != 30e6 {
		t.Fatalf("after lowering: verdict %d, departs %d ns on, want 30 ms (the lead kept)", res.Verdict, res.Tstamp-now)
	}
	st, err := prog.Paces([]uint32{1})
	if err != nil {
		t.Fatal(err)
	}
	if got := st[1]; got.Rate != slow || got.T_next != now+530e6 || got.Drops != 1 {
		t.Fatalf("clock: rate %d t_next +%d drops %d; want %d, +530 ms, 1", got.Rate, got.T_next-now, got.Drops, slow)
	}
}

// TestEDTCountsLinkBytes: with a link layer the program paces what a
// packet costs on the line. A 1514-byte frame with 26 bytes of overhead
// is 33 ATM cells, 1749 bytes: at 1749000 bytes/s one leaves each
// millisecond, and a GSO packet of 10 such segments takes 10 ms.
func TestEDTCountsLinkBytes(t *testing.T) {
	testutil.RequireRoot(t)
	c := edtContent([]units.Rate{1_749_000}, []uint32{0}, 2e9)
	c.EDT.Link = bpf.Link{Overhead: 26, ATM: true}
	prog, err := bpftest.Writable(bpf.Load(c))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	f := udpFrame(1514, 4000, 1000)
	now := uint64(10e9)
	run := func(p bpf.Packet) uint64 {
		t.Helper()
		p.Frame, p.Time = f, now
		res, err := prog.Run(p)
		if err != nil || res.Verdict != bpf.VerdictOK {
			t.Fatalf("%v verdict %d", err, res.Verdict)
		}
		return max(res.Tstamp, now) - now
	}
	for i := 0; i < 5; i++ {
		if d := run(bpf.Packet{}); d != uint64(i)*1e6 {
			t.Fatalf("packet %d departs %d ns after now, want %d ms", i, d, i)
		}
	}
	if d := run(bpf.Packet{WireLen: 10 * 1514, GSOSegs: 10}); d != 5e6 {
		t.Fatalf("the GSO packet departs %d ns after now, want 5 ms", d)
	}
	if d := run(bpf.Packet{}); d != 15e6 {
		t.Fatalf("the packet after 10 segments departs %d ns after now, want 15 ms", d)
	}
}

// TestEDTExemptions: NTP (UDP port 123 either side) and the policy's
// exempt rules keep their timestamp and take no slot, even from a
// backlogged aggregate; they still count in their class.
func TestEDTExemptions(t *testing.T) {
	testutil.RequireRoot(t)
	prog, err := bpftest.Writable(bpf.Load(edtContent([]units.Rate{125_000}, []uint32{0}, 2e9))) // 1 Mbit/s
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	now := uint64(50e9)
	bulk := udpFrame(1250, 4000, 1000) // 10 ms each
	for i := 0; i < 5; i++ {
		if _, err := prog.Run(bpf.Packet{Frame: bulk, Time: now}); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := prog.Paces([]uint32{1})
	for _, f := range [][]byte{udpFrame(90, 123, 4000), udpFrame(90, 4000, 123), udpFrame(90, 123, 123), udpFrame(200, 4000, 5001)} {
		const stamp = 12345 // what ntpd would read
		res, err := prog.Run(bpf.Packet{Frame: f, Time: now, Tstamp: stamp})
		if err != nil {
			t.Fatal(err)
		}
		if res.Verdict != bpf.VerdictOK || res.Tstamp != stamp {
			t.Fatalf("exempt packet: verdict %d, tstamp %d; want it untouched (%d)", res.Verdict, res.Tstamp, stamp)
		}
	}
	after, _ := prog.Paces([]uint32{1})
	if after[1] != before[1] {
		t.Fatalf("exempt packets moved the aggregate's clock: %+v -> %+v", before[1], after[1])
	}
	// The same port on TCP is not NTP.
	tcp := testutil.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: 6, Sport: 123, Dport: 123, TCPFlags: 0x10, Payload: 100}
	res, err := prog.Run(bpf.Packet{Frame: tcp.Frame(), Time: now})
	if err != nil || res.Tstamp <= now {
		t.Fatalf("TCP port 123 was not paced: %v, departs %d ns after now", err, res.Tstamp-now)
	}
	counts, _ := prog.Counts([]uint32{1})
	if counts[1].Packets != 10 {
		t.Fatalf("class counter %d packets, want 10 (exempt ones count too)", counts[1].Packets)
	}
}

// TestEDTGroupCapsItsHosts: two hosts capped at 10 Mbit/s in a group
// capped at 1 Mbit/s (a namespace's pods) take slots on the group's
// clock too, so together they leave at the group's cap; the group's
// counter counts what passed. A packet beyond the horizon gives back its
// slot on both clocks.
func TestEDTGroupCapsItsHosts(t *testing.T) {
	testutil.RequireRoot(t)
	const hostRate, groupRate = 1_250_000, 125_000 // 10 and 1 Mbit/s
	const horizon = 35e6                           // 3 packets queued at the group's cap, and a bit
	c := edtContent([]units.Rate{hostRate, hostRate, hostRate, groupRate}, make([]uint32, 4), horizon)
	c.Targets[1].Group, c.Targets[2].Group = 4, 4 // the group: target 3, + 1
	c.Targets[1].Prod, c.Targets[2].Prod, c.Targets[3].Prod = 0, 0, 0
	prog, err := bpftest.Writable(bpf.Load(c))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	now := uint64(20e9)
	var departs []uint64
	drops := 0
	for i := 0; i < 6; i++ {
		res, err := prog.Run(bpf.Packet{Frame: udpFrame(1250, 4000, uint16(1001+i%2)), Time: now}) // 10 ms at the group's cap
		if err != nil {
			t.Fatal(err)
		}
		if res.Verdict != bpf.VerdictOK {
			drops++
			continue
		}
		departs = append(departs, max(res.Tstamp, now)-now)
	}
	// Slots at 0, 10, 20 and 30 ms fit the 35 ms horizon; the two after
	// them would leave at 40 and 50 ms.
	want := []uint64{0, 10e6, 20e6, 30e6}
	if len(departs) != len(want) || drops != 2 {
		t.Fatalf("departures %v ns after now, %d dropped; want %v and 2 dropped", departs, drops, want)
	}
	for i := range want {
		if departs[i] != want[i] {
			t.Fatalf("departures %v ns after now, want %v", departs, want)
		}
	}
	paces, _ := prog.Paces([]uint32{2, 3, 4})
	// Each host passed two 1 ms slots, the group four 10 ms ones: the
	// dropped packets' slots were given back on both.
	if paces[2].T_next != now+2e6 || paces[3].T_next != now+2e6 || paces[4].T_next != now+40e6 {
		t.Fatalf("clocks after now: hosts %d and %d, group %d ns; want 2e6, 2e6 and 40e6",
			paces[2].T_next-now, paces[3].T_next-now, paces[4].T_next-now)
	}
	counts, _ := prog.Counts([]uint32{2, 3, 4})
	if counts[2].Packets != 2 || counts[3].Packets != 2 || counts[4].Packets != 4 {
		t.Fatalf("counters: hosts %d and %d packets, group %d; want 2, 2 and 4", counts[2].Packets, counts[3].Packets, counts[4].Packets)
	}
}

// TestEDTConcurrentCPUs runs the program on one aggregate from several
// goroutines at once, thousands of times each inside the kernel, at one
// instant: if t_next moved by a plain read-modify-write, concurrent
// packets would take the same slot and the clock would end short. With
// atomic updates it ends exactly at floor + passed x len/rate, and each
// packet beyond the horizon gave its slot back.
func TestEDTConcurrentCPUs(t *testing.T) {
	testutil.RequireRoot(t)
	const rate = 1_000_000_000 // 1 ns per byte
	for _, horizon := range []uint64{1 << 62, 30e6} {
		prog, err := bpftest.Writable(bpf.Load(edtContent([]units.Rate{rate}, []uint32{0}, horizon)))
		if err != nil {
			t.Fatal(err)
		}
		f := udpFrame(1000, 4000, 1000)
		now := uint64(100e9)
		const workers, repeat = 4, 50_000
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := prog.RunRepeat(bpf.Packet{Frame: f, Time: now}, repeat); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		st, err := prog.Paces([]uint32{1})
		if err != nil {
			t.Fatal(err)
		}
		counts, _ := prog.Counts([]uint32{1})
		passed := counts[1].Packets
		// Every run is counted once, passed or dropped. A test run that
		// a signal interrupts (the Go runtime's preemption) is started
		// again from its first repetition (cilium/ebpf's Run), so there
		// may be more runs than asked: 218,693 of 200,000 in a CI run.
		if passed+st[1].Drops < workers*repeat {
			t.Fatalf("horizon %d: %d passed + %d dropped, want at least %d runs", horizon, passed, st[1].Drops, workers*repeat)
		}
		if want := now + passed*uint64(len(f)); st[1].T_next != want {
			t.Fatalf("horizon %d: t_next %d, want now + %d packets x %d ns = %d (lost updates: %d)",
				horizon, st[1].T_next, passed, len(f), want, (int64(want)-int64(st[1].T_next))/int64(len(f)))
		}
		if horizon < 1e9 && (st[1].Drops == 0 || passed > horizon/uint64(len(f))+uint64(workers)) {
			t.Fatalf("horizon %d ns: %d passed, %d dropped; at most %d fit", horizon, passed, st[1].Drops, horizon/uint64(len(f))+1)
		}
		t.Logf("horizon %d: %d runs asked on %d goroutines (%d run): %d passed, %d dropped, t_next exact", horizon, workers*repeat, workers, passed+st[1].Drops, passed, st[1].Drops)
		prog.Close()
	}
}

// SwapHosts writes host entries only when every one holds what the
// caller says it does; otherwise nothing is written (the agent then
// plans in full). TestEDTAgentEditsHostsInPlace shows the new cap on
// traffic.
func TestSwapHosts(t *testing.T) {
	testutil.RequireRoot(t)
	c := edtContent([]units.Rate{125_000}, []uint32{0}, 2e9)
	c.Rules = append([]bpf.Rule{{Family: 4, Flags: bpf.RuleL4, SportHi: 0xffff, DportLo: 2000, DportHi: 2000, Kind: bpf.KindHosts, Target: 0}}, c.Rules...)
	c.Blocks[0].Count++
	c.Blocks[1].First++
	a, b := netip.MustParsePrefix("10.0.0.2/32"), netip.MustParsePrefix("10.0.0.3/32")
	ka, kb := bpf.HostKeyOf(0, a), bpf.HostKeyOf(0, b)
	slow := bpf.Target{Counter: 5, Rate: 125_000, Hist: 1}
	c.Hosts = map[bpf.HostKey]bpf.Target{ka: slow, kb: slow}
	prog, err := bpftest.Writable(bpf.Load(c))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	fast := slow
	fast.Rate = 1_250_000
	// b's old value is wrong: nothing is written, a included.
	wrong := fast
	if err := prog.SwapHosts(map[bpf.HostKey]bpf.Target{ka: slow, kb: wrong}, map[bpf.HostKey]bpf.Target{ka: fast, kb: fast}, nil); err == nil {
		t.Fatal("SwapHosts wrote over an entry that did not hold the old value")
	}
	got, err := prog.Read()
	if err != nil {
		t.Fatal(err)
	}
	if got.Hosts[ka] != slow || got.Hosts[kb] != slow {
		t.Fatalf("a refused swap changed the entries: %+v", got.Hosts)
	}
	// A key the table does not hold is refused too.
	kc := bpf.HostKeyOf(0, netip.MustParsePrefix("10.0.0.4/32"))
	if err := prog.SwapHosts(map[bpf.HostKey]bpf.Target{kc: slow}, map[bpf.HostKey]bpf.Target{kc: fast}, nil); err == nil {
		t.Fatal("SwapHosts added a host")
	}
	if err := prog.SwapHosts(map[bpf.HostKey]bpf.Target{ka: slow}, map[bpf.HostKey]bpf.Target{ka: fast}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ = prog.Read(); got.Hosts[ka] != fast || got.Hosts[kb] != slow || len(got.Hosts) != 2 {
		t.Fatalf("after the swap: %+v", got.Hosts)
	}
	// A write refused half way (the executor's count, a fault): the
	// entries written before it get their old values back.
	writes := 0
	refuseSecond := func() error {
		if writes++; writes == 2 {
			return errors.New("refused")
		}
		return nil
	}
	if err := prog.SwapHosts(map[bpf.HostKey]bpf.Target{ka: fast, kb: slow}, map[bpf.HostKey]bpf.Target{ka: slow, kb: fast}, refuseSecond); err == nil {
		t.Fatal("a refused write: no error")
	}
	if got, _ = prog.Read(); got.Hosts[ka] != fast || got.Hosts[kb] != slow || writes != 2 {
		t.Fatalf("after a swap refused half way (%d writes tried): %+v", writes, got.Hosts)
	}
	// LookupHosts (a group's controller reading its hosts' caps): the
	// entries asked for, a key the table lacks left out.
	seen, err := prog.LookupHosts([]bpf.HostKey{ka, kc})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[ka] != fast {
		t.Fatalf("LookupHosts(a, c) = %+v, want a's entry alone", seen)
	}
}
