package plan

import (
	"sluice/units"

	"flag"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
)

var update = flag.Bool("update", false, "rewrite golden files")

// portMasks must cover a range exactly: every port inside matches one
// value/mask pair, every port outside matches none.
func TestPortMasksExact(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	cases := [][2]uint16{{0, 65535}, {22, 22}, {1024, 65535}, {5060, 5061}, {16384, 32767}, {1, 65534}, {80, 443}}
	for i := 0; i < 200; i++ {
		a, b := uint16(r.Intn(65536)), uint16(r.Intn(65536))
		if a > b {
			a, b = b, a
		}
		cases = append(cases, [2]uint16{a, b})
	}
	for _, c := range cases {
		ms := portMasks(c[0], c[1])
		for p := 0; p < 65536; p++ {
			n := 0
			for _, m := range ms {
				if uint16(p)&m.Mask == m.Val {
					n++
				}
			}
			in := uint16(p) >= c[0] && uint16(p) <= c[1]
			if in && n != 1 || !in && n != 0 {
				t.Fatalf("range %d-%d: port %d matched %d masks (%v)", c[0], c[1], p, n, ms)
			}
		}
		if len(ms) > 30 {
			t.Errorf("range %d-%d: %d masks, more than the 2*16-2 bound", c[0], c[1], len(ms))
		}
	}
}

// subtract must leave exactly the addresses outside the holes.
func TestSubtractExact(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	base := netip.MustParsePrefix("10.0.0.0/16")
	for i := 0; i < 100; i++ {
		var holes []netip.Prefix
		for j := 0; j < 1+r.Intn(3); j++ {
			a := netip.AddrFrom4([4]byte{10, 0, byte(r.Intn(256)), byte(r.Intn(256))})
			holes = append(holes, netip.PrefixFrom(a, 16+r.Intn(17)).Masked())
		}
		got := subtract(base, holes)
		for k := 0; k < 2000; k++ {
			a := netip.AddrFrom4([4]byte{10, 0, byte(r.Intn(256)), byte(r.Intn(256))})
			inHole := false
			for _, h := range holes {
				inHole = inHole || h.Contains(a)
			}
			n := 0
			for _, p := range got {
				if p.Contains(a) {
					n++
				}
			}
			if inHole && n != 0 || !inHole && n != 1 {
				t.Fatalf("holes %v: %v covered %d times by %v", holes, a, n, got)
			}
		}
	}
	// The complement of a /24 in all of IPv4 takes exactly 24 prefixes.
	if n := len(subtract(universe(true), []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")})); n != 24 {
		t.Errorf("complement of a /24: %d prefixes", n)
	}
}

func TestOrderedPriosKeepAndInsert(t *testing.T) {
	first := orderedPrios([]string{"a", "b", "c"}, nil, 1, 0xFFFE)
	if first["a"] != 16 || first["b"] != 32 || first["c"] != 48 {
		t.Fatalf("initial prios %v", first)
	}
	// Insert x between a and b, append d: a, b, c keep theirs.
	next := orderedPrios([]string{"a", "x", "b", "c", "d"}, first, 1, 0xFFFE)
	if next["a"] != 16 || next["b"] != 32 || next["c"] != 48 || !(next["x"] > 16 && next["x"] < 32) || next["d"] <= 48 {
		t.Fatalf("after insert %v", next)
	}
	// Moving c first can keep at most two of the three.
	moved := orderedPrios([]string{"c", "a", "b"}, first, 1, 0xFFFE)
	kept := 0
	for _, k := range []string{"a", "b", "c"} {
		if moved[k] == first[k] {
			kept++
		}
	}
	if kept != 2 || !(moved["c"] < moved["a"] && moved["a"] < moved["b"]) {
		t.Fatalf("after move %v (kept %d)", moved, kept)
	}
	// No room between two adjacent prios: everything is renumbered, in order.
	tight := orderedPrios([]string{"a", "x", "b"}, map[string]uint16{"a": 5, "b": 6}, 1, 0xFFFE)
	if !(tight["a"] < tight["x"] && tight["x"] < tight["b"]) {
		t.Fatalf("renumbered %v", tight)
	}
}

func TestDefaultsAcrossRates(t *testing.T) {
	for _, mbit := range []float64{0.1, 1, 20, 100, 1000, 5000, 10000} {
		rate := units.FromBits(mbit * 1e6)
		b, q := BurstFor(rate, policy.Egress), QuantumFor(rate, rate, LeafFIFO)
		// At least a millisecond of the rate (timer slack), at least two
		// frames; a quantum HTB accepts without its r2q warning bounds.
		if float64(b) < float64(rate)*0.001 || b < 2*frameBytes {
			t.Errorf("%vmbit: burst %d", mbit, b)
		}
		// On an ifb, four (its softirq runs late more often, and what
		// it sends at once waits at no bottleneck).
		if in := BurstFor(rate, policy.Ingress); float64(in) < float64(rate)*0.004 || in < 2*frameBytes || in < b {
			t.Errorf("%vmbit: ingress burst %d (egress %d)", mbit, in, b)
		}
		if q < 1000 || q > 200000 {
			t.Errorf("%vmbit: quantum %d outside HTB's 1000..200000", mbit, q)
		}
		if l := BfifoLimit(rate, rate, q); l < 65536 || l < q {
			t.Errorf("%vmbit: bfifo %d smaller than a GSO packet or a quantum (%d)", mbit, l, q)
		}
		// A class borrowing up to ten times its rate queues at most
		// 50 ms at its rate (above the GSO floor and a quantum), not at
		// its ceil.
		if l := BfifoLimit(rate, 10*rate, q); float64(l) > max(0.050*float64(rate), 65536+3*1514, 2*float64(q)+3*1514)+1 {
			t.Errorf("%vmbit rate, 10x ceil: bfifo %d is more than 50 ms at the rate", mbit, l)
		}
		// On an ingress tree, 10 ms at the rate, with the same floors:
		// never more than egress's, never under a GSO packet or a turn.
		in, eg := IngressBfifoLimit(rate, 10*rate, q), BfifoLimit(rate, 10*rate, q)
		if want := max(uint32(0.010*float64(rate)), MinBfifoBytes, 2*q+3*frameBytes); in != want || in > eg {
			t.Errorf("%vmbit: ingress bfifo %d, want %d (egress %d)", mbit, in, want, eg)
		}
	}
	// The quantum's floor: 4 ms of the link, at least three frames, at
	// most a 64 KB GSO packet; a fast class gets 1 ms of its own rate.
	for _, c := range []struct {
		rate, link float64 // mbit
		want       uint32
	}{{0.1, 8, 4542}, {0.1, 40, 20000}, {1, 100, 50000}, {1, 1000, 67050}, {1000, 1000, 125000}, {100000, 100000, 200000}} {
		if q := QuantumFor(units.FromBits(c.rate*1e6), units.FromBits(c.link*1e6), LeafFIFO); q != c.want {
			t.Errorf("%vmbit in a %vmbit tree: quantum %d, want %d", c.rate, c.link, q, c.want)
		}
	}
	// Under an AQM leaf the floor is 1 ms of the link; under cake, which
	// hands HTB frames, as little as one frame.
	for _, c := range []struct {
		leaf       Leaf
		rate, link float64 // mbit
		want       uint32
	}{{LeafAQM, 0.1, 8, 4542}, {LeafAQM, 0.1, 80, 10000}, {LeafFrames, 0.1, 8, 1514}, {LeafFrames, 0.1, 10, 1514}, {LeafFrames, 0.1, 40, 5000}, {LeafFrames, 1, 1000, 67050}} {
		if q := QuantumFor(units.FromBits(c.rate*1e6), units.FromBits(c.link*1e6), c.leaf); q != c.want {
			t.Errorf("leaf %d: %vmbit in a %vmbit tree: quantum %d, want %d", c.leaf, c.rate, c.link, q, c.want)
		}
	}
	// At 20mbit the burst stays at two frames: a bulk class cannot push
	// more than about a millisecond of line time ahead of interactive.
	if b := BurstFor(2500000, policy.Egress); b > 3100 {
		t.Errorf("20mbit burst %d", b)
	}
	if b := BurstFor(12500000, policy.Ingress); b != 50000 {
		t.Errorf("100mbit ingress burst %d, want 4 ms (50000)", b)
	}
}

func load(t *testing.T, file string) *policy.Policy {
	t.Helper()
	p, _, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Golden plans: the planned objects for each example, on a kernel with
// every qdisc and on one with only fifos (this machine's).
func TestGoldenPlans(t *testing.T) {
	// Files the agent writes are these, whatever this machine's
	// /run/sluice holds: two pods on their veths (k8s-veths.yaml).
	state := t.TempDir()
	t.Setenv("SLUICE_STATE_DIR", state)
	os.MkdirAll(filepath.Join(state, "pods"), 0o755)
	os.WriteFile(filepath.Join(state, "pods", "veths.csv"), []byte("device,pod,ingress,egress\ncali1,shop.web,5mbit,\ncali2,shop.db,10mbit,2mbit\n"), 0o644)
	files, _ := filepath.Glob("../examples/*.yaml")
	fifoOnly := Features{BPF: true, Qdiscs: map[string]bool{"htb": true, "pfifo": true, "bfifo": true, "clsact": true}}
	for _, f := range files {
		for _, k := range []struct {
			name  string
			feats Features
		}{{"full", Everything}, {"fifo", fifoOnly}} {
			name := strings.TrimSuffix(filepath.Base(f), ".yaml") + "." + k.name
			t.Run(name, func(t *testing.T) {
				// A policy this kernel cannot carry (the EDT example without
				// fq) has its error as its golden plan.
				p, err := Build(load(t, f), k.feats, nil)
				var b strings.Builder
				if err != nil {
					fmt.Fprintln(&b, "error:", err)
				} else {
					for _, o := range p.Objects() {
						fmt.Fprintln(&b, o.Describe())
					}
				}
				golden := filepath.Join("testdata", name+".golden")
				if *update {
					os.WriteFile(golden, []byte(b.String()), 0o644)
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run go test ./plan -update)", err)
				}
				if b.String() != string(want) {
					t.Errorf("plan differs from %s (run go test ./plan -update and review the diff)", golden)
				}
			})
		}
	}
}

// Re-planning with the previous allocation keeps every id; adding a
// class in the middle changes no other class's id or filter prio.
func TestPlanStableIDs(t *testing.T) {
	src := func(extra string) string {
		return "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      default: bulk\n      classes:\n" +
			"        - name: a\n          rate: 1mbit\n          match: [{dport: 22}]\n" + extra +
			"        - name: b\n          rate: 1mbit\n          match: [{dport: 80}]\n" +
			"        - name: bulk\n          rate: 1mbit\n"
	}
	parse := func(s string) *policy.Policy {
		p, _, err := policy.Parse("p.yaml", []byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p1, err := Build(parse(src("")), Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	prev := map[string]*Alloc{"eth0": p1.Devices[0].Alloc}
	p2, err := Build(parse(src("        - name: x\n          rate: 1mbit\n          match: [{dport: 53}]\n")), Everything, prev)
	if err != nil {
		t.Fatal(err)
	}
	a1, a2 := p1.Devices[0].Alloc, p2.Devices[0].Alloc
	for _, n := range []string{"a", "b", "bulk"} {
		if a1.Classes[n] != a2.Classes[n] {
			t.Errorf("class %s: id %x -> %x", n, a1.Classes[n], a2.Classes[n])
		}
	}
	for k, v := range a1.Prios {
		if a2.Prios[k] != v {
			t.Errorf("prio %s: %d -> %d", k, v, a2.Prios[k])
		}
	}
	if !(a2.Prios["/a"] < a2.Prios["/x"] && a2.Prios["/x"] < a2.Prios["/b"]) {
		t.Errorf("x not between a and b: %v", a2.Prios)
	}
}

func TestExplicitLeafMissingIsRefused(t *testing.T) {
	p, _, err := policy.Parse("p.yaml", []byte("interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      default: a\n      classes:\n        - name: a\n          rate: 1mbit\n          leaf: fq_codel\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Build(p, Features{Qdiscs: map[string]bool{"bfifo": true}}, nil)
	if err == nil || !strings.Contains(err.Error(), "p.yaml:9:17: class a: leaf fq_codel: this kernel has no fq_codel qdisc") {
		t.Fatalf("error = %v", err)
	}
}

func TestMarkNeedsU32Mark(t *testing.T) {
	p, _, err := policy.Parse("p.yaml", []byte("interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      default: b\n      classes:\n        - name: a\n          rate: 1mbit\n          match: [{mark: 0x10/0xff}]\n        - name: b\n          rate: 1mbit\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Build(p, Features{Qdiscs: map[string]bool{"bfifo": true}}, nil); err == nil || !strings.Contains(err.Error(), "CONFIG_CLS_U32_MARK") {
		t.Fatalf("error = %v", err)
	}
	full, err := Build(p, Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	var marked int
	for _, o := range full.Objects() {
		if f, ok := o.(*tc.Filter); ok && f.U32 != nil && f.U32.Mark != nil && *f.U32.Mark == (tc.Mark{Val: 0x10, Mask: 0xff}) {
			marked++
		}
	}
	if marked != 1 {
		t.Errorf("%d marked nodes, want one (a mark-only rule matches any packet)", marked)
	}
}

// IPv6 prefixes become one key per 32-bit word they cover, at offsets 8
// (source) and 24 (destination); ports sit at 40 without a next-header
// link (IPv6 has no options to skip).
func TestIPv6Keys(t *testing.T) {
	m := &policy.Match{Dst: []netip.Prefix{netip.MustParsePrefix("2001:db8:100::/48")}, Proto: []uint8{17},
		Dport: []policy.PortRange{{Lo: 5060, Hi: 5061}}, Fields: map[string]policy.Pos{"dst": {}, "proto": {}, "dport": {}}}
	nodes := compileMatch(m)
	if len(nodes) != 1 || nodes[0].table != nil {
		t.Fatalf("nodes %+v", nodes)
	}
	want := []tc.Key{
		{Off: 0, Mask: 0xf0000000, Val: 0x60000000},
		{Off: 4, Mask: 0x0000ff00, Val: 0x00001100},
		{Off: 24, Mask: 0xffffffff, Val: 0x20010db8},
		{Off: 28, Mask: 0xffff0000, Val: 0x01000000},
		{Off: 40, Mask: 0x0000fffe, Val: 5060},
	}
	if fmt.Sprint(nodes[0].keys) != fmt.Sprint(want) {
		t.Fatalf("keys\n got %v\nwant %v", nodes[0].keys, want)
	}
	// The IPv4 counterpart links to a next-header table for the ports.
	m4 := &policy.Match{Dst: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Proto: []uint8{17},
		Dport: []policy.PortRange{{Lo: 5060, Hi: 5061}}, Fields: m.Fields}
	n4 := compileMatch(m4)
	if len(n4) != 1 || len(n4[0].table) != 1 || !n4[0].table[0][0].NextHdr {
		t.Fatalf("ipv4 nodes %+v", n4)
	}
}

// u32 hashes hosts on the byte that spreads them best: IPv6 subscribers
// numbered ::1 in a /64 each hash on their prefix, IPv4 hosts on their
// last byte; 5,000 of each fit (they did not when every IPv6 host hashed
// on its last byte, all into one bucket of at most 4,095).
func TestHostsHashOnTheBestByte(t *testing.T) {
	dir := t.TempDir()
	var csv strings.Builder
	csv.WriteString("name,addresses,rate,ceil\n")
	for i := range 5000 {
		fmt.Fprintf(&csv, "s%d,2001:db8:%x:%x::1 10.%d.%d.%d,,\n", i, i>>8, i&0xff, 64+i>>16, i>>8&0xff, i&0xff)
	}
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(csv.String()), 0o644)
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(`interfaces:
  - name: eth0
    egress:
      rate: 10gbit
      classifier: u32
      default: rest
      classes:
        - name: subs
          rate: 9gbit
          per_host: {by: dst, hosts_file: hosts.csv, leaf: none}
        - name: rest
          rate: 500mbit
`), 0o644)
	pol, _, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(pol, Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]string{}
	for _, o := range p.Objects() {
		if f, ok := o.(*tc.Filter); ok && f.U32 != nil && f.U32.Link != 0 {
			links[f.Note] = fmt.Sprintf("hoff %d hmask %#08x", f.U32.Sel.Hoff, f.U32.Sel.Hmask)
		}
	}
	if got := links["IPv4 hosts of subs by dst"]; got != "hoff 16 hmask 0x000000ff" {
		t.Errorf("IPv4 hosts hash on %s, want their last byte (hoff 16 hmask 0xff)", got)
	}
	if got := links["IPv6 hosts of subs by dst"]; got != "hoff 28 hmask 0x000000ff" {
		t.Errorf("IPv6 hosts hash on %s, want byte 8 of the address (hoff 28 hmask 0xff)", got)
	}
}

// On a kernel whose u32 ignores marks, a tree with classifier auto that
// matches marks is classified in BPF instead; classifier u32 is refused
// with the way out. The policy itself is left as it was.
func TestMarksGoToBPFWhereU32IgnoresThem(t *testing.T) {
	src := "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      default: b\n%s      classes:\n        - name: a\n          rate: 1mbit\n          match: [{mark: 0x10/0xff}]\n        - name: b\n          rate: 1mbit\n"
	noMark := Features{BPF: true, Qdiscs: map[string]bool{"bfifo": true}}
	p, _, err := policy.Parse("p.yaml", []byte(fmt.Sprintf(src, "")))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := Build(p, noMark, nil)
	if err != nil {
		t.Fatal(err)
	}
	hooks := 0
	for _, o := range pl.Objects() {
		switch x := o.(type) {
		case *bpf.Hook:
			hooks++
		case *tc.Filter:
			t.Errorf("a u32 filter in a tree classified in BPF: %s", x.Describe())
		}
	}
	if hooks != 1 || p.Interfaces[0].Egress.BPF {
		t.Errorf("%d BPF classifiers (want 1); the policy's tree changed: BPF %v", hooks, p.Interfaces[0].Egress.BPF)
	}
	p, _, err = policy.Parse("p.yaml", []byte(fmt.Sprintf(src, "      classifier: u32\n")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Build(p, noMark, nil); err == nil || !strings.Contains(err.Error(), "p.yaml:10:26: class a: mark: this kernel's u32 cannot match marks") || !strings.Contains(err.Error(), "classifier bpf") {
		t.Fatalf("classifier u32 with marks: %v", err)
	}
}

// A class's cburst holds its quantum (a turn at the parent's speed), an
// inner class's two, unless the policy sets it, and stays well within
// what HTB can hold at a slow ceil.
func TestCburstHoldsATurn(t *testing.T) {
	for _, c := range []struct {
		name                 string
		rate, ceil, parent   units.Rate
		quantum, cburst, got uint32
		set, inner           bool
	}{
		{"a 100mbit ceil and a 167625-byte turn", 6250000, 12500000, 125000000, 167625, 12500, 167625, false, false},
		{"a cburst above the turn stays", 62500000, 125000000, 125000000, 67050, 250000, 250000, false, false},
		{"the policy's cburst stays", 6250000, 12500000, 125000000, 167625, 12500, 12500, true, false},
		{"a slow ceil's is bounded", 50, 100, 125000000, 67050, 3028, 20000, false, false},
		{"a ceil at the parent's keeps its own", 5937500, 11875000, 11875000, 47500, 11875, 11875, false, false},
		{"an inner class's holds two turns", 125000, 187500, 625000, 18168, 3028, 36336, false, true},
		{"an inner class's is bounded too", 50, 100, 125000000, 67050, 3028, 20000, false, true},
		{"an inner class that cannot borrow holds one", 250000, 250000, 1250000, 50000, 3028, 50000, false, true},
	} {
		cl := &tc.Class{Rate: c.rate, Ceil: c.ceil, Quantum: c.quantum, Cburst: c.cburst}
		var set *policy.Size
		if c.set {
			set = &policy.Size{Bytes: uint64(c.cburst)}
		}
		turnBurst(cl, set, c.parent, c.inner)
		if cl.Cburst != c.got {
			t.Errorf("%s: cburst %d, want %d", c.name, cl.Cburst, c.got)
		}
	}
}

// An fq_codel leaf's target is a frame and a half at its class's rate,
// between fq_codel's 5 ms and a cake leaf's 20 ms; its interval ten
// targets, at least fq_codel's 100 ms. A leaf the plan builds carries
// them.
func TestCodelTimes(t *testing.T) {
	for _, c := range []struct {
		name             string
		rate             units.Rate // bytes/s
		target, interval uint32
	}{
		{"no rate: fq_codel's own", 0, 5000, 100000},
		{"100mbit: fq_codel's own", 12500000, 5000, 100000},
		{"3.7mbit: a frame and a half is under 5 ms", 462500, 5000, 100000},
		{"3mbit: 6.06 ms, whole ms up; interval fq_codel's", 375000, 7000, 100000},
		{"1mbit: 18.2 ms, ten of it the interval", 125000, 19000, 190000},
		{"250kbit: held at cake's 20 ms", 31250, 20000, 200000},
		{"1kbit: held at cake's 20 ms", 125, 20000, 200000},
	} {
		target, interval := CodelTimes(c.rate)
		if target != c.target || interval != c.interval {
			t.Errorf("%s: target %d interval %d µs, want %d and %d", c.name, target, interval, c.target, c.interval)
		}
	}
	p, _, err := policy.Parse("p.yaml", []byte(`interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      leaf: fq_codel
      default: b
      classes:
        - {name: a, rate: 19mbit}
        - {name: b, rate: 1mbit}
`))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := Build(p, Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, o := range pl.Objects() {
		if q, ok := o.(*tc.Qdisc); ok && q.FqCodel != nil {
			got[q.Owner] = q.Describe()
		}
	}
	for class, want := range map[string]string{"a": "target 5ms interval 100ms", "b": "target 19ms interval 190ms"} {
		if !strings.Contains(got[class], want) {
			t.Errorf("class %s's leaf: %q, want %q in it", class, got[class], want)
		}
	}
}

// classid pins a class's id (an import keeps the old tool's); a class
// that held it before is numbered anew; ids are checked where written.
func TestClassIDPins(t *testing.T) {
	src := func(www, dfl string) string {
		return "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n      default: dfl\n      classes:\n" +
			"        - {name: smtp, rate: 3mbit, match: [{dport: 25}]}\n" +
			"        - {name: www, " + www + "rate: 3mbit, match: [{dport: 80}]}\n" +
			"        - {name: dfl, " + dfl + "rate: 1mbit}\n"
	}
	build := func(s string, prev map[string]*Alloc) (*Plan, error) {
		p, _, err := policy.Parse("p.yaml", []byte(s))
		if err != nil {
			return nil, err
		}
		return Build(p, Everything, prev)
	}
	p1, err := build(src("", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := p1.Devices[0].Alloc.Classes; a["smtp"] != 0x10 || a["www"] != 0x11 {
		t.Fatalf("unpinned: %v", a)
	}
	// www takes smtp's 1:10; smtp moves; dfl keeps 1:30.
	p2, err := build(src(`classid: "1:10", `, `classid: "1:30", `), map[string]*Alloc{"eth0": p1.Devices[0].Alloc})
	if err != nil {
		t.Fatal(err)
	}
	a := p2.Devices[0].Alloc.Classes
	if a["www"] != 0x10 || a["dfl"] != 0x30 || a["smtp"] == 0x10 || a["smtp"] == 0x30 || a["smtp"] == 0 {
		t.Fatalf("pinned: %v", a)
	}
	for _, o := range p2.Objects() {
		if q, ok := o.(*tc.Qdisc); ok && q.Parent == tc.HandleRoot && q.HTB.Default != 0x30 {
			t.Errorf("the root's default is %x, want 30", q.HTB.Default)
		}
	}
	for _, c := range []struct{ www, dfl, want string }{
		{`classid: "1:10", `, `classid: "1:10", `, `p.yaml:9:32: eth0 egress: class dfl: classid 1:10 is class www's already (line 8)`},
		{`classid: "2:10", `, ``, `classid: "2:10": write it as tc does, 1:MINOR`},
		{`classid: "1:1", `, ``, `the minor must be from 10 to 7fff`},
		{`classid: "1:zz", `, ``, `the minor "zz" is not hex`},
	} {
		if _, err := build(src(c.www, c.dfl), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: error %v, want %q", c.www, c.dfl, err, c.want)
		}
	}
}

// Every leaf class says what holds its packets, `leaf: none` (HTB's own
// fifo) included: stats and conformance count leaves by it, and a
// class of none once counted as an inner class (conformance: "landed in
// no class").
func TestClassInfoNamesEveryLeaf(t *testing.T) {
	p := parseEDT(t, `interfaces:
  - name: eth0
    egress:
      rate: 10mbit
      leaf: pfifo
      default: bulk
      classes:
        - name: voip
          rate: 2mbit
          leaf: none
          match: [{proto: udp, dport: 5060}]
        - name: users
          rate: 2mbit
          classes:
            - name: bulk
              rate: 1mbit
            - name: subs
              rate: 1mbit
              per_host: {by: dst, cidr: 10.0.0.0/30, rate: 100kbit, leaf: none}
`)
	pl, err := Build(p, Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, ci := range pl.Devices[0].Classes {
		got[ci.Name] = ci.Leaf
	}
	want := map[string]string{"voip": "none", "users": "", "bulk": "pfifo", "subs": "", "subs/10.0.0.1": "none", "subs/10.0.0.2": "none"}
	for name, leaf := range want {
		if l, ok := got[name]; !ok || l != leaf {
			t.Errorf("class %s: leaf %q (listed %v), want %q", name, l, ok, leaf)
		}
	}
}
