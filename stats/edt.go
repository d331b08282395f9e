package stats

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sluice/bpf"
	"sluice/kernel"
	"sluice/records"
	"sluice/units"
)

// Delays is an EDT delay histogram: how long the pacing program held
// back the packets of one policy class (a leaf, or every host of a
// per_host class). Packets[0] counts packets sent at once; Packets[k]
// for k > 0 delays under UpperNS[k] and at least UpperNS[k-1]; the last
// bucket (UpperNS 0) is open-ended.
type Delays struct {
	Class   string   `json:"class"`
	Packets []uint64 `json:"packets"`
	UpperNS []uint64 `json:"upper_ns"`
	// SumNS adds up every delay counted (ns).
	SumNS uint64 `json:"sum_ns"`
}

// Quantile is the upper bound (ns) of the bucket holding quantile q of
// the packets: the delay at most a fraction q of them waited (0 when
// there are none; math.MaxUint64 for the open last bucket).
func (d *Delays) Quantile(q float64) uint64 {
	var total uint64
	for _, n := range d.Packets {
		total += n
	}
	if total == 0 {
		return 0
	}
	want := uint64(q*float64(total) + 0.5)
	var seen uint64
	for k, n := range d.Packets {
		seen += n
		if seen >= max(want, 1) {
			if k > 0 && d.UpperNS[k] == 0 {
				return ^uint64(0)
			}
			return d.UpperNS[k]
		}
	}
	return ^uint64(0)
}

// readEDT fills an EDT tree from its records and its program's maps:
// each aggregate's packets and bytes paced (handed to fq with their
// departure times: sent, or waiting in fq for their time), its backlog,
// horizon drops, and each class's delay histogram.
func readEDT(k *kernel.Reader, t *Tree, dev string, rec *records.Tree) error {
	t.Backend = "edt"
	prog, err := k.OpenHook(dev, false)
	if err != nil {
		return err
	}
	if prog == nil {
		t.Missing = true
		return nil
	}
	defer prog.Close()
	t.Classifier = "bpf"
	idx := make([]uint32, 0, len(rec.Classes))
	for _, ci := range rec.Classes {
		idx = append(idx, ci.Counter)
	}
	start := time.Now()
	counts, err := prog.Counts(idx)
	if err != nil {
		return err
	}
	t.read = stamp(start)
	paces, err := prog.Paces(idx)
	if err != nil {
		return err
	}
	now := monotonic()
	// The live caps of the class aggregates (the sharing controller moves
	// them); a host's is its record's.
	targets, _, err := prog.Targets()
	if err != nil {
		return err
	}
	caps := map[uint32]units.Rate{}
	for _, tg := range targets {
		if tg.Counter != 0 {
			caps[tg.Counter] = tg.Rate
		}
	}
	// A per_host class (no counter of its own) sums its hosts, and comes
	// before them.
	groups := map[string]*Class{}
	listed := map[string]bool{}
	for _, ci := range rec.Classes {
		if ci.Counter == 0 {
			groups[ci.Name] = &Class{Name: ci.Name, ID: "edt:" + ci.Name, Rate: ci.Rate, Ceil: ci.Ceil, Prio: ci.Prio}
		}
	}
	for _, ci := range rec.Classes {
		if ci.Counter == 0 {
			continue
		}
		c := &Class{Name: ci.Name, ID: fmt.Sprintf("edt:%d", ci.Counter), Leaf: "edt", Rate: ci.Rate, Ceil: ci.Ceil, Prio: ci.Prio}
		n := counts[ci.Counter]
		c.Packets, c.Bytes = n.Packets, n.Bytes
		pc := paces[ci.Counter]
		c.Drops = uint32(min(pc.Drops, 1<<32-1))
		cp, ok := caps[ci.Counter]
		if !ok {
			cp = ci.Ceil
		}
		c.Backlog = edtBacklog(pc.T_next, now, cp)
		// A packet stamped now leaves when the clock's lead has passed.
		lead := 0.0
		if pc.T_next > now {
			lead = float64(pc.T_next-now) / 1e9
		}
		c.QueueDelay = &lead
		// A group of a per_host class (CLASS:GROUP) counts what its hosts
		// sent, which the class already sums: it is listed below it, as
		// an inner class (no leaf: its bytes are its hosts', never added
		// to the tree's again).
		if i := strings.LastIndexByte(ci.Name, ':'); i > 0 && !strings.Contains(ci.Name, "/") {
			if g := groups[ci.Name[:i]]; g != nil {
				if !listed[g.Name] {
					t.Classes = append(t.Classes, g)
					listed[g.Name] = true
				}
				c.Depth, c.Leaf = 1, ""
			}
		}
		if i := strings.LastIndexByte(ci.Name, '/'); i > 0 {
			if g := groups[ci.Name[:i]]; g != nil {
				if !listed[g.Name] {
					t.Classes = append(t.Classes, g)
					listed[g.Name] = true
				}
				g.Packets += c.Packets
				g.Bytes += c.Bytes
				g.Drops = uint32(min(uint64(g.Drops)+uint64(c.Drops), 1<<32-1))
				g.Backlog = uint32(min(uint64(g.Backlog)+uint64(c.Backlog), 1<<32-1))
				c.Depth = 1
			}
		}
		t.Classes = append(t.Classes, c)
	}
	mode, err := prog.RTTMode()
	if err != nil {
		return err
	}
	if fill, err := rttRead(prog, mode, rec); err != nil {
		return err
	} else if fill != nil {
		fill(t)
	}
	if rec.Alloc == nil {
		return nil
	}
	names := make([]string, 0, len(rec.Alloc.Hists))
	for name := range rec.Alloc.Hists {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		h, sum, err := prog.Delays(rec.Alloc.Hists[name])
		if err != nil {
			return err
		}
		d := &Delays{Class: name, Packets: h[:], UpperNS: make([]uint64, bpf.DelayBuckets), SumNS: sum}
		for k := range d.UpperNS {
			d.UpperNS[k] = bpf.DelayBucketBound(k)
		}
		t.Delays = append(t.Delays, d)
	}
	return nil
}

// writeDelays prints each class's delay quantiles.
func writeDelays(w io.Writer, ds []*Delays) {
	for _, d := range ds {
		fmt.Fprintf(w, "  delay %s: p50 %s p90 %s p99 %s\n", d.Class, delayHuman(d.Quantile(0.5)), delayHuman(d.Quantile(0.9)), delayHuman(d.Quantile(0.99)))
	}
}

func delayHuman(ns uint64) string {
	switch {
	case ns == ^uint64(0):
		return "long"
	case ns == 0:
		return "0"
	case ns >= 1e6:
		return fmt.Sprintf("<%.1fms", float64(ns)/1e6)
	}
	return fmt.Sprintf("<%.0fus", float64(ns)/1e3)
}

// edtBacklog is what an EDT aggregate has waiting in fq, in bytes: its
// clock runs ahead of now by the departure times it handed out, at its
// cap (bytes/s). The program counts a packet when it stamps it, not
// when it leaves: the bytes counted less the backlog are what left
// (measured in the lane: a 37 kbit/s aggregate whose TCP flow filled
// its 10 s horizon counted 70 kbit/s over 5 s).
func edtBacklog(tnext, now uint64, capacity units.Rate) uint32 {
	if tnext <= now || capacity == 0 {
		return 0
	}
	b := float64(tnext-now) * float64(capacity) / 1e9
	return uint32(min(b, 1<<32-1))
}

// monotonic is CLOCK_MONOTONIC in ns, the EDT program's clock
// (bpf_ktime_get_ns).
func monotonic() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return math.MaxUint64 // no backlog rather than a made-up one
	}
	return uint64(ts.Nano())
}
