package kernel

import (
	"time"

	"sluice/internal/writecap"
	"sluice/plan"
)

// Executor is the way in to the executor: every change sluice makes to
// a namespace enters through one of its methods. Only a writecap.Token
// gets one (Kernel.Executor), and of the packages that drive passes
// only the engine names the token (TestOneWriterByImports); the CLI, the
// agent and the lab change the kernel through the engine's passes.
//
// Each entry, and what a kill at any write leaves for the next apply:
//   - Execute journals the change before the first write and commits
//     the records after the last: the next apply completes or undoes it.
//   - ApplyPatch changes values in place (limits over the planned
//     objects, host entries): the engine records the limits with the
//     objects a write may leave behind before the first write
//     (limits.json), and every apply reads those back.
//   - Apply and Forget are reset's: the objects the records say sluice
//     made come out, then their records. Killed between, the records
//     still name what is left, and the next reset removes it.
//   - WriteHosts changes no record: the policy file already says what
//     the program holds, and its fingerprint, which no longer matches,
//     sends the next apply to read it back.
type Executor struct{ k *Kernel }

// Executor returns k's way in to the executor.
func (k *Kernel) Executor(writecap.Token) *Executor { return &Executor{k} }

// Execute makes the kernel hold p (Prepare) and records it, under the
// lock Prepare took. With nothing to change it only refreshes the
// records (which also completes an apply that was interrupted).
// Otherwise it journals the change first, applies it (rolled back on
// failure, *ApplyError) and commits. A journal that cannot be written
// is a *JournalError (nothing changed), final records that cannot be
// put in place a *CommitError (the kernel changed; the journal claims
// it). warn hears of records that could not be put back after a
// rollback; mark, as Request.Mark, of "journal" and "apply" (either
// may be nil).
func (e *Executor) Execute(p *Prepared, policyFile string, mark, warn func(string)) (*Result, error) {
	return e.k.execute(p, policyFile, mark, warn)
}

// Apply carries out d, undoing the steps before a failed one in
// reverse (*ApplyError), with no journal: reset's removal of what the
// records say sluice made.
func (e *Executor) Apply(d *Diff) (*Result, error) { return e.k.apply(d) }

// ApplyPatch carries out d, a change of values in place (limits over
// the objects ReadLimited read, host entries), with Apply's rollback.
// Under -tags faults, SLUICE_FAULTS=kill-at-patch-write=N kills the
// process at its N-th write.
func (e *Executor) ApplyPatch(d *Diff) (*Result, error) { return e.k.applyPatch(d) }

// Forget drops the records of the named tree devices (after reset's
// Apply removed them). A clsact they say sluice made and a remaining
// tree still uses stays sluice's: the remaining tree's record takes the
// claim over.
func (e *Executor) Forget(names []string) error { return e.k.forget(names) }

// WriteHosts writes host entries in place in the programs of namespace
// ns (plan.HostWrite: an edit of a hosts_file that the plan in force
// takes without planning again), under the namespace's lock (waiting
// at most timeout): an entry that does not hold what the caller planned
// refuses the patch before anything is written, and a refused write
// puts back those written before it. No record changes (Executor says
// why that is safe).
func WriteHosts(_ writecap.Token, ns string, timeout time.Duration, writes []plan.HostWrite) (*Result, error) {
	return writeHosts(ns, timeout, writes)
}

// Record updates the ownership records after p was applied with d (or
// found in place: d empty), without a journal: for a change made
// without Execute (a test's own apply).
func (e *Executor) Record(p *plan.Plan, d *Diff, l *Live, policyFile string) error {
	return e.k.record(p, d, l, policyFile)
}
