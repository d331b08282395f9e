package autorate

import (
	"errors"
	"fmt"
	"math"
	"time"

	"sluice/units"
)

// Config is one direction's controller. Min, Base and Max are required;
// a zero in any other field takes its default (cake-autorate v3.5's).
type Config struct {
	// Min and Max bound the rate; Base is where it starts and where it
	// drifts back to when the link is not busy.
	Min, Base, Max units.Rate

	// DelayThreshold: a sample this far above its reflector's baseline
	// (plus one full packet's serialisation at the current rate) counts
	// toward bufferbloat. 30 ms.
	DelayThreshold time.Duration
	// Window and BloatCount: bufferbloat is BloatCount of the last
	// Window samples (all reflectors pooled) above the threshold. 6, 3.
	Window, BloatCount int
	// DecreaseDelay: an average excess delay at or above this makes the
	// largest decrease (DecreaseMax); at the threshold, the smallest
	// (DecreaseMin). 60 ms.
	DecreaseDelay time.Duration
	// DecreaseMin and DecreaseMax are the factors a decrease multiplies
	// the rate by, the gentlest and the steepest. 0.99, 0.75.
	DecreaseMin, DecreaseMax float64
	// PassedDecrease: a decrease goes at least to this fraction of what
	// the shaper passed, when that is lower (and above Min): a link that
	// carries less than the rate says its capacity outright. 0.9.
	PassedDecrease float64
	// IncreaseDelay: a busy link whose average excess delay is at or
	// below this grows by the most (IncreaseMax), one at the threshold
	// not at all. 10 ms.
	IncreaseDelay time.Duration
	// IncreaseMax is the largest growth per sample, as a fraction. 0.04.
	IncreaseMax float64
	// HighLoad: the link is busy when what the shaper passed is at least
	// this fraction of its rate. 0.75.
	HighLoad float64
	// IdleRate: below this the link is idle. 2 Mbit/s.
	IdleRate units.Rate
	// Drift is how far the rate moves toward Base each DriftEvery when
	// the link is neither busy nor bloated, as a fraction. 0.01, 1 s.
	Drift      float64
	DriftEvery time.Duration
	// BloatEvery: after a decrease, the next decrease or increase waits
	// this long (the delay takes a while to answer the new rate). 300 ms.
	BloatEvery time.Duration
	// LoadEvery is the shortest span the passed rate is measured over.
	// 200 ms.
	LoadEvery time.Duration
	// StallAfter: no reply for this long and the rate holds. 2 s.
	StallAfter time.Duration
	// StallRate: below this, with no replies, the link is stalled (a
	// blackout) rather than its reflectors dead. 10 kbit/s.
	StallRate units.Rate
	// BaselineUp and BaselineDown are the weights a sample above and
	// below its reflector's baseline moves it by: slowly up, so that a
	// queue is not mistaken for the path, quickly down. 0.001, 0.9.
	BaselineUp, BaselineDown float64
	// DeltaAlpha weighs each sample's excess delay into the average.
	// 0.095.
	DeltaAlpha float64
}

// Defaults is Config's defaults for the fields a zero leaves open.
var Defaults = Config{
	DelayThreshold: 30 * time.Millisecond,
	Window:         6,
	BloatCount:     3,
	DecreaseDelay:  60 * time.Millisecond,
	DecreaseMin:    0.99,
	DecreaseMax:    0.75,
	PassedDecrease: 0.9,
	IncreaseDelay:  10 * time.Millisecond,
	IncreaseMax:    0.04,
	HighLoad:       0.75,
	IdleRate:       units.FromBits(2e6),
	Drift:          0.01,
	DriftEvery:     time.Second,
	BloatEvery:     300 * time.Millisecond,
	LoadEvery:      200 * time.Millisecond,
	StallAfter:     2 * time.Second,
	StallRate:      units.FromBits(10e3),
	BaselineUp:     0.001,
	BaselineDown:   0.9,
	DeltaAlpha:     0.095,
}

// ConfigFor is a configuration with the defaults, and the delays that
// scale the decrease and the increase at the defaults' proportions to
// threshold (a third of it: the most growth; twice it: the steepest
// decrease).
func ConfigFor(lo, base, hi units.Rate, threshold time.Duration) Config {
	c := Config{Min: lo, Base: base, Max: hi, DelayThreshold: threshold}
	if threshold > 0 {
		c.IncreaseDelay = threshold * Defaults.IncreaseDelay / Defaults.DelayThreshold
		c.DecreaseDelay = threshold * Defaults.DecreaseDelay / Defaults.DelayThreshold
	}
	return c
}

// withDefaults fills c's zero fields from Defaults and checks it.
func (c Config) withDefaults() (Config, error) {
	d := Defaults
	pick := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	pickF := func(v *float64, def float64) {
		if *v == 0 {
			*v = def
		}
	}
	pick(&c.DelayThreshold, d.DelayThreshold)
	pick(&c.DecreaseDelay, d.DecreaseDelay)
	pick(&c.IncreaseDelay, d.IncreaseDelay)
	pick(&c.DriftEvery, d.DriftEvery)
	pick(&c.BloatEvery, d.BloatEvery)
	pick(&c.LoadEvery, d.LoadEvery)
	pick(&c.StallAfter, d.StallAfter)
	pickF(&c.DecreaseMin, d.DecreaseMin)
	pickF(&c.DecreaseMax, d.DecreaseMax)
	pickF(&c.PassedDecrease, d.PassedDecrease)
	pickF(&c.IncreaseMax, d.IncreaseMax)
	pickF(&c.HighLoad, d.HighLoad)
	pickF(&c.Drift, d.Drift)
	pickF(&c.BaselineUp, d.BaselineUp)
	pickF(&c.BaselineDown, d.BaselineDown)
	pickF(&c.DeltaAlpha, d.DeltaAlpha)
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.BloatCount == 0 {
		c.BloatCount = d.BloatCount
	}
	if c.IdleRate == 0 {
		c.IdleRate = d.IdleRate
	}
	if c.StallRate == 0 {
		c.StallRate = d.StallRate
	}
	var errs []error
	if c.Min == 0 || c.Min > c.Base || c.Base > c.Max {
		errs = append(errs, fmt.Errorf("want 0 < min <= base <= max, have min %s, base %s, max %s", c.Min, c.Base, c.Max))
	}
	if c.BloatCount > c.Window {
		errs = append(errs, fmt.Errorf("bloat count %d is more than the window of %d samples", c.BloatCount, c.Window))
	}
	if c.IncreaseDelay >= c.DelayThreshold || c.DecreaseDelay <= c.DelayThreshold {
		errs = append(errs, fmt.Errorf("want increase delay %v < delay threshold %v < decrease delay %v", c.IncreaseDelay, c.DelayThreshold, c.DecreaseDelay))
	}
	if !(0 < c.DecreaseMax && c.DecreaseMax <= c.DecreaseMin && c.DecreaseMin <= 1) {
		errs = append(errs, fmt.Errorf("want 0 < steepest decrease %g <= gentlest %g <= 1", c.DecreaseMax, c.DecreaseMin))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"increase", c.IncreaseMax}, {"passed decrease", c.PassedDecrease}, {"high load", c.HighLoad}, {"drift", c.Drift}, {"baseline up", c.BaselineUp}, {"baseline down", c.BaselineDown}, {"delta alpha", c.DeltaAlpha}} {
		if f.v < 0 || f.v > 1 {
			errs = append(errs, fmt.Errorf("%s %g: want a fraction between 0 and 1", f.name, f.v))
		}
	}
	return c, errors.Join(errs...)
}

// State is what the controller last found the link doing.
type State int

const (
	// Idle: the shaper passes less than IdleRate; the rate drifts to base.
	Idle State = iota
	// Low: busy but under HighLoad of the rate; the rate drifts to base.
	Low
	// High: at least HighLoad of the rate passes and the delay is low:
	// the rate grows.
	High
	// Bloat: recent samples lie above the threshold: the rate falls.
	Bloat
	// Stall: no replies and (almost) no traffic: a blackout; the rate
	// holds.
	Stall
	// NoReplies: traffic passes but no reflector answers: the rate holds
	// and the reflectors are suspect.
	NoReplies
)

var stateNames = [...]string{"idle", "low", "high", "bloat", "stall", "no-replies"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Sample is one reflector's reply: the delay it measured (one way, or
// half the round trip) and when it came.
type Sample struct {
	Reflector string
	At        time.Time
	Delay     time.Duration
}

// Decision is the controller's verdict at a moment: the rate to shape
// at, whether it changed, and why.
type Decision struct {
	Rate    units.Rate
	Changed bool
	State   State
	// Passed is what the shaper passed, bits per second, over the last
	// load span; AvgDelta the average excess delay of the samples.
	Passed   float64
	AvgDelta time.Duration
}

// Controller is one direction's rate controller. It is not safe for
// concurrent use: one goroutine feeds it.
type Controller struct {
	cfg  Config
	rate float64 // bytes per second

	baseline map[string]float64 // ns
	window   []bool             // the last cfg.Window samples: above the threshold
	next     int
	filled   int
	avgDelta float64 // ns
	fresh    bool    // a sample since the last decision

	lastReply  time.Time
	stalled    bool
	lastChange time.Time // the last decrease
	lastDrift  time.Time

	loadAt    time.Time
	loadBytes uint64
	passed    float64 // bits per second
	loaded    bool
}

// New returns a controller at cfg's base rate, its clock starting at
// now.
func New(cfg Config, now time.Time) (*Controller, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: c, rate: float64(c.Base), baseline: map[string]float64{}, window: make([]bool, c.Window),
		lastReply: now, lastDrift: now, lastChange: now.Add(-c.BloatEvery)}, nil
}

// Config is the controller's configuration, defaults filled.
func (c *Controller) Config() Config { return c.cfg }

// Rate is the rate in force.
func (c *Controller) Rate() units.Rate { return units.Rate(math.Round(c.rate)) }

// Baselines is each reflector's baseline delay.
func (c *Controller) Baselines() map[string]time.Duration {
	out := make(map[string]time.Duration, len(c.baseline))
	for r, b := range c.baseline {
		out[r] = time.Duration(b)
	}
	return out
}

// Forget drops a reflector's baseline (it was replaced).
func (c *Controller) Forget(reflector string) { delete(c.baseline, reflector) }

// Delay folds one reply in. A reply later than StallAfter is no sample
// of the queue but of an outage (replies held through a blackout come
// back at once, seconds late): it counts as a reply, not as bloat.
func (c *Controller) Delay(s Sample) {
	c.lastReply = s.At
	d := float64(s.Delay)
	if s.Delay >= c.cfg.StallAfter {
		return
	}
	b, ok := c.baseline[s.Reflector]
	if !ok {
		b = d
	}
	if d >= b {
		b += c.cfg.BaselineUp * (d - b)
	} else {
		b += c.cfg.BaselineDown * (d - b)
	}
	c.baseline[s.Reflector] = b
	delta := d - b
	c.avgDelta += c.cfg.DeltaAlpha * (delta - c.avgDelta)
	// One full packet's serialisation at the rate is delay every sample
	// may see behind a packet in flight, not a queue.
	over := float64(c.cfg.DelayThreshold) + 1514/math.Max(c.rate, 1)*float64(time.Second)
	c.window[c.next] = delta > over
	c.next = (c.next + 1) % len(c.window)
	c.filled = min(c.filled+1, len(c.window))
	c.fresh = true
}

// Passed folds in the shaper's byte counter (cumulative, of this
// direction) read at at.
func (c *Controller) Passed(at time.Time, bytes uint64) {
	if c.loadAt.IsZero() || bytes < c.loadBytes {
		c.loadAt, c.loadBytes = at, bytes
		return
	}
	dt := at.Sub(c.loadAt)
	if dt < c.cfg.LoadEvery {
		return
	}
	c.passed = units.BitsPerSecond(bytes-c.loadBytes, dt)
	c.loadAt, c.loadBytes, c.loaded = at, bytes, true
}

func (c *Controller) bloated() bool {
	n := 0
	for _, over := range c.window[:c.filled] {
		if over {
			n++
		}
	}
	return n >= c.cfg.BloatCount
}

// Decide returns the rate at now, changing it when the rules say so.
func (c *Controller) Decide(now time.Time) Decision {
	old := c.rate
	d := Decision{Passed: c.passed, AvgDelta: time.Duration(c.avgDelta)}
	passedBytes := c.passed / 8
	switch {
	case now.Sub(c.lastReply) >= c.cfg.StallAfter:
		// Nothing is known: hold. The samples from before the outage say
		// nothing of the link after it.
		d.State = NoReplies
		if passedBytes < float64(c.cfg.StallRate) {
			d.State = Stall
		}
		c.lastDrift = now // the drift waits too
		if !c.stalled {
			c.stalled = true
			clear(c.window)
			c.filled, c.avgDelta = 0, 0
		}
	case c.bloated():
		c.stalled = false
		d.State = Bloat
		if now.Sub(c.lastChange) >= c.cfg.BloatEvery {
			f := clamp(float64(time.Duration(c.avgDelta)-c.cfg.DelayThreshold) / float64(c.cfg.DecreaseDelay-c.cfg.DelayThreshold))
			factor := c.cfg.DecreaseMin - f*(c.cfg.DecreaseMin-c.cfg.DecreaseMax)
			lower := c.rate * factor
			if p := min(c.cfg.PassedDecrease, factor) * passedBytes; c.loaded && p > float64(c.cfg.Min) && p < lower {
				lower = p
			}
			c.rate = lower
			c.lastChange = now
		}
	case c.loaded && passedBytes >= c.cfg.HighLoad*c.rate:
		c.stalled = false
		d.State = High
		if c.fresh && now.Sub(c.lastChange) >= c.cfg.BloatEvery {
			g := clamp(float64(c.cfg.DelayThreshold-time.Duration(c.avgDelta)) / float64(c.cfg.DelayThreshold-c.cfg.IncreaseDelay))
			c.rate *= 1 + g*c.cfg.IncreaseMax
		}
	default:
		c.stalled = false
		d.State = Low
		if passedBytes < float64(c.cfg.IdleRate) {
			d.State = Idle
		}
		if now.Sub(c.lastDrift) >= c.cfg.DriftEvery {
			c.lastDrift = now
			base := float64(c.cfg.Base)
			switch {
			case c.rate > base:
				c.rate = max(base, c.rate*(1-c.cfg.Drift))
			case c.rate < base:
				c.rate = min(base, c.rate*(1+c.cfg.Drift))
			}
		}
	}
	c.fresh = false
	c.rate = math.Min(math.Max(c.rate, float64(c.cfg.Min)), float64(c.cfg.Max))
	d.Rate = c.Rate()
	d.Changed = c.rate != old
	return d
}

func clamp(x float64) float64 { return math.Min(math.Max(x, 0), 1) }
