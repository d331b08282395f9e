// Package conform is `sluice lab conformance`: it builds a test bed for
// a policy's devices, drives demand patterns through each tree (cells),
// measures what every class and host got from the kernel's counters,
// and judges it against the weighted max-min reference (share.MaxMin
// over the policy tree) computed for the same demand.
//
// It owns the bed, the cells and the verdicts. It applies policies and
// runs the agent through engine and agent like any user, and never
// writes tc objects itself beyond its bed's own devices (package lab).
package conform
