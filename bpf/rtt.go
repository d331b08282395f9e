package bpf

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cilium/ebpf"
)

// Passive round trips: the classifier times TCP flows from their own
// packets, the way pping does (Kathleen Nichols; ePPing in eBPF). A hook
// that records (the tree's direction, Record) notes when the first
// packet with a new TCP timestamp value (TSval) of a flow passes; the
// interface's hook the other way (Echo) ends the sample when a reply
// echoes that value (TSecr). A sample therefore spans sluice's own queue
// for the packet, the path beyond it, and the way back to the device.
// One sample is outstanding per flow and way, so samples come about once
// a round trip, never per packet; they are folded into a histogram of
// the packet's class in the kernel. Flows without timestamps are timed
// only by their handshake (SYN to SYN-ACK) and counted as untimed.
//
// The hooks of an interface (its egress, and its ingress or ifb) share
// the flow map and the histograms: a program loaded for one takes the
// other's (LoadShared), and the hook that ends a sample counts it in the
// class the hook that started it named.

// RTTBuckets is the number of buckets of a round-trip histogram.
const RTTBuckets = 336

// DefaultFlows is how many flows a hook tracks at once unless the
// policy says otherwise; the least recently seen are forgotten first.
const DefaultFlows = 16384

// RTT is what a hook does with round trips.
type RTT struct {
	// Record starts samples on the packets this hook classifies (the
	// direction a tree shapes); Echo ends samples the interface's other
	// hooks started.
	Record, Echo bool
	// Observe: the hook classifies only to attribute samples to classes
	// (HTB's own filters classify the packets): it changes nothing and
	// lets the filters after it run.
	Observe bool
	// Flows is the capacity of the flow map (0: DefaultFlows).
	Flows uint32
}

// FlowsOrDefault is the flow map's size r asks for.
func (r *RTT) FlowsOrDefault() uint32 { return r.flows() }

func (r *RTT) flows() uint32 {
	if r == nil || r.Flows == 0 {
		return DefaultFlows
	}
	return r.Flows
}

// RTTHist is one class's round trips (struct rtt_hist).
type RTTHist = ClassifierRttHist

// RTTCounts are what a hook's round-trip stage saw, summed over CPUs.
type RTTCounts = ClassifierRttStats

// HostRTTBuckets is the number of buckets of a host's round-trip
// histogram.
const HostRTTBuckets = 64

// HostRTTHist is one host's round trips (struct host_rtt): a quarter of
// an octave a bucket, where a class's has a sixteenth.
type HostRTTHist = ClassifierHostRtt

// rttBucketLow and rttBucketHigh bound bucket k in ns (rtt_bucket in
// classifier.c: 1024 ns units, 16 buckets a doubling above 16 units).
func rttBucketLow(k int) float64 { return bucketLow(k, 16, 1024) }

func rttBucketHigh(k int) float64 {
	if k >= RTTBuckets-1 {
		return math.Inf(1)
	}
	return rttBucketLow(k + 1)
}

// hostBucketLow and hostBucketHigh bound a host histogram's bucket k
// (host_rtt_bucket: 32768 ns units, 4 buckets a doubling above 4).
func hostBucketLow(k int) float64 { return bucketLow(k, 4, 32768) }

func hostBucketHigh(k int) float64 {
	if k >= HostRTTBuckets-1 {
		return math.Inf(1)
	}
	return hostBucketLow(k + 1)
}

// bucketLow is the lower bound (ns) of bucket k of a histogram with per
// buckets a doubling above per linear ones, in units of unit ns.
func bucketLow(k, per int, unit float64) float64 {
	if k < per {
		return float64(k) * unit
	}
	o, s := k/per, k%per
	return float64(uint64(per+s)<<(o-1)) * unit
}

// RTTBucketBounds are the upper bounds (seconds) of the histogram's
// buckets but the last, which is open-ended: for exporting it.
func RTTBucketBounds() []float64 {
	out := make([]float64, RTTBuckets-1)
	for k := range out {
		out[k] = rttBucketHigh(k) / 1e9
	}
	return out
}

// Quantile is the round trip below which a share q (0..1) of h's samples
// fall, interpolated within its bucket; false with no samples.
func Quantile(h *RTTHist, q float64) (time.Duration, bool) {
	return quantile(h.B[:], q, rttBucketLow, rttBucketHigh)
}

// HostQuantile is Quantile of a host's histogram.
func HostQuantile(h *HostRTTHist, q float64) (time.Duration, bool) {
	return quantile(h.B[:], q, hostBucketLow, hostBucketHigh)
}

func quantile[N uint32 | uint64](b []N, q float64, low, high func(int) float64) (time.Duration, bool) {
	var n uint64
	for _, c := range b {
		n += uint64(c)
	}
	if n == 0 {
		return 0, false
	}
	rank := q * float64(n)
	var seen float64
	for k, c := range b {
		if c == 0 {
			continue
		}
		if seen+float64(c) >= rank {
			lo, hi := low(k), high(k)
			if math.IsInf(hi, 1) {
				return time.Duration(lo), true
			}
			return time.Duration(lo + (hi-lo)*(rank-seen)/float64(c)), true
		}
		seen += float64(c)
	}
	return time.Duration(low(len(b) - 1)), true
}

// HostRTTBucketBounds are the upper bounds (seconds) of a host
// histogram's buckets but the last.
func HostRTTBucketBounds() []float64 {
	out := make([]float64, HostRTTBuckets-1)
	for k := range out {
		out[k] = hostBucketHigh(k) / 1e9
	}
	return out
}

// HostRTT reads the round-trip histograms of the hosts whose counters
// are idx, in one batch where the kernel can; absent where none was
// kept (a program without per-host histograms has none).
func (p *Program) HostRTT(idx []uint32) (map[uint32]*HostRTTHist, error) {
	out := make(map[uint32]*HostRTTHist, len(idx))
	m := p.objs.HostRtts
	if m == nil || m.MaxEntries() <= 1 {
		return out, nil
	}
	var n uint32
	for _, i := range idx {
		if i < m.MaxEntries() {
			n = max(n, i+1)
		}
	}
	if n == 0 {
		return out, nil
	}
	want := make(map[uint32]bool, len(idx))
	for _, i := range idx {
		want[i] = true
	}
	keys := make([]uint32, n)
	vals := make([]HostRTTHist, n)
	var cursor ebpf.MapBatchCursor
	got, err := m.BatchLookup(&cursor, keys, vals, nil)
	if err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
		for j, k := range keys[:got] {
			if want[k] && vals[j].Count > 0 {
				out[k] = &vals[j]
			}
		}
		if uint32(got) >= n {
			return out, nil
		}
	}
	// One lookup a host where the kernel cannot batch.
	for i := range want {
		if i >= m.MaxEntries() || out[i] != nil {
			continue
		}
		h := new(HostRTTHist)
		if err := m.Lookup(i, h); err != nil {
			return nil, fmt.Errorf("bpf classifier: read host round trips %d: %w", i, err)
		}
		if h.Count > 0 {
			out[i] = h
		}
	}
	return out, nil
}

// MaxRTTHists is how many round-trip histograms an interface has: its
// classes' indexes (Target.Rtt) number them, both directions in one space.
const MaxRTTHists = 256

// RTT reads the round-trip histograms at idx (the classes' RTT
// indexes; 0 is the hook's traffic of no class).
func (p *Program) RTT(idx []uint32) (map[uint32]*RTTHist, error) {
	if p.objs.Rtts == nil {
		return nil, errors.New("bpf classifier: this program times no round trips (an older version)")
	}
	out := make(map[uint32]*RTTHist, len(idx))
	for _, i := range idx {
		if i >= MaxRTTHists {
			continue
		}
		h := new(RTTHist)
		if err := p.objs.Rtts.Lookup(i, h); err != nil {
			return nil, fmt.Errorf("bpf classifier: read round trips %d: %w", i, err)
		}
		out[i] = h
	}
	return out, nil
}

// FlowsTracked counts the flows the hook's flow map holds now (a walk of
// the map: for benchmarks and diagnostics, not every pass).
func (p *Program) FlowsTracked() (int, error) {
	if p.objs.Flows == nil {
		return 0, errors.New("bpf classifier: this program times no round trips (an older version)")
	}
	var k ClassifierFlowKey
	var v ClassifierFlowState
	n := 0
	it := p.objs.Flows.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n, it.Err()
}

// RTTCounts sums the hook's round-trip counters over CPUs.
func (p *Program) RTTCounts() (RTTCounts, error) {
	var per []RTTCounts
	if p.objs.RttCounts == nil {
		return RTTCounts{}, errors.New("bpf classifier: this program times no round trips (an older version)")
	}
	if err := p.objs.RttCounts.Lookup(uint32(0), &per); err != nil {
		return RTTCounts{}, fmt.Errorf("bpf classifier: read round-trip counts: %w", err)
	}
	var s RTTCounts
	for _, c := range per {
		s.Recorded += c.Recorded
		s.Matched += c.Matched
		s.Missed += c.Missed
		s.Untimed += c.Untimed
	}
	return s, nil
}

// RTTMode is what the program's round-trip stage does (nil: nothing),
// from its settings alone.
func (p *Program) RTTMode() (*RTT, error) {
	var cfg ClassifierConfig
	if err := p.objs.Settings.Lookup(uint32(0), &cfg); err != nil {
		return nil, fmt.Errorf("bpf classifier: read settings: %w", err)
	}
	return rttFlags(cfg.Flags, p.FlowCap), nil
}

// rttFlags is what settings flags say of round trips (nil: nothing),
// with a flow map of flows.
func rttFlags(flags, flows uint32) *RTT {
	if flags&(cfgRTTRecord|cfgRTTEcho|cfgObserve) == 0 {
		return nil
	}
	return &RTT{Record: flags&cfgRTTRecord != 0, Echo: flags&cfgRTTEcho != 0, Observe: flags&cfgObserve != 0, Flows: flows}
}
