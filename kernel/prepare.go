package kernel

import (
	"errors"
	"fmt"
	"time"

	"sluice/features"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
)

// An apply is two calls into this package: Prepare (lock, check, plan,
// read back, diff) and Execute (journal, write, commit). The engine
// holds what lies around them (the policy, the runtime layer, the
// records of limits); the kernel does everything that needs it.

// Request is what Prepare plans and reads back.
type Request struct {
	Policy *policy.Policy
	// Lock takes the namespace's lock (waiting up to LockTimeout) for an
	// apply, and allows the fast path (ReadTouched) unless Full or Force.
	Lock        bool
	LockTimeout time.Duration
	// Full reads every tree back; Force also takes over root qdiscs
	// sluice did not create.
	Full, Force bool
	// SkipMissing plans only the interfaces that exist (Prepared.Missing
	// names the others) instead of refusing the policy.
	SkipMissing bool
	// Layer, when set, says under the lock, once the policy is planned,
	// what the runtime layer is: the limits laid over the plan
	// (plan.Plan.WithLimits), the keys of objects to read back whatever
	// the records' fingerprints say, and whether every tree must be
	// read back. It sees no plan: the runtime layer is data, and the
	// plan goes from the planner to the executor without leaving this
	// package.
	Layer func() (limits plan.Limits, force map[string]bool, full bool)
	// Mark, when set, is told as each step ends ("open", "plan", "read
	// touched" or "read", "diff"), for timings.
	Mark func(step string)
	// Warn, when set, hears what the caller should know as it is found:
	// records set aside, an earlier apply found unfinished.
	Warn func(string)
}

// Prepared is a policy planned against the live kernel, and the diff
// that makes the kernel hold it.
type Prepared struct {
	// Policy is the request's, less its missing interfaces
	// (SkipMissing, named in Missing).
	Policy  *policy.Policy
	Missing []string
	// Plan is the policy's; Desired is Plan with the runtime layer
	// (Limits) laid over it.
	Plan, Desired *plan.Plan
	Limits        plan.Limits
	Live          *Live
	Diff          *Diff
	// Touched: only the objects the edit touched were read (the fast
	// path).
	Touched bool
}

// PolicyError is a policy this kernel cannot hold as given (an
// interface missing, a plan the policy does not allow): the caller's
// input, and nothing was changed.
type PolicyError struct{ Err error }

func (e *PolicyError) Error() string { return e.Err.Error() }
func (e *PolicyError) Unwrap() error { return e.Err }

// Prepare plans r.Policy against this kernel and diffs it against what
// the kernel holds. With r.Lock the lock stays taken until Close.
func (k *Kernel) Prepare(r Request) (*Prepared, error) {
	mark, warn := r.Mark, r.Warn
	if mark == nil {
		mark = func(string) {}
	}
	if warn == nil {
		warn = func(string) {}
	}
	p := &Prepared{Policy: r.Policy}
	if r.Lock {
		if err := k.Lock(r.LockTimeout); err != nil {
			return nil, err
		}
		for _, n := range k.Notes {
			warn(n)
		}
		if j := k.recs.Journal; j != nil {
			warn(fmt.Sprintf("an earlier apply (pid %d, started %s) did not finish: reading every tree back to complete it", j.PID, j.Started.Local().Format(time.DateTime)))
		}
	}
	mark("open")
	if r.SkipMissing {
		p.Policy, p.Missing = k.presentOnly(r.Policy)
	} else if err := k.checkInterfaces(r.Policy); err != nil {
		return nil, &PolicyError{err}
	}
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		return nil, fmt.Errorf("probing the kernel: %w", err)
	}
	if p.Plan, err = k.Plan(p.Policy, rep.Features()); err != nil {
		return nil, &PolicyError{err}
	}
	mark("plan")
	p.Desired = p.Plan
	var force map[string]bool
	full := r.Full || r.Force || !r.Lock
	if r.Layer != nil {
		var all bool
		p.Limits, force, all = r.Layer()
		p.Desired = p.Plan.WithLimits(p.Limits)
		full = full || all
	}
	if !full {
		l, desired, ok, err := k.ReadTouched(p.Plan, p.Desired, force)
		if err != nil {
			return nil, fmt.Errorf("reading the kernel: %w", err)
		}
		if ok {
			p.Live, p.Touched = l, true
			mark("read touched")
			p.Diff = Compute(l.Objects, desired, l.Opt)
			mark("diff")
			return p, nil
		}
	}
	if p.Live, err = k.ReadLive(p.Plan, nil, r.Force); err != nil {
		var fe *ForeignRootError
		if errors.As(err, &fe) {
			return nil, err
		}
		return nil, fmt.Errorf("reading the kernel: %w", err)
	}
	mark("read")
	for _, f := range p.Live.Foreign {
		switch {
		case f.Removed:
		case f.Redirect && !r.Force:
			warn(fmt.Sprintf("%s: %s runs before sluice's redirect: the packets it takes never reach the ingress tree; apply --force removes it (the shaping it did is what the ingress tree replaces)", f.Iface, f))
		default:
			warn(fmt.Sprintf("%s: %s runs before sluice's redirect: the packets it takes never reach the ingress tree (sluice leaves it; tc filter del dev %s ingress prio %d removes it)", f.Iface, f, f.Iface, f.Prio))
		}
	}
	p.Diff = Compute(p.Live.Objects, p.Desired.Objects(), p.Live.Opt)
	mark("diff")
	if r.Force {
		for i := range p.Diff.Changes {
			c := &p.Diff.Changes[i]
			if q, ok := c.Obj.(*tc.Qdisc); ok && c.Verb == tc.Add && q.Parent == tc.HandleRoot {
				c.Force = true
			}
		}
	}
	return p, nil
}

// presentOnly returns pol without its interfaces missing from the
// namespace, and their names.
func (k *Kernel) presentOnly(pol *policy.Policy) (*policy.Policy, []string) {
	out := *pol
	out.Interfaces = nil
	var missing []string
	for _, in := range pol.Interfaces {
		if k.conn.LinkExists(in.Name) {
			out.Interfaces = append(out.Interfaces, in)
		} else {
			missing = append(missing, in.Name)
		}
	}
	return &out, missing
}

// JournalError says the apply could not write its journal (the records
// that claim what it may create) before touching the kernel: nothing
// was changed. records.Error is the other way round: records that
// cannot be read.
type JournalError struct{ Err error }

func (e *JournalError) Error() string {
	return fmt.Sprintf("cannot write sluice's records, so nothing was changed: %v", e.Err)
}
func (e *JournalError) Unwrap() error { return e.Err }

// CommitError says the kernel now matches the policy but the final
// records could not be put in place: the journal, which claims all of
// it, stays in force, and the next apply completes it.
type CommitError struct{ Err error }

func (e *CommitError) Error() string {
	return fmt.Sprintf("applied, but the records could not be finalized (%v); they still claim everything applied, and the next apply reads every tree back", e.Err)
}
func (e *CommitError) Unwrap() error { return e.Err }

// execute is Executor.Execute.
func (k *Kernel) execute(p *Prepared, policyFile string, mark, warn func(string)) (*Result, error) {
	if mark == nil {
		mark = func(string) {}
	}
	if warn == nil {
		warn = func(string) {}
	}
	if p.Diff.Empty() {
		if err := k.record(p.Plan, p.Diff, p.Live, policyFile); err != nil {
			return &Result{}, &CommitError{err}
		}
		return &Result{}, nil
	}
	j, err := k.begin(p.Plan, p.Diff, p.Live, policyFile)
	if err != nil {
		return nil, &JournalError{err}
	}
	mark("journal")
	res, err := k.apply(p.Diff)
	if err != nil {
		var ae *ApplyError
		if errors.As(err, &ae) && ae.RolledBack {
			if aerr := j.Abort(); aerr != nil {
				warn(fmt.Sprintf("could not put the previous records back (%v); they claim what the failed apply would have made, and the next apply reads every tree back", aerr))
			}
		}
		return nil, err
	}
	mark("apply")
	if err := j.Commit(); err != nil {
		return res, &CommitError{err}
	}
	return res, nil
}
