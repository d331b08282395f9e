package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"sluice/features"
	"sluice/lab"
	"sluice/records"
	"sluice/safefile"
	"sluice/vmlane"
)

func labCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "A test bed in network namespaces: traffic, measurements and reports that show what a policy does",
		Long: `The lab builds a home or office in network namespaces (client hosts on a
LAN, a router with devices lan and wan, a server as "the internet", a modem
link in between), runs built-in traffic and latency probes through it
without and with policies, and reports rates, fairness and latency.

Scenarios are YAML files (docs/lab.md); built-in ones: ` + strings.Join(lab.Builtin(), ", ") + `.`,
	}
	bed := "builds and removes test beds of network namespaces"
	cmd.AddCommand(labListCmd(g), needing(labUpCmd(g), bed), needing(labDownCmd(g), bed), needing(labRunCmd(g), bed),
		needing(labConformanceCmd(g), bed))
	return cmd
}

func labListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the built-in scenarios",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, n := range lab.Builtin() {
				s, err := lab.Load(n)
				if err != nil {
					return failure(err)
				}
				fmt.Fprintf(g.stdout, "%-17s %5s  %s\n", n, fmt.Sprintf("%.0f s", s.RunTime().Seconds()), firstSentence(s.Description))
			}
			return nil
		},
	}
}

func firstSentence(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if i := strings.Index(s, ". "); i > 0 {
		return s[:i+1]
	}
	return s
}

func labUpCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "up SCENARIO",
		Short: "Build the scenario's test bed and leave it up",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := lab.Load(args[0])
			if err != nil {
				return badInput(err)
			}
			if lab.NeedsDelayLine(s.Topology) {
				return badInput(fmt.Errorf("%s: the modem's delay or loss needs netem (sch_netem), which this kernel lacks (or the scenario asks for emulator line); sluice lab run emulates it with its own delay line, which lives only as long as the run", s.File))
			}
			b, err := lab.Up(name, s.Topology)
			if err != nil {
				return failure(err)
			}
			fmt.Fprintf(g.stdout, "lab %s is up: router %s (devices lan, wan), server %s, %d client(s) %s\n",
				b.Name, b.Router, b.Server, len(b.Clients), strings.Join(b.Clients, " "))
			fmt.Fprintf(g.stdout, "try: sluice --netns %s apply POLICY   (interfaces lan and wan)\n", b.Router)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "lab", "name of the test bed")
	return cmd
}

func labDownCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "down [NAME] | --all",
		Short: "Remove a test bed (--all: every lab namespace, also leftovers of a crashed run)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var removed []string
			var err error
			switch {
			case all && len(args) > 0:
				return badInput(errors.New("lab down: give a name or --all, not both"))
			case all:
				removed, err = lab.DownAll()
			default:
				name := "lab"
				if len(args) == 1 {
					name = args[0]
				}
				removed, err = lab.Down(name)
			}
			for _, ns := range removed {
				fmt.Fprintln(g.stdout, "removed", ns)
			}
			if len(removed) == 0 && err == nil {
				fmt.Fprintln(g.stdout, "nothing to remove")
			}
			if err != nil {
				return failure(err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "remove every namespace whose name starts with "+lab.Prefix)
	return cmd
}

type runFlags struct {
	name     string
	variants []string
	scale    float64
	out      string
	keep     bool
	quiet    bool
	kernel   string
}

func labRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run SCENARIO",
		Short: "Run a scenario: every variant, then a summary, report.json and report.html",
		Long: `Run builds the scenario's test bed (or uses the one named --name if it is
up), runs each variant in turn, prints the results side by side, writes
report.json (every series) and report.html (charts) to --out, checks the
scenario's expectations (exit status 1 if one fails) and removes the test
bed unless --keep.

With --kernel the whole run happens inside a virtual machine booted with
that kernel: 6.1 or 6.12 (Debian's, fetched with apt into
/var/lib/sluice-vm), a Debian package version (6.1.0-56), or the path of
a vmlinuz whose tree holds lib/modules. An operator proves a policy on
the kernel the gateway runs. It needs qemu (installed if missing) and
virtme-ng (installed in a venv); where KVM cannot run the kernel the
machine is emulated, 5 to 15 times slower (docs/kernels.md). The report
names the kernel it ran on.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.runScenario(args[0], f)
		},
	}
	cmd.Flags().StringVar(&f.name, "name", "", "test bed name (default: the scenario's)")
	cmd.Flags().StringSliceVar(&f.variants, "variant", nil, "run only these variants")
	cmd.Flags().Float64Var(&f.scale, "scale", 1, "multiply every phase's duration (0.5: twice as fast)")
	cmd.Flags().StringVar(&f.out, "out", "", "directory for report.json and report.html (default sluice-lab-SCENARIO)")
	cmd.Flags().BoolVar(&f.keep, "keep", false, "leave the test bed up")
	cmd.Flags().BoolVarP(&f.quiet, "quiet", "q", false, "print only the summary")
	cmd.Flags().StringVar(&f.kernel, "kernel", "", "run inside a VM booted with this kernel: 6.1, 6.12, a Debian package version, or a vmlinuz path")
	return cmd
}

func (g *globals) runScenario(nameOrPath string, f *runFlags) error {
	s, err := lab.Load(nameOrPath)
	if err != nil {
		return badInput(err)
	}
	if f.scale <= 0 {
		return badInput(fmt.Errorf("--scale must be positive"))
	}
	if f.kernel != "" {
		if err := vmlane.CheckKernel(f.kernel); err != nil {
			return badInput(fmt.Errorf("--kernel: %w", err))
		}
	}
	s = s.Select(f.variants)
	variants := s.Variants
	if len(variants) == 0 {
		return badInput(fmt.Errorf("no variant named %s in %s", strings.Join(f.variants, ", "), s.Name))
	}
	if f.kernel != "" {
		return g.runScenarioInVM(nameOrPath, s, f)
	}
	if f.name == "" {
		f.name = s.Name
	}
	if f.out == "" {
		f.out = "sluice-lab-" + s.Name
	}
	// What would fail the run after the bed is built fails it before.
	if err := s.Preflight(f.scale); err != nil {
		return badInput(err)
	}
	if err := safefile.OutDir(f.out); err != nil {
		return outDirErr(err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	release, err := lab.Hold(f.name)
	if err != nil {
		return failure(err)
	}
	defer release()
	bed, err := lab.Attach(f.name)
	created := false
	if err != nil {
		if bed, err = lab.Up(f.name, s.Topology); err != nil {
			return failure(err)
		}
		created = true
	}
	if created && !f.keep {
		defer bed.Down()
	}
	log := g.stdout
	if f.quiet {
		log = nil
	}
	var results []*lab.Result
	for _, v := range variants {
		r, err := lab.Run(ctx, bed, s, v, lab.Options{Scale: f.scale, Log: log})
		if err != nil {
			return failure(err)
		}
		results = append(results, r)
		if ctx.Err() != nil {
			return failure(errors.New("interrupted"))
		}
	}
	rep, _ := features.ProbeCached(records.Dir(""))
	kv := ""
	if rep != nil {
		kv = rep.Kernel
	}
	report := lab.NewReport(s, results, kv)
	fmt.Fprintln(g.stdout)
	report.WriteText(g.stdout)
	if err := writeReports(f.out, report); err != nil {
		return failure(err)
	}
	abs, _ := filepath.Abs(filepath.Join(f.out, "report.html"))
	fmt.Fprintf(g.stdout, "\nreport: %s (and report.json beside it)\n", abs)
	if f.keep {
		fmt.Fprintf(g.stdout, "test bed %s left up: sluice lab down %s\n", bed.Name, bed.Name)
	}
	if !report.Passed {
		return failure(errors.New("some expectations failed"))
	}
	return nil
}

// runScenarioInVM runs the scenario with this very binary inside a VM
// booted with f.kernel, the report landing in --out on the host.
func (g *globals) runScenarioInVM(nameOrPath string, s *lab.Scenario, f *runFlags) error {
	if f.keep {
		return badInput(errors.New("--keep and --kernel: the test bed lives in the VM, which ends with the run"))
	}
	if f.out == "" {
		f.out = "sluice-lab-" + s.Name
	}
	out, err := filepath.Abs(f.out)
	if err != nil {
		return badInput(err)
	}
	if err := safefile.OutDir(out); err != nil {
		return outDirErr(err)
	}
	if _, err := os.Stat(nameOrPath); err == nil {
		if nameOrPath, err = filepath.Abs(nameOrPath); err != nil {
			return badInput(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return failure(err)
	}
	cwd, _ := os.Getwd()
	args := []string{"sluice", "lab", "run", nameOrPath, "--out", out, "--scale", fmt.Sprint(f.scale)}
	if f.name != "" {
		args = append(args, "--name", f.name)
	}
	for _, v := range f.variants {
		args = append(args, "--variant", v)
	}
	if f.quiet {
		args = append(args, "--quiet")
	}
	fmt.Fprintf(g.stdout, "running %s inside a VM with %s\n", s.Name, vmlane.Describe(f.kernel))
	code, err := vmlane.Run(f.kernel, vmlane.Quote(args), self, cwd, out, g.stdout)
	switch {
	case err != nil:
		return failure(fmt.Errorf("the VM: %w", err))
	case code == vmlane.NoVM:
		return failure(fmt.Errorf("no VM ran with %s (said above)", vmlane.Describe(f.kernel)))
	case code != 0:
		return &exitError{code, fmt.Errorf("the run inside the VM with %s exited %d", vmlane.Describe(f.kernel), code)}
	}
	return nil
}

func demoCmd(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show sluice at work in about 20 seconds: a home link, without and with a policy",
		Long: `Demo builds a small home network in network namespaces (a client, a
router, a 20/100 Mbit/s modem with a deep buffer, a server), measures ping
and an ssh-like request/response while the link is idle, while uploading,
downloading and both, first without shaping and then with the wondershaper
policy, prints the results side by side, writes an HTML report, and removes
everything it built. Needs root; no real network is touched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			start := time.Now()
			err := g.runScenario("home", &runFlags{name: "demo", scale: 0.5, out: out, quiet: true})
			fmt.Fprintf(g.stdout, "demo took %.0f s\n", time.Since(start).Seconds())
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "sluice-demo", "directory for the report")
	return cmd
}

// reporter is a run's report: lab run's and lab conformance's.
type reporter interface {
	WriteJSON(io.Writer) error
	WriteHTML(io.Writer) error
}

// writeReports writes report.json and report.html into dir: one the
// caller owns (or makes), each file whole and never through a link.
func writeReports(dir string, r reporter) error {
	if err := safefile.OutDir(dir); err != nil {
		return err
	}
	for name, write := range map[string]func(io.Writer) error{"report.json": r.WriteJSON, "report.html": r.WriteHTML} {
		var b bytes.Buffer
		if err := write(&b); err != nil {
			return err
		}
		if err := safefile.WriteOut(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// outDirErr is a refused --out directory as bad input (exit 2), any
// other failure to make it as a failure.
func outDirErr(err error) error {
	if errors.Is(err, safefile.ErrUnsafe) {
		return badInput(fmt.Errorf("--out: %w", err))
	}
	return failure(err)
}
