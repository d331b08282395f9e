package bpf

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"

	"sluice/internal/writecap"
	"sluice/units"
)

// NamePrefix starts the cls_bpf filter name of every classifier sluice
// attaches; the rest is Version, so that a live program built from other
// C code is recognised and replaced.
const NamePrefix = "sluice-"

// Version identifies the compiled classifier: a hash of its object file.
var Version = func() string {
	h := sha256.Sum256(_ClassifierBytes)
	return hex.EncodeToString(h[:6])
}()

// FilterName is the cls_bpf name sluice gives its classifier.
func FilterName() string { return NamePrefix + Version }

// IsOurs reports whether a cls_bpf filter name is one of sluice's (of
// any version).
func IsOurs(name string) bool { return strings.HasPrefix(name, NamePrefix) }

// Program is a loaded classifier and its maps.
type Program struct {
	objs ClassifierObjects
	// CounterCap is the size of the per-class counter map (and of the
	// EDT state map), HistCap of the EDT delay histogram map and FlowCap
	// of the flow map (0 in a live program of a version without one).
	CounterCap, HistCap, FlowCap uint32
}

// Load loads the classifier with maps sized for c and fills them.
func Load(c *Content) (*Program, error) { return LoadShared(c, nil) }

// LoadShared loads the classifier like Load, sharing the round-trip
// maps (flows and histograms) of sibling, the program on another hook of
// the same interface, when sibling is not nil and has them: round trips
// one hook starts the other ends.
func LoadShared(c *Content, sibling *Program) (*Program, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	spec, err := LoadClassifier()
	if err != nil {
		return nil, fmt.Errorf("bpf classifier: %w", err)
	}
	p := &Program{CounterCap: c.Counters(), HistCap: c.Hists(), FlowCap: c.RTT.flows()}
	spec.Maps[ClassifierMapCounters].MaxEntries = p.CounterCap
	spec.Maps[ClassifierMapPaces].MaxEntries = p.CounterCap
	spec.Maps[ClassifierMapDelays].MaxEntries = p.HistCap
	spec.Maps[ClassifierMapHosts].MaxEntries = MaxHosts
	spec.Maps[ClassifierMapFlows].MaxEntries = p.FlowCap
	if c.RTT != nil && c.RTT.Record {
		// A host's round trips are kept where its counter is.
		spec.Maps[ClassifierMapHostRtts].MaxEntries = p.CounterCap
	}
	var opts *ebpf.CollectionOptions
	if sibling != nil && sibling.objs.Flows != nil && sibling.objs.Rtts != nil {
		p.FlowCap = sibling.FlowCap
		opts = &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
			ClassifierMapFlows: sibling.objs.Flows, ClassifierMapRtts: sibling.objs.Rtts}}
	}
	if err := spec.LoadAndAssign(&p.objs, opts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("bpf classifier: the kernel's verifier refused it: %+v", ve)
		}
		return nil, fmt.Errorf("bpf classifier: load: %w", err)
	}
	if err := (&Writer{p}).Write(c, nil); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Open takes hold of the live classifier program with id (from a
// cls_bpf filter dump) and its maps.
func Open(id uint32) (*Program, error) {
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return nil, fmt.Errorf("bpf program %d: %w", id, err)
	}
	p := &Program{}
	p.objs.SluiceClassify = prog
	info, err := prog.Info()
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("bpf program %d: %w", id, err)
	}
	ids, _ := info.MapIDs()
	byName := map[string]**ebpf.Map{
		ClassifierMapSettings: &p.objs.Settings, ClassifierMapRules: &p.objs.Rules, ClassifierMapBlocks: &p.objs.Blocks,
		ClassifierMapTargets: &p.objs.Targets, ClassifierMapHosts: &p.objs.Hosts, ClassifierMapCounters: &p.objs.Counters,
		ClassifierMapPolicers: &p.objs.Policers, ClassifierMapColours: &p.objs.Colours,
		ClassifierMapPaces: &p.objs.Paces, ClassifierMapDelays: &p.objs.Delays,
		ClassifierMapFlows: &p.objs.Flows, ClassifierMapRtts: &p.objs.Rtts, ClassifierMapRttCounts: &p.objs.RttCounts,
		ClassifierMapHostRtts: &p.objs.HostRtts,
	}
	// The round-trip maps came later: a live program of an earlier
	// version has none, and is still sluice's.
	optional := map[string]bool{ClassifierMapFlows: true, ClassifierMapRtts: true, ClassifierMapRttCounts: true,
		ClassifierMapHostRtts: true}
	for _, mid := range ids {
		m, err := ebpf.NewMapFromID(mid)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("bpf program %d: map %d: %w", id, mid, err)
		}
		mi, err := m.Info()
		if slot, ok := byName[mi.Name]; err == nil && ok && *slot == nil {
			*slot = m
			switch mi.Name {
			case ClassifierMapCounters:
				p.CounterCap = m.MaxEntries()
			case ClassifierMapDelays:
				p.HistCap = m.MaxEntries()
			case ClassifierMapFlows:
				p.FlowCap = m.MaxEntries()
			}
			continue
		}
		m.Close()
	}
	for name, slot := range byName {
		if *slot == nil && !optional[name] {
			p.Close()
			return nil, fmt.Errorf("bpf program %d is not sluice's classifier: it has no map %q", id, name)
		}
	}
	return p, nil
}

// Close releases the program and maps (an attached program stays in the
// kernel, held by its filter).
func (p *Program) Close() { p.objs.Close() }

// Writer is a Program's writes: its maps' contents, the host table's
// swaps, its descriptor for attaching, and test runs (which count in
// its maps). A Program reads; Program.Writer hands its Writer out for a
// writecap.Token, which only the executor and the benchmarks' own
// programs can name (TestOneWriterByImports).
type Writer struct{ *Program }

// Writer returns p's writes.
func (p *Program) Writer(writecap.Token) *Writer { return &Writer{p} }

// FD is the program's file descriptor, for attaching.
func (p *Writer) FD() int { return p.objs.SluiceClassify.FD() }

// ID is the kernel's id of the program.
func (p *Program) ID() uint32 {
	info, err := p.objs.SluiceClassify.Info()
	if err != nil {
		return 0
	}
	id, _ := info.ID()
	return uint32(id)
}

// Prog is the loaded program (for test runs).
func (p *Writer) Prog() *ebpf.Program { return p.objs.SluiceClassify }

func (c *Content) config() ClassifierConfig {
	cfg := ClassifierConfig{L2len: c.L2Len, DefaultTarget: c.Default, Shards: c.Shards,
		Nrules: uint32(len(c.Rules)), Nblocks: uint32(len(c.Blocks)), Ntargets: uint32(len(c.Targets)),
		Npolicers: uint32(len(c.Policers))}
	if c.SetPriority {
		cfg.Flags |= cfgSetPriority
	}
	if c.Ingress {
		cfg.Flags |= cfgIngress
	}
	if c.TestClock {
		cfg.Flags |= cfgTestClock
	}
	if r := c.RTT; r != nil {
		if r.Record {
			cfg.Flags |= cfgRTTRecord
		}
		if r.Echo {
			cfg.Flags |= cfgRTTEcho
		}
		if r.Observe {
			cfg.Flags |= cfgObserve
		}
	}
	if e := c.EDT; e != nil {
		cfg.Flags |= cfgEDT
		if e.Prio {
			cfg.Flags |= cfgEDTPrio
		}
		if e.FromIngress {
			cfg.Flags |= cfgEDTArrival
		}
		cfg.Horizon, cfg.Exempt = e.Horizon, e.Exempt
		cfg.Pool, cfg.PoolRate, cfg.PoolBurst = e.Pool, uint64(e.PoolRate), e.PoolBurst
		cfg.Overhead, cfg.Mpu = e.Link.Overhead, e.Link.MPU
		if e.Link.ATM {
			cfg.Atm = 1
		}
		for i, q := range e.Queues {
			cfg.Q_first[i], cfg.Q_count[i] = q.First, q.Count
		}
	}
	return cfg
}

// Write makes the maps hold c. With old (what they hold now) it writes
// only the entries that differ, in an order that keeps every packet's
// lookup valid: policers, targets and hosts before the rules that lead
// to them, host deletions last. A policer whose settings change starts
// again with full buckets.
func (p *Writer) Write(c, old *Content) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if old == nil {
		old = &Content{}
	}
	o := &p.objs
	var pkeys []uint32
	var pvals []ClassifierPolicer
	for i, pl := range c.Policers {
		if i < len(old.Policers) && old.Policers[i] == pl {
			continue
		}
		pkeys = append(pkeys, uint32(i+1))
		pvals = append(pvals, pl.initial())
	}
	for i := range pkeys {
		if err := o.Policers.Update(pkeys[i], pvals[i], ebpf.UpdateLock); err != nil {
			return fmt.Errorf("bpf classifier: write policer %d: %w", pkeys[i], err)
		}
	}
	if err := writeArray(o.Targets, c.Targets, old.Targets, "class targets"); err != nil {
		return err
	}
	var hk []HostKey
	var hv []Target
	for k, v := range c.Hosts {
		if w, ok := old.Hosts[k]; !ok || w != v {
			hk = append(hk, k)
			hv = append(hv, v)
		}
	}
	if err := updateMany(o.Hosts, hk, hv, "hosts"); err != nil {
		return err
	}
	if err := writeArray(o.Rules, c.Rules, old.Rules, "rules"); err != nil {
		return err
	}
	if err := writeArray(o.Blocks, c.Blocks, old.Blocks, "rule blocks"); err != nil {
		return err
	}
	if err := o.Settings.Update(uint32(0), c.config(), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf classifier: write settings: %w", err)
	}
	for k := range old.Hosts {
		if _, ok := c.Hosts[k]; !ok {
			if err := o.Hosts.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("bpf classifier: delete host: %w", err)
			}
		}
	}
	return nil
}

func (pl Policer) initial() ClassifierPolicer {
	aware := uint8(0)
	if pl.Aware {
		aware = 1
	}
	return ClassifierPolicer{Mode: pl.Mode, Aware: aware, Act: pl.Act, Dscp: pl.DSCP,
		Cir: pl.CIR, Pir: pl.PIR, Cbs: pl.CBS, Ebs: pl.EBS, Tc: int64(pl.CBS) * 1e9, Te: int64(pl.EBS) * 1e9}
}

// writeArray writes the entries of want that differ from have.
func writeArray[T comparable](m *ebpf.Map, want, have []T, what string) error {
	var keys []uint32
	var vals []T
	for i, v := range want {
		if i < len(have) && have[i] == v {
			continue
		}
		keys = append(keys, uint32(i))
		vals = append(vals, v)
	}
	return updateMany(m, keys, vals, what)
}

// updateMany writes entries in batches where the map type allows it, and
// one by one where it does not (LPM tries have no batch update).
func updateMany[K comparable, V any](m *ebpf.Map, keys []K, vals []V, what string) error {
	if len(keys) == 0 {
		return nil
	}
	if m.Type() != ebpf.LPMTrie {
		if _, err := m.BatchUpdate(keys, vals, nil); err == nil {
			return nil
		}
	}
	for i := range keys {
		if err := m.Update(keys[i], vals[i], ebpf.UpdateAny); err != nil {
			return fmt.Errorf("bpf classifier: write %s: %w", what, err)
		}
	}
	return nil
}

// Read returns what the maps hold.
func (p *Program) Read() (*Content, error) {
	o := &p.objs
	var cfg ClassifierConfig
	if err := o.Settings.Lookup(uint32(0), &cfg); err != nil {
		return nil, fmt.Errorf("bpf classifier: read settings: %w", err)
	}
	c := &Content{L2Len: cfg.L2len, SetPriority: cfg.Flags&cfgSetPriority != 0, TestClock: cfg.Flags&cfgTestClock != 0, Ingress: cfg.Flags&cfgIngress != 0,
		Default: cfg.DefaultTarget, Shards: cfg.Shards, Hosts: map[HostKey]Target{}}
	c.RTT = rttFlags(cfg.Flags, p.FlowCap)
	if cfg.Flags&cfgEDT != 0 {
		c.EDT = &EDT{Horizon: cfg.Horizon, Exempt: cfg.Exempt, Prio: cfg.Flags&cfgEDTPrio != 0, FromIngress: cfg.Flags&cfgEDTArrival != 0,
			Pool: cfg.Pool, PoolRate: units.Rate(cfg.PoolRate), PoolBurst: cfg.PoolBurst,
			Link: Link{Overhead: cfg.Overhead, MPU: cfg.Mpu, ATM: cfg.Atm != 0}}
		for i := range c.EDT.Queues {
			c.EDT.Queues[i] = QueueRange{First: cfg.Q_first[i], Count: cfg.Q_count[i]}
		}
	}
	var err error
	if c.Rules, err = readArray[Rule](o.Rules, cfg.Nrules); err != nil {
		return nil, err
	}
	if c.Blocks, err = readArray[Block](o.Blocks, cfg.Nblocks); err != nil {
		return nil, err
	}
	if c.Targets, err = readArray[Target](o.Targets, cfg.Ntargets); err != nil {
		return nil, err
	}
	pols, err := readArray[ClassifierPolicer](o.Policers, cfg.Npolicers+1)
	if err != nil {
		return nil, err
	}
	for _, v := range pols[1:] {
		c.Policers = append(c.Policers, Policer{Mode: v.Mode, Aware: v.Aware != 0, Act: v.Act, DSCP: v.Dscp,
			CIR: v.Cir, PIR: v.Pir, CBS: v.Cbs, EBS: v.Ebs})
	}
	var k HostKey
	var t Target
	it := o.Hosts.Iterate()
	for it.Next(&k, &t) {
		c.Hosts[k] = t
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bpf classifier: read hosts: %w", err)
	}
	return c, nil
}

func readArray[T any](m *ebpf.Map, n uint32) ([]T, error) {
	out := make([]T, n)
	if n == 0 {
		return out, nil
	}
	keys := make([]uint32, n)
	var cursor ebpf.MapBatchCursor
	got, err := m.BatchLookup(&cursor, keys, out, nil)
	if err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
		if uint32(got) >= n {
			return out, nil
		}
	}
	for i := uint32(0); i < n; i++ { // no batch API: one by one
		if err := m.Lookup(i, &out[i]); err != nil {
			return nil, fmt.Errorf("bpf classifier: read %s[%d]: %w", m, i, err)
		}
	}
	return out, nil
}

// Counts sums the per-CPU counters at the given indexes.
//
// They are read in one batch where the kernel has the batch API (5.6):
// one lookup per counter cost a system call each, 10 ms a pass at
// 10,000 hosts.
func (p *Program) Counts(idx []uint32) (map[uint32]Counter, error) {
	out := make(map[uint32]Counter, len(idx))
	if all, ok := p.countsBatch(idx); ok {
		for _, i := range idx {
			if i < uint32(len(all)) {
				out[i] = all[i]
			}
		}
		return out, nil
	}
	var per []Counter
	for _, i := range idx {
		if i >= p.CounterCap {
			continue
		}
		if err := p.objs.Counters.Lookup(i, &per); err != nil {
			return nil, fmt.Errorf("bpf classifier: read counter %d: %w", i, err)
		}
		out[i] = sum(per)
	}
	return out, nil
}

// countsBatch reads the counters from 0 to the highest of idx in
// batches, summed over CPUs; ok false where the kernel cannot.
func (p *Program) countsBatch(idx []uint32) ([]Counter, bool) {
	var n uint32
	for _, i := range idx {
		if i < p.CounterCap {
			n = max(n, i+1)
		}
	}
	if n == 0 {
		return nil, true
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, false
	}
	keys := make([]uint32, n)
	per := make([]Counter, int(n)*cpus)
	var cursor ebpf.MapBatchCursor
	got, err := p.objs.Counters.BatchLookup(&cursor, keys, per, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) || uint32(got) < n {
		return nil, false
	}
	out := make([]Counter, n)
	for j, k := range keys[:got] {
		if k < n {
			out[k] = sum(per[j*cpus : (j+1)*cpus])
		}
	}
	return out, true
}

// Colours returns, for policer number n (from 1), its packets and bytes
// per colour, summed over CPUs.
func (p *Program) Colours(n uint32) ([3]Counter, error) {
	var out [3]Counter
	var per []Counter
	for c := uint32(0); c < 3; c++ {
		if err := p.objs.Colours.Lookup(n*3+c, &per); err != nil {
			return out, fmt.Errorf("bpf classifier: read colours of policer %d: %w", n, err)
		}
		out[c] = sum(per)
	}
	return out, nil
}

func sum(per []Counter) Counter {
	var s Counter
	for _, c := range per {
		s.Packets += c.Packets
		s.Bytes += c.Bytes
	}
	return s
}

// SwapHosts writes host entries in place: every key must hold its
// value in old (what the caller last wrote) before any is written,
// otherwise nothing is written and the error says which differs. The
// update of one entry is atomic to the packets that look it up.
// before, if set, runs before each write (the executor counts writes
// there); if it or a write fails, the entries already written get
// their old values back.
func (p *Writer) SwapHosts(old, new map[HostKey]Target, before func() error) error {
	keys := make([]HostKey, 0, len(new))
	for k := range new {
		var have Target
		if err := p.objs.Hosts.Lookup(k, &have); err != nil {
			return fmt.Errorf("bpf classifier: host %s: %w", hostKeyText(k), err)
		}
		if want, ok := old[k]; !ok || have != want {
			return fmt.Errorf("bpf classifier: host %s holds another target than planned", hostKeyText(k))
		}
		keys = append(keys, k)
	}
	for i, k := range keys {
		err := error(nil)
		if before != nil {
			err = before()
		}
		if err == nil {
			if err = p.objs.Hosts.Update(k, new[k], ebpf.UpdateExist); err != nil {
				err = fmt.Errorf("bpf classifier: write host %s: %w", hostKeyText(k), err)
			}
		}
		if err != nil {
			for _, w := range keys[:i] {
				p.objs.Hosts.Update(w, old[w], ebpf.UpdateExist)
			}
			return err
		}
	}
	return nil
}

func hostKeyText(k HostKey) string {
	t, p := k.Prefix()
	return fmt.Sprintf("%s (table %d)", p, t)
}

// LookupHosts reads the host entries of keys; a key without one is
// left out.
func (p *Program) LookupHosts(keys []HostKey) (map[HostKey]Target, error) {
	out := make(map[HostKey]Target, len(keys))
	for _, k := range keys {
		var t Target
		err := p.objs.Hosts.Lookup(k, &t)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("bpf classifier: host %s: %w", hostKeyText(k), err)
		}
		out[k] = t
	}
	return out, nil
}

// Policers is how many policers the program holds, read alone: a
// reader with none to report need not read the targets.
func (p *Program) Policers() (uint32, error) {
	var cfg ClassifierConfig
	if err := p.objs.Settings.Lookup(uint32(0), &cfg); err != nil {
		return 0, fmt.Errorf("bpf classifier: read settings: %w", err)
	}
	return cfg.Npolicers, nil
}

// Targets reads the class targets (not the hosts) and the number of
// policers: enough to name each policer's class.
func (p *Program) Targets() ([]Target, uint32, error) {
	var cfg ClassifierConfig
	if err := p.objs.Settings.Lookup(uint32(0), &cfg); err != nil {
		return nil, 0, fmt.Errorf("bpf classifier: read settings: %w", err)
	}
	t, err := readArray[Target](p.objs.Targets, cfg.Ntargets)
	return t, cfg.Npolicers, err
}
