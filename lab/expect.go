package lab

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sluice/units"
)

// Expectation is one line of a scenario's expect section:
//
//	[VARIANT[/PHASE]:] SUBJECT METRIC OP VALUE
//
// SUBJECT is `probe NAME`, `class NAME`, `flow NAME`, `hosts`, `flows`,
// `link`, `policers` (the router's BPF policers, summed) or `autorate
// DEVICE` (the agent's rate: auto controller: metric rate, the rate at
// the phase's end, against a rate, a multiple of its end in another
// phase, 1.05x fade, or of its own where the phase's steady part starts, 1.05x start).
// METRIC is a
// latency statistic (p50 p90 p95 p99 avg max, for probes and classes;
// "latency" may follow it), loss, goodput, share (a class's or flow's
// part of the phase's whole goodput), retransmits, rtt (a TCP flow's
// smoothed round-trip time, averaged over the phase), drops, fairness
// (Jain's index) or red (the share of bytes policers coloured red).
// VALUE is a duration
// (5ms) or a multiple of the same latency in another phase (1.2x idle), a rate (18mbit), a ratio or percentage (0.98, 1%), a share of
// the class's configured rate (0.93 rate, 93% of rate), or for a goodput
// a share of the same subject's goodput in another variant's phase
// (0.95 of limit/alone): a reference measured on the same machine in
// the same run, which a slow or emulated machine cannot fail alone;
// or a share of the modem's line rate in the phase in one direction
// (0.85 of modem up), less what a class on the router carried
// (0.85 of modem up less class wan/interactive): what a variable link
// carried. An autorate controller's ramp is how long into the phase
// its rate took to reach 90% of the modem's line in its direction.
//
// A trailing `after DUR` reads the phase from DUR past its start
// instead of past the scenario's settle time.
type Expectation struct {
	Text    string
	Variant string
	Phase   string
	Subject string // probe class flow hosts flows link
	Name    string
	Metric  string
	Op      string
	Value   float64 // ms, bits/s, or a ratio
	OfRate  bool    // Value is a share of the class's rate
	// Of names another phase: Value is a multiple of the same
	// subject's metric there ("p50 < 1.2x idle").
	Of string
	// OfVariant and OfPhase name another variant's phase: Value is a
	// share of the same subject's goodput there ("0.95 of limit/alone").
	OfVariant, OfPhase string
	// OfModem names a direction of the modem ("up", "down"): Value is a
	// share of its line rate in the phase ("0.85 of modem down"), less
	// what the class LessClass carried there, where named.
	OfModem, LessClass string
	// After, where HasAfter, is how far into the phase (seconds) its
	// statistics start, in place of the scenario's settle time: 0 (`after
	// 0s`) judges the whole phase, its start included (a tail is judged
	// where users notice it: when a load begins).
	After    float64
	HasAfter bool
}

// rampShare is the share of the modem's line an autorate controller's
// ramp reaches.
const rampShare = 0.9

// after is a trailing "after DUR".
var after = regexp.MustCompile(`\s+after\s+(\S+)\s*$`)

// ofModem is a goodput relative to the modem's rate in a direction.
var ofModem = regexp.MustCompile(`^([0-9.]+%?)\s+of\s+modem\s+(up|down)(?:\s+less\s+class\s+(\S+))?$`)

// ofVariant is a goodput relative to another variant's phase.
var ofVariant = regexp.MustCompile(`^([0-9.]+%?)\s+of\s+([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$`)

// relative is a latency relative to another phase: 1.2x idle.
var relative = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)x\s+(\S+)$`)

var latencyMetrics = map[string]float64{"p50": 50, "p90": 90, "p95": 95, "p99": 99, "avg": -1, "max": 100}

func parseExpectation(s string) (*Expectation, error) {
	e := &Expectation{Text: s}
	rest := s
	if i := strings.Index(s, ":"); i >= 0 {
		scope := strings.TrimSpace(s[:i])
		rest = s[i+1:]
		e.Variant, e.Phase, _ = strings.Cut(scope, "/")
	}
	if m := after.FindStringSubmatchIndex(rest); m != nil {
		d, err := time.ParseDuration(rest[m[2]:m[3]])
		if err != nil || d < 0 {
			return nil, fmt.Errorf("after %q: want a duration like 5s, or 0s for the whole phase", rest[m[2]:m[3]])
		}
		e.After, e.HasAfter, rest = d.Seconds(), true, rest[:m[0]]
	}
	f := strings.Fields(rest)
	if len(f) < 4 {
		return nil, fmt.Errorf("want [VARIANT[/PHASE]:] SUBJECT METRIC OP VALUE")
	}
	e.Subject = f[0]
	f = f[1:]
	switch e.Subject {
	case "probe", "class", "flow":
		e.Name, f = f[0], f[1:]
	case "autorate":
		e.Name, f = f[0], f[1:]
	case "hosts", "flows", "link", "policers":
	default:
		return nil, fmt.Errorf("subject %q: want probe NAME, class NAME, flow NAME, hosts, flows, link, policers or autorate DEVICE", e.Subject)
	}
	if len(f) < 3 {
		return nil, fmt.Errorf("want METRIC OP VALUE after %s", e.Subject)
	}
	e.Metric, f = f[0], f[1:]
	if f[0] == "latency" {
		f = f[1:]
	}
	e.Op = f[0]
	switch e.Op {
	case "<", "<=", ">", ">=":
	default:
		return nil, fmt.Errorf("operator %q: want < <= > >=", e.Op)
	}
	val := strings.Join(f[1:], " ")
	_, isLatency := latencyMetrics[e.Metric]
	switch {
	case isLatency:
		if e.Subject != "probe" && e.Subject != "class" {
			return nil, fmt.Errorf("%s has no latency; probes and classes do", e.Subject)
		}
		if m := relative.FindStringSubmatch(val); m != nil {
			e.Value, _ = strconv.ParseFloat(m[1], 64)
			e.Of = m[2]
			if e.Of == e.Phase {
				return nil, fmt.Errorf("latency %q: compare with another phase than the expectation's own", val)
			}
			return e, nil
		}
		d, err := time.ParseDuration(val)
		if err != nil {
			return nil, fmt.Errorf("latency %q: want a duration like 5ms, or a multiple of another phase's like 1.2x idle", val)
		}
		e.Value = float64(d) / 1e6
	case e.Metric == "rtt":
		if e.Subject != "flow" {
			return nil, fmt.Errorf("rtt is a flow's (TCP's smoothed round-trip time); probes and classes have p50, p95, ...")
		}
		d, err := time.ParseDuration(val)
		if err != nil {
			return nil, fmt.Errorf("rtt %q: want a duration like 150ms", val)
		}
		e.Value = float64(d) / 1e6
	case e.Metric == "rate":
		if e.Subject != "autorate" {
			return nil, fmt.Errorf("rate is an autorate controller's (autorate DEVICE rate >= 18mbit); a class's is goodput")
		}
		if m := relative.FindStringSubmatch(val); m != nil {
			e.Value, _ = strconv.ParseFloat(m[1], 64)
			e.Of = m[2]
			if e.Of == e.Phase {
				return nil, fmt.Errorf("rate %q: compare with another phase than the expectation's own", val)
			}
			return e, nil
		}
		bps, err := parseRate(val)
		if err != nil {
			return nil, fmt.Errorf("rate %q: %v", val, err)
		}
		e.Value = bps.BitsFloat()
	case e.Metric == "ramp":
		if e.Subject != "autorate" {
			return nil, fmt.Errorf("ramp is an autorate controller's (autorate DEVICE ramp < 5s)")
		}
		d, err := time.ParseDuration(val)
		if err != nil {
			return nil, fmt.Errorf("ramp %q: want a duration like 5s", val)
		}
		e.Value = d.Seconds()
	case e.Subject == "autorate":
		return nil, fmt.Errorf("metric %q: an autorate controller has rate and ramp", e.Metric)
	case e.Metric == "red":
		if e.Subject != "policers" {
			return nil, fmt.Errorf("only policers have a red share")
		}
		v, err := ratio(val)
		if err != nil {
			return nil, err
		}
		e.Value = v
	case e.Metric == "share":
		if e.Subject != "class" && e.Subject != "flow" {
			return nil, fmt.Errorf("share is a class's or a flow's part of the phase's whole goodput")
		}
		v, err := ratio(val)
		if err != nil {
			return nil, err
		}
		e.Value = v
	case e.Metric == "loss" || e.Metric == "retransmits" || e.Metric == "fairness":
		v, err := ratio(val)
		if err != nil {
			return nil, err
		}
		e.Value = v
	case e.Metric == "goodput":
		if m := ofModem.FindStringSubmatch(val); m != nil {
			v, err := ratio(m[1])
			if err != nil {
				return nil, err
			}
			e.Value, e.OfModem, e.LessClass = v, m[2], m[3]
			return e, nil
		}
		if m := ofVariant.FindStringSubmatch(val); m != nil {
			v, err := ratio(m[1])
			if err != nil {
				return nil, err
			}
			e.Value, e.OfVariant, e.OfPhase = v, m[2], m[3]
			return e, nil
		}
		for _, suffix := range []string{" of its rate", " of rate", " rate"} {
			if strings.HasSuffix(val, suffix) {
				v, err := ratio(strings.TrimSuffix(val, suffix))
				if err != nil {
					return nil, err
				}
				if e.Subject != "class" {
					return nil, fmt.Errorf("only a class has a rate to compare with")
				}
				e.Value, e.OfRate = v, true
				return e, nil
			}
		}
		bps, err := parseRate(val)
		if err != nil {
			return nil, fmt.Errorf("goodput %q: %v", val, err)
		}
		e.Value = bps.BitsFloat()
	case e.Metric == "drops":
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, fmt.Errorf("drops %q: want a number", val)
		}
		e.Value = v
	default:
		return nil, fmt.Errorf("metric %q: want p50 p90 p95 p99 avg max loss goodput share retransmits rtt drops fairness red rate ramp", e.Metric)
	}
	return e, nil
}

func ratio(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if strings.HasSuffix(s, "%") {
		v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
		return v / 100, err
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want a ratio (0.98) or a percentage (98%%)", s)
	}
	return v, nil
}

// Verdict is an expectation checked against one variant's result.
type Verdict struct {
	Expect  string  `json:"expect"`
	Variant string  `json:"variant"`
	Actual  float64 `json:"actual"`
	// Shown is Actual in Want's unit ("36.13 Mbit/s", "18.43ms").
	Shown string `json:"actual_text,omitempty"`
	Want  string `json:"want"`
	Pass  bool   `json:"pass"`
	Note  string `json:"note,omitempty"`
	// Skipped: the variant did not run on this kernel (a qdisc it needs
	// is missing), so the expectation was not checked; not a failure.
	Skipped bool `json:"skipped,omitempty"`
}

// Check evaluates e on r; ref is the result of the variant e compares
// with (OfVariant), nil otherwise.
func (e *Expectation) Check(r *Result, ref *Result) Verdict {
	v := Verdict{Expect: e.Text, Variant: r.Variant}
	ph := r.phase(e.Phase)
	if ph == nil {
		v.Note = fmt.Sprintf("no phase %q", e.Phase)
		return v
	}
	if e.HasAfter {
		if e.After >= ph.End-ph.Start {
			v.Note = fmt.Sprintf("after %gs: the phase lasts %gs", e.After, ph.End-ph.Start)
			return v
		}
		modem := ph.Modem
		ph = r.summarize(ph.Name, ph.Start, ph.End, e.After)
		ph.Modem = modem
	}
	want := e.Value
	unit := ""
	switch e.Subject {
	case "probe", "class":
		if _, lat := latencyMetrics[e.Metric]; lat || e.Metric == "loss" {
			st, ok := r.latency(ph, e.Subject, e.Name)
			if !ok {
				v.Note = "no probe samples for " + e.Subject + " " + e.Name
				return v
			}
			if e.Metric == "loss" {
				v.Actual = st.Loss
			} else {
				if st.N == 0 {
					// Every request lost: no latency to judge, never a
					// pass at 0 ms.
					v.Note = fmt.Sprintf("no replies for %s %s (%d requests, all lost)", e.Subject, e.Name, st.Lost)
					return v
				}
				v.Actual, unit = st.pick(e.Metric), "ms"
			}
			if e.Of != "" {
				base := r.phase(e.Of)
				if base == nil {
					v.Note = fmt.Sprintf("no phase %q to compare with", e.Of)
					return v
				}
				bst, ok := r.latency(base, e.Subject, e.Name)
				if !ok || e.Metric != "loss" && bst.N == 0 {
					v.Note = fmt.Sprintf("no samples for %s %s in phase %s", e.Subject, e.Name, e.Of)
					return v
				}
				want = e.Value * bst.pick(e.Metric)
			}
			break
		}
		if e.Metric == "drops" {
			v.Actual = float64(ph.ClassDrops(e.Name))
			break
		}
		v.Actual = ph.classGoodput(e.Name)
		unit = "bit/s"
		if e.Metric == "share" {
			v.Actual, unit = shareOf(v.Actual, ph.Total), ""
			break
		}
		if e.OfRate {
			rate := r.classRate(e.Name)
			if rate == 0 {
				v.Note = "class " + e.Name + " has no configured rate in this variant"
				return v
			}
			v.Actual /= rate
			unit = "of its rate"
		}
	case "flow":
		fs, ok := ph.Flows[e.Name]
		if !ok {
			v.Note = "no flow " + e.Name
			return v
		}
		switch e.Metric {
		case "goodput":
			v.Actual, unit = fs.Goodput, "bit/s"
		case "share":
			v.Actual = shareOf(fs.Goodput, ph.Total)
		case "retransmits":
			v.Actual = fs.RetransRatio
		case "rtt":
			if fs.RTT == 0 {
				v.Note = "no RTT samples for flow " + e.Name + " (TCP only)"
				return v
			}
			v.Actual, unit = fs.RTT, "ms"
		}
	case "hosts":
		v.Actual = ph.HostsFairness
		if e.Metric == "goodput" {
			v.Actual, unit = ph.Total, "bit/s"
		}
	case "flows":
		v.Actual = ph.FlowsFairness
	case "link":
		v.Actual, unit = ph.Total, "bit/s"
	case "autorate":
		st, ok := ph.Autorate[e.Name]
		if !ok {
			v.Note = "no autorate controller on " + e.Name + " in this variant"
			return v
		}
		if e.Metric == "ramp" {
			took, note := r.ramp(ph, e.Name)
			if note != "" {
				// No controller, no line, or a rate that never got
				// there (took: the phase's length): no pass.
				v.Actual, v.Shown, v.Note = took, formatValue(took, "s"), note
				v.Want = fmt.Sprintf("%s %s", e.Op, formatValue(want, "s"))
				return v
			}
			v.Actual, unit = took, "s"
			break
		}
		v.Actual, unit = st.End, "bit/s"
		switch {
		case e.Of == "start":
			want = e.Value * st.Start
		case e.Of != "":
			base := r.phase(e.Of)
			if base == nil || base.Autorate[e.Name] == nil {
				v.Note = fmt.Sprintf("no autorate controller on %s in phase %q to compare with", e.Name, e.Of)
				return v
			}
			want = e.Value * base.Autorate[e.Name].End
		}
	case "policers":
		n, red := ph.policed()
		if n == 0 {
			v.Note = "no policer metered a packet in this variant"
			return v
		}
		v.Actual = ratioOf(red, n)
	}
	if e.OfModem != "" {
		line := ph.Modem[e.OfModem]
		if line == 0 {
			v.Note = "the modem has no " + e.OfModem + " rate in this phase"
			return v
		}
		if e.LessClass != "" {
			carried, ok := ph.classCarried(e.LessClass)
			if !ok {
				v.Note = "no class " + e.LessClass + " on the router"
				return v
			}
			line -= carried
		}
		want = e.Value * line
	}
	if e.OfVariant != "" {
		base, note := e.reference(ref)
		if note != "" {
			v.Note = note
			return v
		}
		want = e.Value * base
	}
	switch e.Op {
	case "<":
		v.Pass = v.Actual < want
	case "<=":
		v.Pass = v.Actual <= want
	case ">":
		v.Pass = v.Actual > want
	case ">=":
		v.Pass = v.Actual >= want
	}
	if math.IsNaN(v.Actual) {
		v.Pass = false
	}
	v.Want = fmt.Sprintf("%s %s", e.Op, formatValue(want, unit))
	v.Shown = formatValue(v.Actual, unit)
	return v
}

// reference is the goodput e compares with in ref, or a note saying
// why there is none.
func (e *Expectation) reference(ref *Result) (float64, string) {
	if ref == nil || ref.Skipped != "" {
		return 0, fmt.Sprintf("no result of variant %q to compare with", e.OfVariant)
	}
	ph := ref.phase(e.OfPhase)
	if ph == nil {
		return 0, fmt.Sprintf("variant %s has no phase %q", e.OfVariant, e.OfPhase)
	}
	switch e.Subject {
	case "class":
		return ph.classGoodput(e.Name), ""
	case "flow":
		if fs, ok := ph.Flows[e.Name]; ok {
			return fs.Goodput, ""
		}
		return 0, fmt.Sprintf("variant %s has no flow %s", e.OfVariant, e.Name)
	case "hosts", "link":
		return ph.Total, ""
	}
	return 0, fmt.Sprintf("%s has no goodput to compare", e.Subject)
}

func formatValue(v float64, unit string) string {
	switch unit {
	case "ms":
		return fmt.Sprintf("%.2fms", v)
	case "bit/s":
		return units.Bits(v)
	case "s":
		return fmt.Sprintf("%.1fs", v)
	}
	return fmt.Sprintf("%.4f", v)
}

// shareOf is part/whole, 0 for an empty whole.
func shareOf(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return part / whole
}

// ramp is how long (seconds) into phase ph the autorate controller on
// device took to reach rampShare of the modem's line in its direction;
// the phase's length, with a note, where it never did.
func (r *Result) ramp(ph *PhaseResult, device string) (float64, string) {
	for _, a := range r.Autorate {
		if a.Device != device {
			continue
		}
		dir := a.ModemDir()
		line := ph.Modem[dir]
		if line == 0 {
			return 0, "the modem has no " + dir + " rate in this phase"
		}
		for i := r.bucketAt(ph.Start); i < r.bucketAt(ph.End) && i < len(a.Rate); i++ {
			if a.Rate[i] >= rampShare*line {
				return max(r.bucketEnd(i)-ph.Start, 0), ""
			}
		}
		return ph.End - ph.Start, fmt.Sprintf("never reached %g%% of the line", rampShare*100)
	}
	return 0, "no autorate controller on " + device + " in this variant"
}

// classCarried is what the class called name (device/name) carried in
// the phase by the router's counters, bits per second; ok false where
// no class matches.
func (p *PhaseResult) classCarried(name string) (float64, bool) {
	var s float64
	ok := false
	for key, cs := range p.Classes {
		if classMatches(key, name) {
			s, ok = s+cs.Bps, true
		}
	}
	return s, ok
}
