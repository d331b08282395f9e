package lab

import (
	"sluice/internal/writecap"
	"sluice/tc"
)

// openBed connects to one of the test bed's own namespaces (the modem's,
// the delay line's) with the writes the bed makes there: its tbfs,
// netems and the line's taps and filters, never a policy's objects,
// which only the executor writes. close releases it.
func openBed(ns string) (c *tc.Writer, close func(), err error) {
	conn, err := tc.Open(ns)
	if err != nil {
		return nil, nil, err
	}
	return conn.Writer(writecap.Token{}), conn.Close, nil
}
