package e2e

import (
	"fmt"
	"math/rand"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sluice/kernel"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
	"sluice/testutil"
)

// A policy using every kind of rule: lists, ranges, negations, both IP
// families, tcp_ack, tcp_syn, tos and dscp, per-host hashing in one and two levels
// (IPv4 by dst, IPv6 /64s by src), a grouping class whose children's
// rules join the root's, and a gating class with a default child.
const everyRule = `interfaces:
  - name: veth0
    egress:
      rate: 1gbit
      default: other
      classes:
        - name: ssh
          rate: 10mbit
          match: [{dport: 22}]
        - name: voip
          rate: 10mbit
          match:
            - {proto: udp, dport: 10000-20000, dscp: EF}
            - {dscp: CS5, src: 10.1.0.0/16}
        - name: acks
          rate: 10mbit
          match: [{tcp_ack: true}]
        - name: syns
          rate: 10mbit
          match: [{tcp_syn: true}]
        - name: lowdelay
          rate: 10mbit
          match: [{tos: minimize-delay}]
        - name: web6
          rate: 10mbit
          match:
            - {dst: "2001:db8:1::/48", proto: tcp, dport: [80, 443]}
            - {proto: tcp, sport: 8000-8999}
        - name: outside
          rate: 10mbit
          match: [{not_dst: 10.0.0.0/8, not_src: 192.168.0.0/16, proto: udp}]
        - name: users
          rate: 10mbit
          per_host: {by: dst, cidr: 10.2.0.0/23}
        - name: users6
          rate: 10mbit
          per_host: {by: src, cidr: "2001:db8:9::/56", prefix: 64}
        - name: group
          rate: 10mbit
          classes:
            - name: g-dns
              rate: 5mbit
              match: [{proto: udp, sport: 53}]
            - name: g-rest
              rate: 5mbit
        - name: gate
          rate: 10mbit
          match: [{src: 10.3.0.0/16}]
          default: gate-rest
          classes:
            - name: gate-icmp
              rate: 5mbit
              match: [{proto: icmp}]
            - name: gate-rest
              rate: 5mbit
        - name: other
          rate: 10mbit
`

// reference classifies a packet by reading the policy's meaning directly
// (docs/policy.md), independently of the u32 compiler.
func reference(t *policy.Tree, p *testutil.Packet) string {
	if c := refBlock(t.Classes, p); c != "" {
		return c
	}
	return t.Default
}

func refBlock(cs []*policy.Class, p *testutil.Packet) string {
	for _, c := range cs {
		switch {
		case len(c.Match) > 0 || c.PerHost != nil:
			if !refClassMatches(c, p) {
				continue
			}
			if ph := c.PerHost; ph != nil {
				a := p.Dst
				if ph.By == "src" {
					a = p.Src
				}
				for _, h := range ph.Hosts() {
					if h.Contains(a) {
						return c.Name + "/" + hostLabel(h)
					}
				}
				return "" // an address of the cidr without a class: default
			}
			if len(c.Classes) > 0 {
				if r := refBlock(c.Classes, p); r != "" {
					return r
				}
				if c.Default != "" {
					return c.Default
				}
				return ""
			}
			return c.Name
		case len(c.Classes) > 0:
			if r := refBlock(c.Classes, p); r != "" {
				return r
			}
		}
	}
	return ""
}

func hostLabel(h netip.Prefix) string {
	if h.Bits() == h.Addr().BitLen() {
		return h.Addr().String()
	}
	return h.String()
}

func refClassMatches(c *policy.Class, p *testutil.Packet) bool {
	if ph := c.PerHost; ph != nil {
		a := p.Dst
		if ph.By == "src" {
			a = p.Src
		}
		if !ph.CIDR.Contains(a) {
			return false
		}
		if len(c.Match) == 0 {
			return true
		}
	}
	for _, m := range c.Match {
		if refEntry(m, p) {
			return true
		}
	}
	return false
}

func anyContains(ps []netip.Prefix, a netip.Addr) bool {
	for _, pf := range ps {
		if pf.Contains(a) {
			return true
		}
	}
	return false
}

func inRanges(rs []policy.PortRange, v uint16) bool {
	for _, r := range rs {
		if v >= r.Lo && v <= r.Hi {
			return true
		}
	}
	return false
}

func refEntry(m *policy.Match, p *testutil.Packet) bool {
	if len(m.Src) > 0 && !anyContains(m.Src, p.Src) || anyContains(m.NotSrc, p.Src) {
		return false
	}
	if len(m.Dst) > 0 && !anyContains(m.Dst, p.Dst) || anyContains(m.NotDst, p.Dst) {
		return false
	}
	// The transport is visible only in the first IPv4 fragment and in
	// IPv6 packets without extension headers.
	l4 := !(p.V6() && p.ExtHeader) && p.FragOffset == 0
	proto := int(p.Proto)
	if p.V6() && p.ExtHeader {
		proto = 60
	}
	if len(m.Proto) > 0 {
		ok := false
		for _, x := range m.Proto {
			ok = ok || int(x) == proto
		}
		if !ok {
			return false
		}
	}
	if len(m.Sport) > 0 || len(m.Dport) > 0 {
		if !l4 || proto != 6 && proto != 17 && proto != 132 && proto != 33 && proto != 136 {
			return false
		}
		if len(m.Sport) > 0 && !inRanges(m.Sport, p.Sport) || len(m.Dport) > 0 && !inRanges(m.Dport, p.Dport) {
			return false
		}
	}
	if len(m.DSCP) > 0 {
		ok := false
		for _, d := range m.DSCP {
			ok = ok || d == p.TOS>>2
		}
		if !ok {
			return false
		}
	}
	if m.TOS != nil && p.TOS&m.TOS.Mask != m.TOS.Val {
		return false
	}
	if m.TCPAck && !(l4 && proto == 6 && p.TCPFlags&0x3f == 0x10 && p.IPLength() < 128) {
		return false
	}
	if m.TCPSyn && !(l4 && proto == 6 && p.TCPFlags&0x02 != 0) {
		return false
	}
	return true
}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.Intn(len(xs))] }

func randomPacket(r *rand.Rand) *testutil.Packet {
	p := &testutil.Packet{}
	if r.Intn(3) == 0 {
		v6 := []string{"2001:db8:1::5", "2001:db8:1:ff::1", "2001:db8:2::1", "2001:db8:9::1", "2001:db8:9:7::2",
			"2001:db8:9:ff::9", "2001:db8:a::1", "fe80::1", "2001:db8:9:100::1", "2001:db8:100::7", "2001:db8:2ff::1", "2001:db8:300::1"}
		p.Src, p.Dst = netip.MustParseAddr(pick(r, v6)), netip.MustParseAddr(pick(r, v6))
		p.Proto = pick(r, []uint8{6, 6, 17, 17, 58, 47})
		p.ExtHeader = r.Intn(6) == 0
	} else {
		v4 := []string{"10.1.2.3", "10.1.255.1", "10.2.0.0", "10.2.0.1", "10.2.0.255", "10.2.1.0", "10.2.1.77", "10.2.1.255",
			"10.2.2.1", "10.3.0.9", "10.9.9.9", "192.168.1.1", "192.168.255.2", "8.8.8.8", "172.16.0.1", "11.0.0.1"}
		p.Src, p.Dst = netip.MustParseAddr(pick(r, v4)), netip.MustParseAddr(pick(r, v4))
		p.Proto = pick(r, []uint8{6, 6, 17, 17, 1, 47})
		if r.Intn(4) == 0 {
			p.IPOptions = 4 * (1 + r.Intn(10))
		}
		switch r.Intn(8) {
		case 0:
			p.FragOffset = 1 + r.Intn(100)
		case 1:
			p.MoreFrags = true
		}
	}
	ports := []uint16{22, 53, 80, 443, 5060, 7999, 8000, 8500, 8999, 9000, 9999, 10000, 15000, 20000, 20001, uint16(r.Intn(65536))}
	p.Sport, p.Dport = pick(r, ports), pick(r, ports)
	p.TOS = pick(r, []uint8{0, 0xb8, 0xb9, 0xa0, 0x10, 0x14, 0x11, 0x12, uint8(r.Intn(256))})
	p.TCPFlags = pick(r, []uint8{0x10, 0x10, 0x18, 0x02, 0x12, 0x50, 0x11})
	p.Payload = pick(r, []int{0, 0, 10, 40, 70, 100, 600})
	return p
}

func describePacket(p *testutil.Packet) string {
	s := fmt.Sprintf("%v -> %v proto %d sport %d dport %d tos %#x flags %#x iplen %d", p.Src, p.Dst, p.Proto, p.Sport, p.Dport, p.TOS, p.TCPFlags, p.IPLength())
	if p.IPOptions > 0 {
		s += fmt.Sprintf(" ipopts %d", p.IPOptions)
	}
	if p.FragOffset > 0 || p.MoreFrags {
		s += fmt.Sprintf(" frag %d mf %v", p.FragOffset, p.MoreFrags)
	}
	if p.ExtHeader {
		s += " exthdr"
	}
	return s
}

// Crafted packets of every shape, injected at the shaped device's egress,
// land in the class the policy's meaning gives them: proof on the real
// kernel of the u32 offsets (IPv4 options, fragments, IPv6 extension
// headers), ranges, negations and hash tables.
func TestCraftedPacketsLandInTheirClass(t *testing.T) {
	light(t)
	for _, c := range []string{"u32", "bpf"} {
		t.Run(c, func(t *testing.T) {
			craftedPackets(t, c, everyRule, []string{"ssh", "voip", "acks", "syns", "lowdelay", "web6", "outside", "users", "users6", "g-dns", "gate-icmp", "gate-rest", "other"})
		})
	}
}

// craftedPackets applies policyText (its device veth0) with classifier and
// sends random packets through it, each checked against the policy's
// own reading of its rules; every class in want must see some.
func craftedPackets(t *testing.T, classifier, policyText string, want []string) {
	testutil.RequireRoot(t)
	bed := newImportBed(t, "a") // veth0 without addresses, a packet socket on it
	a := bed.ns
	polFile := writePolicy(t, "every.yaml", strings.Replace(policyText, "egress:\n", "egress:\n      classifier: "+classifier+"\n", 1))
	must(t, "--netns", a, "apply", "-q", polFile)
	pol, _, err := policy.Load(polFile)
	if err != nil {
		t.Fatal(err)
	}
	tree := pol.Interfaces[0].Egress

	// The records of the apply above, read from its state directory
	// (not the process's environment: tests that run at once share it).
	recs, err := records.Load(records.DirIn(stateDir(t), a))
	if err != nil {
		t.Fatal(err)
	}
	names := map[tc.Handle]string{}
	for _, c := range recs.Devices["veth0"].Classes {
		names[c.Handle] = c.Name
	}
	k, err := kernel.OpenBare(a)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	// veth has a transmit queue per CPU: a BPF tree may be sharded.
	qs, err := k.Qdiscs("veth0")
	if err != nil {
		t.Fatal(err)
	}
	counts := func() map[string]uint64 {
		var cls []*tc.Class
		for _, q := range kernel.TreeQdiscs(qs) {
			cs, err := k.Classes("veth0", q.Handle)
			if err != nil {
				t.Fatal(err)
			}
			cls = append(cls, cs...)
		}
		out := map[string]uint64{}
		for _, c := range cls {
			if c.Level == 0 && c.Stats != nil {
				out[names[c.Handle]] += c.Stats.Packets // copies of a class in shards add up
			}
		}
		return out
	}
	fd, addr := bed.fd, &bed.addr
	r := rand.New(rand.NewSource(7))
	seen := map[string]int{}
	last := counts()
	const n = 2000
	for i := 0; i < n; i++ {
		p := randomPacket(r)
		wantClass := reference(tree, p)
		if err := unix.Sendto(fd, p.Frame(), 0, addr); err != nil {
			if err == syscall.ENOBUFS {
				time.Sleep(10 * time.Millisecond)
				i--
				continue
			}
			t.Fatal(err)
		}
		var got string
		for try := 0; try < 100 && got == ""; try++ {
			now := counts()
			for name, c := range now {
				if c != last[name] {
					if got != "" {
						t.Fatalf("packet %d went to two classes", i)
					}
					got = name
				}
			}
			last = now
			if got == "" {
				time.Sleep(time.Millisecond)
			}
		}
		if got != wantClass {
			t.Fatalf("packet %d (%s): kernel put it in %q, the policy says %q", i, describePacket(p), got, wantClass)
		}
		seen[strings.Split(wantClass, "/")[0]]++
	}
	for _, c := range want {
		if seen[c] == 0 {
			t.Errorf("no packet exercised class %s (seen %v)", c, seen)
		}
	}
	t.Logf("%d packets, per class %v", n, seen)
}
