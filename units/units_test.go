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
