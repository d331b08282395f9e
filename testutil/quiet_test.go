package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Quiet stops the chain's whole process group while a test (or several)
// measures and continues it when the last ends; a pid file naming
// another process (a reused pid) stops nothing.
func TestQuietStopsTheChainWhileTestsMeasure(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "beside.sh")
	os.WriteFile(script, []byte("sleep 60 &\nwait\n"), 0o755)
	chain := exec.Command("bash", script, "run")
	chain.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := chain.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-chain.Process.Pid, syscall.SIGKILL)
		syscall.Kill(-chain.Process.Pid, syscall.SIGCONT)
		chain.Wait()
	})
	var child int
	for deadline := time.Now().Add(5 * time.Second); child == 0; {
		out, _ := exec.Command("pgrep", "-g", strconv.Itoa(chain.Process.Pid), "sleep").Output()
		child, _ = strconv.Atoi(strings.TrimSpace(string(out)))
		if child == 0 && time.Now().After(deadline) {
			t.Fatal("the chain's child did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	pidFile := filepath.Join(dir, "pid")
	os.WriteFile(pidFile, []byte(strconv.Itoa(chain.Process.Pid)+"\n"), 0o644)
	t.Setenv(BesideEnv, pidFile)

	t.Run("two tests measure", func(t *testing.T) {
		t.Run("first", func(t *testing.T) {
			Quiet(t)
			t.Run("second", func(t *testing.T) {
				Quiet(t)
				if !isStopped(t, chain.Process.Pid, true) || !isStopped(t, child, true) {
					t.Fatal("the chain runs while tests measure")
				}
			})
			if !isStopped(t, child, true) {
				t.Fatal("the chain went on while the first test still measured")
			}
		})
	})
	if isStopped(t, chain.Process.Pid, false) || isStopped(t, child, false) {
		t.Fatal("the chain is still stopped after the tests")
	}

	// A pid file that names another process: nothing is stopped.
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		other.Process.Kill()
		other.Wait()
	}()
	os.WriteFile(pidFile, []byte(strconv.Itoa(other.Process.Pid)), 0o644)
	t.Run("stale pid", func(t *testing.T) {
		Quiet(t)
		if isStopped(t, other.Process.Pid, true) {
			t.Fatal("a process that is not the chain was stopped")
		}
	})
}

// isStopped reports whether process pid is stopped (state T), waiting up
// to a second for it to become what want says: signals are delivered
// asynchronously.
func isStopped(t *testing.T, pid int, want bool) bool {
	t.Helper()
	var is bool
	for range 100 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		is = strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0] == "T"
		if is == want {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return is
}
