// Package kernel is the only part of sluice that changes the kernel. It
// reads the live objects sluice owns, diffs them against a plan, applies
// the difference with the fewest netlink writes (the executor), and
// rolls back to the starting state when a write fails. What sluice
// created is recorded (package records, which owns the files, their
// formats, the journal and the locks); this package fills the records
// around each apply and cross-checks them with the live tree before it
// trusts them.
//
// The engine drives an apply (engine.readBackIn: lock, check the
// interfaces, probe, plan, lay its runtime layer) through this
// package's reads (Kernel.Plan, ReadTouched or ReadLive, Compute) and
// then Executor.Execute (journal, write, commit; or roll back and put
// the records back). Every change enters through an Executor
// (Execute, ApplyPatch for values changed in place, reset's Apply and
// Forget, WriteHosts), which only a writecap.Token gets; what only reads
// is handed a Reader, whose classifiers are bpf.Views. Who may import
// the token, or anything else that writes, is held by
// TestOneWriterByImports.
//
// It owns the readback, the diff and the executor, and the namespace's
// netlink handle, which is private; tests inject write faults through
// InjectWriteFault. It must not decide policy: what the kernel is to
// hold comes from plan (and engine, for the runtime layer).
package kernel
