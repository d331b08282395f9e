package engine

import (
	"errors"
	"fmt"
	"time"

	"sluice/features"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
)

// readRequest is what readBack plans and reads: the orchestration of a
// pass around the kernel's readback, diff and executor.
type readRequest struct {
	Policy *policy.Policy
	// Lock takes the namespace's lock (waiting up to LockTimeout) for an
	// apply, and allows the fast path (kernel.ReadTouched) unless Full
	// or Force.
	Lock        bool
	LockTimeout time.Duration
	// Full reads every tree back; Force also takes over root qdiscs
	// sluice did not create.
	Full, Force bool
	// SkipMissing plans only the interfaces that exist (Missing names
	// the others) instead of refusing the policy.
	SkipMissing bool
	// Layer, when set, says under the lock, once the policy is planned,
	// what the runtime layer is: the limits laid over the plan
	// (plan.Plan.WithLimits), the keys of objects to read back whatever
	// the records' fingerprints say, and whether every tree must be
	// read back.
	Layer func() (limits plan.Limits, force map[string]bool, full bool)
	// Mark is told as each step ends ("open", "plan", "read touched" or
	// "read", "diff"), for timings; Warn hears what the caller should
	// know as it is found (records set aside, an earlier apply found
	// unfinished). Either may be nil.
	Mark func(step string)
	Warn func(string)
}

// readBack is a policy planned against the live kernel and diffed
// against what it holds.
type readBack struct {
	// Policy is the request's, less its missing interfaces
	// (SkipMissing, named in Missing).
	Policy  *policy.Policy
	Missing []string
	// Plan is the policy's; Desired is Plan with the runtime layer
	// (Limits) laid over it.
	Plan, Desired *plan.Plan
	Limits        plan.Limits
	Live          *kernel.Live
	Diff          *kernel.Diff
	// Touched: only the objects the edit touched were read (the fast
	// path).
	Touched bool
}

// readBackIn plans r.Policy against k and diffs it against what k
// holds: lock, check the interfaces, probe, plan, lay the runtime layer,
// read back (the fast path where it may), diff. With r.Lock the lock
// stays taken until k closes. A policy k cannot hold as given (an
// interface missing, a plan the policy does not allow) is an
// *InputError, and nothing was changed.
func readBackIn(k *kernel.Kernel, r readRequest) (*readBack, error) {
	mark, warn := r.Mark, r.Warn
	if mark == nil {
		mark = func(string) {}
	}
	if warn == nil {
		warn = func(string) {}
	}
	p := &readBack{Policy: r.Policy}
	if r.Lock {
		if err := k.Lock(r.LockTimeout); err != nil {
			return nil, err
		}
		for _, n := range k.Notes {
			warn(n)
		}
		if j := k.Records().Journal; j != nil {
			warn(fmt.Sprintf("an earlier apply (pid %d, started %s) did not finish: reading every tree back to complete it", j.PID, j.Started.Local().Format(time.DateTime)))
		}
	}
	mark("open")
	if r.SkipMissing {
		p.Policy, p.Missing = k.PresentOnly(r.Policy)
	} else if err := k.CheckInterfaces(r.Policy); err != nil {
		return nil, input(err)
	}
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		return nil, fmt.Errorf("probing the kernel: %w", err)
	}
	if p.Plan, err = k.Plan(p.Policy, rep.Features()); err != nil {
		return nil, input(err)
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
			p.Diff = kernel.Compute(l.Objects, desired, l.Opt)
			mark("diff")
			return p, nil
		}
	}
	if p.Live, err = k.ReadLive(p.Plan, nil, r.Force); err != nil {
		var fe *kernel.ForeignRootError
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
	p.Diff = kernel.Compute(p.Live.Objects, p.Desired.Objects(), p.Live.Opt)
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
