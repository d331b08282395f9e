package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/testutil"
)

// TestSavedPlan: plan --out saves the plan with the policy as it was
// read; apply FILE makes exactly those changes even after the policy
// file was edited, and refuses (changing nothing) when the kernel has
// moved so that other changes are needed; the file is private, never
// written through a link, and tied to its namespace.
func TestSavedPlan(t *testing.T) {
	p := testutil.NewPair(t)
	body := func(web string) string {
		return policyFor(p.DevA, `    egress:
      rate: 20mbit
      default: bulk
      classes:
        - {name: web, rate: `+web+`}
        - {name: bulk, rate: 5mbit}
`)
	}
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(body("10mbit")), 0o644)
	saved := filepath.Join(dir, "first.plan")
	r := sluice(t, "--netns", p.A, "plan", "--out", saved, pol)
	if r.code != 0 || !strings.Contains(r.stdout, "to add") || !strings.Contains(r.stderr, "saved: "+saved) {
		t.Fatalf("plan --out (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if fi, err := os.Stat(saved); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved plan: %v %v, want a file for its owner alone", fi, err)
	}
	// The file is edited after the plan: the saved policy is what applies.
	os.WriteFile(pol, []byte(body("12mbit")), 0o644)
	r = sluice(t, "--netns", p.A, "apply", saved)
	if r.code != 0 || !strings.Contains(r.stdout, "applied: ") {
		t.Fatalf("apply the saved plan (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := testutil.NS(t, p.A, "tc", "class", "show", "dev", p.DevA); !strings.Contains(out, "rate 10Mbit") || strings.Contains(out, "rate 12Mbit") {
		t.Fatalf("not the planned policy in the kernel:\n%s", out)
	}
	// Applied once, the plan's changes are no longer what is needed.
	r = sluice(t, "--netns", p.A, "apply", saved)
	if r.code != 1 || !strings.Contains(r.stderr, "the kernel moved since this plan was made") || !strings.Contains(r.stderr, "planned, no longer needed as planned: + qdisc") {
		t.Fatalf("the same plan again (code %d): want it refused:\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A plan for the edit, then a class changed behind sluice's back:
	// the kernel now needs a repair the plan did not show.
	second := filepath.Join(dir, "second.plan")
	if r := sluice(t, "--netns", p.A, "plan", "--out", second, pol); r.code != 0 || !strings.Contains(r.stdout, "rate 10mbit -> 12mbit") {
		t.Fatalf("plan --out of the edit (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	before := testutil.NS(t, p.A, "tc", "class", "show", "dev", p.DevA)
	testutil.NS(t, p.A, "tc", "class", "change", "dev", p.DevA, "parent", "1:1", "classid", "1:11", "htb", "rate", "3mbit", "ceil", "20mbit")
	moved := testutil.NS(t, p.A, "tc", "class", "show", "dev", p.DevA)
	r = sluice(t, "--netns", p.A, "apply", second)
	if r.code != 1 || !strings.Contains(r.stderr, "needed now, not in the plan: ~ class") {
		t.Fatalf("a plan the kernel moved from (code %d): want it refused:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if now := testutil.NS(t, p.A, "tc", "class", "show", "dev", p.DevA); now != moved || now == before {
		t.Fatalf("a refused plan changed the kernel:\nbefore:\n%s\nafter:\n%s", moved, now)
	}
	// Elsewhere, through a link, or with apply's own flags: refused.
	if r := sluice(t, "apply", second); r.code != 2 || !strings.Contains(r.stderr, "planned for namespace "+p.A+", applied in the current namespace") {
		t.Fatalf("another namespace (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := sluice(t, "--netns", p.A, "apply", "--full", second); r.code != 2 || !strings.Contains(r.stderr, "is a saved plan") {
		t.Fatalf("--full with a saved plan (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep"), 0o644)
	link := filepath.Join(dir, "link.plan")
	os.Symlink(target, link)
	if r := sluice(t, "--netns", p.A, "plan", "--out", link, pol); r.code != 2 || !strings.Contains(r.stderr, "symbolic link") {
		t.Fatalf("--out through a link (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("the link's target was written: %q", b)
	}
	// A FIFO at the name is refused at once (O_TRUNC on one blocked
	// for a reader); a world-readable file there is replaced by a
	// private one (the plan holds the whole policy).
	fifo := filepath.Join(dir, "fifo.plan")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if r := sluice(t, "--netns", p.A, "plan", "--out", fifo, pol); r.code != 2 || !strings.Contains(r.stderr, "a FIFO") || time.Since(start) > 10*time.Second {
		t.Fatalf("--out onto a FIFO (code %d, %v):\n%s%s", r.code, time.Since(start), r.stdout, r.stderr)
	}
	third := filepath.Join(dir, "third.plan")
	os.WriteFile(third, []byte("an older, world-readable file"), 0o644)
	must(t, "--netns", p.A, "plan", "--out", third, pol)
	if fi, err := os.Stat(third); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("plan --out over a 0644 file: %v %v; want mode 0600", fi.Mode(), err)
	}
	// A plan made now applies.
	if r := sluice(t, "--netns", p.A, "apply", third); r.code != 0 || !strings.Contains(r.stdout, "applied: ") {
		t.Fatalf("a fresh plan (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := testutil.NS(t, p.A, "tc", "class", "show", "dev", p.DevA); !strings.Contains(out, "rate 12Mbit") || !strings.Contains(out, "rate 5Mbit") {
		t.Fatalf("the fresh plan's edit and repair are not in the kernel:\n%s", out)
	}
}
