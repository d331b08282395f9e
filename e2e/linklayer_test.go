package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/testutil"
)

// TestLinkLayerApply: overhead and linklayer put a size table on the
// tree's root HTB (and the ifb's), as export writes it; an edit changes
// it in place, without rebuilding the tree; removing the keys removes it.
func TestLinkLayerApply(t *testing.T) {
	p := testutil.NewPair(t)
	pol := func(link string) string {
		return writePolicy(t, "p.yaml", policyFor(p.DevA, `    egress:
      rate: 3800kbit`+link+`
      default: bulk
      classes:
        - {name: interactive, rate: 30%, prio: 0, match: [{proto: icmp}]}
        - {name: bulk, rate: 70%, prio: 1}
    ingress:
      rate: 15mbit`+link+`
      default: all
      classes:
        - {name: all, rate: 100%}
`))
	}
	atm := pol("\n      linklayer: atm\n      overhead: 26")
	r := sluice(t, "--netns", p.A, "apply", atm)
	if r.code != 0 || !strings.Contains(r.stdout+r.stderr, "overhead and linklayer are counted once per GSO packet") {
		t.Fatalf("apply (code %d): want it applied with the GSO note:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, dev := range []string{p.DevA, "ifb-" + p.DevA} {
		if out := testutil.NS(t, p.A, "tc", "-d", "qdisc", "show", "dev", dev, "root"); !strings.Contains(out, "linklayer atm overhead 26") {
			t.Fatalf("%s: no size table on the root:\n%s", dev, out)
		}
	}
	ex := sluice(t, "--netns", p.A, "export", atm)
	if ex.code != 0 || strings.Count(ex.stdout, "root handle 1: stab overhead 26 linklayer atm htb") != 2 {
		t.Fatalf("export (code %d): want the size table on both roots:\n%s%s", ex.code, ex.stdout, ex.stderr)
	}
	if r := sluice(t, "--netns", p.A, "apply", atm); r.code != 0 || !strings.Contains(r.stdout, "no changes") {
		t.Fatalf("second apply (code %d): want no changes:\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = sluice(t, "--netns", p.A, "apply", pol("\n      linklayer: atm\n      overhead: 40"))
	if r.code != 0 || !strings.Contains(r.stdout, "~ tree veth0/egress: overhead 26 -> 40\n") || !strings.Contains(r.stdout, "~ tree veth0/ingress: overhead 26 -> 40\n") ||
		!strings.Contains(r.stdout, "applied: 2 change(s), 2 netlink write(s)\n") {
		t.Fatalf("overhead edit (code %d): want the two roots changed in place:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := testutil.NS(t, p.A, "tc", "-d", "qdisc", "show", "dev", p.DevA, "root"); !strings.Contains(out, "linklayer atm overhead 40") {
		t.Fatalf("the new overhead is not in the kernel:\n%s", out)
	}
	r = sluice(t, "--netns", p.A, "apply", pol(""))
	if r.code != 0 || !strings.Contains(r.stdout, "~ tree veth0/egress: overhead 40 -> 0, linklayer atm -> ethernet\n") || !strings.Contains(r.stdout, "applied: 2 change(s), 2 netlink write(s)\n") {
		t.Fatalf("keys removed (code %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := testutil.NS(t, p.A, "tc", "-d", "qdisc", "show", "dev", p.DevA, "root"); strings.Contains(out, "linklayer") {
		t.Fatalf("the size table stayed:\n%s", out)
	}
}

// TestLinkLayerATM runs the dsl scenario: an ADSL modem whose line
// carries ATM cells. Shaped at 95% of its sync rates counting Ethernet
// bytes the modem's buffer fills (ping's median over 100 ms); counting
// cells (linklayer atm, overhead 26) it never queues, both ways.
func TestLinkLayerATM(t *testing.T) {
	testutil.Slow(t)
	light(t)
	dir := t.TempDir()
	r := sluice(t, "lab", "run", "dsl", "--out", dir, "--name", strings.TrimPrefix(testutil.Unique("dsl"), testutil.Prefix))
	if r.code != 0 {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if n := strings.Count(r.stdout, "PASS  "); n != 8 {
		t.Fatalf("%d of 8 expectations passed:\n%s", n, r.stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "report.json")); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", r.stdout)
}

// TestLinkLayerGoodput: with linklayer atm and 26 bytes of overhead a
// full frame costs 1749 bytes of the line, so TCP's goodput under a
// 20mbit shaper is that of 20 Mbit/s of cells (17.31 Mbit/s of frames),
// on HTB (its size table; one segment per packet, since the table sizes
// a GSO packet once) and on EDT (the program counts each segment of a
// GSO packet, so segmentation stays on).
func TestLinkLayerGoodput(t *testing.T) {
	testutil.Slow(t)
	light(t)
	const rate = 20e6
	frames := rate * 1514 / 1749
	for _, backend := range []string{"htb", "edt"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "edt" {
				needFq(t)
			}
			p := testutil.NewPair(t)
			if backend == "htb" {
				testutil.NS(t, p.A, "ip", "link", "set", "dev", p.DevA, "gso_max_segs", "1")
			}
			must(t, "--netns", p.A, "apply", "-q", writePolicy(t, "p.yaml", policyFor(p.DevA,
				"    egress:\n      backend: "+backend+"\n      rate: 20mbit\n      linklayer: atm\n      overhead: 26\n")))
			testutil.IperfServer(t, p.B, testutil.AddrB, 5201)
			r, err := testutil.Iperf(p.A, testutil.AddrB, 5201, 4, 6)
			if err != nil {
				t.Fatal(err)
			}
			checkGoodput(t, backend+" egress 20mbit of ATM cells", r, frames)
		})
	}
}
