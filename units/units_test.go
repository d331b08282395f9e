package units

import (
	"testing"
	"time"
)

func TestConversions(t *testing.T) {
	r := Rate(2_500_000) // 20 Mbit/s
	if r.Bits() != 20_000_000 || r.BitsFloat() != 20e6 {
		t.Errorf("%d bytes/s is %d (%g) bits/s", r, r.Bits(), r.BitsFloat())
	}
	if FromBits(20e6) != r || FromBits(7) != 0 {
		t.Errorf("FromBits: %d, %d", FromBits(20e6), FromBits(7))
	}
	if got := BitsPerSecond(1_250_000, 500*time.Millisecond); got != 20e6 {
		t.Errorf("BitsPerSecond = %g", got)
	}
	if got := r.BytesIn(10 * time.Millisecond); got != 25_000 {
		t.Errorf("BytesIn(10ms) = %d", got)
	}
	if got := Rate(7).BytesIn(10 * time.Millisecond); got != 0 {
		t.Errorf("7 B/s in 10 ms = %d", got)
	}
	if got := Rate(1e15).BytesIn(time.Hour); got != 36e17 {
		t.Errorf("8 Pbit/s for an hour = %d", got)
	}
	if BitsPerSecond(1, 0) != 0 {
		t.Error("a zero interval has no rate")
	}
}

// Each of the three ways to write a rate, and sizes, in one table: the
// configured (String), the exact (TC) and the measured (Bits).
func TestFormats(t *testing.T) {
	for _, tt := range []struct {
		r          Rate
		str, exact string
	}{
		{0, "0bit", "0bit"},
		{FromBits(999), "992bit", "992bit"}, // 124 bytes/s: whole bytes
		{FromBits(19e6), "19mbit", "19mbit"},
		{FromBits(1.5e9), "1.5gbit", "1500mbit"},
		{FromBits(156_250), "156.2kbit", "156248bit"}, // whole bytes again
		{FromBits(19_950_008), "19.95mbit", "19950008bit"},
		{FromBits(8e15), "8pbit", "8000000gbit"},
	} {
		if got := tt.r.String(); got != tt.str {
			t.Errorf("Rate(%d).String() = %q; want %q", tt.r, got, tt.str)
		}
		if got := tt.r.TC(); got != tt.exact {
			t.Errorf("Rate(%d).TC() = %q; want %q", tt.r, got, tt.exact)
		}
	}
	for _, tt := range []struct {
		bps  float64
		want string
	}{
		{0, "0 bit/s"}, {999, "999 bit/s"}, {1000, "1.0 kbit/s"}, {40_200, "40.2 kbit/s"},
		{19.95e6, "19.95 Mbit/s"}, {1e9, "1.00 Gbit/s"}, {40e9, "40.00 Gbit/s"},
	} {
		if got := Bits(tt.bps); got != tt.want {
			t.Errorf("Bits(%g) = %q; want %q", tt.bps, got, tt.want)
		}
	}
	for _, tt := range []struct {
		b    uint64
		want string
	}{
		{0, "0B"}, {1023, "1023B"}, {1024, "1.0K"}, {70_000, "68.4K"}, {1 << 20, "1.0M"}, {3 << 30, "3.0G"},
	} {
		if got := Size(tt.b); got != tt.want {
			t.Errorf("Size(%d) = %q; want %q", tt.b, got, tt.want)
		}
	}
}
