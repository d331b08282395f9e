package kernel

import (
	"errors"
	"fmt"

	"sluice/plan"
	"sluice/policy"
)

// Prepared is what Execute carries out: a plan, what was read back
// of it (ReadLive, ReadTouched), and the diff between them (Compute).
// The engine makes one: the lock, the probe, the plan and its runtime
// layer are its (engine.readBackIn).
type Prepared struct {
	Plan *plan.Plan
	Live *Live
	Diff *Diff
}

// PresentOnly returns pol without its interfaces missing from the
// namespace, and their names.
func (k *Kernel) PresentOnly(pol *policy.Policy) (*policy.Policy, []string) {
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
