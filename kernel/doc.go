// Package kernel is the only part of sluice that changes the kernel. It
// reads the live objects sluice owns, diffs them against a plan, applies
// the difference with the fewest netlink writes (the executor:
// Kernel.Apply, and Kernel.ApplyPatch for values changed in place), and
// rolls back to the starting state when a write fails. What sluice
// created is recorded (package records, which owns the files, their
// formats, the journal and the locks); this package fills the records
// around each apply and cross-checks them with the live tree before it
// trusts them.
//
// An apply is two calls: Kernel.Prepare (lock, check the interfaces,
// plan, lay the caller's runtime layer, read back what can differ,
// diff) and Kernel.Execute (journal, write, commit; or roll back and
// put the records back).
//
// It owns the readback, the diff and the executor, and the namespace's
// netlink handle, which is private: others read through the Kernel's
// few read methods (Classes, Qdiscs, LinkExists, IfIndex), and tests
// inject write faults through InjectWriteFault. It must not decide
// policy: what the kernel is to hold
// comes from plan (and engine, for the runtime layer), and nothing
// outside this package writes tc objects or BPF maps
// (TestOnlyTheExecutorWrites).
package kernel
