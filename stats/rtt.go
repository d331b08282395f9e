package stats

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"sluice/bpf"
	"sluice/records"
)

// MinRTTSamples is how many samples a class needs before its quantiles
// are shown: fewer say "too few" instead of a number.
const MinRTTSamples = 10

// RTT is a class's round trips as its TCP flows' own packets time them
// (an interface's `rtt:`): from the moment sluice classifies a packet,
// through its queue and the path beyond, until the reply that echoes
// the packet's timestamp comes back to the same interface. Cumulative
// since the program was loaded.
//
// A host's (a per-host class's) come from its own histogram, a quarter
// octave a bucket where a class's has a sixteenth, and lag a class's by
// a round trip: a sample counts for its host on its flow's next packet.
type RTT struct {
	Samples uint64  `json:"samples"`
	P50     float64 `json:"p50_seconds"`
	P95     float64 `json:"p95_seconds"`
	P99     float64 `json:"p99_seconds"`
	Mean    float64 `json:"mean_seconds"`
	hist    *bpf.RTTHist
	host    *bpf.HostRTTHist
}

// Hist is the histogram a class's figures come from (bpf.Quantile reads
// it); nil for a host's.
func (r *RTT) Hist() *bpf.RTTHist { return r.hist }

// HostHist is the histogram a host's figures come from; nil for a
// class's.
func (r *RTT) HostHist() *bpf.HostRTTHist { return r.host }

// Enough reports whether r has the samples to show quantiles
// (MinRTTSamples).
func (r *RTT) Enough() bool { return r != nil && r.Samples >= MinRTTSamples }

// NewRTT summarises histogram h (what a reading does with a program's).
func NewRTT(h *bpf.RTTHist) *RTT { return rttOf(h) }

// rttOf summarises histogram h.
func rttOf(h *bpf.RTTHist) *RTT {
	r := &RTT{Samples: h.Count, hist: h}
	if h.Count == 0 {
		return r
	}
	q := func(x float64) float64 {
		d, _ := bpf.Quantile(h, x)
		return d.Seconds()
	}
	r.P50, r.P95, r.P99 = q(0.5), q(0.95), q(0.99)
	r.Mean = float64(h.Sum) / float64(h.Count) / 1e9
	return r
}

// RoundTrips is what a tree's hook did with round trips since it was
// loaded: samples it started (a data packet with a new timestamp value,
// or a SYN), how many of them an echo ended (its classes' samples),
// those it gave up (no echo within 4 s: the replies did not come back
// through the interface, or were lost), and TCP packets without
// timestamps (only their SYNs are timed).
type RoundTrips struct {
	Started uint64 `json:"started"`
	Timed   uint64 `json:"timed"`
	GivenUp uint64 `json:"given_up"`
	Untimed uint64 `json:"untimed_packets"`
}

// Unanswered reports whether more of r's samples were given up than
// timed: the replies return by another way (an asymmetric route), or the
// interface's hook that ends samples is missing.
func (r *RoundTrips) Unanswered() bool { return r != nil && r.GivenUp > 0 && r.GivenUp >= r.Timed }

// hostRTTOf summarises a host's histogram h.
func hostRTTOf(h *bpf.HostRTTHist) *RTT {
	r := &RTT{Samples: uint64(h.Count), host: h}
	if h.Count == 0 {
		return r
	}
	q := func(x float64) float64 {
		d, _ := bpf.HostQuantile(h, x)
		return d.Seconds()
	}
	r.P50, r.P95, r.P99 = q(0.5), q(0.95), q(0.99)
	r.Mean = float64(h.Sum) / float64(h.Count) / 1e9
	return r
}

// isHost reports whether a class name is a per-host class's (PARENT/HOST:
// policy class names cannot hold a slash).
func isHost(name string) bool { return strings.Contains(name, "/") }

// rttRead reads prog's histograms of rec's classes, where prog (in
// mode, its RTTMode) starts round trips, and returns what gives a
// tree's classes them (nil: prog starts none). Reading the maps needs
// no kernel handle (CollectTrees).
func rttRead(prog *bpf.View, mode *bpf.RTT, rec *records.Tree) (func(t *Tree), error) {
	if mode == nil || !mode.Record {
		return nil, nil
	}
	var idx, hostIdx []uint32
	byName := map[string]uint32{}
	hostByName := map[string]uint32{}
	for _, ci := range rec.Classes {
		switch {
		case ci.RTT != 0:
			idx = append(idx, ci.RTT-1)
			byName[ci.Name] = ci.RTT - 1
		case isHost(ci.Name) && !ci.Replica:
			i := counterOf(rec, ci)
			hostIdx = append(hostIdx, i)
			hostByName[ci.Name] = i
		}
	}
	// The direction's histogram of no class (classes beyond its first
	// 127 share it) counts among the samples timed.
	none := uint32(0)
	if rec.Dir == "ingress" {
		none = bpf.MaxRTTHists / 2
	}
	hs, err := prog.RTT(append(idx, none))
	if err != nil {
		return nil, err
	}
	hosts, err := prog.HostRTT(hostIdx)
	if err != nil {
		return nil, err
	}
	counts, err := prog.RTTCounts()
	if err != nil {
		return nil, err
	}
	rt := &RoundTrips{Started: counts.Recorded, GivenUp: counts.Missed, Untimed: counts.Untimed}
	for _, h := range hs {
		rt.Timed += h.Count
	}
	return func(t *Tree) {
		t.RoundTrips = rt
		for _, c := range t.Classes {
			if i, ok := byName[c.Name]; ok && hs[i] != nil {
				c.RTT = rttOf(hs[i])
			} else if i, ok := hostByName[c.Name]; ok {
				// A host without samples yet has none to show, and says so.
				if h := hosts[i]; h != nil {
					c.RTT = hostRTTOf(h)
				} else {
					c.RTT = &RTT{}
				}
			}
		}
	}, nil
}

// writeRTT prints the round trips of t's classes that have them, and of
// their hosts too where hosts is true, and what its hook counted.
func writeRTT(w io.Writer, t *Tree, hosts bool) {
	writeRTTClasses(w, t.Classes, hosts)
	r := t.RoundTrips
	if r == nil {
		return
	}
	fmt.Fprintf(w, "  round trips: %d started, %d timed, %d given up; %d TCP packets without timestamps\n", r.Started, r.Timed, r.GivenUp, r.Untimed)
	if r.Unanswered() {
		fmt.Fprintf(w, "  most samples were never answered through %s: replies that come back another way (an asymmetric route) cannot be timed here\n", t.Interface)
	}
}

func writeRTTClasses(w io.Writer, cs []*Class, hosts bool) {
	var with []*Class
	for _, c := range cs {
		if c.RTT != nil && (hosts || !isHost(c.Name)) {
			with = append(with, c)
		}
	}
	if len(with) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	// QUEUE NOW is sluice's own part: what the class's queue holds a
	// packet now. What a round trip has above it is the path's.
	fmt.Fprintln(tw, "ROUND TRIPS\tSAMPLES\tP50\tP95\tP99\tQUEUE NOW\t")
	for _, c := range with {
		r := c.RTT
		name := strings.Repeat("  ", c.Depth) + c.Name
		queue := "-"
		if c.QueueDelay != nil {
			queue = rttHuman(*c.QueueDelay)
		}
		if !r.Enough() {
			fmt.Fprintf(tw, "%s\t%d\ttoo few\t\t\t%s\t\n", name, r.Samples, queue)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", name, r.Samples, rttHuman(r.P50), rttHuman(r.P95), rttHuman(r.P99), queue)
	}
	tw.Flush()
}

// rttHuman prints a round trip in ms (µs below one).
func rttHuman(s float64) string {
	d := time.Duration(s * 1e9)
	if d < time.Millisecond {
		return fmt.Sprintf("%d us", d.Microseconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d)/1e6)
}

// NewHostRTT summarises a host's histogram h.
func NewHostRTT(h *bpf.HostRTTHist) *RTT { return hostRTTOf(h) }
