package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"sluice/agent"
	"sluice/stats"
	"sluice/units"
)

func showCmd(g *globals) *cobra.Command {
	var asJSON, watch, local, hosts bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "show [DEV...]",
		Short: "Show the live tree: configured and measured rates, packets, drops, backlog",
		Long: `Show reads every class of the trees sluice manages (or those on DEV; an
interface includes its ingress ifb) twice, --interval apart, and prints
each class's configured rate and ceil, its measured rate over that
interval, and its counters. --watch repeats until interrupted. --json
prints the documented object of docs/json.md (one per line with --watch).

Where an interface has rtt: on, a ROUND TRIPS table follows each tree:
its classes' passive round trips (p50, p95, p99, from the shaped TCP
flows' own packets) and QUEUE NOW, sluice's own part of them: what the
class's queue holds a packet now (its backlog at the rate it passed over
the interval; an EDT aggregate's clock lead). The rest is the path's.
--hosts adds each host of a per_host class.

When a sluice agent runs in the namespace, show prints the agent's own
last reading instead (the numbers its dashboard and metrics show, its
rates over its interval); --local reads the kernel regardless.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval < 0 {
				return badInput(fmt.Errorf("--interval must not be negative"))
			}
			if !local {
				if done, err := g.showFromAgent(args, asJSON, watch, hosts, interval); done {
					return err
				}
			}
			k, err := g.openKernel(cmd)
			if err != nil {
				return err
			}
			defer k.Close()
			for _, d := range args {
				if !k.LinkExists(d) {
					return badInput(fmt.Errorf("device %s does not exist", d))
				}
			}
			prev, err := stats.Collect(k, args)
			if err != nil {
				return failure(err)
			}
			stop := make(chan os.Signal, 1)
			signal.Notify(stop, os.Interrupt)
			defer signal.Stop(stop)
			for first := true; ; first = false {
				cur := prev
				if interval > 0 {
					select {
					case <-time.After(interval):
					case <-stop:
						return nil
					}
					if cur, err = stats.Collect(k, args); err != nil {
						return failure(err)
					}
					stats.Rates(prev, cur)
				}
				g.printSample(cur, asJSON, watch, hosts, first, "")
				if !watch || interval == 0 {
					return nil
				}
				prev = cur
			}
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (see docs/json.md)")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "refresh every interval until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "measurement interval (0: counters only)")
	cmd.Flags().BoolVar(&local, "local", false, "read the kernel even when an agent runs")
	cmd.Flags().BoolVar(&hosts, "hosts", false, "list each host's round trips too (rtt: on, per_host classes)")
	return cmd
}

// showFromAgent prints a running agent's readings; done is false when no
// agent answers (show then reads the kernel).
func (g *globals) showFromAgent(devs []string, asJSON, watch, hosts bool, interval time.Duration) (done bool, err error) {
	st, ok := agent.ReadStatus(g.netns, 2*time.Second)
	if !ok {
		return false, nil
	}
	known := map[string]bool{}
	for _, t := range st.Sample.Trees {
		known[t.Device], known[t.Interface] = true, true
	}
	for _, d := range devs {
		if !known[d] {
			return true, badInput(fmt.Errorf("device %s: the agent shapes no tree on it", d))
		}
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt)
	defer signal.Stop(stop)
	for first := true; ; first = false {
		s := filterTrees(st.Sample, devs)
		g.printSample(s, asJSON, watch, hosts, first, fmt.Sprintf("(from the sluice agent: its reading of %s)", s.At.Local().Format(time.TimeOnly)))
		if !asJSON {
			writeAutorate(g.stdout, st.Autorate, devs)
		}
		if !watch || interval == 0 {
			return true, nil
		}
		select {
		case <-time.After(interval):
		case <-stop:
			return true, nil
		}
		if st, ok = agent.ReadStatus(g.netns, 2*time.Second); !ok {
			return true, failure(fmt.Errorf("the agent stopped answering"))
		}
	}
}

func filterTrees(s *stats.Sample, devs []string) *stats.Sample {
	if len(devs) == 0 {
		return s
	}
	out := &stats.Sample{At: s.At}
	for _, t := range s.Trees {
		for _, d := range devs {
			if t.Device == d || t.Interface == d {
				out.Trees = append(out.Trees, t)
				break
			}
		}
	}
	return out
}

// printSample prints one reading: JSON (a line each with watch), or the
// text tree (clearing the screen between readings with watch), after
// note when there is one.
func (g *globals) printSample(s *stats.Sample, asJSON, watch, hosts, first bool, note string) {
	switch {
	case asJSON && watch:
		b, _ := json.Marshal(s)
		fmt.Fprintln(g.stdout, string(b))
	case asJSON:
		s.WriteJSON(g.stdout)
	default:
		if watch && !first {
			fmt.Fprint(g.stdout, "\033[H\033[2J")
		}
		if note != "" {
			fmt.Fprintln(g.stdout, note)
		}
		s.WriteText(g.stdout, stats.TextOptions{Hosts: hosts})
	}
}

// writeAutorate prints each rate: auto controller of devs (all, when
// none are named): its rate against its bounds, its state, the delay it
// reads and its reflectors.
func writeAutorate(w io.Writer, as []agent.AutoStatus, devs []string) {
	for _, a := range as {
		if len(devs) > 0 && !slices.Contains(devs, a.Device) && !slices.Contains(devs, a.Interface) {
			continue
		}
		active := 0
		for _, r := range a.Reflectors {
			if r.Active {
				active++
			}
		}
		bits := func(b uint64) string { return units.Bits(float64(b) * 8) }
		threshold := fmt.Sprintf("threshold %.1f ms", a.ThresholdSeconds*1e3)
		if a.ThresholdAuto {
			threshold += " (auto)"
		}
		fmt.Fprintf(w, "rate: auto %s %s: %s (min %s, base %s, max %s), %s, passing %s, delay %.1f ms over the baseline, %s, %d of %d reflectors pinged (%s), %d replaced",
			a.Interface, a.Direction, bits(a.RateBytesPerSecond), bits(a.MinBytesPerSecond), bits(a.BaseBytesPerSecond), bits(a.MaxBytesPerSecond),
			a.State, units.Bits(a.PassedBytesPerSecond*8), a.DelaySeconds*1e3, threshold, active, len(a.Reflectors), a.Probe, a.Replaced)
		if a.Error != "" {
			fmt.Fprintf(w, "; %s", a.Error)
		}
		fmt.Fprintln(w)
	}
}
