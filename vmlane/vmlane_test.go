package vmlane

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A kernel argument that names no kernel is refused before anything is
// fetched: `lab run --kernel '6.1*'` once asked apt for 54 packages.
func TestCheckKernel(t *testing.T) {
	img := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(img, []byte("not really"), 0o644)
	for _, c := range []struct {
		arg string
		ok  bool
	}{
		{"6.1", true}, {"6.12", true}, {"6.1.0-56", true}, {"6.12.57-1", true}, {img, true},
		{"6.1*", false}, {".*", false}, {"6", false}, {"6.1.0-56;reboot", false}, {"6.1.0-56 -y", false},
		{"", false}, {"vmlinuz", false}, {"./no-such-image", false}, {filepath.Dir(img) + "/", false},
	} {
		if err := CheckKernel(c.arg); (err == nil) != c.ok {
			t.Errorf("CheckKernel(%q) = %v", c.arg, err)
		}
	}
}

// out/ is where builds and tests write (the lane's guests and logs under
// out/vm among them), and they remove what they wrote while other go
// commands run: make install's out/share vanished under the race build's
// `go test ./...` as it listed packages, and failed that CI run. out/ is
// a module of its own (out/go.mod), so ./... never walks it: a
// directory there, even one holding a file that is not Go, is no
// package of sluice's.
func TestOutIsNotWalked(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	dir, err := os.MkdirTemp(filepath.Join("..", "out"), "walk-probe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte("this is not Go\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, "list", "./...")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list ./... beside a broken directory under out/: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "sluice/out") {
		t.Errorf("go list ./... lists packages under out/:\n%s", out)
	}
}

// ending_summary, which decides whether a guest that left no status is
// booted again, runs to its end under the lane's set -euo pipefail
// whatever is missing: a qemu killed outright logs no SHUTDOWN event,
// and grep's status there ended the lane before its second boot
// (2026-12-06's CI: a soft lockup under emulation, then "Error 1").
func TestEndingSummaryCompletes(t *testing.T) {
	b, err := os.ReadFile("vmtest.sh")
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	start := strings.Index(src, "\nheadline='")
	fn := strings.Index(src, "\nending_summary() {")
	if start < 0 || fn < 0 {
		t.Fatal("vmtest.sh has no headline= or ending_summary()")
	}
	end := strings.Index(src[fn:], "\n}\n")
	if end < 0 {
		t.Fatal("ending_summary() does not end")
	}
	out := t.TempDir()
	for name, body := range map[string]string{
		"console.log": "[ 1357.417869] watchdog: BUG: soft lockup - CPU#0 stuck for 26s! [e2e.test:3772]\n",
		"e2e.log":     "=== RUN   TestDebUnitsStartUnderSystemd\n",
		"kernel.log":  "ok\n", "kernel.rc": "0\n",
		"bpf.log": "nothing ran\n",
	} {
		os.WriteFile(filepath.Join(out, name), []byte(body), 0o644)
	}
	script := "set -euo pipefail\nout=" + out + "\nsay() { echo \"vmtest: $*\" >&2; }\n" +
		src[start:fn+end+3] + "ending_summary\necho \"done slow_only=$slow_only\"\n"
	res, err := exec.Command("bash", "-c", script).CombinedOutput()
	if err != nil || !strings.Contains(string(res), "done slow_only=1") {
		t.Fatalf("ending_summary did not complete: %v\n%s", err, res)
	}
	for _, want := range []string{"no shutdown event", "suite e2e was running; its last test started: TestDebUnitsStartUnderSystemd", "suite bpf was running\n"} {
		if !strings.Contains(string(res), want) {
			t.Errorf("its account lacks %q:\n%s", want, res)
		}
	}
}

// The arm64 smoke lane's scripts parse, and a kernel it does not know is
// refused (exit 2, saying what it wants) before anything is installed or
// fetched.
func TestArm64LaneRefusesBadKernels(t *testing.T) {
	for _, s := range []string{"arm64.sh", "arm64-guest.sh"} {
		if out, err := exec.Command("bash", "-n", s).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", s, err, out)
		}
	}
	for _, arg := range []string{"6.1*", "6.2", "../x", "6.1;reboot"} {
		cmd := exec.Command("bash", "arm64.sh", arg)
		cmd.Env = append(os.Environ(), "SLUICE_VM_CACHE="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), "want 6.1 or 6.12") {
			t.Errorf("arm64.sh %q: exit %d (%v), want 2 saying what it wants:\n%s", arg, code, err, out)
		}
	}
}

// A deadline (CI's, VM_DEADLINE) that is not a time, or that leaves no
// time for the lane, is refused (exit 125, no VM) before anything is
// installed or fetched.
func TestLaneRefusesBadDeadlines(t *testing.T) {
	now := time.Now().Unix()
	for deadline, want := range map[string]string{
		"tomorrow":                    "want seconds since the epoch",
		"1e9":                         "want seconds since the epoch",
		strconv.FormatInt(now+60, 10): "too little to run the lane",
		strconv.FormatInt(now-10, 10): "too little to run the lane",
	} {
		cmd := exec.Command("bash", "vmtest.sh", "6.1")
		cmd.Env = append(os.Environ(), "VM_DEADLINE="+deadline, "VM_CACHE="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(string(out), want) {
			t.Errorf("VM_DEADLINE=%s: exit %d (%v), want 125 saying %q:\n%s", deadline, code, err, want, out)
		}
	}
}
