package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"sluice/conform"
	"sluice/safefile"
	"sluice/vmlane"
)

type conformanceFlags struct {
	kernel, backend, out, name, scale string
	queues, hosts                     int
	rtt, settle, measure              time.Duration
	trees                             []string
	asJSON, quiet, keep               bool
}

func labConformanceCmd(g *globals) *cobra.Command {
	f := &conformanceFlags{}
	cmd := &cobra.Command{
		Use:   "conformance POLICY",
		Short: "Prove who gets what: drive demand patterns through the policy and compare every class and host with the weighted max-min reference",
		Long: `Conformance builds a test bed with the policy's own devices (a gateway
namespace, the devices wired to namespaces beyond them), applies the
policy, and for every tree drives demand patterns through it: all its
classes and hosts at once, each alone, subsets, one heavy host with eight
flows against light ones, a UDP flow that wants less than its share. Each
cell compares what every class and host got (the kernel's counters) with
the weighted max-min reference for the same demand: its share of the total
within 5%, and the total within 5% of what the reference wants, after what
a plain limit at the tree's rate carries on this bed (docs/sharing.md).

Rates are scaled down where the bed carries less than twice a tree's rate
(--scale 1 keeps them). A tree the kernel cannot build (a leaf it lacks)
is skipped and says why. With --kernel the run happens inside a VM booted
with that kernel, as lab run does.

Exit status: 0 every cell within the tolerance, 1 a cell beyond it (or a
failure while acting), 2 bad input.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.conformance(args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.kernel, "kernel", "", "run inside a VM booted with this kernel: 6.1, 6.12, a Debian package version, or a vmlinuz path")
	fl.StringVar(&f.backend, "backend", "", "run every tree on this data plane: htb or edt (default: the policy's)")
	fl.IntVar(&f.queues, "queues", 0, "transmit queues of the bed's devices (default: the real device's, where this host has it, else 1)")
	fl.DurationVar(&f.rtt, "rtt", conform.DefaultRTT, "round trip beyond each device (0: none)")
	fl.DurationVar(&f.settle, "settle", conform.DefaultSettle, "time each cell runs before it is measured")
	fl.DurationVar(&f.measure, "duration", conform.DefaultMeasure, "time each cell is measured")
	fl.StringVar(&f.scale, "scale", "auto", "multiply every rate by this (auto: so that each tree needs at most half of what the bed carries)")
	fl.IntVar(&f.hosts, "hosts", conform.DefaultHosts, "hosts driven per per_host class")
	fl.StringSliceVar(&f.trees, "tree", nil, "run only these trees (DEVICE/egress, DEVICE/ingress)")
	fl.StringVar(&f.out, "out", "sluice-conformance", "directory for report.json and report.html")
	fl.StringVar(&f.name, "name", "", "name of the test bed (default: cf and the process id)")
	fl.BoolVar(&f.asJSON, "json", false, "print the report as JSON instead of tables")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "a line per cell; subjects only for the cells beyond the tolerance")
	fl.BoolVar(&f.keep, "keep", false, "leave the test bed up (sluice lab down NAME removes it)")
	return cmd
}

func (g *globals) conformance(file string, f *conformanceFlags) error {
	opt := conform.Options{Name: f.name, Queues: f.queues, RTT: f.rtt, Settle: f.settle, Measure: f.measure, Hosts: f.hosts, Trees: f.trees, Keep: f.keep}
	switch {
	case f.rtt < 0 || f.settle < 0 || f.measure < 0:
		return badInput(errors.New("--rtt, --settle and --duration cannot be negative"))
	case f.queues < 0 || f.queues > 64:
		return badInput(fmt.Errorf("--queues %d: between 1 and 64", f.queues))
	case f.hosts < 1:
		return badInput(fmt.Errorf("--hosts %d: at least 1", f.hosts))
	}
	if f.scale != "auto" {
		v, err := strconv.ParseFloat(f.scale, 64)
		if err != nil || !(v > 0 && v <= 1) {
			return badInput(fmt.Errorf("--scale %q: auto, or a factor above 0 and at most 1", f.scale))
		}
		opt.Scale = v
	}
	pol, err := conform.LoadPolicy(file, f.backend)
	if err != nil {
		return badInput(err)
	}
	if f.keep && f.rtt > 0 {
		return badInput(errors.New("--keep: the delay line that makes --rtt lives only as long as the run; keep a bed with --rtt 0"))
	}
	if f.kernel != "" {
		if f.keep {
			return badInput(errors.New("--keep and --kernel: the test bed lives in the VM, which ends with the run"))
		}
		return g.conformanceInVM(file, f)
	}
	if !f.quiet && !f.asJSON {
		opt.Log = g.stdout
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	rep, err := conform.Run(ctx, pol, opt)
	if err != nil {
		return failure(err)
	}
	if f.asJSON {
		if err := rep.WriteJSON(g.stdout); err != nil {
			return failure(err)
		}
	} else {
		fmt.Fprintln(g.stdout)
		rep.WriteText(g.stdout, f.quiet)
	}
	if err := writeReports(f.out, rep); err != nil {
		return failure(err)
	}
	if !f.asJSON {
		abs, _ := filepath.Abs(filepath.Join(f.out, "report.html"))
		fmt.Fprintf(g.stdout, "report: %s (and report.json beside it)\n", abs)
	}
	if rep.Measured() == 0 {
		return failure(errors.New("nothing was measured: no tree could be driven"))
	}
	if !rep.Pass {
		return failure(errors.New("some cells are beyond the tolerance"))
	}
	return nil
}

// conformanceInVM runs the same command with this binary inside a VM
// booted with f.kernel, the report landing in --out on the host.
func (g *globals) conformanceInVM(file string, f *conformanceFlags) error {
	out, err := filepath.Abs(f.out)
	if err != nil {
		return badInput(err)
	}
	if file, err = filepath.Abs(file); err != nil {
		return badInput(err)
	}
	if err := safefile.OutDir(out); err != nil {
		return outDirErr(err)
	}
	self, err := os.Executable()
	if err != nil {
		return failure(err)
	}
	cwd, _ := os.Getwd()
	args := []string{"sluice", "lab", "conformance", file, "--out", out, "--rtt", f.rtt.String(), "--settle", f.settle.String(),
		"--duration", f.measure.String(), "--scale", f.scale, "--hosts", strconv.Itoa(f.hosts)}
	for _, s := range []struct{ flag, v string }{{"--backend", f.backend}, {"--name", f.name}} {
		if s.v != "" {
			args = append(args, s.flag, s.v)
		}
	}
	if f.queues > 0 {
		args = append(args, "--queues", strconv.Itoa(f.queues))
	}
	for _, t := range f.trees {
		args = append(args, "--tree", t)
	}
	if f.asJSON {
		args = append(args, "--json")
	}
	if f.quiet {
		args = append(args, "--quiet")
	}
	fmt.Fprintf(g.stderr, "running the conformance of %s inside a VM with %s\n", file, vmlane.Describe(f.kernel))
	code, err := vmlane.Run(f.kernel, vmlane.Quote(args), self, cwd, out, g.stdout)
	switch {
	case err != nil:
		return failure(fmt.Errorf("the VM: %w", err))
	case code != 0:
		return &exitError{code, fmt.Errorf("the run inside the VM with %s exited %d", vmlane.Describe(f.kernel), code)}
	}
	return nil
}
