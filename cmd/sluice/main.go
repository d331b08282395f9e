// Command sluice shapes Linux network traffic from a declarative policy.
// See README.md, or run `sluice --help`.
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"sluice/cli"
)

func main() { os.Exit(run()) }

// run is main with the profiles, which defer writes before the exit:
// SLUICE_CPUPROFILE=FILE writes a CPU profile, SLUICE_MEMPROFILE=FILE one
// of every allocation (for go tool pprof), and with
// SLUICE_MEMPROFILE_EVERY=DURATION also FILE.1, FILE.2, ... that often
// while it runs, each after a collection (a long-running agent's heap
// over time: go tool pprof -base FILE.1 FILE.9 shows what grew).
func run() int {
	if f := os.Getenv("SLUICE_CPUPROFILE"); f != "" {
		if out, err := os.Create(f); err == nil {
			pprof.StartCPUProfile(out)
			defer func() { pprof.StopCPUProfile(); out.Close() }()
		}
	}
	if f := os.Getenv("SLUICE_MEMPROFILE"); f != "" {
		runtime.MemProfileRate = 4096
		if every, err := time.ParseDuration(os.Getenv("SLUICE_MEMPROFILE_EVERY")); err == nil && every > 0 {
			go func() {
				for n := 1; ; n++ {
					time.Sleep(every)
					runtime.GC()
					if out, err := os.Create(fmt.Sprintf("%s.%d", f, n)); err == nil {
						pprof.Lookup("heap").WriteTo(out, 0)
						out.Close()
					}
				}
			}()
		}
		defer func() {
			if out, err := os.Create(f); err == nil {
				pprof.Lookup("allocs").WriteTo(out, 0)
				out.Close()
			}
		}()
	}
	return cli.Main(os.Args[1:])
}
