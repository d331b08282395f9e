// Command sluice shapes Linux network traffic from a declarative policy.
// See README.md, or run `sluice --help`.
package main

import (
	"os"
	"runtime/pprof"

	"sluice/cli"
)

func main() {
	// SLUICE_CPUPROFILE=FILE writes a CPU profile (for go tool pprof).
	if f := os.Getenv("SLUICE_CPUPROFILE"); f != "" {
		if out, err := os.Create(f); err == nil {
			pprof.StartCPUProfile(out)
			code := cli.Main(os.Args[1:])
			pprof.StopCPUProfile()
			out.Close()
			os.Exit(code)
		}
	}
	os.Exit(cli.Main(os.Args[1:]))
}
