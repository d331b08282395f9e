package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"sluice/agent"
	"sluice/bpf"
	"sluice/engine"
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
			trees, classes, hosts := 0, 0, 0
			for _, in := range p.Interfaces {
				for _, t := range []*policy.Tree{in.Egress, in.Ingress} {
					if t != nil {
						trees++
						classes += t.ClassCount
						hosts += t.Hosts
					}
				}
			}
			fmt.Fprintf(g.stdout, "%s: valid (%d interface(s), %d tree(s), %d class(es)", args[0], len(p.Interfaces), trees, classes)
			if hosts > 0 {
				fmt.Fprintf(g.stdout, ", %d of them per-host", hosts)
			}
			fmt.Fprintln(g.stdout, ")")
			return nil
		},
	}
}

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

func planCmd(g *globals) *cobra.Command {
	var force, detailed, tcLines, asJSON bool
	var out string
	cmd := &cobra.Command{
		Use:   "plan FILE",
		Short: "Show what apply would change on the live kernel",
		Long: `Plan shows what apply would change on the live kernel, and changes nothing.

It lists the changes in the policy's terms: each tree, class and group
of hosts added (+), changed (~, with what changed), replaced (-/+) or
removed (-), then a count. --tc lists the kernel objects instead (qdiscs,
classes, filters, BPF maps), as tc would show them; --json prints both.

With --detailed-exitcode the exit status says whether there is anything
to change: 0 none, 3 changes to make, 1 a failure, 2 bad input (terraform
uses 2 for changes; in sluice 2 is bad input in every command).

With --out FILE the plan is also saved, with the policy as it was read:
'sluice apply FILE' later makes exactly the changes shown, or, if the
kernel (or a hosts file, or the records) moved in between so that other
changes are needed, none, saying which differ.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := g.engineOptions(cmd)
			if err != nil {
				return err
			}
			o.Force = force
			oneShotGC()
			var p *engine.Prepared
			var saved *engine.SavedPlan
			if out != "" {
				p, saved, err = engine.PlanToSave(args[0], o, changeLines)
			} else {
				p, err = engine.Plan(args[0], o)
			}
			if err != nil {
				return classify(err)
			}
			defer p.Close()
			if saved != nil {
				if err := saved.Write(out); err != nil {
					return classify(err)
				}
				defer fmt.Fprintf(g.stderr, "saved: %s (sluice apply %s makes these changes, or none if the kernel moved)\n", out, out)
			}
			if p.Kernel().Interrupted() {
				fmt.Fprintln(g.stderr, "note: an earlier apply did not finish; the next apply completes it")
			}
			switch {
			case asJSON:
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				if err := enc.Encode(struct {
					*engine.Summary
					TC []string `json:"tc"`
				}{p.Summary(), changeLines(p)}); err != nil {
					return failure(err)
				}
			case tcLines:
				printDiff(g.stdout, p.Diff)
			default:
				fmt.Fprint(g.stdout, p.Summary())
			}
			printSharing(g.stderr, p.Plan)
			if keeper, kept := agentKeeps(g.netns, args[0], false); kept && !p.Diff.Empty() {
				fmt.Fprintf(g.stderr, "note: %s; apply refuses without --force\n", keeper)
			}
			if detailed && !p.Diff.Empty() {
				return quietExit(ExitChanges)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "plan to replace root qdiscs sluice did not create")
	cmd.Flags().BoolVar(&detailed, "detailed-exitcode", false, "exit 3 when there are changes to make, 0 when none")
	cmd.Flags().StringVar(&out, "out", "", "save the plan to FILE, for `sluice apply FILE`")
	cmd.Flags().BoolVar(&tcLines, "tc", false, "list the kernel objects to change (tc's terms) instead of the policy's")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the changes in both terms as JSON (docs/json.md)")
	cmd.MarkFlagsMutuallyExclusive("tc", "json")
	return cmd
}

// changeLines renders a diff one line per change, in its order (a
// replacement is its delete and its add): a saved plan's lines.
func changeLines(p *engine.Prepared) []string {
	var out []string
	for _, c := range p.Diff.Changes {
		mark := "+"
		switch c.Verb {
		case tc.Delete:
			mark = "-"
		case tc.Change:
			mark = "~"
		}
		out = append(out, mark+" "+c.Obj.Describe())
	}
	return out
}

// agentKeeps says, where a sluice agent keeps the namespace with a
// policy other than file, that it will undo what file changes (kept
// false where none runs, or it keeps file itself: it applies the same).
func agentKeeps(netns, file string, savedPlan bool) (string, bool) {
	info, ok := agent.Keeper(netns)
	if !ok {
		return "", false
	}
	if abs, err := filepath.Abs(file); err == nil && info.Policy != "" && abs == info.Policy && !savedPlan {
		return "", false
	}
	who := "a sluice agent"
	if info.PID > 0 {
		who += fmt.Sprintf(" (pid %d)", info.PID)
	}
	if info.Policy == "" {
		return who + " keeps this network namespace: it puts its own policy back at its next pass (edit that policy instead; the agent reloads it)", true
	}
	return fmt.Sprintf("%s keeps this network namespace with %s: it puts that policy back at its next pass, undoing any difference (edit %s instead: the agent reloads it on change or SIGHUP)",
		who, info.Policy, info.Policy), true
}

func applyCmd(g *globals) *cobra.Command {
	var force, quiet, timings, full, tcLines bool
	cmd := &cobra.Command{
		Use:   "apply FILE",
		Short: "Make the kernel match the policy (or a plan saved by plan --out) with the fewest changes",
		Long: `Apply changes the kernel to match the policy: only the difference from the
live state, in an order the kernel accepts. It prints what it changes as
plan does, in the policy's terms (--tc or -v: each kernel object). If any step fails, every step
before it is undone in reverse, leaving the kernel as it was. A second
apply of the same policy changes nothing.

Before its first change, apply writes a journal into its records: if it
is killed at any point, the records still claim everything it may have
made, and the next plain apply (or reset) completes the work. When the
records cannot be written (a full disk), apply changes nothing.

When the last apply's records allow it, apply reads back only the objects
the policy edit touches (a subscriber's class and leaf, the classifier's
maps), after checking with a few reads that each tree's root (and every
shard) is still the one it made, and trusts the rest to be as it left
them; --full reads everything back and repairs what was changed behind
sluice's back, as plan shows.

FILE may be a plan saved by 'sluice plan --out': apply then makes exactly
the changes that plan showed, for the policy as it was then, or refuses
(changing nothing) if the kernel now needs other changes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := g.engineOptions(cmd)
			if err != nil {
				return err
			}
			o.Force, o.Full = force, full
			oneShotGC()
			saved, isPlan, err := engine.ReadSavedPlan(args[0])
			if err != nil {
				return classify(err)
			}
			keeper, kept := agentKeeps(g.netns, args[0], isPlan)
			if kept && !force {
				return badInput(fmt.Errorf("%s; apply changes nothing (--force applies anyway, until the agent's next pass)", keeper))
			}
			var p *engine.Prepared
			if isPlan {
				if force || full {
					return badInput(fmt.Errorf("%s is a saved plan: it applies as it was planned (--force as plan had it); --force and --full are for a policy", args[0]))
				}
				p, err = engine.PrepareSaved(args[0], saved, o, changeLines)
			} else {
				p, err = engine.Prepare(args[0], o)
			}
			if err != nil {
				return classify(err)
			}
			defer p.Close()
			if timings {
				defer func() { fmt.Fprintln(g.stderr, p.Phases.String()) }()
			}
			empty := p.Diff.Empty()
			switch {
			case empty:
				fmt.Fprintln(g.stdout, "no changes")
			case quiet:
			case tcLines:
				printDiff(g.stdout, p.Diff)
			default:
				// The plan's lines: what changes in the policy's terms,
				// not hundreds of u32 keys (--tc lists those).
				for _, l := range p.Summary().Lines {
					fmt.Fprintln(g.stdout, l.String())
				}
			}
			res, err := p.Apply()
			if err != nil {
				return classify(err)
			}
			if !quiet {
				printSharing(g.stderr, p.Plan)
			}
			if !empty {
				fmt.Fprintf(g.stdout, "applied: %d change(s), %d netlink write(s)\n", res.Changes, res.Writes)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "replace root qdiscs and filters sluice did not create; apply beside a running agent")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "do not print the changes")
	cmd.Flags().BoolVarP(&tcLines, "tc", "v", false, "print the kernel objects changed (tc's terms) instead of the plan's lines")
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
			o, err := g.engineOptions(cmd)
			if err != nil {
				return err
			}
			r, err := engine.Reset(args, all, o, func(d *kernel.Diff) { printDiff(g.stdout, d) })
			if err != nil {
				return classify(err)
			}
			if len(r.Devices) == 0 {
				fmt.Fprintf(g.stdout, "nothing to reset: sluice has shaped none of %s\n", strings.Join(args, ", "))
				return nil
			}
			fmt.Fprintf(g.stdout, "reset: %s\n", strings.Join(r.Devices, ", "))
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "reset every device sluice shapes in the namespace")
	return cmd
}

// printDiff writes one line per object: + add, ~ change, - delete,
// -/+ replace.
// printSharing notes the sibling groups whose quanta cannot follow their
// weights (docs/policy.md, "Sharing spare capacity"), and what else a
// tree cannot do as the policy reads (plan.Device.Notes).
func printSharing(w io.Writer, p *plan.Plan) {
	for _, d := range p.Devices {
		for _, s := range slices.Concat(d.Sharing, d.Notes) {
			fmt.Fprintf(w, "note: %s %s: %s\n", d.Interface, d.Dir, s)
		}
	}
	for _, n := range controllerNotes(p) {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// controllerNotes says, per sharing controller, what it shares and that
// it runs in the agent (docs/sharing.md).
func controllerNotes(p *plan.Plan) []string {
	var out []string
	for _, d := range p.Devices {
		for _, c := range d.Controllers {
			if c.Shards {
				out = append(out, fmt.Sprintf("%s %s: `sluice agent` balances the %d shards every %s: each shard's rate is its part of %s by the hosts active in it, so that the shards lend to each other; without the agent each keeps rate/%d",
					d.Interface, d.Dir, len(c.Children), c.Quantum, c.Capacity.String(), len(c.Children)))
				continue
			}
			over := "the top-level classes"
			if c.Owner != "" {
				over = "the children of " + c.Owner
			}
			var ws, prod []string
			for _, ch := range c.Children {
				if ch.Prod {
					prod = append(prod, ch.Name)
					continue
				}
				ws = append(ws, fmt.Sprintf("%s %.4g", ch.Name, ch.Weight))
			}
			what := "ceils"
			if c.Assure {
				what = "rates" // guarantees: what one leaves the others borrow
			}
			s := fmt.Sprintf("%s %s: a sharing controller splits %s among %s by weight (%s) every %s, writing their %s; it runs in `sluice agent`, and without one the %s stay the policy's",
				d.Interface, d.Dir, c.Capacity.String(), over, listSome(ws), c.Quantum, what, what)
			if len(prod) > 0 {
				s += fmt.Sprintf("; %s (prio 0) never limited, their use taken off the %s", listSome(prod), c.Capacity.String())
			}
			out = append(out, s)
		}
	}
	return out
}

// listSome joins the first few of names (a group's hosts may be
// thousands) and counts the rest.
func listSome(names []string) string {
	const some = 8
	if len(names) <= some {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:some], ", "), len(names)-some)
}

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
			parts = append(parts, fmt.Sprintf("rate %s -> %s", o.Rate.TC(), n.Rate.TC()))
		}
		if o.Ceil != n.Ceil {
			parts = append(parts, fmt.Sprintf("ceil %s -> %s", o.Ceil.TC(), n.Ceil.TC()))
		}
		b, cb := tc.BurstChanged(o, n)
		if b {
			parts = append(parts, fmt.Sprintf("burst %db -> %db", o.Burst, n.Burst))
		}
		if cb {
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
