package engine

import (
	"bytes"

	"sluice/internal/writecap"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
)

// HostsChange is one hosts_file's content before an edit (what the
// policy in force was read from) and after it.
type HostsChange struct {
	File     string
	Old, New []byte
}

// HostsEdit is an edit of hosts files that the policy and plan in force
// take in place: new rates and ceils of hosts they list, written as the
// host entries of EDT programs that change (PlanHostsEdit).
type HostsEdit struct {
	edits []policy.HostEdit
	patch *plan.HostPatch
}

// Hosts counts the hosts the edit changes (one per host and per class
// listing its file); 0: the files hold what the policy was read from.
func (e *HostsEdit) Hosts() int { return len(e.edits) }

// Entries counts the program entries the edit writes.
func (e *HostsEdit) Entries() int { return e.patch.Entries() }

// Writes are the entries to write, each program's before and after.
func (e *HostsEdit) Writes() []plan.HostWrite { return e.patch.Writes }

// Commit puts the edit into the policy and plan it was worked out from:
// once the kernel holds it, they are what is in force.
func (e *HostsEdit) Commit() {
	for _, ed := range e.edits {
		ed.Apply()
	}
	e.patch.Apply()
}

// PlanHostsEdit works out an edit of hosts files (policy.EditHosts)
// against pol, the policy in force, and inForce, the plan made from it:
// with 100,000 hosts, microseconds where planning them all again costs
// tens of milliseconds. Neither changes until Commit.
//
// ok is false where the edit needs a full apply: anything but hosts'
// rates and ceils changed (lines added, removed or moved; a file that
// is not a hosts_file of pol, such as the policy itself), or it reaches beyond their own entries (plan.PatchHosts:
// an HTB tree's host, a controlled tree). A changed line the policy
// refuses is an *InputError, reported as a full load reports it.
func PlanHostsEdit(pol *policy.Policy, inForce *plan.Plan, changes []HostsChange) (e *HostsEdit, ok bool, err error) {
	e = &HostsEdit{}
	for _, c := range changes {
		if bytes.Equal(c.Old, c.New) {
			continue
		}
		eds, ok, err := pol.EditHosts(c.File, c.Old, c.New)
		if err != nil {
			return nil, false, refused(pol.File, err)
		}
		if !ok {
			return nil, false, nil
		}
		e.edits = append(e.edits, eds...)
	}
	if e.patch, ok = inForce.PatchHosts(e.edits); !ok {
		return nil, false, nil
	}
	return e, true, nil
}

// EditHosts takes an edit of hosts files into the kernel, then into pol
// and inForce (PlanHostsEdit says what it takes and when ok is false).
// The entries are written under the namespace's lock, through the
// executor (kernel.WriteHosts): an entry that does not hold what
// inForce says refuses the edit before anything is written, and a
// refused write puts back those written before it; either is an error
// that is not an *InputError, and pol and inForce stay as they were.
func (s *Session) EditHosts(pol *policy.Policy, inForce *plan.Plan, changes []HostsChange) (*HostsEdit, bool, error) {
	e, ok, err := PlanHostsEdit(pol, inForce, changes)
	if !ok || err != nil {
		return nil, ok, err
	}
	if len(e.Writes()) > 0 {
		s.clean = nil // BPF map writes send no notification
		if _, err := kernel.WriteHosts(writecap.Token{}, s.opts.Netns, s.opts.LockTimeout, e.Writes()); err != nil {
			return nil, false, err
		}
	}
	e.Commit()
	return e, true, nil
}
