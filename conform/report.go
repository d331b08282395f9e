package conform

import (
	"encoding/json"
	"fmt"
	"html/template"
	"image/color"
	"io"
	"strings"
	"text/tabwriter"

	"sluice/chart"
	"sluice/units"
)

// Report is a conformance run: per tree, what each cell's subjects got
// against the reference. Its JSON form is report.json (docs/json.md).
type Report struct {
	Policy  string  `json:"policy"`
	Kernel  string  `json:"kernel,omitempty"`
	RTT     float64 `json:"rtt_s"`
	Settle  float64 `json:"settle_s"`
	Measure float64 `json:"measure_s"`
	// Capacity is what the bed carried unshaped toward each device,
	// measured to scale trees it could not carry at their rates.
	Capacity []DeviceCapacity `json:"capacity,omitempty"`
	Trees    []*TreeReport    `json:"trees"`
	// Pass: every cell of every tree that ran is within Tolerance.
	Pass bool `json:"pass"`
}

// Measured counts the cells measured, in every tree that ran.
func (r *Report) Measured() int {
	n := 0
	for _, t := range r.Trees {
		if t.Skipped == "" {
			n += len(t.Cells)
		}
	}
	return n
}

// Undriven lists the subjects of the trees that ran that no cell drove
// ("eth0 egress: voip"): what a verdict does not speak for.
func (r *Report) Undriven() []string {
	var out []string
	for _, t := range r.Trees {
		if t.Skipped != "" {
			continue
		}
		for _, s := range t.Subjects {
			if s.NotDriven != "" {
				out = append(out, t.Name()+": "+s.Name)
			}
		}
	}
	return out
}

// Proven says what a verdict speaks for: every subject, or all but
// those not driven.
func (r *Report) Proven() string {
	un := r.Undriven()
	if len(un) == 0 {
		return "every subject driven"
	}
	n := 0
	for _, t := range r.Trees {
		if t.Skipped == "" {
			n += len(t.Subjects)
		}
	}
	return fmt.Sprintf("for the %d of %d subjects driven; not driven: %s (each says why)", n-len(un), n, strings.Join(un, ", "))
}

// DeviceCapacity is what the bed carried unshaped toward a device.
type DeviceCapacity struct {
	Device string  `json:"device"`
	Bps    float64 `json:"bps"`
}

// TreeReport is one tree's run.
type TreeReport struct {
	Interface  string   `json:"interface"`
	Direction  string   `json:"direction"`
	Device     string   `json:"device"`
	Backend    string   `json:"backend,omitempty"`
	Classifier string   `json:"classifier,omitempty"`
	Shards     int      `json:"shards,omitempty"`
	Queues     int      `json:"queues"`
	Leaves     []string `json:"leaves,omitempty"`
	// Scale is what the tree's rates were multiplied by (1: as written);
	// Rate is its rate (bits/s, scaled); Reference what a plain limit at
	// that rate carried on the bed, Efficiency their ratio.
	Scale      float64 `json:"scale"`
	Rate       float64 `json:"rate_bps"`
	Reference  float64 `json:"reference_bps"`
	Efficiency float64 `json:"efficiency"`
	// Notes are what plan says the tree cannot do as the policy reads.
	Notes    []string      `json:"notes,omitempty"`
	Subjects []*Subject    `json:"subjects"`
	Cells    []*CellReport `json:"cells"`
	Worst    float64       `json:"worst"`
	Pass     bool          `json:"pass"`
	// Skipped says why the tree did not run (a qdisc the kernel lacks).
	Skipped string `json:"skipped,omitempty"`
}

// CellReport is one cell and its verdict.
type CellReport struct {
	Cell
	Verdict Verdict `json:"verdict"`
	// FirstTotal, when set, is what the cell's first measurement
	// carried in all (bits/s): it fell short of the bed's reference
	// with every share right, and the cell was measured once more.
	FirstTotal float64 `json:"first_total_bps,omitempty"`
	// ReferenceAgain, when set, is what a plain limit at the tree's
	// rate carried between the two measurements (bits/s): the second is
	// judged by the lower of it and the tree's first reading.
	ReferenceAgain float64 `json:"reference_again_bps,omitempty"`
	// SecondWindow, when set, is how long the second measurement was
	// (seconds): twice the first's, at most maxWindow.
	SecondWindow float64 `json:"second_window_s,omitempty"`
	// FirstWorst, when set, is the first measurement's worst deviation:
	// it was past the tolerance by less than as much again, and the
	// cell was measured once more.
	FirstWorst float64 `json:"first_worst,omitempty"`
	// Window, when set, is how long the cell was measured (seconds),
	// longer than the run's measure time: its smallest share would
	// have sent too few packets to judge (Window).
	Window float64 `json:"window_s,omitempty"`
	// Limit, when set, is the plan's note that explains the cell's
	// failure (Options.Limit): a limit of the data plane, measured once.
	Limit string `json:"limit,omitempty"`
}

// secondFor says how long the second measurement was, where it says.
func (c *CellReport) secondFor() string {
	if c.SecondWindow <= 0 {
		return ""
	}
	return fmt.Sprintf(", the second over %.0f s", c.SecondWindow)
}

// Name is "eth0 egress".
func (t *TreeReport) Name() string { return t.Interface + " " + t.Direction }

// Describe is the tree's data plane in a line.
func (t *TreeReport) Describe() string {
	var parts []string
	if t.Backend != "" {
		parts = append(parts, t.Backend)
	}
	if t.Classifier != "" {
		parts = append(parts, t.Classifier+" classifier")
	}
	q := fmt.Sprintf("%d queue", t.Queues)
	if t.Queues != 1 {
		q += "s"
	}
	if t.Shards > 1 {
		q += fmt.Sprintf(", %d shards", t.Shards)
	}
	parts = append(parts, q)
	if len(t.Leaves) > 0 {
		parts = append(parts, "leaves "+strings.Join(t.Leaves, ", "))
	}
	s := strings.Join(parts, ", ") + "; " + units.Bits(t.Rate)
	if t.Scale != 1 && t.Scale != 0 {
		s += fmt.Sprintf(" (its rates x%g, for what the bed carries)", t.Scale)
	}
	return s
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// WriteText writes the tables: per tree, per cell, each subject's ideal
// and measured rate and share and its deviation; quiet prints a line per
// cell and the subjects of the cells that failed.
func (r *Report) WriteText(w io.Writer, quiet bool) {
	fmt.Fprintf(w, "conformance of %s", r.Policy)
	if r.Kernel != "" {
		fmt.Fprintf(w, " on Linux %s", r.Kernel)
	}
	rtt := "no propagation delay"
	if r.RTT > 0 {
		rtt = fmt.Sprintf("%.0f ms round trip beyond each device", r.RTT*1000)
	}
	fmt.Fprintf(w, " (%s; per cell %.0f s to settle, %.0f s measured)\n", rtt, r.Settle, r.Measure)
	for _, c := range r.Capacity {
		fmt.Fprintf(w, "the bed carries %s unshaped toward %s\n", units.Bits(c.Bps), c.Device)
	}
	cells, pass := 0, 0
	var worst *CellReport
	var worstTree *TreeReport
	for _, t := range r.Trees {
		fmt.Fprintf(w, "\n%s: %s\n", t.Name(), t.Describe())
		if t.Skipped != "" {
			fmt.Fprintf(w, "  skipped: %s\n", t.Skipped)
			continue
		}
		fmt.Fprintf(w, "  reference: a plain %s limit carried %s (%.0f%%) on this bed\n", units.Bits(t.Rate), units.Bits(t.Reference), 100*t.Efficiency)
		for _, n := range t.Notes {
			fmt.Fprintf(w, "  plan says: %s\n", n)
		}
		for _, s := range t.Subjects {
			if s.NotDriven != "" {
				fmt.Fprintf(w, "  not driven: %s: %s\n", s.Name, s.NotDriven)
			}
			for _, m := range s.Misplaced {
				fmt.Fprintf(w, "  left out: %s: %s\n", s.Name, m)
			}
		}
		tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
		if quiet {
			fmt.Fprintln(tw, "  CELL\tWORST\tVERDICT")
		} else {
			// The last column: each subject's round trips, the
			// cell's verdict and notes.
			fmt.Fprintln(tw, "  CELL\tSUBJECT\tDEMAND\tIDEAL\tSHARE\tMEASURED\tSHARE\tDEV\tROUND TRIP p50 / p95")
		}
		for _, c := range t.Cells {
			cells++
			if c.Verdict.Pass {
				pass++
			}
			if worst == nil || !(c.Verdict.Worst <= worst.Verdict.Worst) {
				worst, worstTree = c, t
			}
			verdict := "pass"
			if !c.Verdict.Pass {
				verdict = "FAIL: " + c.Verdict.Why
			}
			if quiet {
				if c.Limit != "" {
					verdict += " (a limit the plan notes)"
				}
				if c.Window > 0 {
					verdict += fmt.Sprintf(" (measured %.0f s)", c.Window)
				}
				fmt.Fprintf(tw, "  %s\t%.1f%%\t%s\n", c.Name, 100*c.Verdict.Worst, verdict)
				continue
			}
			for i, s := range c.Verdict.Subjects {
				name := ""
				if i == 0 {
					name = c.Name
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%.1f%%\t%s\t%.1f%%\t%.1f%%\t%s\n", name, s.Name, s.Demand, units.Bits(s.Ideal), 100*s.IdealShare,
					units.Bits(s.Measured), 100*s.MeasuredShare, 100*s.Deviation, s.RTT.Text())
			}
			fmt.Fprintf(tw, "  \ttotal\t\t%s\t\t%s\t(%.0f%%)\t%.1f%%\t%s\n", units.Bits(c.Verdict.IdealTotal), units.Bits(c.Verdict.MeasuredTotal),
				100*c.Verdict.Utilisation, 100*c.Verdict.Worst, verdict)
			if c.FirstTotal > 0 {
				fmt.Fprintf(tw, "  \t\t\t\t\t%s\t\t\t(measured twice%s: the first carried this in all)\n", units.Bits(c.FirstTotal), c.secondFor())
			}
			if c.ReferenceAgain > 0 {
				fmt.Fprintf(tw, "  \t\t\t%s\t\t\t\t\t(a plain limit between the two: at this bed's %.0f%% then)\n", units.Bits(c.ReferenceAgain), 100*c.Verdict.Efficiency)
			}
			if c.FirstWorst > 0 {
				fmt.Fprintf(tw, "  \t\t\t\t\t\t\t\t(measured twice%s: the first was %.1f%% from the reference)\n", c.secondFor(), 100*c.FirstWorst)
			}
			if c.Window > 0 {
				fmt.Fprintf(tw, "  \t\t\t\t\t\t\t\t(measured %.0f s: %d packets of its smallest share)\n", c.Window, minPackets)
			}
			if c.Limit != "" {
				fmt.Fprintf(tw, "  \t\t\t\t\t\t\t\t(a limit the plan notes: %s)\n", c.Limit)
			}
			for _, n := range c.Verdict.Notes {
				fmt.Fprintf(tw, "  \t\t\t\t\t\t\t\t(%s)\n", n)
			}
		}
		tw.Flush()
		word := "every cell within"
		if !t.Pass {
			word = "cells beyond"
		}
		fmt.Fprintf(w, "  %s: %s %.0f%% of the reference (worst %.1f%%)\n", t.Name(), word, 100*Tolerance, 100*t.Worst)
	}
	fmt.Fprintf(w, "\n%d of %d cells within %.0f%% of the reference", pass, cells, 100*Tolerance)
	if worst != nil {
		fmt.Fprintf(w, "; worst %.1f%% (%s, %s)", 100*worst.Verdict.Worst, worstTree.Name(), worst.Name)
	}
	fmt.Fprintln(w)
	switch {
	case r.Measured() == 0:
		fmt.Fprintln(w, "verdict: NOTHING MEASURED (every tree was skipped, each says why above)")
	case r.Pass:
		fmt.Fprintln(w, "verdict: PASS,", r.Proven())
	default:
		fmt.Fprintln(w, "verdict: FAIL,", r.Proven())
	}
}

// WriteHTML writes a self-contained page: per tree, a chart of each
// cell's worst deviation against the 5% line, and the table.
func (r *Report) WriteHTML(w io.Writer) error {
	type view struct {
		T     *TreeReport
		Chart template.HTML
	}
	var views []view
	for _, t := range r.Trees {
		v := view{T: t}
		if len(t.Cells) > 0 {
			p := chart.New(t.Name() + ": worst deviation per cell")
			p.Y.Label = "% of the reference share"
			vals := make([]float64, len(t.Cells))
			names := make([]string, len(t.Cells))
			for i, c := range t.Cells {
				vals[i] = 100 * c.Verdict.Worst
				names[i] = fmt.Sprint(i + 1)
			}
			p.Add(chart.Bars{Values: vals, Width: 14, Color: chart.Color(0)},
				chart.HLine{Y: 100 * Tolerance, Color: color.Black, Width: 1, Dashes: []float64{4, 3}})
			p.Nominal(names...)
			svg := template.HTML(p.SVG(8, 3))
			v.Chart = svg
		}
		views = append(views, v)
	}
	return page.Execute(w, map[string]any{"R": r, "Views": views, "Tol": 100 * Tolerance})
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"mbit": units.Bits,
	"pct":  func(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) },
	"inc":  func(i int) int { return i + 1 },
	"rtt":  func(r *SubjectRTT) string { return r.Text() },
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>sluice conformance: {{.R.Policy}}</title>
<style>
body{font:14px system-ui,sans-serif;margin:2em;max-width:70em}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child,td:nth-child(2){text-align:left}
.fail{color:#b00020;font-weight:600}.pass{color:#1b5e20}
</style></head><body>
<h1>Conformance of {{.R.Policy}}</h1>
<p>Kernel {{.R.Kernel}}. Every cell drives some subjects (classes, hosts) through a copy of the policy's devices and compares what each got
(the kernel's counters) with the weighted max-min reference for the same demand. A cell passes when each subject's share of the total is
within {{.Tol}}% of the reference's for what the tree carried in all (its rate at most; every ceil as configured; never judged finer than a quarter of an equal share), and the total no more than {{.Tol}}% short of
what the reference wants after the bed's own efficiency and no more than {{.Tol}}% over it at the nominal rates (a cell short of it with every
share right is measured once more, as is a cell whose worst share is past the tolerance; the second must pass). A tree the bed cannot carry at twice its rate runs with every rate scaled down.</p>
<p class="{{if .R.Pass}}pass{{else}}fail{{end}}">Verdict: {{if .R.Pass}}PASS{{else}}FAIL{{end}}, {{.R.Proven}}</p>
{{range .Views}}{{$t := .T}}
<h2>{{$t.Name}}</h2>
<p>{{$t.Describe}}{{if $t.Skipped}}. Skipped: {{$t.Skipped}}{{else}}. A plain {{mbit $t.Rate}} limit carried {{mbit $t.Reference}} on this bed.{{end}}</p>
{{range $t.Notes}}<p>Plan says: {{.}}</p>{{end}}
{{range $t.Subjects}}{{if .NotDriven}}<p>Not driven: {{.Name}}: {{.NotDriven}}</p>{{end}}{{$n := .Name}}{{range .Misplaced}}<p>Left out: {{$n}}: {{.}}</p>{{end}}{{end}}
{{.Chart}}
{{if $t.Cells}}<table><tr><th>#</th><th>cell</th><th>subject</th><th>demand</th><th>ideal</th><th>share</th><th>measured</th><th>share</th><th>deviation</th><th>round trip p50 / p95</th></tr>
{{range $i, $c := $t.Cells}}{{range $j, $s := $c.Verdict.Subjects}}<tr>{{if eq $j 0}}<td>{{inc $i}}</td><td>{{$c.Name}}</td>{{else}}<td></td><td></td>{{end}}
<td>{{$s.Name}}</td><td>{{$s.Demand}}</td><td>{{mbit $s.Ideal}}</td><td>{{pct $s.IdealShare}}</td><td>{{mbit $s.Measured}}</td><td>{{pct $s.MeasuredShare}}</td><td>{{pct $s.Deviation}}</td><td>{{rtt $s.RTT}}</td></tr>
{{end}}<tr><td></td><td></td><td>total</td><td></td><td>{{mbit $c.Verdict.IdealTotal}}</td><td></td><td>{{mbit $c.Verdict.MeasuredTotal}}</td><td>{{pct $c.Verdict.Utilisation}}</td>
<td class="{{if $c.Verdict.Pass}}pass{{else}}fail{{end}}" colspan="2">{{if $c.Verdict.Pass}}pass{{else}}{{$c.Verdict.Why}}{{end}}</td></tr>
{{range $c.Verdict.Notes}}<tr><td></td><td></td><td colspan="8">{{.}}</td></tr>{{end}}
{{end}}</table>{{end}}
{{end}}
</body></html>
`))
