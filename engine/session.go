package engine

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"sluice/bpf"
	"sluice/internal/writecap"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
)

// Session is the engine as a long-lived writer (the agent's): it
// applies policies as Prepare and Apply do, with its runtime layer
// (plan.Limits: what the sharing controllers decide) laid over each
// plan, and changes that layer through the same executor, recorded
// before the kernel is touched. A reconcile pass therefore keeps the
// limits, and nothing but the executor writes them.
//
// The limits record it writes stands while the process holds the
// namespace's agent lock (records.AcquireAgentLock) and for a lease
// after each write (SetLease): then a plain `apply` keeps the limits;
// once either ends (the agent stopped or was killed), the next apply
// puts the policy's values back. A new session starts with no limits,
// whatever an earlier one recorded.
type Session struct {
	opts   Options
	lease  time.Duration
	limits plan.Limits

	// What steady passes need (steady.go): the namespace's tc
	// notifications, a reading handle, the last settled pass.
	watcher *tc.Watcher
	noWatch bool
	reader  *kernel.Kernel
	clean   *steady
	// until is when the lease of the limits last recorded ends.
	until time.Time
}

// DefaultLease is how long a session's limits hold after it last wrote
// them, unless the caller sets another (SetLease).
const DefaultLease = 10 * time.Second

// NewSession starts a session acting with opts.
func NewSession(opts Options) *Session {
	return &Session{opts: opts, lease: DefaultLease}
}

// SetLease sets how long the limits hold after each write: a few of
// the writer's own intervals, so that a late step does not let them
// lapse.
func (s *Session) SetLease(d time.Duration) { s.lease = d }

// Limits returns the limits in force (do not change them).
func (s *Session) Limits() plan.Limits { return s.limits }

// Prepare plans pol with the session's limits for an apply, holding the
// namespace's lock until Close (as PreparePolicy).
func (s *Session) Prepare(pol *policy.Policy) (*Prepared, error) {
	return prepare(pol.File, pol, s.opts, true, s)
}

// SetLimits makes l the session's limits, writing what they change in
// the kernel. p is the session's prepared pass, already applied (the
// lock it holds keeps other writers out). The limits record is written
// first, with every object the change writes pending, then the changes
// go through the executor; a refused write rolls the change back and
// the record with it. Objects the limits leave alone are not read.
func (s *Session) SetLimits(p *Prepared, l plan.Limits) (*kernel.Result, error) {
	if p.sess != s || p.Desired == nil {
		return nil, errors.New("SetLimits: not this session's prepared pass")
	}
	if l.Equal(p.Limits) && (len(l) == 0 && p.limitsRec == nil || p.recordHolds(l, s.lease)) {
		s.unchanged(p, l)
		return &kernel.Result{}, nil // the pass already holds them: the common step
	}
	next := p.Plan.WithLimits(l)
	var want []tc.Object
	for i, d := range next.Devices {
		was := p.Desired.Devices[i]
		// A tree planned again at a new rate (rate: auto) may differ
		// anywhere a rate reaches (bursts, quanta, queue limits, the
		// classifier's pacing); limits alone, in rate and ceil.
		differ := limitsDiffer
		if d.Rate() != was.Rate() {
			differ = kernel.PlannedDiffer
		}
		for j, o := range d.Objects {
			if differ(o, was.Objects[j]) {
				want = append(want, o)
			}
		}
	}
	res := &kernel.Result{}
	var d *kernel.Diff
	if len(want) > 0 {
		// What came before this step is someone else's; from here on,
		// notifications must be of the objects it reads (a get is
		// notified too) and writes (ownWrites).
		if notes, ok := s.drain(); !ok || len(notes) > 0 {
			s.clean = nil
		}
		live, err := p.k.ReadLimited(want)
		if err != nil {
			return nil, fmt.Errorf("reading the kernel: %w", err)
		}
		for i, o := range live {
			if o == nil {
				return nil, fmt.Errorf("%s is not in the kernel; the next pass puts it back", want[i].Describe())
			}
		}
		d = kernel.Compute(live, want, kernel.Options{})
	}
	var pending []string
	for _, o := range want {
		pending = append(pending, o.Key())
	}
	old := p.limitsRec
	if d == nil || d.Empty() {
		d = nil
		if len(l) == 0 && old == nil || p.recordHolds(l, s.lease) {
			p.Limits, p.Desired = l, next
			s.unchanged(p, l)
			return res, nil // nothing to write, and any lease holds a while yet
		}
	}
	rec := limitsRecord(l, time.Now().Add(s.lease), pending)
	if err := records.SaveLimits(p.k.RecordsDir, rec); err != nil {
		return nil, &JournalError{Err: err}
	}
	p.limitsRec, p.limitsErr, s.until = rec, nil, rec.Until
	if d == nil && s.clean != nil {
		s.clean.limits = l // the record only: the kernel is as settled
	}
	if d != nil {
		var err error
		res, err = p.k.Executor(writecap.Token{}).ApplyPatch(d)
		if err != nil {
			s.clean = nil
			var ae *kernel.ApplyError
			if errors.As(err, &ae) && ae.RolledBack {
				back := limitsRecord(s.limits, time.Now().Add(s.lease), pending)
				if serr := records.SaveLimits(p.k.RecordsDir, back); serr == nil {
					p.limitsRec = back
				}
			}
			return nil, err
		}
		s.ownWrites(p.k, d, l)
	}
	s.limits, p.Limits, p.Desired = l, l, next
	return res, nil
}

// unchanged makes l the session's limits where SetLimits wrote nothing:
// the kernel is as it was, so a settled pass stays settled.
func (s *Session) unchanged(p *Prepared, l plan.Limits) {
	s.limits = l
	if p.limitsRec != nil {
		s.until = p.limitsRec.Until
	}
	if s.clean != nil {
		s.clean.limits = l
	}
}

// limitsDiffer reports whether two overlays of one planned object
// differ in what limits set (a class's rate and ceil, the targets of a
// classifier).
func limitsDiffer(a, b tc.Object) bool {
	if a == b {
		return false
	}
	switch x := a.(type) {
	case *tc.Class:
		y := b.(*tc.Class)
		return x.Rate != y.Rate || x.Ceil != y.Ceil
	case *bpf.Hook:
		y := b.(*bpf.Hook)
		if x.Content == nil || y.Content == nil {
			return x.Content != y.Content
		}
		// An aggregate's cap is in the targets, a group's host's in the
		// hosts.
		return !slices.Equal(x.Content.Targets, y.Content.Targets) || !maps.Equal(x.Content.Hosts, y.Content.Hosts)
	}
	return false
}

// Release ends the session's lease now, so that the next apply puts
// the policy's values back (an agent that stops). The kernel keeps the
// limits until then.
func (s *Session) Release() error {
	if len(s.limits) == 0 {
		return nil
	}
	k, err := Open(s.opts)
	if err != nil {
		return err
	}
	defer k.Close()
	if err := k.Lock(s.opts.LockTimeout); err != nil {
		return err
	}
	rec, err := records.LoadLimits(k.RecordsDir)
	if err != nil || rec == nil || rec.Holder != os.Getpid() {
		return err
	}
	rec.Until = time.Now().UTC()
	return records.SaveLimits(k.RecordsDir, rec)
}

// layLimits reads the limits record and sets the limits in force
// (Prepared.Limits), which the kernel lays over the plan. It returns the objects an apply
// must read back whatever the records' fingerprints say: those the
// record touched and those the limits touch.
func (p *Prepared) layLimits() map[string]bool {
	p.limitsRec, p.limitsErr = records.LoadLimits(p.k.RecordsDir)
	if p.limitsErr != nil {
		p.opts.warn("%v: reading every tree back", p.limitsErr)
	}
	if p.sess != nil {
		p.Limits = p.sess.limits
	} else {
		p.Limits = limitsInForce(p.limitsRec, time.Now())
	}
	force := map[string]bool{}
	for _, k := range p.limitsRec.Touched() {
		force[k] = true
	}
	for _, k := range p.Limits.Objects() {
		force[k] = true
	}
	return force
}

// recordLimits brings the limits record to the limits this apply lays
// down: ahead of the kernel writes (with everything the old record or
// the new limits touch pending), then after them (without). A session
// renews its lease; a plain apply keeps the lease it found.
func (p *Prepared) recordLimits(ahead bool) error {
	old := p.limitsRec
	var pending []string
	if ahead {
		pending = append(old.Touched(), p.Limits.Objects()...)
	}
	if len(p.Limits) == 0 && len(pending) == 0 {
		if old == nil && p.limitsErr == nil {
			return nil
		}
		if err := records.SaveLimits(p.k.RecordsDir, nil); err != nil {
			return err
		}
		p.limitsRec, p.limitsErr = nil, nil
		return nil
	}
	var until time.Time
	switch {
	case p.sess != nil:
		until = time.Now().Add(p.sess.lease)
	case old != nil:
		until = old.Until
	}
	var lease time.Duration // a plain apply keeps the lease it found
	if p.sess != nil {
		lease = p.sess.lease
	}
	if p.recordHolds(p.Limits, lease) {
		return nil // the record already says so
	}
	rec := limitsRecord(p.Limits, until, pending)
	if err := records.SaveLimits(p.k.RecordsDir, rec); err != nil {
		return err
	}
	p.limitsRec, p.limitsErr = rec, nil
	return nil
}

// recordHolds reports whether the limits record read (or written) says
// l, with nothing pending, and its lease holds for more than half of
// lease yet: then there is nothing to write.
func (p *Prepared) recordHolds(l plan.Limits, lease time.Duration) bool {
	r := p.limitsRec
	return r != nil && p.limitsErr == nil && limitsInForce(r, time.Now()).Equal(l) && len(r.Pending) == 0 && time.Until(r.Until) > lease/2
}
