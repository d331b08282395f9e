package e2e

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/testutil"
)

// kernelRate is the rate of the root HTB class 1:1 on veth0 in ns, as
// tc says it ("20Mbit").
func kernelRate(t *testing.T, ns string) string {
	t.Helper()
	m := regexp.MustCompile(`class htb 1:1 root .*?rate (\S+)`).FindStringSubmatch(tcShow(t, ns, "class", "show", "dev", "veth0"))
	if m == nil {
		return ""
	}
	return m[1]
}

// Beside a running agent, an apply of another policy would be undone at
// the agent's next pass (issue 57: "applied: 2 change(s)", rc 0, and the
// agent "repaired drift" back a second later). apply refuses, naming the
// agent's policy and what to do; plan says the agent undoes the
// difference; --force applies anyway; the agent's own file applies as
// usual; with the agent gone, apply works again.
func TestApplyBesideAnAgentIsRefused(t *testing.T) {
	p := testutil.NewPair(t)
	body := func(rate string) string {
		return policyFor(p.DevA, "    egress:\n      rate: "+rate+"\n      default: bulk\n      classes:\n        - {name: bulk, rate: 5mbit}\n")
	}
	kept := writePolicy(t, "kept.yaml", body("20mbit"))
	other := writePolicy(t, "other.yaml", body("10mbit"))
	a := startAgent(t, p.A, kept, "--interval", "30s")

	r := sluice(t, "--netns", p.A, "apply", other)
	if r.code != 2 || !strings.Contains(r.stderr, "keeps this network namespace with "+kept) ||
		!strings.Contains(r.stderr, "--force") || strings.Contains(r.stdout, "applied") {
		t.Fatalf("apply beside the agent: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if s := kernelRate(t, p.A); s != "20Mbit" {
		t.Errorf("a refused apply changed the kernel: root rate %s", s)
	}
	r = sluice(t, "--netns", p.A, "plan", other)
	if r.code != 0 || !strings.Contains(r.stdout, "rate 20mbit -> 10mbit") || !strings.Contains(r.stderr, "puts that policy back at its next pass") {
		t.Errorf("plan beside the agent: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := sluice(t, "--netns", p.A, "plan", kept); r.code != 0 || strings.Contains(r.stderr, "puts that policy back") {
		t.Errorf("plan of the agent's own policy: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := must(t, "--netns", p.A, "apply", kept); !strings.Contains(out, "no changes") {
		t.Errorf("apply of the agent's own policy:\n%s", out)
	}
	if out := must(t, "--netns", p.A, "apply", "--force", other); !strings.Contains(out, "applied") {
		t.Errorf("apply --force beside the agent:\n%s", out)
	}
	if s := kernelRate(t, p.A); s != "10Mbit" {
		t.Errorf("apply --force: root rate %s", s)
	}
	a.stop(syscall.SIGTERM)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := sluice(t, "--netns", p.A, "apply", "-q", kept)
		if r.code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("apply after the agent stopped: exit %d\n%s", r.code, r.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
