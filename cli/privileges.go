package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// needs is the annotation of a command that reads or changes the
// kernel's traffic control or sluice's records: what it does there, for
// the message that says it needs privileges.
const needs = "sluice/needs"

// capNetAdmin is CAP_NET_ADMIN's bit in the capability sets.
const capNetAdmin = 12

// privileged reports whether this process may change the kernel's
// network configuration: root, or CAP_NET_ADMIN in its effective set.
func privileged() bool {
	if os.Geteuid() == 0 {
		return true
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<capNetAdmin) != 0
		}
	}
	return false
}

// checkPrivileges refuses, before anything runs, a command that needs
// privileges in a process without them, saying which and what works
// without (a permission error deep inside once came with the advice to
// remove sluice's records).
func checkPrivileges(cmd *cobra.Command) error {
	what := cmd.Annotations[needs]
	if what == "" || privileged() {
		return nil
	}
	return failure(fmt.Errorf("%s needs root (or CAP_NET_ADMIN): it %s. Without: `sluice validate FILE` checks a policy, `sluice export FILE` prints its tc script, `sluice lab list` lists the scenarios", cmd.CommandPath(), what))
}

// inNS is the annotation of a command that acts in a network namespace
// (--netns) and may wait for another sluice there (--lock-timeout).
const inNS = "sluice/netns"

// inNamespace marks cmd as acting in the namespace --netns names.
func inNamespace(cmd *cobra.Command) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[inNS] = "yes"
	return cmd
}

// checkNamespaceFlags refuses --netns and --lock-timeout on a command
// where they mean nothing (validate reads a file; lab and demo build
// their own namespaces): given there, a user expects an effect that
// would silently not happen.
func checkNamespaceFlags(cmd *cobra.Command) error {
	for c := cmd; c != nil; c = c.Parent() {
		if c.Annotations[inNS] != "" {
			return nil
		}
	}
	for _, name := range []string{"netns", "lock-timeout"} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return badInput(fmt.Errorf("--%s means nothing for `%s`: it is for plan, apply, show, reset, export, agent and munin", name, cmd.CommandPath()))
		}
	}
	return nil
}

// needing marks cmd as needing privileges for what it does.
func needing(cmd *cobra.Command, what string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[needs] = what
	return cmd
}
