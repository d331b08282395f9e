package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/testutil"
)

// The migration of issue 57: a hand-built tree (HTB on veth0, an ingress
// qdisc whose u32 filter at prio 10 redirects everything to ifb0, HTB
// there), imported with `import tc` and applied with --force. sluice's
// redirect sits at a late prio, so the old one would keep taking the
// traffic: the import says apply --force removes it, plan says so
// line by line, apply removes it, and sluice's ifb then counts every
// packet (ifb0 none). A foreign redirect added later is warned of by
// plan and apply without --force, and left alone.
func TestMigrationTakesOverTheIngress(t *testing.T) {
	testutil.Slow(t)
	p := testutil.NewPair(t)
	ns, dev := p.A, p.DevA
	for _, c := range [][]string{
		{"tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20"},
		{"tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", "10mbit"},
		{"tc", "class", "add", "dev", dev, "parent", "1:1", "classid", "1:10", "htb", "rate", "5mbit", "ceil", "10mbit", "prio", "0"},
		{"tc", "class", "add", "dev", dev, "parent", "1:1", "classid", "1:20", "htb", "rate", "5mbit", "ceil", "10mbit", "prio", "1"},
		{"tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip", "protocol", "1", "0xff", "flowid", "1:10"},
		{"ip", "link", "add", "ifb0", "type", "ifb"},
		// No IPv6 of its own: the router solicitations and MLD reports
		// an interface sends when it comes up pass its root qdisc too,
		// and one counted after the takeover, under emulation (the 6.1
		// lane, 2026-12-06: "ifb0 counted 1 packets"), where only
		// redirected pings are meant.
		{"sysctl", "-qw", "net.ipv6.conf.ifb0.disable_ipv6=1"},
		{"ip", "link", "set", "ifb0", "up"},
		{"tc", "qdisc", "add", "dev", "ifb0", "root", "handle", "1:", "htb", "default", "10"},
		{"tc", "class", "add", "dev", "ifb0", "parent", "1:", "classid", "1:10", "htb", "rate", "20mbit"},
		{"tc", "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress"},
		{"tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "prio", "10", "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "ifb0"},
	} {
		testutil.NS(t, ns, c[0], c[1:]...)
	}
	sent := func(d string) uint64 {
		t.Helper()
		var qs []struct {
			Kind    string `json:"kind"`
			Root    bool   `json:"root"`
			Packets uint64 `json:"packets"`
		}
		if err := json.Unmarshal([]byte(testutil.NS(t, ns, "tc", "-s", "-j", "qdisc", "show", "dev", d, "root")), &qs); err != nil || len(qs) == 0 {
			t.Fatalf("%s's root qdisc: %v %+v", d, err, qs)
		}
		return qs[0].Packets
	}
	ping := func() {
		t.Helper()
		if _, err := testutil.Ping(p.B, testutil.AddrA, 8, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	before := sent("ifb0")
	ping()
	if n := sent("ifb0") - before; n < 8 {
		t.Fatalf("the old ingress counted %d of 8 pings", n)
	}

	dir := t.TempDir()
	imp := sluice(t, "--netns", ns, "import", "tc", dev, "-o", dir)
	if imp.code != 0 || !strings.Contains(imp.stderr, "this redirect (prio 10) would run before sluice's: `apply --force` removes it") {
		t.Fatalf("import (code %d): want the redirect's takeover said:\n%s", imp.code, imp.stderr)
	}
	pol := filepath.Join(dir, "policy.yaml")
	removal := "- filter " + dev + "/ingress: another tool's u32 filter at ingress prio 10 (redirect to ifb0), which ran before sluice's (--force)\n"
	if r := sluice(t, "--netns", ns, "plan", "--force", pol); r.code != 0 || !strings.Contains(r.stdout, removal) || !strings.Contains(r.stdout, "filter of another tool 1 to delete") ||
		strings.Contains(r.stdout, "classification rules") {
		t.Fatalf("plan --force (code %d): want %q:\n%s%s", r.code, removal, r.stdout, r.stderr)
	}
	r := sluice(t, "--netns", ns, "apply", "--force", pol)
	if r.code != 0 || !strings.Contains(r.stdout, removal) {
		t.Fatalf("apply --force (code %d): want %q:\n%s%s", r.code, removal, r.stdout, r.stderr)
	}
	if out := testutil.NS(t, ns, "tc", "filter", "show", "dev", dev, "ingress"); strings.Contains(out, "ifb0") {
		t.Fatalf("the old redirect stayed:\n%s", out)
	}
	oldBefore, newBefore := sent("ifb0"), sent("ifb-"+dev)
	ping()
	if old, mine := sent("ifb0")-oldBefore, sent("ifb-"+dev)-newBefore; old != 0 || mine < 8 {
		t.Fatalf("after the takeover ifb0 counted %d packets and sluice's ifb %d, want 0 and every ping (8)", old, mine)
	}
	if r := sluice(t, "--netns", ns, "plan", pol); r.code != 0 || r.stdout != "no changes\n" || strings.Contains(r.stderr, "runs before") {
		t.Fatalf("plan after the takeover (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Another tool's redirect added afterwards: said, not touched, by
	// a plain plan and apply; --force takes it out.
	testutil.NS(t, ns, "tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "prio", "5", "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "ifb0")
	warning := dev + ": another tool's u32 filter at ingress prio 5 (redirect to ifb0) runs before sluice's redirect: the packets it takes never reach the ingress tree; apply --force removes it"
	for _, cmd := range []string{"plan", "apply"} {
		r := sluice(t, "--netns", ns, cmd, pol)
		if r.code != 0 || !strings.Contains(r.stderr, warning) {
			t.Fatalf("%s (code %d): want the warning %q:\n%s%s", cmd, r.code, warning, r.stdout, r.stderr)
		}
	}
	if out := testutil.NS(t, ns, "tc", "filter", "show", "dev", dev, "ingress"); !strings.Contains(out, "ifb0") {
		t.Fatalf("a plain apply removed another tool's filter:\n%s", out)
	}
	// A filter that does something else (here it takes a port's
	// packets past every later filter) is said, and left even by
	// --force: it is not shaping sluice replaces.
	testutil.NS(t, ns, "tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "ip", "prio", "3", "u32", "match", "ip", "dport", "9", "0xffff", "flowid", "1:1")
	r = sluice(t, "--netns", ns, "apply", "--force", pol)
	if r.code != 0 || !strings.Contains(r.stdout, "- filter "+dev+"/ingress: another tool's u32 filter at ingress prio 5") ||
		!strings.Contains(r.stderr, "another tool's u32 filter at ingress prio 3 (classid 1:1) runs before sluice's redirect") {
		t.Fatalf("apply --force beside a classifying filter (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	out := testutil.NS(t, ns, "tc", "filter", "show", "dev", dev, "ingress")
	if strings.Contains(out, "ifb0") || !strings.Contains(out, "pref 3 ") {
		t.Fatalf("--force: want the redirect gone and the other filter kept:\n%s", out)
	}
}
