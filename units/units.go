// Package units holds sluice's one rate type. The kernel's HTB, TBF and
// policers keep rates in bytes per second; people, tc and sluice's
// output speak bits per second. Every rate inside sluice is a Rate (bytes
// per second), and the conversions to and from bits live here, so that
// no caller multiplies or divides by 8 by hand.
package units

import (
	"math"
	"math/bits"
	"time"
)

// Rate is a rate in bytes per second.
type Rate uint64

// Bits is r in bits per second.
func (r Rate) Bits() uint64 { return uint64(r) * 8 }

// BitsFloat is r in bits per second, as a float (for display and
// comparison with measurements).
func (r Rate) BitsFloat() float64 { return float64(r) * 8 }

// FromBits is the rate of bits bits per second (rounded down to whole
// bytes per second).
func FromBits(bits float64) Rate { return Rate(bits / 8) }

// BytesIn is how many bytes r sends in d (rounded down, exactly).
func (r Rate) BytesIn(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(r), uint64(d))
	if hi >= uint64(time.Second) {
		return ^uint64(0)
	}
	q, _ := bits.Div64(hi, lo, uint64(time.Second))
	return q
}

// BitsOf is n bytes in bits (a byte counter shown as bits).
func BitsOf(n uint64) uint64 { return n * 8 }

// PerSecond is the rate of n bytes sent over d (rounded to whole bytes
// per second).
func PerSecond(n uint64, d time.Duration) Rate {
	if d <= 0 {
		return 0
	}
	return Rate(math.Round(float64(n) / d.Seconds()))
}

// BitsPerSecond is the rate in bits per second of n bytes sent over d.
func BitsPerSecond(n uint64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) * 8 / d.Seconds()
}
