package e2e

import (
	"fmt"
	"math"
	"math/rand"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sluice/features"
	"sluice/records"
	"sluice/testutil"
)

// lqFixtureCircuit is a circuit of a LibreQoS fixture: its addresses
// (IPv4 addresses and IPv6 prefixes, space-separated), node and
// download min/max in Mbit/s.
type lqFixtureCircuit struct {
	id, addr, node string
	min, max       float64
}

// libreqosDryRun is the tests' reading of what LibreQoS's dry run
// prints for the download direction of one CPU queue (its docs: an HTB
// whose class 1:1 holds the capacity, a default class 1:2 of a quarter
// of it at prio 5, a class per node with ceil its maximum capped by its
// parent's and rate 95% of that, a class per circuit below its node with
// rate its minimum and ceil its maximum capped by the node's, prio 3,
// and the SQM qdisc on each circuit), with u32 filters on destination
// addresses standing in for its XDP address-to-class map. It returns
// the commands and the old class of each circuit.
func libreqosDryRun(dev string, capMbps float64, sqm string, nodes [][3]string, nodeMax map[string]float64, circuits []lqFixtureCircuit) ([][]string, map[string]string) {
	mb := func(v float64) string { return fmt.Sprintf("%gmbit", v) }
	cmds := [][]string{
		{"qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "2"},
		{"class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", mb(capMbps), "ceil", mb(capMbps)},
		{"class", "add", "dev", dev, "parent", "1:1", "classid", "1:2", "htb", "rate", mb(math.Round((capMbps - 1) / 4)), "ceil", mb(capMbps - 1), "prio", "5"},
		append([]string{"qdisc", "add", "dev", dev, "parent", "1:2"}, strings.Fields(sqm)...),
	}
	minor := 3
	classOf, ceilOf := map[string]string{}, map[string]float64{}
	owner := map[string]string{}
	var filters [][]string
	for _, n := range nodes { // name, parent name ("" top)
		name, parent := n[0], n[1]
		pc, pceil := "1:1", capMbps
		if parent != "" {
			pc, pceil = classOf[parent], ceilOf[parent]
		}
		ceil := math.Min(nodeMax[name], pceil)
		id := fmt.Sprintf("1:%x", minor)
		minor++
		classOf[name], ceilOf[name] = id, ceil
		cmds = append(cmds, []string{"class", "add", "dev", dev, "parent", pc, "classid", id, "htb", "rate", mb(math.Round(ceil * 0.95)), "ceil", mb(ceil), "prio", "3"})
		for _, c := range circuits {
			if c.node != name {
				continue
			}
			cid := fmt.Sprintf("1:%x", minor)
			minor++
			max := math.Min(c.max, ceil)
			cmds = append(cmds, []string{"class", "add", "dev", dev, "parent", id, "classid", cid, "htb", "rate", mb(math.Min(c.min, max)), "ceil", mb(max), "prio", "3"},
				append([]string{"qdisc", "add", "dev", dev, "parent", cid}, strings.Fields(sqm)...))
			for _, a := range strings.Fields(c.addr) {
				proto, match, prio := "ip", "ip", "1"
				if strings.Contains(a, ":") {
					proto, match, prio = "ipv6", "ip6", "2"
				}
				if !strings.Contains(a, "/") {
					a += map[string]string{"ip": "/32", "ipv6": "/128"}[proto]
				}
				filters = append(filters, []string{"filter", "add", "dev", dev, "parent", "1:", "protocol", proto, "prio", prio, "u32", "match", match, "dst", a, "classid", cid})
			}
			owner[cid] = c.id
		}
	}
	return append(cmds, filters...), owner
}

// A LibreQoS directory imported by sluice and the tree LibreQoS's dry
// run builds from it: every crafted packet lands in the same circuit
// (or the default class), and UDP floods to three circuits get the same
// rates through both.
func TestImportedLibreQoSClassifiesAsTheOriginal(t *testing.T) {
	testutil.Slow(t)
	light(t)
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	// LibreQoS's default SQM where the kernel has it (the lane's);
	// elsewhere a qdisc it does have, which the import leaves to sluice.
	sqm := "cake diffserv4"
	if !rep.Features().Qdiscs["cake"] {
		sqm = "pfifo limit 1000"
	}
	old, imp := newImportBed(t, "old"), newImportBed(t, "imp")
	// The upload side's device (to_internet): present, not measured.
	for _, b := range []*importBed{old, imp} {
		testutil.NS(t, b.ns, "ip", "link", "add", "wan9", "type", "veth", "peer", "name", "wan9p")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "lqos.conf"), []byte(fmt.Sprintf("[bridge]\nto_internet = \"wan9\"\nto_network = \"veth0\"\n[queues]\ndownlink_bandwidth_mbps = 20\nuplink_bandwidth_mbps = 10\ndefault_sqm = %q\n", sqm)), 0o644)
	os.WriteFile(filepath.Join(dir, "network.json"), []byte(`{
  "Tower A": {"downloadBandwidthMbps": 12, "uploadBandwidthMbps": 5, "children": {
    "A-1": {"downloadBandwidthMbps": 8, "uploadBandwidthMbps": 4},
    "A-2": {"downloadBandwidthMbps": 20, "uploadBandwidthMbps": 4}}},
  "Tower B": {"downloadBandwidthMbps": 6, "uploadBandwidthMbps": 3}
}
`), 0o644)
	circuits := []lqFixtureCircuit{
		{"c1", "100.64.0.11", "A-1", 2, 8},
		{"c2", "100.64.0.12", "A-1", 4, 8},
		{"c3", "100.64.0.13", "A-2", 1, 30},
		{"c4", "100.64.0.14", "Tower B", 1, 6},
	}
	csv := "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n"
	for i, c := range circuits {
		csv += fmt.Sprintf("%s,%s,%d,cpe,%s,,%s,,%g,1,%g,2,\n", c.id, c.id, i, c.node, c.addr, c.min, c.max)
	}
	os.WriteFile(filepath.Join(dir, "ShapedDevices.csv"), []byte(csv), 0o644)

	cmds, owner := libreqosDryRun("veth0", 20, sqm,
		[][3]string{{"Tower A", ""}, {"A-1", "Tower A"}, {"A-2", "Tower A"}, {"Tower B", ""}},
		map[string]float64{"Tower A": 12, "A-1": 8, "A-2": 20, "Tower B": 6}, circuits)
	for _, c := range cmds {
		testutil.NS(t, old.ns, "tc", c...)
	}
	out := t.TempDir()
	res := sluice(t, "import", "libreqos", dir, "-o", out)
	if res.code != 0 {
		t.Fatalf("import: exit %d\n%s", res.code, res.stderr)
	}
	t.Logf("import report:\n%s", res.stderr)
	policyFile := filepath.Join(out, "policy.yaml")
	must(t, "--netns", imp.ns, "apply", "-q", policyFile)

	// Classification: each circuit's address, addresses of no circuit,
	// both directions of address, every protocol.
	names := sluiceClassNames(t, imp.ns)
	r := rand.New(rand.NewSource(5))
	v4 := []string{"100.64.0.11", "100.64.0.12", "100.64.0.13", "100.64.0.14", "100.64.0.99", "8.8.8.8"}
	seen := map[string]int{}
	for i := 0; i < 120; i++ {
		p := importPacket(r, v4, []string{"2001:db8::1"}, []uint16{53, 80, 443})
		if p.Dst.Is6() {
			p.Src, p.Dst = netip.MustParseAddr("100.64.0.99"), netip.MustParseAddr(pick(r, v4))
			p.Proto = 17
		}
		seen[libreqosSameClass(t, i, p, old, imp, owner, names)]++
	}
	for _, c := range []string{"circuits/c1", "circuits/c2", "circuits/c3", "circuits/c4", "default"} {
		if seen[c] == 0 {
			t.Errorf("no packet exercised %s (seen %v)", c, seen)
		}
	}
	t.Logf("%d packets agree: %v", 120, seen)

	// Rates: floods to c1, c2 (sharing A-1's 8) and c4 (Tower B's 6).
	for _, b := range []*importBed{old, imp} {
		testutil.NS(t, b.ns, "ip", "addr", "add", "10.9.0.1/24", "dev", "veth0")
		testutil.NS(t, b.peer, "ip", "addr", "add", "10.9.0.2/24", "dev", "veth1")
		testutil.NS(t, b.ns, "ip", "route", "add", "100.64.0.0/24", "via", "10.9.0.2")
		for _, c := range circuits {
			testutil.NS(t, b.peer, "ip", "addr", "add", c.addr+"/32", "dev", "veth1")
		}
	}
	flooded := []string{"c1", "c2", "c4"}
	addr := map[string]string{}
	for _, c := range circuits {
		addr[c.id] = c.addr
	}
	// Floods of 12 Mbit/s each, past every share they can get (A-1's 8,
	// Tower B's 6): six of 20 Mbit/s cost the emulated guest 15,000
	// packets a second.
	var stops []func()
	for _, b := range []*importBed{old, imp} {
		for _, c := range flooded {
			stops = append(stops, udpFlood(t, b.ns, addr[c], 12e6, 5001))
		}
	}
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	oldName := map[string]string{}
	for h, c := range owner {
		oldName[h] = "circuits/" + c
	}
	const warm, measure = 2 * time.Second, 4 * time.Second
	time.Sleep(warm)
	// HTB's own shares: c1 2 and c2 4 of A-1's 8, the 2 over their rates
	// by quantum (rate/10 under LibreQoS, in proportion to the rate under
	// sluice too: 1:2), c4 Tower B's 6. Measured here: the same to 0.01
	// Mbit/s. A rate off the original's by more than 5% must be HTB's
	// share for the configuration. A window that misses is measured
	// once more, and the second must hold: under emulation on a busy
	// CI machine the two trees, side by side, once read c4 5.15 and 5.55
	// Mbit/s (LibreQoS's and the import's, in the 6.1 lane), where they
	// read within 1% of 6 in every other run.
	want := map[string][2]float64{"c1": {2.5, 3.2}, "c2": {4.7, 5.5}, "c4": {5.6, 6.2}}
	var misses []string
	for try := 0; try < 2; try++ {
		o0, n0 := old.bytesBy(t, oldName), imp.bytesBy(t, names)
		time.Sleep(measure)
		o1, n1 := old.bytesBy(t, oldName), imp.bytesBy(t, names)
		misses = nil
		for _, c := range flooded {
			k := "circuits/" + c
			ro, rn := float64(o1[k]-o0[k])*8/measure.Seconds()/1e6, float64(n1[k]-n0[k])*8/measure.Seconds()/1e6
			t.Logf("circuit %s: LibreQoS's tree %.2f Mbit/s, sluice's import %.2f Mbit/s", c, ro, rn)
			if math.Abs(rn-ro) > 0.05*ro && (rn < want[c][0] || rn > want[c][1]) {
				misses = append(misses, fmt.Sprintf("circuit %s: %.2f Mbit/s under the import, %.2f under LibreQoS's tree (want within 5%%, or %.1f-%.1f)", c, rn, ro, want[c][0], want[c][1]))
			}
		}
		if len(misses) == 0 {
			break
		}
		if try == 0 {
			t.Logf("measuring again: %s", strings.Join(misses, "; "))
		}
	}
	for _, m := range misses {
		t.Error(m)
	}
}

// sqm's simple.qos imported and applied: its upload tiers sort packets
// by DSCP as sqm's own rules do (EF, CS6, AF42 and the Minimize-Delay
// TOS to priority, CS1 to background, the rest to best effort, IPv4
// and IPv6 alike), and its download is one class behind an ifb.
func TestImportedSQMSortsByDSCPAsSQM(t *testing.T) {
	light(t)
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	qdisc := "fq_codel" // sqm's default, where the kernel has it (the lane's)
	if !rep.Features().Qdiscs["fq_codel"] {
		qdisc = "pfifo"
	}
	b := newImportBed(t, "sqm")
	conf := filepath.Join(t.TempDir(), "sqm")
	os.WriteFile(conf, []byte("config queue 'wan'\n\toption enabled '1'\n\toption interface 'veth0'\n\toption download '20000'\n\toption upload '5000'\n\toption qdisc '"+qdisc+"'\n\toption script 'simple.qos'\n\toption linklayer 'atm'\n\toption overhead '26'\n"), 0o644)
	out := t.TempDir()
	res := sluice(t, "import", "sqm", conf, "-o", out)
	if res.code != 0 {
		t.Fatalf("import: exit %d\n%s", res.code, res.stderr)
	}
	// The shell form other distributions install (/etc/sqm) says the
	// same: it imports to the same policy, line for line but the
	// comments naming the file.
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "default.conf"), []byte("UPLINK=1000\nDOWNLINK=20000\nSCRIPT=piece_of_cake.qos\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "veth0.iface.conf"), []byte("UPLINK=5000\nQDISC="+qdisc+"\nSCRIPT=simple.qos\nLINKLAYER=atm\nOVERHEAD=26\n"), 0o644)
	shellOut := t.TempDir()
	if res := sluice(t, "import", "sqm", etc, "-o", shellOut); res.code != 0 {
		t.Fatalf("import of /etc/sqm's form: exit %d\n%s", res.code, res.stderr)
	}
	uncomment := func(dir string) string {
		b, err := os.ReadFile(filepath.Join(dir, "policy.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return regexp.MustCompile(`#.*`).ReplaceAllString(string(b), "")
	}
	if a, b := uncomment(out), uncomment(shellOut); a != b {
		t.Errorf("UCI's and the shell form's imports differ:\n%s\n---\n%s", a, b)
	}
	must(t, "--netns", b.ns, "apply", "-q", filepath.Join(out, "policy.yaml"))
	if q := testutil.NS(t, b.ns, "tc", "-d", "qdisc", "show", "dev", "ifb-veth0"); !strings.Contains(q, "htb") || !strings.Contains(q, "linklayer atm") {
		t.Errorf("download: no HTB with the ATM size table on ifb-veth0:\n%s", q)
	}
	names := sluiceClassNames(t, b.ns)
	for _, c := range []struct {
		tos  uint8
		want string
	}{
		{0xb8, "priority"}, {0xc0, "priority"}, {0x90, "priority"}, {0x10, "priority"},
		{0x20, "background"}, {0x00, "besteffort"}, {0x28, "besteffort"}, {0x12, "besteffort"}, {0x11, "besteffort"},
	} {
		for _, src := range []string{"10.0.0.1", "2001:db8::1"} {
			dst := "10.0.0.2"
			if strings.Contains(src, ":") {
				dst = "2001:db8::2"
			}
			p := &testutil.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: 17, TOS: c.tos, Sport: 4000, Dport: 53}
			if got := names[b.classify(t, p)]; got != c.want {
				t.Errorf("TOS %#x from %s: class %q, want %s", c.tos, src, got, c.want)
			}
		}
	}
}

// libreqosSameClass sends packet i through LibreQoS's tree (old) and
// sluice's import (imp) and fails unless both put it in the same
// circuit (owner: the old tree's class ids; names: sluice's), or both in
// the default class; it returns that class's name in sluice.
func libreqosSameClass(t *testing.T, i int, p *testutil.Packet, old, imp *importBed, owner, names map[string]string) string {
	t.Helper()
	o, got := old.classify(t, p), imp.classify(t, p)
	want := "default"
	if id, ok := owner[o]; ok {
		want = "circuits/" + id
	} else if o != "1:2" {
		t.Fatalf("packet %d (%s): LibreQoS's tree put it in %q, neither a circuit nor the default class", i, describePacket(p), o)
	}
	if names[got] != want {
		t.Fatalf("packet %d (%s): LibreQoS's tree put it in %s (%s), sluice's import in %q", i, describePacket(p), o, want, names[got])
	}
	return want
}
