package stats

import (
	"testing"

	"sluice/units"
)

func TestEDTBacklog(t *testing.T) {
	for _, c := range []struct {
		tnext, now uint64
		cap        units.Rate
		want       uint32
	}{
		{0, 1e9, 1e6, 0},                     // idle since boot
		{1e9, 2e9, 1e6, 0},                   // its clock behind now: nothing waits
		{2e9, 2e9, 1e6, 0},                   // exactly now
		{2e9 + 1e8, 2e9, 500_000, 50_000},    // 100 ms ahead at 4 mbit/s
		{2e9 + 1e8, 2e9, 0, 0},               // no cap: not paced
		{2e9 + 10e9, 2e9, 1.25e9, 1<<32 - 1}, // 10 s at 10 Gbit/s: held at the field's size
		{2e9 + 327e6, 2e9, 4_669, 1_526},     // one frame at 37 kbit/s
	} {
		if got := edtBacklog(c.tnext, c.now, c.cap); got != c.want {
			t.Errorf("edtBacklog(%d, %d, %d) = %d, want %d", c.tnext, c.now, c.cap, got, c.want)
		}
	}
	if m := monotonic(); m == 0 || m == ^uint64(0) {
		t.Errorf("monotonic() = %d", m)
	}
}
