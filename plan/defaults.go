package plan

import "sluice/units"

// Defaults for what a policy leaves unsaid. They are functions of a
// class's own rates only, so that adding or removing a class never
// changes its siblings.

const (
	// MTU-sized frames as HTB counts them (Ethernet header included).
	frameBytes = 1514

	// burstTime is how long a class may send at full speed after an idle
	// moment. HTB refills tokens when its timer fires; a wakeup late by
	// more than burst/rate loses the tokens beyond the burst, which is
	// why tc's default (about one MTU) undershoots at high rates. One
	// millisecond of the rate absorbs timer and softirq latency while
	// adding at most 1 ms of queue behind a bulk class; from 1gbit,
	// where a late timer costs most, two (burstTimeFast). Measured over
	// 20 runs each (docs/benchmarks.md): with 1 ms the worst run at
	// 2.5gbit reached 0.941 of the rate, with 2 ms at least 0.954 at 1,
	// 2.5 and 5gbit.
	burstTime     = 0.001
	burstTimeFast = 0.002
	fastRate      = 125_000_000 // 1gbit, bytes/s
	// minBurst keeps slow classes able to send a frame and its ACK clock.
	minBurst = 2 * frameBytes

	// quantumTime sizes the DRR quantum (bytes a class sends per round
	// when borrowing) to about 1 ms of its rate, but never below one
	// 64 KB GSO packet: HTB lets a class send a packet whenever its turn
	// comes, even with a negative deficit, so with packets larger than
	// the quantum its "DRR" becomes packet round-robin and classes whose
	// TCP sends bigger GSO packets get more bytes (measured: 8 hosts,
	// Jain 0.92 with a 1514-byte quantum, 1.00 with 64 KB). Explicit
	// quanta never trigger the kernel's r2q warnings.
	quantumTime = 0.001
	minQuantum  = 65536 + frameBytes
	maxQuantum  = 200000

	// bfifoTime is the queue a bfifo leaf holds, at the class's rate,
	// when the kernel has no AQM: about 50 ms. But never less than one
	// maximal GSO/GRO packet (64 KB) plus three frames: a byte-limited
	// FIFO smaller than the packets TCP hands it drops every one of them
	// (measured: 4 TCP flows at 5mbit got 5% of the rate with 31 KB, 95%
	// with 70 KB).
	bfifoTime     = 0.050
	minBfifoBytes = 65536 + 3*frameBytes

	// perHostFlows: per-host fq_codel leaves need far fewer flow slots
	// than a whole link's (one host, not thousands).
	perHostFlows = 64
)

// BurstFor is the default burst (and cburst) for rate in bytes/s.
func BurstFor(rate units.Rate) uint32 {
	t := burstTime
	if rate >= fastRate {
		t = burstTimeFast
	}
	b := uint64(float64(rate) * t)
	if b < minBurst {
		b = minBurst
	}
	if b > 1<<30 {
		b = 1 << 30
	}
	return uint32(b)
}

// QuantumFor is the default quantum for a leaf with rate in bytes/s.
func QuantumFor(rate units.Rate) uint32 {
	q := uint64(float64(rate) * quantumTime)
	return uint32(min(max(q, minQuantum), maxQuantum))
}

// BfifoLimit is the default bfifo limit (bytes) of a class with rate
// and ceil: bfifoTime at its rate, which HTB guarantees, so that the
// queue delays a packet at most that long whenever the class gets its
// share, however far above its rate it may borrow. Sized at the ceil, a
// per-host class with a share of 5 of 40 Mbit/s queued 400 ms (measured
// in the fair-share scenario: 340 ms of TCP RTT, against 109 ms through
// a plain FIFO). Never more than bfifoTime at the ceil, never less than
// minBfifoBytes.
func BfifoLimit(rate, ceil units.Rate) uint32 {
	b := uint64(float64(max(rate, 1)) * bfifoTime)
	b = min(b, uint64(float64(ceil)*bfifoTime))
	return uint32(min(max(b, minBfifoBytes), 1<<30))
}
