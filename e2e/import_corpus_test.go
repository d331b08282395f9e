package e2e

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"sluice/features"
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
	rep, err := features.ProbeCached(records.Dir(""))
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
	// htb.init's sample directory (eth0 and its classes, sfq leaves)
	// as htb.init builds it, by the tests' reading of it, on veth0.
	t.Run("htb.init", func(t *testing.T) {
		src := filepath.Dir(corpusFile(t, "htb.init/eth0"))
		testutil.NeedFeature(t, "sfq", q["sfq"])
		dir := copyCorpusDir(t, src, func(name string, b []byte) (string, []byte) {
			return strings.Replace(name, "eth0", "veth0", 1), b
		})
		out := t.TempDir()
		if res := sluice(t, "import", "htb.init", dir, "-o", out, "--ipv4-only"); res.code != 0 {
			t.Fatalf("import: exit %d\n%s", res.code, res.stderr)
		}
		d, err := migrate.HTBInit(dir, migrate.Options{IPv4Only: true})
		if err != nil {
			t.Fatal(err)
		}
		old, imp := newImportBed(t, "old"), newImportBed(t, "imp")
		for _, c := range htbInitScript(t, dir, "veth0") {
			testutil.NS(t, old.ns, "tc", c...)
		}
		must(t, "--netns", imp.ns, "apply", "-q", filepath.Join(out, "policy.yaml"))
		r := rand.New(rand.NewSource(37))
		var ps []*testutil.Packet
		for len(ps) < 300 {
			ps = append(ps, importPacket(r, []string{"10.2.0.1", "8.8.8.8"}, []string{"2001:db8::1"}, []uint16{22, 25, 80, 443}))
		}
		seen := compareImport(t, old, imp, d, "veth0/egress", ps)
		if len(seen) < 3 {
			t.Errorf("the packets exercised %d classes, want www, smtp and dfl (seen %v)", len(seen), seen)
		}
		t.Logf("%d packets agree, per class %v", len(ps), seen)
	})
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

// LibreQoS's own example directories (v1.4's ispConfig.py, v2.2's
// lqos.conf, with their network.json and ShapedDevices.csv), imported by
// sluice and built by the tests' reading of LibreQoS's dry run from the
// same files: every crafted packet, IPv4 and IPv6, lands in the same
// circuit or the default class. Circuits of several devices (v1.4's
// 2794) are one class of every device's addresses in both.
func TestImportedLibreQoSCorpusClassifiesAsTheOriginal(t *testing.T) {
	testutil.Slow(t)
	light(t)
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	sqm := "cake diffserv4"
	if !rep.Features().Qdiscs["cake"] {
		sqm = "pfifo limit 1000"
	}
	for _, c := range []struct {
		dir, settings string
		// rename makes the download device (toward the subscribers)
		// the bed's veth0 and the upload device wan9.
		rename  func(string) string
		capMbps float64
	}{
		{"libreqos/v1.4", "ispConfig.example.py", func(s string) string {
			return strings.NewReplacer("interfaceA = 'eth1'", "interfaceA = 'veth0'", "interfaceB = 'eth2'", "interfaceB = 'wan9'").Replace(s)
		}, 1000},
		{"libreqos/v2.2", "lqos.example", func(s string) string {
			return strings.NewReplacer(`to_network = "eth1"`, `to_network = "veth0"`, `to_internet = "eth0"`, `to_internet = "wan9"`).Replace(s)
		}, 100000},
	} {
		t.Run(c.dir, func(t *testing.T) {
			src := filepath.Dir(corpusFile(t, filepath.Join(c.dir, c.settings)))
			dir := copyCorpusDir(t, src, func(name string, b []byte) (string, []byte) {
				if name == c.settings {
					b = []byte(c.rename(string(b)))
				}
				return name, b
			})
			nodes, nodeMax, circuits := libreqosCorpusFixture(t, dir)
			old, imp := newImportBed(t, "old"), newImportBed(t, "imp")
			testutil.NS(t, imp.ns, "ip", "link", "add", "wan9", "type", "veth", "peer", "name", "wan9p")
			cmds, owner := libreqosDryRun("veth0", c.capMbps, sqm, nodes, nodeMax, circuits)
			for _, cmd := range cmds {
				testutil.NS(t, old.ns, "tc", cmd...)
			}
			out := t.TempDir()
			if res := sluice(t, "import", "libreqos", dir, "-o", out); res.code != 0 {
				t.Fatalf("import: exit %d\n%s", res.code, res.stderr)
			}
			must(t, "--netns", imp.ns, "apply", "-q", filepath.Join(out, "policy.yaml"))
			names := sluiceClassNames(t, imp.ns)
			var v4, v6 []string
			for i := 1; i <= 15; i++ {
				v4 = append(v4, fmt.Sprintf("100.64.0.%d", i))
				v6 = append(v6, fmt.Sprintf("fdd7:b724:0:%x00::%x", i, i))
			}
			v4, v6 = append(v4, "100.64.1.1", "8.8.8.8"), append(v6, "2001:db8::1")
			r := rand.New(rand.NewSource(31))
			seen := map[string]int{}
			const n = 300
			for i := 0; i < n; i++ {
				p := importPacket(r, v4, v6, []uint16{53, 80, 443})
				seen[libreqosSameClass(t, i, p, old, imp, owner, names)]++
			}
			for _, ci := range circuits {
				if seen["circuits/"+ci.id] == 0 {
					t.Errorf("no packet exercised circuit %s (seen %v)", ci.id, seen)
				}
			}
			if seen["default"] == 0 {
				t.Errorf("no packet exercised the default class (seen %v)", seen)
			}
			t.Logf("%d packets agree: %v", n, seen)
		})
	}
}

// libreqosCorpusFixture reads a LibreQoS directory's network.json (or
// its example) and ShapedDevices.csv (or its example) as the dry run's
// input: nodes parents first, each node's download maximum, and the
// circuits with every device's addresses. Rows are read from their end,
// so both the v2.0 layout and the one with node id columns read alike.
func libreqosCorpusFixture(t *testing.T, dir string) ([][3]string, map[string]float64, []lqFixtureCircuit) {
	t.Helper()
	read := func(names ...string) []byte {
		for _, n := range names {
			if b, err := os.ReadFile(filepath.Join(dir, n)); err == nil {
				return b
			}
		}
		t.Fatalf("none of %v in %s", names, dir)
		return nil
	}
	type node struct {
		Down     float64         `json:"downloadBandwidthMbps"`
		Children map[string]node `json:"children"`
	}
	var top map[string]node
	if err := json.Unmarshal(read("network.json", "network.example.json"), &top); err != nil {
		t.Fatal(err)
	}
	var nodes [][3]string
	nodeMax := map[string]float64{}
	var walk func(parent string, m map[string]node)
	walk = func(parent string, m map[string]node) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			nodes = append(nodes, [3]string{k, parent})
			nodeMax[k] = m[k].Down
			walk(k, m[k].Children)
		}
	}
	walk("", top)
	var lines []string
	for _, l := range strings.Split(string(read("ShapedDevices.csv", "ShapedDevices.example.csv")), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	cr := csv.NewReader(strings.NewReader(strings.Join(lines, "\n")))
	cr.FieldsPerRecord = -1 // v2.2's example: rows of 13 fields under a header of 15
	rows, err := cr.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]int{}
	var circuits []lqFixtureCircuit
	for _, row := range rows[1:] {
		k := len(row)
		num := func(s string) float64 {
			v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil {
				t.Fatalf("row %v: %v", row, err)
			}
			return v
		}
		addrs := strings.Join(strings.FieldsFunc(row[k-7]+" "+row[k-6], func(r rune) bool { return r == ',' || r == ' ' }), " ")
		if i, ok := byID[row[0]]; ok {
			circuits[i].addr += " " + addrs
			continue
		}
		byID[row[0]] = len(circuits)
		circuits = append(circuits, lqFixtureCircuit{id: row[0], addr: addrs, node: row[4], min: num(row[k-5]), max: num(row[k-3])})
	}
	return nodes, nodeMax, circuits
}

// copyCorpusDir copies the corpus directory src into a temporary one,
// each file as edit returns its name and contents.
func copyCorpusDir(t *testing.T, src string, edit func(name string, b []byte) (string, []byte)) string {
	t.Helper()
	dir := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		name, b := edit(e.Name(), b)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
