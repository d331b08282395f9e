// Package engine runs sluice's pipeline (policy -> plan -> kernel) as
// one library call for every caller: the command line, the lab and the
// benchmarks. Plan reads a policy and works out what would change;
// Apply carries the change out under a journal, so that an apply that
// is killed, or that cannot write its records, never leaves the kernel
// holding objects the records do not claim; Reset removes what sluice
// made.
//
// Errors that come from the caller's input (a policy, a namespace name,
// an interface that does not exist) are *InputError; everything else is
// a failure while acting.
package engine

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"sluice/internal/writecap"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
)

// Options say how to plan and apply.
type Options struct {
	// Netns is the network namespace to act in ("": the caller's).
	Netns string
	// Force takes over root qdiscs sluice did not create.
	Force bool
	// FullEvery, for a Session, is how long its steady passes may go
	// without reading every tree back (0: the package's FullEvery).
	FullEvery time.Duration
	// Full reads every tree back instead of only what the edit touches
	// (the fast path), and so repairs changes made behind sluice's back.
	Full bool
	// LockTimeout bounds the wait for another sluice acting on the same
	// namespace.
	LockTimeout time.Duration
	// SkipMissing plans only the policy's interfaces that exist now,
	// instead of refusing the policy (Prepared.Missing names the
	// others): a daemon shapes the devices it has and waits for the
	// rest.
	SkipMissing bool
	// Warn receives warnings: the policy's, records set aside, an
	// interrupted apply found (nil: dropped).
	Warn func(string)
}

func (o *Options) warn(format string, args ...any) {
	if o.Warn != nil {
		o.Warn(fmt.Sprintf(format, args...))
	}
}

// InputError is an error in what the caller gave: the command line
// exits 2 for it, and nothing was changed.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

func input(err error) error { return &InputError{err} }

// Prepared is a policy planned against the live kernel. Close releases
// it (and the lock, when it holds one).
type Prepared struct {
	Policy *policy.Policy
	Plan   *plan.Plan
	Live   *kernel.Live
	Diff   *kernel.Diff
	// Touched: the diff covers only the objects the edit touched (the
	// fast path).
	Touched bool
	// Phases time the steps, for --timings.
	Phases Phases
	// Missing names the policy's interfaces left out because they do not
	// exist (Options.SkipMissing).
	Missing []string
	// Limits are the runtime layer laid over Plan: a Session's, or,
	// without one, those of a limits record whose lease holds (the
	// agent's, while it runs). Desired is Plan with them: what the
	// kernel is to hold.
	Limits  plan.Limits
	Desired *plan.Plan

	k    *kernel.Kernel
	file string
	opts Options
	sess *Session
	// limitsRec is the limits record as read (nil: none), limitsErr why
	// it could not be read.
	limitsRec *records.Limits
	limitsErr error
	// watched: the session's notifications were taken before the read
	// (Session.Settled).
	watched bool
}

// Kernel is the namespace the plan was made for, read-only: a pass's
// writes are its Execute's and SetLimits'.
func (p *Prepared) Kernel() *kernel.Reader { return p.k.Reader() }

// Close releases the namespace (and its lock).
func (p *Prepared) Close() { p.k.Close() }

// Open connects to a namespace and loads its records, passing on what
// the records check set aside.
func Open(opts Options) (*kernel.Kernel, error) {
	k, err := kernel.Open(opts.Netns)
	if err != nil {
		var ne *kernel.NetnsError
		if errors.As(err, &ne) {
			return nil, input(err)
		}
		return nil, err
	}
	for _, n := range k.Notes {
		opts.warn("%s", n)
	}
	return k, nil
}

// Load reads and checks a policy file, passing its warnings on.
func Load(file string, opts Options) (*policy.Policy, error) {
	p, warns, err := policy.Load(file)
	return checked(file, p, warns, err, opts)
}

// checked passes a policy's warnings on and its errors as bad input.
func checked(file string, p *policy.Policy, warns policy.Errors, err error, opts Options) (*policy.Policy, error) {
	for _, w := range warns {
		opts.warn("%s", w)
	}
	if err != nil {
		return nil, refused(file, err)
	}
	return p, nil
}

// refused is the bad input error of policy file for err, counting the
// problems a policy.Errors holds.
func refused(file string, err error) error {
	var pe policy.Errors
	if errors.As(err, &pe) {
		return input(fmt.Errorf("%s: %d problem(s):\n%w", file, len(pe), err))
	}
	return input(err)
}

// Plan plans file against the kernel without changing anything (as
// `sluice plan`): it reads every tree back.
func Plan(file string, opts Options) (*Prepared, error) {
	return prepare(file, nil, opts, false, nil)
}

// PlanPolicy is Plan for a policy already loaded (file names it in the
// records).
func PlanPolicy(pol *policy.Policy, opts Options) (*Prepared, error) {
	return prepare(pol.File, pol, opts, false, nil)
}

// prepare plans against the kernel. lock takes the namespace's lock,
// for an apply; it also allows the fast path (kernel.ReadTouched)
// unless opts say Full or Force. sess, when set, lays its limits over
// the plan; otherwise a limits record whose lease holds does.
func prepare(file string, pol *policy.Policy, opts Options, lock bool, sess *Session) (*Prepared, error) {
	var ph Phases
	ph.start()
	// The records load while the policy parses: with 10,000 hosts each
	// takes milliseconds, and the lock below re-reads records that
	// changed in between.
	type opened struct {
		k   *kernel.Kernel
		err error
	}
	open := make(chan opened, 1)
	go func() {
		k, err := Open(opts)
		open <- opened{k, err}
	}()
	var err error
	if pol == nil {
		pol, err = Load(file, opts)
	}
	o := <-open
	if err != nil {
		if o.k != nil {
			o.k.Close()
		}
		return nil, err
	}
	ph.mark("parse")
	if o.err != nil {
		return nil, o.err
	}
	k := o.k
	p := &Prepared{k: k, Policy: pol, Phases: ph, file: file, opts: opts, sess: sess}
	kp, err := readBackIn(k, readRequest{
		Policy: pol, Lock: lock, LockTimeout: opts.LockTimeout,
		Full: opts.Full, Force: opts.Force, SkipMissing: opts.SkipMissing,
		// The runtime layer is laid between the plan and the read, under
		// the lock.
		Layer: func() (plan.Limits, map[string]bool, bool) {
			force := p.layLimits()
			if sess != nil {
				_, p.watched = sess.drain() // what they say, the read below sees
			}
			// A tree whose rate the limits set (rate: auto) differs from
			// its records anywhere a rate reaches: it is read back whole.
			return p.Limits, force, p.limitsErr != nil || rateLimited(force)
		},
		Mark: p.Phases.mark,
		Warn: func(s string) { opts.warn("%s", s) },
	})
	if err != nil {
		k.Close()
		return nil, err
	}
	p.Policy, p.Missing = kp.Policy, kp.Missing
	p.Plan, p.Desired = kp.Plan, kp.Desired
	p.Live, p.Diff, p.Touched = kp.Live, kp.Diff, kp.Touched
	return p, nil
}

// rateLimited reports whether keys name a tree's rate (plan.RateLimit).
func rateLimited(keys map[string]bool) bool {
	for k := range keys {
		if plan.RateLimited(k) != "" {
			return true
		}
	}
	return false
}

// Prepare plans file for an apply: it takes the namespace's lock, which
// the caller releases with Close (after Apply).
func Prepare(file string, opts Options) (*Prepared, error) {
	return prepare(file, nil, opts, true, nil)
}

// PreparePolicy is Prepare for a policy already loaded.
func PreparePolicy(pol *policy.Policy, opts Options) (*Prepared, error) {
	return prepare(pol.File, pol, opts, true, nil)
}

// JournalError says the apply could not write its journal before
// touching the kernel: nothing was changed (kernel.JournalError).
type JournalError = kernel.JournalError

// CommitError says the kernel now matches the policy but the final
// records could not be put in place (kernel.CommitError).
type CommitError = kernel.CommitError

// Apply carries out the prepared diff (Prepare) and records it, through
// the kernel's executor (kernel.Execute: journal, write, commit), with
// the limits record brought along: ahead of the kernel writes, and
// after them.
func (p *Prepared) Apply() (*kernel.Result, error) {
	if !p.Diff.Empty() {
		if err := p.recordLimits(true); err != nil {
			return nil, &JournalError{Err: err}
		}
	}
	warn := func(s string) { p.opts.warn("%s", s) }
	res, err := p.k.Executor(writecap.Token{}).Execute(&kernel.Prepared{Plan: p.Plan, Live: p.Live, Diff: p.Diff}, p.file, p.Phases.mark, warn)
	if err != nil {
		return res, err
	}
	if err := p.recordLimits(false); err != nil {
		return res, &CommitError{Err: err}
	}
	p.Phases.mark("record")
	return res, nil
}

// ResetResult is what Reset removed.
type ResetResult struct {
	// Devices are the tree devices whose records were dropped.
	Devices []string
	Diff    *kernel.Diff
	*kernel.Result
}

// Reset removes what sluice made on devs (an interface covers its
// egress tree and its ifb's ingress tree), or on every device when all.
// show, when set, sees the diff before it is applied.
func Reset(devs []string, all bool, opts Options, show func(*kernel.Diff)) (*ResetResult, error) {
	if all == (len(devs) > 0) {
		return nil, input(errors.New("reset: name one or more devices, or --all"))
	}
	k, err := Open(opts)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	if err := k.Lock(opts.LockTimeout); err != nil {
		return nil, err
	}
	d, names, err := k.ResetPlan(devs, all)
	if err != nil {
		return nil, err
	}
	out := &ResetResult{Devices: names, Diff: d, Result: &kernel.Result{}}
	if len(names) == 0 {
		return out, nil
	}
	if show != nil {
		show(d)
	}
	x := k.Executor(writecap.Token{})
	if out.Result, err = x.Apply(d); err != nil {
		return nil, err
	}
	if err := x.Forget(names); err != nil {
		return nil, fmt.Errorf("removed, but could not update the records (%w); the next reset finds nothing left and completes it", err)
	}
	if len(k.Records().Devices) == 0 {
		// Nothing left for a limit to apply to.
		if err := records.SaveLimits(k.RecordsDir, nil); err != nil {
			opts.warn("could not remove the limits record: %v", err)
		}
	}
	return out, nil
}

// Phases times the steps of a command, for --timings.
type Phases struct {
	last  time.Time
	names []string
	took  []time.Duration
}

func (t *Phases) start() { t.last = time.Now() }

func (t *Phases) mark(name string) {
	now := time.Now()
	t.names = append(t.names, name)
	t.took = append(t.took, now.Sub(t.last))
	t.last = now
}

func (t *Phases) String() string {
	var parts []string
	var sum time.Duration
	for i, n := range t.names {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", n, float64(t.took[i].Microseconds())/1000))
		sum += t.took[i]
	}
	return fmt.Sprintf("timings: %s (total %.1f ms)", strings.Join(parts, ", "), float64(sum.Microseconds())/1000)
}
