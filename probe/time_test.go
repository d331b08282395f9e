package probe

import (
	"testing"
	"time"
)

// ICMP timestamps are milliseconds of the UTC day: differences cross
// midnight.
func TestMidnight(t *testing.T) {
	for _, tt := range []struct {
		b, a uint32
		want time.Duration
	}{
		{1000, 990, 10 * time.Millisecond},
		{5, day - 5, 10 * time.Millisecond},
		{day - 5, 5, -10 * time.Millisecond},
	} {
		if got := msDiff(tt.b, tt.a); got != tt.want {
			t.Errorf("msDiff(%d, %d) = %v; want %v", tt.b, tt.a, got, tt.want)
		}
	}
	if got := msOfDay(time.Date(2026, 1, 1, 23, 59, 59, 999e6, time.UTC)); got != day-1 {
		t.Errorf("msOfDay(23:59:59.999) = %d", got)
	}
}
