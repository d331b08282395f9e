// Package cli is sluice's command line: thin cobra commands over the
// policy, plan, kernel and stats packages.
package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/spf13/cobra"

	"sluice/engine"
	"sluice/kernel"
	"sluice/policy"
	"sluice/records"
)

// Exit codes (contract): 0 success, 1 failure while acting, 2 bad input;
// plan --detailed-exitcode: 3 when there are changes to make (terraform
// uses 2, which sluice gives bad input in every command).
const (
	ExitFailure  = 1
	ExitBadInput = 2
	ExitChanges  = 3
)

// quietExit is an exit code that is not a failure: nothing to print.
type quietExit int

func (q quietExit) Error() string { return fmt.Sprintf("exit %d", int(q)) }

// exitError carries an exit code to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func badInput(err error) error { return &exitError{ExitBadInput, err} }
func failure(err error) error  { return &exitError{ExitFailure, err} }

// globals shared by the commands.
type globals struct {
	netns       string
	lockTimeout time.Duration
	stdout      io.Writer
	stderr      io.Writer
}

// New builds the command tree.
func New() *cobra.Command { return newRoot(os.Stdout, os.Stderr) }

// newRoot builds the command tree writing to stdout and stderr.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "sluice",
		Short: "Declarative traffic shaping for Linux",
		Long: `sluice shapes a network link from a declarative policy: HTB class trees
with rates, ceilings and priorities, rules that sort packets into classes,
per-host fair shares, in both directions. It applies the policy through
netlink with the fewest changes, rolls back on failure, and shows what
every class is doing.`,
		Example: `  sluice validate office.yaml                   # every problem, as FILE:LINE:COL: message
  sudo sluice plan office.yaml                  # what apply would change, and why
  sudo sluice apply office.yaml                 # apply it: only the difference, rolled back on failure
  sudo sluice show                              # each class's rate, drops and backlog, live
  sluice export office.yaml --format sh > tc.sh # the same as a plain tc script
  sudo sluice reset --all                       # remove what sluice made, nothing else
  sudo sluice import tc wan0 > policy.yaml      # a hand-written tc tree, as a policy
  sudo sluice lab run fair-share                # measure a policy in network namespaces
  sudo sluice agent policy.yaml                 # keep it applied; metrics and a dashboard`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := checkNamespaceFlags(cmd); err != nil {
				return err
			}
			return checkPrivileges(cmd)
		},
	}
	root.PersistentFlags().StringVar(&g.netns, "netns", "", "run inside the named network namespace (as `ip netns exec NAME`): plan, apply, show, reset, export, agent, munin")
	root.PersistentFlags().DurationVar(&g.lockTimeout, "lock-timeout", 30*time.Second, "how long to wait for another sluice changing the same namespace: plan, apply, reset, agent")
	root.SetOut(g.stdout)
	root.SetErr(g.stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return badInput(fmt.Errorf("%w\nSee '%s --help'.", err, c.CommandPath()))
	})
	root.AddCommand(
		validateCmd(g),
		inNamespace(planCmd(g)),
		inNamespace(needing(applyCmd(g), "changes the kernel's traffic control")),
		inNamespace(showCmd(g)),
		inNamespace(needing(resetCmd(g), "changes the kernel's traffic control")),
		inNamespace(exportCmd(g)),
		doctorCmd(g),
		labCmd(g),
		inNamespace(importCmd(g)),
		needing(demoCmd(g), "builds a test bed of network namespaces"),
		inNamespace(needing(agentCmd(g), "keeps the kernel's traffic control in force")),
		inNamespace(muninCmd(g)),
		versionCmd(g),
	)
	return root
}

// Main runs sluice with args and returns the process exit code.
func Main(args []string) int { return run(args, os.Stdout, os.Stderr) }

func run(args []string, stdout, stderr io.Writer) int {
	cmd := newRoot(stdout, stderr)
	cmd.SetArgs(args)
	err := cmd.Execute()
	if err == nil {
		return 0
	}
	var q quietExit
	if errors.As(err, &q) {
		return int(q)
	}
	fmt.Fprintln(stderr, "sluice:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	// Cobra's own argument errors (wrong count, unknown command).
	return ExitBadInput
}

// engineOptions gathers the global flags for the engine, refusing a
// --netns given empty (which would otherwise mean the caller's own).
func (g *globals) engineOptions(cmd *cobra.Command) (engine.Options, error) {
	if f := cmd.Flags().Lookup("netns"); f != nil && f.Changed {
		if err := records.ValidNetnsName(g.netns); err != nil {
			return engine.Options{}, badInput(fmt.Errorf("--netns: %w", err))
		}
	}
	return engine.Options{Netns: g.netns, LockTimeout: g.lockTimeout,
		Warn: func(s string) { fmt.Fprintln(g.stderr, s) }}, nil
}

// classify gives an engine error its exit code: bad input 2, the rest 1.
func classify(err error) error {
	var ie *engine.InputError
	if errors.As(err, &ie) {
		return badInput(err)
	}
	var re *records.Error
	if errors.Is(err, fs.ErrPermission) && !errors.As(err, &re) && !privileged() {
		// What a reader without root meets: tc reads, BPF objects not.
		return failure(fmt.Errorf("%w (without root this user reads the kernel's traffic control and sluice's records, not its BPF program: plan a tree with classifier: bpf or backend: edt as root, or with CAP_BPF)", err))
	}
	return failure(err)
}

// loadPolicy reads a policy, printing warnings; errors are bad input.
func (g *globals) loadPolicy(file string) (*policy.Policy, error) {
	p, err := engine.Load(file, engine.Options{Warn: func(s string) { fmt.Fprintln(g.stderr, s) }})
	if err != nil {
		return nil, classify(err)
	}
	return p, nil
}

// openKernel connects to the target namespace, to read it.
func (g *globals) openKernel(cmd *cobra.Command) (*kernel.Reader, error) {
	o, err := g.engineOptions(cmd)
	if err != nil {
		return nil, err
	}
	k, err := engine.Open(o)
	if err != nil {
		return nil, classify(err)
	}
	return k.Reader(), nil
}
