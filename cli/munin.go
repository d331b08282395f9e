package cli

import (
	"sluice/units"

	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sluice/agent"
	"sluice/stats"
)

func muninCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "munin [config|autoconf]",
		Short: "Act as a munin plugin: one graph per device and direction, a line per class",
		Long: `munin prints the class counters in munin's plugin protocol (multigraph):
one graph per device and direction with a line per class (per-host
classes are left out; their parent class carries them). With 'config' it
prints the graphs' definitions, with 'autoconf' whether it can run. The
values come from a running agent when there is one, else from the kernel.
Install it as a plugin with a two-line wrapper (see docs/agent.md):

  #!/bin/sh
  exec sluice munin "$@"`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode := ""
			if len(args) == 1 {
				mode = args[0]
			}
			switch mode {
			case "", "fetch", "config", "autoconf":
			default:
				return badInput(fmt.Errorf("munin %q: want config, autoconf or nothing (values)", mode))
			}
			s, err := g.sample(cmd, nil)
			if mode == "autoconf" {
				if err != nil {
					fmt.Fprintf(g.stdout, "no (%v)\n", err)
				} else {
					fmt.Fprintln(g.stdout, "yes")
				}
				return nil
			}
			if err != nil {
				return err
			}
			writeMunin(g.stdout, s, mode == "config")
			return nil
		},
	}
	return cmd
}

// sample is one reading of the counters: a running agent's last (so
// every reader sees the same numbers), else the kernel's, now.
func (g *globals) sample(cmd *cobra.Command, devs []string) (*stats.Sample, error) {
	if st, ok := agent.ReadStatus(g.netns, 2*time.Second); ok {
		return st.Sample, nil
	}
	k, err := g.openKernel(cmd)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	s, err := stats.Collect(k, devs)
	if err != nil {
		return nil, failure(err)
	}
	return s, nil
}

// muninName makes s a munin field or graph name: letters, digits and _.
func muninName(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

func writeMunin(w io.Writer, s *stats.Sample, config bool) {
	for _, t := range s.Trees {
		if t.Missing {
			continue
		}
		fmt.Fprintf(w, "multigraph sluice_%s_%s\n", muninName(t.Interface), t.Direction)
		if config {
			fmt.Fprintf(w, "graph_title sluice %s %s\n", t.Interface, t.Direction)
			fmt.Fprintln(w, "graph_category network")
			fmt.Fprintln(w, "graph_vlabel bits per ${graph_period}")
			fmt.Fprintln(w, "graph_args --base 1000 --lower-limit 0")
		}
		// A sharded tree has a copy of each named class per shard: one line.
		var names []string
		sum := map[string]uint64{}
		first := map[string]*stats.Class{}
		for _, c := range t.Classes {
			if agent.IsHostClass(c.Name) || c.Name == "?" {
				continue
			}
			if first[c.Name] == nil {
				first[c.Name] = c
				names = append(names, c.Name)
			}
			sum[c.Name] += c.Bytes
		}
		used := map[string]bool{}
		for i, name := range names {
			c := first[name]
			// Field names must be unique and may not start with a digit.
			f := "c_" + muninName(name)
			if used[f] {
				f = fmt.Sprintf("%s_%d", f, i)
			}
			used[f] = true
			if config {
				fmt.Fprintf(w, "%s.label %s\n", f, name)
				fmt.Fprintf(w, "%s.type DERIVE\n", f)
				fmt.Fprintf(w, "%s.min 0\n", f)
				fmt.Fprintf(w, "%s.info class %s, rate %d bit/s, ceil %d bit/s\n", f, c.ID, c.Rate.Bits(), c.Ceil.Bits())
				continue
			}
			fmt.Fprintf(w, "%s.value %d\n", f, units.BitsOf(sum[name]))
		}
	}
}
