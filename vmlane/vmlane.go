// Package vmlane runs sluice inside a virtual machine booted with
// another kernel: Debian's 6.1 or 6.12 (what users' gateways run, every
// qdisc a module) or any vmlinuz. The machinery is the stock-kernel test
// lane's (vmtest.sh, vmtest-guest.sh: qemu through virtme-ng, with the
// host's root filesystem shared read-only), embedded here so that
// `sluice lab run --kernel` needs no checkout.
package vmlane

import (
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

var (
	//go:embed vmtest.sh
	hostScript []byte
	//go:embed vmtest-guest.sh
	guestScript []byte
)

// Run boots kernel (6.1, 6.12, a Debian package version or a vmlinuz
// path) and runs command (a shell command line) in the guest, in
// directory cwd, with the sluice binary bin first on its PATH and rwdir
// writable (the rest of the host's filesystem is read-only there). The
// guest's output goes to out as it comes. It returns the command's exit
// status, or an error when the machine could not run it.
func Run(kernel, command, bin, cwd, rwdir string, out io.Writer) (int, error) {
	dir, err := os.MkdirTemp("", "sluice-vmlane")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	for name, b := range map[string][]byte{"vmtest.sh": hostScript, "vmtest-guest.sh": guestScript} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			return 0, err
		}
	}
	cmd := exec.Command("bash", filepath.Join(dir, "vmtest.sh"), kernel)
	cmd.Env = append(os.Environ(), "VM_RUN_ONLY="+command, "SLUICE_VM_BIN="+bin, "VM_CWD="+cwd, "VM_RWDIR="+rwdir)
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), nil
	}
	return 0, err
}

// NoVM is the exit status of a Run in which no VM ran (vmtest.sh's
// kernel argument named no kernel, or fetching it failed); its output
// says why.
const NoVM = 125

var packageVersion = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+-[0-9]+$`)

// CheckKernel checks a kernel argument before anything is fetched or
// booted: 6.1, 6.12, a Debian package version (6.1.0-56), or the path
// of a kernel image (with a '/': ./vmlinuz). Nothing else reaches apt,
// where a pattern (6.1*) would fetch every kernel it matches.
func CheckKernel(kernel string) error {
	switch {
	case kernel == "6.1" || kernel == "6.12" || packageVersion.MatchString(kernel):
		return nil
	case strings.Contains(kernel, "/"):
		fi, err := os.Stat(kernel)
		if err != nil {
			return fmt.Errorf("kernel %s: %w", kernel, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("kernel %s: not a regular file (a vmlinuz image)", kernel)
		}
		return nil
	}
	return fmt.Errorf("kernel %q: want 6.1, 6.12, a Debian package version like 6.1.0-56, or the path of a vmlinuz (with a '/', as ./vmlinuz)", kernel)
}

// Quote quotes args for the guest's shell.
func Quote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// Describe says what a kernel argument means, for messages.
func Describe(kernel string) string {
	if strings.Contains(kernel, "/") {
		return "the kernel image " + kernel
	}
	return fmt.Sprintf("Debian's %s kernel", kernel)
}
