package chart

import (
	"encoding/xml"
	"image/color"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// parse checks that s is well-formed XML and returns its elements' names
// in order.
func parse(t *testing.T, s string) []xml.StartElement {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(s))
	var out []xml.StartElement
	for {
		tok, err := d.Token()
		if err != nil {
			if err.Error() == "EOF" {
				return out
			}
			t.Fatalf("not well-formed: %v\n%s", err, s)
		}
		if se, ok := tok.(xml.StartElement); ok {
			out = append(out, se)
		}
	}
}

func attr(e xml.StartElement, name string) string {
	for _, a := range e.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// A chart over time: lines in data coordinates inside the plot area,
// dashes and widths in points, a band across the full height, a label
// escaped, a NaN that breaks a line in two, and linear ticks at 1, 2 or
// 5 times a power of ten.
func TestLinesBandsAndLabels(t *testing.T) {
	p := New(`rates <a & b>`)
	p.X.Label, p.Y.Label = "seconds", "Mbit/s"
	p.X.Min, p.X.Max = 0, 10
	p.Y.Min, p.Y.Max = 0, 20
	p.Add(Band{From: 2, To: 4, Color: color.Gray{Y: 242}},
		Line{Points: []XY{{0, 0}, {5, 10}, {10, 20}}, Color: Color(0), Width: 1.5},
		Line{Points: []XY{{0, 5}, {1, math.NaN()}, {2, 5}, {3, 5}}, Color: Color(1), Width: 1, Dashes: []float64{4, 3}},
		Label{X: 2.1, Y: 19, Text: "load & more", Color: color.Gray{Y: 90}})
	s := p.SVG(10.4, 3.4)
	els := parse(t, s)
	if els[0].Name.Local != "svg" || attr(els[0], "width") != "998" || attr(els[0], "height") != "326" {
		t.Errorf("svg element %v: want 998 x 326 (10.4 x 3.4 in at 96 px)", els[0].Attr)
	}
	var paths []string
	for _, e := range els {
		if e.Name.Local == "path" && attr(e, "fill") == "none" && attr(e, "stroke") != "#444" {
			paths = append(paths, attr(e, "d"))
		}
	}
	// Plot area: x 58..984.4, y 284.4..30.
	want := []string{"M58.0 284.4L521.2 157.2L984.4 30.0", "M58.0 220.8", "M243.3 220.8L335.9 220.8"}
	if strings.Join(paths, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q, want %q", paths, want)
	}
	if !strings.Contains(s, `stroke-width="2.00"`) || !strings.Contains(s, `stroke-dasharray="5.3,4.0"`) {
		t.Error("widths and dashes are not in points")
	}
	if !regexp.MustCompile(`<rect x="243.3" y="30.0" width="185.3" height="254.4" fill="#f2f2f2"/>`).MatchString(s) {
		t.Errorf("no band from 2 to 4 s across the plot:\n%s", s)
	}
	for _, text := range []string{">rates &lt;a &amp; b&gt;<", ">load &amp; more<", ">seconds<", ">Mbit/s<"} {
		if !strings.Contains(s, text) {
			t.Errorf("no %s", text)
		}
	}
	var yticks []string
	for _, m := range regexp.MustCompile(`text-anchor="end" dominant-baseline="middle">([^<]*)<`).FindAllStringSubmatch(s, -1) {
		yticks = append(yticks, m[1])
	}
	if strings.Join(yticks, " ") != "0 5 10 15 20" {
		t.Errorf("Y ticks %v, want 0 5 10 15 20", yticks)
	}
}

// A log axis is ticked at every decade, labelled as plain numbers, with
// unlabelled marks between; data outside the range is clipped.
func TestLogAxis(t *testing.T) {
	p := New("latency")
	p.X.Log = true
	p.X.Min, p.X.Max = 0.1, 1000
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(Line{Points: []XY{{0.5, 0.1}, {20, 0.5}, {5000, 1}}, Color: Color(2)})
	s := p.SVG(8, 3)
	parse(t, s)
	var labels []string
	for _, m := range regexp.MustCompile(`<text x="[0-9.]+" y="[0-9.]+" text-anchor="middle">([^<]*)<`).FindAllStringSubmatch(s, -1) {
		labels = append(labels, m[1])
	}
	if got := strings.Join(labels, " "); got != "0.1 1 10 100 1000" {
		t.Errorf("log labels %q, want 0.1 1 10 100 1000", got)
	}
	if n := len(regexp.MustCompile(`<line [^>]*stroke="#444"/>`).FindAllString(s, -1)); n != 4*9+1 {
		t.Errorf("%d tick marks, want 37 (4 decades of 9, and 1000)", n)
	}
	if !strings.Contains(s, `clip-path="url(#chart-clip-`) {
		t.Error("data is not clipped to the plot area")
	}
}

// Grouped bars on named positions: each bar from zero to its value,
// offset in points, the range from the data with zero in it; a
// horizontal line across; two charts on one page clip apart.
func TestBars(t *testing.T) {
	p := New("goodput per host")
	p.Add(Bars{Values: []float64{4, 8}, Width: 14, Offset: -7, Color: Color(0)},
		Bars{Values: []float64{2, 6}, Width: 14, Offset: 7, Color: Color(1)},
		HLine{Y: 5, Color: color.Black, Dashes: []float64{4, 3}})
	p.Nominal("client1", "client<2>")
	s := p.SVG(8, 3)
	els := parse(t, s)
	type bar struct{ x, h float64 }
	var bars []bar
	for _, e := range els {
		if e.Name.Local == "rect" && attr(e, "fill") != "" {
			x, _ := strconv.ParseFloat(attr(e, "x"), 64)
			h, _ := strconv.ParseFloat(attr(e, "height"), 64)
			bars = append(bars, bar{x, h})
		}
	}
	if len(bars) != 4 {
		t.Fatalf("%d bars, want 4", len(bars))
	}
	// Heights in proportion to the values, the second group to the right.
	if r := bars[1].h / bars[0].h; math.Abs(r-2) > 0.02 {
		t.Errorf("bar heights %v: 8 is not twice 4", bars)
	}
	if r := bars[3].h / bars[2].h; math.Abs(r-3) > 0.03 {
		t.Errorf("bar heights %v: 6 is not three times 2", bars)
	}
	if !(bars[0].x < bars[2].x && bars[2].x < bars[1].x && bars[1].x < bars[3].x) {
		t.Errorf("bars %v: not grouped by position, the second series right of the first", bars)
	}
	if !strings.Contains(s, ">client1<") || !strings.Contains(s, ">client&lt;2&gt;<") {
		t.Error("positions not named")
	}
	ids := regexp.MustCompile(`clipPath id="([^"]+)"`)
	if a, b := ids.FindStringSubmatch(s)[1], ids.FindStringSubmatch(p.SVG(8, 3))[1]; a == b {
		t.Errorf("two charts share the clip %s", a)
	}
}

// Nothing to draw still draws axes; ranges from no data are sane.
func TestEmpty(t *testing.T) {
	for _, log := range []bool{false, true} {
		p := New("")
		p.X.Log = log
		s := p.SVG(4, 2)
		parse(t, s)
		if strings.Contains(s, "NaN") || strings.Contains(s, "Inf") {
			t.Errorf("log %v: %s", log, s)
		}
	}
}
