package share

import (
	"math"
	"time"
)

// DefaultApplyAbove is seed 000's delayed-limit threshold, used when a
// Controller has none (the policy's default is the same).
const DefaultApplyAbove = 0.8

// Child is a class under a controller, as the policy gives it. Rates are
// bits per second.
type Child struct {
	Name   string
	Weight float64
	// Rate is the class's guarantee: a limit never goes below it.
	Rate float64
	// Ceil is the most the policy lets it use: the limit when none is
	// applied, and the bound of every limit.
	Ceil float64
	// Prod marks a prio 0 class: never limited; what it uses comes off
	// the capacity the others share.
	Prod bool
}

// Reading is a child's counters at one instant.
type Reading struct {
	// Bytes sent so far (a counter; a decrease means the class was
	// made again, and restarts the measurement).
	Bytes uint64
	// Queued: the class had a standing queue (backlog) at the reading,
	// or dropped packets since the last one: it is held back.
	Queued bool
}

// Decision is what a step found and decided for one child.
type Decision struct {
	Name string
	// Usage is the rate the child sent at over the quantum.
	Usage float64
	// Demand is what the step counted it as wanting: its usage, or its
	// ceil when it was held back (Hungry).
	Demand float64
	Hungry bool
	// Share is its weighted max-min share of the capacity; Limit that
	// share kept between its rate and ceil.
	Share, Limit float64
	// Applied: the limit is in force (the child used at least
	// ApplyAbove of it); otherwise the child may use up to its ceil.
	Applied bool
	// Ceil is what the class's ceil must be now: Limit when applied,
	// else the policy's ceil.
	Ceil float64
}

// Controller runs seed 000's loop for one parent's children: every
// quantum, measure each child's demand, split the capacity by weighted
// max-min fairness and decide each child's limit, with delayed limits
// (a limit is applied only while the child uses at least ApplyAbove of
// it, so a child whose demand jumps is not held at its old share).
//
// A limit is applied only to a child that wants more than its share
// (the others are using less than theirs, and need none), and, unless
// the child is held back, only once it uses ApplyAbove of it.
//
// Demand is the usage of the last quantum, except for a child that was
// held back (a standing queue, drops, or at least ApplyAbove of an
// applied limit used): its usage says only what it was allowed, so it
// counts as wanting up to its ceil. Without this a saturated link would
// keep whatever split it started with: every child's usage would equal
// its share.
type Controller struct {
	Children []Child
	// Capacity is what the children share, in bits/s, before prod's use
	// is taken off.
	Capacity   float64
	ApplyAbove float64

	last    []Reading
	lastAt  time.Time
	applied []float64 // the limit in force, 0 for none
	started bool
}

// Step takes the readings (one per child, in order) at now and returns
// the decisions, or nil on the first call (no quantum measured yet) or
// when the clock did not move.
func (c *Controller) Step(now time.Time, rs []Reading) []Decision {
	if len(rs) != len(c.Children) {
		return nil
	}
	if c.applied == nil {
		c.applied = make([]float64, len(c.Children))
	}
	if !c.started {
		c.last, c.lastAt, c.started = append([]Reading(nil), rs...), now, true
		return nil
	}
	dt := now.Sub(c.lastAt).Seconds()
	if dt <= 0 {
		return nil
	}
	above := c.ApplyAbove
	if above <= 0 || above > 1 {
		above = DefaultApplyAbove
	}
	ds := make([]Decision, len(c.Children))
	capacity := c.Capacity
	var ms []Member
	var idx []int
	for i, ch := range c.Children {
		d := &ds[i]
		d.Name = ch.Name
		if rs[i].Bytes >= c.last[i].Bytes {
			d.Usage = float64(rs[i].Bytes-c.last[i].Bytes) * 8 / dt
		}
		if ch.Prod {
			capacity -= d.Usage
			d.Demand, d.Share, d.Limit, d.Ceil = d.Usage, d.Usage, ch.Ceil, ch.Ceil
			continue
		}
		d.Hungry = rs[i].Queued || c.applied[i] > 0 && d.Usage >= above*c.applied[i]
		d.Demand = d.Usage
		if d.Hungry {
			d.Demand = ch.Ceil
		}
		ms = append(ms, Member{Weight: ch.Weight, Demand: min(d.Demand, ch.Ceil)})
		idx = append(idx, i)
	}
	shares := MaxMin(max(capacity, 0), ms)
	for k, i := range idx {
		ch, d := c.Children[i], &ds[i]
		d.Share = shares[k]
		d.Limit = math.Min(math.Max(d.Share, ch.Rate), ch.Ceil)
		// Only a child that wants more than its share is held to it:
		// one whose whole demand fits has a share equal to its usage
		// when the link is full, and a limit there would be the very
		// loop delayed limits break. Delayed limits: a child not held
		// back gets its limit only once it uses ApplyAbove of it; one
		// held back gets it at once (its usage right after a cut is
		// TCP backing off, not a lower demand: measured, limits applied
		// on usage alone flapped every other quantum).
		d.Applied = d.Limit < ch.Ceil && d.Demand > d.Share && (d.Hungry || d.Usage >= above*d.Limit)
		d.Ceil = ch.Ceil
		c.applied[i] = 0
		if d.Applied {
			d.Ceil = d.Limit
			c.applied[i] = d.Limit
		}
	}
	c.last, c.lastAt = append(c.last[:0], rs...), now
	return ds
}

// Reset forgets the measurements and limits (the classes were made
// again, or the policy changed).
func (c *Controller) Reset() {
	c.started, c.applied, c.last = false, nil, nil
}
