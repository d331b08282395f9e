package e2e

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/testutil"
)

// A controller step killed at any of its writes is completed or undone
// by what comes next, as after an undisturbed step: the next agent
// start leaves the kernel as an undisturbed agent's first step does,
// and a plain apply after it puts the policy back.
func TestControllerStepKilledAtEveryWrite(t *testing.T) {
	// Without traffic the first step splits the link as if every class
	// wanted its ceil (5 and 15 Mbit/s as rates): two class writes.
	src := func(dev string) string {
		return policyFor(dev, `    egress:
      rate: 20mbit
      default: b
      sharing: {mode: controller, quantum: 300ms}
      classes:
        - {name: a, rate: 100kbit, weight: 1, match: [{proto: udp, dport: 9001}]}
        - {name: b, rate: 100kbit, weight: 3}
`)
	}
	// stepped waits until the agent's first step is in the kernel.
	stepped := func(t *testing.T, ns string) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			s := kernelState(t, ns)
			if strings.Contains(s, "rate 5Mbit") && strings.Contains(s, "rate 15Mbit") {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("the agent's first step is not in the kernel after 10 s:\n%s", s)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The undisturbed run: the first step, then a plain apply once the
	// agent is gone.
	ref := testutil.NewPair(t)
	refPol := writePolicy(t, "ref.yaml", src(ref.DevA))
	a := startAgent(t, ref.A, refPol, "--interval", "300ms")
	wantStep := stepped(t, ref.A)
	a.stop(syscall.SIGKILL)
	must(t, "--netns", ref.A, "apply", refPol)
	wantApplied := kernelState(t, ref.A)
	if wantApplied == wantStep || !strings.Contains(wantApplied, "rate 100Kbit ceil 20Mbit") {
		t.Fatalf("the reference apply did not put the policy back:\n%s", wantApplied)
	}

	for n := 1; ; n++ {
		if n > 6 {
			t.Fatal("the step still writes after 6 writes")
		}
		p := testutil.NewPair(t)
		pol := writePolicy(t, "p.yaml", src(p.DevA))
		// The fault binary applies the tree in its first pass, then
		// dies at the n-th write of a limits change.
		cmd := exec.Command(faultBin, "--netns", p.A, "agent", pol, "--interval", "300ms")
		cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+stateDir(t), "SLUICE_FAULTS=kill-at-limits-write="+strconv.Itoa(n))
		var log strings.Builder
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("write %d: the agent ended with %v, not killed\n%s", n, err, log.String())
			}
		case <-time.After(4 * time.Second):
			cmd.Process.Kill()
			<-done
			if n < 3 {
				t.Fatalf("the step made only %d write(s); the test expects two classes written", n-1)
			}
			return // past the step's last write: every one was tried
		}
		if s := kernelState(t, p.A); s == wantStep {
			t.Errorf("write %d: the kill left the whole step in place: not killed mid-step", n)
		}
		b := startAgent(t, p.A, pol, "--interval", "300ms")
		if got := stepped(t, p.A); got != wantStep {
			t.Errorf("killed at write %d of a step, then an agent's first step:\n%s\nwant, as undisturbed:\n%s", n, got, wantStep)
		}
		b.stop(syscall.SIGKILL)
		must(t, "--netns", p.A, "apply", pol)
		if got := kernelState(t, p.A); got != wantApplied {
			t.Errorf("killed at write %d of a step, then apply:\n%s\nwant, as undisturbed:\n%s", n, got, wantApplied)
		}
	}
}
