package autorate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"sluice/units"
)

// Config is one direction's controller. Min, Base and Max are required;
// a zero in any other field takes its default.
//
// The signal and the states are cake-autorate's (v3.5): a baseline per
// reflector, bufferbloat as BloatCount of the last Window samples above
// the threshold, load from the shaper's counters, stalls that hold the
// rate. What the rate does differs (docs/autorate.md says why, with
// the measurements): a decrease goes to the capacity the delay's slope
// shows, less what drains the queue, and the rate then probes past that
// capacity slowly at first, faster the longer no bufferbloat answers.
type Config struct {
	// Min and Max bound the rate; Base is where it starts and where it
	// drifts back to when the link is not busy.
	Min, Base, Max units.Rate
	// Downstream: the shaper is behind the link's buffer (a download
	// shaped on arrival), so what the link delivers while that buffer
	// holds a queue (Arrived; without it, what the shaper passes while
	// it holds nothing back) is the link's capacity itself. Upstream
	// (an upload), it feeds the buffer, and the capacity is what it
	// sent less the queue's growth.
	Downstream bool

	// DelayThreshold: a sample this far above its reflector's baseline
	// (plus one full packet's serialisation at the current rate) counts
	// toward bufferbloat. 30 ms; with AutoThreshold, where the
	// threshold starts (ThresholdMax: a jittery path cut on jitter before
	// its jitter is known recovers slowly).
	DelayThreshold time.Duration
	// AutoThreshold: the threshold fits the path's own delay variation
	// (Threshold says how): a few ms on a wired link, tens on LTE,
	// within ThresholdMin and ThresholdMax (5 ms, 50 ms).
	AutoThreshold              bool
	ThresholdMin, ThresholdMax time.Duration
	// Window and BloatCount: bufferbloat is BloatCount of the last
	// Window samples (all reflectors pooled) above the threshold. 6, 3.
	Window, BloatCount int
	// DrainTime: a decrease sets the rate to the capacity less what
	// drains the queue the samples show within this long (a probe's
	// end, and downstream every decrease, within a third of it), and
	// once it has drained, the rate goes back to just under the
	// capacity, no later than this long after the cut. 500 ms.
	DrainTime time.Duration
	// DecreaseMax is the least one decrease leaves of the capacity it
	// found (a deep queue drains over several). 0.5.
	DecreaseMax float64
	// Margin: below the capacity last found by this fraction, the rate
	// closes in on it (time constant Approach); above it, it probes.
	// 0.02, 500 ms.
	Margin   float64
	Approach time.Duration
	// ProbeGrowth is how fast (per second) the rate probes just past
	// the capacity last found; GrowthMax how fast once it is ProbeSpan
	// above it (the link grew), growing with the square of the
	// distance in between. 0.05, 0.5, 0.2.
	ProbeGrowth, GrowthMax, ProbeSpan float64
	// DecreaseMargin: a downstream decrease sets the rate at least this
	// fraction below the capacity it found (what passed over a second
	// reads a little above the line: a cut that lands above it drains
	// nothing). 0.05.
	DecreaseMargin float64
	// HighLoad: the link is busy when what the shaper passed is at least
	// this fraction of its rate: only then does the rate grow. 0.9.
	HighLoad float64
	// IdleRate: below this the link is idle. 2 Mbit/s, or half of Min
	// where that is less.
	IdleRate units.Rate
	// Drift is how far the rate moves toward Base each DriftEvery when
	// the link is neither busy nor bloated, as a fraction. 0.01, 1 s.
	Drift      float64
	DriftEvery time.Duration
	// BloatEvery: after a decrease, the next waits this long, and comes
	// only if the delay still rises (the first one takes a while to
	// show), or, downstream, where the decrease read the capacity from
	// what passed and what passes still runs under the rate; after a
	// probe's end, a queue that still grows is cut at once. 300 ms.
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
	// DeltaAlpha weighs each sample's excess delay into the average
	// (reported, and what holds growth back). 0.095.
	DeltaAlpha float64
}

// Defaults is Config's defaults for the fields a zero leaves open.
var Defaults = Config{
	DelayThreshold: 30 * time.Millisecond,
	ThresholdMin:   5 * time.Millisecond,
	ThresholdMax:   50 * time.Millisecond,
	Window:         6,
	BloatCount:     3,
	DrainTime:      500 * time.Millisecond,
	DecreaseMax:    0.5,
	Margin:         0.02,
	Approach:       500 * time.Millisecond,
	ProbeGrowth:    0.05,
	GrowthMax:      0.5,
	ProbeSpan:      0.2,
	DecreaseMargin: 0.05,
	HighLoad:       0.9,
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

// ConfigFor is a configuration with the defaults and threshold (zero:
// automatic).
func ConfigFor(lo, base, hi units.Rate, threshold time.Duration, downstream bool) Config {
	return Config{Min: lo, Base: base, Max: hi, DelayThreshold: threshold, AutoThreshold: threshold == 0, Downstream: downstream}
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
	if c.AutoThreshold && c.DelayThreshold == 0 {
		c.DelayThreshold = c.ThresholdMax
		if c.DelayThreshold == 0 {
			c.DelayThreshold = d.ThresholdMax
		}
	}
	pick(&c.DelayThreshold, d.DelayThreshold)
	pick(&c.ThresholdMin, d.ThresholdMin)
	pick(&c.ThresholdMax, d.ThresholdMax)
	pick(&c.DrainTime, d.DrainTime)
	pick(&c.Approach, d.Approach)
	pick(&c.DriftEvery, d.DriftEvery)
	pick(&c.BloatEvery, d.BloatEvery)
	pick(&c.LoadEvery, d.LoadEvery)
	pick(&c.StallAfter, d.StallAfter)
	pickF(&c.DecreaseMax, d.DecreaseMax)
	pickF(&c.Margin, d.Margin)
	pickF(&c.ProbeGrowth, d.ProbeGrowth)
	pickF(&c.GrowthMax, d.GrowthMax)
	pickF(&c.ProbeSpan, d.ProbeSpan)
	pickF(&c.DecreaseMargin, d.DecreaseMargin)
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
		// Never above half of Min: a DSL upload of 1 Mbit/s, saturated,
		// is busy, not idle (the lab's 1.6 Mbit/s upload read idle
		// under load at 2).
		c.IdleRate = min(d.IdleRate, c.Min/2)
	}
	if c.StallRate == 0 {
		c.StallRate = d.StallRate
	}
	var errs []error
	if c.Min == 0 || c.Min > c.Base || c.Base > c.Max {
		errs = append(errs, fmt.Errorf("want 0 < min <= base <= max, have min %s, base %s, max %s", c.Min, c.Base, c.Max))
	}
	if c.ThresholdMin > c.ThresholdMax {
		errs = append(errs, fmt.Errorf("threshold bounds %s > %s", c.ThresholdMin, c.ThresholdMax))
	}
	if c.BloatCount > c.Window {
		errs = append(errs, fmt.Errorf("bloat count %d is more than the window of %d samples", c.BloatCount, c.Window))
	}
	if c.ProbeGrowth > c.GrowthMax {
		errs = append(errs, fmt.Errorf("probe growth %g is more than the most growth %g", c.ProbeGrowth, c.GrowthMax))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"steepest decrease", c.DecreaseMax}, {"margin", c.Margin}, {"decrease margin", c.DecreaseMargin}, {"high load", c.HighLoad}, {"drift", c.Drift},
		{"baseline up", c.BaselineUp}, {"baseline down", c.BaselineDown}, {"delta alpha", c.DeltaAlpha}} {
		if f.v < 0 || f.v > 1 {
			errs = append(errs, fmt.Errorf("%s %g: want a fraction between 0 and 1", f.name, f.v))
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"probe growth", c.ProbeGrowth}, {"most growth", c.GrowthMax}, {"probe span", c.ProbeSpan}} {
		if f.v < 0 || f.v > 10 {
			errs = append(errs, fmt.Errorf("%s %g: want a rate per second between 0 and 10", f.name, f.v))
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
// half the round trip), when it came, and when its request was sent
// (zero: not known).
type Sample struct {
	Reflector string
	At        time.Time
	Delay     time.Duration
	Sent      time.Time
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

	// threshold is the delay threshold in force (ns): the configured
	// one, or, with AutoThreshold, what the path's variation shows.
	threshold float64
	// prev is each reflector's last sample; steps the differences
	// between a reflector's consecutive samples (ns, the last
	// jitterSteps, a ring from stepNext), for AutoThreshold.
	prev     map[string]Sample
	steps    []float64
	stepNext int
	// thresholdMin overrides Config.ThresholdMin (SetThresholdMin);
	// sorted is refit's scratch copy of steps.
	thresholdMin time.Duration
	sorted       []float64

	// recent holds the last slopeSamples samples' excess delays and
	// times (all reflectors), for the queue's slope and depth.
	recent []point

	lastReply  time.Time
	lastOver   time.Time // the last sample above the threshold
	stalled    bool
	lastChange time.Time // the last decrease
	lastDrift  time.Time
	lastGrow   time.Time // the last decision that grew (or could have)
	// capacity is what the last decrease found the link carries (bytes
	// per second; 0: none yet).
	capacity float64
	// probeEnded: the last change (lastChange) was a probe's end at
	// the first growing queue, not a decrease.
	probeEnded bool
	// grewAt is when the rate last grew (closing in or probing).
	grewAt time.Time
	// restoreAt and restoreTo: a cut below the capacity it measured
	// drains the queue it saw by then; the rate then goes back to
	// restoreTo (bytes per second), just under that capacity.
	restoreAt time.Time
	restoreTo float64
	// pending: downstream, the target of the last decrease that read
	// the capacity from what passed, lowered to what the link was
	// since measured to deliver (bytes per second; 0: none). nextStep
	// goes on toward it unless the link shows it carries the rate.
	pending float64

	readings []reading // the counter over the last 2 s
	// arrivals is the link's delivered byte counter over the last 2 s
	// (Arrived; downstream only; empty: not fed).
	arrivals  []reading
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
		threshold: float64(c.DelayThreshold), prev: map[string]Sample{},
		lastReply: now, lastDrift: now, lastChange: now.Add(-c.BloatEvery)}, nil
}

// reading is the shaper's byte counter at a time.
type reading struct {
	at    time.Time
	bytes uint64
}

// sentBetween is what the shaper sent (bytes per second) from about
// from to about to, by its counter; ok false when the readings do not
// cover it.
func (c *Controller) sentBetween(from, to time.Time) (float64, bool) {
	return rateBetween(c.readings, from, to)
}

// rateBetween is the rate (bytes per second) a counter's readings show
// from about from to about to; ok false when they do not cover it.
func rateBetween(rs []reading, from, to time.Time) (float64, bool) {
	n := len(rs)
	if n < 2 {
		return 0, false
	}
	i := 0
	for i < n-2 && !rs[i+1].at.After(from) {
		i++
	}
	j := n - 1
	for j > i+1 && rs[j-1].at.After(to) {
		j--
	}
	a, b := rs[i], rs[j]
	dt := b.at.Sub(a.at).Seconds()
	if dt < 0.1 {
		return 0, false
	}
	return float64(b.bytes-a.bytes) / dt, true
}

// queueLevel is the excess delay (ns) above which a sample shows a
// queue: half the threshold.
func (c *Controller) queueLevel() float64 { return c.threshold / 2 }

// queued reports whether the newest sample shows a queue.
func (c *Controller) queued() bool {
	n := len(c.recent)
	return n > 0 && c.recent[n-1].delta > c.queueLevel()
}

// Urgent reports whether the newest sample shows a queue under a probe
// past the capacity last found: a decision now ends the probe a
// decision interval sooner.
func (c *Controller) Urgent() bool {
	return c.queued() && c.capacity > 0 && c.rate > c.capacity && !c.grewAt.Before(c.lastChange)
}

// fed reports whether the link's delivery is fed (Arrived).
func (c *Controller) fed() bool { return len(c.arrivals) > 0 }

// queuedFor is the least span a delivered rate is read over.
const queuedFor = 150 * time.Millisecond

// delivered is what the link delivered (bytes per second) while its
// buffer is known to have held a queue, and so what it carries: from
// when the oldest of the newest run of samples above half the
// threshold joined the queue, to when the newest left it. ok false
// where Arrived is not fed, or the newest sample shows no queue (a load
// that ended delivers less than the link carries), or the run is
// shorter than queuedFor.
func (c *Controller) delivered() (float64, bool) {
	if !c.fed() || !c.queued() {
		return 0, false
	}
	n := len(c.recent)
	level := c.queueLevel()
	last := c.recent[n-1]
	from, to := last.at, last.at.Add(time.Duration(last.delta))
	for i := n - 2; i >= 0 && c.recent[i].delta > level; i-- {
		from = c.recent[i].at
	}
	if to.Sub(from) < queuedFor {
		return 0, false
	}
	return rateBetween(c.arrivals, from, to)
}

// downstreamFloor is the least a downstream decrease leaves of the
// capacity.
const downstreamFloor = 0.85

// downstreamStep is the least one downstream decrease leaves of the
// rate.
const downstreamStep = 0.5

// point is one sample's excess delay (ns) at a time.
type point struct {
	at    time.Time
	delta float64
}

// slopeSamples is how many recent samples are kept (400 ms at 20 Hz),
// slopePoints how many the slope is read from.
const (
	slopeSamples = 8
	slopePoints  = 5
)

// slope is the queue's growth over the recent samples enqueued after
// since, seconds of delay per second (least squares), with how many
// there were; depth is the delay the last three samples show above
// their baselines.
func (c *Controller) slope(since time.Time) (slope, depth float64, n int) {
	if len(c.recent) == 0 {
		return 0, 0, 0
	}
	k := min(3, len(c.recent))
	for _, p := range c.recent[len(c.recent)-k:] {
		depth += p.delta / float64(k)
	}
	var sx, sy, sxx, sxy float64
	var t0 time.Time
	// The last slopePoints only: after a sudden change, older samples
	// lie on the queue's old course.
	first := max(0, len(c.recent)-slopePoints)
	for _, p := range c.recent[first:] {
		if !p.at.After(since) {
			continue
		}
		if n == 0 {
			t0 = p.at
		}
		n++
		x := p.at.Sub(t0).Seconds()
		y := p.delta / 1e9
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	fn := float64(n)
	den := fn*sxx - sx*sx
	if n < 3 || den <= 0 {
		return 0, depth, n
	}
	return (fn*sxy - sx*sy) / den, depth, n
}

// fromSlope is what the shaper sent (bytes per second) while the probes
// since the last decrease queued, and the capacity that and the queue's
// slope show: the link's buffer drains at the capacity, so the queue
// grows by sent/capacity - 1 seconds a second.
func (c *Controller) fromSlope(slope float64) (sent, capacity float64) {
	sent = c.rate
	if from, to := c.freshSpan(c.lastChange); to.After(from) {
		if b, ok := c.sentBetween(from, to); ok {
			sent = math.Min(b, c.rate)
		}
	}
	return sent, sent / (1 + math.Min(math.Max(slope, -0.9), 10))
}

// freshSpan is the span of the recent samples enqueued after since.
func (c *Controller) freshSpan(since time.Time) (from, to time.Time) {
	for _, p := range c.recent {
		if p.at.After(since) {
			if from.IsZero() {
				from = p.at
			}
			to = p.at
		}
	}
	return from, to
}

// The automatic threshold (AutoThreshold) starts at DelayThreshold and,
// once jitterMin steps are known, is jitterScale times the jitterQuantile
// of the last jitterSteps differences between a reflector's consecutive
// samples, within ThresholdMin and ThresholdMax.
//
// Why steps and not the samples' spread above the baseline: that spread
// is the path's only while nothing queues, and a link that is never
// idle (or whose other direction is busy, which echo samples carry
// too) would never be measured. A path's jitter moves from one sample
// to the next; a queue, which drains at the capacity, moves by its
// slope times the samples' spacing, and by much only at a probe's end
// or a drop: the 0.9 quantile leaves those out. The baseline follows
// the path's fastest samples, so the threshold must clear the path's
// whole spread above them: for normal jitter (sigma) the steps' 0.9
// quantile is 2.3 sigma, twice that lies 2.2 sigma above the mean, 4.7
// above the baseline (about 2.5 under it), and three samples in six
// above it, bufferbloat, come from jitter about once in ten minutes at
// 20 Hz; uniform jitter over R gives 1.37 R, never. A queue the
// threshold lets stand (the probes' sawtooth) moves by about a third of
// it between a reflector's samples: the threshold does not grow on its
// own queue.
const (
	jitterSteps    = 200
	jitterMin      = 40
	jitterQuantile = 0.9
	jitterScale    = 2
)

// fit folds sample s into the automatic threshold.
func (c *Controller) fit(s Sample) {
	p, ok := c.prev[s.Reflector]
	c.prev[s.Reflector] = s
	if !c.cfg.AutoThreshold || !ok || s.At.Sub(p.At) > time.Second {
		return
	}
	// A queue the controller moves (a cut drains it within DrainTime,
	// a probe's end sooner) or bufferbloat shows is no jitter: left
	// out, it cannot lift the threshold that let it build (in the
	// model the probes' drains took a wired path's threshold from 5 to
	// 12.5 ms).
	if s.At.Sub(c.lastChange) < c.cfg.DrainTime || c.bloated() {
		return
	}
	step := math.Abs(float64(s.Delay - p.Delay))
	if len(c.steps) < jitterSteps {
		c.steps = append(c.steps, step)
	} else {
		c.steps[c.stepNext] = step
		c.stepNext = (c.stepNext + 1) % jitterSteps
	}
	if len(c.steps) < jitterMin {
		return
	}
	c.refit()
}

// refit sets the automatic threshold from the steps known.
func (c *Controller) refit() {
	if !c.cfg.AutoThreshold || len(c.steps) < jitterMin {
		return
	}
	// A scratch copy kept between samples: refit runs on each one.
	c.sorted = append(c.sorted[:0], c.steps...)
	slices.Sort(c.sorted)
	q := c.sorted[int(jitterQuantile*float64(len(c.sorted)-1))]
	lo := c.cfg.ThresholdMin
	if c.thresholdMin > 0 {
		lo = min(c.thresholdMin, c.cfg.ThresholdMax)
	}
	c.threshold = math.Min(math.Max(jitterScale*q, float64(lo)), float64(c.cfg.ThresholdMax))
}

// SetThresholdMin moves the automatic threshold's lower bound (zero:
// the configured one, Config.ThresholdMin).
func (c *Controller) SetThresholdMin(d time.Duration) {
	c.thresholdMin = d
	c.refit()
}

// Threshold is the delay threshold in force: the configured one, or,
// with AutoThreshold, what the path's variation shows so far.
func (c *Controller) Threshold() time.Duration { return time.Duration(c.threshold) }

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
func (c *Controller) Forget(reflector string) {
	delete(c.baseline, reflector)
	delete(c.prev, reflector)
}

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
	if len(c.recent) == slopeSamples {
		c.recent = append(c.recent[:0], c.recent[1:]...)
	}
	// The slope and what the shaper sent are matched at the time the
	// probe joined the queue. Downstream, the reply's: its delay ago
	// (less the path's). Upstream, the request's, as it was sent: the
	// reply then came back through the other direction's queue, which
	// the delay leaves out: a download's growing queue stretches the
	// upload's samples apart and biases the slope (in the unit test a
	// growing upload read 22.9 Mbit/s on a 20 Mbit/s line).
	joined := s.At.Add(-time.Duration(delta))
	if !c.cfg.Downstream && !s.Sent.IsZero() {
		joined = s.Sent
	}
	c.recent = append(c.recent, point{joined, delta})
	// One full packet's serialisation at the rate is delay every sample
	// may see behind a packet in flight, not a queue.
	c.fit(s)
	over := c.threshold + 1514/math.Max(c.rate, 1)*float64(time.Second)
	c.window[c.next] = delta > over
	if delta > over {
		c.lastOver = s.At
	}
	c.next = (c.next + 1) % len(c.window)
	c.filled = min(c.filled+1, len(c.window))
	c.fresh = true
}

// Passed folds in the shaper's byte counter (cumulative, of this
// direction) read at at.
func (c *Controller) Passed(at time.Time, bytes uint64) {
	c.readings = fold(c.readings, at, bytes)
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

// Arrived folds in, downstream, the link's delivered byte counter
// (cumulative: the received bytes of the interface the link's buffer
// feeds, before the shaper) read at at. While that buffer holds a
// queue it delivers at the capacity, whatever the shaper then passes,
// drops or queues: a decrease reads the capacity from it, not from
// what the shaper passed, which the shaper's own rate caps.
func (c *Controller) Arrived(at time.Time, bytes uint64) {
	c.arrivals = fold(c.arrivals, at, bytes)
}

// fold appends a counter's reading, keeping the last 2 s (a counter that
// went back was reset: its past goes).
func fold(rs []reading, at time.Time, bytes uint64) []reading {
	if n := len(rs); n > 0 && bytes < rs[n-1].bytes {
		rs = rs[:0]
	}
	for len(rs) > 0 && at.Sub(rs[0].at) > 2*time.Second {
		rs = rs[1:]
	}
	return append(rs, reading{at, bytes})
}

// QueueNear reports whether a sample showed a queue above the threshold
// within a second before at, or since. A request sent at at and lost
// was then most likely dropped by a full buffer (a drop-tail buffer
// drops probes too), not ignored by its reflector: the caller counts it
// against none (a pool would replace a good reflector for the queue's
// drops). Asked when the loss is known (a timeout after at), the
// samples of a queue that was filling at at have arrived.
func (c *Controller) QueueNear(at time.Time) bool {
	return !c.lastOver.IsZero() && !c.lastOver.Before(at.Add(-time.Second))
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
	if !c.restoreAt.IsZero() && !now.Before(c.restoreAt) {
		// The cut drained the queue it saw: back to just under the
		// capacity it measured, rather than closing in on it from the
		// cut for a second or more; once the newest sample shows the
		// queue gone (downstream the senders' windows still grow until
		// the shaper's own queue overflows, and the queue the samples
		// show with them: in the lab it grew from 5 to 38 ms under a
		// rate 5% below the line), and no later than DrainTime after
		// the cut.
		switch {
		case now.Sub(c.lastChange) > c.cfg.DrainTime:
			c.restoreAt = time.Time{}
		case !c.queued():
			c.rate = math.Max(c.rate, c.restoreTo)
			c.restoreAt = time.Time{}
		}
	}
	switch {
	case now.Sub(c.lastReply) >= c.cfg.StallAfter:
		// Nothing is known: hold. The samples from before the outage say
		// nothing of the link after it.
		d.State = NoReplies
		if passedBytes < float64(c.cfg.StallRate) {
			d.State = Stall
		}
		c.lastDrift, c.lastGrow = now, now // the drift waits too
		c.restoreAt = time.Time{}
		if !c.stalled {
			c.stalled = true
			clear(c.window)
			c.filled, c.avgDelta, c.recent = 0, 0, c.recent[:0]
		}
	case c.bloated():
		c.stalled = false
		d.State = Bloat
		// The shaper sends into the link's buffer, which drains at the
		// capacity: the queue grows by sent/capacity - 1 seconds a
		// second (shrinks, where negative). So the capacity is what
		// the shaper sent over one plus the queue's slope, and the
		// rate goes below it by what drains the queue within
		// DrainTime. A decision reads only probes that joined the
		// queue after the last decrease (those before cannot show its
		// effect: a deep queue returns them late), at least three.
		slope, depth, n := c.slope(c.lastChange)
		arrived, known := c.delivered()
		if known && c.pending > 0 {
			// What the link delivered while its buffer held the queue
			// the samples show is its capacity: the pending decrease
			// goes no higher (a first cut that came before the queue
			// had lasted long enough to measure read what passed over
			// a second, mostly from before the drop: the pending rate
			// stood at 41 Mbit/s on a 40 Mbit/s line).
			c.pending = math.Min(c.pending, c.below(arrived, depth, false))
			c.capacity = math.Min(c.capacity, arrived)
		}
		// A probe's end (probeEnded) is no decrease to wait on: it went
		// just under the capacity it read, and a queue that still
		// grows after it says that reading was high (a link with a
		// token bucket delivers its burst as the queue starts: the
		// lab's modem read 84 to 86 Mbit/s on an 80 Mbit/s line, and
		// for 300 ms nothing drained a queue that grew to 20 to 35 ms).
		if (now.Sub(c.lastChange) >= c.cfg.BloatEvery || c.probeEnded && slope > 0) && n >= 3 {
			sent, capacity := c.fromSlope(slope)
			if c.cfg.Downstream && c.loaded {
				// What the shaper passed is the capacity only while the
				// shaper does not hold it back; while it does, the
				// capacity found before stands, and the rate falls
				// further only while the queue still grows.
				// Over a second, not the last load span alone: the
				// senders' losses make what passes dip for a moment,
				// and a link's bursts lift it (a modem with 10 ms of
				// bucket read 5% above its line over 200 ms).
				passed := passedBytes
				if b, ok := c.sentBetween(now.Add(-time.Second), now); ok {
					passed = b
				}
				switch {
				case known:
					// The link delivers at its capacity while its
					// buffer holds the queue the samples show.
					capacity = arrived
				case passed < 0.95*c.rate:
					capacity = passed
				case c.capacity > 0 && slope <= 0:
					capacity = c.rate
				case c.capacity > 0:
					capacity = math.Min(c.capacity, c.rate)
				}
			}
			// The last probe shows the queue as it was when it joined:
			// it has grown (or shrunk) by the slope since.
			if last := c.recent[len(c.recent)-1]; slope > 0 && !c.cfg.Downstream {
				depth += slope * float64(now.Sub(last.at))
			}
			// A queue this deep that does not shrink is a full buffer
			// dropping: its slope says nothing of the capacity. (A full
			// buffer still delivers at the capacity: with the delivery
			// fed, nothing needs guessing.)
			full := depth >= float64(c.cfg.DrainTime) && slope > -0.05 && !c.fed()
			// A queue that drains while the shaper sent less than its
			// rate as those probes queued (the load ended, or paused;
			// both ways, since what passed over the second lags the
			// load's end) goes by itself, and what the shaper sends is
			// no measure of the capacity: hold. So
			// does one that drained below the threshold (the window's
			// older samples are its past): its slope flattens as it
			// empties, and would read as a capacity lower than it is.
			drained := depth < c.threshold
			// Downstream, with the delivery fed, a newest sample that
			// shows no queue is a queue gone (a load that ended leaves
			// the shaper passing its rate a while from its own queue,
			// which is no measure of the link): hold.
			gone := c.cfg.Downstream && c.fed() && !c.queued()
			if !gone && (full || slope > 0 || sent >= c.cfg.HighLoad*c.rate && !drained) {
				c.decrease(now, capacity, depth, full, known)
			} else {
				c.nextStep(now, passedBytes)
			}
		}
		c.lastGrow = now
	case c.loaded && passedBytes >= c.cfg.HighLoad*c.rate:
		c.stalled = false
		d.State = High
		c.pending = 0 // the link carries the rate
		// Grow while the queue stays short: close in on the capacity
		// last found, then probe past it, slowly at first, faster the
		// longer no bufferbloat answers (the link may have grown).
		dt := math.Min(now.Sub(c.lastGrow).Seconds(), maxGrowSpan.Seconds())
		c.lastGrow = now
		slope, depth, n := c.slope(c.lastChange)
		if dt <= 0 || now.Sub(c.lastChange) < c.cfg.BloatEvery {
			break
		}
		if c.probeAnswered(now, slope, depth, n) {
			break
		}
		c.grewAt = now
		if target := c.capacity * (1 - c.cfg.Margin); c.rate < target*0.995 {
			c.rate += (target - c.rate) * math.Min(1, dt/c.cfg.Approach.Seconds())
			break
		}
		// Slowly near the capacity last found, faster away from it (as
		// CUBIC grows a window): the link most likely carries what it
		// did, and when it grew, it may have grown a lot.
		c.rate *= 1 + dt*c.growth()
	default:
		c.stalled = false
		c.lastGrow = now
		d.State = Low
		if passedBytes < float64(c.cfg.IdleRate) {
			d.State = Idle
			c.pending = 0 // the load ended: nothing more is known
		}
		// A probe that grows fast runs ahead of what passes (the
		// senders follow a span later): the load reads low every other
		// decision, and a queue that shows then answers it all the
		// same (in the lab the upload's probe stood 15% over its line
		// one decision more, and the queue reached 24 ms).
		if now.Sub(c.grewAt) < 2*c.cfg.LoadEvery && now.Sub(c.lastChange) >= c.cfg.BloatEvery {
			if slope, depth, n := c.slope(c.lastChange); c.probeAnswered(now, slope, depth, n) {
				break
			}
		}
		if now.Sub(c.lastChange) >= c.cfg.BloatEvery && c.nextStep(now, passedBytes) {
			break
		}
		if now.Sub(c.lastDrift) >= c.cfg.DriftEvery {
			// The steps keep their cadence when decisions come late (a
			// loaded or emulated machine's timers: the 6.1 lane's idle
			// drift lost one step in six): the next is due DriftEvery
			// after this one was, unless a busy spell came between.
			c.lastDrift = c.lastDrift.Add(c.cfg.DriftEvery)
			if now.Sub(c.lastDrift) >= c.cfg.DriftEvery {
				c.lastDrift = now
			}
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

// growth is how fast (per second) a probe grows the rate where it
// stands: slowly near the capacity last found, faster away from it (as
// CUBIC grows a window): the link most likely carries what it did,
// and when it grew, it may have grown a lot.
func (c *Controller) growth() float64 {
	over := 1.0
	if c.capacity > 0 {
		over = math.Min(1, math.Max(c.rate/c.capacity-1, 0)/c.cfg.ProbeSpan)
	}
	return c.cfg.ProbeGrowth + over*over*(c.cfg.GrowthMax-c.cfg.ProbeGrowth)
}

// maxGrowSpan is the most time one decision grows the rate for. A
// decision grows by the time since the one before, so that the rate
// grows by the clock however late decisions come (a loaded or emulated
// machine's agent: 300 ms apart and more in the 6.1 lane, where a cap of
// 200 ms made 5% a second 3.3% or less, and a rise's upload grew 1.7% a
// second, at 0.56 of the line);
// a machine that stalled longer grows by a second's worth, not by all
// it missed.
const maxGrowSpan = time.Second

// decrease sets the rate below the capacity by what drains a queue of
// depth (ns) within DrainTime, no further than the floor allows; a full
// buffer cuts by the most. measured: downstream, the capacity is what
// the link delivered while it held a queue, which needs no second look.
func (c *Controller) decrease(now time.Time, capacity, depth float64, full, measured bool) {
	if full {
		capacity = math.Min(capacity, c.rate)
	}
	target := c.below(capacity, depth, false)
	// Upstream, only a decision that decreases keeps its capacity: one
	// that does not reads a queue already draining, whose slope
	// flattens as it empties (read as a capacity lower than the one
	// the decrease found). So does one held at Min, which decreases
	// nothing (in one run after the lab's drop to 8 Mbit/s a decision
	// at Min read 7.0 where the cut before read 8.1). Downstream the
	// capacity is what passed.
	if math.Max(target, float64(c.cfg.Min)) < c.rate || c.cfg.Downstream {
		c.capacity = capacity
	}
	c.pending = 0
	if c.cfg.Downstream && !measured {
		c.pending = target
	}
	old := c.rate
	c.step(now, target, !measured)
	if c.rate < old && !full && (measured || !c.cfg.Downstream) {
		c.drainThenRestore(now, capacity, depth)
	}
}

// probeAnswered reports whether the newest samples show a queue, which
// stops a probe's growth; where it still grows it answers the probe,
// before it reaches the threshold and bufferbloat would: the link
// carries what the slope shows (downstream, what the link delivered
// while the queue grew, or what passed), or the capacity last found
// where that is less (a drop is bufferbloat's to find, from more
// samples). The rate goes under it by what drains the queue (a queue
// the samples show as it was when they joined it, grown since), then
// back to just under it.
func (c *Controller) probeAnswered(now time.Time, slope, depth float64, n int) bool {
	// A queue (the last samples' average, or the newest alone where
	// the queue grows: each sample waited for costs the probe's
	// growth, 2.5% of the rate at full speed, and in the lab a rise's
	// probe stood 10 to 19% over the line by then): the growth stops.
	if !(depth > c.queueLevel() || c.queued() && slope > 0 && n >= 3) {
		return false
	}
	if c.capacity == 0 || n < 3 {
		return true
	}
	if slope <= 0 {
		c.drainStanding(now, slope, depth)
		return true
	}
	capacity := c.queueCapacity(slope)
	margin := c.cfg.Margin
	if c.cfg.Downstream {
		// What passed, or what the link delivered, reads a little above
		// the line, as in a decrease.
		margin = math.Max(margin, c.cfg.DecreaseMargin)
	}
	// Only a probe past the capacity last found builds a queue worth
	// draining; below it, a queue that shows is a drop (bufferbloat's
	// to find) or jitter, and a deeper cut for it costs goodput (0.84
	// of the capacity under the jitter test's, 0.78 with the drain).
	past := c.rate > c.capacity
	if past {
		// What the samples and the counters show lags the rate by about
		// a load span, and a probe at speed ran that much further past
		// the line (a modem's token bucket hides the queue longer: in
		// the model, at 50% a second past 80 Mbit/s with 10 ms of
		// bucket, no queue for 170 ms, then 12 ms within 90): the cut
		// goes under the capacity by at least that growth, so that the
		// queue drains at once rather than at the next decrease, and
		// drainThenRestore brings the rate back once it has.
		margin = math.Max(margin, c.growth()*c.cfg.LoadEvery.Seconds())
	}
	capacity = math.Max(capacity, c.capacity)
	back := capacity * (1 - margin)
	var queue float64
	if past {
		last := c.recent[len(c.recent)-1]
		queue = last.delta + slope*float64(now.Sub(last.at))
		back = math.Min(back, c.below(capacity, queue, true))
	}
	if back < c.rate {
		c.rate, c.capacity = back, capacity
		c.lastChange, c.probeEnded = now, true
		c.drainThenRestore(now, capacity, queue)
	}
	return true
}

// queueCapacity is the capacity the samples since the last change show
// with the queue's slope: upstream, from what the shaper sent and the
// slope (fromSlope); downstream what passed, or, better, what the link
// delivered while its buffer held the queue.
func (c *Controller) queueCapacity(slope float64) float64 {
	sent, capacity := c.fromSlope(slope)
	if !c.cfg.Downstream {
		return capacity
	}
	if arrived, ok := c.delivered(); ok {
		return arrived
	}
	return sent
}

// drainStanding cuts under the capacity last found a queue that stands
// rather than drains (by its slope, not within DrainTime) while the
// rate is at that capacity: a probe's end that read the capacity a
// little high (a modem's bucket delivers its burst as the queue starts)
// leaves the rate at the line, and the queue it built stands, under the
// threshold, as long as the rate does (5.7 ms for seconds in the model
// of the lab's upload, 15 Mbit/s with 10 ms of bucket). A queue that
// drains by itself in time, or one under a rate well below the
// capacity (a drop, bufferbloat's to find; or jitter), is left alone.
func (c *Controller) drainStanding(now time.Time, slope, depth float64) {
	if depth <= c.queueLevel() || slope*float64(c.cfg.DrainTime) < -depth || now.Sub(c.lastChange) < c.cfg.BloatEvery {
		return
	}
	// A queue that neither grows nor drains is fed at the capacity,
	// where that is under the capacity last found (which read the
	// bucket's burst: 15.45 Mbit/s on the 15 line).
	capacity := math.Min(c.queueCapacity(slope), c.capacity)
	if c.rate < capacity*(1-c.cfg.Margin)*0.999 {
		return
	}
	if back := c.below(capacity, depth, true); back < c.rate {
		c.rate, c.capacity = back, capacity
		c.lastChange, c.probeEnded = now, true
		c.drainThenRestore(now, capacity, depth)
	}
}

// drainThenRestore schedules the rate's return to just under capacity
// (bytes per second) once the cut to the rate in force has drained a
// queue of depth (ns): the buffer drains at the capacity less the rate
// the senders keep to, so by depth * capacity / (capacity - rate), and
// Decide waits on from then for a sample that shows the queue gone
// (downstream the senders' windows grow on until the shaper's own
// queue overflows). The link stays busy while its queue drains, so a
// deep, short cut costs next to nothing; staying there costs goodput.
//
// A cut the floor held drains nothing by then (a queue that deep came
// from a drop, whose capacity one reading does not settle): the next
// decisions go on from it.
func (c *Controller) drainThenRestore(now time.Time, capacity, depth float64) {
	c.restoreAt = time.Time{}
	if c.rate >= capacity || depth <= 0 || c.rate <= c.floor()*capacity*1.001 {
		return
	}
	margin := c.cfg.Margin
	if c.cfg.Downstream {
		margin = math.Max(margin, c.cfg.DecreaseMargin)
	}
	to := capacity * (1 - margin)
	if to <= c.rate {
		return
	}
	wait := time.Duration(depth * capacity / (capacity - c.rate))
	c.restoreAt, c.restoreTo = now.Add(min(wait, c.cfg.DrainTime)), to
}

// below is the rate a decrease (or, probe, a probe's end) sets for a
// capacity (bytes per second) and a queue of depth (ns): under the
// capacity by what drains the queue in time, no further than the floor
// allows.
func (c *Controller) below(capacity, depth float64, probe bool) float64 {
	floor := c.floor()
	// Downstream, and at a probe's end, the cut drains the queue
	// within a third of DrainTime, and the rate goes back up once it
	// has (drainThenRestore). An upload's decrease drains it within
	// DrainTime: a decision that follows a drop's first cut reads the
	// slope of a queue that drains, and a deeper cut there takes the
	// rate to Min on a reading that is low (after the lab's drop to 8
	// Mbit/s, 6.4 to 7.7), which the rate then closes in on for
	// seconds.
	drainTime := float64(c.cfg.DrainTime)
	if c.cfg.Downstream || probe {
		drainTime /= 3
	}
	target := capacity * math.Max(1-depth/drainTime, floor)
	if c.cfg.Downstream {
		target = math.Min(target, capacity*(1-c.cfg.DecreaseMargin))
	}
	return target
}

// floor is the least share of the capacity a decrease leaves. Behind
// the buffer (downstream) the queue moves into the shaper's own at the
// capacity less the rate, and goes once that overflows and the senders
// slow down: no deeper than downstreamFloor, past which a cut costs
// goodput and drains little faster.
func (c *Controller) floor() float64 {
	if c.cfg.Downstream {
		return math.Max(c.cfg.DecreaseMax, downstreamFloor)
	}
	return c.cfg.DecreaseMax
}

// step sets the rate to target where that is lower; downstream, a
// target not measured (stepwise) no lower than downstreamStep of the
// rate: each step shows in what passes next (what the link delivered
// while it held a queue is the capacity already).
func (c *Controller) step(now time.Time, target float64, stepwise bool) {
	if c.cfg.Downstream && stepwise {
		target = math.Max(target, downstreamStep*c.rate)
	}
	if target < c.rate {
		c.rate = target
		c.lastChange, c.probeEnded = now, false
	}
}

// nextStep goes on with a downstream decrease read from what passed
// (pending): the next step toward its target, or toward the capacity
// the link was since measured to deliver where that is lower. What
// passed over the last second mixes in the rate from before a drop,
// and one step goes halfway at most, and the queue the drop built may
// drain before another decrease could see it: in the lab the upload's
// own drop held the download's ACKs, its senders paused, and a rate
// left at 46 to 50 Mbit/s on a 40 Mbit/s line let the buffer refill to
// 40 to 90 ms two seconds after the drop. It waits BloatEvery after
// the last step, goes only while what passes (passed, bytes per
// second) runs under the rate (a link that carries the rate ends the
// decrease), and reports whether it stepped.
func (c *Controller) nextStep(now time.Time, passed float64) bool {
	target := c.pending
	if target == 0 || target >= c.rate || passed >= c.cfg.HighLoad*c.rate {
		c.pending = 0
		return false
	}
	c.step(now, target, true)
	return true
}

func clamp(x float64) float64 { return math.Min(math.Max(x, 0), 1) }
