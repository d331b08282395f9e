// Package e2e tests the sluice binary as users run it: in network
// namespaces, on the real kernel, with real traffic.
package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"sluice/testutil"
)

// bin is the sluice binary under test; faultBin the same built with
// -tags faults, which SLUICE_FAULTS can kill at chosen points.
var bin, faultBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-e2e")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "sluice")
	faultBin = filepath.Join(dir, "sluice-faults")
	// The VM lane (scripts/vmtest.sh) builds both on the host and runs
	// this test binary in a guest that cannot link Go programs.
	if b, fb := os.Getenv("SLUICE_TEST_BIN"), os.Getenv("SLUICE_TEST_FAULT_BIN"); b != "" && fb != "" {
		bin, faultBin = b, fb
	} else {
		for _, b := range [][]string{{"-o", bin}, {"-tags", "faults", "-o", faultBin}} {
			// Static, as make build and make dist build it.
			build := exec.Command("go", append(append([]string{"build"}, b...), "../cmd/sluice")...)
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "building sluice: %v\n%s", err, out)
				os.Exit(1)
			}
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result of one sluice run.
type result struct {
	code           int
	stdout, stderr string
}

// sluice runs the binary with a private state directory.
func sluice(t *testing.T, args ...string) result {
	t.Helper()
	return runSluice(t, bin, []string{"SLUICE_STATE_DIR=" + stateDir(t)}, args...)
}

// runSluice runs binary with env added to the environment.
func runSluice(t *testing.T, binary string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	return runCmd(t, cmd)
}

// runCmd runs cmd and returns its output and exit status; a command that
// cannot start fails the test.
func runCmd(t *testing.T, cmd *exec.Cmd) result {
	t.Helper()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	r := result{stdout: o.String(), stderr: e.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// nobodysCopy makes a directory anyone may enter (as /run is) holding a
// copy of sluice anyone may run, for the tests that run it as nobody.
func nobodysCopy(t *testing.T) (dir, binary string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	exe, _ := os.ReadFile(bin)
	binary = filepath.Join(dir, "sluice")
	os.WriteFile(binary, exe, 0o755)
	return dir, binary
}

// light marks a test that leaves the machine idle while it runs: its
// traffic is a slow link's (10 to 40 Mbit/s), or it has none and only
// applies, kills, classifies and reads back. Measured in a clean-clone
// run (2026-11-28), each took 1 to 25% of the two CPUs. Go runs such
// tests together after the rest of the package, up to -parallel at once
// (make test-host: 3). Tests that stay out run alone: those held to the
// tightest references (testutil.Quiet), those that fill a CPU (a VM,
// a browser, a build, HTTP load, a 1 Gbit/s bed), those that time the
// agent's own work, latency percentiles, and the ones that set the
// process's environment (t.Setenv). Under emulation (the stock-kernel
// lane on TCG) no test leaves the machine idle: there they run alone.
func light(t *testing.T) {
	testutil.RequireRoot(t)
	if os.Getenv("SLUICE_EMULATED") == "1" {
		return
	}
	t.Parallel()
}

// stateDirs holds each top-level test's state directory (tests that
// run in parallel ask at once).
var (
	stateDirsMu sync.Mutex
	stateDirs   = map[string]string{}
)

func stateDir(t *testing.T) string {
	name := strings.Split(t.Name(), "/")[0]
	stateDirsMu.Lock()
	defer stateDirsMu.Unlock()
	if d, ok := stateDirs[name]; ok {
		return d
	}
	d, err := os.MkdirTemp("", "sluice-state")
	if err != nil {
		t.Fatal(err)
	}
	stateDirs[name] = d
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// must runs sluice and fails the test unless it exits 0.
func must(t *testing.T, args ...string) string {
	t.Helper()
	r := sluice(t, args...)
	if r.code != 0 {
		t.Fatalf("sluice %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// writePolicy writes a policy into the test's temp dir.
func writePolicy(t *testing.T, name, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// devNS creates a namespace holding veth pairs named devs (peers named
// dev+"p", in the same namespace).
func devNS(t *testing.T, devs ...string) string {
	t.Helper()
	testutil.RequireRoot(t)
	ns := testutil.NewNetns(t, "e")
	for _, d := range devs {
		testutil.NS(t, ns, "ip", "link", "add", d, "type", "veth", "peer", "name", d+"p")
		testutil.NS(t, ns, "ip", "link", "set", d, "up")
		testutil.NS(t, ns, "ip", "link", "set", d+"p", "up")
	}
	return ns
}

func tcShow(t *testing.T, ns string, args ...string) string {
	t.Helper()
	return testutil.NS(t, ns, "tc", args...)
}
