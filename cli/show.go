package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/spf13/cobra"

	"sluice/stats"
)

func showCmd(g *globals) *cobra.Command {
	var asJSON, watch bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "show [DEV...]",
		Short: "Show the live tree: configured and measured rates, packets, drops, backlog",
		Long: `Show reads every class of the trees sluice manages (or those on DEV; an
interface includes its ingress ifb) twice, --interval apart, and prints
each class's configured rate and ceil, its measured rate over that
interval, and its counters. --watch repeats until interrupted. --json
prints the documented object of docs/json.md (one per line with --watch).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := g.openKernel(cmd)
			if err != nil {
				return err
			}
			defer k.Close()
			for _, d := range args {
				if !k.Conn.LinkExists(d) {
					return badInput(fmt.Errorf("device %s does not exist", d))
				}
			}
			if interval < 0 {
				return badInput(fmt.Errorf("--interval must not be negative"))
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
				switch {
				case asJSON && watch:
					b, _ := json.Marshal(cur)
					fmt.Fprintln(g.stdout, string(b))
				case asJSON:
					cur.WriteJSON(g.stdout)
				default:
					if watch && !first {
						fmt.Fprint(g.stdout, "\033[H\033[2J")
					}
					cur.WriteText(g.stdout)
				}
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
	return cmd
}
