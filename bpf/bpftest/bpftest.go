// Package bpftest gives tests and benchmarks their own loaded
// classifiers with writes: test runs and map contents of programs they
// loaded, never a policy's (those are the executor's).
package bpftest

import (
	"sluice/bpf"
	"sluice/internal/writecap"
)

// Writable is a program just loaded or opened (bpf.Load, bpf.Open),
// with its writes.
func Writable(p *bpf.Program, err error) (*bpf.Writer, error) {
	if err != nil {
		return nil, err
	}
	return p.Writer(writecap.Token{}), nil
}
