package e2e

import (
	"sluice/bpf"
	"sluice/internal/writecap"
)

// writable is a loaded classifier with its writes: a test's own programs, not a policy's.
func writable(p *bpf.Program, err error) (*bpf.Writer, error) {
	if err != nil {
		return nil, err
	}
	return p.Writer(writecap.Token{}), nil
}
