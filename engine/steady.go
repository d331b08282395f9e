package engine

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"sluice/bpf"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/stats"
	"sluice/tc"
)

// FullEvery bounds how long a session trusts the kernel's notifications
// alone: a pass more than this after the last one that read every tree
// back reads them all again. It is what catches changes that send no
// notification (a BPF map written by another program).
const FullEvery = 10 * time.Second

// steady is what a session knows after a pass that read every tree back
// and found nothing to change: until the kernel notifies a change that
// is not the session's own, a pass for the same policy and limits would
// find the same.
type steady struct {
	pol    *policy.Policy
	plan   *plan.Plan
	limits plan.Limits // the session's, when settled or since written
	at     time.Time
	state  *records.File
	// roots holds each HTB tree device's tree qdiscs (one per shard),
	// whose classes carry the counters.
	roots map[string][]tc.Handle
}

func (s *Session) fullEvery() time.Duration {
	if s.opts.FullEvery > 0 {
		return s.opts.FullEvery
	}
	return FullEvery
}

// drain takes the notifications queued so far and reports whether the
// session can still tell what changes (a watcher that works); the
// notifications it returns are the caller's to judge.
func (s *Session) drain() ([]tc.Note, bool) {
	if s.watcher == nil && !s.noWatch {
		w, err := tc.Watch(s.opts.Netns)
		if err != nil {
			s.noWatch = true
			s.opts.warn("no tc notifications (%v): every pass reads the trees back", err)
			return nil, false
		}
		s.watcher = w
		return nil, true
	}
	if s.watcher == nil {
		return nil, false
	}
	notes, lost, err := s.watcher.Take()
	if err != nil {
		s.watcher.Close()
		s.watcher, s.noWatch = nil, true
		s.opts.warn("tc notifications stopped (%v): every pass reads the trees back", err)
		return nil, false
	}
	if lost {
		s.clean = nil
	}
	return notes, true
}

// Settled tells the session that p, prepared by it for pol, read every
// tree back and found nothing to change: the next passes for pol may
// then be steady (Steady) until the kernel notifies a change. A pass
// that wrote, or that left interfaces out, is not settled.
func (s *Session) Settled(pol *policy.Policy, p *Prepared) {
	s.clean = nil
	if p.sess != s || !p.watched || p.Touched || len(p.Missing) > 0 || !p.Diff.Empty() ||
		p.k.Records().Journal != nil || p.Live == nil {
		return
	}
	roots := map[string][]tc.Handle{}
	qs := map[string][]*tc.Qdisc{}
	for _, o := range p.Live.Objects {
		if q, ok := o.(*tc.Qdisc); ok {
			qs[q.Dev] = append(qs[q.Dev], q)
		}
	}
	for dev, rec := range p.k.Records().Devices {
		if rec.EDT || rec.PoliceOnly {
			continue
		}
		for _, q := range kernel.TreeQdiscs(qs[dev]) {
			roots[dev] = append(roots[dev], q.Handle)
		}
		if len(roots[dev]) == 0 {
			return // a tree with no qdisc read back: not steady
		}
	}
	s.clean = &steady{pol: pol, plan: p.Plan, limits: s.limits, at: time.Now(), state: p.k.Records(), roots: roots}
}

// Steady reads the counters for a pass of pol when nothing can have
// changed since the last settled pass (Settled): the same policy and
// limits, no tc or link notification since that pass began its read
// but for the session's own writes, and that read less than FullEvery
// ago. It reads only the HTB trees' classes and the BPF counters, and
// plans nothing. ok false means a full pass (Prepare) is due.
func (s *Session) Steady(pol *policy.Policy) (sample *stats.Sample, ok bool) {
	notes, watching := s.drain()
	c := s.clean
	if !watching || len(notes) > 0 || c == nil || c.pol != pol || !c.limits.Equal(s.limits) || time.Since(c.at) >= s.fullEvery() {
		s.clean = nil
		return nil, false
	}
	k, err := s.Reader()
	if err != nil {
		return nil, false
	}
	sample, err = stats.CollectTrees(k, c.roots)
	if err != nil {
		return nil, false // a device gone meanwhile: the full pass says so
	}
	return sample, true
}

// Reader returns the session's reading handle: the namespace with the
// records of the last settled pass, read-only.
func (s *Session) Reader() (*kernel.Reader, error) {
	if s.clean == nil {
		return nil, errors.New("no settled pass")
	}
	if s.reader == nil {
		k, err := kernel.OpenBare(s.opts.Netns)
		if err != nil {
			return nil, err
		}
		s.reader = k
	}
	s.reader.UseRecords(s.clean.state)
	return s.reader.Reader(), nil
}

// LimitsHold reports whether l are the session's limits, written and
// leased for more than half a lease yet: a steady pass whose
// controllers decide l has nothing to write.
func (s *Session) LimitsHold(l plan.Limits) bool {
	return l.Equal(s.limits) && (len(l) == 0 && s.until.IsZero() || time.Until(s.until) > s.lease/2)
}

// PrepareLimits prepares a pass that only writes limits (SetLimits) on
// the plan of the last settled pass: the namespace locked and the
// limits record read, nothing planned or read back. The caller
// releases it with Close.
func (s *Session) PrepareLimits() (*Prepared, error) {
	c := s.clean
	if c == nil {
		return nil, errors.New("no settled pass")
	}
	// Without the records: a limits write reads and writes only the
	// limits record (at 10,000 hosts, loading the trees' records cost
	// more than the step).
	k, err := kernel.OpenBare(s.opts.Netns)
	if err != nil {
		return nil, err
	}
	k.UseRecords(c.state)
	if err := k.Lock(s.opts.LockTimeout); err != nil {
		k.Close()
		return nil, err
	}
	p := &Prepared{k: k, Policy: c.pol, Plan: c.plan, opts: s.opts, sess: s, Diff: &kernel.Diff{}}
	p.layLimits()
	p.Desired = p.Plan.WithLimits(p.Limits)
	return p, nil
}

// ownWrites judges the notifications that came while the session read
// and wrote d through k: the session's own class changes (and the
// kernel's echo of its gets of them) keep a settled pass settled (with
// limits l now); anything else ends it. A foreign change of one of the
// same classes in that instant looks like the session's own; the full
// read at most FullEvery later finds it.
func (s *Session) ownWrites(k *kernel.Kernel, d *kernel.Diff, l plan.Limits) {
	notes, ok := s.drain()
	if s.clean == nil || !ok {
		return
	}
	type key struct {
		ifindex int32
		h       tc.Handle
	}
	type mark struct {
		typ uint16
		key
	}
	mine := map[mark]bool{}
	for _, c := range d.Changes {
		var dev string
		var m mark
		switch x := c.Obj.(type) {
		case *tc.Class:
			dev, m = x.Dev, mark{typ: unix.RTM_NEWTCLASS, key: key{h: x.Handle}}
		case *tc.Qdisc: // a leaf's limit, which follows a rate
			dev, m = x.Dev, mark{typ: unix.RTM_NEWQDISC, key: key{h: x.Handle}}
		case *bpf.Hook:
			continue // map writes send no notification
		default:
			s.clean = nil
			return
		}
		idx, err := k.IfIndex(dev)
		if err != nil {
			s.clean = nil
			return
		}
		m.ifindex = int32(idx)
		mine[m] = true
	}
	for _, n := range notes {
		if !mine[mark{uint16(n.Type), key{n.Ifindex, n.Handle}}] {
			s.clean = nil
			return
		}
	}
	s.clean.limits = l
}

// Close ends the session's watching and reading; its limits stay (see
// Release).
func (s *Session) Close() {
	if s.watcher != nil {
		s.watcher.Close()
		s.watcher = nil
	}
	if s.reader != nil {
		s.reader.Close()
		s.reader = nil
	}
	s.clean = nil
}
