// Package stats reads the live counters of the trees sluice manages and
// turns two readings into rates: what `sluice show` prints and what the
// lab and the daemon consume.
package stats

import (
	"sluice/records"
	"sluice/units"

	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"sluice/bpf"
	"sluice/kernel"
	"sluice/tc"
)

// Sample is one reading of every tree.
type Sample struct {
	At    time.Time `json:"at"`
	Trees []*Tree   `json:"trees"`
}

// Tree is one device's HTB tree.
type Tree struct {
	Device    string   `json:"device"`
	Interface string   `json:"interface"`
	Direction string   `json:"direction"`
	Classes   []*Class `json:"classes"`
	// Classifier is "bpf" when sluice's BPF program classifies (and
	// polices), else "u32".
	Classifier string `json:"classifier"`
	// Policers lists the BPF policers with their per-colour counters.
	Policers []*Policer `json:"policers,omitempty"`
	// Missing is set when the records name a tree the kernel no longer has.
	Missing bool `json:"missing,omitempty"`
	// Backend is "edt" for the EDT backend (Classes are its aggregates;
	// Drops are horizon drops), empty for HTB.
	Backend string `json:"backend,omitempty"`
	// Delays are the EDT backend's delay histograms, per class.
	Delays []*Delays `json:"delays,omitempty"`
	// Sharing is what the agent's sharing controllers last decided for
	// the classes they control (only in the agent's readings).
	Sharing []*Share `json:"sharing,omitempty"`
	// HostClasses counts this tree's per-host classes left out of the
	// reading (the agent's status without hosts).
	HostClasses int `json:"host_classes_omitted,omitzero"`
	// RoundTrips counts the samples the tree's hook started, where its
	// interface times round trips.
	RoundTrips *RoundTrips `json:"rtt_counts,omitempty"`
	// Unread says what of the tree this process could not read (BPF
	// maps without root or CAP_BPF), instead of failing the whole reading.
	Unread []string `json:"unread,omitempty"`

	// read is when the tree's counters were read (the middle of the
	// read; zero: at the sample's At). Reading thousands of classes on
	// a busy machine takes long enough after At that a rate over a few
	// seconds taken from At is off by a share of them (an emulated
	// guest's EDT host read 2.125 Mbit/s of a 2 Mbit/s cap over 4 s).
	read time.Time
}

// ReadAt is when t's class counters were read (the middle of their
// dump), or zero where the reading does not say: a rate between two
// readings is truest between these, not between the readings' ends,
// which also wait for the BPF maps.
func (t *Tree) ReadAt() time.Time { return t.read }

// stamp returns the middle of a read that began at start and ended now.
func stamp(start time.Time) time.Time { return start.Add(time.Since(start) / 2) }

// Share is a sharing controller's last decision for one class.
type Share struct {
	Class string `json:"class"`
	// Owner is the parent whose children share ("" for the top level).
	Owner  string  `json:"owner,omitempty"`
	Weight float64 `json:"weight"`
	// Prod: a prio 0 class beside others, never limited.
	Prod bool `json:"prod,omitempty"`
	// Usage is what it sent over the last quantum; Demand what the
	// controller counted it as wanting (its ceil when held back:
	// Hungry); Share its weighted max-min share; Limit that share
	// between its rate and ceil, Applied when in force: as the class's
	// rate when Assured, else as its ceil. Rate and Ceil are the class's
	// now.
	Usage   units.Rate `json:"usage_bytes_per_second"`
	Demand  units.Rate `json:"demand_bytes_per_second"`
	Hungry  bool       `json:"hungry,omitempty"`
	Share   units.Rate `json:"share_bytes_per_second"`
	Limit   units.Rate `json:"limit_bytes_per_second"`
	Applied bool       `json:"applied"`
	Assured bool       `json:"assured,omitempty"`
	Rate    units.Rate `json:"rate_bytes_per_second,omitempty"`
	Ceil    units.Rate `json:"ceil_bytes_per_second"`
}

// MarshalJSON adds the rates in bits per second under their names
// before base units (deprecated: docs/changelog.md).
func (sh Share) MarshalJSON() ([]byte, error) {
	type fields Share
	return json.Marshal(struct {
		fields
		Usage  float64 `json:"usage_bps"`
		Demand float64 `json:"demand_bps"`
		Share  float64 `json:"share_bps"`
		Limit  float64 `json:"limit_bps"`
		Rate   float64 `json:"rate_bps,omitempty"`
		Ceil   float64 `json:"ceil_bps"`
	}{fields(sh), sh.Usage.BitsFloat(), sh.Demand.BitsFloat(), sh.Share.BitsFloat(), sh.Limit.BitsFloat(), sh.Rate.BitsFloat(), sh.Ceil.BitsFloat()})
}

// Class is one class's configuration and counters.
type Class struct {
	handle     tc.Handle  // ID's, where read from HTB (0: an EDT aggregate)
	Name       string     `json:"name"`
	ID         string     `json:"id"`
	Parent     string     `json:"parent"`
	Depth      int        `json:"depth"`
	Leaf       string     `json:"leaf,omitempty"`
	Rate       units.Rate `json:"rate_bytes_per_second"`
	Ceil       units.Rate `json:"ceil_bytes_per_second"`
	Prio       uint32     `json:"prio"`
	Measured   units.Rate `json:"measured_bytes_per_second"`
	Bytes      uint64     `json:"bytes"`
	Packets    uint64     `json:"packets"`
	Drops      uint32     `json:"drops"`
	Overlimits uint32     `json:"overlimits"`
	Backlog    uint32     `json:"backlog_bytes"`
	Qlen       uint32     `json:"backlog_packets"`
	Borrowed   uint32     `json:"borrowed"`
	Lent       uint32     `json:"lent"`
	Tokens     int32      `json:"tokens"`
	Ctokens    int32      `json:"ctokens"`
	// Classified counts what the BPF classifier sent to this class
	// (before any policer), when it classifies.
	Classified *Count `json:"classified,omitempty"`
	// RTT is the class's round trips where its interface times them.
	RTT *RTT `json:"rtt,omitempty"`
	// QueueDelay is how long the class's queue holds a packet now
	// (seconds), sluice's own part of its round trips: its backlog at
	// the rate it passed since the last reading (Rates), or an EDT
	// aggregate's clock lead. Nil where not known: a first reading of
	// an HTB class, or one that passed nothing.
	QueueDelay *float64 `json:"queue_delay_seconds,omitempty"`
}

// MarshalJSON adds the rates in bits per second under their names
// before base units (deprecated: docs/changelog.md).
func (c Class) MarshalJSON() ([]byte, error) {
	type fields Class
	return json.Marshal(struct {
		fields
		OldRates
	}{fields(c), OldRatesOf(c.Rate, c.Ceil, c.Measured)})
}

// OldRates are a class's rates under their JSON names before base
// units, in bits per second (deprecated: docs/changelog.md), for a
// MarshalJSON to embed beside the new names.
type OldRates struct {
	Rate     uint64  `json:"rate_bps"`
	Ceil     uint64  `json:"ceil_bps"`
	Measured float64 `json:"measured_bps"`
}

// OldRatesOf is OldRates for a rate, ceil and measured rate.
func OldRatesOf(rate, ceil, measured units.Rate) OldRates {
	return OldRates{rate.Bits(), ceil.Bits(), measured.BitsFloat()}
}

// Count is a packet and byte counter.
type Count struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// Policer is one BPF policer's verdicts by colour.
type Policer struct {
	Class  string `json:"class"`
	Green  Count  `json:"green"`
	Yellow Count  `json:"yellow"`
	Red    Count  `json:"red"`
}

// readBPF adds the classifier's per-class counters and the policers'
// colours to t.
func readBPF(k *kernel.Reader, t *Tree, dev string, ingress bool, rec *records.Tree, known map[tc.Handle]int32) error {
	prog, err := k.OpenHook(dev, ingress)
	if err != nil || prog == nil {
		return err
	}
	defer prog.Close()
	mode, err := prog.RTTMode()
	if err != nil {
		return err
	}
	if fill, err := rttRead(prog, mode, rec); err != nil {
		return err
	} else if fill != nil {
		fill(t)
	}
	if mode != nil && mode.Observe {
		return nil // u32 classifies; the program only times round trips
	}
	cl, err := count(prog, rec)
	if err != nil {
		return err
	}
	cl.fill(t, rec, known)
	return nil
}

// classified is what a tree's classifier counted: per counter (a
// class's minor, or its recorded counter) and per policer.
type classified struct {
	counts   map[uint32]bpf.Counter
	policers []*Policer
}

// counterOf is the classifier's counter of class ci: its minor, or
// recorded (sharded trees, where copies of a class in the other shards
// share the first's counter).
func counterOf(rec *records.Tree, ci records.Class) uint32 {
	switch {
	case rec.PoliceOnly:
		return 1
	case ci.Counter != 0:
		return ci.Counter
	}
	return uint32(ci.Handle.Minor())
}

// count reads prog's counters for rec's classes, and its policers'
// colours. It reads the program's maps only, never the kernel handle,
// so it may run while the handle dumps classes (CollectTrees).
func count(prog *bpf.View, rec *records.Tree) (*classified, error) {
	idx := make([]uint32, 0, len(rec.Classes))
	for _, ci := range rec.Classes {
		if !ci.Replica {
			idx = append(idx, counterOf(rec, ci))
		}
	}
	counts, err := prog.Counts(idx)
	if err != nil {
		return nil, err
	}
	cl := &classified{counts: counts}
	// The targets (one per class: 10,000 for as many hosts) are read
	// only for the policers' classes.
	if npol, err := prog.Policers(); err != nil || npol == 0 {
		return cl, err
	}
	targets, npol, err := prog.Targets()
	if err != nil {
		return nil, err
	}
	names := make(map[uint32]string, len(rec.Classes))
	for _, ci := range rec.Classes {
		if !ci.Replica {
			names[counterOf(rec, ci)] = ci.Name
		}
	}
	polClass := map[uint16]string{}
	for _, tg := range targets {
		if tg.Policer != 0 {
			polClass[tg.Policer] = names[tg.Counter]
		}
	}
	for n := uint32(1); n <= npol; n++ {
		col, err := prog.Colours(n)
		if err != nil {
			return nil, err
		}
		cl.policers = append(cl.policers, &Policer{Class: polClass[uint16(n)],
			Green:  Count{col[0].Packets, col[0].Bytes},
			Yellow: Count{col[1].Packets, col[1].Bytes},
			Red:    Count{col[2].Packets, col[2].Bytes}})
	}
	return cl, nil
}

// fill gives t's classes their counts, and t the policers. known is
// the records' index of t's classes (classesOf).
func (cl *classified) fill(t *Tree, rec *records.Tree, known map[tc.Handle]int32) {
	t.Classifier = "bpf"
	var counts []Count // one allocation for every class's
	for _, c := range t.Classes {
		i, ok := known[c.handle]
		if !ok || i < 0 || rec.Classes[i].Replica {
			continue
		}
		if n, ok := cl.counts[counterOf(rec, rec.Classes[i])]; ok {
			if counts == nil {
				counts = make([]Count, 0, len(t.Classes))
			}
			counts = append(counts, Count{Packets: n.Packets, Bytes: n.Bytes})
			c.Classified = &counts[len(counts)-1]
		}
	}
	t.Policers = cl.policers
}

// Collect reads the trees recorded for the namespace, all or those on
// the named devices (an interface name includes its ingress ifb).
func Collect(k *kernel.Reader, devs []string) (*Sample, error) {
	return collect(k, devs, nil, nil)
}

// CollectFrom is Collect from the objects of a full read that found
// nothing to change (engine.Prepared.Live): the classes' counters come
// with them, so the daemon reads the kernel once per pass, not twice.
// Only the BPF counters are read here.
func CollectFrom(k *kernel.Reader, live []tc.Object) (*Sample, error) {
	byDev := map[string][]*tc.Class{}
	for _, o := range live {
		if c, ok := o.(*tc.Class); ok {
			byDev[c.Dev] = append(byDev[c.Dev], c)
		}
	}
	return collect(k, nil, byDev, nil)
}

// CollectTrees is Collect for a caller that knows each HTB tree's
// qdiscs (roots: a device's tree qdiscs, one per shard), from a read
// that found them unchanged since (the agent's steady pass): it dumps
// their classes only, a dump per tree qdisc. A dump of the whole device
// costs more: the kernel resumes it every 32 KB of answer by walking the
// device's qdiscs, the leaves included, up to the tree it stopped in
// (10,000 classes on 16 shards: 15.8 ms in one dump, 10.2 ms in 16;
// 20,000: 48 against 25 ms; Linux 6.18).
//
// The classifiers' counters are read meanwhile: the kernel builds a
// class dump under its routing lock, a map read needs none, and on two
// cores the two overlap (the counters of 10,000 hosts: 4 ms).
func CollectTrees(k *kernel.Reader, roots map[string][]tc.Handle) (*Sample, error) {
	pending := map[string]*counting{}
	for dev := range roots {
		rec := k.Recorded(dev)
		if rec == nil || rec.EDT || rec.PoliceOnly {
			continue
		}
		prog, err := k.OpenHook(dev, false)
		if err != nil {
			return nil, err
		}
		c := &counting{done: make(chan struct{})}
		pending[dev] = c
		if prog == nil {
			close(c.done) // no classifier: u32
			continue
		}
		go func() {
			defer close(c.done)
			defer prog.Close()
			mode, err := prog.RTTMode()
			if err != nil {
				c.err = err
				return
			}
			if c.rtt, c.err = rttRead(prog, mode, rec); c.err != nil || mode != nil && mode.Observe {
				return
			}
			c.cl, c.err = count(prog, rec)
		}()
	}
	byDev := map[string][]*tc.Class{}
	for dev, hs := range roots {
		cs, err := k.ClassesOf(dev, hs)
		if err != nil {
			return nil, err
		}
		byDev[dev] = cs
	}
	return collect(k, nil, byDev, pending)
}

// counting is a tree's classifier counters being read (count) while its
// classes are dumped.
type counting struct {
	done chan struct{}
	cl   *classified // nil: no classifier
	rtt  func(t *Tree)
	err  error
}

// collect reads the trees; classes, when not nil, holds every tree
// device's classes as already read.
//
// counted, when not nil, holds the classifier counters of trees being
// read by CollectTrees; any other tree's are read here.
func collect(k *kernel.Reader, devs []string, classes map[string][]*tc.Class, counted map[string]*counting) (*Sample, error) {
	s := &Sample{At: time.Now()}
	for _, name := range k.RecordedNames() {
		rec := k.Recorded(name)
		if len(devs) > 0 && !contains(devs, name) && !contains(devs, rec.Interface) {
			continue
		}
		t := &Tree{Device: name, Interface: rec.Interface, Direction: rec.Dir, Classifier: "u32"}
		s.Trees = append(s.Trees, t)
		if rec.PoliceOnly {
			t.Device = rec.Interface
			if !k.LinkExists(rec.Interface) {
				t.Missing = true
				continue
			}
			if err := readBPF(k, t, rec.Interface, rec.Dir == "ingress", rec, nil); unreadable(t, err) != nil {
				return nil, err
			}
			t.Missing = t.Classifier != "bpf" && len(t.Unread) == 0
			continue
		}
		if rec.EDT {
			if !k.LinkExists(name) {
				t.Missing = true
				continue
			}
			if err := readEDT(k, t, name, rec); unreadable(t, err) != nil {
				return nil, err
			}
			continue
		}
		root, err := tc.ParseHandle(rec.Root)
		if err != nil || classes == nil && !k.LinkExists(name) {
			t.Missing = true
			continue
		}
		live := classes[name]
		if classes == nil {
			start := time.Now()
			qs, err := k.Qdiscs(name)
			if err != nil {
				return nil, err
			}
			var roots []tc.Handle
			for _, q := range kernel.TreeQdiscs(qs) {
				roots = append(roots, q.Handle)
			}
			if live, err = k.ClassesOf(name, roots); err != nil {
				return nil, err
			}
			t.read = stamp(start)
		}
		if len(live) == 0 {
			t.Missing = true
			continue
		}
		known := classesOf(t, rec, root, live)
		if c := counted[name]; c != nil {
			<-c.done
			if c.err != nil {
				return nil, c.err
			}
			if c.cl != nil {
				c.cl.fill(t, rec, known)
			}
			if c.rtt != nil {
				c.rtt(t)
			}
		} else if err := readBPF(k, t, name, false, rec, known); unreadable(t, err) != nil {
			return nil, err
		}
	}
	return s, nil
}

// unreadable notes on t a BPF read the kernel refused this process
// (reading BPF objects needs root or CAP_BPF, where reading tc does
// not) and returns nil for it; any other error it returns.
func unreadable(t *Tree, err error) error {
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	t.Unread = append(t.Unread, fmt.Sprintf("sluice's BPF program and maps (%v): reading them needs root or CAP_BPF; what they count (classifier and policer counters, EDT aggregates) is left out", err))
	return nil
}

// classesOf fills t's classes from its live ones: the root's class
// first, then in the records' order, then classes the records do not
// know, in id order. It returns the records' index of each class they
// know (-1: the root's class).
//
// At 10,000 classes a pass this is a third of the agent's steady pass
// outside the kernel, so it keeps to one map of the records and one of
// depths, and one allocation for all the classes.
func classesOf(t *Tree, rec *records.Tree, root tc.Handle, live []*tc.Class) map[tc.Handle]int32 {
	slices.SortFunc(live, func(a, b *tc.Class) int { return cmp.Compare(a.Handle, b.Handle) })
	find := func(h tc.Handle) *tc.Class {
		i, ok := slices.BinarySearchFunc(live, h, func(c *tc.Class, h tc.Handle) int { return cmp.Compare(c.Handle, h) })
		if !ok {
			return nil
		}
		return live[i]
	}
	top := tc.MakeHandle(root.Major(), 1)
	known := make(map[tc.Handle]int32, len(rec.Classes)+1)
	known[top] = -1
	order := make([]tc.Handle, 0, max(len(rec.Classes)+1, len(live)))
	order = append(order, top)
	for i, ci := range rec.Classes {
		known[ci.Handle] = int32(i)
		order = append(order, ci.Handle)
	}
	for _, c := range live {
		if _, ok := known[c.Handle]; !ok {
			order = append(order, c.Handle)
		}
	}
	// depth holds every class taken, at its depth below the first
	// whose parent is not taken (the root's class, at 0).
	depth := make(map[tc.Handle]int, len(live))
	slab := make([]Class, 0, len(live))
	t.Classes = make([]*Class, 0, len(live))
	var parent tc.Handle // the last parent's id, which most siblings share
	var parentID string
	for _, h := range order {
		c := find(h)
		if c == nil {
			continue
		}
		if _, taken := depth[h]; taken {
			continue
		}
		d := 0
		if p, ok := depth[c.Parent]; ok {
			d = p + 1
		}
		depth[h] = d
		if c.Parent != parent || parentID == "" {
			parent, parentID = c.Parent, c.Parent.String()
		}
		name, leaf := "?", ""
		if i, ok := known[h]; ok && i >= 0 {
			name, leaf = rec.Classes[i].Name, rec.Classes[i].Leaf
		} else if ok {
			name = "(root)"
		}
		if c.Level > 0 {
			leaf = ""
		}
		slab = append(slab, Class{handle: h, Name: name, ID: h.String(), Parent: parentID, Depth: d, Leaf: leaf,
			Rate: c.Rate, Ceil: c.Ceil, Prio: c.Prio})
		out := &slab[len(slab)-1]
		if c.Stats != nil {
			out.Bytes, out.Packets, out.Drops = c.Stats.Bytes, c.Stats.Packets, c.Stats.Drops
			out.Overlimits, out.Backlog, out.Qlen = c.Stats.Overlimits, c.Stats.Backlog, c.Stats.Qlen
		}
		if c.HTB != nil {
			out.Borrowed, out.Lent, out.Tokens, out.Ctokens = c.HTB.Borrows, c.HTB.Lends, c.HTB.Tokens, c.HTB.Ctokens
		}
		t.Classes = append(t.Classes, out)
	}
	return known
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// Rates fills cur's measured rates from the bytes sent since prev.
func Rates(prev, cur *Sample) {
	if prev == nil {
		return
	}
	dt := cur.At.Sub(prev.At)
	if dt <= 0 {
		return
	}
	old := map[string]uint64{}
	read := map[string]time.Time{}
	for _, t := range prev.Trees {
		read[t.Device] = t.read
		for _, c := range t.Classes {
			old[t.Device+"/"+c.ID] = c.Bytes
		}
	}
	for _, t := range cur.Trees {
		dt := dt
		// Between the times the counters were read, where both readings
		// say.
		if p := read[t.Device]; !p.IsZero() && !t.read.IsZero() && t.read.After(p) {
			dt = t.read.Sub(p)
		}
		for _, c := range t.Classes {
			if b, ok := old[t.Device+"/"+c.ID]; ok && c.Bytes >= b {
				c.Measured = units.PerSecond(c.Bytes-b, dt)
				if c.QueueDelay == nil && c.Measured > 0 {
					q := float64(c.Backlog) / float64(c.Measured)
					c.QueueDelay = &q
				}
			}
		}
	}
}

// WriteJSON writes the sample as one JSON object.
func (s *Sample) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// TextOptions say what WriteText adds to its tables.
type TextOptions struct {
	// Hosts lists each per-host class's round trips beside its class's
	// (a line a host).
	Hosts bool
}

// WriteText writes a tree per device.
func (s *Sample) WriteText(w io.Writer, o TextOptions) {
	if len(s.Trees) == 0 {
		fmt.Fprintln(w, "sluice shapes nothing here (no records; see `sluice apply`)")
		return
	}
	for i, t := range s.Trees {
		if i > 0 {
			fmt.Fprintln(w)
		}
		title := t.Device + " " + t.Direction
		if t.Device != t.Interface {
			title += " of " + t.Interface
		}
		fmt.Fprintln(w, title)
		if t.Missing {
			fmt.Fprintln(w, "  (missing: the kernel no longer has this tree; run apply or reset)")
			continue
		}
		for _, u := range t.Unread {
			fmt.Fprintln(w, "  not read: "+u)
		}
		if len(t.Policers) > 0 {
			pw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(pw, "POLICER\tGREEN\t\tYELLOW\t\tRED\t\t")
			for _, p := range t.Policers {
				fmt.Fprintf(pw, "%s\t%d\t%s\t%d\t%s\t%d\t%s\t\n", p.Class, p.Green.Packets, units.Size(p.Green.Bytes),
					p.Yellow.Packets, units.Size(p.Yellow.Bytes), p.Red.Packets, units.Size(p.Red.Bytes))
			}
			pw.Flush()
		}
		if len(t.Classes) == 0 {
			continue
		}
		if t.Backend == "edt" {
			tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "AGGREGATE	RATE	CAP	KIND	MEASURED	PACKETS	BYTES	HORIZON DROPS	")
			for _, c := range t.Classes {
				kind := "prod"
				if c.Prio > 0 {
					kind = "nonprod"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t\n", strings.Repeat("  ", c.Depth)+c.Name, configured(c.Rate), configured(c.Ceil), kind,
					units.Bits(c.Measured.BitsFloat()), c.Packets, units.Size(c.Bytes), c.Drops)
			}
			tw.Flush()
			writeDelays(w, t.Delays)
			writeRTT(w, t, o.Hosts)
			continue
		}
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "CLASS\tID\tRATE\tCEIL\tPRIO\tMEASURED\tPACKETS\tBYTES\tDROPS\tOVERLIMITS\tBACKLOG\tBORROWED\t")
		for _, c := range t.Classes {
			name := strings.Repeat("  ", c.Depth) + c.Name
			prio := fmt.Sprint(c.Prio)
			if c.Leaf == "" {
				prio = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%d\t\n", name, c.ID,
				configured(c.Rate), configured(c.Ceil), prio, units.Bits(c.Measured.BitsFloat()),
				c.Packets, units.Size(c.Bytes), c.Drops, c.Overlimits, units.Size(uint64(c.Backlog)), c.Borrowed)
		}
		tw.Flush()
		writeRTT(w, t, o.Hosts)
		writeSharing(w, t.Sharing)
	}
}

// writeSharing prints the sharing controllers' last decisions (readings
// from the agent only).
func writeSharing(w io.Writer, ss []*Share) {
	if len(ss) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SHARING	WEIGHT	USAGE	DEMAND	SHARE	LIMIT	")
	for _, sh := range ss {
		name := sh.Class
		if sh.Owner != "" {
			name = sh.Owner + "/" + name
		}
		demand := units.Bits(sh.Demand.BitsFloat())
		if sh.Hungry {
			demand += " (held back)"
		}
		limit := "none"
		switch {
		case sh.Prod:
			name, limit = name+" (prod)", "never"
		case sh.Applied && sh.Assured:
			limit = units.Bits(sh.Limit.BitsFloat()) + " (rate)"
		case sh.Applied:
			limit = units.Bits(sh.Limit.BitsFloat()) + " (ceil)"
		}
		fmt.Fprintf(tw, "%s\t%.4g\t%s\t%s\t%s\t%s\t\n", name, sh.Weight, units.Bits(sh.Usage.BitsFloat()), demand, units.Bits(sh.Share.BitsFloat()), limit)
	}
	tw.Flush()
}

// configured writes a class's configured rate as a policy spells it.
func configured(r units.Rate) string { return r.String() }
