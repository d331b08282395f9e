package bpf

import (
	"fmt"
	"math/bits"

	"sluice/units"
)

// Clock is the Go reference of one EDT clock (an aggregate's or the
// direction's pool): what the program keeps in struct pace.
type Clock struct {
	TNext uint64 // ns at which the next byte may leave
	Drops uint64 // packets dropped beyond the horizon (aggregates)
	Rate  uint64 // bytes/s it last ran at: a raise rescales its lead
}

func (c *Clock) reserve(now, burst, delay, rate uint64) uint64 {
	floor := uint64(0)
	if now > burst {
		floor = now - burst
	}
	if c.Rate != rate {
		if c.Rate != 0 && rate > c.Rate && c.TNext > now {
			r := (rate << 16) / c.Rate
			c.TNext = now + ((c.TNext-now)<<16)/r
		}
		c.Rate = rate
	}
	c.TNext = max(c.TNext, floor)
	start := c.TNext
	c.TNext += delay
	return start
}

// Pacing is the Go reference of the EDT program's arithmetic on one
// CPU (pace() in classifier.c), so that tests can check the program
// against it packet by packet.
type Pacing struct {
	Horizon uint64 // ns
	// Pool is the direction's shared clock at PoolRate (nil: none).
	Pool      *Clock
	PoolRate  units.Rate
	PoolBurst uint64
}

// Stamp returns the departure time of a packet of n bytes seen at now,
// whose own timestamp (egress: TCP's pacing) is ts, in aggregate agg of
// the given rate (0: not paced), burst and kind, or drop when it would
// leave later than now + Horizon. A departure at or before now means
// "at once": the program leaves skb->tstamp alone.
//
// horizon, when not 0, is the aggregate's own (Target.Horizon).
func (p *Pacing) Stamp(now, ts uint64, n uint32, agg *Clock, rate units.Rate, burst, horizon uint64, prod bool) (depart uint64, drop bool) {
	if horizon == 0 {
		horizon = p.Horizon
	}
	depart = max(now, ts)
	if rate == 0 {
		return depart, false
	}
	delay := uint64(n) * 1e9 / uint64(rate)
	depart = max(depart, agg.reserve(now, burst, delay, uint64(rate)))
	var pdelay uint64
	if p.Pool != nil && p.PoolRate != 0 {
		pdelay = uint64(n) * 1e9 / uint64(p.PoolRate)
		if start := p.Pool.reserve(now, p.PoolBurst, pdelay, uint64(p.PoolRate)); !prod {
			depart = max(depart, start)
		}
	}
	if depart > now+horizon {
		agg.TNext -= delay
		if p.Pool != nil && p.PoolRate != 0 {
			p.Pool.TNext -= pdelay
		}
		agg.Drops++
		return 0, true
	}
	return depart, false
}

// DelayBucket is the histogram bucket the program counts a delay of d
// ns in: 0 for none, else 1 + the bit length of d/1024, capped.
func DelayBucket(d uint64) int {
	if d == 0 {
		return 0
	}
	return min(1+bits.Len64(d>>10), DelayBuckets-1)
}

// DelayBucketBound is the upper bound (ns, exclusive) of bucket k's
// delays; the last bucket has none (0).
func DelayBucketBound(k int) uint64 {
	if k <= 0 || k >= DelayBuckets-1 {
		return 0
	}
	return 1024 << (k - 1)
}

// Paces reads the EDT state (departure clock, horizon drops) of the
// aggregates with the given counter indexes.
func (p *Program) Paces(idx []uint32) (map[uint32]Pace, error) {
	out := make(map[uint32]Pace, len(idx))
	for _, i := range idx {
		if i >= p.CounterCap {
			continue
		}
		var v Pace
		if err := p.objs.Paces.Lookup(i, &v); err != nil {
			return nil, fmt.Errorf("bpf classifier: read EDT state %d: %w", i, err)
		}
		out[i] = v
	}
	return out, nil
}

// Delays returns delay histogram h summed over CPUs, and the sum of the
// delays it counted (ns).
func (p *Program) Delays(h uint16) (buckets [DelayBuckets]uint64, sum uint64, err error) {
	if uint32(h) >= p.HistCap {
		return buckets, 0, nil
	}
	var per []ClassifierDelayHist
	if err := p.objs.Delays.Lookup(uint32(h), &per); err != nil {
		return buckets, 0, fmt.Errorf("bpf classifier: read delay histogram %d: %w", h, err)
	}
	for _, c := range per {
		for k, v := range c.B {
			buckets[k] += v
		}
		sum += c.Sum
	}
	return buckets, sum, nil
}
