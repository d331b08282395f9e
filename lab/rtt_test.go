package lab

import (
	"math"
	"strings"
	"testing"

	"sluice/bpf"
	"sluice/policy"
)

// The lab turns round-trip timing on for every interface of a variant's
// policy that does not set it itself, comments and all kept.
func TestWithRTT(t *testing.T) {
	src := `interfaces:
  - name: wan   # the modem's side
    egress: {rate: 10mbit}
  - name: lan
    rtt: off
    egress: {rate: 10mbit}
`
	out := withRTT(src)
	p, _, err := policy.Parse("p.yaml", []byte(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if p.Interfaces[0].RTT == nil || p.Interfaces[1].RTT != nil {
		t.Errorf("rtt: wan %v, lan %v; want on, off (its own)\n%s", p.Interfaces[0].RTT, p.Interfaces[1].RTT, out)
	}
	if !strings.Contains(out, "# the modem's side") {
		t.Errorf("comment lost:\n%s", out)
	}
	for _, same := range []string{"", "pod_veths: {}\n", "interfaces: [\n", "interfaces:\n  - name: x\n    rtt: on\n"} {
		if got := withRTT(same); got != same {
			t.Errorf("%q became %q", same, got)
		}
	}
}

// A phase's round trips are what the class's cumulative histogram
// gained over it: samples before the phase (and buckets unread) are not
// the phase's.
func TestRTTOverAPhase(t *testing.T) {
	h := func(n uint64, k int) *bpf.RTTHist {
		x := &bpf.RTTHist{Count: n}
		x.B[k] = n
		return x
	}
	k := 16*11 + 3 // 20 ms: 19531 units of 1024 ns, bit length 15, sixteenth 3 (19.9 to 21.0 ms)
	c := &ClassSeries{rtt: []*bpf.RTTHist{h(100, 5), nil, h(100, 5), nil}}
	second := *c.rtt[2]
	second.B[k], second.Count = 40, 140
	c.rtt[2] = &second
	s := c.rttOver(2, 4) // buckets 2 and 3; before them, bucket 1 unread: bucket 0's
	if s == nil || s.Samples != 40 || s.P50 < 19 || s.P50 > 21 {
		t.Errorf("phase: %+v, want 40 samples near 20 ms", s)
	}
	if s := c.rttOver(0, 1); s == nil || s.Samples != 100 {
		t.Errorf("first bucket: %+v, want its 100", s)
	}
	if s := (&ClassSeries{}).rttOver(0, 4); s != nil {
		t.Errorf("no readings: %+v", s)
	}
}

// A phase's mean round trip splits at the shaper: the class's mean
// backlog over what it passed (Little's law) is its queue, the rest the
// path. 60 KB queued at 8 Mbit/s is 60 ms; round trips of 80 ms leave
// 20 for the path.
func TestRTTSplitsQueueAndPath(t *testing.T) {
	before := &bpf.RTTHist{Count: 10, Sum: 10 * 5e6}
	after := &bpf.RTTHist{Count: 110, Sum: 10*5e6 + 100*80e6}
	after.B[16*12+4] = 100 // about 80 ms
	c := &ClassSeries{
		rtt:     []*bpf.RTTHist{before, nil, after},
		Bps:     []float64{0, 8e6, 8e6},
		Backlog: []uint32{0, 50000, 70000},
	}
	s := c.rttOver(1, 3)
	if s == nil || s.Samples != 100 {
		t.Fatalf("phase: %+v, want its 100 samples", s)
	}
	if s.Mean != 80 || math.Abs(s.Queue-60) > 1e-9 || math.Abs(s.Path-20) > 1e-9 {
		t.Errorf("mean %v ms, queue %v, path %v: want 80, 60 and 20", s.Mean, s.Queue, s.Path)
	}
	// A queue longer than the round trips (a reading's backlog at a
	// moment) leaves no negative path.
	c.Backlog = []uint32{0, 500000, 500000}
	if s := c.rttOver(1, 3); s.Path != 0 || s.Queue != 500 {
		t.Errorf("queue %v ms, path %v: want 500 and 0", s.Queue, s.Path)
	}
	// Nothing passed: no queue to speak of.
	c.Bps = []float64{0, 0, 0}
	if s := c.rttOver(1, 3); s.Queue != 0 || s.Path != 80 {
		t.Errorf("idle class: queue %v ms, path %v: want 0 and 80", s.Queue, s.Path)
	}
}
