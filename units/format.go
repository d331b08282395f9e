package units

import (
	"fmt"
	"strconv"
)

// sluice writes a rate in one of three ways, each made here and nowhere
// else:
//
//   - a configured rate, as a policy or tc spells it: Rate.String
//     ("19mbit", "1.5gbit"), to four significant digits;
//   - a configured rate exactly, for a script tc must reproduce bit for
//     bit: Rate.TC ("19mbit", "1500001bit");
//   - a measured rate, bits per second with two decimals: Bits
//     ("19.95 Mbit/s", "40.2 kbit/s").
//
// Sizes (queues, backlogs, counters) are Size ("68.4K").

// String writes r in bits per second with tc's unit names and at most
// four significant digits: "19mbit", "1.5gbit", "156.2kbit", "0bit".
func (r Rate) String() string {
	bits := r.BitsFloat()
	for _, u := range []struct {
		s string
		v float64
	}{{"pbit", 1e15}, {"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if bits >= u.v {
			return strconv.FormatFloat(bits/u.v, 'g', 4, 64) + u.s
		}
	}
	return fmt.Sprintf("%.0fbit", bits)
}

// TC writes r exactly, in the largest of tc's bit units that divides it:
// what an exported script passes to tc.
func (r Rate) TC() string {
	bits := r.Bits()
	switch {
	case bits == 0:
		return "0bit"
	case bits%1e9 == 0:
		return fmt.Sprintf("%dgbit", bits/1e9)
	case bits%1e6 == 0:
		return fmt.Sprintf("%dmbit", bits/1e6)
	case bits%1e3 == 0:
		return fmt.Sprintf("%dkbit", bits/1e3)
	}
	return fmt.Sprintf("%dbit", bits)
}

// Bits writes a measured rate of bps bits per second: "19.95 Mbit/s",
// "1.00 Gbit/s", "40.2 kbit/s", "999 bit/s".
func Bits(bps float64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.2f Gbit/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.2f Mbit/s", bps/1e6)
	case bps >= 1e3:
		return fmt.Sprintf("%.1f kbit/s", bps/1e3)
	}
	return fmt.Sprintf("%.0f bit/s", bps)
}

// Size writes a byte count in binary units: "1023B", "68.4K", "3.0G".
func Size(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1fG", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1fM", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1fK", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%dB", b)
}
