package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sluice/bpf"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/tc"
)

func validateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a policy file; errors as FILE:LINE:COL: message",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.loadPolicy(args[0])
			if err != nil {
				return err
			}
			trees, classes := 0, 0
			for _, in := range p.Interfaces {
				for _, t := range []*policy.Tree{in.Egress, in.Ingress} {
					if t != nil {
						trees++
						classes += countClasses(t.Classes)
					}
				}
			}
			fmt.Fprintf(g.stdout, "%s: valid (%d interface(s), %d tree(s), %d class(es))\n", args[0], len(p.Interfaces), trees, classes)
			return nil
		},
	}
}

func countClasses(cs []*policy.Class) int {
	n := 0
	for _, c := range cs {
		n++
		if c.PerHost != nil {
			n += c.PerHost.HostCount()
		}
		n += countClasses(c.Classes)
	}
	return n
}

// prepared is a policy planned against the live kernel.
type prepared struct {
	k     *kernel.Kernel
	pol   *policy.Policy
	plan  *plan.Plan
	live  *kernel.Live
	diff  *kernel.Diff
	phase phases
	// touched: the diff covers only the objects the edit touched.
	touched bool
}

// phases times the steps of a command, for --timings.
type phases struct {
	last  time.Time
	names []string
	took  []time.Duration
}

func (t *phases) start() { t.last = time.Now() }

func (t *phases) mark(name string) {
	now := time.Now()
	t.names = append(t.names, name)
	t.took = append(t.took, now.Sub(t.last))
	t.last = now
}

func (t *phases) String() string {
	var parts []string
	var sum time.Duration
	for i, n := range t.names {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", n, float64(t.took[i].Microseconds())/1000))
		sum += t.took[i]
	}
	return fmt.Sprintf("timings: %s (total %.1f ms)", strings.Join(parts, ", "), float64(sum.Microseconds())/1000)
}

// prepare plans file against the kernel. apply passes lock (it changes
// the kernel) and, unless --full or --force, fast: read back only what
// the edit touches when the records allow it (kernel.ReadTouched).
// oneShotGC turns the garbage collector off up to a memory limit, for
// plan and apply: they run once and keep most of what they allocate (the
// policy, the plan, the records), so collecting frees little, and with
// 10,000 hosts it cost a fifth of a one-subscriber change. GOGC or
// GOMEMLIMIT in the environment take precedence.
func oneShotGC() {
	if os.Getenv("GOGC") == "" && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(1 << 30)
	}
}

func (g *globals) prepare(file string, force, lock, fast bool) (*prepared, error) {
	oneShotGC()
	var ph phases
	ph.start()
	// The records load while the policy parses: with 10,000 hosts each
	// takes milliseconds, and the lock below re-reads records that
	// changed in between.
	type opened struct {
		k   *kernel.Kernel
		err error
	}
	open := make(chan opened, 1)
	go func() {
		k, err := g.openKernel()
		open <- opened{k, err}
	}()
	pol, err := g.loadPolicy(file)
	o := <-open
	if err != nil {
		if o.k != nil {
			o.k.Close()
		}
		return nil, err
	}
	ph.mark("parse")
	if o.err != nil {
		return nil, o.err
	}
	k := o.k
	p := &prepared{k: k, pol: pol, phase: ph}
	fail := func(e error) (*prepared, error) {
		k.Close()
		return nil, e
	}
	if lock {
		if err := k.Lock(g.lockTimeout); err != nil {
			return fail(failure(err))
		}
	}
	p.phase.mark("open")
	if err := k.CheckInterfaces(pol); err != nil {
		return fail(badInput(err))
	}
	rep, err := kernel.ProbeCached(kernel.StateDir(""))
	if err != nil {
		return fail(failure(fmt.Errorf("probing the kernel: %w", err)))
	}
	if p.plan, err = k.Plan(pol, rep.Features()); err != nil {
		return fail(badInput(err))
	}
	p.phase.mark("plan")
	if fast {
		l, desired, ok, err := k.ReadTouched(p.plan)
		if err != nil {
			return fail(failure(fmt.Errorf("reading the kernel: %w", err)))
		}
		if ok {
			p.live, p.touched = l, true
			p.phase.mark("read touched")
			p.diff = kernel.Compute(l.Objects, desired, l.Opt)
			p.phase.mark("diff")
			return p, nil
		}
	}
	if p.live, err = k.ReadLive(p.plan, nil, force); err != nil {
		var fe *kernel.ForeignRootError
		if errors.As(err, &fe) {
			return fail(failure(err))
		}
		return fail(failure(fmt.Errorf("reading the kernel: %w", err)))
	}
	p.phase.mark("read")
	p.diff = kernel.Compute(p.live.Objects, p.plan.Objects(), p.live.Opt)
	p.phase.mark("diff")
	if force {
		for i := range p.diff.Changes {
			c := &p.diff.Changes[i]
			if q, ok := c.Obj.(*tc.Qdisc); ok && c.Verb == tc.Add && q.Parent == tc.HandleRoot {
				c.Force = true
			}
		}
	}
	return p, nil
}

func planCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "plan FILE",
		Short: "Show what apply would change on the live kernel",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.prepare(args[0], force, false, false)
			if err != nil {
				return err
			}
			defer p.k.Close()
			printDiff(g.stdout, p.diff)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "plan to replace root qdiscs sluice did not create")
	return cmd
}

func applyCmd(g *globals) *cobra.Command {
	var force, quiet, timings, full bool
	cmd := &cobra.Command{
		Use:   "apply FILE",
		Short: "Make the kernel match the policy with the fewest changes",
		Long: `Apply changes the kernel to match the policy: only the difference from the
live state, in an order the kernel accepts. If any step fails, every step
before it is undone in reverse, leaving the kernel as it was. A second
apply of the same policy changes nothing.

When the last apply's records allow it, apply reads back only the objects
the policy edit touches (a subscriber's class and leaf, the classifier's
maps) and trusts the rest to be as it left them; --full reads everything
back and repairs what was changed behind sluice's back, as plan shows.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.prepare(args[0], force, true, !full && !force)
			if err != nil {
				return err
			}
			defer p.k.Close()
			if timings {
				defer func() { fmt.Fprintln(g.stderr, p.phase.String()) }()
			}
			if p.diff.Empty() {
				fmt.Fprintln(g.stdout, "no changes")
				defer p.phase.mark("record")
				return p.k.Record(p.plan, p.diff, p.live, args[0])
			}
			if !quiet {
				printDiff(g.stdout, p.diff)
			}
			res, err := p.k.Apply(p.diff)
			if err != nil {
				return failure(err)
			}
			p.phase.mark("apply")
			if err := p.k.Record(p.plan, p.diff, p.live, args[0]); err != nil {
				return failure(fmt.Errorf("applied, but could not record ownership: %w", err))
			}
			p.phase.mark("record")
			fmt.Fprintf(g.stdout, "applied: %d change(s), %d netlink write(s)\n", res.Changes, res.Writes)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "replace root qdiscs sluice did not create")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "do not print the changes")
	cmd.Flags().BoolVar(&timings, "timings", false, "print how long each step took (to stderr)")
	cmd.Flags().BoolVar(&full, "full", false, "read every object back, not only those the edit touches (repairs changes made behind sluice's back)")
	return cmd
}

func resetCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "reset DEV... | --all",
		Short: "Remove everything sluice installed on DEV (qdiscs, filters, ifb), nothing else",
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return badInput(errors.New("reset: name one or more devices, or --all"))
			}
			k, err := g.openKernel()
			if err != nil {
				return err
			}
			defer k.Close()
			if err := k.Lock(g.lockTimeout); err != nil {
				return failure(err)
			}
			d, names, err := k.ResetPlan(args, all)
			if err != nil {
				return failure(err)
			}
			if len(names) == 0 {
				fmt.Fprintf(g.stdout, "nothing to reset: sluice has shaped none of %s\n", strings.Join(args, ", "))
				return nil
			}
			printDiff(g.stdout, d)
			if _, err := k.Apply(d); err != nil {
				return failure(err)
			}
			if err := k.Forget(names); err != nil {
				return failure(err)
			}
			fmt.Fprintf(g.stdout, "reset: %s\n", strings.Join(names, ", "))
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "reset every device sluice shapes in the namespace")
	return cmd
}

// printDiff writes one line per object: + add, ~ change, - delete,
// -/+ replace.
func printDiff(w io.Writer, d *kernel.Diff) {
	if d.Empty() {
		fmt.Fprintln(w, "no changes")
		return
	}
	deleted := map[string]kernel.Change{}
	added := map[string]bool{}
	for _, c := range d.Changes {
		switch c.Verb {
		case tc.Delete:
			deleted[c.Obj.Key()] = c
		case tc.Add:
			added[c.Obj.Key()] = true
		}
	}
	var nAdd, nChange, nDel, nRepl int
	for _, c := range d.Changes {
		k := c.Obj.Key()
		switch {
		case c.Verb == tc.Delete && added[k]:
			continue // shown with its re-creation
		case c.Verb == tc.Delete:
			nDel++
			line := "- " + c.Obj.Describe()
			if n := len(c.Implied); n > 0 {
				line += fmt.Sprintf("  (with %d object(s) inside)", n)
			}
			fmt.Fprintln(w, line)
		case c.Verb == tc.Change:
			nChange++
			fmt.Fprintf(w, "~ %s%s\n", c.Obj.Describe(), changeNote(c))
		case c.Verb == tc.Add && deleted[k].Obj != nil:
			nRepl++
			why := c.Reason
			if why == "" {
				why = deleted[k].Reason
			}
			fmt.Fprintf(w, "-/+ %s  (replace: %s)\n", c.Obj.Describe(), why)
		default:
			nAdd++
			fmt.Fprintln(w, "+ "+c.Obj.Describe())
		}
	}
	fmt.Fprintf(w, "plan: %d to add, %d to change, %d to replace, %d to delete\n", nAdd, nChange, nRepl, nDel)
}

func changeNote(c kernel.Change) string {
	switch n := c.Obj.(type) {
	case *tc.Class:
		o := c.Old.(*tc.Class)
		var parts []string
		if o.Rate != n.Rate {
			parts = append(parts, fmt.Sprintf("rate %s -> %s", tc.FormatRate(o.Rate), tc.FormatRate(n.Rate)))
		}
		if o.Ceil != n.Ceil {
			parts = append(parts, fmt.Sprintf("ceil %s -> %s", tc.FormatRate(o.Ceil), tc.FormatRate(n.Ceil)))
		}
		if o.BufferTicks != tc.XmitTicks(n.Rate, n.Burst) {
			parts = append(parts, fmt.Sprintf("burst %db -> %db", o.Burst, n.Burst))
		}
		if o.CbufferTicks != tc.XmitTicks(n.Ceil, n.Cburst) {
			parts = append(parts, fmt.Sprintf("cburst %db -> %db", o.Cburst, n.Cburst))
		}
		if o.Prio != n.Prio {
			parts = append(parts, fmt.Sprintf("prio %d -> %d", o.Prio, n.Prio))
		}
		if o.Quantum != n.Quantum {
			parts = append(parts, fmt.Sprintf("quantum %d -> %d", o.Quantum, n.Quantum))
		}
		if len(parts) > 0 {
			return "  (" + strings.Join(parts, ", ") + ")"
		}
	case *tc.Link:
		return "  (set up)"
	case *bpf.Hook:
		if d := n.Content.Delta(c.Old.(*bpf.Hook).Content); d != "" {
			return "  (maps: " + d + ")"
		}
	}
	return ""
}
