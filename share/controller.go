package share

import (
	"math"
	"slices"
	"time"

	"sluice/units"
)

// DefaultApplyAbove is seed 000's delayed-limit threshold, used when a
// Controller has none (the policy's default is the same).
const DefaultApplyAbove = 0.8

// hardHeadroom is what a Hard controller leaves a child over its
// usage: more than 1/DefaultApplyAbove, so that a steady child sits
// below the held-back threshold.
const hardHeadroom = 1.5

// windowFrames is how many full-size frames a child's limit must let
// through in the window its usage is judged over: a limit of a few
// frames a quantum reads as 0, 1 or 2 packets from one quantum to the
// next, and a TCP flow waiting on its retransmission timer as idle. A
// child held to a limit slower than that is judged over the longer
// window (at most maxWindow): its usage there, held back if it was in
// any quantum of it. Without it, a 25kbit default class the controller
// held to its 18.7 kbit/s share (a frame every 650 ms) was released to
// its ceil at every quantum without a packet, sent at the ceil's rate,
// was cut again, lost what it had sent, and went silent for seconds
// (measured: 25% of its share, or none, in the 6.1 lane).
const (
	windowFrames = 8
	frameBytes   = 1514
	maxWindow    = 10 * time.Second
)

// Child is a class under a controller, as the policy gives it.
type Child struct {
	Name   string
	Weight float64
	// Rate is the class's guarantee: a limit never goes below it.
	Rate units.Rate
	// Ceil is the most the policy lets it use: the limit when none is
	// applied, and the bound of every limit.
	Ceil units.Rate
	// Prod marks a prio 0 class: never limited; what it uses comes off
	// the capacity the others share.
	Prod bool
	// Capped: HTB cannot weigh what it borrows (it is lighter than its
	// quanta follow: plan notes it), so an assuring controller holds it
	// to its share with its ceil too, not only its rate. Left to borrow,
	// such a child takes at least a packet per turn of whatever its
	// siblings leave for an instant (measured: a 25kbit default class
	// beside 1, 2 and 4mbit got 70 kbit/s for its 37 on Debian's 6.12).
	Capped bool
	// Standby (Hard controllers): the least limit of a child that sent
	// nothing over the quantum, instead of Rate. A balanced shard's
	// floor keeps it alive; its standby lets hosts that start on it
	// send at a useful rate until the next step sees them. At the
	// floor, four TCP flows starting in a 20mbit tree's idle shard
	// queued for seconds in their leaves, backed off, and had not
	// recovered two seconds after the shard got its share (measured:
	// its hosts 15% under the reference, every run).
	Standby units.Rate
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
	// Usage is the rate the child sent at over the quantum, or over the
	// longer window a slow limit is judged on (windowFrames).
	Usage units.Rate
	// Demand is what the step counted it as wanting: its usage, or its
	// ceil when it was held back (Hungry).
	Demand units.Rate
	Hungry bool
	// Share is its weighted max-min share of the capacity; Limit that
	// share kept between its rate and ceil.
	Share, Limit units.Rate
	// Applied: the limit is in force (the child used at least
	// ApplyAbove of it); otherwise the child may use up to its ceil.
	Applied bool
	// Rate and Ceil are what the class's rate and ceil must be now. A
	// limiting controller holds an applied Limit as the ceil; an
	// assuring one (Controller.Assure) gives it as the rate and leaves
	// the ceil the policy's. Otherwise both are the policy's.
	Rate, Ceil units.Rate
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
	// Capacity is what the children share, before prod's use is taken
	// off.
	Capacity   units.Rate
	ApplyAbove float64
	// Assure: a child's share is given as its guaranteed rate (HTB's
	// rate), not as a cap (its ceil). The others then borrow what a
	// child leaves of its share for an instant (a TCP flow backing off),
	// where caps that add up to the capacity leave it idle (measured: 4
	// to 8% of the link). Only for children whose rates together the
	// parent guarantees (HTB serves a class below its rate without
	// asking its parent), and with no cap below the parent: borrowing
	// goes up to the parent's ceil. Each child's own rate is reserved
	// for it in the split, so the rates never add up to more than the
	// capacity. ApplyAbove does not apply: a share given as a rate
	// holds nobody back.
	Assure bool
	// Hard: the limits are hard caps (a balanced shard's rate: its root
	// class has no parent to borrow from), so a child held at its cap
	// may show no queue at the instant of a reading. One using
	// ApplyAbove of its limit counts as held back, and one that is not
	// is left hardHeadroom over its usage (with Assure).
	Hard bool
	// Bound: the capacity is a cap below what the parent lets the
	// children take (sharing's cap), which only the limits hold. A
	// child given no limit (its demand fits) is then still held, by its
	// ceil, to its open share: what it would get if it wanted its ceil,
	// the others wanting what they do. It grows to its due at once, and
	// into what the others leave, but not past the cap. Released to its
	// policy ceil instead, a tenant whose TCP flows were still ramping
	// at a reading took the parent's spare for a quantum (measured:
	// prod-nonprod's b at 16 to 19 Mbit/s for a second where the 80%
	// cap gives it 14.6, the tenants together 26 for the cap's 22).
	// Using ApplyAbove of it counts as held back, as of an applied
	// limit: a tenant close to its open share without a queue at the
	// reading otherwise read as wanting only its usage, and its sibling
	// kept the difference for another quantum.
	Bound bool

	lastAt  time.Time
	applied []float64 // the limit in force, 0 for none
	started bool
	// past holds each child's readings of up to maxWindow ago, oldest
	// first, for a slow limit's window (windowFrames).
	past [][]pastReading
}

type pastReading struct {
	at time.Time
	Reading
}

// window returns child i's usage (bytes/s) over the window its applied
// limit needs, ending with reading r at now, and whether it was held
// back in any quantum of it; dt is the last quantum, the window's least.
func (c *Controller) window(i int, r Reading, now time.Time, dt float64) (usage float64, queued bool) {
	w := dt
	if lim := c.applied[i]; lim > 0 {
		w = max(w, windowFrames*frameBytes/lim)
	}
	w = min(w, maxWindow.Seconds())
	ps := c.past[i]
	from := len(ps) - 1 // the last quantum's start
	for from > 0 && now.Sub(ps[from].at).Seconds() < w {
		from--
	}
	queued = r.Queued
	for _, p := range ps[from+1:] {
		queued = queued || p.Queued
	}
	p := ps[from]
	if span := now.Sub(p.at).Seconds(); span > 0 && r.Bytes >= p.Bytes {
		usage = float64(r.Bytes-p.Bytes) / span
	}
	return usage, queued
}

// remember adds the readings at now to the past, and forgets those no
// window reaches (one older than maxWindow stays: a window's start).
func (c *Controller) remember(rs []Reading, now time.Time) {
	if len(c.past) != len(rs) {
		c.past = make([][]pastReading, len(rs))
	}
	for i, r := range rs {
		ps := c.past[i]
		if n := len(ps); n > 0 && r.Bytes < ps[n-1].Bytes {
			ps = ps[:0] // the class was made again: measure afresh
		}
		ps = append(ps, pastReading{now, r})
		drop := 0
		for drop+1 < len(ps) && now.Sub(ps[drop+1].at) >= maxWindow {
			drop++
		}
		c.past[i] = append(ps[:0], ps[drop:]...)
	}
}

// Step takes the readings (one per child, in order) at now and returns
// the decisions, or nil when the clock did not move, and on the first
// call (no quantum measured yet) of a limiting controller. An assuring
// one starts from the split as if every child wanted its ceil: a rate
// given to an idle child is borrowed by the others, so guessing high
// costs nothing, and children busy from the start are not cut from
// HTB's split to the controller's a quantum later (measured: TCP took
// a second to recover from such a cut).
func (c *Controller) Step(now time.Time, rs []Reading) []Decision {
	if len(rs) != len(c.Children) {
		return nil
	}
	if c.applied == nil {
		c.applied = make([]float64, len(c.Children))
	}
	first := !c.started
	if first {
		c.lastAt, c.started = now, true
		c.remember(rs, now)
		if !c.Assure {
			return nil
		}
	}
	dt := now.Sub(c.lastAt).Seconds()
	if dt <= 0 && !first {
		return nil
	}
	above := c.ApplyAbove
	if above <= 0 || above > 1 {
		above = DefaultApplyAbove
	}
	// The arithmetic is in bytes per second, as floats: shares are
	// fractions of the capacity, rounded once, in the decisions.
	ds := make([]step, len(c.Children))
	capacity := float64(c.Capacity)
	var ms []Member
	var floors []float64
	var idx []int
	for i, ch := range c.Children {
		d := &ds[i]
		rate, ceil := float64(ch.Rate), float64(ch.Ceil)
		queued := rs[i].Queued
		if !first {
			d.usage, queued = c.window(i, rs[i], now, dt)
		}
		if ch.Prod {
			if c.Assure {
				capacity -= max(d.usage, rate) // its rate is its at any instant
			} else {
				capacity -= d.usage
			}
			d.demand, d.share, d.limit, d.rate, d.ceil = d.usage, d.usage, ceil, rate, ceil
			continue
		}
		// An assured child may borrow past its rate, so only a queue
		// says it is held back.
		d.hungry = first || queued || (!c.Assure || c.Hard) && c.applied[i] > 0 && d.usage >= above*c.applied[i]
		d.demand = d.usage
		if c.Hard {
			// Room to grow without a queue: a child using less than
			// ApplyAbove of its cap stays below it, and is not held.
			d.demand = d.usage * hardHeadroom
		}
		if d.hungry {
			d.demand = ceil
		}
		want := min(d.demand, ceil)
		if c.Assure {
			want = max(want, rate)
		}
		ms = append(ms, Member{Weight: ch.Weight, Demand: want})
		floors = append(floors, rate)
		idx = append(idx, i)
	}
	// Rates first, then the rest by weight: HTB's split, and the
	// reference's. A shard's rate is no guarantee of the policy's but a
	// floor that keeps the shard alive: shards share by weight alone
	// (the hosts active in each), as the reference shares their hosts.
	split := func(capacity float64, ms []Member) []float64 {
		if c.Hard {
			return MaxMin(capacity, ms)
		}
		return MaxMinOver(capacity, ms, floors)
	}
	shares := split(max(capacity, 0), ms)
	// A capped child's ceil is its share as if no idle child reserved
	// its rate: it may take what those leave, never what busy siblings
	// are due.
	var open []float64
	if c.Assure && slices.ContainsFunc(c.Children, func(ch Child) bool { return ch.Capped }) {
		wants := make([]Member, len(ms))
		for k, i := range idx {
			wants[k] = Member{Weight: ms[k].Weight, Demand: min(ds[i].demand, float64(c.Children[i].Ceil))}
		}
		open = split(max(capacity, 0), wants)
	}
	for k, i := range idx {
		ch, d := c.Children[i], &ds[i]
		rate, ceil := float64(ch.Rate), float64(ch.Ceil)
		d.share = shares[k]
		d.limit = math.Min(math.Max(d.share, rate), ceil)
		if c.Hard && !d.hungry && d.usage == 0 && float64(ch.Standby) > d.limit {
			d.limit = math.Min(float64(ch.Standby), ceil)
		}
		// Only a child that wants more than its share is held to it:
		// one whose whole demand fits has a share equal to its usage
		// when the link is full, and a limit there would be the very
		// loop delayed limits break. Delayed limits: a child not held
		// back gets its limit only once it uses ApplyAbove of it; one
		// held back gets it at once (its usage right after a cut is
		// TCP backing off, not a lower demand: measured, limits applied
		// on usage alone flapped every other quantum).
		d.applied = d.limit < ceil && d.demand > d.share && (d.hungry || d.usage >= above*d.limit)
		d.rate, d.ceil = rate, ceil
		c.applied[i] = 0
		switch {
		case c.Assure:
			// Every child gets its share as its rate, including one
			// whose demand fits: left at its policy rate it would only
			// borrow, beside children whose rates take the whole
			// capacity (measured: a child under its share then got a
			// third of what was left). The shares add up to the
			// capacity, so a rate nobody uses is borrowed, never idle.
			d.applied, d.rate = true, d.limit
			c.applied[i] = d.limit
			if ch.Capped && open != nil && d.demand > d.share {
				d.ceil = min(max(open[k], d.rate), ceil)
			}
		case d.applied:
			d.ceil = d.limit
			c.applied[i] = d.limit
		case c.Bound:
			d.ceil = math.Min(math.Max(openShare(split, max(capacity, 0), ms, k, ceil), rate), ceil)
			c.applied[i] = d.ceil
		}
	}
	c.lastAt = now
	if !first {
		c.remember(rs, now)
	}
	out := make([]Decision, len(ds))
	for i, d := range ds {
		out[i] = Decision{Name: c.Children[i].Name, Usage: rate(d.usage), Demand: rate(d.demand), Hungry: d.hungry,
			Share: rate(d.share), Limit: rate(d.limit), Applied: d.applied, Rate: rate(d.rate), Ceil: rate(d.ceil)}
	}
	return out
}

// openShare is member k's share under split if it wanted want, the
// others wanting what they do.
func openShare(split func(float64, []Member) []float64, capacity float64, ms []Member, k int, want float64) float64 {
	open := slices.Clone(ms)
	open[k].Demand = want
	return split(capacity, open)[k]
}

// step is a Decision as Step works it out, in bytes per second.
type step struct {
	usage, demand, share, limit, rate, ceil float64
	hungry, applied                         bool
}

// rate rounds x bytes per second to a Rate.
func rate(x float64) units.Rate {
	if !(x > 0) {
		return 0
	}
	return units.Rate(math.Round(x))
}

// Reset forgets the measurements and limits (the classes were made
// again, or the policy changed).
func (c *Controller) Reset() {
	c.started, c.applied, c.past = false, nil, nil
}
