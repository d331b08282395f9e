package lab

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// Two variants, before and after: one page compares them on the same
// axes (the latency of both on one chart; every time chart to the same
// seconds and Mbit/s), names the phases on the charts, writes legends
// beside the charts, not over them, labels the log axis 0.1, 1, 10, and
// shows an expectation's actual in its unit.
func TestReportHTMLComparesOnSharedAxes(t *testing.T) {
	before := synthetic()
	before.Variant = "unshaped"
	for i := range before.Probes[0].Samples {
		before.Probes[0].Samples[i].RTT *= 200 // 200 to 600 ms
	}
	before.Flows[1].Goodput = fill(20, 40e6)
	before.Phases = []*PhaseResult{before.summarize("idle", 0, 1, 0), before.summarize("upload", 1, 2, 0)}
	after := synthetic()
	after.Phases = []*PhaseResult{after.summarize("idle", 0, 1, 0), after.summarize("upload", 1, 2, 0)}
	r := &Report{Scenario: "t", Results: []*Result{before, after},
		Verdicts: []Verdict{{Expect: "shaped: flow bulk goodput >= 5mbit", Actual: 9.5e6, Shown: "9.50Mbit/s", Want: ">= 5.00Mbit/s", Pass: true}}}

	sc := sharedScales(r.Results)
	if sc.rateMax != 40 || sc.duration != 2 || sc.rttMin != 1 || sc.rttMax != 1000 {
		t.Errorf("shared scales %+v: want 40 Mbit/s, 2 s, 1 to 1000 ms", sc)
	}
	var b bytes.Buffer
	if err := r.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if !strings.Contains(page, "<figcaption>Latency under load, every variant</figcaption>") ||
		!strings.Contains(page, "unshaped: ping under load") || !strings.Contains(page, "shaped: ping under load") {
		t.Error("no chart comparing the variants' latency under load")
	}
	if strings.Contains(page, "9.5e+06") || !strings.Contains(page, "<td>9.50Mbit/s</td>") {
		t.Error("an expectation's actual is not shown in its unit")
	}
	// The log axis's labels: plain numbers, on both variants' charts alike.
	if regexp.MustCompile(`>\d(\.\d+)?e[+-]\d+<`).MatchString(page) {
		t.Error("an axis label in e-notation")
	}
	for _, tick := range []string{">1<", ">10<", ">100<", ">1000<"} {
		if n := strings.Count(page, tick); n < 3 {
			t.Errorf("tick %s on %d charts, want the three latency charts", tick, n)
		}
	}
	// Phases named on the time charts; legends under each chart.
	if n := strings.Count(page, ">upload</text>"); n < 2 {
		t.Errorf("phase named on %d charts", n)
	}
	figures := strings.Count(page, `<figure class="chart">`)
	if keys := strings.Count(page, `<div class="keys"><span>`); figures < 5 || keys != figures {
		t.Errorf("%d charts, %d with a legend under them", figures, keys)
	}
	if strings.Contains(page, ">unshaped: ping under load</text>") || strings.Contains(page, ">web</text>") {
		t.Error("a legend drawn inside a plot, over its data")
	}
	// Phases summarised from 0: nothing tinted.
	if strings.Contains(page, `fill="#ffe8cc"`) {
		t.Error("a settle tinted where the phases leave none out")
	}
}

// Each phase's settle, which its figures leave out, is tinted on the
// charts over time, and said under the table.
func TestReportTintsTheSettle(t *testing.T) {
	r := synthetic()
	r.Phases = []*PhaseResult{r.summarize("idle", 0, 1, 0.3), r.summarize("load", 1, 2, 0.3), r.summarize("short", 2, 2.2, 0.3)}
	if f := r.Phases[1].From; f != 1.3 {
		t.Errorf("load's figures from %g s, want 1.3", f)
	}
	if f := r.Phases[2].From; f != 2 {
		t.Errorf("a phase shorter than the settle: figures from %g s, want its start, 2", f)
	}
	var b bytes.Buffer
	if err := (&Report{Scenario: "t", Results: []*Result{r}}).WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	// Every chart over time shades its second phase grey (one band) and
	// tints the first two phases' settles; the third is shorter than it.
	grey, tint := strings.Count(page, `fill="#f2f2f2"`), strings.Count(page, `fill="#ffe8cc"`)
	if grey == 0 || tint != 2*grey {
		t.Errorf("%d tinted bands on %d charts over time, want 2 a chart", tint, grey)
	}
	if !strings.Contains(page, "first seconds are tinted") {
		t.Error("the tint is not explained")
	}
}
