package lab

import (
	"math"
	"sort"
	"strings"

	"sluice/bpf"
	"sluice/share"
)

// Result is one variant of a scenario, run: every series sampled every
// Bucket seconds, and per-phase summaries.
type Result struct {
	Scenario string            `json:"scenario"`
	Variant  string            `json:"variant"`
	Note     string            `json:"note,omitempty"`
	Skipped  string            `json:"skipped,omitempty"`
	Matrix   map[string]string `json:"matrix,omitempty"`
	Policy   string            `json:"policy,omitempty"`
	Bucket   float64           `json:"bucket_s"`
	// Spans are the seconds each bucket's flow readings really covered
	// (a late tick makes one longer, the next shorter): a phase's
	// goodput weighs each bucket by its span.
	Spans    []float64        `json:"spans_s,omitempty"`
	Duration float64          `json:"duration_s"`
	Phases   []*PhaseResult   `json:"phases"`
	Flows    []*FlowSeries    `json:"flows"`
	Classes  []*ClassSeries   `json:"classes"`
	Policers []*PolicerSeries `json:"policers,omitempty"`
	Probes   []*ProbeSeries   `json:"probes"`
	// Autorate is each rate: auto controller's state, per bucket.
	Autorate []*AutorateSeries `json:"autorate,omitempty"`
	Verdicts []Verdict         `json:"verdicts,omitempty"`
}

// AutorateSeries is one rate: auto controller (the agent's) over the
// run: the rate it decided, what its device passed, the delay above the
// reflectors' baselines, its state; bits/s and ms, per bucket.
type AutorateSeries struct {
	Device    string    `json:"device"`
	Direction string    `json:"direction"`
	Rate      []float64 `json:"rate_bps"`
	Passed    []float64 `json:"passed_bps"`
	Delay     []float64 `json:"delay_ms"`
	State     []string  `json:"state"`
	// Replaced counts the reflectors replaced by the run's end.
	Replaced uint64 `json:"reflectors_replaced"`
}

// ModemDir is the modem's direction the controller shapes: "down"
// for the ingress (the download, on the ifb), "up" otherwise.
func (a *AutorateSeries) ModemDir() string {
	if a.Direction == "ingress" {
		return "down"
	}
	return "up"
}

// AutorateStat is a controller over one phase: its mean rate in the
// phase's steady part, its rate where that part starts (past the
// settle time, as every other statistic of the phase) and its rate at
// the phase's end (bits/s).
type AutorateStat struct {
	Rate  float64 `json:"rate_bps"`
	Start float64 `json:"start_rate_bps"`
	End   float64 `json:"end_rate_bps"`
}

// FlowSeries is one TCP connection or UDP stream.
type FlowSeries struct {
	Name    string    `json:"name"`
	Item    string    `json:"item"`
	Type    string    `json:"type"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Host    string    `json:"host"` // its client end, for per-host results
	Class   string    `json:"class,omitempty"`
	CC      string    `json:"cc,omitempty"`
	Goodput []float64 `json:"goodput_bps"`
	RTT     []float64 `json:"rtt_ms,omitempty"`
	Retrans []uint64  `json:"retransmits,omitempty"` // cumulative
	Segs    []uint64  `json:"segments,omitempty"`    // cumulative
	Sent    uint64    `json:"sent_bytes"`
}

// ClassSeries is one policy class on the router, from its counters.
type ClassSeries struct {
	Device string    `json:"device"`
	Name   string    `json:"name"`
	ID     string    `json:"id"`
	Depth  int       `json:"depth"`
	Leaf   bool      `json:"leaf"`
	Rate   float64   `json:"rate_bps"`
	Ceil   float64   `json:"ceil_bps"`
	Bps    []float64 `json:"bps"`
	Drops  []uint64  `json:"drops"` // cumulative
	// Backlog is what the class held queued when each bucket was read
	// (bytes; an EDT aggregate's: its clock's lead at its cap), which
	// the phases' queue delay comes from.
	Backlog []uint32 `json:"backlog_bytes,omitempty"`
	// Sharing is what the agent's sharing controller decided for the
	// class, per bucket (policies with sharing: controller).
	Sharing *SharingSeries `json:"sharing,omitempty"`
	// rtt is the class's cumulative round-trip histogram at each bucket
	// (nil where not read), which the phases' RTT come from.
	rtt []*bpf.RTTHist
}

// SharingSeries is a controlled class's demand, share and limit over
// time (bits/s per bucket; 0 before the controller's first quantum).
// Limit is the ceil in force: the applied limit, or the policy's ceil.
type SharingSeries struct {
	Weight float64   `json:"weight"`
	Prod   bool      `json:"prod,omitempty"`
	Demand []float64 `json:"demand_bps"`
	Share  []float64 `json:"share_bps"`
	Limit  []float64 `json:"limit_bps"`
}

// PolicerSeries is one BPF policer on the router: cumulative bytes by
// colour.
type PolicerSeries struct {
	Device string   `json:"device"`
	Class  string   `json:"class"`
	Green  []uint64 `json:"green"`
	Yellow []uint64 `json:"yellow"`
	Red    []uint64 `json:"red"`
}

// Key names a policer across the router's devices.
func (p *PolicerSeries) Key() string { return p.Device + "/" + p.Class }

// Key names a class across the router's devices.
func (c *ClassSeries) Key() string { return c.Device + "/" + c.Name }

// ProbeSeries is one latency probe's samples.
type ProbeSeries struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	From    string   `json:"from"`
	To      string   `json:"to"`
	Class   string   `json:"class,omitempty"`
	Samples []Sample `json:"samples"`
}

// PhaseResult summarises one phase (its first Settle seconds left out).
type PhaseResult struct {
	Name  string  `json:"name"`
	Start float64 `json:"start_s"`
	End   float64 `json:"end_s"`
	// From is where the phase's figures start: past the scenario's
	// settle (the seconds after a change that they leave out), or at
	// Start where the phase is shorter. Expectations with `after` read
	// the phase from their own point instead.
	From          float64               `json:"summary_from_s"`
	Probes        map[string]*Latency   `json:"probes"`
	Flows         map[string]*FlowStat  `json:"flows"`
	Classes       map[string]*ClassStat `json:"classes"`
	Hosts         map[string]float64    `json:"hosts_bps"`
	HostsFairness float64               `json:"hosts_fairness"`
	FlowsFairness float64               `json:"flows_fairness"`
	Total         float64               `json:"goodput_bps"`
	// Modem is the modem's line rate per direction ("up", "down") in the
	// phase, bits per second, where the scenario changes it.
	Modem map[string]float64 `json:"modem_bps,omitempty"`
	// Policers are the router's BPF policers' verdicts, by device/class.
	Policers map[string]*PolicerStat `json:"policers,omitempty"`
	// Autorate is each rate: auto controller in the phase, by device.
	Autorate map[string]*AutorateStat `json:"autorate,omitempty"`

	byClass map[string][]*FlowStat
	nflows  int
}

// PolicerStat counts a policer's verdicts over a phase, in bytes (a
// GSO super-packet is one packet of up to 64 KB: bytes compare).
type PolicerStat struct {
	Green  uint64 `json:"green"`
	Yellow uint64 `json:"yellow"`
	Red    uint64 `json:"red"`
}

// policed sums the phase's policers: bytes metered and coloured red.
func (p *PhaseResult) policed() (bytes, red uint64) {
	for _, ps := range p.Policers {
		bytes += ps.Green + ps.Yellow + ps.Red
		red += ps.Red
	}
	return bytes, red
}

func ratioOf(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Latency summarises probe samples (milliseconds).
type Latency struct {
	N    int     `json:"n"`
	Lost int     `json:"lost"`
	Loss float64 `json:"loss"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P95  float64 `json:"p95_ms"`
	P99  float64 `json:"p99_ms"`
	Avg  float64 `json:"avg_ms"`
	Max  float64 `json:"max_ms"`
	// TM95 is the mean of the fastest 95% (the trimmed mean the IETF's
	// responsiveness draft takes of its probes).
	TM95 float64 `json:"tm95_ms"`
	// Responsiveness is the phase's round trips per minute and
	// bufferbloat grade (Responsiveness), where the run has a phase to
	// compare with.
	Responsiveness *Responsiveness `json:"responsiveness,omitempty"`
}

func (l *Latency) pick(metric string) float64 {
	switch metric {
	case "p50":
		return l.P50
	case "p90":
		return l.P90
	case "p95":
		return l.P95
	case "p99":
		return l.P99
	case "avg":
		return l.Avg
	}
	return l.Max
}

// FlowStat is a traffic item's goodput in a phase (all its flows).
type FlowStat struct {
	Goodput      float64 `json:"goodput_bps"`
	RetransRatio float64 `json:"retransmit_ratio"`
	RTT          float64 `json:"rtt_ms,omitempty"`
	Class        string  `json:"class,omitempty"`
	Flows        int     `json:"flows"`
}

// ClassStat is a class's counters over a phase.
type ClassStat struct {
	Bps   float64 `json:"bps"`
	Drops uint64  `json:"drops"`
	Rate  float64 `json:"rate_bps"`
	// RTT is the round trips its TCP flows' own packets timed in the
	// phase (after its settling time), where the class has them.
	RTT *RTTStat `json:"rtt,omitempty"`
}

// Summarize computes latency statistics of samples.
func Summarize(samples []Sample) *Latency {
	l := &Latency{}
	var rtts []float64
	for _, s := range samples {
		if s.Lost {
			l.Lost++
			continue
		}
		rtts = append(rtts, s.RTT)
	}
	l.N = len(rtts)
	if total := l.N + l.Lost; total > 0 {
		l.Loss = float64(l.Lost) / float64(total)
	}
	if l.N == 0 {
		return l
	}
	sort.Float64s(rtts)
	pct := func(p float64) float64 {
		i := int(math.Ceil(p/100*float64(len(rtts)))) - 1
		return rtts[max(0, min(i, len(rtts)-1))]
	}
	l.P50, l.P90, l.P95, l.P99, l.Max = pct(50), pct(90), pct(95), pct(99), rtts[len(rtts)-1]
	var s float64
	for _, r := range rtts {
		s += r
	}
	l.Avg = s / float64(len(rtts))
	keep := max(1, int(math.Floor(0.95*float64(len(rtts)))))
	s = 0
	for _, r := range rtts[:keep] {
		s += r
	}
	l.TM95 = s / float64(keep)
	return l
}

// Jain is Jain's fairness index of xs (share.Jain).
func Jain(xs []float64) float64 { return share.Jain(xs) }

func (r *Result) phase(name string) *PhaseResult {
	if name == "" {
		return r.whole()
	}
	for _, p := range r.Phases {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// whole summarises the entire run as one phase.
func (r *Result) whole() *PhaseResult {
	if len(r.Phases) == 1 {
		return r.Phases[0]
	}
	return r.summarize("whole run", 0, r.Duration, 0)
}

func (r *Result) latency(p *PhaseResult, subject, name string) (*Latency, bool) {
	if subject == "probe" {
		l, ok := p.Probes[name]
		return l, ok && l.N+l.Lost > 0
	}
	var samples []Sample
	for _, pr := range r.Probes {
		if classMatches(pr.Class, name) {
			samples = append(samples, window(pr.Samples, p.Start, p.End)...)
		}
	}
	l := Summarize(samples)
	return l, l.N+l.Lost > 0
}

// classMatches compares a traffic item's class tag with a name given as
// "interactive" or "wan/interactive".
func classMatches(tag, name string) bool {
	if tag == name {
		return true
	}
	_, short, ok := strings.Cut(tag, "/")
	_, short2, ok2 := strings.Cut(name, "/")
	return ok && short == name || ok2 && tag == short2
}

func window(s []Sample, from, to float64) []Sample {
	var out []Sample
	for _, x := range s {
		if x.T >= from && x.T < to {
			out = append(out, x)
		}
	}
	return out
}

func (p *PhaseResult) classGoodput(name string) float64 {
	var s float64
	for tag, fs := range p.byClass {
		if classMatches(tag, name) {
			for _, f := range fs {
				s += f.Goodput
			}
		}
	}
	return s
}

// ClassDrops is the drops of the class called name in the phase.
func (p *PhaseResult) ClassDrops(name string) uint64 {
	var d uint64
	for k, c := range p.Classes {
		if classMatches(k, name) {
			d += c.Drops
		}
	}
	return d
}

func (r *Result) classRate(name string) float64 {
	for _, c := range r.Classes {
		if classMatches(c.Key(), name) || c.Name == name {
			return c.Rate
		}
	}
	return 0
}

// summarize computes a phase's statistics over [from+settle, to).
// bucketAt is the first bucket whose middle is at t seconds or later,
// by the time the buckets really covered (Spans) where known: a reader
// that falls behind loses ticks, and bucket i then ends later than
// (i+1) buckets in (a slow machine's lane read the per-host classes'
// counters for so long that fair-share's lone user's flow, started 16 s
// in, counted in the phase before, and its own phase got 2.36 of its
// 32 Mbit/s).
func (r *Result) bucketAt(t float64) int {
	if len(r.Spans) == 0 {
		return int(t/r.Bucket + 0.5)
	}
	var end float64
	for i, d := range r.Spans {
		if end+d/2 >= t {
			return i
		}
		end += d
	}
	return len(r.Spans)
}

// bucketEnd is the time (seconds into the run) bucket i ended.
func (r *Result) bucketEnd(i int) float64 {
	if len(r.Spans) <= i {
		return float64(i+1) * r.Bucket
	}
	var end float64
	for _, d := range r.Spans[:i+1] {
		end += d
	}
	return end
}

func (r *Result) summarize(name string, from, to, settle float64) *PhaseResult {
	p := &PhaseResult{Name: name, Start: from, End: to, Probes: map[string]*Latency{}, Flows: map[string]*FlowStat{},
		Classes: map[string]*ClassStat{}, Hosts: map[string]float64{}, byClass: map[string][]*FlowStat{}}
	lo, hi := r.bucketAt(from+settle), r.bucketAt(to)
	p.From = from + settle
	if lo >= hi {
		lo, p.From = r.bucketAt(from), from
	}
	mean := func(xs []float64) float64 {
		var s float64
		n := 0
		for i := lo; i < hi && i < len(xs); i++ {
			s += xs[i]
			n++
		}
		if n == 0 {
			return 0
		}
		return s / float64(hi-lo)
	}
	delta := func(xs []uint64) uint64 {
		if len(xs) == 0 {
			return 0
		}
		a, b := min(lo, len(xs)-1), min(hi-1, len(xs)-1)
		if lo > 0 {
			a = min(lo-1, len(xs)-1)
		}
		return xs[b] - xs[a]
	}
	// Goodput is bytes over time: each bucket's rate weighed by the
	// time it covered. An unweighted mean counted a stalled reader's
	// catch-up twice (its short bucket after a long one): 10.37 Mbit/s
	// of goodput through a 10mbit class in the emulated lane.
	spanMean := func(xs []float64) float64 {
		if len(r.Spans) < len(xs) {
			return mean(xs)
		}
		var s, d float64
		for i := lo; i < hi && i < len(xs); i++ {
			s += xs[i] * r.Spans[i]
			d += r.Spans[i]
		}
		if d == 0 {
			return mean(xs)
		}
		return s / d
	}
	var perFlow []float64
	for _, f := range r.Flows {
		g := spanMean(f.Goodput)
		fs := p.Flows[f.Item]
		if fs == nil {
			fs = &FlowStat{Class: f.Class}
			p.Flows[f.Item] = fs
			p.byClass[f.Class] = append(p.byClass[f.Class], fs)
		}
		fs.Goodput += g
		fs.Flows++
		if re, sg := delta(f.Retrans), delta(f.Segs); sg > 0 {
			fs.RetransRatio = (fs.RetransRatio*float64(fs.Flows-1) + float64(re)/float64(sg)) / float64(fs.Flows)
		}
		if len(f.RTT) > 0 {
			fs.RTT = (fs.RTT*float64(fs.Flows-1) + mean(f.RTT)) / float64(fs.Flows)
		}
		if g > 0 || active(f.Goodput, lo, hi) {
			perFlow = append(perFlow, g)
			p.Hosts[f.Host] += g
		}
		p.Total += g
	}
	for _, c := range r.Classes {
		p.Classes[c.Key()] = &ClassStat{Bps: mean(c.Bps), Drops: delta(c.Drops), Rate: c.Rate, RTT: c.rttOver(lo, hi)}
	}
	for _, pl := range r.Policers {
		if p.Policers == nil {
			p.Policers = map[string]*PolicerStat{}
		}
		p.Policers[pl.Key()] = &PolicerStat{Green: delta(pl.Green), Yellow: delta(pl.Yellow), Red: delta(pl.Red)}
	}
	for _, a := range r.Autorate {
		if p.Autorate == nil {
			p.Autorate = map[string]*AutorateStat{}
		}
		st := &AutorateStat{Rate: mean(a.Rate)}
		if end := min(hi, len(a.Rate)) - 1; end >= 0 {
			st.End = a.Rate[end]
			// Not the rate at the phase's first instant: the controller
			// still answers the phase before it there (the queue left
			// when flows stop is read as bloat and cuts the rate 4%).
			st.Start = a.Rate[min(lo, end)]
		}
		p.Autorate[a.Device] = st
	}
	p.nflows = len(perFlow)
	for _, pr := range r.Probes {
		p.Probes[pr.Name] = Summarize(window(pr.Samples, from+min(settle, (to-from)/2), to))
	}
	var hosts []float64
	for _, h := range p.Hosts {
		hosts = append(hosts, h)
	}
	p.HostsFairness, p.FlowsFairness = zeroNaN(Jain(hosts)), zeroNaN(Jain(perFlow))
	return p
}

// zeroNaN keeps JSON encodable: no flows, no fairness (0).
func zeroNaN(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return x
}

func active(xs []float64, lo, hi int) bool {
	for i := lo; i < hi && i < len(xs); i++ {
		if xs[i] > 0 {
			return true
		}
	}
	return false
}
