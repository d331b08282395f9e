package cli

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"sluice/bpf"
	"sluice/features"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
)

func exportCmd(g *globals) *cobra.Command {
	var format, target string
	var fresh, partial bool
	cmd := &cobra.Command{
		Use:   "export FILE --format tc",
		Short: "Write the policy as a tc -batch script (for audit and for hosts without sluice)",
		Long: `Export writes the commands that build, on a device with nothing on it,
exactly what apply builds: run it with 'tc -batch FILE' (format tc; ifb
devices for ingress must exist first, as its header says) or as a shell
script (format sh, which creates them).

Class ids and filter prios are those recorded for the namespace (--netns)
when there are any, so the script reproduces the live tree; --fresh uses
the ids a first apply would choose. Leaf qdiscs follow this kernel's
features; --kernel full plans for a kernel with every qdisc.

tc cannot load sluice's BPF classifier: a tree sluice classifies in BPF
(classifier bpf, or auto where this kernel's u32 cannot match marks) is
written as its u32 equivalent (one HTB, no shards, u32 hash tables for
hosts; mark rules as u32 'match mark', which needs CONFIG_CLS_U32_MARK on
the host that runs the script), said in a comment at the top.

Where a tree has no tc equivalent on any kernel (policers in BPF, the
EDT backend's pacing, a hosts_file beside match rules), export writes
nothing and exits 2 naming the tree and why; --partial writes the rest,
with the part tc cannot build left as a comment.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "tc" && format != "sh" {
				return badInput(fmt.Errorf("--format %q: expected tc or sh", format))
			}
			if _, err := g.engineOptions(cmd); err != nil {
				return err
			}
			pol, err := g.loadPolicy(args[0])
			if err != nil {
				return err
			}
			if err := batchNames(pol); err != nil {
				return badInput(err)
			}
			// Without privileges neither this kernel's features nor the
			// records can be read: plan as a first apply on a kernel with
			// every qdisc would, and say so (the audit needs no root).
			if !privileged() && (target == "local" || !fresh) {
				fmt.Fprintln(g.stderr, "sluice export: without root this kernel's features and sluice's records cannot be read: written for a kernel with every qdisc, with the ids a first apply would choose (as --kernel full --fresh); as root it matches the live tree")
				target, fresh = "full", true
			}
			var feats plan.Features
			switch target {
			case "local":
				rep, err := features.ProbeCached(records.Dir(""))
				if err != nil {
					return failure(err)
				}
				feats = rep.Features()
			case "full":
				feats = plan.Everything
			default:
				return badInput(fmt.Errorf("--kernel %q: expected local or full", target))
			}
			prev := map[string]*plan.Alloc{}
			if !fresh {
				st, err := records.Load(records.Dir(g.netns))
				if err != nil {
					return failure(err)
				}
				prev = kernel.RecordedAllocs(st)
			}
			// tc cannot load sluice's BPF program: a BPF tree is written
			// as its u32 equivalent where there is one, and export
			// refuses (unless --partial) where there is none.
			var notes, missing []string
			for _, in := range pol.Interfaces {
				for _, t := range []*policy.Tree{in.Egress, in.Ingress} {
					if t == nil {
						continue
					}
					if t.EDT() {
						missing = append(missing, fmt.Sprintf("%s %s (%s): backend edt: sluice's BPF program paces every class and host; tc has no equivalent (the fq qdiscs only hold packets until the time the program sets: without it they pace nothing, docs/edt.md)", in.Name, t.Dir, pos(pol, t.Pos)))
						continue
					}
					if !t.BPF && !(plan.MatchesMarks(t) && !feats.U32Mark && t.Classifier == "auto" && t.Police == nil) {
						continue
					}
					if why := plan.U32Inexpressible(t); why != "" {
						missing = append(missing, fmt.Sprintf("%s %s (%s): classified by sluice's BPF program, which tc cannot load: %s, which u32 cannot express", in.Name, t.Dir, pos(pol, t.Pos), why))
						continue
					}
					t.BPF = false
					note := fmt.Sprintf("%s %s: sluice classifies it in BPF; written here as the equivalent u32 filters (one HTB, no shards)", in.Name, t.Dir)
					if plan.MatchesMarks(t) && !feats.U32Mark {
						note += "; its mark rules are u32 'match mark', which needs CONFIG_CLS_U32_MARK (this kernel's u32 ignores marks: the host that runs this script must have it)"
					}
					notes = append(notes, note)
				}
			}
			if len(missing) > 0 && !partial {
				return badInput(fmt.Errorf("%s: no tc equivalent, so a script would not reproduce apply:\n  %s\n(--partial writes the rest, with these left as comments)",
					args[0], strings.Join(missing, "\n  ")))
			}
			for _, m := range missing {
				notes = append(notes, "not reproduced (--partial): "+m)
			}
			// The script is for a host whose u32 matches marks: its
			// mark rules are u32's, whatever this kernel's u32 does.
			feats.U32Mark = true
			p, err := plan.Build(pol, feats, prev)
			if err != nil {
				return badInput(err)
			}
			notes = append(notes, controllerNotes(p)...)
			d := kernel.Compute(nil, p.Objects(), kernel.Options{})
			fmt.Fprint(g.stdout, renderExport(args[0], format, notes, p, d.Ops()))
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "tc", "tc (a tc -batch script) or sh (a shell script)")
	cmd.Flags().BoolVar(&fresh, "fresh", false, "ignore the ids recorded for the namespace")
	cmd.Flags().BoolVar(&partial, "partial", false, "write what tc can build where a tree has no tc equivalent (policers, EDT), instead of refusing")
	cmd.Flags().StringVar(&target, "kernel", "local", "local (this kernel's qdiscs) or full (every qdisc)")
	return cmd
}

func renderExport(file, format string, notes []string, p *plan.Plan, ops []tc.Op) string {
	var b strings.Builder
	var ifbs []string
	queues := map[string]int{}
	for _, d := range p.Devices {
		if d.Ifb {
			ifbs = append(ifbs, d.Name)
			for _, o := range d.Objects {
				if l, ok := o.(*tc.Link); ok && l.TxQueues > 0 {
					queues[d.Name] = l.TxQueues
				}
			}
		}
	}
	sort.Strings(ifbs)
	// An EDT ifb has one transmit queue per fq.
	numtx := func(ifb string) string {
		if n := queues[ifb]; n > 0 {
			return fmt.Sprintf(" numtxqueues %d", n)
		}
		return ""
	}
	// Every name and path is quoted for the shell or for tc's batch
	// parser, and comments carry no line breaks (tc.ShellWord,
	// tc.CommentSafe): a device may be called "$(id)".
	if format == "sh" {
		fmt.Fprintf(&b, "#!/bin/sh\n# Generated by `sluice export %s --format sh`.\nset -e\n", tc.CommentSafe(file))
		for _, i := range ifbs {
			q := tc.ShellWord(i)
			fmt.Fprintf(&b, "ip link show dev %s >/dev/null 2>&1 || ip link add name %s%s type ifb\nip link set dev %s up\n", q, q, numtx(i), q)
		}
		b.WriteString("tc -batch - <<'SLUICE_EOF'\n")
	} else {
		fmt.Fprintf(&b, "# Generated by `sluice export %s --format tc`. Run: tc -batch FILE\n", tc.CommentSafe(file))
		for _, i := range ifbs {
			q := tc.ShellWord(i)
			fmt.Fprintf(&b, "# First: ip link add name %s%s type ifb && ip link set dev %s up\n", q, numtx(i), q)
		}
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "# %s\n", tc.CommentSafe(n))
	}
	for _, op := range ops {
		if _, isLink := op.Obj.(*tc.Link); isLink {
			continue // created above (sh) or named in the header (tc)
		}
		if h, ok := op.Obj.(*bpf.Hook); ok {
			// tc -batch cannot load sluice's program and fill its maps.
			fmt.Fprintf(&b, "# not reproducible with tc: %s\n# (sluice apply loads bpf/classifier.c and attaches it: tc filter add dev %s %s prio %d bpf da ...)\n",
				tc.CommentSafe(h.Describe()), tc.ShellWord(h.Dev), map[bool]string{true: "ingress", false: "egress"}[h.Ingress], h.Prio)
			continue
		}
		b.WriteString(tc.Batch([]tc.Op{op}))
	}
	if format == "sh" {
		b.WriteString("SLUICE_EOF\n")
	}
	return b.String()
}

// batchNames refuses device names a tc -batch line cannot hold.
func batchNames(pol *policy.Policy) error {
	d := &policy.Diag{File: pol.File}
	for _, in := range pol.Interfaces {
		if err := tc.BatchName(in.Name); err != nil {
			d.Errorf(in.NamePos, "interface: %v", err)
		}
		if in.Ingress != nil {
			if err := tc.BatchName(policy.IfbName(in)); err != nil {
				d.Errorf(in.Ingress.Pos, "ingress: its ifb: %v", err)
			}
		}
	}
	return d.Err()
}

func doctorCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Show which qdiscs, classifiers, actions, BPF features and congestion controls this kernel has",
		Long: `Doctor probes the running kernel by creating each qdisc, classifier and
action on a veth pair in a throwaway network namespace (never by reading
config files), checks BPF features by loading programs and maps, and says
what sluice will therefore do. --json gives the same as a stable object
(see docs/json.md).

Without root (or CAP_NET_ADMIN) it probes nothing: it reads what anyone
may (the release, sysctls, BTF, the kernel's modules), takes each kind to
exist when its module does, and says what it could not find out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Without privileges, what anyone may read, saying what
			// only a probe would tell.
			r := features.Inventory()
			if privileged() {
				var err error
				if r, err = features.Probe(); err != nil {
					return failure(err)
				}
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			fmt.Fprint(g.stdout, doctorText(r))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func orNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, " ")
}

func yesNo(m map[string]bool, order []string) string {
	var have, lack []string
	for _, k := range order {
		if m[k] {
			have = append(have, k)
		} else {
			lack = append(lack, k)
		}
	}
	s := "have " + strings.Join(have, " ")
	if len(lack) > 0 {
		s += "; lack " + strings.Join(lack, " ")
	}
	return s
}

func doctorText(r *features.Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kernel          %s\n", r.Kernel)
	for _, u := range r.Unread {
		fmt.Fprintf(&b, "not read        %s\n", u)
	}
	if r.KindsKnown() {
		fmt.Fprintf(&b, "qdiscs          %s\n", yesNo(r.Qdiscs, features.ProbeQdiscs))
		fmt.Fprintf(&b, "classifiers     %s\n", yesNo(r.Classifiers, features.ProbeClassifiers))
		fmt.Fprintf(&b, "actions         %s\n", yesNo(r.Actions, features.ProbeActions))
	} else {
		fmt.Fprintf(&b, "qdiscs          unknown (not probed)\nclassifiers     unknown (not probed)\nactions         unknown (not probed)\n")
	}
	fmt.Fprintf(&b, "u32 mark match  %v\n", r.U32Mark)
	bp := r.BPF
	fmt.Fprintf(&b, "bpf             syscall %v, jit %v, btf %v, sched_cls %v, tcx %v, test_run %v, spin_lock %v\n",
		bp.Syscall, bp.JIT, bp.BTF, bp.SchedCLS, bp.TCX, bp.TestRun, bp.SpinLock)
	fmt.Fprintf(&b, "bpf maps        %s\n", strings.Join(bp.Maps, " "))
	for _, p := range bp.Problems {
		fmt.Fprintf(&b, "bpf problem     %s\n", p)
	}
	fmt.Fprintf(&b, "tcp cc          %s (current %s)\n", strings.Join(r.CongestionControls, " "), r.CongestionControl)
	fmt.Fprintf(&b, "default_qdisc   %s\n", r.DefaultQdisc)
	if m := r.Modules; m.NoModules {
		b.WriteString("modules         none: this kernel loads no modules; what it has is built in\n")
	} else {
		fmt.Fprintf(&b, "modules         loaded before this probe: %s\n", orNone(m.Loaded))
		fmt.Fprintf(&b, "                loadable on demand: %s\n", orNone(m.Loadable))
		fmt.Fprintf(&b, "                built in: %s\n", orNone(m.Builtin))
		fmt.Fprintf(&b, "                absent: %s\n", orNone(m.Absent))
	}
	b.WriteString("\nsluice will:\n")
	for _, p := range r.Plan {
		fmt.Fprintf(&b, "  - %s\n", p)
	}
	return b.String()
}

// pos is where p stands in pol's file ("office.yaml:12:5").
func pos(pol *policy.Policy, p policy.Pos) string {
	return fmt.Sprintf("%s:%d:%d", pol.File, p.Line, p.Col)
}
