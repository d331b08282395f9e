package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/bpf"
	"sluice/bpf/bpftest"
	"sluice/plan"
	"sluice/policy"
	"sluice/tc"
	"sluice/testutil"
)

// bpfHookOf plans pol and returns the first device's BPF classifier.
func bpfHookOf(t *testing.T, pol *policy.Policy) (*plan.Device, *bpf.Hook) {
	t.Helper()
	p, err := plan.Build(pol, plan.Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := p.Devices[0]
	for _, o := range d.Objects {
		if h, ok := o.(*bpf.Hook); ok {
			return d, h
		}
	}
	t.Fatal("the plan has no bpf classifier")
	return nil, nil
}

// vlanTagged inserts n 802.1Q/802.1ad tags after the MAC addresses.
func vlanTagged(f []byte, n int) []byte {
	out := append([]byte{}, f[:12]...)
	for i := 0; i < n; i++ {
		tpid := []byte{0x81, 0x00}
		if i == 0 && n == 2 {
			tpid = []byte{0x88, 0xa8}
		}
		out = append(out, tpid[0], tpid[1], 0x00, byte(10+i))
	}
	return append(out, f[12:]...)
}

// The BPF classifier, run through BPF_PROG_TEST_RUN on many more packets
// than the kernel test can inject, gives every packet the class the
// policy's meaning gives it (reference), also behind VLAN tags; a
// truncated packet gets its class or the default, never another.
func TestBPFClassifierMatchesPolicy(t *testing.T) {
	testutil.RequireRoot(t)
	src := strings.Replace(everyRule, "egress:\n", "egress:\n      classifier: bpf\n", 1)
	pol, _, err := policy.Parse("every.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	tree := pol.Interfaces[0].Egress
	dev, hook := bpfHookOf(t, pol)
	byName := map[string]uint32{}
	for _, c := range dev.Classes {
		byName[c.Name] = uint32(c.Handle)
	}
	prog, err := bpftest.Writable(bpf.Load(hook.Content))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	r := rand.New(rand.NewSource(11))
	n := 30000
	if testing.Short() {
		n = 5000
	}
	seen := map[string]int{}
	truncated := 0
	for i := 0; i < n; i++ {
		p := randomPacket(r)
		want := reference(tree, p)
		frame := p.Frame()
		tags := r.Intn(6)
		if tags <= 2 && tags > 0 {
			frame = vlanTagged(frame, tags)
		} else {
			tags = 0
		}
		cut := r.Intn(8) == 0
		if cut {
			// The kernel's test run refuses an untagged frame shorter
			// than the fixed IP header; behind a tag any cut is allowed.
			lo := 14 + 4*tags
			if tags == 0 {
				lo += 20
				if p.V6() {
					lo += 20
				}
			}
			if lo < len(frame) {
				frame = frame[:lo+r.Intn(len(frame)-lo)]
			}
		}
		res, err := prog.Run(bpf.Packet{Frame: frame})
		if err != nil {
			t.Fatalf("packet %d (%d bytes): %v", i, len(frame), err)
		}
		if res.Verdict != bpf.VerdictOK {
			t.Fatalf("packet %d (%s): verdict %d, want TC_ACT_OK", i, describePacket(p), res.Verdict)
		}
		switch {
		case res.Priority == byName[want]:
		case cut && res.Priority == byName[tree.Default]:
			truncated++
		default:
			t.Fatalf("packet %d (%s, %d bytes, cut %v): BPF gave class %s, the policy says %s (%s)", i, describePacket(p), len(frame), cut,
				tc.Handle(res.Priority), tc.Handle(byName[want]), want)
		}
		seen[strings.Split(want, "/")[0]]++
	}
	// Not IP at all: an ARP frame goes to the default class.
	arp := make([]byte, 42)
	arp[12], arp[13] = 0x08, 0x06
	if res, err := prog.Run(bpf.Packet{Frame: arp}); err != nil || res.Priority != byName[tree.Default] {
		t.Errorf("ARP: class %s, err %v; want the default %s", tc.Handle(res.Priority), err, tree.Default)
	}
	for _, c := range []string{"ssh", "voip", "acks", "syns", "lowdelay", "web6", "outside", "users", "users6", "g-dns", "gate-icmp", "gate-rest", "other"} {
		if seen[c] == 0 {
			t.Errorf("no packet exercised class %s", c)
		}
	}
	counts, err := prog.Counts([]uint32{uint32(tc.Handle(byName["ssh"]).Minor())})
	if err != nil || counts[uint32(tc.Handle(byName["ssh"]).Minor())].Packets == 0 {
		t.Errorf("the per-class counter of ssh stayed at zero (%v, %v)", counts, err)
	}
	t.Logf("%d packets (%d truncated ones to the default), per class %v", n, truncated, seen)
}

// Marks, hosts_file hosts (with unknown addresses falling through to
// later rules) and a parent column.
func TestBPFHostsFileAndMark(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	csv := "name,addresses,rate,ceil,parent\nalice,10.5.0.1 2001:db8:5::/64,2mbit,10mbit,\nbob,10.5.0.2,1mbit,,gold\ncarol,10.6.0.0/24,,,\n"
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(csv), 0o644)
	src := `interfaces:
  - name: veth0
    egress:
      rate: 100mbit
      classifier: bpf
      default: rest
      classes:
        - name: marked
          rate: 10mbit
          match: [{mark: "0x10/0xf0"}]
        - name: subs
          rate: 50mbit
          per_host: {by: dst, hosts_file: hosts.csv, rate: 1mbit, ceil: 50mbit}
        - name: gold
          rate: 10mbit
        - name: to10
          rate: 10mbit
          match: [{dst: 10.0.0.0/8}]
        - name: rest
          rate: 10mbit
`
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(src), 0o644)
	pol, _, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	dev, hook := bpfHookOf(t, pol)
	cls := map[string]plan.ClassInfo{}
	for _, c := range dev.Classes {
		cls[c.Name] = c
	}
	if cls["subs/bob"].Parent != cls["gold"].Handle || cls["subs/alice"].Parent != cls["subs"].Handle {
		t.Fatalf("parents: bob under %s (gold is %s), alice under %s", cls["subs/bob"].Parent, cls["gold"].Handle, cls["subs/alice"].Parent)
	}
	if cls["subs/alice"].Rate != 2e6/8 || cls["subs/alice"].Ceil != 10e6/8 || cls["subs/bob"].Ceil != 50e6/8 || cls["subs/carol"].Rate != 1e6/8 {
		t.Errorf("host rates: alice %d/%d bob %d/%d carol %d", cls["subs/alice"].Rate, cls["subs/alice"].Ceil, cls["subs/bob"].Rate, cls["subs/bob"].Ceil, cls["subs/carol"].Rate)
	}
	prog, err := bpftest.Writable(bpf.Load(hook.Content))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for _, c := range []struct {
		dst  string
		mark uint32
		want string
	}{
		{"10.5.0.1", 0, "subs/alice"},
		{"2001:db8:5::77", 0, "subs/alice"},
		{"10.5.0.2", 0, "subs/bob"},
		{"10.6.0.200", 0, "subs/carol"},
		{"10.5.0.3", 0, "to10"},      // unknown host: falls through to later rules
		{"192.0.2.1", 0, "rest"},     // nothing matches
		{"10.5.0.1", 0x15, "marked"}, // the mark rule comes first
		{"10.5.0.1", 0x25, "subs/alice"},
	} {
		pk := &testutil.Packet{Src: mustAddr("10.9.9.9"), Dst: mustAddr(c.dst), Proto: 17, Sport: 1, Dport: 2}
		if strings.Contains(c.dst, ":") {
			pk.Src = mustAddr("2001:db8::9")
		}
		res, err := prog.Run(bpf.Packet{Frame: pk.Frame(), Mark: c.mark})
		if err != nil {
			t.Fatal(err)
		}
		if res.Priority != uint32(cls[c.want].Handle) {
			t.Errorf("dst %s mark %#x: class %s, want %s (%s)", c.dst, c.mark, tc.Handle(res.Priority), cls[c.want].Handle, c.want)
		}
	}

	// Bad hosts files are reported at their own line and column.
	for _, bad := range []struct{ csv, want string }{
		{"name,addresses,rate\nx,10.0.0.1,1mbit\n", "hosts.csv:1:1: hosts file: header"},
		{"name,addresses,rate,ceil\nx,10.0.0.300,1mbit,\n", "hosts.csv:2:3: hosts file: host x: bad address"},
		{"name,addresses,rate,ceil\nx,10.0.0.1,fast,\n", "hosts.csv:2:12: hosts file: host x: rate"},
		{"name,addresses,rate,ceil\nx,10.0.0.1,,\ny,10.0.0.1,,\n", "already listed on line 2"},
		{"name,addresses,rate,ceil,parent\nx,10.0.0.1,,,nope\n", "parent class \"nope\" does not exist"},
		{"name,addresses,rate,ceil,parent\nx,10.0.0.1,,,to10\n", "must be a plain class"},
	} {
		os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(bad.csv), 0o644)
		_, _, err := policy.Load(file)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("hosts file %q: error %v, want one containing %q", bad.csv, err, bad.want)
		}
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// Policing without a tree on an interface's ingress (no ifb): twice the
// rate offered, the committed rate passes; show reports the colours, and
// reset removes the program.
func TestBPFIngressPolicer(t *testing.T) {
	testutil.Slow(t)
	light(t)
	p := testutil.NewPair(t)
	file := writePolicy(t, "p.yaml", policyFor(p.DevA, "    ingress:\n      police: {cir: 20mbit, cbs: 30kb}\n"))
	out := must(t, "--netns", p.A, "plan", "--tc", file)
	if !strings.Contains(out, "bpf classifier veth0 ingress") || strings.Contains(out, "ifb") {
		t.Fatalf("plan:\n%s", out)
	}
	must(t, "--netns", p.A, "apply", "-q", file)
	if out := must(t, "--netns", p.A, "plan", file); !strings.Contains(out, "no changes") {
		t.Fatalf("apply is not idempotent:\n%s", out)
	}
	// 40 Mbit/s of UDP offered: the policer passes its committed rate.
	testutil.IperfServer(t, p.A, testutil.AddrA, 5201)
	r, err := testutil.Iperf(p.B, testutil.AddrA, 5201, 1, 4, "-u", "-b", "40M", "-l", "1400")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("40 Mbit/s of UDP through a 20mbit policer: %.2f Mbit/s arrive", r.Goodput/1e6)
	// 1400-byte payloads in 1470-byte frames: the payload share of 20mbit is 0.95.
	if r.Goodput < 0.9*20e6 || r.Goodput > 1.01*20e6 {
		t.Errorf("%.2f Mbit/s passed a 20mbit policer", r.Goodput/1e6)
	}
	var sample struct {
		Trees []struct {
			Device, Direction, Classifier string
			Policers                      []struct {
				Class              string
				Green, Yellow, Red struct{ Packets, Bytes uint64 }
			}
		}
	}
	if err := json.Unmarshal([]byte(must(t, "--netns", p.A, "show", "--json", "--interval", "0")), &sample); err != nil {
		t.Fatal(err)
	}
	if len(sample.Trees) != 1 || len(sample.Trees[0].Policers) != 1 {
		t.Fatalf("show: %+v", sample)
	}
	pol := sample.Trees[0].Policers[0]
	if sample.Trees[0].Classifier != "bpf" || pol.Green.Packets == 0 || pol.Red.Packets == 0 || pol.Yellow.Packets != 0 {
		t.Errorf("policer colours: %+v", pol)
	}
	must(t, "--netns", p.A, "reset", p.DevA)
	if q := testutil.NS(t, p.A, "tc", "qdisc", "show", "dev", p.DevA); strings.Contains(q, "clsact") {
		t.Errorf("reset left the clsact: %s", q)
	}
}

// With hosts in a hosts_file, changing one host's rate and another's
// address is one class change and a map update: no other object is
// touched.
func TestBPFOneHostChange(t *testing.T) {
	testutil.RequireRoot(t)
	ns := devNS(t, "veth0")
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("name,addresses,rate,ceil\n")
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&b, "h%d,10.7.%d.%d,1mbit,20mbit\n", i, i/250, i%250+1)
	}
	hosts := filepath.Join(dir, "hosts.csv")
	os.WriteFile(hosts, []byte(b.String()), 0o644)
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(`interfaces:
  - name: veth0
    egress:
      rate: 1gbit
      default: rest
      classes:
        - name: subs
          rate: 500mbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 100mbit
`), 0o644)
	must(t, "--netns", ns, "apply", "-q", file)
	edited := strings.Replace(b.String(), "h7,10.7.0.8,1mbit", "h7,10.7.0.8,3mbit", 1)
	edited = strings.Replace(edited, "h9,10.7.0.10,", "h9,10.7.9.10,", 1)
	os.WriteFile(hosts, []byte(edited), 0o644)
	out := must(t, "--netns", ns, "plan", "--tc", file)
	// h7's class changes, and its leaf with it where the leaf's options
	// follow the rate (a bfifo's limit, two of its quanta; an fq_codel's
	// target); the program's maps change; nothing else.
	changes := 0
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "~") {
			continue
		}
		changes++
		if !strings.Contains(l, "# subs/h7") && !strings.Contains(l, "# leaf of subs/h7") && !strings.Contains(l, "bpf classifier") {
			t.Errorf("a change beside h7's and the map's: %s", l)
		}
	}
	if !strings.Contains(out, fmt.Sprintf("plan: 0 to add, %d to change, 0 to replace, 0 to delete", changes)) ||
		changes < 2 || changes > 3 || !strings.Contains(out, "maps: hosts +1 -1 ~0") || !strings.Contains(out, "# subs/h7") {
		t.Fatalf("plan for a one-host change:\n%s", out)
	}
	must(t, "--netns", ns, "apply", "-q", file)
	if out := must(t, "--netns", ns, "plan", file); !strings.Contains(out, "no changes") {
		t.Fatalf("after the change:\n%s", out)
	}
}
