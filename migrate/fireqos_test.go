package migrate

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sluice/policy"
)

func TestFireQOSOffice(t *testing.T) {
	d, err := FireQOS("testdata/fireqos/fireqos.conf", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Report.Refusals(); err != nil {
		t.Fatal(err)
	}
	golden(t, d, "fireqos-office")
	eth0 := d.Interfaces[0]
	in, out := eth0.Ingress, eth0.Egress
	if in == nil || out == nil || len(d.Interfaces) != 1 {
		t.Fatalf("want eth0 both ways: %+v", d.Interfaces)
	}
	// adsl remote pppoe-llcsnap: 40 bytes less the 14 of the Ethernet
	// header the remote end does not see.
	if in.Rate != "20mbit" || in.Linklayer != "atm" || in.Overhead != 26 || in.Leaf != "fq_codel" || in.Default != "default" {
		t.Errorf("ingress %+v", in)
	}
	if out.Rate != "5mbit" || out.Leaf != "pfifo" || out.Default != "default" {
		t.Errorf("egress %+v", out)
	}
	type want struct {
		path, origin, rate, ceil string
		prio                     int // -1: none (a group)
		rules                    int
	}
	for _, w := range []want{
		{"eth0/ingress/voip", "1:11", "300kbit", "2mbit", 0, 3},
		// 10% of the parent's rate, in bash's integers.
		{"eth0/ingress/interactive", "1:12", "2mbit", "20mbit", 1, 5},
		{"eth0/ingress/office", "1:13", "12mbit", "20mbit", -1, 1},
		// A ceil's % is of the parent's rate too (FireQOS reads it so).
		{"eth0/ingress/mail", "1:14", "600kbit", "6mbit", 0, 1},
		{"eth0/ingress/web", "1:15", "200kbit", "20mbit", 1, 1},
		{"eth0/ingress/office-default", "1:8001", "200kbit", "20mbit", 2, 0},
		// 5kbps (5*1024 bytes/s) is under the minimum: raised to it.
		{"eth0/ingress/bulk", "1:17", "200kbit", "18mbit", 3, 4},
		{"eth0/ingress/default", "1:8000", "200kbit", "20mbit", 4, 0},
		{"eth0/egress/voip", "1:11", "100kbit", "5mbit", 0, 4},
		{"eth0/egress/acks", "1:12", "50kbit", "5mbit", 1, 1},
		{"eth0/egress/interactive", "1:13", "500kbit", "5mbit", 2, 1},
		{"eth0/egress/default", "1:8000", "1mbit", "5mbit", 3, 0},
		{"eth0/egress/bulk", "1:15", "50kbit", "5mbit", 3, 1},
	} {
		c := class(t, d, w.path)
		if c.Origin != w.origin || c.Rate != w.rate || c.Ceil != w.ceil || len(c.Match) != w.rules {
			t.Errorf("%s: origin %s rate %s ceil %s, %d rules; want %s %s %s, %d", w.path, c.Origin, c.Rate, c.Ceil, len(c.Match), w.origin, w.rate, w.ceil, w.rules)
		}
		if w.prio < 0 && c.Prio != nil || w.prio >= 0 && (c.Prio == nil || *c.Prio != w.prio) {
			t.Errorf("%s: prio %v, want %d", w.path, c.Prio, w.prio)
		}
	}
	if g := class(t, d, "eth0/ingress/office"); g.Default != "office-default" || g.Match[0].Dst[0] != "10.1.0.0/16" {
		t.Errorf("the group is a gate to its default: %+v", g)
	}
	// server ssh on input: requests to port 22; client dns on input:
	// replies from 53, per protocol; reverse swaps the sides.
	ia := class(t, d, "eth0/ingress/interactive").Match
	if ia[0].Proto != "tcp" || !slices.Equal(ia[0].Dport, []string{"22"}) || ia[1].Proto != "udp" || !slices.Equal(ia[1].Sport, []string{"53"}) ||
		ia[2].Proto != "tcp" || !slices.Equal(ia[2].Sport, []string{"53"}) || !slices.Equal(ia[3].Sport, []string{"3389"}) || ia[4].TOS != "0x10/0x10" {
		t.Errorf("interactive's rules: %s", matchText(ia))
	}
	// `ports` is either side: two entries, the range as sluice writes it.
	if v := class(t, d, "eth0/ingress/voip").Match; !slices.Equal(v[0].Sport, []string{"5060", "10000-20000"}) || !slices.Equal(v[1].Dport, []string{"5060", "10000-20000"}) {
		t.Errorf("voip's rules: %s", matchText(v))
	}
	if a := class(t, d, "eth0/egress/acks").Match; !a[0].TCPAck || a[0].Proto != "tcp" {
		t.Errorf("acks: %s", matchText(a))
	}
	// match all: every IPv4 packet (sluice has no empty entry).
	if b := class(t, d, "eth0/egress/bulk").Match; !slices.Equal(b[0].Src, []string{"0.0.0.0/0"}) {
		t.Errorf("bulk: %s", matchText(b))
	}
	wantFinding(t, d, Exact, `fireqos.conf:8$`, `linklayer atm, overhead 26`)
	wantFinding(t, d, Exact, `fireqos.conf:24$`, `raised to the interface's minimum`)
	wantFinding(t, d, Approximated, `fireqos.conf:28$`, `DSCP by name only`)
	wantFinding(t, d, Approximated, `fireqos.conf:37$`, `tried this match \(for interactive\) before the rules of voip's at line`)
	wantFinding(t, d, Approximated, `fireqos.conf:35$`, `tcp_ack`)
	wantFinding(t, d, Approximated, `fireqos.conf:8$`, `IPv4 alone`)
}

func matchText(ms []*Match) string {
	var b strings.Builder
	for _, m := range ms {
		b.WriteString(strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(strings.TrimPrefix(strings.TrimPrefix(fmtMatch(m), "&"), "{"), "\n", " "), "  ", " ")))
		b.WriteString("; ")
	}
	return b.String()
}

func fmtMatch(m *Match) string {
	return strings.Join([]string{"proto=" + m.Proto, "src=" + strings.Join(m.Src, ","), "dst=" + strings.Join(m.Dst, ","),
		"sport=" + strings.Join(m.Sport, ","), "dport=" + strings.Join(m.Dport, ","), "tos=" + m.TOS, "dscp=" + m.DSCP}, " ")
}

func TestFireQOSIPv4Only(t *testing.T) {
	d, err := FireQOS("testdata/fireqos/fireqos.conf", Options{IPv4Only: true})
	if err != nil || d.Report.Refusals() != nil {
		t.Fatal(err, d.Report.Refusals())
	}
	for _, m := range class(t, d, "eth0/ingress/interactive").Match {
		if !slices.Equal(m.Src, []string{"0.0.0.0/0"}) {
			t.Errorf("--ipv4-only: a rule without addresses keeps IPv6 out with src 0.0.0.0/0: %s", fmtMatch(m))
		}
	}
	wantFinding(t, d, Exact, `fireqos.conf:8$`, `classify IPv4 alone`)
}

// TestFireQOSScript: what sluice reads of bash, and what it refuses.
func TestFireQOSScript(t *testing.T) {
	write := func(s string) string {
		file := filepath.Join(t.TempDir(), "fireqos.conf")
		os.WriteFile(file, []byte(s), 0o644)
		return file
	}
	ok := []struct{ name, conf, path, rate string }{
		{"braces and quotes", "R=1Mbit; N='web'\ninterface eth1 x output rate ${R}\n  class \"$N\" commit 10% # a comment\n    match tcp port 80\n", "eth1/egress/web", "100kbit"},
		{"continuation", "interface eth1 x output \\\n  rate 2Mbit\nclass a \\\n commit 500kbit\nmatch udp\n", "eth1/egress/a", "500kbit"},
		{"units", "interface eth1 x output rate 100Mbit\nclass a commit 1Mbps\nmatch udp\n", "eth1/egress/a", "8388kbit"},
		{"export", "export FIREQOS_MIN_RATE_DIVISOR=10\ninterface eth1 x output rate 1Mbit\nclass a\nmatch udp\n", "eth1/egress/a", "100kbit"},
		{"interface46", "interface46 eth1 x output rate 1Mbit\nclass a commit 200kbit\nmatch all\n", "eth1/egress/a", "200kbit"},
		{"balanced", "interface eth1 x output rate 1Mbit balanced\nclass a commit 200kbit\nmatch udp\nclass b commit 200kbit\nmatch tcp\n", "eth1/egress/b", "200kbit"},
	}
	for _, c := range ok {
		t.Run(c.name, func(t *testing.T) {
			d := importFQ(t, c.conf)
			if cl := class(t, d, c.path); cl.Rate != c.rate {
				t.Errorf("%s: rate %s, want %s", c.path, cl.Rate, c.rate)
			}
		})
	}
	d, _ := FireQOS(write(ok[5].conf), Options{})
	if *class(t, d, "eth1/egress/a").Prio != 4 || *class(t, d, "eth1/egress/b").Prio != 4 {
		t.Errorf("balanced: every class at prio 4")
	}
	d, _ = FireQOS(write(ok[4].conf), Options{})
	if m := class(t, d, "eth1/egress/a").Match; len(m) != 2 || m[0].Src[0] != "::/0" || m[1].Src[0] != "0.0.0.0/0" {
		t.Errorf("match all on interface46: both families: %s", matchText(m))
	}
	refused := []struct{ conf, at, want string }{
		{"for i in 1 2; do\n  echo $i\ndone\n", `:1$`, `not bash's control flow`},
		{"interface eth0 x output rate 1Mbit\nqos() { class a; }\n", `:2$`, `functions`},
		{"R=$(cat /etc/rate)\n", `:1$`, `command substitution`},
		{"interface eth0 x output rate $RATE\n", `:1$`, `\$RATE is not set`},
		{"interface eth0 x output rate 1.5Mbit\n", `:1$`, `no fractions`},
		{"interface eth0 x sideways rate 1Mbit\n", `:1$`, `want input, output or both`},
		{"interface eth0 x output\n", `:1$`, `no rate`},
		{"class a\n", `:1$`, `before any interface`},
		{"interface eth0 x output rate 1Mbit\nmatch tcp\n", `:2$`, `above all classes`},
		{"interface eth0 x output rate 1Mbit\nclass a\nmatch mark 1\n", `:3$`, `rawmark`},
		{"interface eth0 x output rate 1Mbit\nclass a\nmatch tcp port http\n", `:3$`, `port number`},
		{"interface eth0 x output rate 1Mbit\nclass a\nmatch src 10.0.0.300\n", `:3$`, `not an address`},
		{"interface eth0 x output rate 1Mbit\nclass a\nmatch src 2001:db8::1\n", `:3$`, `other family`},
		{"interface eth0 x output rate 1Mbit\nclass a\nmatch tcp class nosuch\n", `:3$`, `no such class`},
		{"interface eth0 x output rate 1Mbit\nclass a qdisc cake\n", `:2$`, `takes sfq, pfifo`},
		{"interface eth0 x output rate 1Mbit\nclass a hashfilter key 1\n", `:2$`, `per_host`},
		{"interface eth0 x output rate 1Mbit\nclass group end\n", `:2$`, `no class group is open`},
		{"interface eth0 x output rate 1Mbit\nclass a frobnicate 1\n", `:2$`, `not a FireQOS class`},
		{"interface eth0 x output rate 1Mbit\nclass a\nmatch tcp port 22 sport 1\n", `:3$`, `FireQOS refuses these together`},
		{"interface eth0 x output rate 1Mbit\nclass a\nserver quake\n", `:3$`, `not in FireHOL.s service table`},
		{"interface eth0 x output rate 1Mbit\nif true; then class a; fi\n", `:2$`, `control flow`},
		{"interface eth0 x output rate 1Mbit\ninterface eth0 y output rate 2Mbit\n", `:2$`, `a second output interface`},
		{"tc qdisc add dev eth0 root htb\n", `:1$`, `not a FireQOS statement`},
		{"# nothing\n", `fireqos.conf$`, `no interface statement`},
	}
	for _, c := range refused {
		d, err := FireQOS(write(c.conf), Options{})
		if err != nil {
			t.Fatal(err)
		}
		wantFinding(t, d, Refused, c.at, c.want)
	}
}

func FuzzFireQOS(f *testing.F) {
	b, _ := os.ReadFile("testdata/fireqos/fireqos.conf")
	f.Add(string(b))
	f.Add("interface eth0 x both rate 1Mbit\nclass group g commit 50%\nmatch tcp\nclass a\nclass group end\n")
	f.Fuzz(func(t *testing.T, s string) {
		file := filepath.Join(t.TempDir(), "fireqos.conf")
		os.WriteFile(file, []byte(s), 0o644)
		d, err := FireQOS(file, Options{})
		if err != nil || d.Report.Refusals() != nil {
			return
		}
		if err := d.Check(); err != nil {
			t.Fatalf("an import without refusals does not validate: %v\n%s", err, d.Render())
		}
	})
}

// What FireQOS's own examples write as bash: integer arithmetic on
// literals and the file's variables, functions without arguments
// expanded where they are called, services the file defines with
// server_NAME_ports, and FireHOL's whole service table.
func TestFireQOSShellForms(t *testing.T) {
	d := importFQ(t, `LINE=12200
IN="$(( LINE * 85 / 100 ))kbit"
OUT="$((890  * (100 - 5) / 100))kbit"
server_rtp_ports="udp/10000:10100"
classes() {
	class voip
		server rtp
		server sip
	class remote
		client mosh
		server GRE
		server ping
}
interface eth0 world input rate $IN
	classes
interface eth0 world-out output rate $OUT
	classes
`)
	out := string(d.Render())
	for _, want := range []string{"rate: 10370kbit", "rate: 845kbit", "dport: 10000-10100", "dport: 5060", "sport: 60000-61000", `proto: "47"`, "proto: icmp"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	for _, c := range []struct{ expr, want string }{
		{"1 + 2 * 3", "7"}, {"(1 + 2) * 3", "9"}, {"-7 / 2", "-3"}, {"7 % 3", "1"}, {"X * 2", "84"}, {"$X - 2", "40"}, {"${X}/4", "10"},
	} {
		v, err := shellArith(c.expr, map[string]string{"X": "42"})
		if err != nil || fmt.Sprint(v) != c.want {
			t.Errorf("$((%s)) = %d, %v; want %s", c.expr, v, err, c.want)
		}
	}
	for _, bad := range []string{"1 / 0", "Y + 1", "1 +", "(1", "010", "1 < 2", "a=1"} {
		if _, err := shellArith(bad, map[string]string{}); err == nil {
			t.Errorf("$((%s)) read", bad)
		}
	}
	// A variable the file does not set, named like one it does.
	file := filepath.Join(t.TempDir(), "fireqos.conf")
	os.WriteFile(file, []byte("OUTPUT_SPEED=1Mbit\ninterface eth0 x output rate $OUTPUT_RATE\nclass a\n"), 0o644)
	d, _ = FireQOS(file, Options{})
	wantFinding(t, d, Refused, `:2$`, `did you mean \$OUTPUT_SPEED`)
	wantFinding(t, d, Refused, `:3$`, `its interface statement \(line 2\) was refused`)
}

// FireQOS's `match tcp syn` (its shipped example's synacks class) is
// sluice's tcp_syn; with more protocols than TCP, syn holds for the TCP
// filter only, as FireQOS documents.
func TestFireQOSSyn(t *testing.T) {
	d := importFQ(t, "interface eth0 x output rate 1Mbit\nclass synacks\n  match tcp syn\n  match tcp ack\n  match proto tcp,udp syn dport 53\nclass default\n")
	m := class(t, d, "eth0/egress/synacks").Match
	if len(m) != 4 || !m[0].TCPSyn || m[0].Proto != "tcp" || !m[1].TCPAck || m[1].TCPSyn ||
		!m[2].TCPSyn || m[2].Proto != "tcp" || m[3].TCPSyn || m[3].Proto != "udp" {
		t.Errorf("synacks: %s", matchText(m))
	}
	if !strings.Contains(string(d.Render()), "tcp_syn: true") {
		t.Errorf("no tcp_syn in:\n%s", d.Render())
	}
	wantFinding(t, d, Approximated, `fireqos.conf:3$`, `tcp_syn: TCP with SYN set`)
}

// A file of more classes than one HTB tree holds is refused where the
// limit is passed, and read no further (issue 58: 20,000 classes took
// 18 s and 1.7 GB before the plan refused them): one refusal, not one
// per class beyond.
func TestFireQOSRefusesPastHTBsClasses(t *testing.T) {
	var b strings.Builder
	b.WriteString("interface eth0 x output rate 100Mbit\n")
	for i := 0; i < policy.MaxClasses+100; i++ {
		fmt.Fprintf(&b, "class c%d commit 1kbit\n", i)
	}
	file := filepath.Join(t.TempDir(), "fireqos.conf")
	os.WriteFile(file, []byte(b.String()), 0o644)
	d, err := FireQOS(file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantFinding(t, d, Refused, fmt.Sprintf(`:%d$`, policy.MaxClasses), `the most one HTB tree holds`)
	if n := d.Report.Count(Refused); n > 2 {
		t.Errorf("%d refusals; want the one at the limit (and the default class's)", n)
	}
}

// importFQ imports conf as a FireQOS file and fails the test unless it
// imports without refusals into a policy that validates.
func importFQ(t *testing.T, conf string) *Draft {
	t.Helper()
	file := filepath.Join(t.TempDir(), "fireqos.conf")
	os.WriteFile(file, []byte(conf), 0o644)
	d, err := FireQOS(file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Report.Refusals(); err != nil {
		t.Fatalf("%v\n%s", err, d.Report.String())
	}
	if err := d.Check(); err != nil {
		t.Fatalf("%v\n%s", err, d.Render())
	}
	return d
}
