// Package writecap is the right to change the kernel: tc objects and
// links, sluice's BPF maps, the executor's entries. A tc.Conn, a
// bpf.Program and a kernel.Kernel read; their writes are their Writers',
// which only a Token gets. Naming Token takes importing this package,
// and TestOneWriterByImports (package kernel) holds who may: the
// executor (kernel), the engine that drives it, the packages that
// define the writes (tc, bpf), and the lab's and benchmarks' own test
// beds, each with its reason.
package writecap

// Token is the right to write. Its zero value is the token: what is
// checked is who can name the type.
type Token struct{}
