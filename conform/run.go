package conform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"sluice/agent"
	"sluice/bpf"
	"sluice/engine"
	"sluice/features"
	"sluice/kernel"
	"sluice/lab"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/stats"
	"sluice/units"
)

// Options shape a conformance run.
type Options struct {
	// Name names the bed (namespaces sllab-NAME-...).
	Name string
	// Queues is the number of transmit queues of the bed's copy of each
	// device; 0 takes the real device's where this host has one of that
	// name, else 1.
	Queues int
	// RTT is the round trip beyond each device (0: none).
	RTT time.Duration
	// Settle is left out at the start of each cell; Measure is how long
	// its counters are read over.
	Settle, Measure time.Duration
	// Scale multiplies every rate of the policy; 0 picks one per tree
	// so that its rate is at most half of what the bed carries unshaped
	// toward its device (measured first), 1 keeps the policy's rates.
	Scale float64
	// Parallel is how many runs share this machine's CPUs at once (0
	// and 1: this one only). The automatic scale divides what the bed
	// carries among them: a bed measured while another was between
	// cells would otherwise run a tree at a rate the machine carries
	// only alone (examples/isp.yaml's 1 Gbit/s beside a second bed:
	// its lone flow 8% under its share).
	Parallel int
	// Hosts is how many hosts of each per_host class are driven.
	Hosts int
	// Trees, if set, names the trees to run ("eth0/egress").
	Trees []string
	// Cells, if set, gives a tree's demand patterns instead of the
	// automatic ones (the conformance matrix uses it); nil for a tree
	// keeps its automatic ones.
	Cells func(tree string, ss []*Subject) []Cell
	// Limit, if set, gives for a tree's cell the plan note that explains
	// why the kernel cannot meet the reference there (a documented limit,
	// docs/sharing.md; "" for none). A cell that fails where its tree's
	// plan says that note is measured once, not again (a second look
	// cannot change what the data plane does), and its report names the
	// note (CellReport.Limit).
	Limit func(tree, cell string) string
	// Log receives progress lines (nil: none).
	Log io.Writer
	// Keep leaves the bed up after the run (lab down NAME removes it).
	Keep bool

	// afterCalibrate, for tests, runs once the plain limits are
	// measured: a fault injected into what the run believes of its bed.
	afterCalibrate func(trees []*tree)
	// afterApply, for tests, runs each time the policy (not a plain
	// limit) has been applied, in gateway namespace gw: a fault injected
	// into the kernel's objects.
	afterApply func(gw string)
}

// flowShare is the most of a lone flow's rate each flow of a subject
// must carry (Run gives subjects flows enough).
const flowShare = 0.4

// minEfficiency is the least of a tree's rate a plain limit must carry
// on the bed for its cells to be judged (an emulated guest carries 90%
// and more; a bed that carries less is broken, not slow).
const minEfficiency = 0.5

// Defaults for a run.
const (
	DefaultRTT     = 5 * time.Millisecond
	DefaultSettle  = 2 * time.Second
	DefaultMeasure = 3 * time.Second
	DefaultHosts   = 8
)

func (o *Options) fill() {
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
	}
	if o.Measure <= 0 {
		o.Measure = DefaultMeasure
	}
	if o.Hosts <= 0 {
		o.Hosts = DefaultHosts
	}
	if o.Name == "" {
		o.Name = fmt.Sprintf("cf%d", os.Getpid()%100000)
	}
}

// missingQdisc finds the planner's refusal of a qdisc the kernel lacks.
var missingQdisc = regexp.MustCompile(`this kernel has no (\S+) qdisc|needs the (\S+) qdisc \(\S+\), which this kernel lacks`)

// Run drives pol's trees in a bed and compares what each subject got
// with the reference (docs/sharing.md, Conformance).
func Run(ctx context.Context, pol *policy.Policy, opt Options) (*Report, error) {
	opt.fill()
	r := &runner{pol: pol, opt: opt, rep: &Report{Policy: pol.File, RTT: opt.RTT.Seconds(), Settle: opt.Settle.Seconds(),
		Measure: opt.Measure.Seconds()}}
	if rep, err := features.ProbeCached(records.Dir("")); err == nil {
		r.rep.Kernel = rep.Kernel
		// Timed where the kernel lets it and the plan takes it: the
		// verdict is the policy's either way.
		if feats := rep.Features(); feats.BPF {
			// The planner settles each tree's classifier (auto).
			if _, err := plan.Build(pol, feats, nil); err == nil {
				if t, err := timed(pol, timeable(pol)); err == nil {
					if _, err := plan.Build(t, feats, nil); err == nil {
						r.pol = t
					}
				}
			}
		}
	}
	var devs []string
	queues := map[string]int{}
	for _, in := range pol.Interfaces {
		devs = append(devs, in.Name)
		queues[in.Name] = opt.Queues
		if opt.Queues <= 0 {
			queues[in.Name] = hostQueues(in.Name)
		}
	}
	r.queues = queues
	release, err := lab.Hold(opt.Name)
	if err != nil {
		return nil, err
	}
	defer release()
	b, err := newBed(opt.Name, devs, queues, opt.RTT)
	if err != nil {
		return nil, err
	}
	r.bed = b
	if !opt.Keep {
		defer b.down()
	}
	r.logf("bed %s up: gateway %s with %s", opt.Name, b.gw, strings.Join(devs, ", "))
	if err := r.run(ctx); err != nil {
		return nil, err
	}
	// Nothing measured is no pass: a verdict that cannot fail says
	// nothing (every tree skipped, say, because no class could be
	// driven).
	r.rep.Pass = r.rep.Measured() > 0
	for _, t := range r.rep.Trees {
		if !t.Pass && t.Skipped == "" {
			r.rep.Pass = false
		}
	}
	return r.rep, nil
}

// hostQueues is the transmit queues of this host's device dev (the
// driver's real ones), or 1.
func hostQueues(dev string) int {
	ents, err := os.ReadDir("/sys/class/net/" + dev + "/queues")
	if err != nil {
		return 1
	}
	n := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "tx-") {
			n++
		}
	}
	return max(n, 1)
}

type runner struct {
	pol    *policy.Policy
	opt    Options
	bed    *bed
	rep    *Report
	queues map[string]int
	k      *kernel.Kernel
	// agentLog, where SLUICE_CONFORM_AGENT_LOG keeps the agent's log,
	// also gets when each measurement starts and ends.
	agentLog *slog.Logger
	// agentStop stops the agent that runs the sharing controllers of
	// agentTrees (nil: none runs).
	agentStop  func()
	agentTrees []*tree
}

func (r *runner) logf(format string, args ...any) {
	if r.opt.Log != nil {
		fmt.Fprintf(r.opt.Log, format+"\n", args...)
	}
}

// tree is one tree of the policy under test.
type tree struct {
	in   *policy.Interface
	t    *policy.Tree
	key  string // eth0/egress
	dev  string // the device its qdiscs are on (the ifb for ingress)
	subs []*Subject
	rep  *TreeReport
	// ref is the flow a plain limit is measured with: the first
	// subject's TCP flow, else a TCP flow between addresses no rule
	// names (a plain limit classifies nothing).
	ref Flow
}

func (r *runner) trees() []*tree {
	var out []*tree
	for _, in := range r.pol.Interfaces {
		for _, t := range []*policy.Tree{in.Egress, in.Ingress} {
			if t == nil {
				continue
			}
			key := in.Name + "/" + t.Dir
			if len(r.opt.Trees) > 0 && !contains(r.opt.Trees, key) {
				continue
			}
			tr := &tree{in: in, t: t, key: key, dev: in.Name}
			if t.Dir == policy.Ingress {
				tr.dev = policy.IfbName(in)
			}
			tr.rep = &TreeReport{Interface: in.Name, Direction: t.Dir, Device: tr.dev, Queues: r.queues[in.Name]}
			out = append(out, tr)
		}
	}
	return out
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func (r *runner) run(ctx context.Context) error {
	trees := r.trees()
	if len(trees) == 0 {
		return errors.New("no tree to run (the policy has none, or --tree names none of them)")
	}
	// How fast the bed is, and so the scale.
	if err := r.scale(ctx, trees); err != nil {
		return err
	}
	for _, tr := range trees {
		tr.rep.Rate = bits(tr.t.RateBps)
		if tr.t.Police != nil {
			tr.rep.Skipped = "a policer without a tree: nothing is shared"
			continue
		}
		tr.subs = subjects(tr.t, r.opt.Hosts)
		tr.rep.Subjects = tr.subs
		tr.ref = referenceFlow(tr.t, tr.subs)
	}
	defer func() {
		if r.k != nil {
			r.k.Close()
		}
	}()
	// The bed's own efficiency: what a plain limit at each tree's rate
	// carries here, with one flow (the reference for utilisation).
	if err := r.calibrate(ctx, trees); err != nil {
		return err
	}
	if r.opt.afterCalibrate != nil {
		r.opt.afterCalibrate(trees)
	}
	// The policy itself.
	p, err := r.applyPolicy()
	if err != nil {
		if m := missingQdisc.FindStringSubmatch(err.Error()); m != nil {
			for _, tr := range trees {
				if tr.rep.Skipped == "" {
					tr.rep.Skipped = "the kernel has no " + m[1] + m[2] + " qdisc"
				}
			}
			r.rep.Trees = treeReports(trees)
			return nil
		}
		return fmt.Errorf("applying the policy: %w", err)
	}
	controlled := false
	for _, tr := range trees {
		if d := planned(p, tr); d != nil {
			describeTree(tr.rep, tr.t, d)
			tr.rep.Notes = d.Notes
			tr.rep.Notes = append(tr.rep.Notes, d.Sharing...)
			for _, s := range tr.subs {
				if sh, ok := d.Alloc.Shards[s.Name]; ok && tr.rep.Shards > 1 {
					s.Shard = int(sh) + 1
				}
			}
			controlled = controlled || len(d.Controllers) > 0
		}
	}
	// A sharing controller runs in the agent: run it, as sluice agent
	// would, for the whole run.
	if controlled {
		if r.agentStop, err = r.startAgent(trees); err != nil {
			return err
		}
		r.agentTrees = trees
		defer func() {
			if r.agentStop != nil {
				r.agentStop()
			}
		}()
	}
	for _, tr := range trees {
		if tr.rep.Skipped != "" {
			continue
		}
		if err := r.runTree(ctx, tr); err != nil {
			return fmt.Errorf("%s: %w", tr.key, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	r.rep.Trees = treeReports(trees)
	return nil
}

func treeReports(trees []*tree) []*TreeReport {
	var out []*TreeReport
	for _, tr := range trees {
		out = append(out, tr.rep)
	}
	return out
}

func planned(p *plan.Plan, tr *tree) *plan.Device {
	for _, d := range p.Devices {
		if d.Name == tr.dev && d.Interface == tr.in.Name && d.Dir == tr.t.Dir {
			return d
		}
	}
	return nil
}

// describeTree notes what the planner made of t: backend, classifier,
// shards and leaves.
func describeTree(tr *TreeReport, t *policy.Tree, d *plan.Device) {
	tr.Backend = "htb"
	if t.EDT() {
		tr.Backend = "edt"
	}
	tr.Classifier = "u32"
	if t.BPF || t.EDT() {
		tr.Classifier = "bpf"
	}
	tr.Shards = 1
	leaves := map[string]bool{}
	roots := 0
	for _, c := range d.Classes {
		if c.Name == "(root)" {
			roots++
		}
		if c.Leaf != "" {
			leaves[c.Leaf] = true
		}
	}
	if roots > 1 {
		tr.Shards = roots
	}
	for l := range leaves {
		tr.Leaves = append(tr.Leaves, l)
	}
	sort.Strings(tr.Leaves)
}

// startAgent runs sluice's agent on the gateway with the policy (its
// rates scaled as the run's), until stop.
func (r *runner) startAgent(trees []*tree) (stop func(), err error) {
	file, cleanup, err := writeEffective(r.pol)
	if err != nil {
		return nil, err
	}
	scales := map[string]float64{}
	for _, tr := range trees {
		scales[tr.key] = tr.rep.Scale
	}
	// SLUICE_CONFORM_AGENT_LOG=FILE keeps the agent's debug log (its
	// controllers' decisions every quantum): how a controlled cell's
	// deviation is explained.
	var logTo io.Writer = io.Discard
	if name := os.Getenv("SLUICE_CONFORM_AGENT_LOG"); name != "" {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW, 0o644)
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("SLUICE_CONFORM_AGENT_LOG: %w", err)
		}
		prev := cleanup
		cleanup = func() { r.agentLog = nil; f.Close(); prev() }
		logTo = f
		r.agentLog = slog.New(slog.NewTextHandler(f, nil))
	}
	ag, err := agent.New(agent.Config{Policy: file, Netns: r.bed.gw, Interval: time.Second,
		Log: slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Transform: func(p *policy.Policy) {
			for _, in := range p.Interfaces {
				for _, t := range []*policy.Tree{in.Egress, in.Ingress} {
					if t != nil {
						t.ScaleRates(scales[in.Name+"/"+t.Dir])
					}
				}
			}
		}})
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("starting the agent for the sharing controller: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ag.Run(ctx)
	}()
	r.logf("the agent runs the sharing controller")
	return func() {
		cancel()
		<-done
		cleanup()
	}, nil
}

// applyPolicy applies the policy under test.
func (r *runner) applyPolicy() (*plan.Plan, error) {
	p, err := r.apply(r.pol)
	if err == nil && r.opt.afterApply != nil {
		r.opt.afterApply(r.bed.gw)
	}
	return p, err
}

// apply makes the gateway carry pol, as sluice apply does.
func (r *runner) apply(pol *policy.Policy) (*plan.Plan, error) {
	p, err := engine.PreparePolicy(pol, engine.Options{Netns: r.bed.gw, LockTimeout: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if _, err := p.Apply(); err != nil {
		return nil, err
	}
	// The counters are read through sluice's records of what it applied.
	if r.k != nil {
		r.k.Close()
	}
	if r.k, err = kernel.Open(r.bed.gw); err != nil {
		return nil, err
	}
	return p.Plan, nil
}

// scale measures what the bed carries unshaped toward each device and
// scales each tree's rates so that its rate is at most half of it
// (Options.Scale 0), or every tree's by the scale given.
func (r *runner) scale(ctx context.Context, trees []*tree) error {
	if f := r.opt.Scale; f > 0 {
		for _, tr := range trees {
			tr.t.ScaleRates(f)
			tr.rep.Scale = f
		}
		return nil
	}
	capacity := map[string]float64{}
	for _, tr := range trees {
		tr.rep.Scale = 1
		if tr.t.Police != nil {
			continue
		}
		c, done := capacity[tr.in.Name]
		if !done {
			var err error
			if c, err = r.capacity(ctx, tr); err != nil {
				return fmt.Errorf("measuring the bed: %w", err)
			}
			capacity[tr.in.Name] = c
			r.rep.Capacity = append(r.rep.Capacity, DeviceCapacity{Device: tr.in.Name, Bps: c})
			r.logf("the bed carries %s unshaped toward %s", units.Bits(c), tr.in.Name)
		}
		share, ours := c/float64(max(r.opt.Parallel, 1)), "what the bed carries"
		if r.opt.Parallel > 1 {
			ours = fmt.Sprintf("its part (1/%d) of %s", r.opt.Parallel, ours)
		}
		if need := 2 * bits(tr.t.RateBps); share > 0 && need > share {
			f := niceScale(share / need)
			tr.t.ScaleRates(f)
			tr.rep.Scale = f
			r.logf("%s: rates x%g, so that the tree needs at most half of %s", tr.key, f, ours)
		}
	}
	return nil
}

// niceScale rounds f down to 1, 2 or 5 times a power of ten.
func niceScale(f float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(f)))
	for _, m := range []float64{5, 2, 1} {
		if m*p <= f {
			return m * p
		}
	}
	return p
}

// capacity is what four greedy TCP flows get through the bed toward
// tr's device with no policy, in bits/s of goodput.
func (r *runner) capacity(ctx context.Context, tr *tree) (float64, error) {
	src, dst := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	flows := make([]Flow, 4)
	for i := range flows {
		flows[i] = Flow{Proto: "tcp", Src: netip.AddrPortFrom(src, uint16(41000+i)), Dst: netip.AddrPortFrom(dst, 5001)}
	}
	if err := r.bed.route(tr.in.Name, policy.Egress, flows, false); err != nil {
		return 0, err
	}
	defer r.bed.route(tr.in.Name, policy.Egress, flows, true)
	var ds []drive
	for i := range flows {
		ds = append(ds, drive{flow: flows[i], idx: i})
	}
	res, err := r.drive(ctx, tr.in.Name, policy.Egress, ds, 500*time.Millisecond, 1500*time.Millisecond, nil)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, g := range res.goodput {
		sum += g
	}
	return sum * 1514 / 1448, nil // on the wire, as a shaper counts
}

// calibrate applies a plain limit at each tree's rate and measures what
// one TCP flow gets through it: the bed's efficiency at that rate (an
// emulated machine's late timers cost every HTB alike).
func (r *runner) calibrate(ctx context.Context, trees []*tree) error {
	ref, err := r.referencePolicy(trees)
	if err != nil {
		return err
	}
	if _, err := r.apply(ref); err != nil {
		if m := missingQdisc.FindStringSubmatch(err.Error()); m != nil {
			for _, tr := range trees {
				tr.rep.Skipped = "the kernel has no " + m[1] + m[2] + " qdisc"
			}
			return nil
		}
		return fmt.Errorf("applying a plain limit: %w", err)
	}
	for _, tr := range trees {
		if tr.rep.Skipped != "" {
			continue
		}
		got, err := r.measureReference(ctx, tr, false)
		if err != nil {
			return err
		}
		if got < minEfficiency*bits(tr.t.RateBps) {
			// A bed that cannot carry a flow through a plain limit
			// proves nothing about the policy: no cell is judged
			// against a reference it never met.
			tr.rep.Skipped = fmt.Sprintf("a plain %s limit carried only %s on this bed (flow %s): the bed cannot carry the tree's rate, so no share can be judged",
				units.Bits(bits(tr.t.RateBps)), units.Bits(got), tr.ref.describe())
			r.logf("%s: %s", tr.key, tr.rep.Skipped)
			continue
		}
		tr.rep.Reference = got
		tr.rep.Efficiency = got / bits(tr.t.RateBps)
		r.logf("%s: a plain %s limit carried %s (%.0f%%)", tr.key, units.Bits(bits(tr.t.RateBps)), units.Bits(got), 100*tr.rep.Efficiency)
	}
	return nil
}

// referencePolicy is a plain limit at the rate of each of trees, on its
// interface and in its direction, with the tree's backend.
func (r *runner) referencePolicy(trees []*tree) (*policy.Policy, error) {
	var b strings.Builder
	b.WriteString("interfaces:\n")
	for _, in := range r.pol.Interfaces {
		var dirs []string
		for _, tr := range trees {
			if tr.in == in && tr.t.Police == nil && tr.rep.Skipped == "" {
				backend := "htb"
				if tr.t.EDT() {
					backend = "edt"
				}
				dirs = append(dirs, fmt.Sprintf("    %s: {rate: %dbit, backend: %s}\n", tr.t.Dir, uint64(bits(tr.t.RateBps)), backend))
			}
		}
		if len(dirs) > 0 {
			fmt.Fprintf(&b, "  - name: %s\n%s", strconv.Quote(in.Name), strings.Join(dirs, ""))
		}
	}
	ref, _, err := policy.Parse("reference.yaml", []byte(b.String()))
	if err != nil {
		return nil, fmt.Errorf("the reference policy: %w", err)
	}
	return ref, nil
}

// referenceFlow is the TCP flow a plain limit of tree t is measured
// with: the first of its subjects' TCP flows, else one between
// addresses and ports no rule names (a tree whose classes only UDP or
// pure ACKs reach still carries TCP through a plain limit).
func referenceFlow(t *policy.Tree, ss []*Subject) Flow {
	for _, s := range ss {
		if len(s.Flows) > 0 && s.Flows[0].Greedy() {
			return s.Flows[0]
		}
	}
	nb := newNeutral(t)
	for _, s := range ss {
		for _, f := range append(s.Flows, s.flowUDP()...) {
			nb.use(f.Src.Addr(), true)
			nb.use(f.Dst.Addr(), false)
		}
	}
	return Flow{Proto: "tcp", Src: netip.AddrPortFrom(nb.addr(false), nb.port(&nb.nextSource)),
		Dst: netip.AddrPortFrom(nb.addr(false), nb.port(&nb.nextPort))}
}

// measureReference drives tr's reference flow through the plain limit
// the gateway carries now, and gives what its device counted (bits/s).
// Routed: the tree's flows are routed already (runTree's), and stay.
func (r *runner) measureReference(ctx context.Context, tr *tree, routed bool) (float64, error) {
	flow := tr.ref
	if !routed {
		if err := r.bed.route(tr.in.Name, tr.t.Dir, []Flow{flow}, false); err != nil {
			return 0, err
		}
		defer r.bed.route(tr.in.Name, tr.t.Dir, []Flow{flow}, true)
	}
	res, err := r.drive(ctx, tr.in.Name, tr.t.Dir, []drive{{flow: flow}}, r.opt.Settle, r.opt.Measure, []string{tr.dev})
	if err != nil {
		return 0, err
	}
	return res.total[tr.dev], nil
}

// recalibrate measures tr's plain limit again, now, and puts the policy
// back: the bed's speed beside a cell that fell short of the first
// reading. A guest emulated on a busy machine slows for minutes at a
// time (a CI machine's 6.1 lane: a plain limit 98% at the start, a
// prio cell's total 89% twice in a row a minute later), which a reading
// taken once at the start cannot tell from a shaper that wastes the
// link. The agent, where one runs, stops meanwhile: it would put the
// policy back under the measurement.
func (r *runner) recalibrate(ctx context.Context, tr *tree) (float64, error) {
	if r.agentStop != nil {
		r.agentStop()
		r.agentStop = nil
	}
	ref, err := r.referencePolicy([]*tree{tr})
	if err != nil {
		return 0, err
	}
	if _, err := r.apply(ref); err != nil {
		return 0, fmt.Errorf("applying a plain limit again: %w", err)
	}
	got, err := r.measureReference(ctx, tr, true)
	if err != nil {
		return 0, err
	}
	if _, err := r.applyPolicy(); err != nil {
		return 0, fmt.Errorf("applying the policy again: %w", err)
	}
	if r.agentTrees != nil {
		if r.agentStop, err = r.startAgent(r.agentTrees); err != nil {
			return 0, err
		}
	}
	return got, nil
}

// runTree checks that each subject's flows land in its class, then runs
// the tree's cells.
func (r *runner) runTree(ctx context.Context, tr *tree) error {
	flows := []Flow{tr.ref}
	for _, s := range tr.subs {
		flows = append(flows, s.Flows...)
		flows = append(flows, s.flowUDP()...)
	}
	if err := r.bed.route(tr.in.Name, tr.t.Dir, flows, false); err != nil {
		return err
	}
	defer r.bed.route(tr.in.Name, tr.t.Dir, flows, true)
	// Flows of mark rules: the gateway's firewall marks them.
	if err := r.bed.mark(flows, false); err != nil {
		for _, s := range tr.subs {
			if s.NotDriven == "" && len(s.Flows) > 0 && s.Flows[0].Mark != 0 {
				s.NotDriven = fmt.Sprintf("its rules match firewall mark %#x, and the bed could not set it: %v", s.Flows[0].Mark, err)
				r.logf("%s: %s: %s", tr.key, s.Name, s.NotDriven)
			}
		}
	} else {
		defer r.bed.mark(flows, true)
	}
	// Raw ACKs and SYNs end where they arrive; without nft they draw
	// resets, which the bed carries too.
	if err := r.bed.sink(tr.in.Name, tr.t.Dir, flows, false); err != nil {
		r.logf("%s: raw flows are answered with resets: %v", tr.key, err)
	} else {
		defer r.bed.sink(tr.in.Name, tr.t.Dir, flows, true)
	}
	// The kernel's word on classification: each subject's flows must
	// land in its class.
	var driven []*Subject
	for _, s := range tr.subs {
		if s.NotDriven != "" {
			continue
		}
		if err := r.checkLanding(ctx, tr, s); err != nil {
			return err
		}
		if s.NotDriven != "" {
			r.logf("%s: %s: %s", tr.key, s.Name, s.NotDriven)
			continue
		}
		for _, m := range s.Misplaced {
			r.logf("%s: %s: left out: %s", tr.key, s.Name, m)
		}
		driven = append(driven, s)
	}
	var cells []Cell
	if r.opt.Cells != nil {
		cells = r.opt.Cells(tr.key, driven)
	}
	if cells == nil {
		cells = autoCells(tr.t, tr.key, driven)
	}
	bySubject := map[string]*Subject{}
	for _, s := range driven {
		bySubject[s.Name] = s
	}
	tr.rep.Pass = true
	// A flow can only be as greedy as the bed lets it: one TCP flow that
	// must carry much of the link falls short of it after every loss
	// (more under emulation), and the shaper rightly lends what it
	// leaves. A subject is given flows enough that none must carry more
	// than flowShare of what one flow got alone through a plain limit.
	flowCap := flowShare * tr.rep.Reference
	for _, c := range cells {
		ideal, err := Reference(tr.t, tr.subs, c)
		if err != nil {
			return err
		}
		c.Demands = append([]Demand(nil), c.Demands...)
		rated := false
		for i, d := range c.Demands {
			if s := bySubject[d.Subject]; d.Proto == "tcp" && s != nil && flowCap > 0 {
				c.Demands[i].Flows = min(max(d.Flows, int(math.Ceil(ideal[d.Subject]/flowCap))), len(s.Flows))
			}
			// A flow sent at a rate past its share is sent at a quarter
			// past it: held to its share, it proves what a flood would,
			// and a slow bed (an emulated guest's delay line) is not
			// flooded with packets the shaper drops anyway, at the TCP
			// flows' cost (the 6.1 lane: small ACKs at 25% over a 5
			// Mbit/s link, past their share of 0.6, left the TCP class
			// 2.3 of its 3.6).
			if want := 1.25 * ideal[d.Subject]; d.Proto != "tcp" && want > 0 && d.Rate > want {
				c.Demands[i].Rate, rated = want, true
			}
		}
		if rated {
			if ideal, err = Reference(tr.t, tr.subs, c); err != nil {
				return err
			}
		}
		var ds []drive
		for _, d := range c.Demands {
			s := bySubject[d.Subject]
			if s == nil {
				return fmt.Errorf("cell %q: %s is not a subject that can be driven", c.Name, d.Subject)
			}
			if d.Proto != "tcp" {
				f := s.rated(d.Proto)
				if f == nil {
					return fmt.Errorf("cell %q: %s takes no %s flow", c.Name, d.Subject, d.Proto)
				}
				ds = append(ds, drive{flow: *f, subject: s.Name, rate: d.Rate})
				continue
			}
			for i := 0; i < max(d.Flows, 1) && i < len(s.Flows); i++ {
				ds = append(ds, drive{flow: s.Flows[i], subject: s.Name, idx: i})
			}
		}
		measure := Window(r.opt.Measure, c, ideal)
		res, err := r.drive(ctx, tr.in.Name, tr.t.Dir, ds, r.opt.Settle, measure, []string{tr.dev})
		if err != nil {
			return err
		}
		v := r.judge(tr, c, ideal, res)
		cr := &CellReport{Cell: c, Verdict: v}
		// A second look is twice as long (up to maxWindow): what made
		// the first miss (an emulated guest's stall; a flow that lost a
		// window) weighs half as much in it, what the shaper does as
		// much. On a slow machine's 6.1 lane the first windows of cells
		// that then passed read 7 to 22% from the reference.
		second := max(measure, min(2*measure, maxWindow))
		if limit := r.knownLimit(tr.key, c.Name, tr.rep.Notes); !v.Pass && limit != "" {
			cr.Limit = limit
		} else if !v.Pass && v.Worst <= Tolerance && v.Utilisation < 1 {
			// Every share right, the total short: the bed's own dip (an
			// emulated guest stalls now and then, and slows for minutes
			// on a busy machine; the reference run itself read 93 to 99%
			// at one rate) or the shaper's. The plain limit once more,
			// now (recalibrate), and the cell once more, judged by the
			// lower of the plain limit's two readings: a shaper that
			// wastes the link does it again beside a plain limit that
			// does not.
			r.logf("%s: %-40s carried %s in all, short of the reference: measuring a plain limit and it again", tr.key, c.Name, units.Bits(v.MeasuredTotal))
			again, err := r.recalibrate(ctx, tr)
			if err != nil {
				return err
			}
			eff := tr.rep.Efficiency
			if e := again / bits(tr.t.RateBps); e > 0 && e < eff {
				eff = e
			}
			r.logf("%s: a plain %s limit carried %s (%.0f%%) now", tr.key, units.Bits(bits(tr.t.RateBps)), units.Bits(again), 100*again/bits(tr.t.RateBps))
			if res, err = r.drive(ctx, tr.in.Name, tr.t.Dir, ds, r.opt.Settle, second, []string{tr.dev}); err != nil {
				return err
			}
			v = r.judgeAt(tr, c, ideal, res, eff)
			cr = &CellReport{Cell: c, Verdict: v, FirstTotal: cr.Verdict.MeasuredTotal, ReferenceAgain: again, SecondWindow: second.Seconds()}
		} else if !v.Pass {
			// A share past the tolerance in one window: one flow of
			// many stalled for a moment (on the 6.1 lane's emulated
			// guest one host of eleven read 838 kbit/s for 909 once, in
			// a cell that read 1.5 to 3% in other runs; on the host a
			// shard's four hosts 1.53 Mbit/s each for 1.82 once, 11.2%,
			// and a TCP flow through a policer half its rate once,
			// 27%, in cells that read under 1% in every other run).
			// Once more, twice as long; the second must pass, and the
			// report shows both. A shaper that shares wrongly does it
			// twice.
			r.logf("%s: %-40s %.1f%% from the reference: measuring it again", tr.key, c.Name, 100*v.Worst)
			if res, err = r.drive(ctx, tr.in.Name, tr.t.Dir, ds, r.opt.Settle, second, []string{tr.dev}); err != nil {
				return err
			}
			first := v.Worst
			v = r.judge(tr, c, ideal, res)
			cr = &CellReport{Cell: c, Verdict: v, FirstWorst: first, SecondWindow: second.Seconds()}
		}
		if measure > r.opt.Measure {
			cr.Window = measure.Seconds()
		}
		tr.rep.Cells = append(tr.rep.Cells, cr)
		if !v.Pass {
			tr.rep.Pass = false
		}
		if !(v.Worst <= tr.rep.Worst) {
			tr.rep.Worst = v.Worst
		}
		word := "pass"
		if !v.Pass {
			word = "FAIL: " + v.Why
		}
		r.logf("%s: %-40s worst %5.1f%%  %s", tr.key, c.Name, 100*v.Worst, word)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if len(cells) == 0 {
		tr.rep.Skipped = "no subject can be driven"
	}
	return nil
}

// landingWindow is how long a subject's flows run to show where the
// kernel counts them.
const landingWindow = 600 * time.Millisecond

// checkLanding drives subject s's flows together for a moment and reads
// where the kernel counted them. Where some strayed, each is driven
// alone: a stray is left out of the subject (Misplaced says where it
// went), and a subject none of whose flows lands is not driven.
func (r *runner) checkLanding(ctx context.Context, tr *tree, s *Subject) error {
	link := bits(tr.t.RateBps)
	var ds []drive
	for i, f := range s.Flows {
		d := drive{flow: f, subject: s.Name, idx: i}
		if !f.Greedy() {
			d.rate = min(max(s.Rate, link/10), maxRate(f))
		}
		ds = append(ds, d)
	}
	udp := s.UDP != nil && (len(s.Flows) == 0 || *s.UDP != s.Flows[0])
	if udp {
		ds = append(ds, drive{flow: *s.UDP, subject: s.Name, rate: min(max(s.Rate, link/10), maxRate(*s.UDP))})
	}
	res, err := r.drive(ctx, tr.in.Name, tr.t.Dir, ds, 0, landingWindow, []string{tr.dev})
	if err != nil {
		return err
	}
	if _, ok := landed(res.classes, s.Name); ok {
		return nil
	}
	var keep []Flow
	for i, d := range ds {
		one, err := r.drive(ctx, tr.in.Name, tr.t.Dir, []drive{d}, 0, landingWindow, []string{tr.dev})
		if err != nil {
			return err
		}
		where, ok := landed(one.classes, s.Name)
		switch {
		case ok && i < len(s.Flows):
			keep = append(keep, d.flow)
		case ok:
		case len(one.unconnected) > 0:
			s.Misplaced = append(s.Misplaced, "its "+one.unconnected[0])
		default:
			s.Misplaced = append(s.Misplaced, fmt.Sprintf("its flow %s landed in %s, not in its class", d.flow.describe(), where))
			if udp && i == len(ds)-1 {
				s.UDP = nil
			}
		}
	}
	if len(keep) == 0 {
		s.NotDriven = s.Misplaced[0]
		if len(s.Misplaced) > 1 {
			s.NotDriven += fmt.Sprintf(" (and %d more)", len(s.Misplaced)-1)
		}
		s.Misplaced = nil
	}
	s.Flows = keep
	return nil
}

// landed reports whether what a measurement counted (bits/s by class)
// landed in class name (all but 2%), and otherwise where the most went.
func landed(classes map[string]float64, name string) (where string, ok bool) {
	in, out, most := classes[name], 0.0, 0.0
	for c, v := range classes {
		if c == name {
			continue
		}
		out += v
		if v > most {
			where, most = c, v
		}
	}
	if in > 0 && out <= 0.02*(in+out) {
		return name, true
	}
	if where == "" {
		where = "no class (nothing was counted)"
	} else if in > 0 {
		where = fmt.Sprintf("%s (%.0f%% of it; %.0f%% in its own)", where, 100*out/(in+out), 100*in/(in+out))
	}
	return where, false
}

// judge judges a cell's measurement: its total against ideal (the
// reference at the tree's rate), its shares against the reference at
// what the tree carried (ReferenceAt), never above the tree's rate.
func (r *runner) judge(tr *tree, c Cell, ideal map[string]float64, res *driven) Verdict {
	return r.judgeAt(tr, c, ideal, res, tr.rep.Efficiency)
}

// judgeAt is judge with the bed's efficiency eff.
func (r *runner) judgeAt(tr *tree, c Cell, ideal map[string]float64, res *driven, eff float64) Verdict {
	// A flow sent at a rate that its sender could not keep up (a busy
	// machine) demanded what it sent: the reference is for that demand.
	var notes []string
	short := false
	c.Demands = append([]Demand(nil), c.Demands...)
	for i, d := range c.Demands {
		if got := res.sent[d.Subject]; d.Proto != "tcp" && got > 0 && got < 0.97*d.Rate {
			notes = append(notes, fmt.Sprintf("%s's sender sent %s of its %s: judged for what it sent", d.Subject, units.Bits(got), units.Bits(d.Rate)))
			c.Demands[i].Rate, short = got, true
		}
	}
	if short {
		if again, err := Reference(tr.t, tr.subs, c); err == nil {
			ideal = again
		}
	}
	v := r.judgeCarried(tr, c, ideal, res, eff)
	for i := range v.Subjects {
		v.Subjects[i].RTT = subjectRTT(res.rtt[v.Subjects[i].Name], r.opt.RTT)
	}
	v.Notes = append(v.Notes, notes...)
	v.Notes = append(v.Notes, res.unconnected...)
	// What landed in a class no demand of the cell sends to: a flow the
	// kernel put elsewhere than its subject's class.
	sending := map[string]bool{}
	for _, d := range c.Demands {
		sending[d.Subject] = true
	}
	stray, where := 0.0, ""
	for name, bps := range res.classes {
		if !sending[name] && bps > 0 {
			stray += bps
			if where != "" {
				where += ", "
			}
			where += fmt.Sprintf("%s %s", name, units.Bits(bps))
		}
	}
	if total := v.MeasuredTotal + stray; total > 0 && stray > 0.02*total {
		v.Strays = stray
		if v.Pass {
			v.Pass = false
			v.Why = fmt.Sprintf("%.1f%% of the cell's traffic landed in classes it does not drive (%s)", 100*stray/total, where)
		}
	}
	return v
}

// judgeCarried is judgeAt's comparison of the shares and the total.
func (r *runner) judgeCarried(tr *tree, c Cell, ideal map[string]float64, res *driven, eff float64) Verdict {
	carried := 0.0
	for _, d := range c.Demands {
		carried += res.classes[d.Subject]
	}
	at := ideal
	if link := bits(tr.t.RateBps); carried > 0 && carried < link {
		if a, err := ReferenceAt(tr.t, tr.subs, c, carried); err == nil {
			at = a
		}
	}
	return Judge(c, ideal, at, res.classes, res.bySubject, eff)
}

func (f Flow) describe() string {
	return fmt.Sprintf("%s %s > %s", f.Proto, f.Src, f.Dst)
}

// drive is one flow of a measurement.
type drive struct {
	flow    Flow
	subject string
	idx     int     // TCP: its index at its sink
	rate    float64 // UDP: bits/s on the wire
}

// driven is what a measurement read: bits/s per class of the devices
// (from their counters), per device in total, and per subject of
// goodput (what the receivers read).
type driven struct {
	classes   map[string]float64
	total     map[string]float64
	goodput   []float64
	bySubject map[string]float64
	sent      map[string]float64 // flows sent at a rate: bits/s of frames they sent
	// unconnected says, per TCP flow that never connected (its SYN
	// waited behind a queue longer than the dial allows), why.
	unconnected []string
	// rtt is each class's round trips over the measurement (by name).
	rtt map[string]*stats.RTT
}

// udpPayload is the payload of conformance's UDP datagrams.
const udpPayload = 1200

// udpWire is the size on the wire of a datagram of UDP flow f.
func udpWire(f Flow) int {
	if f.Dst.Addr().Is6() {
		return udpPayload + 62
	}
	return udpPayload + 42
}

// drive runs flows from the tree's sending end to its receiving end,
// waits settle, and measures for measure: the classes' counters of devs
// and the receivers' bytes.
func (r *runner) drive(ctx context.Context, dev, dir string, ds []drive, settle, measure time.Duration, devs []string) (*driven, error) {
	sendNS, recvNS := r.bed.ends(dev, dir)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	counters := make([]*lab.FlowCounter, len(ds))
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	// One TCP sink per destination, flows told apart by index.
	sinks := map[netip.AddrPort][]*lab.FlowCounter{}
	for i, d := range ds {
		counters[i] = &lab.FlowCounter{}
		if d.flow.Proto == "tcp" {
			s := sinks[d.flow.Dst]
			for len(s) <= d.idx {
				s = append(s, &lab.FlowCounter{})
			}
			s[d.idx] = counters[i]
			sinks[d.flow.Dst] = s
		}
	}
	for at, fcs := range sinks {
		c, err := lab.TCPSink(recvNS, at, fcs)
		if err != nil {
			return nil, err
		}
		closers = append(closers, c)
	}
	for i, d := range ds {
		if d.flow.Proto == "udp" {
			c, err := lab.UDPSink(recvNS, d.flow.Dst, counters[i])
			if err != nil {
				return nil, err
			}
			closers = append(closers, c)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	var unconnected []string
	for i, d := range ds {
		wg.Add(1)
		go func(d drive, fc *lab.FlowCounter) {
			defer wg.Done()
			var err error
			switch d.flow.Proto {
			case "udp":
				payload := units.FromBits(d.rate * udpPayload / float64(udpWire(d.flow)))
				err = lab.UDPSend(ctx, sendNS, d.flow.Src, d.flow.Dst, payload, udpPayload, int(d.flow.DSCP), fc)
			case "ack":
				err = lab.ACKSend(ctx, sendNS, d.flow.Src, d.flow.Dst, d.rate, int(d.flow.DSCP), fc)
			case "syn":
				err = lab.SYNSend(ctx, sendNS, d.flow.Src, d.flow.Dst, d.rate, int(d.flow.DSCP), fc)
			default:
				err = lab.TCPSend(ctx, sendNS, d.flow.Src, d.flow.Dst, d.idx, "", int(d.flow.DSCP), fc)
			}
			var timeout net.Error
			switch {
			case err == nil || ctx.Err() != nil:
			case d.flow.Proto == "tcp" && errors.As(err, &timeout) && timeout.Timeout() && fc.Received() == 0:
				// A SYN behind a class's full queue: the flow carries
				// nothing, which the cell shows, and the run goes on.
				mu.Lock()
				unconnected = append(unconnected, fmt.Sprintf("flow %s could not connect (%v): its class's queue held its SYN longer than that", d.flow.describe(), err))
				mu.Unlock()
			default:
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("flow %s: %w", d.flow.describe(), err)
				}
				mu.Unlock()
			}
		}(d, counters[i])
	}
	stop := func() {
		cancel()
		wg.Wait()
	}
	select {
	case <-time.After(settle):
	case <-ctx.Done():
	}
	c0, q0, h0, t0, err := r.read(devs)
	if err != nil {
		stop()
		return nil, err
	}
	if r.agentLog != nil {
		var who []string
		for _, d := range ds {
			who = append(who, d.subject)
		}
		r.agentLog.Info("conform: measuring", "devs", devs, "subjects", who)
		defer r.agentLog.Info("conform: measured", "devs", devs)
	}
	g0, s0 := make([]uint64, len(counters)), make([]uint64, len(counters))
	for i, fc := range counters {
		g0[i], s0[i] = fc.Received(), fc.Sent()
	}
	select {
	case <-time.After(measure):
	case <-ctx.Done():
	}
	c1, _, h1, t1, err := r.read(devs)
	g1, s1 := make([]uint64, len(counters)), make([]uint64, len(counters))
	for i, fc := range counters {
		g1[i], s1[i] = fc.Received(), fc.Sent()
	}
	stop()
	if err != nil {
		return nil, err
	}
	// What the flows left queued drains before the next measurement:
	// it would be counted there, in classes that no longer send.
	r.drain(devs)
	if firstErr != nil {
		return nil, firstErr
	}
	dt := t1.Sub(t0).Seconds()
	res := &driven{bySubject: map[string]float64{}, sent: map[string]float64{}, unconnected: unconnected}
	res.classes, res.total = classRates(c0, c1, dt, devs)
	res.rtt = classRTTs(h0, h1)
	// What a class no flow here drives held queued when the measurement
	// began was left by an earlier one (a class capped far below what
	// was sent to it drains slower than drain waits: a 32 kbit/s host
	// behind a pfifo of 1000 packets takes minutes): its leaving is not
	// this measurement's traffic, nor a flow landing there.
	driving := map[string]bool{}
	for _, d := range ds {
		driving[d.subject] = true
	}
	for key, q := range q0 {
		dev, name, _ := strings.Cut(key, "\x00")
		if slices.Contains(devs, dev) && !driving[name] {
			if v, ok := res.classes[name]; ok {
				res.classes[name] = max(v-q*8/dt, 0)
			}
		}
	}
	for i, d := range ds {
		g := float64(g1[i]-g0[i]) * 8 / dt
		res.goodput = append(res.goodput, g)
		res.bySubject[d.subject] += g
		if !d.flow.Greedy() {
			sent := float64(s1[i]-s0[i]) * 8 / dt
			if d.flow.Proto == "udp" {
				sent *= float64(udpWire(d.flow)) / udpPayload // payload to frames
			}
			res.sent[d.subject] += sent
		}
	}
	return res, nil
}

// drain waits until the classes of devs hold no backlog: 5 s, and up
// to 30 s while the backlog shrinks fast enough to be gone by then (a
// host class capped at tens of kbit/s behind a long FIFO). What remains
// after that the next measurement discounts (drive).
func (r *runner) drain(devs []string) {
	if len(devs) == 0 {
		return
	}
	start := time.Now()
	var first uint64
	for ; ; time.Sleep(50 * time.Millisecond) {
		smp, err := stats.Collect(r.k.Reader(), devs)
		if err != nil {
			return
		}
		var backlog uint64
		for _, t := range smp.Trees {
			for _, c := range t.Classes {
				backlog += uint64(c.Backlog)
			}
		}
		if backlog == 0 {
			return
		}
		waited := time.Since(start)
		if first == 0 {
			first = backlog
		}
		if waited < drainWait {
			continue
		}
		// At the pace seen so far, is the rest gone within drainMax?
		gone := float64(first) - float64(backlog)
		if waited >= drainMax || gone <= 0 || float64(backlog)/gone*waited.Seconds() > (drainMax-waited).Seconds() {
			return
		}
	}
}

// drainWait and drainMax bound drain.
const drainWait, drainMax = 5 * time.Second, 30 * time.Second

// classRates turns two readings (read's, dt seconds apart) into each
// class's rate by name, and each device's total, counting only devs.
// A reading of a device holds its interface's other trees too (the
// ingress tree on its ifb), whose classes may have the same names:
// summed by name, examples/wondershaper.yaml's egress "interactive"
// counted its ingress namesake's ACKs, 22 kbit/s for an 11 kbit/s flow.
func classRates(c0, c1 map[string]float64, dt float64, devs []string) (classes, total map[string]float64) {
	classes, total = map[string]float64{}, map[string]float64{}
	for key, b1 := range c1 {
		b0, ok := c0[key]
		dev, name, _ := strings.Cut(key, "\x00")
		if !ok || !slices.Contains(devs, dev) {
			continue
		}
		v := max(b1-b0, 0) * 8 / dt
		if name == "(root)" {
			total[dev] += v
			continue
		}
		classes[name] += v
	}
	return classes, total
}

// read sums each class's bytes, and each leaf's backlog and round-trip
// histogram, by device and name (a sharded tree has a copy of a class
// per shard; an EDT tree counts per aggregate).
func (r *runner) read(devs []string) (bytes, backlog map[string]float64, rtt map[string]*bpf.RTTHist, at time.Time, err error) {
	out, queued, rtt := map[string]float64{}, map[string]float64{}, map[string]*bpf.RTTHist{}
	if len(devs) == 0 {
		return out, queued, rtt, time.Now(), nil
	}
	smp, err := stats.Collect(r.k.Reader(), devs)
	if err != nil {
		return nil, nil, nil, time.Time{}, err
	}
	for _, t := range smp.Trees {
		var aggregates float64
		for _, c := range t.Classes {
			b := float64(c.Bytes)
			if c.Leaf == "edt" {
				// Counted when paced: what waits in fq has not left.
				b -= float64(c.Backlog)
				aggregates += b
			}
			// Leaves only: an inner class counts what its children sent.
			switch {
			case c.Name == "(root)":
				out[t.Device+"\x00(root)"] += b
			case c.Leaf != "":
				out[t.Device+"\x00"+c.Name] += b
				if c.Leaf != "edt" {
					queued[t.Device+"\x00"+c.Name] += float64(c.Backlog)
				}
				if c.RTT != nil && c.RTT.Hist() != nil {
					addHist(rtt, t.Device+"\x00"+c.Name, c.RTT.Hist())
				}
			}
		}
		if t.Backend == "edt" {
			// No root class: the aggregates add up to the tree.
			out[t.Device+"\x00(root)"] = aggregates
		}
	}
	return out, queued, rtt, smp.At, nil
}

// addHist adds h to m[key].
func addHist(m map[string]*bpf.RTTHist, key string, h *bpf.RTTHist) {
	sum := m[key]
	if sum == nil {
		sum = &bpf.RTTHist{}
		m[key] = sum
	}
	for k := range sum.B {
		sum.B[k] += h.B[k]
	}
	sum.Count += h.Count
	sum.Sum += h.Sum
}

// classRTTs is each class's round trips between two readings' histograms
// (by name: the devices measured together are one cell's), for the
// classes that timed any.
func classRTTs(h0, h1 map[string]*bpf.RTTHist) map[string]*stats.RTT {
	byName := map[string]*bpf.RTTHist{}
	for key, end := range h1 {
		d := *end
		if start := h0[key]; start != nil {
			for k := range d.B {
				d.B[k] -= min(d.B[k], start.B[k])
			}
			d.Count -= min(d.Count, start.Count)
			d.Sum -= min(d.Sum, start.Sum)
		}
		_, name, _ := strings.Cut(key, "\x00")
		addHist(byName, name, &d)
	}
	out := map[string]*stats.RTT{}
	for name, h := range byName {
		if h.Count > 0 {
			out[name] = stats.NewRTT(h)
		}
	}
	return out
}

// knownLimit is the note Options.Limit gives for a tree's cell when the
// tree's plan says it, else "".
func (r *runner) knownLimit(tree, cell string, notes []string) string {
	if r.opt.Limit == nil {
		return ""
	}
	n := r.opt.Limit(tree, cell)
	if n == "" {
		return ""
	}
	for _, have := range notes {
		if strings.Contains(have, n) {
			return n
		}
	}
	return ""
}
