// Package kernel is the only part of sluice that changes the kernel. It
// reads the live objects sluice owns, diffs them against a plan, applies
// the difference with the fewest netlink writes (the executor:
// Kernel.Apply, and Kernel.ApplyPatch for values changed in place), and
// rolls back to the starting state when a write fails. Ownership (what
// sluice created) is recorded under /run/sluice and cross-checked with
// the live tree; the limits record (limits.go) says what the agent's
// runtime layer holds.
//
// It owns the records' and journal's formats, the locks, the readback
// and the diff. It must not decide policy: what the kernel is to hold
// comes from plan (and engine, for the runtime layer), and nothing
// outside this package writes tc objects or BPF maps
// (TestOnlyTheExecutorWrites).
package kernel
