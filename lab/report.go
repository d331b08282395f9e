package lab

import (
	"bytes"
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

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
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

func bytesMB(n uint64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

func mbit(v float64) string { return fmt.Sprintf("%.2f Mbit/s", v/1e6) }

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
				s := mbit(fs.Goodput)
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
			return fmt.Sprintf("%.1f%% of %s", 100*ratioOf(red, n), bytesMB(n)), true
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
				row = append(row, mbit(fs.Goodput), fmt.Sprintf("%.1f%%", 100*fs.RetransRatio))
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

type chart struct {
	Title string
	SVG   template.HTML
}

type variantView struct {
	Name, Note, Skipped, Policy string
	Charts                      []chart
}

// WriteHTML writes a self-contained page: the comparison table, the
// expectations, and per variant the charts (SVG drawn with gonum/plot).
func (r *Report) WriteHTML(w io.Writer) error {
	heads, rows := r.comparison()
	var views []variantView
	nCharts := 0
	for _, res := range r.Results {
		v := variantView{Name: res.Variant, Note: res.Note, Skipped: res.Skipped, Policy: res.Policy}
		if res.Skipped == "" {
			for _, c := range []func(*Result) (chart, bool){classChart, sharingChart, latencyChart, hostsChart, flowChart} {
				ch, ok := c(res)
				if ok {
					v.Charts = append(v.Charts, ch)
					nCharts++
				}
			}
		}
		views = append(views, v)
	}
	mh, mr := r.matrix()
	return page.Execute(w, map[string]any{
		"R": r, "Heads": heads, "Rows": rows, "Variants": views, "NCharts": nCharts, "MHeads": mh, "MRows": mr,
	})
}

// SVG draws p at wIn x hIn inches as inline SVG for a report page.
func SVG(p *plot.Plot, wIn, hIn float64) (template.HTML, error) { return svg(p, wIn, hIn) }

func svg(p *plot.Plot, wIn, hIn float64) (template.HTML, error) {
	wt, err := p.WriterTo(vg.Length(wIn)*vg.Inch, vg.Length(hIn)*vg.Inch, "svg")
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return "", err
	}
	s := b.String()
	if i := strings.Index(s, "<svg"); i > 0 {
		s = s[i:] // drop the XML prolog: the SVG is inline
	}
	return template.HTML(s), nil
}

// classChart: goodput per class over time, with each class's configured
// rate dashed in the same colour.
func classChart(r *Result) (chart, bool) {
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
		return chart{}, false
	}
	p := plot.New()
	p.Title.Text = "Rate per class (router counters) against configured rates"
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "Mbit/s"
	p.Legend.Top = true
	for i, c := range show {
		l, err := plotter.NewLine(mbitSeries(c.Bps, r.Bucket))
		if err != nil {
			continue
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(c.Key(), l)
		rate, _ := plotter.NewLine(plotter.XYs{{X: 0, Y: c.Rate / 1e6}, {X: r.Duration, Y: c.Rate / 1e6}})
		rate.Color = plotutil.Color(i)
		rate.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(rate)
	}
	phaseLines(p, r)
	s, err := svg(p, 8, 3.6)
	return chart{Title: "Rates per class", SVG: s}, err == nil
}

// sharingChart: for classes under a sharing controller, the rate each
// sent (solid), the limit in force (thin), its share (dashed) and the
// demand the controller counted (dotted), per tenant in one colour.
func sharingChart(r *Result) (chart, bool) {
	p := plot.New()
	p.Title.Text = "Sharing controller: rate, limit, share and demand per class"
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "Mbit/s"
	p.Legend.Top = true
	n := 0
	for _, c := range r.Classes {
		sh := c.Sharing
		if sh == nil {
			continue
		}
		col := plotutil.Color(n)
		n++
		for _, v := range []struct {
			what   string
			xs     []float64
			width  float64
			dashes []vg.Length
		}{
			{"rate", c.Bps, 1.5, nil},
			{"limit", sh.Limit, 0.8, nil},
			{"share", sh.Share, 1, []vg.Length{vg.Points(5), vg.Points(3)}},
			{"demand", sh.Demand, 1, []vg.Length{vg.Points(1), vg.Points(2)}},
		} {
			l, err := plotter.NewLine(mbitSeries(v.xs, r.Bucket))
			if err != nil {
				continue
			}
			l.Color, l.Width, l.Dashes = col, vg.Points(v.width), v.dashes
			p.Add(l)
			p.Legend.Add(c.Name+" "+v.what, l)
		}
	}
	if n == 0 {
		return chart{}, false
	}
	phaseLines(p, r)
	s, err := svg(p, 8, 4)
	return chart{Title: "Sharing controller", SVG: s}, err == nil
}

// mbitSeries turns a series of bits/s per bucket into chart points.
func mbitSeries(xs []float64, bucket float64) plotter.XYs {
	pts := make(plotter.XYs, len(xs))
	for j, v := range xs {
		pts[j].X, pts[j].Y = float64(j)*bucket, v/1e6
	}
	return pts
}

// phaseLines marks phase boundaries.
func phaseLines(p *plot.Plot, r *Result) {
	for _, ph := range r.Phases[1:] {
		l, err := plotter.NewLine(plotter.XYs{{X: ph.Start, Y: p.Y.Min}, {X: ph.Start, Y: p.Y.Max}})
		if err != nil {
			continue
		}
		l.Color = color.Gray{Y: 170}
		l.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
		p.Add(l)
	}
}

// latencyChart: the distribution of each probe's round trips, idle (the
// first phase) against loaded (the others).
func latencyChart(r *Result) (chart, bool) {
	p := plot.New()
	p.Title.Text = "Latency: share of probes answered within x ms"
	p.X.Label.Text = "round trip (ms, log scale)"
	p.Y.Label.Text = "fraction"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{}
	p.Legend.Left = false
	p.Legend.Top = false
	n := 0
	for _, pr := range r.Probes {
		for pi, ph := range r.Phases {
			var rtts []float64
			for _, s := range window(pr.Samples, ph.Start, ph.End) {
				if !s.Lost {
					rtts = append(rtts, math.Max(s.RTT, 0.001))
				}
			}
			if len(rtts) == 0 {
				continue
			}
			sort.Float64s(rtts)
			pts := make(plotter.XYs, len(rtts))
			for i, v := range rtts {
				pts[i].X, pts[i].Y = v, float64(i+1)/float64(len(rtts))
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				continue
			}
			l.Color = plotutil.Color(pi)
			if pr.Type != "ping" {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(2)}
			}
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(pr.Name+" "+ph.Name, l)
			n++
		}
	}
	if n == 0 {
		return chart{}, false
	}
	s, err := svg(p, 8, 3.6)
	return chart{Title: "Latency, idle and loaded", SVG: s}, err == nil
}

// hostsChart: goodput per host in each loaded phase.
func hostsChart(r *Result) (chart, bool) {
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
		return chart{}, false
	}
	var hosts []string
	for h := range hostSet {
		hosts = append(hosts, h)
	}
	sort.Slice(hosts, func(i, j int) bool { return hostLess(hosts[i], hosts[j]) })
	p := plot.New()
	p.Title.Text = "Goodput per host"
	p.Y.Label.Text = "Mbit/s"
	w := vg.Points(14)
	for i, ph := range phases {
		vals := make(plotter.Values, len(hosts))
		for j, h := range hosts {
			vals[j] = ph.Hosts[h] / 1e6
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			continue
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(i-len(phases)/2)
		p.Add(bars)
		p.Legend.Add(fmt.Sprintf("%s (Jain %.3f)", ph.Name, ph.HostsFairness), bars)
	}
	p.Legend.Top = true
	p.NominalX(hosts...)
	s, err := svg(p, 8, 3.4)
	return chart{Title: "Goodput per host", SVG: s}, err == nil
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

// flowChart: goodput of each traffic item over time (when no class
// chart explains it, e.g. unshaped variants).
func flowChart(r *Result) (chart, bool) {
	items := map[string][]float64{}
	var order []string
	for _, f := range r.Flows {
		if _, ok := items[f.Item]; !ok {
			order = append(order, f.Item)
			items[f.Item] = make([]float64, len(f.Goodput))
		}
		for i, v := range f.Goodput {
			items[f.Item][i] += v
		}
	}
	if len(order) == 0 {
		return chart{}, false
	}
	p := plot.New()
	p.Title.Text = "Goodput per traffic item (receiver side)"
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "Mbit/s"
	p.Legend.Top = true
	for i, it := range order {
		l, err := plotter.NewLine(mbitSeries(items[it], r.Bucket))
		if err != nil {
			continue
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(it, l)
	}
	phaseLines(p, r)
	s, err := svg(p, 8, 3.4)
	return chart{Title: "Goodput per traffic item", SVG: s}, err == nil
}

var page = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>sluice lab: {{.R.Scenario}}</title>
<style>
body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f3f3f3}.pass{color:#176a17}.fail{color:#b00;font-weight:bold}
figure{margin:1em 0}figcaption{font-weight:600;margin-bottom:.3em}pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:85%}
.chart svg{max-width:100%;height:auto}
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
{{if .R.Verdicts}}<h2>Expectations</h2><table><tr><th></th><th>expectation</th><th>actual</th><th>want</th></tr>
{{range .R.Verdicts}}<tr><td>{{if .Skipped}}skip{{else if .Pass}}<span class="pass">pass</span>{{else}}<span class="fail">FAIL</span>{{end}}</td><td>{{.Expect}}</td><td>{{printf "%.4g" .Actual}}{{if .Note}} ({{.Note}}){{end}}</td><td>{{.Want}}</td></tr>{{end}}
</table>{{end}}
{{range .Variants}}<h2>{{.Name}}</h2>{{if .Note}}<p>{{.Note}}</p>{{end}}
{{if .Skipped}}<p><i>Skipped: {{.Skipped}}</i></p>{{else}}
{{range .Charts}}<figure class="chart"><figcaption>{{.Title}}</figcaption>{{.SVG}}</figure>{{end}}
{{if .Policy}}<details><summary>policy</summary><pre>{{.Policy}}</pre></details>{{end}}{{end}}
{{end}}
<script>
// Marks the page once every chart has laid out with a visible size and
// drawn paths: the report's own test reads this attribute.
addEventListener("load", function () {
  var ok = 0, svgs = document.querySelectorAll(".chart svg");
  svgs.forEach(function (s) {
    var r = s.getBoundingClientRect();
    if (r.width > 100 && r.height > 100 && s.querySelectorAll("path").length > 3) ok++;
  });
  document.body.setAttribute("data-charts", svgs.length);
  document.body.setAttribute("data-rendered", ok);
});
</script>
</body></html>
`))
