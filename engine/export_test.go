package engine

import "sluice/kernel"

// KernelOf is p's namespace, writes included: for the tests' fault
// injection only (Prepared.Kernel is read-only).
func KernelOf(p *Prepared) *kernel.Kernel { return p.k }
