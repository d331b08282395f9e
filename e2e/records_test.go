package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/testutil"
)

// A foreign tree put where sluice's was, with the same handle, is not
// sluice's: neither the fast path nor --full takes it over; --force does.
func TestReplacedRootIsForeign(t *testing.T) {
	ns := multiQueueNS(t)
	inc := writePolicy(t, "p.yaml", `interfaces:
  - name: eth0
    egress:
      rate: 100mbit
      default: rest
      classes:
        - name: web
          rate: 20mbit
          match: [{dport: 80}]
        - name: rest
          rate: 10mbit
`)
	must(t, "--netns", ns, "apply", "-q", inc)
	testutil.NS(t, ns, "tc", "qdisc", "del", "dev", "eth0", "root")
	testutil.NS(t, ns, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
	testutil.NS(t, ns, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate", "5mbit")
	theirs := kernelState(t, ns)
	for _, args := range [][]string{{"apply", inc}, {"apply", "--full", inc}, {"plan", inc}} {
		r := sluice(t, append([]string{"--netns", ns}, args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "has a root qdisc htb 1: that sluice did not create") {
			t.Fatalf("%v over a foreign root: exit %d, want 1 and why\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	sameState(t, "the foreign tree", theirs, kernelState(t, ns))
	if r := sluice(t, "--netns", ns, "show"); strings.Contains(r.stdout, "web") {
		t.Errorf("show lists the foreign tree as sluice's:\n%s", r.stdout)
	}
	must(t, "--netns", ns, "apply", "-q", "--force", inc)
	if out := must(t, "--netns", ns, "plan", inc); strings.TrimSpace(out) != "no changes" {
		t.Fatalf("after --force: %s", out)
	}
}

// A shard deleted with its classes is seen by the next plain apply.
func TestMissingShardIsRepaired(t *testing.T) {
	ns := multiQueueNS(t)
	pol := writePolicy(t, "p.yaml", `interfaces:
  - name: eth0
    egress:
      rate: 100mbit
      classifier: bpf
      default: rest
      classes:
        - name: subs
          rate: 80mbit
          per_host: {by: dst, cidr: 10.6.0.0/24, rate: 100kbit, ceil: 50mbit}
        - name: rest
          rate: 10mbit
`)
	must(t, "--netns", ns, "apply", "-q", pol)
	want := kernelState(t, ns)
	testutil.NS(t, ns, "tc", "qdisc", "del", "dev", "eth0", "parent", "1:2")
	r := sluice(t, "--netns", ns, "apply", "--timings", pol)
	if r.code != 0 || strings.Contains(r.stdout, "no changes") || strings.Contains(r.stderr, "read touched") {
		t.Fatalf("apply after a shard was deleted: exit %d, want a full read and a repair\n%.2000s%s", r.code, r.stdout, r.stderr)
	}
	sameState(t, "repaired", want, kernelState(t, ns))
}

// Records of a namespace deleted and made again under the same name,
// or of a device deleted and made again, describe nothing there now:
// show, reset and apply ignore them and leave the hand-made trees alone.
func TestRecordsOfAnotherNamespaceOrDevice(t *testing.T) {
	light(t)
	name := testutil.Unique("r")
	mk := func() {
		testutil.Run(t, "ip", "netns", "add", name)
		testutil.NS(t, name, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
		testutil.NS(t, name, "ip", "link", "set", "eth0", "up")
	}
	mk()
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	pol := writePolicy(t, "p.yaml", "interfaces:\n  - name: eth0\n    egress: {rate: 10mbit}\n")
	must(t, "--netns", name, "apply", "-q", pol)
	handMade := func() string {
		testutil.NS(t, name, "tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
		testutil.NS(t, name, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "3mbit")
		return kernelState(t, name)
	}
	check := func(what string) {
		t.Helper()
		theirs := handMade()
		r := sluice(t, "--netns", name, "show")
		if r.code != 0 || strings.Contains(r.stdout, "eth0 egress") || !strings.Contains(r.stderr, "ignored") {
			t.Fatalf("%s: show: exit %d, want no tree and a note\n%s%s", what, r.code, r.stdout, r.stderr)
		}
		if r := sluice(t, "--netns", name, "reset", "--all"); r.code != 0 || !strings.Contains(r.stdout, "nothing to reset") {
			t.Fatalf("%s: reset: exit %d\n%s%s", what, r.code, r.stdout, r.stderr)
		}
		if r := sluice(t, "--netns", name, "apply", pol); r.code != 1 || !strings.Contains(r.stderr, "did not create") {
			t.Fatalf("%s: apply: exit %d, want the hand-made root refused\n%s%s", what, r.code, r.stdout, r.stderr)
		}
		sameState(t, what, theirs, kernelState(t, name))
	}
	testutil.Run(t, "ip", "netns", "del", name)
	mk()
	check("namespace made again")

	must(t, "--netns", name, "apply", "-q", "--force", pol)
	testutil.NS(t, name, "ip", "link", "del", "eth0")
	testutil.NS(t, name, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	check("device made again")
}

// Planted links and loose permissions in the records directory are
// refused, and nothing they point to is touched.
func TestRecordsDirectoryRefusesPlantedFiles(t *testing.T) {
	ns := devNS(t, "eth0")
	pol := writePolicy(t, "p.yaml", "interfaces:\n  - name: eth0\n    egress: {rate: 10mbit}\n")
	base := t.TempDir()
	os.Chmod(base, 0o755)
	const baseMode = 0o755
	env := []string{"SLUICE_STATE_DIR=" + base}
	dir := filepath.Join(base, "netns", ns)
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("precious\n"), 0o644)
	intact := func(what string) {
		t.Helper()
		if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
			t.Fatalf("%s: the link's target was written: %q", what, b)
		}
	}
	for _, planted := range []string{"lock", "state.json"} {
		os.RemoveAll(dir)
		os.MkdirAll(dir, 0o700)
		os.Symlink(victim, filepath.Join(dir, planted))
		before := kernelState(t, ns)
		r := runSluice(t, bin, env, "--netns", ns, "apply", "-q", pol)
		if r.code != 1 || !strings.Contains(r.stderr, "symbolic link") {
			t.Fatalf("%s planted as a link: exit %d, want 1 and why\n%s%s", planted, r.code, r.stdout, r.stderr)
		}
		intact(planted)
		sameState(t, planted+" planted", before, kernelState(t, ns))
	}
	// The directory itself as a link, and one others can write to.
	os.RemoveAll(dir)
	os.Symlink(t.TempDir(), dir)
	if r := runSluice(t, bin, env, "--netns", ns, "apply", "-q", pol); r.code != 1 || !strings.Contains(r.stderr, "not a directory") {
		t.Fatalf("records directory as a link: exit %d\n%s", r.code, r.stderr)
	}
	os.Remove(dir)
	os.MkdirAll(dir, 0o700)
	os.Chmod(dir, 0o777)
	if r := runSluice(t, bin, env, "--netns", ns, "apply", "-q", pol); r.code != 1 || !strings.Contains(r.stderr, "writable by other users") {
		t.Fatalf("world-writable records directory: exit %d\n%s", r.code, r.stderr)
	}
	// Made by sluice under umask 000: private all the same.
	os.RemoveAll(dir)
	old := syscall.Umask(0)
	r := runSluice(t, bin, env, "--netns", ns, "apply", "-q", pol)
	syscall.Umask(old)
	if r.code != 0 {
		t.Fatalf("apply: exit %d\n%s", r.code, r.stderr)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) == 0 {
		t.Fatal("no records written")
	}
	for _, e := range entries {
		fi, _ := e.Info()
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is mode %v: records must be private", e.Name(), fi.Mode().Perm())
		}
	}
	for _, d := range []string{filepath.Join(base, "netns"), dir} {
		if fi, _ := os.Stat(d); fi.Mode().Perm() != 0o700 {
			t.Errorf("%s is mode %v, want 0700", d, fi.Mode().Perm())
		}
	}
	// The state directory the user gave is theirs: its mode stays
	// (issue 58: a shared SLUICE_STATE_DIR, or /var/lib under a
	// hosts_file, was made 0700).
	if fi, _ := os.Stat(base); fi.Mode().Perm() != baseMode {
		t.Errorf("SLUICE_STATE_DIR %s changed to mode %v from %v", base, fi.Mode().Perm(), baseMode)
	}
	// Corrupt records: a failure (exit 1) that says how to start over,
	// not bad input; a bulk file changed behind sluice's back is caught.
	bins, _ := filepath.Glob(filepath.Join(dir, "state.*.bin"))
	if len(bins) != 1 {
		t.Fatalf("want one bulk file, have %v", bins)
	}
	b, _ := os.ReadFile(bins[0])
	b[len(b)/2] ^= 0xff
	os.WriteFile(bins[0], b, 0o600)
	if r := runSluice(t, bin, env, "--netns", ns, "apply", pol); r.code != 1 || !strings.Contains(r.stderr, "checksum") {
		t.Fatalf("corrupt bulk: exit %d\n%s", r.code, r.stderr)
	}
	st := filepath.Join(dir, "state.json")
	os.WriteFile(st, []byte(`{"version": 99, "devices": {}}`), 0o600)
	if r := runSluice(t, bin, env, "--netns", ns, "show"); r.code != 1 || !strings.Contains(r.stderr, "version 99") {
		t.Fatalf("records of an unknown version: exit %d\n%s", r.code, r.stderr)
	}
	os.WriteFile(st, []byte(`{"version": 2, "devi`), 0o600)
	if r := runSluice(t, bin, env, "--netns", ns, "show"); r.code != 1 || !strings.Contains(r.stderr, "remove") {
		t.Fatalf("truncated records: exit %d\n%s", r.code, r.stderr)
	}
}

// --netns takes names as ip netns does; policies and hosts files must
// be regular files of bounded size.
func TestHostileInputsRefused(t *testing.T) {
	testutil.RequireRoot(t)
	pol := writePolicy(t, "p.yaml", "interfaces:\n  - name: eth0\n    egress: {rate: 10mbit}\n")
	for _, ns := range []string{"", "../../proc/1/ns/net", ".", "..", "a/b"} {
		r := sluice(t, "--netns", ns, "apply", pol)
		if r.code != 2 || !strings.Contains(r.stderr, "--netns") {
			t.Errorf("--netns %q: exit %d, want 2\n%s", ns, r.code, r.stderr)
		}
	}
	fifo := filepath.Join(t.TempDir(), "fifo")
	syscall.Mkfifo(fifo, 0o600)
	for _, f := range []string{"/dev/zero", fifo, t.TempDir()} {
		start := time.Now()
		r := sluice(t, "validate", f)
		if r.code != 2 || !strings.Contains(r.stderr, "not a regular file") || time.Since(start) > 5*time.Second {
			t.Errorf("policy %s: exit %d after %v, want 2 at once\n%s", f, r.code, time.Since(start), r.stderr)
		}
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	os.WriteFile(big, make([]byte, 17<<20), 0o600)
	if r := sluice(t, "validate", big); r.code != 2 || !strings.Contains(r.stderr, "at most") {
		t.Errorf("a 17 MB policy: exit %d\n%s", r.code, r.stderr)
	}
	for _, hf := range []string{"/dev/zero", fifo} {
		p := writePolicy(t, "h.yaml", `interfaces:
  - name: eth0
    egress:
      rate: 10mbit
      default: subs
      classes:
        - name: subs
          rate: 5mbit
          per_host: {hosts_file: `+hf+`}
`)
		start := time.Now()
		r := sluice(t, "validate", p)
		if r.code != 2 || !strings.Contains(r.stderr, "h.yaml:9:34:") || !strings.Contains(r.stderr, "not a regular file") || time.Since(start) > 5*time.Second {
			t.Errorf("hosts_file %s: exit %d after %v\n%s", hf, r.code, time.Since(start), r.stderr)
		}
	}
}

// A process `ip netns exec B` put in named namespace B keeps B's records,
// as `--netns B` does, not the root namespace's (issue 58: it wrote over
// the records of the namespace an agent kept, and the agent failed every
// pass after).
func TestRecordsFollowTheNamespaceEntered(t *testing.T) {
	light(t)
	ns := devNS(t, "eth0")
	pol := writePolicy(t, "p.yaml", "interfaces:\n  - name: eth0\n    egress: {rate: 10mbit}\n")
	base := stateDir(t)
	// Where the root namespace's records are (an agent keeping it).
	rootFile := filepath.Join(base, "state.json")
	cmd := exec.Command("ip", "netns", "exec", ns, bin, "apply", "-q", pol)
	cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+base)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip netns exec %s sluice apply: %v\n%s", ns, err, out)
	}
	if _, err := os.Stat(rootFile); err == nil {
		t.Errorf("the apply inside %s wrote the root namespace's records (%s)", ns, rootFile)
	}
	if r := sluice(t, "--netns", ns, "plan", pol); r.code != 0 || r.stdout != "no changes\n" {
		t.Errorf("--netns %s does not find the records the apply inside it wrote: exit %d\n%s%s", ns, r.code, r.stdout, r.stderr)
	}
	cmd = exec.Command("ip", "netns", "exec", ns, bin, "reset", "--all")
	cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+base)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "eth0") {
		t.Errorf("reset inside %s: %v\n%s", ns, err, out)
	}
	if q := tcShow(t, ns, "qdisc", "show", "dev", "eth0"); strings.Contains(q, "htb") {
		t.Errorf("reset inside the namespace left the tree:\n%s", q)
	}
}
