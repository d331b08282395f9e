package e2e

import (
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sluice/kernel"
	"sluice/migrate"
	"sluice/records"
	"sluice/testutil"
)

// corpusFile is a file of the peers' own example corpus (../shared/corpus
// beside the checkout, or $SLUICE_CORPUS); the test skips where the
// corpus is not there (it is not the project's to ship).
func corpusFile(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("SLUICE_CORPUS")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "corpus")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no corpus of the peers' example files (set SLUICE_CORPUS): %v", err)
	}
	return p
}

// The tools' own shipped examples, run by the tools themselves and
// imported by sluice, unchanged but for the device's name: every crafted
// packet lands in the same class. FireQOS builds its default leaves
// (fq_codel, else codel, else sfq) and wondershaper 1.4.1 its sfq ones
// only where the kernel has them: the stock-kernel lane.
func TestImportedCorpusClassifiesAsTheOriginal(t *testing.T) {
	testutil.Slow(t)
	light(t)
	rep, err := kernel.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	q := rep.Features().Qdiscs
	for _, c := range []struct {
		file string
		// rename turns the file's device into the bed's veth0.
		rename  func(string) string
		classes []string
	}{
		{"fireqos/etc-fireqos.conf.example", func(s string) string { return strings.Replace(s, "DEVICE=dsl0", "DEVICE=veth0", 1) },
			[]string{"voip", "interactive", "vpns", "servers", "synacks", "default", "torrents"}},
		{"fireqos/examples-fireqos.conf", func(s string) string { return strings.ReplaceAll(s, "eth2", "veth0") },
			[]string{"voip", "realtime", "clients", "default", "torrents"}},
		{"fireqos/tests-minimal-qos.conf", func(s string) string { return s }, nil},
	} {
		t.Run(c.file, func(t *testing.T) {
			src := corpusFile(t, c.file)
			testutil.NeedFeature(t, "fq_codel", q["fq_codel"])
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			conf := filepath.Join(t.TempDir(), filepath.Base(c.file))
			if err := os.WriteFile(conf, []byte(c.rename(string(b))), 0o644); err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			if res := sluice(t, "import", "fireqos", conf, "-o", out, "--ipv4-only"); res.code != 0 {
				t.Fatalf("import: exit %d\n%s", res.code, res.stderr)
			}
			d, err := migrate.FireQOS(conf, migrate.Options{IPv4Only: true})
			if err != nil {
				t.Fatal(err)
			}
			old, imp := newImportBed(t, "old"), newImportBed(t, "imp")
			t.Logf("fireqos:\n%s", runFireQOS(t, old.ns, conf))
			must(t, "--netns", imp.ns, "apply", "-q", filepath.Join(out, "policy.yaml"))
			r := rand.New(rand.NewSource(23))
			v4 := []string{"83.235.24.9", "192.168.2.5", "10.2.0.1", "8.8.8.8"}
			v6 := []string{"2001:db8::1", "2001:db8::2"}
			ports := []uint16{22, 53, 80, 443, 873, 1196, 1723, 2099, 3478, 5060, 5222, 5500, 8395, 10050, 16393, 20000, 51414}
			var ps []*testutil.Packet
			for len(ps) < 400 {
				p := importPacket(r, v4, v6, ports)
				// FireQOS reads a small ACK as exactly ACK under 64
				// bytes, sluice's tcp_ack any ACK-only under 128 (the
				// import says so): packets the two call alike.
				if p.Proto == 6 && p.TCPFlags == 0x10 && p.IPLength() >= 64 && p.IPLength() < 128 {
					continue
				}
				ps = append(ps, p)
			}
			// A match FireQOS tried early (`prio 1` on a service) takes a
			// packet another class's earlier rule takes here: the report
			// says so ("match order"), naming both classes.
			explained := func(was, is string) bool {
				for _, f := range d.Report.Findings {
					if f.Kind == migrate.Approximated && f.What == "match order" &&
						strings.Contains(f.How, "(for "+was+")") && strings.Contains(f.How, " "+is+"'s at line ") {
						return true
					}
				}
				return false
			}
			seen, told := compareImportExplained(t, old, imp, d, "veth0/egress", ps, explained)
			if told > 0 {
				t.Logf("%d packets went where the report's match-order notes say", told)
			}
			for _, cl := range c.classes {
				if seen[cl] == 0 {
					t.Errorf("no packet exercised class %s (seen %v)", cl, seen)
				}
			}
			t.Logf("%d packets agree, per class %v", len(ps), seen)
		})
	}
	// wondershaper 1.4.1's program with its shipped wondershaper.conf
	// (NOPRIOHOSTSRC=(80), which tc reads as 80.0.0.0), as its systemd
	// unit starts it.
	t.Run("wondershaper/wondershaper.conf", func(t *testing.T) {
		prog, conf0 := corpusFile(t, "wondershaper/reference/wondershaper-1.4.1"), corpusFile(t, "wondershaper/wondershaper.conf")
		testutil.NeedFeature(t, "sfq", q["sfq"])
		b, err := os.ReadFile(conf0)
		if err != nil {
			t.Fatal(err)
		}
		conf := filepath.Join(t.TempDir(), "wondershaper.conf")
		if err := os.WriteFile(conf, []byte(strings.Replace(string(b), `IFACE="eth0"`, `IFACE="veth0"`, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		old, imp := newImportBed(t, "old"), newImportBed(t, "imp")
		// Its downlink half wants the host's ifb0, which the bed's
		// namespace does not have: the uplink is what is compared.
		ws, _ := exec.Command("ip", "netns", "exec", old.ns, "bash", prog, "-p", "-f", conf).CombinedOutput()
		t.Logf("wondershaper 1.4.1: %s", ws)
		if f := testutil.NS(t, old.ns, "tc", "filter", "show", "dev", "veth0"); !strings.Contains(f, "flowid 1:30") {
			t.Fatalf("wondershaper built no NOPRIOHOSTSRC filter:\n%s", f)
		}
		out := t.TempDir()
		if res := sluice(t, "import", "wondershaper", conf, "-o", out, "--ipv4-only"); res.code != 0 {
			t.Fatalf("import: exit %d\n%s", res.code, res.stderr)
		}
		d, err := migrate.Wondershaper(conf, nil, migrate.Options{IPv4Only: true})
		if err != nil {
			t.Fatal(err)
		}
		must(t, "--netns", imp.ns, "apply", "-q", filepath.Join(out, "policy.yaml"))
		r := rand.New(rand.NewSource(29))
		var ps []*testutil.Packet
		for len(ps) < 300 {
			p := importPacket(r, []string{"80.0.0.0", "80.0.0.1", "10.2.0.1", "8.8.8.8"}, []string{"2001:db8::1"}, []uint16{22, 80, 873})
			// The old rule took every small TCP packet, sluice's tcp_ack
			// pure ACKs (the import says so).
			if p.Proto == 6 && p.IPLength() < 128 && p.TCPFlags != 0x10 && p.TOS != 0x10 {
				continue
			}
			ps = append(ps, p)
		}
		seen := compareImport(t, old, imp, d, "veth0/egress", ps)
		for _, cl := range []string{"interactive", "bulk", "low"} {
			if seen[cl] == 0 {
				t.Errorf("no packet exercised class %s (seen %v)", cl, seen)
			}
		}
		t.Logf("%d packets agree, per class %v", len(ps), seen)
	})
}
