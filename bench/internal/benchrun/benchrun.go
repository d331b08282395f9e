// Package benchrun holds what the benchmark commands share: running
// tools, failing loudly, and building the sluice binary they time.
package benchrun

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Fail prints err and exits: a benchmark that cannot measure must not
// write results.
func Fail(err error) {
	fmt.Fprintln(os.Stderr, filepath.Base(os.Args[0])+":", err)
	os.Exit(1)
}

// Must runs a command and fails with its output if it fails.
func Must(name string, args ...string) {
	if o, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		Fail(fmt.Errorf("%s %v: %v\n%s", name, args, err, o))
	}
}

// Output runs a command and returns its standard output, empty on error.
func Output(name string, args ...string) string {
	o, _ := exec.Command(name, args...).Output()
	return string(o)
}

// FirstLine is s's first non-blank line, for notes.
func FirstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// Sluice returns bin, or builds ./cmd/sluice into the temporary
// directory as name when bin is empty.
func Sluice(bin, name string) string {
	if bin != "" {
		return bin
	}
	bin = filepath.Join(os.TempDir(), name)
	Must("go", "build", "-o", bin, "./cmd/sluice")
	return bin
}

// HostAddr is subscriber i's address: 10.64.0.0/10, one /32 each.
func HostAddr(i int) string { return fmt.Sprintf("10.%d.%d.%d", 64+i>>16, i>>8&0xff, i&0xff) }

// HostsCSV is a hosts_file of n subscribers at 2mbit (subscriber bump,
// if any, at 3mbit), each with a 20mbit ceil.
func HostsCSV(n int, bump int) string { return hostsCSV(n, bump, false) }

// HostsCSVCap is HostsCSV with subscriber bump's ceil changed (20 to
// 30mbit) instead of its rate: what an EDT aggregate's cap is.
func HostsCSVCap(n int, bump int) string { return hostsCSV(n, bump, true) }

func hostsCSV(n int, bump int, ceil bool) string {
	var b strings.Builder
	b.WriteString("name,addresses,rate,ceil\n")
	for i := 0; i < n; i++ {
		rate, cap := 2, 20
		if i == bump && ceil {
			cap = 30
		} else if i == bump {
			rate = 3
		}
		fmt.Fprintf(&b, "s%d,%s,%dmbit,%dmbit\n", i, HostAddr(i), rate, cap)
	}
	return b.String()
}
