package bpf

// View is a loaded classifier seen read-only: its counters, round trips,
// pacing state and tables, and nothing that changes them. The executor
// (package kernel) is the only writer of the program's maps; what only
// reads (stats, the agent's controllers, show) gets a View, so that a
// write there does not compile. TestReadersCannotWrite (package
// kernel) keeps its methods to reads.
type View struct{ p *Program }

// View returns p seen read-only. Closing the view closes p.
func (p *Program) View() *View { return &View{p} }

// Close releases the program's maps.
func (v *View) Close() { v.p.Close() }

// ID is the program's kernel id.
func (v *View) ID() uint32 { return v.p.ID() }

// Read returns what the maps hold.
func (v *View) Read() (*Content, error) { return v.p.Read() }

// Counts returns the counters of the targets idx.
func (v *View) Counts(idx []uint32) (map[uint32]Counter, error) { return v.p.Counts(idx) }

// Colours returns policer number n's (from 1) packets and bytes per
// colour, summed over CPUs.
func (v *View) Colours(n uint32) ([3]Counter, error) { return v.p.Colours(n) }

// LookupHosts reads the host entries of keys; a key without one is left
// out.
func (v *View) LookupHosts(keys []HostKey) (map[HostKey]Target, error) {
	return v.p.LookupHosts(keys)
}

// Policers is how many policers the program holds.
func (v *View) Policers() (uint32, error) { return v.p.Policers() }

// Targets returns the class targets (not the hosts) and the number of
// policers.
func (v *View) Targets() ([]Target, uint32, error) { return v.p.Targets() }

// Paces reads the EDT state of the aggregates with counter indexes idx.
func (v *View) Paces(idx []uint32) (map[uint32]Pace, error) { return v.p.Paces(idx) }

// Delays returns the EDT delay histogram of aggregate h.
func (v *View) Delays(h uint16) (buckets [DelayBuckets]uint64, sum uint64, err error) {
	return v.p.Delays(h)
}

// RTT returns the round-trip histograms idx.
func (v *View) RTT(idx []uint32) (map[uint32]*RTTHist, error) { return v.p.RTT(idx) }

// HostRTT returns the hosts' round-trip histograms idx.
func (v *View) HostRTT(idx []uint32) (map[uint32]*HostRTTHist, error) { return v.p.HostRTT(idx) }

// FlowsTracked counts the flows the hook's flow map holds now (a walk).
func (v *View) FlowsTracked() (int, error) { return v.p.FlowsTracked() }

// RTTCounts is what the round-trip stage saw, summed over CPUs.
func (v *View) RTTCounts() (RTTCounts, error) { return v.p.RTTCounts() }

// RTTMode is what the hook does with round trips (nil: nothing).
func (v *View) RTTMode() (*RTT, error) { return v.p.RTTMode() }
