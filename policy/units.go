package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"sluice/units"
)

// Rate units, as tc(8) reads them: "bit" units count bits, "bps" units
// count bytes (a common trap: 20mbps is 160 Mbit/s).
var rateUnits = map[string]float64{
	"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "pbit": 1e15,
	"kibit": 1 << 10, "mibit": 1 << 20, "gibit": 1 << 30, "tibit": 1 << 40,
	"bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
	"kibps": 8 << 10, "mibps": 8 << 20, "gibps": 8 << 30, "tibps": 8 << 40,
}

// Size units (bytes), as tc's get_size reads them: k/kb is 1024.
var sizeUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
}

// MaxRateBps is the highest rate a policy may give, in bytes/s (8 Pbit/s).
const MaxRateBps units.Rate = 1e15

// Rate is an absolute rate or a share of the parent's.
type Rate struct {
	Bps     units.Rate // when absolute
	Percent float64    // 0 < Percent <= 100, when relative
	// Auto: a direction's `rate: auto` (Tree.Auto holds its settings).
	Auto bool
	Text string
	Pos  Pos
}

// Resolve returns the rate in bytes/s given the parent's.
func (r *Rate) Resolve(parent units.Rate) units.Rate {
	if r.Percent > 0 {
		return units.Rate(float64(parent) * r.Percent / 100)
	}
	return r.Bps
}

func splitNumber(s string) (num, unit string) {
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	return s[:i], s[i:]
}

// ParseRate reads "20mbit", "1.5gbit", "2mbps" (bytes/s) or "90%".
// The warning, if any, flags a legal but probably unintended unit.
func ParseRate(s string) (r Rate, warning string, err error) {
	r.Text = s
	t := strings.TrimSpace(s)
	if strings.HasSuffix(t, "%") {
		p, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(t, "%")), 64)
		if err != nil || p <= 0 || p > 100 || math.IsNaN(p) {
			return r, "", fmt.Errorf("bad percentage %q: want more than 0%% and at most 100%%", s)
		}
		r.Percent = p
		return r, "", nil
	}
	num, unit := splitNumber(t)
	if num == "" {
		return r, "", fmt.Errorf("bad rate %q: want a number and a unit, like 20mbit", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return r, "", fmt.Errorf("bad rate %q: %q is not a number", s, num)
	}
	u := strings.ToLower(strings.TrimSpace(unit))
	if strings.Contains(unit, " ") && u != "" {
		return r, "", fmt.Errorf("bad rate %q: write the unit right after the number (%s%s)", s, num, u)
	}
	scale, ok := rateUnits[u]
	if !ok {
		return r, "", fmt.Errorf("bad rate %q: %s", s, rateUnitHint(num, u))
	}
	bits := v * scale
	if bits < 8 {
		return r, "", fmt.Errorf("bad rate %q: must be at least 8bit", s)
	}
	if units.FromBits(bits) > MaxRateBps {
		return r, "", fmt.Errorf("bad rate %q: above %s, the most sluice shapes (HTB keeps a burst as whole microseconds at the rate; beyond it even 1 GiB lasts less)", s, MaxRateBps.String())
	}
	r.Bps = units.FromBits(bits) // tc truncates the same way
	if strings.HasSuffix(u, "bps") {
		warning = fmt.Sprintf("%s is %s per second in tc's units (bytes, not bits); write %s%sbit if you meant bits",
			s, byteWord(u), num, strings.TrimSuffix(u, "bps"))
	}
	return r, warning, nil
}

func byteWord(u string) string {
	switch strings.TrimSuffix(u, "bps") {
	case "k", "ki":
		return "kilobytes"
	case "m", "mi":
		return "megabytes"
	case "g", "gi":
		return "gigabytes"
	case "t", "ti":
		return "terabytes"
	}
	return "bytes"
}

func rateUnitHint(num, u string) string {
	switch {
	case u == "":
		// A big bare number is more likely kbit (tc scripts and
		// wondershaper count in kbit) or bit than mbit: 19000 is
		// 19000kbit, not 19 gigabits.
		v, _ := strconv.ParseFloat(num, 64)
		switch {
		case v >= 1e6:
			return fmt.Sprintf("missing unit: write %sbit (bits/s, %s), %skbit, or %sbps (bytes/s)", num, units.FromBits(v).String(), num, num)
		case v >= 1e3:
			return fmt.Sprintf("missing unit: write %skbit (kilobits/s, %s), %smbit, or %skbps (kilobytes/s)", num, units.FromBits(v*1e3).String(), num, num)
		}
		return fmt.Sprintf("missing unit: write %smbit (megabits/s), %skbit, %sgbit, or %sbps (bytes/s)", num, num, num, num)
	case strings.HasSuffix(u, "bits"):
		return fmt.Sprintf("%q is not a unit; did you mean %s%s?", u, num, strings.TrimSuffix(u, "s"))
	case u == "k" || u == "m" || u == "g" || u == "kb" || u == "mb" || u == "gb" || u == "b":
		return fmt.Sprintf("%q is a size, not a rate; write %s%sbit for bits/s or %s%sbps for bytes/s",
			u, num, strings.TrimSuffix(u, "b"), num, strings.TrimSuffix(u, "b"))
	case strings.HasSuffix(u, "b/s") || strings.HasSuffix(u, "bit/s") || strings.HasSuffix(u, "bps/s"):
		return fmt.Sprintf("%q is not a tc unit; write %s%sbit", u, num, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(u, "/s"), "it"), "b"))
	}
	if s := suggest(u, keys(rateUnits)); s != "" {
		return fmt.Sprintf("unknown unit %q; did you mean %s%s?", u, num, s)
	}
	return fmt.Sprintf("unknown unit %q; rates use bit, kbit, mbit, gbit (bits/s) or bps, kbps, mbps (bytes/s)", u)
}

// ParseSize reads "1600", "1600b", "15kb", "2mb" (bytes; k is 1024).
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	num, unit := splitNumber(t)
	if num == "" {
		return 0, fmt.Errorf("bad size %q: want a number of bytes, like 15kb", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("bad size %q", s)
	}
	u := strings.ToLower(unit)
	scale, ok := sizeUnits[u]
	if !ok {
		if _, isRate := rateUnits[u]; isRate {
			return 0, fmt.Errorf("bad size %q: %q is a rate unit; sizes use b, kb, mb", s, u)
		}
		return 0, fmt.Errorf("bad size %q: unknown unit %q; sizes use b, kb, mb", s, u)
	}
	b := v * float64(scale)
	if b < 1 || b > math.MaxUint32 {
		return 0, fmt.Errorf("bad size %q: must be between 1b and 4gb", s)
	}
	return uint64(b), nil
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Suggest returns the candidate closest to s, if it is close ("" if
// none): a typo or a longer or shorter spelling of a name.
func Suggest(s string, candidates []string) string { return suggest(s, candidates) }

// suggest returns the candidate closest to s, if it is close: a typo
// (edits, swapped letters) or a longer or shorter spelling of a name.
func suggest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := editDistance(s, c)
		if len(s) >= 3 && len(c) >= 3 && (strings.HasPrefix(s, c) || strings.HasPrefix(c, s)) {
			d = min(d, 1)
		}
		if d < bestD || d == bestD && c < best {
			best, bestD = c, d
		}
	}
	if bestD > 2 || bestD == 2 && len(s) <= 3 {
		return ""
	}
	return best
}

// editDistance counts insertions, deletions, substitutions and swaps of
// adjacent letters (optimal string alignment).
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
