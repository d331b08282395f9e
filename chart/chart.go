// Package chart draws the lab's and conformance reports' charts as
// inline SVG: lines over time or on a log axis, shaded bands, labels and
// grouped bars, on axes the caller may fix so that charts compare.
//
// It replaces gonum/plot, whose plot package carries every Liberation
// font face and every vector backend (about 5 MB of each binary, issue
// 61). An inline SVG needs no font: its text is drawn by the browser.
package chart

import (
	"fmt"
	"html"
	"image/color"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
)

var clips atomic.Uint64

// XY is a point in data coordinates.
type XY struct{ X, Y float64 }

// Axis is one axis of a plot. Min and Max both zero: the range holds
// the data (and zero, on a linear axis).
type Axis struct {
	Label    string
	Min, Max float64
	// Log draws the axis on a log scale, ticked at each decade and
	// labelled 0.1, 1, 10 (not 1e-01). Min and Max must be positive.
	Log bool
}

// Item is something a plot draws: Line, Band, Label, Bars or HLine.
type Item interface {
	extent() (xs, ys []float64)
}

// Line joins Points in order; a point with a NaN coordinate breaks it.
// Width is in points (1/72 in), Dashes in points too (nil: solid).
type Line struct {
	Points []XY
	Color  color.Color
	Width  float64
	Dashes []float64
}

// Band shades the plot's full height from X From to To.
type Band struct {
	From, To float64
	Color    color.Color
}

// Label writes Text with its start at (X, Y).
type Label struct {
	X, Y  float64
	Text  string
	Color color.Color
}

// Bars draws one bar per value, value i at nominal position i (see
// Plot.Nominal), Width points wide and moved Offset points sideways, so
// that several Bars side by side make groups.
type Bars struct {
	Values        []float64
	Width, Offset float64
	Color         color.Color
}

// HLine is a horizontal line across the plot at Y.
type HLine struct {
	Y      float64
	Color  color.Color
	Width  float64
	Dashes []float64
}

func (l Line) extent() (xs, ys []float64) {
	for _, p := range l.Points {
		xs, ys = append(xs, p.X), append(ys, p.Y)
	}
	return xs, ys
}
func (b Band) extent() (xs, ys []float64)  { return []float64{b.From, b.To}, nil }
func (l Label) extent() (xs, ys []float64) { return []float64{l.X}, []float64{l.Y} }
func (b Bars) extent() (xs, ys []float64) {
	return []float64{-0.5, float64(len(b.Values)) - 0.5}, append([]float64{0}, b.Values...)
}
func (h HLine) extent() (xs, ys []float64) { return nil, []float64{h.Y} }

// Plot is a chart being made: a title, two axes and what it draws, in
// the order added (later on top).
type Plot struct {
	Title   string
	X, Y    Axis
	items   []Item
	nominal []string
}

// New is an empty plot titled title.
func New(title string) *Plot { return &Plot{Title: title} }

// Add draws items on p, over what it already has.
func (p *Plot) Add(items ...Item) { p.items = append(p.items, items...) }

// Nominal names the X axis's positions 0, 1, ... (bar charts' groups)
// instead of numbering it.
func (p *Plot) Nominal(names ...string) { p.nominal = names }

// palette holds distinct colours that read on white and for most
// colour-blind readers; Color cycles through them.
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xe4, 0x57, 0x1c, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0x9c, 0x4d, 0xcc, 0xff},
	{0xc7, 0x9a, 0x00, 0xff}, {0x17, 0xbe, 0xcf, 0xff}, {0xd6, 0x27, 0x8b, 0xff}, {0x7f, 0x7f, 0x7f, 0xff},
}

// Color is the i-th colour of the charts' palette (cycling).
func Color(i int) color.Color { return palette[((i%len(palette))+len(palette))%len(palette)] }

// Hex is c as #rrggbb.
func Hex(c color.Color) string {
	if c == nil {
		c = color.Black
	}
	r, g, b, _ := c.RGBA()
	return fmt.Sprintf("#%02x%02x%02x", r>>8, g>>8, b>>8)
}

// pt is one point (1/72 in) in the SVG's pixels (1/96 in).
const pt = 96.0 / 72

// The plot area's margins, in pixels.
const (
	marginLeft   = 58
	marginRight  = 14
	marginTop    = 30
	marginBottom = 42
)

type scale struct {
	min, max float64
	log      bool
	lo, hi   float64 // pixels
}

func (s scale) at(v float64) float64 {
	a, b, x := s.min, s.max, v
	if s.log {
		a, b, x = math.Log10(a), math.Log10(b), math.Log10(math.Max(v, 1e-300))
	}
	if b == a {
		return s.lo
	}
	return s.lo + (x-a)/(b-a)*(s.hi-s.lo)
}

// span is the axis's range: the one set, else the data's.
func span(ax Axis, data []float64, nominal int) (lo, hi float64) {
	if ax.Min != 0 || ax.Max != 0 {
		lo, hi = ax.Min, ax.Max
		if hi <= lo {
			hi = lo + 1
		}
		return lo, hi
	}
	if nominal > 0 {
		return -0.5, float64(nominal) - 0.5
	}
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range data {
		if math.IsNaN(v) || math.IsInf(v, 0) || ax.Log && v <= 0 {
			continue
		}
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	switch {
	case math.IsInf(lo, 1) && ax.Log:
		return 1, 10
	case math.IsInf(lo, 1):
		return 0, 1
	case ax.Log:
		return math.Pow10(int(math.Floor(math.Log10(lo)))), math.Pow10(int(math.Ceil(math.Log10(hi))))
	}
	lo, hi = math.Min(lo, 0), math.Max(hi, 0)
	if hi == lo {
		hi = lo + 1
	}
	return lo, hi + 0.05*(hi-lo)
}

type tick struct {
	v     float64
	label string
	minor bool
}

// ticks are an axis's marks: 1, 2 or 5 times a power of ten apart,
// about six of them, or on a log axis every decade and its multiples.
func ticks(lo, hi float64, log bool) []tick {
	var out []tick
	if log {
		for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
			for m := 1.0; m < 10; m++ {
				v := m * math.Pow10(int(e))
				if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
					continue
				}
				t := tick{v: v, minor: m != 1}
				if !t.minor {
					t.label = strconv.FormatFloat(v, 'f', -1, 64)
				}
				out = append(out, t)
			}
		}
		return out
	}
	raw := (hi - lo) / 6
	step := math.Pow10(int(math.Floor(math.Log10(raw))))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*step >= raw {
			step *= m
			break
		}
	}
	prec := max(0, -int(math.Floor(math.Log10(step))))
	for i := math.Ceil(lo/step - 1e-9); i*step <= hi+1e-9*step; i++ {
		v := i * step
		if v == 0 {
			v = 0 // not -0
		}
		out = append(out, tick{v: v, label: strconv.FormatFloat(v, 'f', prec, 64)})
	}
	return out
}

// SVG draws p at wIn x hIn inches as an inline <svg> element (no XML
// prolog), its text in the page's own sans-serif font. Lines and bars
// are of class "data": a page can tell a chart that drew its data from
// an empty one.
func (p *Plot) SVG(wIn, hIn float64) string {
	w, h := wIn*96, hIn*96
	var xsData, ysData []float64
	for _, it := range p.items {
		xs, ys := it.extent()
		xsData, ysData = append(xsData, xs...), append(ysData, ys...)
	}
	x := scale{log: p.X.Log, lo: marginLeft, hi: w - marginRight}
	x.min, x.max = span(p.X, xsData, len(p.nominal))
	y := scale{log: p.Y.Log, lo: h - marginBottom, hi: marginTop}
	y.min, y.max = span(p.Y, ysData, 0)

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="system-ui,sans-serif" font-size="11" style="max-width:100%%;height:auto">`, w, h, w, h)
	// Each chart's clip is its own: a page holds many charts.
	clip := fmt.Sprintf("chart-clip-%d", clips.Add(1))
	fmt.Fprintf(&b, `<defs><clipPath id="%s"><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"/></clipPath></defs>`,
		clip, x.lo, y.hi, x.hi-x.lo, y.lo-y.hi)
	if p.Title != "" {
		fmt.Fprintf(&b, `<text x="%.1f" y="18" text-anchor="middle" font-size="13" font-weight="600">%s</text>`, w/2, html.EscapeString(p.Title))
	}
	// The grid and the Y axis's ticks.
	for _, t := range ticks(y.min, y.max, y.log) {
		py := y.at(t.v)
		stroke := "#e6e6e6"
		if t.minor {
			stroke = "#f3f3f3"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, x.lo, py, x.hi, py, stroke)
		if t.label != "" {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`, x.lo-5, py, t.label)
		}
	}
	// The X axis's ticks: named positions, or numbers.
	if len(p.nominal) > 0 {
		for i, name := range p.nominal {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x.at(float64(i)), y.lo+15, html.EscapeString(name))
		}
	} else {
		for _, t := range ticks(x.min, x.max, x.log) {
			px := x.at(t.v)
			size := 5.0
			if t.minor {
				size = 3
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#444"/>`, px, y.lo, px, y.lo+size)
			if t.label != "" {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, px, y.lo+16, t.label)
			}
		}
	}
	fmt.Fprintf(&b, `<g clip-path="url(#%s)">`, clip)
	for _, it := range p.items {
		switch it := it.(type) {
		case Band:
			x0, x1 := x.at(it.From), x.at(it.To)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, math.Min(x0, x1), y.hi, math.Abs(x1-x0), y.lo-y.hi, Hex(it.Color))
		case Line:
			for _, seg := range segments(it.Points) {
				var d strings.Builder
				for i, q := range seg {
					cmd := "L"
					if i == 0 {
						cmd = "M"
					}
					fmt.Fprintf(&d, "%s%.1f %.1f", cmd, x.at(q.X), y.at(q.Y))
				}
				fmt.Fprintf(&b, `<path class="data" d="%s" fill="none" stroke="%s" stroke-width="%.2f"%s stroke-linejoin="round"/>`,
					d.String(), Hex(it.Color), width(it.Width), dashes(it.Dashes))
			}
		case HLine:
			py := y.at(it.Y)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.2f"%s/>`, x.lo, py, x.hi, py, Hex(it.Color), width(it.Width), dashes(it.Dashes))
		case Bars:
			for i, v := range it.Values {
				cx := x.at(float64(i)) + it.Offset*pt
				y0, y1 := y.at(0), y.at(v)
				fmt.Fprintf(&b, `<rect class="data" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`,
					cx-it.Width*pt/2, math.Min(y0, y1), it.Width*pt, math.Abs(y1-y0), Hex(it.Color), strconv.FormatFloat(v, 'g', 4, 64))
			}
		case Label:
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="%s">%s</text>`, x.at(it.X), y.at(it.Y), Hex(it.Color), html.EscapeString(it.Text))
		}
	}
	b.WriteString(`</g>`)
	// The axes' lines and labels, over the data.
	fmt.Fprintf(&b, `<path d="M%.1f %.1fV%.1fH%.1f" fill="none" stroke="#444"/>`, x.lo, y.hi, y.lo, x.hi)
	if p.X.Label != "" {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, (x.lo+x.hi)/2, h-6, html.EscapeString(p.X.Label))
	}
	if p.Y.Label != "" {
		fmt.Fprintf(&b, `<text transform="translate(13 %.1f) rotate(-90)" text-anchor="middle">%s</text>`, (y.lo+y.hi)/2, html.EscapeString(p.Y.Label))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// segments splits pts where a coordinate is NaN or infinite.
func segments(pts []XY) [][]XY {
	var out [][]XY
	var cur []XY
	for _, q := range pts {
		if math.IsNaN(q.X) || math.IsNaN(q.Y) || math.IsInf(q.X, 0) || math.IsInf(q.Y, 0) {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, q)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func width(w float64) float64 {
	if w <= 0 {
		w = 1
	}
	return w * pt
}

func dashes(d []float64) string {
	if len(d) == 0 {
		return ""
	}
	s := make([]string, len(d))
	for i, v := range d {
		s[i] = strconv.FormatFloat(v*pt, 'f', 1, 64)
	}
	return ` stroke-dasharray="` + strings.Join(s, ",") + `"`
}
