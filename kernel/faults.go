//go:build !faults

package kernel

// Fault injection is compiled in only with -tags faults (faults_on.go):
// the end-to-end tests build such a binary to kill it at chosen points.

func installFaults(*Kernel) {}

func faultPoint(string) {}

func patchFaults(*Kernel) func() { return func() {} }
