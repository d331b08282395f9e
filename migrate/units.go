package migrate

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"sluice/policy"
)

// tcRate reads a rate as tc reads it: units compared without case, a
// bare number is bits per second. It returns bits per second.
func tcRate(s string) (float64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty rate")
	}
	if _, err := strconv.ParseFloat(t, 64); err == nil {
		t += "bit"
	}
	r, _, err := policy.ParseRate(strings.ToLower(t))
	if err != nil {
		return 0, err
	}
	if r.Percent > 0 {
		return 0, fmt.Errorf("bad rate %q: tc has no percentages here", s)
	}
	return r.Bps.BitsFloat(), nil
}

// tcSize reads a size as tc's get_size does: a bare number is bytes,
// k/kb/m/mb are 1024-based bytes, kbit/mbit/gbit are 1024-based bits.
func tcSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, u := range []struct {
		suffix string
		scale  float64
	}{{"gbit", 1 << 30 / 8}, {"mbit", 1 << 20 / 8}, {"kbit", 1 << 10 / 8}} {
		if strings.HasSuffix(t, u.suffix) {
			v, err := strconv.ParseFloat(strings.TrimSuffix(t, u.suffix), 64)
			if err != nil || v <= 0 {
				return 0, fmt.Errorf("bad size %q", s)
			}
			return uint64(v * u.scale), nil
		}
	}
	if strings.HasSuffix(t, "bit") {
		v, err := strconv.ParseFloat(strings.TrimSuffix(t, "bit"), 64)
		if err != nil || v <= 0 {
			return 0, fmt.Errorf("bad size %q", s)
		}
		return uint64(v / 8), nil
	}
	return policy.ParseSize(t)
}

// bitRate writes bits per second exactly, in the largest unit that
// keeps it a whole number ("220kbit", "115789bit").
func bitRate(bits float64) string {
	v := math.Round(bits)
	if v < 8 {
		v = 8
	}
	n := uint64(v)
	for _, u := range []struct {
		s string
		v uint64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if n >= u.v && n%u.v == 0 {
			return fmt.Sprintf("%d%s", n/u.v, u.s)
		}
	}
	return fmt.Sprintf("%dbit", n)
}

// byteSize writes a size in bytes, in kb where it is a whole number.
func byteSize(n uint64) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%dkb", n/1024)
	}
	return fmt.Sprintf("%db", n)
}
