// Command sluice shapes Linux network traffic from a declarative policy.
// See README.md, or run `sluice --help`.
package main

import (
	"os"
	"runtime"
	"runtime/pprof"

	"sluice/cli"
)

func main() { os.Exit(run()) }

// run is main with the profiles, which defer writes before the exit:
// SLUICE_CPUPROFILE=FILE writes a CPU profile, SLUICE_MEMPROFILE=FILE one
// of every allocation (for go tool pprof).
func run() int {
	if f := os.Getenv("SLUICE_CPUPROFILE"); f != "" {
		if out, err := os.Create(f); err == nil {
			pprof.StartCPUProfile(out)
			defer func() { pprof.StopCPUProfile(); out.Close() }()
		}
	}
	if f := os.Getenv("SLUICE_MEMPROFILE"); f != "" {
		runtime.MemProfileRate = 4096
		defer func() {
			if out, err := os.Create(f); err == nil {
				pprof.Lookup("allocs").WriteTo(out, 0)
				out.Close()
			}
		}()
	}
	return cli.Main(os.Args[1:])
}
