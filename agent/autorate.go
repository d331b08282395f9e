package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/autorate"
	"sluice/kernel"
	"sluice/nsrun"
	"sluice/plan"
	"sluice/policy"
	"sluice/probe"
	"sluice/units"
)

// rate: auto (docs/autorate.md): each tree whose rate is auto has a
// controller (package autorate) fed with the delay its reflectors show
// (package probe) and what its device sent; the rate it decides goes to
// the kernel as a limit (plan.RateLimit) through the engine session,
// like the sharing controllers' limits. The loop owns all of it: the
// probers' goroutines only hand their replies over (autoEvents).

// AutoEvery is how often the controllers read their devices' counters
// and decide: the probers' interval, so that every sample counts.
const AutoEvery = 50 * time.Millisecond

// autoWriteStep is the least relative change of the rate that is
// written at once; smaller moves (the drift) wait until they add up.
const autoWriteStep = 0.005

// autoCompareEvery is how often the reflectors' baselines are compared
// (an outlier is replaced).
const autoCompareEvery = time.Minute

// autoPublishEvery is how often the controllers' figures (rate decided,
// load, delay) are published while nothing else moved: a state, a
// written rate, an error or a reflector is published at once.
const autoPublishEvery = 100 * time.Millisecond

// autoTree is one tree's controller.
type autoTree struct {
	dev, iface, dir string
	cfg             policy.Auto
	ctl             *autorate.Controller
	prober          *autoProber
	last            autorate.Decision
	// written is the rate last handed to the session (0: none yet).
	written units.Rate
	err     string
}

// autoProber is one prober and the pool of its reflectors, shared by
// the trees that name the same reflectors and probe mode.
type autoProber struct {
	key      string
	p        *probe.Prober
	pool     *autorate.Pool
	cancel   context.CancelFunc
	done     chan struct{}
	trees    []*autoTree
	compared time.Time
	late     map[string]uint64
	replaced uint64
	// answered is when the latest request answered was sent.
	answered time.Time
	err      string
}

// sharedEchoMin is the least automatic threshold of trees that share
// one echo prober (an upload and a download): each gets half of one
// round trip, whichever way the queue is, so one direction's probes
// show in the other's samples as its own would, and at the lone
// direction's 5 ms the download's rate stood at half its line while
// the upload probed (docs/autorate.md).
const sharedEchoMin = 15 * time.Millisecond

// sharedFloor is the automatic threshold's lower bound for t, one of
// pr's trees: sharedEchoMin where the other direction of t's interface
// shares echo's round trips with it, else the controller's own (0).
// (Two interfaces' trees pinging the same reflectors do not: each
// interface's queue is in its own samples only.)
func sharedFloor(pr *autoProber, t *autoTree) time.Duration {
	if t.cfg.Probe == "timestamp" {
		return 0
	}
	for _, o := range pr.trees {
		if o != t && o.iface == t.iface && o.dir != t.dir {
			return sharedEchoMin
		}
	}
	return 0
}

// autoEvent is a reply, or a request lost, from a prober's goroutine.
type autoEvent struct {
	from  *autoProber
	reply probe.Reply
	lost  netip.Addr
	sent  time.Time // the lost request's
}

// autoActive is the number of reflectors pinged at once; the rest wait
// as spares (cake-autorate pings 6; three at 20 Hz in all give each a
// sample every 150 ms).
const autoActive = 3

func proberKey(a *policy.Auto) string {
	var b strings.Builder
	b.WriteString(a.Probe)
	for _, r := range a.Reflectors {
		b.WriteString(" " + r.String())
	}
	return b.String()
}

// syncAuto starts, keeps or stops the controllers and probers for the
// auto trees of pl, the plan in force. A tree whose settings did not
// change keeps its controller (and its rate).
func (a *Agent) syncAuto(pl *plan.Plan) {
	trees := map[string]*autoTree{}
	probers := map[string]*autoProber{}
	for _, d := range pl.Devices {
		if d.Auto == nil {
			continue
		}
		t := a.autos[d.Name]
		if t == nil || !sameAuto(&t.cfg, d.Auto) {
			cfg := autorate.ConfigFor(d.Auto.MinBps, d.Auto.BaseBps, d.Auto.MaxBps, d.Auto.DelayThreshold, d.Dir == policy.Ingress)
			ctl, err := autorate.New(cfg, time.Now())
			if err != nil { // validation checked the same bounds
				a.logFailure("rate: auto: cannot start the controller", "autorate", fmt.Errorf("%s: %w", d.Name, err))
				continue
			}
			t = &autoTree{dev: d.Name, iface: d.Interface, dir: d.Dir, cfg: *d.Auto, ctl: ctl}
			a.log.Info("rate: auto started", "device", d.Name, "direction", d.Dir, "min", d.Auto.MinBps.String(), "base", d.Auto.BaseBps.String(),
				"max", d.Auto.MaxBps.String(), "probe", d.Auto.Probe, "reflectors", len(d.Auto.Reflectors))
		}
		trees[d.Name] = t
		key := proberKey(d.Auto)
		pr := probers[key]
		if pr == nil {
			pr = a.probers[key]
			if pr == nil {
				pr = a.startProber(key, d.Auto)
			}
			pr.trees = nil
			probers[key] = pr
		}
		t.prober = pr
		pr.trees = append(pr.trees, t)
	}
	for _, pr := range probers {
		for _, t := range pr.trees {
			t.ctl.SetThresholdMin(sharedFloor(pr, t))
		}
	}
	for key, pr := range a.probers {
		if probers[key] == nil {
			pr.stop()
		}
	}
	a.autos, a.probers = trees, probers
	a.publishAuto(time.Now(), true)
}

func sameAuto(a, b *policy.Auto) bool {
	return a.MinBps == b.MinBps && a.BaseBps == b.BaseBps && a.MaxBps == b.MaxBps && a.DelayThreshold == b.DelayThreshold &&
		a.Probe == b.Probe && slices.Equal(a.Reflectors, b.Reflectors)
}

// startProber opens a prober in the agent's namespace and runs it. One
// that cannot open is kept, with its error: its trees see no replies
// and hold their rate (NoReplies or Stall), and the status says why.
func (a *Agent) startProber(key string, cfg *policy.Auto) *autoProber {
	var names []string
	for _, r := range cfg.Reflectors {
		names = append(names, r.String())
	}
	pr := &autoProber{key: key, pool: autorate.NewPool(names, autoActive), late: map[string]uint64{}, compared: time.Now()}
	pcfg := probe.Config{Reflectors: pr.activeAddrs(), Interval: AutoEvery, Timestamp: cfg.Probe == "timestamp"}
	open := func() (err error) { pr.p, err = probe.Open(pcfg); return err }
	// The socket lives in the namespace it was opened in.
	if err := nsrun.In(a.cfg.Netns, open); err != nil {
		pr.err = err.Error()
		a.logFailure("rate: auto: cannot probe the reflectors", "autorate", err)
		return pr
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr.cancel, pr.done = cancel, make(chan struct{})
	events := a.autoEvents
	send := func(ev autoEvent) {
		select {
		case events <- ev:
		default: // the loop is behind: a sample less
		}
	}
	go func() {
		defer close(pr.done)
		err := pr.p.Run(ctx, func(r probe.Reply) { send(autoEvent{from: pr, reply: r}) },
			func(to netip.Addr, sent time.Time) { send(autoEvent{from: pr, lost: to, sent: sent}) })
		if err != nil {
			a.log.Error("rate: auto: the prober stopped", "err", err)
		}
	}()
	return pr
}

// activeAddrs is the pool's active reflectors, as the prober takes them
// (the pool keeps the names the policy's addresses were written as).
func (pr *autoProber) activeAddrs() []netip.Addr {
	var out []netip.Addr
	for _, r := range pr.pool.Active() {
		out = append(out, netip.MustParseAddr(r))
	}
	return out
}

func (pr *autoProber) stop() {
	if pr.cancel != nil {
		pr.cancel()
		<-pr.done
	}
	if pr.p != nil {
		pr.p.Close()
	}
}

// stopAuto stops every prober (the agent stops).
func (a *Agent) stopAuto() {
	for _, pr := range a.probers {
		pr.stop()
	}
	a.probers, a.autos = nil, nil
}

// autoEvent folds a reply into the trees of its prober, or counts a
// lost request against its reflector (which the pool may replace).
func (a *Agent) autoEvent(ev autoEvent) {
	pr := ev.from
	if a.probers[pr.key] != pr {
		return // a prober stopped since
	}
	if ev.lost.IsValid() {
		r := ev.lost.String()
		pr.late[r]++
		// Late while another answered a later request: this reflector's
		// fault. All of them silent is the link's (an outage), which
		// no replacement mends; so is a request lost while the samples
		// show a full queue (a drop-tail buffer drops probes too).
		if pr.answered.After(ev.sent) && !pr.queueNear(ev.sent) {
			if repl := pr.pool.Late(r, time.Now()); repl != "" {
				a.replaceReflector(pr, r, repl)
			}
		}
		return
	}
	r := ev.reply
	if r.Sent.After(pr.answered) {
		pr.answered = r.Sent
	}
	name := r.Reflector.String()
	var urgent []*autoTree
	for _, t := range pr.trees {
		d := r.RTT / 2
		if r.Timestamp {
			d = r.Up
			if t.dir == policy.Ingress {
				d = r.Down
			}
		}
		t.ctl.Delay(autorate.Sample{Reflector: name, At: r.At, Delay: d, Sent: r.Sent})
		if t.ctl.Urgent() {
			urgent = append(urgent, t)
		}
	}
	if len(urgent) > 0 {
		a.autoDecideNow(urgent, time.Now())
	}
}

// autoDecideNow lets the controllers of trees whose newest sample shows
// a probe's queue decide at once rather than at the next pass: a probe
// at speed grows the queue by 10 to 15% of a second a second, and the
// pass's 25 ms on average were a third of the queue it ended at
// (autorate.Controller.Urgent; docs/autorate.md).
func (a *Agent) autoDecideNow(trees []*autoTree, now time.Time) {
	k, err := a.autoKernel()
	if err != nil {
		return // the pass says so
	}
	write := false
	for _, t := range trees {
		write = a.autoDecide(k, t, now) || write
	}
	a.publishAuto(now, false)
	if write {
		a.writeLimits("autorate")
	}
}

// queueNear reports whether any of the prober's trees saw a queue
// around sent.
func (pr *autoProber) queueNear(sent time.Time) bool {
	for _, t := range pr.trees {
		if t.ctl.QueueNear(sent) {
			return true
		}
	}
	return false
}

func (a *Agent) replaceReflector(pr *autoProber, old, repl string) {
	pr.replaced++
	for _, t := range pr.trees {
		t.ctl.Forget(old)
	}
	if pr.p != nil {
		pr.p.SetReflectors(pr.activeAddrs())
	}
	a.log.Warn("rate: auto: reflector replaced", "reflector", old, "by", repl)
}

// autoStep reads each auto tree's device counter, lets its controller
// decide, and writes the rates that moved.
func (a *Agent) autoStep(now time.Time) {
	if len(a.autos) == 0 {
		return
	}
	k, err := a.autoKernel()
	if err != nil {
		a.logFailure("rate: auto: cannot read the counters", "autorate", err)
		return
	}
	write := false
	for _, t := range a.autos {
		write = a.autoDecide(k, t, now) || write
	}
	for _, pr := range a.probers {
		if now.Sub(pr.compared) >= autoCompareEvery && len(pr.trees) > 0 {
			pr.compared = now
			for _, pair := range pr.pool.Compare(pr.trees[0].ctl.Baselines()) {
				a.replaceReflector(pr, pair[0], pair[1])
			}
		}
	}
	a.publishAuto(now, false)
	if !write && a.sess.LimitsHold(a.allLimits()) {
		return
	}
	a.writeLimits("autorate")
}

// autoDecide reads t's counters, lets its controller decide at now, and
// reports whether the rate it decided is to be written.
func (a *Agent) autoDecide(k *kernel.Reader, t *autoTree, now time.Time) bool {
	bytes, err := k.TxBytes(t.dev)
	if err != nil {
		t.err = err.Error()
		return false // the device is gone: the pass says so; the rate holds
	}
	t.err = ""
	t.ctl.Passed(now, bytes)
	if t.dir == policy.Ingress {
		// What the interface received is what the link delivered,
		// before the shaper (its ifb) held any of it back.
		if _, rx, err := k.LinkBytes(t.iface); err == nil {
			t.ctl.Arrived(now, rx)
		}
	}
	t.last = t.ctl.Decide(now)
	return t.written == 0 || moved(t.written, t.last.Rate)
}

// moved reports whether the rate moved enough from what was written to
// write it again.
func moved(written, r units.Rate) bool {
	d := float64(r) - float64(written)
	return d > autoWriteStep*float64(written) || -d > autoWriteStep*float64(written)
}

// autoKernel is the handle the controllers read the counters with.
func (a *Agent) autoKernel() (*kernel.Reader, error) {
	if a.autoK == nil {
		k, err := kernel.OpenReader(a.cfg.Netns)
		if err != nil {
			return nil, err
		}
		a.autoK = k
	}
	return a.autoK, nil
}

// autoLimits are the rates the controllers decided, as limits.
func (a *Agent) autoLimits() plan.Limits {
	l := plan.Limits{}
	for _, t := range a.autos {
		if t.last.Rate > 0 {
			l[plan.RateLimitOn(t.dev)] = plan.Limit{Rate: t.last.Rate}
		}
	}
	return l
}

// allLimits are the runtime layer the agent wants: the sharing
// controllers' limits and the auto rates.
func (a *Agent) allLimits() plan.Limits {
	l := a.autoLimits()
	for _, ctl := range a.ctls {
		maps.Copy(l, ctl.limits)
	}
	return l
}

// writeLimits writes the runtime layer outside a pass, on the last
// settled pass's plan. Without one (a pass is due: the kernel changed
// or the policy did), the next pass writes them.
func (a *Agent) writeLimits(why string) {
	limits := a.allLimits()
	if a.sess.LimitsHold(limits) {
		a.markWritten()
		return
	}
	p, err := a.sess.PrepareLimits()
	if err != nil {
		a.log.Debug(why+": limits wait for the next pass", "why", err)
		return
	}
	defer p.Close()
	if _, err := a.sess.SetLimits(p, limits); err != nil {
		a.logFailure(why+": writing the limits failed", why, err)
		return
	}
	a.markWritten()
}

// markWritten notes the auto rates now in the session's limits.
func (a *Agent) markWritten() {
	in := a.sess.Limits()
	for _, t := range a.autos {
		if l, ok := in[plan.RateLimitOn(t.dev)]; ok && l.Rate != t.written {
			t.written = l.Rate
			a.metrics.autoWrites.Inc()
		}
	}
}

// AutoStatus is one auto tree's controller, as /api/v1/status and show
// report it.
type AutoStatus struct {
	Device    string `json:"device"`
	Interface string `json:"interface"`
	Direction string `json:"direction"`
	// State is the controller's last finding: idle, low, high, bloat,
	// stall or no-replies.
	State string `json:"state"`
	// RateBytesPerSecond is the rate it decided; Written the one in the
	// kernel (they differ by less than half a percent, or while a write
	// waits for a pass).
	RateBytesPerSecond    uint64  `json:"rate_bytes_per_second"`
	WrittenBytesPerSecond uint64  `json:"written_bytes_per_second"`
	MinBytesPerSecond     uint64  `json:"min_bytes_per_second"`
	BaseBytesPerSecond    uint64  `json:"base_bytes_per_second"`
	MaxBytesPerSecond     uint64  `json:"max_bytes_per_second"`
	PassedBytesPerSecond  float64 `json:"passed_bytes_per_second"`
	// DelaySeconds is the average excess delay over the baselines;
	// ThresholdSeconds the excess that counts toward bufferbloat, fitted
	// to the path's own variation where ThresholdAuto.
	DelaySeconds     float64           `json:"delay_seconds"`
	ThresholdSeconds float64           `json:"threshold_seconds"`
	ThresholdAuto    bool              `json:"threshold_auto"`
	Probe            string            `json:"probe"`
	Reflectors       []ReflectorStatus `json:"reflectors"`
	// Replaced counts the reflectors replaced since the agent started.
	Replaced uint64 `json:"reflectors_replaced"`
	Error    string `json:"error,omitzero"`
}

// ReflectorStatus is one reflector of an auto tree.
type ReflectorStatus struct {
	Addr            string  `json:"addr"`
	Active          bool    `json:"active"`
	BaselineSeconds float64 `json:"baseline_seconds,omitzero"`
	Lost            uint64  `json:"lost"`
}

// publishAuto copies the controllers' state where the HTTP server and
// the metrics read it: at once when force or what an operator acts on
// changed, else every autoPublishEvery (each publication moves the
// generation, which makes the server encode its replies again).
func (a *Agent) publishAuto(now time.Time, force bool) {
	out := make([]AutoStatus, 0, len(a.autos))
	for _, t := range a.autos {
		s := AutoStatus{Device: t.dev, Interface: t.iface, Direction: t.dir, State: t.last.State.String(),
			RateBytesPerSecond: uint64(t.last.Rate), WrittenBytesPerSecond: uint64(t.written),
			MinBytesPerSecond: uint64(t.cfg.MinBps), BaseBytesPerSecond: uint64(t.cfg.BaseBps), MaxBytesPerSecond: uint64(t.cfg.MaxBps),
			PassedBytesPerSecond: t.last.Passed / 8, DelaySeconds: t.last.AvgDelta.Seconds(), Probe: t.cfg.Probe, Error: t.err,
			ThresholdSeconds: t.ctl.Threshold().Seconds(), ThresholdAuto: t.ctl.Config().AutoThreshold}
		if t.last.Rate == 0 {
			s.RateBytesPerSecond, s.State = uint64(t.ctl.Rate()), "starting"
		}
		if pr := t.prober; pr != nil {
			s.Replaced = pr.replaced
			if s.Error == "" {
				s.Error = pr.err
			}
			base := t.ctl.Baselines()
			active := pr.pool.Active()
			for _, r := range t.cfg.Reflectors {
				n := r.String()
				s.Reflectors = append(s.Reflectors, ReflectorStatus{Addr: n, Active: slices.Contains(active, n),
					BaselineSeconds: base[n].Seconds(), Lost: pr.late[n]})
			}
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(x, y AutoStatus) int { return strings.Compare(x.Device, y.Device) })
	a.mu.Lock()
	defer a.mu.Unlock()
	if !force && (now.Sub(a.autoPublished) < autoPublishEvery && sameAutoKeys(a.auto, out) || reflect.DeepEqual(a.auto, out)) {
		return
	}
	a.auto, a.autoPublished = out, now
	a.gen++
}

// sameAutoKeys reports whether x and y agree on what an operator acts
// on: each tree's state, written rate, error and reflectors.
func sameAutoKeys(x, y []AutoStatus) bool {
	return slices.EqualFunc(x, y, func(p, q AutoStatus) bool {
		return p.Device == q.Device && p.State == q.State && p.WrittenBytesPerSecond == q.WrittenBytesPerSecond &&
			p.Error == q.Error && p.Replaced == q.Replaced && slices.EqualFunc(p.Reflectors, q.Reflectors, func(r, s ReflectorStatus) bool {
			return r.Addr == s.Addr && r.Active == s.Active && r.Lost == s.Lost
		})
	})
}

// autoCollector sends rate: auto's metrics from the last step's status.
type autoCollector struct{ a *Agent }

var autoStates = []string{"starting", "idle", "low", "high", "bloat", "stall", "no-replies"}

var (
	autoLabels  = []string{"device", "direction"}
	autoRateD   = prometheus.NewDesc("sluice_autorate_rate_bytes_per_second", "The rate rate: auto decided for the direction, bytes per second.", autoLabels, nil)
	autoBoundD  = prometheus.NewDesc("sluice_autorate_bound_bytes_per_second", "rate: auto's min, base and max, bytes per second.", append(autoLabels, "bound"), nil)
	autoPassedD = prometheus.NewDesc("sluice_autorate_passed_bytes_per_second", "What the direction's device sent over the controller's last load span, bytes per second.", autoLabels, nil)
	autoDelayD  = prometheus.NewDesc("sluice_autorate_delay_seconds", "The average delay of the reflectors' replies above their baselines (the queue the controller reads).", autoLabels, nil)
	autoThreshD = prometheus.NewDesc("sluice_autorate_threshold_seconds", "The delay above the baselines that counts toward bufferbloat: delay_threshold, or with auto what the path's own variation shows.", autoLabels, nil)
	autoStateD  = prometheus.NewDesc("sluice_autorate_state", "1 for the controller's state (idle, low, high, bloat, stall, no-replies), 0 for the others.", append(autoLabels, "state"), nil)
	autoBaseD   = prometheus.NewDesc("sluice_autorate_baseline_seconds", "A reflector's baseline delay (the path without a queue).", append(autoLabels, "reflector"), nil)
	autoActiveD = prometheus.NewDesc("sluice_autorate_reflector_active", "1 while the reflector is pinged, 0 while it waits as a spare.", append(autoLabels, "reflector"), nil)
	autoLostD   = prometheus.NewDesc("sluice_autorate_reflector_lost_total", "Requests to the reflector unanswered within a second.", append(autoLabels, "reflector"), nil)
	autoReplD   = prometheus.NewDesc("sluice_autorate_reflectors_replaced_total", "Reflectors replaced (late too often, or a baseline far above the others').", autoLabels, nil)
)

func (c autoCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{autoRateD, autoBoundD, autoPassedD, autoDelayD, autoThreshD, autoStateD, autoBaseD, autoActiveD, autoLostD, autoReplD} {
		ch <- d
	}
}

func (c autoCollector) Collect(ch chan<- prometheus.Metric) {
	c.a.mu.RLock()
	st := c.a.auto
	c.a.mu.RUnlock()
	g := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	for _, s := range st {
		g(autoRateD, float64(s.RateBytesPerSecond), s.Device, s.Direction)
		g(autoBoundD, float64(s.MinBytesPerSecond), s.Device, s.Direction, "min")
		g(autoBoundD, float64(s.BaseBytesPerSecond), s.Device, s.Direction, "base")
		g(autoBoundD, float64(s.MaxBytesPerSecond), s.Device, s.Direction, "max")
		g(autoPassedD, s.PassedBytesPerSecond, s.Device, s.Direction)
		g(autoDelayD, s.DelaySeconds, s.Device, s.Direction)
		g(autoThreshD, s.ThresholdSeconds, s.Device, s.Direction)
		for _, state := range autoStates {
			v := 0.0
			if state == s.State {
				v = 1
			}
			g(autoStateD, v, s.Device, s.Direction, state)
		}
		for _, r := range s.Reflectors {
			if r.BaselineSeconds != 0 {
				g(autoBaseD, r.BaselineSeconds, s.Device, s.Direction, r.Addr)
			}
			active := 0.0
			if r.Active {
				active = 1
			}
			g(autoActiveD, active, s.Device, s.Direction, r.Addr)
			ch <- prometheus.MustNewConstMetric(autoLostD, prometheus.CounterValue, float64(r.Lost), s.Device, s.Direction, r.Addr)
		}
		ch <- prometheus.MustNewConstMetric(autoReplD, prometheus.CounterValue, float64(s.Replaced), s.Device, s.Direction)
	}
}
