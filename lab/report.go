package lab

import (
	"encoding/json"
	"fmt"
	"html/template"
	"image/color"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"sluice/chart"

	"sluice/units"
)

// Report is a scenario's results, ready to print or save.
type Report struct {
	Scenario    string    `json:"scenario"`
	Description string    `json:"description,omitempty"`
	Article     string    `json:"article,omitempty"`
	Taken       time.Time `json:"taken"`
	Kernel      string    `json:"kernel,omitempty"`
	Results     []*Result `json:"results"`
	Verdicts    []Verdict `json:"verdicts"`
	Passed      bool      `json:"passed"`
}

// NewReport gathers results and checks the scenario's expectations.
func NewReport(s *Scenario, results []*Result, kernel string) *Report {
	r := &Report{Scenario: s.Name, Description: strings.TrimSpace(s.Description), Article: strings.TrimSpace(s.Article),
		Taken: time.Now().UTC(), Kernel: kernel, Results: results}
	r.Verdicts = Check(s, results)
	r.Passed = true
	for _, v := range r.Verdicts {
		r.Passed = r.Passed && v.Pass
	}
	return r
}

// WriteJSON writes the report with every series.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(r)
}

func ms(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

// row is one line of the comparison table: a metric, one value per variant.
type row struct {
	Phase, Metric string
	Values        []string
}

// comparison lays the variants side by side, phase by phase.
func (r *Report) comparison() ([]string, []row) {
	var heads []string
	var ran []*Result
	for _, res := range r.Results {
		if res.Skipped == "" {
			heads = append(heads, res.Variant)
			ran = append(ran, res)
		}
	}
	if len(ran) == 0 {
		return heads, nil
	}
	var rows []row
	for pi, ph := range ran[0].Phases {
		add := func(metric string, f func(p *PhaseResult) (string, bool)) {
			rw := row{Phase: ph.Name, Metric: metric}
			any := false
			for _, res := range ran {
				if pi >= len(res.Phases) {
					rw.Values = append(rw.Values, "")
					continue
				}
				v, ok := f(res.Phases[pi])
				any = any || ok
				rw.Values = append(rw.Values, v)
			}
			if any {
				rows = append(rows, rw)
			}
		}
		var probes []string
		for _, p := range ran[0].Probes {
			if !contains(probes, p.Name) {
				probes = append(probes, p.Name)
			}
		}
		for _, name := range probes {
			add(name+" p50 / p95", func(p *PhaseResult) (string, bool) {
				l := p.Probes[name]
				if l == nil || l.N == 0 {
					return "-", false
				}
				s := ms(l.P50) + " / " + ms(l.P95)
				if l.Loss > 0 {
					s += fmt.Sprintf(" (%.0f%% lost)", 100*l.Loss)
				}
				return s, true
			})
		}
		for _, name := range probes {
			add(name+" responsiveness", func(p *PhaseResult) (string, bool) {
				l := p.Probes[name]
				if l == nil || l.Responsiveness == nil {
					return "-", false
				}
				return l.Responsiveness.String(), true
			})
		}
		items := map[string]bool{}
		var order []string
		for _, f := range ran[0].Flows {
			if !items[f.Item] {
				items[f.Item] = true
				order = append(order, f.Item)
			}
		}
		for _, it := range order {
			add(it+" goodput", func(p *PhaseResult) (string, bool) {
				fs := p.Flows[it]
				if fs == nil || fs.Goodput == 0 {
					return "-", false
				}
				s := units.Bits(fs.Goodput)
				if fs.RetransRatio > 0.0005 {
					s += fmt.Sprintf(", %.1f%% retransmitted", 100*fs.RetransRatio)
				}
				return s, true
			})
		}
		for _, it := range order {
			add(it+" RTT", func(p *PhaseResult) (string, bool) {
				fs := p.Flows[it]
				if fs == nil || fs.RTT == 0 {
					return "-", false
				}
				return ms(fs.RTT) + " (TCP's smoothed)", true
			})
		}
		// Each class's round trips from its own TCP packets (the lab turns
		// rtt on for every shaped interface), the passive figure beside
		// the probes.
		var rttClasses []string
		for _, res := range ran {
			if pi >= len(res.Phases) {
				continue
			}
			for k, cs := range res.Phases[pi].Classes {
				if cs.RTT != nil && cs.RTT.Samples > 0 && !contains(rttClasses, k) {
					rttClasses = append(rttClasses, k)
				}
			}
		}
		sort.Strings(rttClasses)
		for _, k := range rttClasses {
			add(k+" round trip p50 / p95", func(p *PhaseResult) (string, bool) {
				cs := p.Classes[k]
				if cs == nil || cs.RTT == nil || cs.RTT.Samples == 0 {
					return "-", false
				}
				if cs.RTT.Samples < 10 {
					return fmt.Sprintf("%d samples (too few)", cs.RTT.Samples), true
				}
				return fmt.Sprintf("%s / %s (passive, %d samples; mean %s: queue %s, path %s)", ms(cs.RTT.P50), ms(cs.RTT.P95), cs.RTT.Samples,
					ms(cs.RTT.Mean), ms(cs.RTT.Queue), ms(cs.RTT.Path)), true
			})
		}
		add("flows fairness", func(p *PhaseResult) (string, bool) {
			if p.nflows < 2 || len(p.Hosts) > 1 {
				return "-", false
			}
			return fmt.Sprintf("%.3f (Jain, %d flows)", p.FlowsFairness, p.nflows), true
		})
		add("policed red", func(p *PhaseResult) (string, bool) {
			if len(p.Policers) == 0 {
				return "-", false
			}
			n, red := p.policed()
			return fmt.Sprintf("%.1f%% of %s", 100*ratioOf(red, n), units.Size(n)), true
		})
		add("hosts fairness", func(p *PhaseResult) (string, bool) {
			if len(p.Hosts) < 2 {
				return "-", false
			}
			return fmt.Sprintf("%.3f (Jain, %d hosts)", p.HostsFairness, len(p.Hosts)), true
		})
	}
	return heads, rows
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// matrix lays out a matrix scenario one variant per row: its matrix
// values, then each traffic item's goodput and retransmit share and each
// probe's median over the whole run.
func (r *Report) matrix() ([]string, [][]string) {
	if len(r.Results) == 0 || r.Results[0].Matrix == nil {
		return nil, nil
	}
	var keys []string
	for k := range r.Results[0].Matrix {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	heads := append([]string{}, keys...)
	var items, probes []string
	for _, res := range r.Results {
		for _, f := range res.Flows {
			if !contains(items, f.Item) {
				items = append(items, f.Item)
			}
		}
		for _, p := range res.Probes {
			if !contains(probes, p.Name) {
				probes = append(probes, p.Name)
			}
		}
	}
	for _, it := range items {
		heads = append(heads, it+" goodput", it+" retransmitted")
	}
	for _, p := range probes {
		heads = append(heads, p+" p50")
	}
	var rows [][]string
	for _, res := range r.Results {
		var row []string
		for _, k := range keys {
			row = append(row, res.Matrix[k])
		}
		if res.Skipped != "" {
			rows = append(rows, append(row, "skipped: "+res.Skipped))
			continue
		}
		ph := res.whole()
		for _, it := range items {
			if fs := ph.Flows[it]; fs != nil {
				row = append(row, units.Bits(fs.Goodput), fmt.Sprintf("%.1f%%", 100*fs.RetransRatio))
			} else {
				row = append(row, "-", "-")
			}
		}
		for _, p := range probes {
			if l := ph.Probes[p]; l != nil && l.N > 0 {
				row = append(row, ms(l.P50))
			} else {
				row = append(row, "-")
			}
		}
		rows = append(rows, row)
	}
	return heads, rows
}

// WriteText prints the comparison table, skipped variants and verdicts.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "scenario %s\n", r.Scenario)
	if mh, mr := r.matrix(); mh != nil {
		tw := tabwriter.NewWriter(w, 2, 4, 3, ' ', 0)
		fmt.Fprintln(tw, strings.ToUpper(strings.Join(mh, "\t")))
		for _, row := range mr {
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		tw.Flush()
		r.writeVerdicts(w)
		return
	}
	heads, rows := r.comparison()
	tw := tabwriter.NewWriter(w, 2, 4, 3, ' ', 0)
	fmt.Fprintf(tw, "PHASE\tMETRIC\t%s\n", strings.ToUpper(strings.Join(heads, "\t")))
	last := ""
	for _, rw := range rows {
		phase := rw.Phase
		if phase == last {
			phase = ""
		}
		last = rw.Phase
		fmt.Fprintf(tw, "%s\t%s\t%s\n", phase, rw.Metric, strings.Join(rw.Values, "\t"))
	}
	tw.Flush()
	for _, res := range r.Results {
		if res.Skipped != "" {
			fmt.Fprintf(w, "skipped %s: %s\n", res.Variant, res.Skipped)
		}
	}
	r.writeVerdicts(w)
}

func (r *Report) writeVerdicts(w io.Writer) {
	if len(r.Verdicts) > 0 {
		fmt.Fprintln(w)
		for _, v := range r.Verdicts {
			mark := "PASS"
			switch {
			case v.Skipped:
				mark = "SKIP"
			case !v.Pass:
				mark = "FAIL"
			}
			actual := v.Shown
			if actual == "" {
				actual = fmt.Sprintf("%.4g", v.Actual)
			}
			detail := fmt.Sprintf("actual %s, want %s", actual, v.Want)
			if v.Note != "" {
				detail = v.Note
			}
			fmt.Fprintf(w, "%s  %s  (%s)\n", mark, v.Expect, detail)
		}
	}
}

// --- HTML -------------------------------------------------------------------

type figure struct {
	Title string
	SVG   template.HTML
	// Keys is the figure's legend, drawn under it in the page (a legend
	// inside the plot hides the data it sits on).
	Keys []legendKey
}

// legendKey is one line of a legend: a sample of the line's colour,
// width and dashes, and its name.
type legendKey struct {
	Name, Color, Dash string
	Width             float64
}

// key describes a line for the legend under its chart.
func key(name string, c color.Color, width float64, dashes []float64) legendKey {
	k := legendKey{Name: name, Color: chart.Hex(c), Width: width}
	var d []string
	for _, l := range dashes {
		d = append(d, fmt.Sprintf("%g", l))
	}
	k.Dash = strings.Join(d, ",")
	return k
}

type variantView struct {
	Name, Note, Skipped, Policy string
	Charts                      []figure
}

// scales are the axes every variant's charts share, so that before and
// after read at a glance: one time axis, one rate axis, one latency
// axis for the whole report.
type scales struct {
	duration       float64 // s
	rateMax        float64 // Mbit/s
	rttMin, rttMax float64 // ms
}

// sharedScales finds the scales that hold every variant's data.
func sharedScales(results []*Result) scales {
	sc := scales{rttMin: math.Inf(1)}
	top := func(xs []float64) {
		for _, v := range xs {
			sc.rateMax = math.Max(sc.rateMax, v/1e6)
		}
	}
	for _, r := range results {
		if r.Skipped != "" {
			continue
		}
		sc.duration = math.Max(sc.duration, r.Duration)
		for _, c := range r.Classes {
			top(c.Bps)
			sc.rateMax = math.Max(sc.rateMax, c.Rate/1e6)
			if sh := c.Sharing; sh != nil {
				top(sh.Limit)
				top(sh.Share)
				top(sh.Demand)
			}
		}
		for _, it := range flowItems(r) {
			top(it.bps)
		}
		for _, a := range r.Autorate {
			top(a.Rate)
			top(a.Passed)
		}
		for _, ph := range r.Phases {
			for _, c := range ph.Modem {
				sc.rateMax = math.Max(sc.rateMax, c/1e6)
			}
		}
		for _, pr := range r.Probes {
			for _, s := range pr.Samples {
				if !s.Lost {
					v := math.Max(s.RTT, 0.001)
					sc.rttMin, sc.rttMax = math.Min(sc.rttMin, v), math.Max(sc.rttMax, v)
				}
			}
		}
	}
	if sc.rateMax == 0 {
		sc.rateMax = 1
	}
	if math.IsInf(sc.rttMin, 1) {
		sc.rttMin, sc.rttMax = 0.01, 1
	}
	// Whole decades: the log axis's labels fall on its ends.
	sc.rttMin = math.Pow10(int(math.Floor(math.Log10(sc.rttMin))))
	sc.rttMax = math.Pow10(int(math.Ceil(math.Log10(sc.rttMax))))
	if sc.rttMax <= sc.rttMin {
		sc.rttMax = sc.rttMin * 10
	}
	return sc
}

// WriteHTML writes a self-contained page: the comparison table, the
// expectations, the latency of every variant on one chart, and per
// variant its charts (inline SVG, package chart), all on shared axes.
func (r *Report) WriteHTML(w io.Writer) error {
	heads, rows := r.comparison()
	sc := sharedScales(r.Results)
	var views []variantView
	nCharts := 0
	for _, res := range r.Results {
		v := variantView{Name: res.Variant, Note: res.Note, Skipped: res.Skipped, Policy: res.Policy}
		if res.Skipped == "" {
			for _, c := range []func(*Result, scales) (figure, bool){classChart, sharingChart, autorateChart, autorateDelayChart, latencyChart, hostsChart, flowChart} {
				ch, ok := c(res, sc)
				if ok {
					v.Charts = append(v.Charts, ch)
					nCharts++
				}
			}
		}
		views = append(views, v)
	}
	var compare []figure
	if ch, ok := latencyCompareChart(r.Results, sc); ok {
		compare = append(compare, ch)
		nCharts++
	}
	mh, mr := r.matrix()
	return page.Execute(w, map[string]any{
		"R": r, "Heads": heads, "Rows": rows, "Variants": views, "NCharts": nCharts, "MHeads": mh, "MRows": mr, "Compare": compare,
	})
}

// Chart sizes, in inches: the page is 10.4 in (1000 px) wide and the
// charts fill it.
const (
	chartW = 10.4
	chartH = 3.4
)

// svg draws p at wIn x hIn inches, inline in a report page.
func svg(p *chart.Plot, wIn, hIn float64) template.HTML {
	return template.HTML(p.SVG(wIn, hIn))
}

// timePlot is a plot of rates over the run's seconds on the shared axes,
// its phases shaded and named along the top.
func timePlot(title string, r *Result, sc scales) *chart.Plot {
	p := chart.New(title)
	p.X.Label = "seconds"
	p.Y.Label = "Mbit/s"
	p.X.Min, p.X.Max = 0, sc.duration
	p.Y.Min, p.Y.Max = 0, sc.rateMax*1.18
	phaseBands(p, r, sc.rateMax*1.06)
	return p
}

// settleTint marks a phase's first seconds, which its figures leave out
// (PhaseResult.From): where a load starts or a rate changes, and tails
// live.
var settleTint = color.RGBA{R: 255, G: 232, B: 204, A: 255}

// phaseBands shades every other phase, tints each phase's settle, and
// writes each phase's name at its start, at height y.
func phaseBands(p *chart.Plot, r *Result, y float64) {
	var labels []chart.Item
	for i, ph := range r.Phases {
		if i%2 == 1 {
			p.Add(chart.Band{From: ph.Start, To: ph.End, Color: color.Gray{Y: 242}})
		}
		if ph.From > ph.Start {
			p.Add(chart.Band{From: ph.Start, To: min(ph.From, ph.End), Color: settleTint})
		}
		labels = append(labels, chart.Label{X: ph.Start + 0.15, Y: y, Text: ph.Name, Color: color.Gray{Y: 90}})
	}
	p.Add(labels...)
}

// Dashes, in points.
var (
	dashed = []float64{4, 3}
	dotted = []float64{1, 2}
)

// line adds xs (bits/s per bucket) to p as a line and returns its key.
func line(p *chart.Plot, name string, xs []float64, bucket float64, c color.Color, width float64, dashes []float64) (legendKey, bool) {
	if len(xs) == 0 {
		return legendKey{}, false
	}
	p.Add(chart.Line{Points: mbitSeries(xs, bucket), Color: c, Width: width, Dashes: dashes})
	return key(name, c, width, dashes), true
}

// classChart: goodput per class over time, with each class's configured
// rate dashed in the same colour.
func classChart(r *Result, sc scales) (figure, bool) {
	var show []*ClassSeries
	leaves := 0
	for _, c := range r.Classes {
		if c.Leaf {
			leaves++
		}
	}
	for _, c := range r.Classes {
		if leaves <= 8 && c.Leaf || leaves > 8 && c.Depth == 1 {
			show = append(show, c)
		}
	}
	if len(show) == 0 {
		return figure{}, false
	}
	p := timePlot("Rate per class (router counters) against its configured rate (dashed)", r, sc)
	var keys []legendKey
	for i, c := range show {
		if k, ok := line(p, c.Key(), c.Bps, r.Bucket, chart.Color(i), 1.5, nil); ok {
			keys = append(keys, k)
		}
		p.Add(chart.Line{Points: []chart.XY{{X: 0, Y: c.Rate / 1e6}, {X: r.Duration, Y: c.Rate / 1e6}}, Color: chart.Color(i), Width: 1, Dashes: dashed})
	}
	return figure{Title: "Rates per class", SVG: svg(p, chartW, chartH), Keys: keys}, true
}

// sharingChart: for classes under a sharing controller, the rate each
// sent (solid), the limit in force (thin), its share (dashed) and the
// demand the controller counted (dotted), per tenant in one colour.
func sharingChart(r *Result, sc scales) (figure, bool) {
	p := timePlot("Sharing controller: rate, limit, share and demand per class", r, sc)
	var keys []legendKey
	n := 0
	for _, c := range r.Classes {
		sh := c.Sharing
		if sh == nil {
			continue
		}
		col := chart.Color(n)
		n++
		for _, v := range []struct {
			what   string
			xs     []float64
			width  float64
			dashes []float64
		}{
			{"rate", c.Bps, 1.5, nil},
			{"limit", sh.Limit, 0.8, nil},
			{"share", sh.Share, 1, []float64{5, 3}},
			{"demand", sh.Demand, 1, dotted},
		} {
			if k, ok := line(p, c.Name+" "+v.what, v.xs, r.Bucket, col, v.width, v.dashes); ok {
				keys = append(keys, k)
			}
		}
	}
	if n == 0 {
		return figure{}, false
	}
	return figure{Title: "Sharing controller", SVG: svg(p, chartW, chartH+0.4), Keys: keys}, true
}

// autorateChart: each rate: auto controller's rate against the modem's
// line rate in its direction (dashed) and what its device passed.
func autorateChart(r *Result, sc scales) (figure, bool) {
	if len(r.Autorate) == 0 {
		return figure{}, false
	}
	p := timePlot("rate: auto: the shaper's rate against the link's capacity (dashed) and what it passed", r, sc)
	var keys []legendKey
	for i, a := range r.Autorate {
		col := chart.Color(i)
		dir := a.ModemDir()
		var capa []chart.XY
		for _, ph := range r.Phases {
			if c := ph.Modem[dir]; c > 0 {
				capa = append(capa, chart.XY{X: ph.Start, Y: c / 1e6}, chart.XY{X: ph.End, Y: c / 1e6})
			}
		}
		if len(capa) > 0 {
			p.Add(chart.Line{Points: capa, Color: col, Width: 1, Dashes: dashed})
			keys = append(keys, key(a.Device+" capacity ("+dir+")", col, 1, dashed))
		}
		if k, ok := line(p, a.Device+" rate", a.Rate, r.Bucket, col, 1.8, nil); ok {
			keys = append(keys, k)
		}
		if k, ok := line(p, a.Device+" passed", a.Passed, r.Bucket, col, 0.7, dotted); ok {
			keys = append(keys, k)
		}
	}
	return figure{Title: "rate: auto", SVG: svg(p, chartW, chartH), Keys: keys}, true
}

// autorateDelayChart: each controller's delay above its reflectors'
// baselines (the queue it reads), in ms.
func autorateDelayChart(r *Result, sc scales) (figure, bool) {
	if len(r.Autorate) == 0 {
		return figure{}, false
	}
	top := 1.0
	for _, a := range r.Autorate {
		for _, d := range a.Delay {
			top = max(top, d)
		}
	}
	p := chart.New("rate: auto: delay above the reflectors' baselines")
	p.X.Label = "seconds"
	p.Y.Label = "ms"
	p.X.Min, p.X.Max = 0, sc.duration
	p.Y.Min, p.Y.Max = 0, top*1.18
	phaseBands(p, r, top*1.06)
	var keys []legendKey
	for i, a := range r.Autorate {
		if len(a.Delay) == 0 {
			continue
		}
		pts := make([]chart.XY, len(a.Delay))
		for j, d := range a.Delay {
			pts[j].X, pts[j].Y = float64(j)*r.Bucket, d
		}
		p.Add(chart.Line{Points: pts, Color: chart.Color(i), Width: 1.2})
		keys = append(keys, key(a.Device+" delay", chart.Color(i), 1.2, nil))
	}
	return figure{Title: "rate: auto's delay", SVG: svg(p, chartW, chartH*0.7), Keys: keys}, true
}

// mbitSeries turns a series of bits/s per bucket into chart points.
func mbitSeries(xs []float64, bucket float64) []chart.XY {
	pts := make([]chart.XY, len(xs))
	for j, v := range xs {
		pts[j].X, pts[j].Y = float64(j)*bucket, v/1e6
	}
	return pts
}

// latencyPlot is an empty distribution of round trips on the shared log
// axis, labelled 0.1, 1, 10, 100 (not 1e-01).
func latencyPlot(title string, sc scales) *chart.Plot {
	p := chart.New(title)
	p.X.Label = "round trip (ms, log scale)"
	p.Y.Label = "share of probes answered"
	p.X.Log = true
	p.X.Min, p.X.Max = sc.rttMin, sc.rttMax
	p.Y.Min, p.Y.Max = 0, 1
	return p
}

// cdf is the distribution of the answered round trips in samples, or
// nil when none was answered.
func cdf(samples []Sample) []chart.XY {
	var rtts []float64
	for _, s := range samples {
		if !s.Lost {
			rtts = append(rtts, math.Max(s.RTT, 0.001))
		}
	}
	if len(rtts) == 0 {
		return nil
	}
	sort.Float64s(rtts)
	pts := make([]chart.XY, len(rtts))
	for i, v := range rtts {
		pts[i].X, pts[i].Y = v, float64(i+1)/float64(len(rtts))
	}
	return pts
}

// latencyChart: the distribution of each probe's round trips, idle (the
// first phase) against loaded (the others).
func latencyChart(r *Result, sc scales) (figure, bool) {
	p := latencyPlot("Latency: share of probes answered within x ms, per phase", sc)
	var keys []legendKey
	for _, pr := range r.Probes {
		for pi, ph := range r.Phases {
			pts := cdf(window(pr.Samples, ph.Start, ph.End))
			if pts == nil {
				continue
			}
			l := chart.Line{Points: pts, Color: chart.Color(pi), Width: 1.5}
			if pr.Type != "ping" {
				l.Dashes = []float64{5, 2}
			}
			p.Add(l)
			keys = append(keys, key(pr.Name+" "+ph.Name, l.Color, l.Width, l.Dashes))
		}
	}
	if len(keys) == 0 {
		return figure{}, false
	}
	return figure{Title: "Latency, idle and loaded", SVG: svg(p, chartW, chartH), Keys: keys}, true
}

// latencyCompareChart: each variant's first probe under load (every
// phase but the first, idle one) on one chart, before against after.
func latencyCompareChart(results []*Result, sc scales) (figure, bool) {
	p := latencyPlot("Latency under load: share of probes answered within x ms, per variant", sc)
	var keys []legendKey
	for i, r := range results {
		if r.Skipped != "" || len(r.Probes) == 0 || len(r.Phases) < 2 {
			continue
		}
		pr := r.Probes[0]
		var loaded []Sample
		for _, ph := range r.Phases[1:] {
			loaded = append(loaded, window(pr.Samples, ph.Start, ph.End)...)
		}
		pts := cdf(loaded)
		if pts == nil {
			continue
		}
		l := chart.Line{Points: pts, Color: chart.Color(i), Width: 2}
		p.Add(l)
		keys = append(keys, key(r.Variant+": "+pr.Name+" under load", l.Color, l.Width, nil))
	}
	if len(keys) < 2 {
		return figure{}, false
	}
	return figure{Title: "Latency under load, every variant", SVG: svg(p, chartW, chartH), Keys: keys}, true
}

// hostsChart: goodput per host in each loaded phase.
func hostsChart(r *Result, sc scales) (figure, bool) {
	var phases []*PhaseResult
	hostSet := map[string]bool{}
	for _, ph := range r.Phases {
		if len(ph.Hosts) > 1 {
			phases = append(phases, ph)
		}
		for h := range ph.Hosts {
			hostSet[h] = true
		}
	}
	if len(phases) == 0 {
		return figure{}, false
	}
	var hosts []string
	for h := range hostSet {
		hosts = append(hosts, h)
	}
	sort.Slice(hosts, func(i, j int) bool { return hostLess(hosts[i], hosts[j]) })
	p := chart.New("Goodput per host, per phase")
	p.Y.Label = "Mbit/s"
	const w = 14.0
	var keys []legendKey
	for i, ph := range phases {
		vals := make([]float64, len(hosts))
		for j, h := range hosts {
			vals[j] = ph.Hosts[h] / 1e6
		}
		bars := chart.Bars{Values: vals, Width: w, Offset: w * (float64(i) - float64(len(phases)-1)/2), Color: chart.Color(i)}
		p.Add(bars)
		keys = append(keys, key(fmt.Sprintf("%s (Jain %.3f)", ph.Name, ph.HostsFairness), bars.Color, 8, nil))
	}
	p.Nominal(hosts...)
	return figure{Title: "Goodput per host", SVG: svg(p, chartW, chartH), Keys: keys}, true
}

func hostLess(a, b string) bool {
	var x, y int
	fmt.Sscanf(a, "client%d", &x)
	fmt.Sscanf(b, "client%d", &y)
	if x != y {
		return x < y
	}
	return a < b
}

type flowItem struct {
	name string
	bps  []float64
}

// flowItems sums each traffic item's flows, in the order they come.
func flowItems(r *Result) []flowItem {
	var out []flowItem
	index := map[string]int{}
	for _, f := range r.Flows {
		i, ok := index[f.Item]
		if !ok {
			i = len(out)
			index[f.Item] = i
			out = append(out, flowItem{f.Item, make([]float64, len(f.Goodput))})
		}
		for j, v := range f.Goodput {
			if j < len(out[i].bps) {
				out[i].bps[j] += v
			}
		}
	}
	return out
}

// flowChart: goodput of each traffic item over time (when no class
// chart explains it, e.g. unshaped variants).
func flowChart(r *Result, sc scales) (figure, bool) {
	items := flowItems(r)
	if len(items) == 0 {
		return figure{}, false
	}
	p := timePlot("Goodput per traffic item (receiver side)", r, sc)
	var keys []legendKey
	for i, it := range items {
		if k, ok := line(p, it.name, it.bps, r.Bucket, chart.Color(i), 1.5, nil); ok {
			keys = append(keys, k)
		}
	}
	return figure{Title: "Goodput per traffic item", SVG: svg(p, chartW, chartH), Keys: keys}, true
}

var page = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>sluice lab: {{.R.Scenario}}</title>
<style>
body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f3f3f3}.pass{color:#176a17}.fail{color:#b00;font-weight:bold}
figure{margin:1em 0}figcaption{font-weight:600;margin-bottom:.3em}pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:85%}
.chart>svg{width:100%;height:auto;display:block}
.keys{display:flex;flex-wrap:wrap;gap:.2em 1.2em;font-size:85%;margin:.2em 0 0 3.5em}.keys svg{vertical-align:middle;margin-right:.3em}
</style></head>
<body>
<h1>sluice lab: {{.R.Scenario}}</h1>
<p>{{.R.Description}}</p>
{{if .R.Article}}<p><b>The article:</b> {{.R.Article}}</p>{{end}}
<p>Taken {{.R.Taken.Format "2006-01-02 15:04 UTC"}}{{if .R.Kernel}} on kernel {{.R.Kernel}}{{end}}.
{{if .R.Passed}}<span class="pass">All expectations hold.</span>{{else}}<span class="fail">Some expectations fail.</span>{{end}}</p>
{{if .MHeads}}<h2>Matrix</h2>
<table><tr>{{range .MHeads}}<th>{{.}}</th>{{end}}</tr>
{{range .MRows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}
</table>{{else}}<h2>Side by side</h2>
<table><tr><th>phase</th><th>metric</th>{{range .Heads}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr><td>{{.Phase}}</td><td>{{.Metric}}</td>{{range .Values}}<td>{{.}}</td>{{end}}</tr>{{end}}
</table>{{end}}
<p class="settle">On the charts over time, each phase's first seconds are tinted: the
figures above leave them out (the scenario's settle), and an expectation that ends in
<code>after 0s</code> judges the whole phase, them included.</p>
{{range .Compare}}{{template "chart" .}}{{end}}
{{if .R.Verdicts}}<h2>Expectations</h2><table><tr><th></th><th>expectation</th><th>actual</th><th>want</th></tr>
{{range .R.Verdicts}}<tr><td>{{if .Skipped}}skip{{else if .Pass}}<span class="pass">pass</span>{{else}}<span class="fail">FAIL</span>{{end}}</td><td>{{.Expect}}</td><td>{{if .Shown}}{{.Shown}}{{else}}{{printf "%.4g" .Actual}}{{end}}{{if .Note}} ({{.Note}}){{end}}</td><td>{{.Want}}</td></tr>{{end}}
</table>{{end}}
{{range .Variants}}<h2>{{.Name}}</h2>{{if .Note}}<p>{{.Note}}</p>{{end}}
{{if .Skipped}}<p><i>Skipped: {{.Skipped}}</i></p>{{else}}
{{range .Charts}}{{template "chart" .}}{{end}}
{{if .Policy}}<details><summary>policy</summary><pre>{{.Policy}}</pre></details>{{end}}{{end}}
{{end}}
<script>
// Marks the page once every chart has laid out with a visible size and
// drawn its data (package chart's class "data"), and counts what would make it hard to read: a chart
// narrower than the page, a label outside its chart, a number in
// e-notation on an axis, a chart without its legend. The report's own
// test reads these attributes.
addEventListener("load", function () {
  var ok = 0, narrow = 0, clipped = [], enotation = 0, unkeyed = 0;
  var figs = document.querySelectorAll("figure.chart"), page = document.querySelector("h1").getBoundingClientRect().width;
  figs.forEach(function (f) {
    var s = f.querySelector(":scope > svg"), r = s.getBoundingClientRect();
    if (r.width > 100 && r.height > 100 && s.querySelectorAll(".data").length > 0) ok++;
    if (r.width < 0.95 * page) narrow++;
    s.querySelectorAll("text").forEach(function (t) {
      var b = t.getBoundingClientRect();
      if (b.width && (b.left < r.left - 1 || b.right > r.right + 1 || b.top < r.top - 1 || b.bottom > r.bottom + 1)) clipped.push(t.textContent);
      if (/\de[+-]?\d/.test(t.textContent)) enotation++;
    });
    if (!f.querySelector(".keys span")) unkeyed++;
  });
  var b = document.body;
  b.setAttribute("data-charts", figs.length);
  b.setAttribute("data-rendered", ok);
  b.setAttribute("data-narrow", narrow);
  b.setAttribute("data-clipped", clipped.length);
  b.setAttribute("data-clipped-text", clipped.slice(0, 5).join(" | "));
  b.setAttribute("data-enotation", enotation);
  b.setAttribute("data-unkeyed", unkeyed);
});
</script>
</body></html>
{{define "chart"}}<figure class="chart"><figcaption>{{.Title}}</figcaption>{{.SVG}}
<div class="keys">{{range .Keys}}<span><svg width="30" height="10"><line x1="0" y1="5" x2="30" y2="5" stroke="{{.Color}}" stroke-width="{{.Width}}"{{if .Dash}} stroke-dasharray="{{.Dash}}"{{end}}/></svg>{{.Name}}</span>{{end}}</div></figure>{{end}}
`))
