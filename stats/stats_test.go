package stats

import (
	"bytes"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"sluice/bpf"
	"sluice/units"
)

// Rates turns two readings into each class's rate in bytes per second,
// and gives none where the two cannot be compared.
func TestRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	reading := func(at time.Time, bytes map[string]uint64) *Sample {
		tr := &Tree{Device: "eth0"}
		for id, b := range bytes {
			tr.Classes = append(tr.Classes, &Class{ID: id, Bytes: b})
		}
		return &Sample{At: at, Trees: []*Tree{tr}}
	}
	for _, tc := range []struct {
		name       string
		prev       *Sample
		dt         time.Duration
		prevBytes  uint64
		bytes      uint64
		want       units.Rate // bytes/s
		wantAbsent bool       // prev has no such class
	}{
		{name: "1.25 MB in a second is 10 Mbit/s", prev: reading(t0, nil), dt: time.Second, prevBytes: 1_000, bytes: 1_251_000, want: 1_250_000},
		{name: "the same over half a second is twice that", dt: 500 * time.Millisecond, prevBytes: 0, bytes: 1_250_000, want: 2_500_000},
		{name: "idle", dt: time.Second, prevBytes: 500, bytes: 500, want: 0},
		{name: "a counter that went back (class made again) gives no rate", dt: time.Second, prevBytes: 5_000, bytes: 100, want: 0},
		{name: "readings at the same instant give no rate", dt: 0, prevBytes: 0, bytes: 1_000, want: 0},
		{name: "a class new in this reading has no rate yet", dt: time.Second, bytes: 1_000, wantAbsent: true, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prev := reading(t0, map[string]uint64{"1:10": tc.prevBytes})
			if tc.wantAbsent {
				prev = reading(t0, map[string]uint64{"1:20": 0})
			}
			cur := reading(t0.Add(tc.dt), map[string]uint64{"1:10": tc.bytes})
			Rates(prev, cur)
			if got := cur.Trees[0].Classes[0].Measured; got != tc.want {
				t.Errorf("measured %d bytes/s; want %d", got, tc.want)
			}
		})
	}
	cur := reading(t0, map[string]uint64{"1:10": 7})
	Rates(nil, cur) // the first reading
	if cur.Trees[0].Classes[0].Measured != 0 {
		t.Error("a first reading has a rate")
	}
}

// A tree whose counters were read later than its sample began (a long
// read of thousands of classes, a process descheduled after At) is
// measured between its reads: 1 MB over the 3.75 s between them is
// 266,667 bytes/s, where the samples' 4 s would say 250,000. A tree
// with no read time (the agent's HTB classes, read before) keeps At.
// A class's queue now is its backlog at the rate it passed: 62.5 KB
// at 10 Mbit/s is 50 ms; unknown on a first reading, and where it passed
// nothing; an EDT aggregate's (its clock's lead, set when read) kept.
func TestQueueDelay(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := &Sample{At: t0, Trees: []*Tree{{Device: "eth0", Classes: []*Class{{ID: "1:10"}, {ID: "1:11", Bytes: 7}, {ID: "edt:1"}}}}}
	lead := 0.004
	cur := &Sample{At: t0.Add(time.Second), Trees: []*Tree{{Device: "eth0", Classes: []*Class{
		{ID: "1:10", Bytes: 1_250_000, Backlog: 62_500}, {ID: "1:11", Bytes: 7, Backlog: 100}, {ID: "1:12", Bytes: 9, Backlog: 100},
		{ID: "edt:1", Bytes: 1_250_000, Backlog: 5_000, QueueDelay: &lead}}}}}
	Rates(prev, cur)
	c := cur.Trees[0].Classes
	if q := c[0].QueueDelay; q == nil || math.Abs(*q-0.05) > 1e-9 {
		t.Errorf("62.5 KB at 10 Mbit/s: queue %v, want 50 ms", q)
	}
	if c[1].QueueDelay != nil || c[2].QueueDelay != nil {
		t.Errorf("idle, and first read: queues %v and %v, want unknown", c[1].QueueDelay, c[2].QueueDelay)
	}
	if q := c[3].QueueDelay; q == nil || *q != 0.004 {
		t.Errorf("EDT: queue %v, want its lead, 4 ms", q)
	}
	c[0].RTT = rttOf(&bpf.RTTHist{Count: 40, Sum: 40 * 70e6})
	c[0].RTT.P50, c[0].RTT.P95, c[0].RTT.P99 = 0.07, 0.08, 0.09
	c[0].Name, c[3].Name = "users", "edt"
	c[3].RTT = &RTT{Samples: 3}
	var b bytes.Buffer
	cur.WriteText(&b, TextOptions{})
	for _, re := range []string{`ROUND TRIPS +SAMPLES +P50 +P95 +P99 +QUEUE NOW`, `users +40 +70\.0 ms +80\.0 ms +90\.0 ms +50\.0 ms`, `edt +3 +too few +4\.0 ms`} {
		if !regexp.MustCompile(re).MatchString(b.String()) {
			t.Errorf("no line matching %s:\n%s", re, b.String())
		}
	}
}

func TestRatesBetweenReads(t *testing.T) {
	t0 := time.Unix(1000, 0)
	reading := func(at, read time.Time, bytes uint64) *Sample {
		return &Sample{At: at, Trees: []*Tree{{Device: "eth0", read: read, Classes: []*Class{{ID: "edt:1", Bytes: bytes}}}}}
	}
	prev := reading(t0, t0.Add(500*time.Millisecond), 0)
	cur := reading(t0.Add(4*time.Second), t0.Add(4250*time.Millisecond), 1_000_000)
	Rates(prev, cur)
	if got := cur.Trees[0].Classes[0].Measured; got != 266_667 {
		t.Errorf("measured %d bytes/s between the reads; want 266,667", got)
	}
	prev = reading(t0, time.Time{}, 0)
	cur = reading(t0.Add(4*time.Second), t0.Add(4250*time.Millisecond), 1_000_000)
	Rates(prev, cur)
	if got := cur.Trees[0].Classes[0].Measured; got != 250_000 {
		t.Errorf("measured %d bytes/s with one read time unknown; want 250,000 (the samples' 4 s)", got)
	}
}

// A delay histogram's quantile is the upper bound of the bucket that
// holds it: a bound the packets waited less than, never an average.
func TestDelaysQuantile(t *testing.T) {
	upper := []uint64{1e3, 1e4, 1e5, 0} // <1us, <10us, <100us, longer
	for _, tc := range []struct {
		name    string
		packets []uint64
		q       float64
		want    uint64
	}{
		{"no packets", []uint64{0, 0, 0, 0}, 0.5, 0},
		{"all in the first bucket", []uint64{10, 0, 0, 0}, 0.99, 1e3},
		{"the median in the second", []uint64{4, 6, 0, 0}, 0.5, 1e4},
		{"p90 in the third", []uint64{80, 5, 15, 0}, 0.9, 1e5},
		{"the open last bucket is long", []uint64{1, 0, 0, 9}, 0.5, ^uint64(0)},
		{"p0 is the first packet's bucket", []uint64{0, 3, 0, 0}, 0, 1e4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Delays{Packets: tc.packets, UpperNS: upper}
			if got := d.Quantile(tc.q); got != tc.want {
				t.Errorf("Quantile(%g) = %d; want %d", tc.q, got, tc.want)
			}
		})
	}
}

// Delays print in the unit that reads best.
func TestDelayUnits(t *testing.T) {
	for _, tc := range []struct {
		ns   uint64
		want string
	}{
		{0, "0"}, {900, "<1us"}, {10_000, "<10us"}, {2_500_000, "<2.5ms"}, {^uint64(0), "long"},
	} {
		if got := delayHuman(tc.ns); got != tc.want {
			t.Errorf("delayHuman(%d) = %q; want %q", tc.ns, got, tc.want)
		}
	}
}

// show's text: a reading of nothing says so and where to start; a tree
// the kernel lost says what to do; a tree's classes are indented under
// their parents with their figures.
func TestWriteText(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *Sample
		want []string
	}{
		{"no records", &Sample{}, []string{"sluice shapes nothing here", "sluice apply"}},
		{"a missing tree", &Sample{Trees: []*Tree{{Device: "ifb-eth0", Interface: "eth0", Direction: "ingress", Missing: true}}},
			[]string{"ifb-eth0 ingress of eth0", "missing: the kernel no longer has this tree; run apply or reset"}},
		{"an HTB tree", &Sample{Trees: []*Tree{{Device: "eth0", Interface: "eth0", Direction: "egress", Classes: []*Class{
			{Name: "root", ID: "1:1", Rate: 20e6 / 8, Ceil: 20e6 / 8},
			{Name: "bulk", ID: "1:20", Depth: 1, Leaf: "fq_codel", Rate: 5e6 / 8, Ceil: 20e6 / 8, Prio: 4, Measured: 12.5e6 / 8, Bytes: 3 << 20, Drops: 7},
		}}}}, []string{"eth0 egress\n", "CLASS", "  bulk", "1:20", "5mbit", "20mbit", "12.50 Mbit/s", "3.0M"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			tc.s.WriteText(&b, TextOptions{})
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

// The ROUND TRIPS table lists classes; with Hosts, each host too, and a
// host with too few samples says so instead of a number.
func TestWriteTextRoundTrips(t *testing.T) {
	class := new(bpf.RTTHist)
	class.B[16*11+3] = 40 // (16+3) << 10 units of 1024 ns: 19.9 to 21 ms
	class.Count, class.Sum = 40, 40*20e6
	busy, quiet := new(bpf.HostRTTHist), new(bpf.HostRTTHist)
	busy.B[4*10+1] = 30 // (4+1) << 9 units of 32768 ns: 84 to 101 ms
	busy.Count, busy.Sum = 30, 30*90e6
	quiet.B[4*10+1] = 3
	quiet.Count, quiet.Sum = 3, 3*90e6
	s := &Sample{Trees: []*Tree{{Device: "eth1", Interface: "eth1", Direction: "egress", Classes: []*Class{
		{Name: "users", ID: "1:10", RTT: rttOf(class)},
		{Name: "users/10.0.0.2", ID: "1:100", Depth: 1, RTT: hostRTTOf(busy)},
		{Name: "users/10.0.0.3", ID: "1:101", Depth: 1, RTT: hostRTTOf(quiet)},
		{Name: "users/10.0.0.4", ID: "1:102", Depth: 1, RTT: &RTT{}},
	}}}}
	var plain, hosts bytes.Buffer
	s.WriteText(&plain, TextOptions{})
	s.WriteText(&hosts, TextOptions{Hosts: true})
	rt := func(out string) string { _, after, _ := strings.Cut(out, "ROUND TRIPS"); return after }
	if got := rt(plain.String()); !regexp.MustCompile(`users +40 +2\d\.\d ms`).MatchString(got) || strings.Contains(got, "10.0.0") {
		t.Errorf("without hosts: want the class's line only:\n%s", plain.String())
	}
	got := rt(hosts.String())
	for _, re := range []string{`users/10\.0\.0\.2 +30 +(8[4-9]|9\d|10[01])\.\d ms`, `users/10\.0\.0\.3 +3 +too few`, `users/10\.0\.0\.4 +0 +too few`} {
		if !regexp.MustCompile(re).MatchString(got) {
			t.Errorf("with hosts: no line matching %s:\n%s", re, hosts.String())
		}
	}
	// The hook's counts follow; where more samples were given up than
	// timed, a line says why that may be.
	for _, tc := range []struct {
		r    RoundTrips
		hint bool
	}{{RoundTrips{Started: 40, Timed: 38, GivenUp: 1, Untimed: 5}, false}, {RoundTrips{Started: 6, GivenUp: 4}, true}, {RoundTrips{Started: 1}, false}} {
		s.Trees[0].RoundTrips = &tc.r
		var b bytes.Buffer
		s.WriteText(&b, TextOptions{})
		want := fmt.Sprintf("round trips: %d started, %d timed, %d given up; %d TCP packets without timestamps", tc.r.Started, tc.r.Timed, tc.r.GivenUp, tc.r.Untimed)
		if !strings.Contains(b.String(), want) || strings.Contains(b.String(), "an asymmetric route") != tc.hint {
			t.Errorf("%+v: want %q, and the asymmetric route's hint %v:\n%s", tc.r, want, tc.hint, b.String())
		}
	}
}
