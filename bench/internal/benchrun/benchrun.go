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
