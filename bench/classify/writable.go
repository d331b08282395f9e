package main

import (
	"sluice/bpf"
	"sluice/internal/writecap"
)

// writable is a loaded classifier with its writes: the benchmark's own programs, not a policy's.
func writable(p *bpf.Program, err error) (*bpf.Writer, error) {
	if err != nil {
		return nil, err
	}
	return p.Writer(writecap.Token{}), nil
}
