package lab

import (
	"sluice/units"

	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"sluice/agent"
	"sluice/engine"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/stats"
)

// Options tune a run.
type Options struct {
	// Scale multiplies every duration of the timeline (0.5 halves it).
	Scale float64
	// Log receives progress lines (nil: none).
	Log io.Writer
}

const bucket = 100 * time.Millisecond

// Apply makes the router carry policy (empty: nothing) through sluice's
// engine, exactly as `sluice apply` does. It returns the planned
// classes per device.
func Apply(b *Bed, name, text string) (map[string][]plan.ClassInfo, bool, error) {
	opts := engine.Options{Netns: b.Router, LockTimeout: 30 * time.Second}
	if strings.TrimSpace(text) == "" {
		_, err := engine.Reset(nil, true, opts, nil)
		return nil, false, err
	}
	pol, _, err := policy.Parse(name, []byte(text))
	if err != nil {
		return nil, false, err
	}
	p, err := engine.PreparePolicy(pol, opts)
	if err != nil {
		return nil, false, err
	}
	defer p.Close()
	if _, err := p.Apply(); err != nil {
		return nil, false, err
	}
	out := map[string][]plan.ClassInfo{}
	controlled := false
	for _, dev := range p.Plan.Devices {
		out[dev.Name] = dev.Classes
		controlled = controlled || len(dev.Controllers) > 0 || dev.Auto != nil
	}
	return out, controlled, nil
}

// startAgent runs sluice's agent on the router for a policy with sharing
// controllers, as `sluice agent` would: it applies nothing new (the
// policy is in force) and sets the controlled classes' ceils every
// quantum. stop ends it and waits.
func startAgent(b *Bed, name, text string) (ag *agent.Agent, stop func(), err error) {
	dir, err := os.MkdirTemp("", "sluice-lab-agent")
	if err != nil {
		return nil, nil, err
	}
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	ag, err = agent.New(agent.Config{Policy: file, Netns: b.Router, Interval: time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("%s: starting the agent: %w", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ag.Run(ctx)
	}()
	return ag, func() {
		cancel()
		<-done
		os.RemoveAll(dir)
	}, nil
}

// missingQdisc finds the planner's refusal of a leaf, or of the EDT
// backend's fq, that the kernel lacks.
var missingQdisc = regexp.MustCompile(`this kernel has no (\S+) qdisc|needs the (\S+) qdisc \(\S+\), which this kernel lacks`)

// endpoint is one end of a flow.
type endpoint struct {
	host string
	ns   string
	addr netip.Addr
}

func (b *Bed) endpoints(names []string, family int) ([]endpoint, error) {
	var out []endpoint
	for _, n := range names {
		if n == "clients" {
			for i := range b.Clients {
				ep, err := b.endpoints([]string{fmt.Sprintf("client%d", i+1)}, family)
				if err != nil {
					return nil, err
				}
				out = append(out, ep...)
			}
			continue
		}
		ns, a4, a6, err := b.Host(n)
		if err != nil {
			return nil, err
		}
		a := a4
		if family == 6 {
			a = a6
		}
		out = append(out, endpoint{host: n, ns: ns, addr: a})
	}
	return out, nil
}

// windows returns when an item runs, relative to the start.
func (t *Traffic) windows(s *Scenario, phases []Phase, ds []time.Duration, total time.Duration, scale float64) ([][2]time.Duration, error) {
	if len(t.Phases) > 0 {
		var out [][2]time.Duration
		var at time.Duration
		for i, p := range phases {
			for _, want := range t.Phases {
				if want != p.Name {
					continue
				}
				// Consecutive phases make one continuous transfer, not a
				// new one (in slow start) at each boundary.
				if n := len(out); n > 0 && out[n-1][1] == at {
					out[n-1][1] = at + ds[i]
				} else {
					out = append(out, [2]time.Duration{at, at + ds[i]})
				}
			}
			at += ds[i]
		}
		return out, nil
	}
	start, dur := time.Duration(0), total
	var err error
	if t.Start != "" {
		if start, err = time.ParseDuration(t.Start); err != nil {
			return nil, fmt.Errorf("traffic %s: start %q: %v", t.Name, t.Start, err)
		}
		start = time.Duration(float64(start) * scale)
		dur = total - start
	}
	if t.Duration != "" {
		if dur, err = time.ParseDuration(t.Duration); err != nil {
			return nil, fmt.Errorf("traffic %s: duration %q: %v", t.Name, t.Duration, err)
		}
		dur = time.Duration(float64(dur) * scale)
	}
	return [][2]time.Duration{{start, min(start+dur, total)}}, nil
}

// Run runs one variant of s on b.
func Run(ctx context.Context, b *Bed, s *Scenario, v Variant, opt Options) (*Result, error) {
	if opt.Scale <= 0 {
		opt.Scale = 1
	}
	logf := func(format string, args ...any) {
		if opt.Log != nil {
			fmt.Fprintf(opt.Log, format+"\n", args...)
		}
	}
	r := &Result{Scenario: s.Name, Variant: v.Name, Note: v.Note, Bucket: bucket.Seconds(), Matrix: v.Matrix}
	text, err := s.policyText(v)
	if err != nil {
		return nil, err
	}
	r.Policy = text
	// Every class's round trips from its own packets, beside the pings.
	text = withRTT(text)
	classes, controlled, err := Apply(b, fmt.Sprintf("%s/%s", s.Name, v.Name), text)
	if err != nil {
		if m := missingQdisc.FindStringSubmatch(err.Error()); m != nil {
			r.Skipped = "the kernel has no " + m[1] + m[2] + " qdisc"
			logf("%s: skipped: %v", v.Name, err)
			return r, nil
		}
		return nil, fmt.Errorf("variant %s: applying its policy: %w", v.Name, err)
	}
	phases, ds, total, err := s.phaseTimes(opt.Scale)
	if err != nil {
		return nil, err
	}
	settle := time.Second
	if s.Settle != "" {
		settle, _ = time.ParseDuration(s.Settle)
	}
	r.Duration = total.Seconds()
	nb := int(total/bucket) + 1

	// Servers, flows and probes.
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	type job struct {
		win [][2]time.Duration
		run func(ctx context.Context) error
	}
	var jobs []job
	var flows []*FlowSeries
	var counters []*FlowCounter
	var probes []*probeLog
	t0 := time.Now() // replaced just before the start
	t0p := &t0
	for i, t := range s.TrafficFor(v) {
		t := t
		fam := t.Family
		if fam == 0 {
			fam = 4
		}
		from, err := b.endpoints(t.From, fam)
		if err != nil {
			return nil, fmt.Errorf("traffic %s: %w", t.Name, err)
		}
		to, err := b.endpoints(t.To, fam)
		if err != nil {
			return nil, fmt.Errorf("traffic %s: %w", t.Name, err)
		}
		win, err := t.windows(s, phases, ds, total, opt.Scale)
		if err != nil {
			return nil, err
		}
		port := t.Port
		if port == 0 {
			port = 20000 + 20*i
		}
		dscp := 0
		if t.DSCP != "" {
			dscp, _ = parseDSCP(t.DSCP)
		}
		interval := 100 * time.Millisecond
		if t.Interval != "" {
			interval, _ = time.ParseDuration(t.Interval)
		}
		for _, f := range from {
			for _, d := range to {
				host := f.host
				if host == "server" {
					host = d.host
				}
				at := netip.AddrPortFrom(d.addr, uint16(port))
				switch t.Type {
				case "tcp", "udp":
					n := max(t.Flows, 1)
					if t.Type == "udp" {
						n = 1
					}
					var fcs []*FlowCounter
					for k := 0; k < n; k++ {
						fc := &FlowCounter{}
						fcs = append(fcs, fc)
						counters = append(counters, fc)
						name := t.Name
						if n > 1 || len(from)*len(to) > 1 {
							name = fmt.Sprintf("%s#%s-%s-%d", t.Name, f.host, d.host, k+1)
						}
						flows = append(flows, &FlowSeries{Name: name, Item: t.Name, Type: t.Type, From: f.host, To: d.host,
							Host: host, Class: t.Class, CC: t.CC, Goodput: make([]float64, nb)})
					}
					if t.Type == "tcp" {
						c, err := TCPSink(d.ns, at, fcs)
						if err != nil {
							return nil, fmt.Errorf("traffic %s: %w", t.Name, err)
						}
						closers = append(closers, c)
						for k, fc := range fcs {
							k, fc, f := k, fc, f
							jobs = append(jobs, job{win, func(ctx context.Context) error {
								return TCPSend(ctx, f.ns, netip.AddrPort{}, at, k, t.CC, dscp, fc)
							}})
						}
					} else {
						c, err := UDPSink(d.ns, at, fcs[0])
						if err != nil {
							return nil, fmt.Errorf("traffic %s: %w", t.Name, err)
						}
						closers = append(closers, c)
						rate, _ := parseRate(t.Rate)
						size := t.Size
						if size == 0 {
							size = 1200
						}
						f, fc := f, fcs[0]
						jobs = append(jobs, job{win, func(ctx context.Context) error {
							return UDPSend(ctx, f.ns, netip.AddrPort{}, at, rate, size, dscp, fc)
						}})
					}
				case "rr", "udp-echo", "ping":
					log := &probeLog{}
					probes = append(probes, log)
					r.Probes = append(r.Probes, &ProbeSeries{Name: t.Name, Type: t.Type, From: f.host, To: d.host, Class: t.Class})
					size := t.Size
					if size == 0 {
						size = 64
					}
					f := f
					switch t.Type {
					case "rr":
						c, err := tcpEchoServer(d.ns, at)
						if err != nil {
							return nil, fmt.Errorf("traffic %s: %w", t.Name, err)
						}
						closers = append(closers, c)
						jobs = append(jobs, job{win, func(ctx context.Context) error {
							return rrProbe(ctx, f.ns, at, size, interval, dscp, *t0p, log)
						}})
					case "udp-echo":
						c, err := udpEchoServer(d.ns, at)
						if err != nil {
							return nil, fmt.Errorf("traffic %s: %w", t.Name, err)
						}
						closers = append(closers, c)
						jobs = append(jobs, job{win, func(ctx context.Context) error {
							return udpProbe(ctx, f.ns, at, size, interval, dscp, *t0p, log)
						}})
					case "ping":
						jobs = append(jobs, job{win, func(ctx context.Context) error {
							return icmpProbe(ctx, f.ns, d.addr, size, interval, *t0p, log)
						}})
					}
				}
			}
		}
	}
	r.Flows = flows

	// Class series from the router's counters, configured rates from the plan.
	k0, err := kernel.Open(b.Router)
	if err != nil {
		return nil, err
	}
	defer k0.Close()
	k := k0.Reader()
	classIdx := map[string]*ClassSeries{}
	for dev, cis := range classes {
		depth := map[string]int{}
		for _, ci := range cis {
			d := depth[ci.Parent.String()] + 1
			depth[ci.Handle.String()] = d
			cs := &ClassSeries{Device: dev, Name: ci.Name, ID: ci.Handle.String(), Depth: d, Leaf: ci.Leaf != "",
				Rate: ci.Rate.BitsFloat(), Ceil: ci.Ceil.BitsFloat(), Bps: make([]float64, nb), Drops: make([]uint64, nb), Backlog: make([]uint32, nb)}
			r.Classes = append(r.Classes, cs)
			classIdx[dev+"/"+cs.ID] = cs
		}
	}

	var ag *agent.Agent
	if controlled {
		var stop func()
		if ag, stop, err = startAgent(b, s.Name+"/"+v.Name, text); err != nil {
			return nil, err
		}
		defer stop()
	}
	byName := map[string]*ClassSeries{}
	for _, cs := range r.Classes {
		byName[cs.Device+"/"+cs.Name] = cs
	}

	logf("%s: running %s (%.0f s)", s.Name, v.Name, total.Seconds())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	// A variable link: the modem's rates change at each phase's start,
	// the first phase's set before the traffic starts.
	setModem := func(p Phase) error {
		for _, dir := range modemDirs {
			if r := s.modemRate(p, dir); r != "" {
				if err := b.SetModemRate(dir, r); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if s.variableModem() {
		if err := setModem(phases[0]); err != nil {
			return nil, err
		}
		// The next variant, or a run after this one, starts from the
		// topology's rates.
		defer setModem(Phase{})
	}
	*t0p = time.Now()
	if s.variableModem() {
		var at time.Duration
		for i, p := range phases {
			if i > 0 {
				wg.Add(1)
				go func(at time.Duration, p Phase) {
					defer wg.Done()
					select {
					case <-time.After(time.Until(t0p.Add(at))):
					case <-ctx.Done():
						return
					}
					if err := setModem(p); err != nil && ctx.Err() == nil {
						fail(err)
					}
				}(at, p)
			}
			at += ds[i]
		}
	}
	for _, j := range jobs {
		for _, w := range j.win {
			wg.Add(1)
			go func(w [2]time.Duration, run func(context.Context) error) {
				defer wg.Done()
				select {
				case <-time.After(time.Until(t0p.Add(w[0]))):
				case <-ctx.Done():
					return
				}
				wctx, wcancel := context.WithDeadline(ctx, t0p.Add(w[1]))
				defer wcancel()
				if err := run(wctx); err != nil && ctx.Err() == nil {
					fail(err)
				}
			}(w, j.run)
		}
	}
	// Sample every bucket until the end.
	prevRx := make([]uint64, len(counters))
	prevBytes := map[string]uint64{}
	polIdx := map[string]*PolicerSeries{}
	// Rates divide by the time that really passed between two readings,
	// not the bucket: on a loaded (or emulated) CPU a tick comes late and
	// the nominal bucket would overstate that bucket's rate.
	prevFlowAt := *t0p
	prevStatAt := map[string]time.Time{} // by device
	tick := time.NewTicker(bucket)
	for i := 0; i < nb; i++ {
		select {
		case <-ctx.Done():
			i = nb
			continue
		case <-tick.C:
		}
		now := time.Now()
		if r.Spans == nil {
			r.Spans = make([]float64, nb)
		}
		r.Spans[i] = now.Sub(prevFlowAt).Seconds()
		for fi, fc := range counters {
			rx := fc.Received()
			flows[fi].Goodput[i] = units.BitsPerSecond(rx-prevRx[fi], now.Sub(prevFlowAt))
			prevRx[fi] = rx
			if re, sg, rtt, ok := fc.tcpInfo(); ok {
				for len(flows[fi].RTT) < i {
					flows[fi].RTT = append(flows[fi].RTT, 0)
				}
				flows[fi].RTT = append(flows[fi].RTT, float64(rtt)/1e6)
				flows[fi].Retrans = grow(flows[fi].Retrans, i, re)
				flows[fi].Segs = grow(flows[fi].Segs, i, sg)
			}
		}
		prevFlowAt = now
		if ag != nil {
			st := ag.Status(true) // once a bucket, for both
			recordSharing(st, byName, i, nb)
			recordAutorate(st, r, i, nb)
		}
		if smp, err := stats.Collect(k, nil); err == nil {
			now := time.Now()
			for _, t := range smp.Trees {
				// Between the times the tree's counters were read: the end
				// of the reading also waits for the BPF maps, which under
				// emulation took long and unevenly enough to read a 10mbit
				// class at 10.7 Mbit/s.
				statAt := t.ReadAt()
				if statAt.IsZero() {
					statAt = now
				}
				prev := prevStatAt[t.Device]
				prevStatAt[t.Device] = statAt
				for _, c := range t.Classes {
					cs := classIdx[t.Device+"/"+c.ID]
					if cs == nil {
						continue
					}
					key := t.Device + "/" + c.ID
					if old, ok := prevBytes[key]; ok && c.Bytes >= old && !prev.IsZero() && statAt.After(prev) {
						cs.Bps[i] = units.BitsPerSecond(c.Bytes-old, statAt.Sub(prev))
					}
					prevBytes[key] = c.Bytes
					cs.Drops[i] = uint64(c.Drops)
					cs.Backlog[i] = c.Backlog
					if c.RTT != nil {
						for len(cs.rtt) < i {
							cs.rtt = append(cs.rtt, nil)
						}
						cs.rtt = append(cs.rtt, c.RTT.Hist())
					}
				}
				for _, pl := range t.Policers {
					ps := polIdx[t.Device+"/"+pl.Class]
					if ps == nil {
						ps = &PolicerSeries{Device: t.Device, Class: pl.Class}
						polIdx[ps.Key()] = ps
						r.Policers = append(r.Policers, ps)
					}
					ps.Green = grow(ps.Green, i, pl.Green.Bytes)
					ps.Yellow = grow(ps.Yellow, i, pl.Yellow.Bytes)
					ps.Red = grow(ps.Red, i, pl.Red.Bytes)
				}
			}
		}
	}
	tick.Stop()
	cancel()
	wg.Wait()
	for fi, fc := range counters {
		flows[fi].Sent = fc.tx.Load()
	}
	for pi, log := range probes {
		r.Probes[pi].Samples = log.all()
	}
	if firstErr != nil {
		return nil, fmt.Errorf("variant %s: %w", v.Name, firstErr)
	}
	// Cumulative drops start from the first reading.
	for _, cs := range r.Classes {
		base := cs.Drops[0]
		for i := range cs.Drops {
			if cs.Drops[i] >= base {
				cs.Drops[i] -= base
			}
		}
	}
	var at time.Duration
	for i, p := range phases {
		ph := r.summarize(p.Name, at.Seconds(), (at + ds[i]).Seconds(), settle.Seconds())
		if s.variableModem() || len(r.Autorate) > 0 {
			ph.Modem = map[string]float64{}
			for _, dir := range modemDirs {
				if bps, err := parseRate(s.modemRate(p, dir)); err == nil {
					ph.Modem[dir] = bps.BitsFloat()
				}
			}
		}
		r.Phases = append(r.Phases, ph)
		at += ds[i]
	}
	r.responsiveness()
	return r, nil
}

// recordSharing copies the agent's last sharing decisions into the
// controlled classes' series at bucket i.
func recordSharing(st agent.Status, byName map[string]*ClassSeries, i, nb int) {
	if st.Sample == nil {
		return
	}
	for _, t := range st.Sample.Trees {
		for _, sh := range t.Sharing {
			cs := byName[t.Device+"/"+sh.Class]
			if cs == nil {
				continue
			}
			if cs.Sharing == nil {
				cs.Sharing = &SharingSeries{Weight: sh.Weight, Prod: sh.Prod, Demand: make([]float64, nb), Share: make([]float64, nb), Limit: make([]float64, nb)}
			}
			limit := sh.Ceil
			if sh.Applied {
				limit = sh.Limit
			}
			cs.Sharing.Demand[i], cs.Sharing.Share[i], cs.Sharing.Limit[i] = sh.Demand.BitsFloat(), sh.Share.BitsFloat(), limit.BitsFloat()
		}
	}
}

// recordAutorate copies the agent's rate: auto controllers' state into
// the result's series at bucket i.
func recordAutorate(st agent.Status, r *Result, i, nb int) {
	for _, a := range st.Autorate {
		var as *AutorateSeries
		for _, x := range r.Autorate {
			if x.Device == a.Device {
				as = x
			}
		}
		if as == nil {
			as = &AutorateSeries{Device: a.Device, Direction: a.Direction, Rate: make([]float64, nb), Passed: make([]float64, nb),
				Delay: make([]float64, nb), State: make([]string, nb)}
			r.Autorate = append(r.Autorate, as)
		}
		as.Rate[i] = float64(a.RateBytesPerSecond) * 8
		as.Passed[i] = a.PassedBytesPerSecond * 8
		as.Delay[i] = a.DelaySeconds * 1e3
		as.State[i] = a.State
		as.Replaced = a.Replaced
	}
}

// grow appends v at index i of a cumulative series, filling gaps with
// the last value.
func grow(xs []uint64, i int, v uint64) []uint64 {
	for len(xs) < i {
		last := uint64(0)
		if len(xs) > 0 {
			last = xs[len(xs)-1]
		}
		xs = append(xs, last)
	}
	return append(xs, v)
}

// Check evaluates the scenario's expectations on the results.
func Check(s *Scenario, results []*Result) []Verdict {
	var out []Verdict
	for _, text := range s.Expect {
		e, err := parseExpectation(text)
		if err != nil {
			out = append(out, Verdict{Expect: text, Note: err.Error()})
			continue
		}
		matched := false
		for _, r := range results {
			if r.Skipped != "" || e.Variant != "" && e.Variant != r.Variant {
				continue
			}
			matched = true
			var ref *Result
			for _, o := range results {
				if e.OfVariant != "" && o.Variant == e.OfVariant {
					ref = o
				}
			}
			vd := e.Check(r, ref)
			r.Verdicts = append(r.Verdicts, vd)
			out = append(out, vd)
		}
		if !matched {
			skipped := ""
			for _, r := range results {
				if r.Skipped != "" && r.Variant == e.Variant {
					skipped = r.Skipped
				}
			}
			if skipped != "" {
				out = append(out, Verdict{Expect: text, Variant: e.Variant, Pass: true, Skipped: true, Note: "variant skipped: " + skipped})
				continue
			}
			out = append(out, Verdict{Expect: text, Variant: e.Variant, Note: "no such variant ran"})
		}
	}
	return out
}
