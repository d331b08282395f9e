package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	testutil.Slow(t)
	light(t)
	// Without traffic the first step splits the link as if every class
	// wanted its ceil (each its 100kbit rate and 19.8 Mbit/s by 1:3,
	// 5.05 and 14.95 Mbit/s, as rates): two class writes.
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
			if strings.Contains(s, "rate 5050Kbit") && strings.Contains(s, "rate 14950Kbit") {
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
		cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+stateDir(t), "SLUICE_FAULTS=kill-at-patch-write="+strconv.Itoa(n))
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

// A hosts_file edit the agent writes in place (a patch of the EDT
// program's host entries), killed at any of its writes, is completed by
// the next agent start and by the next plain apply: `plan` then finds
// the kernel as the edited file says.
func TestEDTHostsPatchKilledAtEveryWrite(t *testing.T) {
	needFq(t)
	a, _ := shardedPair(t, 2, 0)
	pol := writePolicy(t, "p.yaml", policyFor("veth0", `    egress:
      backend: edt
      rate: 200mbit
      default: rest
      classes:
        - {name: subs, rate: 100mbit, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 50mbit}
`))
	hosts := filepath.Join(filepath.Dir(pol), "hosts.csv")
	csv := func(ceil string) string {
		var b strings.Builder
		b.WriteString("name,addresses,rate,ceil\n")
		for i := range 4 {
			c := "10mbit"
			if i < 3 {
				c = ceil // three entries change: three writes
			}
			fmt.Fprintf(&b, "s%d,10.20.0.%d,1mbit,%s\n", i, i+1, c)
		}
		return b.String()
	}
	inPlan := func(what string) {
		t.Helper()
		if out := must(t, "--netns", a, "plan", pol); !strings.Contains(out, "no changes") {
			t.Errorf("%s: plan finds the kernel is not as the file says:\n%s", what, out)
		}
	}
	// killedPatch runs the fault agent, edits the file, and waits for it
	// to die at write n of the patch; false if it wrote it all.
	killedPatch := func(n int, from, to string) bool {
		t.Helper()
		replaceFile(t, hosts, csv(from))
		must(t, "--netns", a, "apply", pol)
		ag := startAgentWith(t, faultBin, []string{"SLUICE_FAULTS=kill-at-patch-write=" + strconv.Itoa(n)}, a, pol, "--interval", "10s")
		replaceFile(t, hosts, csv(to))
		select {
		case <-ag.done:
		case <-time.After(5 * time.Second):
			if !strings.Contains(ag.Log(), "hosts edited in place") {
				t.Fatalf("the edit was not taken in place:\n%s", ag.Log())
			}
			ag.stop(syscall.SIGKILL)
			return false
		}
		if ws, ok := ag.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("write %d: the agent ended with %v, not killed\n%s", n, ag.cmd.ProcessState, ag.Log())
		}
		if out := must(t, "--netns", a, "plan", pol); strings.Contains(out, "no changes") {
			t.Errorf("write %d: killed, yet the kernel already holds the whole edit: not killed mid-patch", n)
		}
		return true
	}
	for n := 1; ; n++ {
		if n > 8 {
			t.Fatal("the patch still writes after 8 writes")
		}
		if !killedPatch(n, "10mbit", "12mbit") {
			if n < 4 {
				t.Fatalf("the patch made %d write(s); the edit changes three entries", n-1)
			}
			return
		}
		b := startAgent(t, a, pol, "--interval", "10s")
		inPlan(fmt.Sprintf("killed at write %d, then the agent started", n))
		b.stop(syscall.SIGTERM)
		if !killedPatch(n, "10mbit", "12mbit") {
			t.Fatalf("write %d: not killed the second time", n)
		}
		must(t, "--netns", a, "apply", pol)
		inPlan(fmt.Sprintf("killed at write %d, then apply", n))
	}
}
