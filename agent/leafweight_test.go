package agent

import (
	"testing"

	"sluice/stats"
	"sluice/units"
)

func TestLeafWeight(t *testing.T) {
	rate := units.Rate(250_000 / 8) // 250 kbit/s, in bytes per second
	for _, tc := range []struct {
		name    string
		c       stats.Class
		prev    uint64
		seen    bool
		dt      float64
		want    float64
		message string
	}{
		{"queued", stats.Class{Rate: rate, Backlog: 3000, Bytes: 10}, 10, true, 1, float64(rate), "a queue says it wants its rate"},
		{"first sight", stats.Class{Rate: rate, Bytes: 1e6}, 0, false, 1, 0, "no previous reading: nothing to go by"},
		{"idle", stats.Class{Rate: rate, Bytes: 1e6}, 1e6, true, 1, 0, "sent nothing"},
		{"stray packet", stats.Class{Rate: rate, Bytes: 1e6 + 42}, 1e6, true, 1, 42, "an ARP weighs what it sent, not the class's rate"},
		{"trickle", stats.Class{Rate: rate, Bytes: 1e6 + 5000}, 1e6, true, 2, 2500, "what it sent at"},
		{"busy without a queue", stats.Class{Rate: rate, Bytes: 1e6 + 200_000}, 1e6, true, 1, float64(rate), "a transfer counts at its rate"},
		{"busy, overbooked", stats.Class{Rate: 10 * rate, Bytes: 1e6 + 20_000}, 1e6, true, 1, float64(10 * rate), "a transfer held below its rate still weighs its rate"},
	} {
		c := tc.c
		if got := leafWeight(&c, tc.prev, tc.seen, tc.dt); got != tc.want {
			t.Errorf("%s: leafWeight = %v, want %v (%s)", tc.name, got, tc.want, tc.message)
		}
	}
}
