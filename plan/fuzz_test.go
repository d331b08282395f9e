package plan

import (
	"fmt"
	"strings"
	"testing"

	"sluice/policy"
	"sluice/tc"
)

// byteSource hands out choices from fuzz input, then zeros.
type byteSource struct{ b []byte }

func (s *byteSource) next(n int) int {
	if len(s.b) == 0 || n <= 0 {
		return 0
	}
	v := int(s.b[0]) % n
	s.b = s.b[1:]
	return v
}

func (s *byteSource) pick(xs ...string) string { return xs[s.next(len(xs))] }

// fuzzPolicy writes a u32 policy whose rules the input chooses.
func fuzzPolicy(data []byte) string {
	s := &byteSource{b: data}
	var b strings.Builder
	b.WriteString("interfaces:\n  - name: eth0\n    egress:\n      rate: 1gbit\n      classifier: u32\n      default: rest\n      classes:\n")
	n := 1 + s.next(6)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "        - name: c%d\n          rate: 1mbit\n", i)
		if s.next(4) == 0 {
			cidr := s.pick("10.1.0.0/24", "10.2.0.0/28", "2001:db8:1::/120", "2001:db8:2::/56", "10.3.0.0/22")
			prefix := ""
			if strings.HasSuffix(cidr, "/56") {
				prefix = ", prefix: 64"
			}
			fmt.Fprintf(&b, "          per_host: {by: %s, cidr: %q%s}\n", s.pick("src", "dst"), cidr, prefix)
		}
		entries := s.next(4)
		if entries == 0 {
			continue
		}
		b.WriteString("          match:\n")
		for e := 0; e < entries; e++ {
			var fields []string
			for f := 0; f < 1+s.next(4); f++ {
				switch s.next(11) {
				case 0:
					fields = append(fields, "src: "+s.pick("10.0.0.0/8", "192.168.1.0/24", "10.9.9.9", `"2001:db8::/32"`, "[10.1.0.0/16, 172.16.0.0/12]"))
				case 1:
					fields = append(fields, "dst: "+s.pick("10.0.0.0/8", "192.168.1.7", `"2001:db8:5::/48"`, `["::1", "fe80::/10"]`))
				case 2:
					fields = append(fields, "not_src: "+s.pick("10.5.0.0/16", "192.168.0.0/16", `"2001:db8:7::/64"`))
				case 3:
					fields = append(fields, "not_dst: "+s.pick("10.6.0.0/16", "172.16.0.0/12"))
				case 4:
					fields = append(fields, "dport: "+s.pick("22", "1000-2000", "[80, 443, 8000-8999]", "0-65535", "5060-5061"))
				case 5:
					fields = append(fields, "sport: "+s.pick("53", "1024-65535", "[123, 161]"))
				case 6:
					fields = append(fields, "proto: "+s.pick("tcp", "udp", "icmp", "icmpv6", "[tcp, udp]", "47", "sctp"))
				case 7:
					fields = append(fields, "dscp: "+s.pick("EF", "[AF41, CS1]", "0"))
				case 8:
					fields = append(fields, "tos: "+s.pick("minimize-delay", "0x10/0x1e"))
				case 9:
					fields = append(fields, "tcp_ack: true")
				case 10:
					fields = append(fields, "mark: "+s.pick("1", "0x10/0xf0"))
				}
			}
			fmt.Fprintf(&b, "            - {%s}\n", strings.Join(fields, ", "))
		}
	}
	b.WriteString("        - name: rest\n          rate: 1mbit\n")
	return b.String()
}

// FuzzU32Compile: whatever rules a policy combines, the u32 compiler
// either refuses them with a located error or emits filters the kernel
// can take: keys on word boundaries, links and hashes into tables that
// exist, class ids that exist, unique handles; the same plan twice; a
// re-plan from its own allocation changes nothing.
func FuzzU32Compile(f *testing.F) {
	for _, seed := range []string{"", "\x01\x02\x03\x04\x05\x06\x07\x08", "\x05\x00\x03\x03\x04\x02\x09\x0a", "\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8\xf7"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src := fuzzPolicy(data)
		pol, _, err := policy.Parse("f.yaml", []byte(src))
		if err != nil {
			return // refused at validate, with positions (policy's own fuzzing)
		}
		p, err := Build(pol, Everything, nil)
		if err != nil {
			if !strings.Contains(err.Error(), "f.yaml:") {
				t.Fatalf("refusal without a position: %v\n%s", err, src)
			}
			return
		}
		checkU32Plan(t, p, src)
		again, err := Build(pol, Everything, nil)
		if err != nil || describeAll(again) != describeAll(p) {
			t.Fatalf("two builds differ\n%s", src)
		}
		prev := map[string]*Alloc{}
		for _, d := range p.Devices {
			prev[d.Name] = d.Alloc
		}
		replan, err := Build(pol, Everything, prev)
		if err != nil || describeAll(replan) != describeAll(p) {
			t.Fatalf("a re-plan from the plan's own ids differs\n%s", src)
		}
	})
}

func describeAll(p *Plan) string {
	var b strings.Builder
	for _, o := range p.Objects() {
		b.WriteString(o.Describe())
		b.WriteByte('\n')
	}
	return b.String()
}

func checkU32Plan(t *testing.T, p *Plan, src string) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\npolicy:\n%s", append(args, src)...)
	}
	keys := map[string]bool{}
	classes := map[tc.Handle]bool{}
	tables := map[string]uint32{} // parent/prio/table id -> divisor
	tk := func(f *tc.Filter, id uint32) string { return fmt.Sprintf("%s/%d/%x", f.Parent, f.Prio, id) }
	for _, o := range p.Objects() {
		if keys[o.Key()] {
			fail("two objects with key %s", o.Key())
		}
		keys[o.Key()] = true
		switch x := o.(type) {
		case *tc.Class:
			classes[x.Handle] = true
		case *tc.Filter:
			if x.U32 != nil && x.U32.Divisor > 0 {
				d := x.U32.Divisor
				if d > 256 || d&(d-1) != 0 {
					fail("table %s: divisor %d", tc.U32Handle(x.Handle), d)
				}
				tables[tk(x, tc.U32HTID(x.Handle))] = d
			}
		}
	}
	for _, o := range p.Objects() {
		x, ok := o.(*tc.Filter)
		if !ok || x.U32 == nil || x.U32.Divisor > 0 {
			continue
		}
		u := x.U32
		if u.ClassID != 0 && !classes[u.ClassID] {
			fail("%s: class %s does not exist", x.Describe(), u.ClassID)
		}
		if u.Link != 0 {
			if _, ok := tables[tk(x, u.Link)]; !ok {
				fail("%s: links to table %x that does not exist", x.Describe(), u.Link>>20)
			}
		}
		if h := tc.U32HTID(x.Handle); h != 0 {
			d, ok := tables[tk(x, h)]
			if !ok {
				fail("%s: in table %x that does not exist", x.Describe(), h>>20)
			}
			if tc.U32Bucket(x.Handle) >= d {
				fail("%s: bucket %d of a table of %d", x.Describe(), tc.U32Bucket(x.Handle), d)
			}
		}
		if tc.U32Node(x.Handle) == 0 || tc.U32Node(x.Handle) > 0xFFF {
			fail("%s: node id %d", x.Describe(), tc.U32Node(x.Handle))
		}
		if u.ClassID == 0 && u.Link == 0 {
			fail("%s: neither a class nor a link", x.Describe())
		}
		if s := u.Sel; s != nil {
			if len(s.Keys) > 128 {
				fail("%s: %d keys", x.Describe(), len(s.Keys))
			}
			for _, k := range s.Keys {
				if k.Off%4 != 0 || k.Val&^k.Mask != 0 {
					fail("%s: key at %d val %#x mask %#x", x.Describe(), k.Off, k.Val, k.Mask)
				}
			}
			if d := tables[tk(x, u.Link)]; u.Link != 0 && d > 1 && s.Hmask == 0 {
				fail("%s: hashes into a table of %d buckets without a hash mask", x.Describe(), d)
			}
		}
	}
}
