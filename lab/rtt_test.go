package lab

import (
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
