package tc

import (
	"sluice/units"

	"fmt"
	"os"
	"sync"
)

// The kernel keeps HTB bursts as the time to send them at the class rate,
// in "ticks" (64 ns on every kernel since 2.6.24). tc(8) converts with
// floating point and two truncations; sluice does the same arithmetic so
// that a class it creates and the same class created by `tc -batch` from
// sluice's export are bit-for-bit identical.

var (
	tickOnce     sync.Once
	tickInUsec   = 15.625 // 1000 ns/us / 64 ns/tick
	clockFactor  = 1.0
	timeUnitsSec = 1000000.0
)

func loadPsched() {
	tickOnce.Do(func() {
		b, err := os.ReadFile("/proc/net/psched")
		if err != nil {
			return
		}
		var t2us, us2t, clockRes uint32
		if n, _ := fmt.Sscanf(string(b), "%08x%08x%08x", &t2us, &us2t, &clockRes); n != 3 || us2t == 0 {
			return
		}
		if clockRes == 1000000000 {
			t2us = us2t
		}
		clockFactor = float64(clockRes) / timeUnitsSec
		tickInUsec = float64(t2us) / float64(us2t) * clockFactor
	})
}

// XmitTicks is tc_calc_xmittime(): the ticks needed to send size bytes at
// rate bytes per second.
func XmitTicks(rate units.Rate, size uint32) uint32 {
	loadPsched()
	if rate == 0 {
		return 0
	}
	us := uint32(timeUnitsSec * (float64(size) / float64(rate)))
	return uint32(float64(us) * tickInUsec)
}

// TicksToBytes inverts XmitTicks approximately (for display).
func TicksToBytes(rate units.Rate, ticks uint32) uint32 {
	loadPsched()
	us := float64(ticks) / tickInUsec
	return uint32(us * float64(rate) / timeUnitsSec)
}

// BurstChanged reports whether class n's burst (and cburst) in bytes
// differ from what the kernel holds for o. The kernel keeps a burst as
// the time it takes at the class's rate, so a rate change alone changes
// the ticks and not the burst: compared at o's own rate.
func BurstChanged(o, n *Class) (burst, cburst bool) {
	return o.BufferTicks != XmitTicks(o.Rate, n.Burst), o.CbufferTicks != XmitTicks(o.Ceil, n.Cburst)
}
