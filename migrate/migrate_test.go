package migrate

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sluice/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// golden compares the draft's policy with testdata/NAME.golden.yaml and
// checks that it validates.
func golden(t *testing.T, d *Draft, name string) {
	t.Helper()
	got := d.Render()
	if err := d.Check(); err != nil {
		t.Fatalf("%v\n%s", err, got)
	}
	file := filepath.Join("testdata", name+".golden.yaml")
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs (go test ./migrate -update rewrites it):\n%s", file, got)
	}
}

// finding returns the findings whose place and text match the regexps.
func finding(d *Draft, k Kind, at, text string) []Finding {
	var out []Finding
	for _, f := range d.Report.Findings {
		if f.Kind == k && regexp.MustCompile(at).MatchString(f.At.String()) && regexp.MustCompile(text).MatchString(f.What+": "+f.How) {
			out = append(out, f)
		}
	}
	return out
}

func wantFinding(t *testing.T, d *Draft, k Kind, at, text string) {
	t.Helper()
	if len(finding(d, k, at, text)) == 0 {
		t.Errorf("no %s finding at %q matching %q in:\n%s", k, at, text, d.Report.String())
	}
}

func class(t *testing.T, d *Draft, path string) *Class {
	t.Helper()
	c := d.Classes()[path]
	if c == nil {
		t.Fatalf("no class %s among %v", path, sortedKeys(d.Classes()))
	}
	return c
}

func TestHTBInitOffice(t *testing.T) {
	d, err := HTBInit("testdata/htbinit/office", Options{})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, d, "htbinit-office")
	if err := d.Report.Refusals(); err != nil {
		t.Fatal(err)
	}
	// The one root class with children is the tree: its rate the link.
	if r := d.Interfaces[0].Egress.Rate; r != "2mbit" {
		t.Errorf("eth0 rate %s, want 2mbit", r)
	}
	// Spaces, quotes and the comment are deleted before reading.
	if c := class(t, d, "eth0/egress/ssh"); c.Rate != "128kbit" || c.Burst != "100kb" || *c.Prio != 1 {
		t.Errorf("ssh: rate %s burst %s prio %d, want 128kbit 100kb 1", c.Rate, c.Burst, *c.Prio)
	}
	// CEIL defaults to the class's RATE, not the parent's; prate is the
	// parent's rate; a CRLF file reads as any other.
	if c := class(t, d, "eth0/egress/web"); c.Ceil != "2mbit" {
		t.Errorf("web ceil %s, want prate = 2mbit", c.Ceil)
	}
	if c := class(t, d, "eth0/egress/default"); c.Rate != "800kbit" || c.Leaf != "sfq" || *c.Prio != 5 {
		t.Errorf("CRLF class: %+v", c)
	}
	// A port mask of leading ones is a range.
	web := class(t, d, "eth0/egress/web")
	if m := web.Match[2]; strings.Join(m.Dst, ",") != "10.0.0.0/8" || strings.Join(m.Dport, ",") != "7936-8191" {
		t.Errorf("10.0.0.0/8:8000/0xff00 became %+v", m)
	}
	// A trailing comma makes a source rule.
	if m := class(t, d, "eth1/egress/local").Match[0]; strings.Join(m.Src, ",") != "192.168.1.1" || strings.Join(m.Sport, ",") != "3128" || len(m.Dst) > 0 {
		t.Errorf("192.168.1.1:3128, became %+v", m)
	}
	// Hex ids in C sort order: 1f before a.
	internet := class(t, d, "eth1/egress/internet")
	if internet.Classes[0].Name != "bob" || internet.Classes[1].Origin != "1:a" {
		t.Errorf("children of internet in the wrong order: %s, %s", internet.Classes[0].Name, internet.Classes[1].Name)
	}
	wantFinding(t, d, Exact, `ssh~$`, `skipped`)
	wantFinding(t, d, Approximated, `eth1-2:9.internet$`, `add up to 3mbit.*scaled by 0.667`)
	wantFinding(t, d, Approximated, `alice:4$`, `PRIO=9.*prio 7`)
	wantFinding(t, d, Approximated, `bob:4$`, `MARK=5.*every RULE before any MARK`)
	wantFinding(t, d, Approximated, `ssh:4$`, `port match`)
	wantFinding(t, d, Approximated, `office/eth0$`, `IPv6.*3 rule`)
	wantFinding(t, d, Exact, `office/eth0:2$`, `DEFAULT=30: default: default`)
}

func TestHTBInitRefusesAtTheLine(t *testing.T) {
	d, err := HTBInit("testdata/htbinit/refused", Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Report.Refusals()
	if err == nil {
		t.Fatal("TIME, REALM and a host name were not refused")
	}
	for _, want := range []string{
		"refused/eth0-2:10.night:3: TIME=0-6:00;500Kbit: sluice has no time-of-day rates",
		"refused/eth0-2:10.night:4: RULE=host.example:80: \"host.example\" is not an IPv4 address",
		"refused/eth0-2:20.rest:3: REALM=3",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusals lack %q:\n%v", want, err)
		}
	}
	dir := t.TempDir()
	if _, err := d.Write(dir, false); err == nil {
		t.Fatal("Write wrote a draft with refusals")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused import left %d file(s) in the output directory", len(ents))
	}
}

func writeHTBInit(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for n, s := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The traps the htb.init format sets, one configuration each.
func TestHTBInitTraps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		check func(t *testing.T, d *Draft)
	}{{
		name:  "bps are bytes, a bare rate is bits",
		files: map[string]string{"eth0": "DEFAULT=3\n", "eth0-2": "RATE=1000kbps\n", "eth0-2:3": "RATE=4000000\nCEIL=1000kbps\n"},
		check: func(t *testing.T, d *Draft) {
			if r := d.Interfaces[0].Egress.Rate; r != "8mbit" {
				t.Errorf("1000kbps became %s, want 8mbit", r)
			}
			if c := class(t, d, "eth0/egress/class-3"); c.Rate != "4mbit" || c.Ceil != "8mbit" {
				t.Errorf("bare 4000000 and 1000kbps became %s/%s", c.Rate, c.Ceil)
			}
		},
	}, {
		name:  "DEFAULT=0 leaves unclassified traffic unshaped",
		files: map[string]string{"eth0": "DEFAULT=0\n", "eth0-2": "RATE=10mbit\n", "eth0-2:10": "RATE=10mbit\nRULE=*:80\n"},
		check: func(t *testing.T, d *Draft) {
			tr := d.Interfaces[0].Egress
			if tr.Default != "unclassified" {
				t.Fatalf("default %q, want the added class unclassified", tr.Default)
			}
			wantFinding(t, d, Approximated, `eth0:1$`, `DEFAULT=0: unclassified traffic went out unshaped`)
			wantFinding(t, d, Approximated, `eth0$`, `add up to 10.1mbit|add up to 10100kbit`)
		},
	}, {
		name:  "several root classes do not lend to each other",
		files: map[string]string{"eth0": "DEFAULT=3\n", "eth0-2": "RATE=1mbit\nCEIL=5mbit\n", "eth0-3": "RATE=2mbit\n"},
		check: func(t *testing.T, d *Draft) {
			tr := d.Interfaces[0].Egress
			if tr.Rate != "3mbit" || class(t, d, "eth0/egress/class-2").Ceil != "1mbit" {
				t.Errorf("tree %s, class-2 ceil %s; want 3mbit and 1mbit", tr.Rate, class(t, d, "eth0/egress/class-2").Ceil)
			}
		},
	}, {
		name:  "the characters htb.init deletes, and the range *-_",
		files: map[string]string{"eth0": "DEFAULT=3 ", "eth0-2": "RA TE=\"1mbit\"\t# total\n", "eth0-2:3.a b": "RATE='1mbit'\nRULE=10.1.2.3@,\n"},
		check: func(t *testing.T, d *Draft) {
			// '@' is inside '*'..'_' and is kept: the rule's address is
			// not an address.
			wantFinding(t, d, Refused, `a b:2$`, `10.1.2.3@`)
			if d.Interfaces[0].Egress.Rate != "1mbit" {
				t.Errorf("RA TE=\"1mbit\" read as rate %q", d.Interfaces[0].Egress.Rate)
			}
		},
	}, {
		name:  "a parent without a file",
		files: map[string]string{"eth0": "DEFAULT=3\n", "eth0-2:3": "RATE=1mbit\n"},
		check: func(t *testing.T, d *Draft) {
			wantFinding(t, d, Refused, `eth0-2:3$`, `parent 1:2 has no file`)
		},
	}, {
		name:  "a non-contiguous port mask",
		files: map[string]string{"eth0": "DEFAULT=3\n", "eth0-2": "RATE=1mbit\n", "eth0-2:3": "RATE=1mbit\nRULE=*:80/0xf0f0\n"},
		check: func(t *testing.T, d *Draft) {
			wantFinding(t, d, Refused, `eth0-2:3:2$`, `not leading ones`)
		},
	}, {
		name:  "--ipv4-only keeps IPv6 out of port rules",
		files: map[string]string{"eth0": "DEFAULT=3\n", "eth0-2": "RATE=1mbit\n", "eth0-2:3": "RATE=1mbit\nRULE=*:22\n"},
		check: func(t *testing.T, d *Draft) {
			if len(finding(d, Approximated, ``, `IPv6`)) != 0 {
				t.Errorf("an IPv6 approximation with --ipv4-only:\n%s", d.Report.String())
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := HTBInit(writeHTBInit(t, tc.files), Options{IPv4Only: strings.HasPrefix(tc.name, "--ipv4-only")})
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, d)
			if d.Report.Refusals() == nil {
				if err := d.Check(); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

func TestWondershaperVariants(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string
		args    []string
		variant string
		check   func(t *testing.T, d *Draft)
	}{{
		name: "debian-command-line", args: []string{"wondershaper", "eth0", "800", "220"}, variant: wsDebian,
		check: func(t *testing.T, d *Draft) {
			// CBQ's unbounded classes borrow up to UPLINK; MLDonkey's
			// UDP goes to the low class.
			if c := class(t, d, "eth0/egress/bulk"); c.Ceil != "220kbit" {
				t.Errorf("bulk ceil %s, want 220kbit", c.Ceil)
			}
			if m := class(t, d, "eth0/egress/low").Match[0]; m.Proto != "udp" || m.Sport[0] != "4666" {
				t.Errorf("low's first rule %+v, want udp sport 4666", m)
			}
			if p := d.Interfaces[0].Ingress.Police; p == nil || p.CIR != "800kbit" || p.CBS != "10kb" {
				t.Errorf("ingress police %+v", p)
			}
			wantFinding(t, d, Approximated, ``, `CBQ.*becomes HTB`)
		},
	}, {
		name: "lartc-htb", file: "testdata/wondershaper/wshaper.htb", variant: wsHTB,
		check: func(t *testing.T, d *Draft) {
			// HTB's ceil defaults to the rate: bulk never exceeds 9/10.
			if c := class(t, d, "ppp0/egress/bulk"); c.Ceil != "198kbit" || c.Burst != "6kb" {
				t.Errorf("bulk ceil %s burst %s, want 198kbit 6kb", c.Ceil, c.Burst)
			}
			low := class(t, d, "ppp0/egress/low")
			var got []string
			for _, m := range low.Match {
				got = append(got, strings.Join(append(append(m.Src, m.Dport...), m.Sport...), " "))
			}
			if strings.Join(got, ",") != "6881,6882,10.0.0.9" {
				t.Errorf("NOPRIO rules %q, want dports 6881 6882 then src 10.0.0.9 (the comment after the quotes ignored)", got)
			}
			wantFinding(t, d, Approximated, ``, `ACK-only TCP packets under 64 bytes`)
		},
	}, {
		name: "lartc-cbq", file: "testdata/wondershaper/wshaper.cbq", variant: wsCBQ,
		check: func(t *testing.T, d *Draft) {
			if _, ok := d.Classes()["eth0/egress/low"]; ok {
				t.Error("a low class without 1:30 in the script")
			}
		},
	}, {
		name: "1.4.1-conf", file: "testdata/wondershaper/wondershaper.conf", variant: ws141,
		check: func(t *testing.T, d *Draft) {
			in := class(t, d, "eth1/egress/interactive")
			if in.Rate != "204kbit" || in.Ceil != "972kbit" || *in.Prio != 1 {
				t.Errorf("interactive %s/%s prio %d, want 20%% and 95%% of 1024 in whole kbit", in.Rate, in.Ceil, *in.Prio)
			}
			if m := in.Match[1]; m.Dst[0] != "192.0.2.7" {
				t.Errorf("HIPRIODST's first host became %+v", m)
			}
			if tr := d.Interfaces[0].Ingress; tr == nil || tr.Rate != "4096kbit" || tr.Police != nil {
				t.Errorf("1.4.1 shapes downloads on an ifb: %+v", tr)
			}
		},
	}, {
		name: "1.4.1-command-line", args: []string{"/usr/bin/wondershaper", "-a", "wlan0", "-u", "512"}, variant: ws141,
		check: func(t *testing.T, d *Draft) {
			if d.Interfaces[0].Ingress != nil {
				t.Error("an ingress tree without -d")
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Wondershaper(tc.file, tc.args, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(d.Tool, tc.variant) {
				t.Errorf("detected %q, want %q", d.Tool, tc.variant)
			}
			if err := d.Report.Refusals(); err != nil {
				t.Fatal(err)
			}
			golden(t, d, "wondershaper-"+tc.name)
			tc.check(t, d)
		})
	}
}

func TestWondershaperBadInput(t *testing.T) {
	for _, tc := range []struct {
		file string
		args []string
		want string
	}{
		{args: []string{"wondershaper", "eth0"}, want: "shows or clears"},
		{args: []string{"wondershaper", "-c", "-a", "eth0"}, want: "-c clears"},
		{args: []string{"wondershaper", "eth0", "8oo", "220"}, want: `DOWNLINK "8oo": want a whole number`},
		{args: []string{"wondershaper", "-a", "eth0"}, want: "neither an upload nor a download"},
		{args: []string{"wondershaper", "-u", "100"}, want: "no device"},
		{args: []string{"wondershaper", "-x"}, want: "-x is not a wondershaper 1.4.1 option"},
		{file: "testdata/wondershaper/debian-wondershaper", want: "debian-wondershaper:4: DEV is taken from the command line"},
		{file: "testdata/htbinit/office/eth0", want: "not a wondershaper script"},
	} {
		_, err := Wondershaper(tc.file, tc.args, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: error %v, want %q", tc.file, tc.args, err, tc.want)
		}
	}
}

// Write puts nothing in place until the policy validates, never
// writes through a link where a file is to go, and leaves only the
// policy.
func TestWriteValidatesAndReplaces(t *testing.T) {
	d, err := Wondershaper("", []string{"wondershaper", "eth0", "800", "220"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("keep"), 0o644)
	link := filepath.Join(dir, "policy.yaml")
	os.Symlink(victim, link)
	if _, err := d.Write(dir, false); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Write over a link: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Error("Write followed a link to another file")
	}
	os.Remove(link)
	file, err := d.Write(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Write(dir, false); err != nil {
		t.Errorf("a second import over the first: %v", err)
	}
	if _, _, err := policy.Load(file); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries in the output directory, want policy.yaml alone", len(ents))
	}
	if _, err := d.Write(t.TempDir(), true); err == nil || !strings.Contains(err.Error(), "--strict") {
		t.Errorf("--strict wrote an approximated import: %v", err)
	}
}

func FuzzHTBInitFile(f *testing.F) {
	f.Add("RATE=1mbit\nCEIL=2mbit\nRULE=10.0.0.0/8:80,\nPRIO=3\n")
	f.Add("RATE=prate\nRULE=*:1024/0xfc00\nMARK=0x10\nLEAF=bfifo\nLIMIT=10kb\n")
	f.Fuzz(func(t *testing.T, s string) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "eth0"), []byte("DEFAULT=3\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "eth0-2"), []byte("RATE=10mbit\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "eth0-2:3"), []byte(s), 0o644)
		d, err := HTBInit(dir, Options{})
		if err != nil || d.Report.Refusals() != nil {
			return
		}
		if err := d.Check(); err != nil {
			t.Fatalf("an import without refusals does not validate: %v\n%s", err, d.Render())
		}
	})
}

func FuzzWondershaperFile(f *testing.F) {
	f.Add("DEV=eth0\nUPLINK=220\nDOWNLINK=800\nNOPRIOPORTDST=\"1 2\"\ntc qdisc add dev $DEV root handle 1: htb default 20\n")
	f.Add("[wondershaper]\nIFACE=eth0\nUSPEED=100\nHIPRIODST=( 10.0.0.1 )\n")
	f.Fuzz(func(t *testing.T, s string) {
		file := filepath.Join(t.TempDir(), "ws")
		os.WriteFile(file, []byte(s), 0o644)
		d, err := Wondershaper(file, nil, Options{})
		if err != nil || d.Report.Refusals() != nil {
			return
		}
		if err := d.Check(); err != nil {
			t.Fatalf("an import without refusals does not validate: %v\n%s", err, d.Render())
		}
	})
}

// Text an import copies into comments (an interface's name, a class's
// description) is written so that the policy still parses, each comment
// on its line: bytes that are not UTF-8 made the YAML encoder panic
// (found by FuzzFireQOS), and a line break would leave the comment's
// rest as YAML.
func TestCommentsHoldAnyText(t *testing.T) {
	for _, tt := range []struct{ name, text, want string }{
		{"Latin-1", "B\xfcro", "B?ro"},
		{"a line break", "a\nrate: 1kbit", "a rate: 1kbit"},
		{"a carriage return", "a\rb", "a b"},
		{"YAML's other breaks", "a\u0085b\u2028c\u2029d", "a b c d"},
		{"control bytes", "a\x00b\x1bc\x7f", "a?b?c?"},
		{"a tab and UTF-8", "a\tb ü", "a\tb ü"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &Draft{Tool: "test", Interfaces: []*Interface{{Name: "eth0", Egress: &Tree{
				Comment: tt.text, Rate: "10mbit", Default: "a",
				Classes: []*Class{{Name: "a", Rate: "1mbit", Comment: tt.text}},
			}}}}
			out := d.Render()
			p, _, err := policy.Parse("p.yaml", out)
			if err != nil {
				t.Fatalf("the policy does not parse: %v\n%s", err, out)
			}
			if n := len(p.Interfaces[0].Egress.Classes); n != 1 {
				t.Fatalf("%d classes, want 1:\n%s", n, out)
			}
			if got := strings.Count(string(out), "# "+tt.want+"\n"); got != 2 {
				t.Errorf("want the comment %q on the tree's line and the class's, found %d:\n%s", tt.want, got, out)
			}
		})
	}
}

// The old tool's class ids are kept where sluice's tree can hold them
// (classid), and each one that cannot is reported with why.
func TestImportKeepsClassIDs(t *testing.T) {
	d, err := FireQOS("testdata/fireqos/fireqos.conf", Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := string(d.Render())
	if !strings.Contains(out, `classid: "1:11"`) {
		t.Errorf("FireQOS's 1:11 not kept:\n%s", out)
	}
	// FireQOS's default class is 1:8000, past sluice's 1:7fff.
	wantFinding(t, d, Approximated, ``, `class default id 1:8000: not kept \(sluice's classes are 1:10 to 1:7fff`)
	d, err = Wondershaper("", []string{"wondershaper", "-a", "eth0", "-d", "1024", "-u", "512"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 1.4.1's ingress class is 2:1 on ifb0: under sluice's 1:10.
	wantFinding(t, d, Approximated, ``, `class all id 2:1: not kept \(sluice's classes are 1:10 to 1:7fff`)
	if out := string(d.Render()); !strings.Contains(out, `classid: "1:10"`) || !strings.Contains(out, `classid: "1:30"`) {
		t.Errorf("1.4.1's egress ids not kept:\n%s", out)
	}
}

// A report quotes what would drive the terminal that reads it: an OSC
// title, a clear-screen, a carriage return, bytes that are not UTF-8
// taken from the source (issue 58).
func TestReportQuotesControlBytes(t *testing.T) {
	file := filepath.Join(t.TempDir(), "fireqos.conf")
	os.WriteFile(file, []byte("interface eth0 x output rate 1Mbit\nclass a\nmatch \x1b]0;pwned\x07\x1b[2J\rtcp\xff\n"), 0o644)
	d, err := FireQOS(file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := d.Report.String()
	if err := d.Report.Refusals(); err != nil {
		out += err.Error()
	}
	for _, c := range []string{"\x1b", "\x07", "\r", "\xff"} {
		if strings.Contains(out, c) {
			t.Errorf("the report holds %q:\n%s", c, out)
		}
	}
	if !strings.Contains(out, `match \x1b]0`) || !strings.Contains(out, `pwned\a\x1b[2J\rtcp\xff`) {
		t.Errorf("the bytes are not shown quoted:\n%s", out)
	}
	if printable("plain, ünïcode") != "plain, ünïcode" {
		t.Error("printable changed printable text")
	}
}
