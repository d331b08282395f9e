package migrate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSQMConfig(t *testing.T) {
	d, err := SQM("testdata/sqm/sqm", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Report.Refusals(); err != nil {
		t.Fatal(err)
	}
	golden(t, d, "sqm")
	if len(d.Interfaces) != 2 {
		t.Fatalf("%d interfaces, want eth1 and wwan0 (guest is disabled)", len(d.Interfaces))
	}
	// simple.qos upload: three tiers by DSCP, best effort the default,
	// sqm's stab overhead counted from the Ethernet frame as sluice's.
	eth1 := d.Interfaces[0]
	if eth1.Name != "eth1" || eth1.Egress.Rate != "10mbit" || eth1.Egress.Linklayer != "atm" || eth1.Egress.Overhead != 40 || eth1.Egress.Leaf != "fq_codel" {
		t.Errorf("eth1 egress %+v", eth1.Egress)
	}
	if c := class(t, d, "eth1/egress/priority"); c.Rate != "128kbit" || c.Ceil != "3333kbit" || *c.Prio != 1 || len(c.Match) != 4 || c.Match[3].TOS != "0x10/0x3f" {
		t.Errorf("priority tier %+v", c)
	}
	if c := class(t, d, "eth1/egress/background"); c.Rate != "1666kbit" || c.Ceil != "9984kbit" || c.Match[0].DSCP != "CS1" {
		t.Errorf("background tier %+v", c)
	}
	// squash_ingress (sqm's default): the download is one class.
	if in := eth1.Ingress; in == nil || in.Rate != "85mbit" || len(in.Classes) != 1 || in.Default != "all" {
		t.Errorf("eth1 ingress %+v", in)
	}
	// layer_cake: cake counts overhead from the IP packet.
	lte := d.Interfaces[1]
	if lte.Egress != nil || lte.Ingress == nil || lte.Ingress.Overhead != 4 || lte.Ingress.Leaf != "cake" || len(lte.Ingress.Classes) != 3 {
		t.Errorf("wwan0: egress %+v ingress %+v", lte.Egress, lte.Ingress)
	}
	wantFinding(t, d, Exact, `sqm:27$`, `not enabled`)
	wantFinding(t, d, Exact, `sqm:25$`, `overhead 18.*4 from the Ethernet frame`)
	wantFinding(t, d, Approximated, `sqm:17$`, `diffserv3 tins`)
	wantFinding(t, d, Approximated, `sqm:2$`, `iptables`)
}

func TestSQMSquashIngressOff(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sqm")
	os.WriteFile(file, []byte("config queue\n\toption enabled 1\n\toption interface eth0\n\toption download 20000\n\toption upload 2000\n\toption squash_ingress 0\n\toption script piece_of_cake.qos\n"), 0o644)
	d, err := SQM(file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Report.Refusals(); err != nil {
		t.Fatal(err)
	}
	if in := d.Interfaces[0].Ingress; len(in.Classes) != 1 || in.Leaf != "cake" {
		t.Errorf("piece_of_cake ingress %+v", in)
	}
	wantFinding(t, d, Approximated, `sqm:1$`, `cake shapes at the root`)
	os.WriteFile(file, []byte("config queue\n\toption enabled 1\n\toption interface eth0\n\toption download 20000\n\toption squash_ingress 0\n"), 0o644)
	if d, err = SQM(file, Options{}); err != nil || d.Report.Refusals() != nil {
		t.Fatal(err, d.Report.Refusals())
	}
	if c := class(t, d, "eth0/ingress/priority"); c.Rate != "32kbit" || len(c.Match) != 5 {
		t.Errorf("simple.qos ingress with DSCP: %+v", c)
	}
}

func TestSQMRefusals(t *testing.T) {
	for _, c := range []struct{ conf, at, want string }{
		{"config queue\n\toption enabled 1\n\toption upload 100\n", `:1$`, `no interface`},
		{"config queue\n\toption enabled 1\n\toption interface eth0\n\toption upload fast\n", `:4$`, `"fast": want kbit`},
		{"config queue\n\toption enabled 1\n\toption interface eth0\n\toption upload 1000\n\toption script nxt_routed_hfsc.qos\n", `:5$`, `its own`},
		{"config queue\n\toption enabled 1\n\toption interface 'eth0\n", `:3$`, `unterminated quote`},
		{"config queue\n\toption enabled 1\n\toption interface eth0\n\toption upload 1000\n\toption linklayer atm\n\toption overhead 999\n", `:6$`, `-64 to 256`},
		{"config queue\n\toption enabled 1\n\toption interface eth0\n\toption upload 10\n", `:4$`, `too slow`},
		{"config queue\n\toption enabled 0\n\toption interface eth0\n", `sqm$`, `no queue is enabled`},
		{"upload=1000\n", `:1$`, `not UCI`},
	} {
		file := filepath.Join(t.TempDir(), "sqm")
		os.WriteFile(file, []byte(c.conf), 0o644)
		d, err := SQM(file, Options{})
		if err != nil {
			t.Fatal(err)
		}
		wantFinding(t, d, Refused, c.at, c.want)
		if _, err := d.Write(t.TempDir(), false); err == nil || !strings.Contains(err.Error(), c.want[:4]) && err == nil {
			t.Errorf("%q: a refused import was written", c.conf)
		}
	}
}

func FuzzSQMConfig(f *testing.F) {
	f.Add("config queue 'wan'\n\toption enabled '1'\n\toption interface 'eth1'\n\toption download '85000'\n\toption upload '10000'\n\toption linklayer 'atm'\n\toption overhead '44'\n")
	f.Add("config queue\n option enabled 1\n option interface eth0\n option upload 3000\n option script layer_cake.qos\n option squash_ingress 0\n")
	f.Add("UPLINK=1000\nDOWNLINK=85000\nSCRIPT=layer_cake.qos\nLINKLAYER=atm\nOVERHEAD=44\n")
	f.Fuzz(func(t *testing.T, s string) {
		// As UCI's file, and as the shell form's DEV.iface.conf.
		dir := t.TempDir()
		for _, name := range []string{"sqm", "eth0.iface.conf"} {
			file := filepath.Join(dir, name)
			os.WriteFile(file, []byte(s), 0o644)
			d, err := SQM(file, Options{})
			if err != nil || d.Report.Refusals() != nil {
				continue
			}
			if err := d.Check(); err != nil {
				t.Fatalf("an import without refusals does not validate: %v\n%s", err, d.Render())
			}
		}
	})
}

// sqm's shell form (/etc/sqm): default.conf, then each DEV.iface.conf
// over it, as sqm sources them; the same queue reader as UCI's.
func TestSQMShellForm(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("default.conf", "# defaults\nUPLINK=1000\nDOWNLINK=85000\nSCRIPT=piece_of_cake.qos\n#ENABLED=1\nILIMIT=\n")
	write("eth0.iface.conf", "UPLINK=20000   # the iface file wins\nexport SCRIPT=\"simple.qos\"\nQDISC='fq_codel'\nLINKLAYER=atm\nOVERHEAD=44\nLLAM=tc_stab\nETARGET=10ms\nMYVAR=1\n")
	write("wan1.iface.conf", "ENABLED=0\n")

	d, err := SQM(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Report.Refusals(); err != nil {
		t.Fatalf("%v\n%s", err, d.Report.String())
	}
	if len(d.Interfaces) != 1 || d.Interfaces[0].Name != "eth0" {
		t.Fatalf("interfaces %+v, want eth0 alone (wan1 is disabled)", d.Interfaces)
	}
	eth0 := d.Interfaces[0]
	if e := eth0.Egress; e.Rate != "20mbit" || e.Linklayer != "atm" || e.Overhead != 44 || e.Leaf != "fq_codel" || len(e.Classes) != 3 {
		t.Errorf("eth0 egress %+v: want the iface file's 20 Mbit/s simple.qos with ATM and 44 bytes", e)
	}
	if in := eth0.Ingress; in == nil || in.Rate != "85mbit" || len(in.Classes) != 1 {
		t.Errorf("eth0 ingress %+v: want default.conf's 85 Mbit/s, one class (IGNORE_DSCP_INGRESS)", in)
	}
	wantFinding(t, d, Approximated, `eth0.iface.conf:7$`, `tuning of its leaves`)
	wantFinding(t, d, Approximated, `eth0.iface.conf:8$`, `not one of sqm's settings`)
	wantFinding(t, d, Exact, `wan1.iface.conf$`, `not enabled`)
	if n := len(finding(d, Approximated, `default.conf:6$`, ``)); n != 0 {
		t.Errorf("an empty ILIMIT= was reported: %s", d.Report.String())
	}

	// One iface file reads default.conf beside it; default.conf alone
	// needs the interface; the file's device is the one it names.
	d, err = SQM(filepath.Join(dir, "eth0.iface.conf"), Options{})
	if err != nil || d.Report.Refusals() != nil || len(d.Interfaces) != 1 || d.Interfaces[0].Ingress.Rate != "85mbit" {
		t.Errorf("eth0.iface.conf alone: %v %+v\n%s", err, d, d.Report.String())
	}
	d, err = SQM(filepath.Join(dir, "default.conf"), Options{Interface: "ppp0"})
	if err != nil || d.Report.Refusals() != nil || d.Interfaces[0].Name != "ppp0" || d.Interfaces[0].Egress.Rate != "1mbit" {
		t.Errorf("default.conf for ppp0: %v\n%s", err, d.Report.String())
	}
	if _, err := SQM(filepath.Join(dir, "eth0.iface.conf"), Options{Interface: "ppp0"}); err == nil || !strings.Contains(err.Error(), "eth0's configuration") {
		t.Errorf("eth0.iface.conf with --interface ppp0: %v", err)
	}
	d, _ = SQM(filepath.Join(dir, "wan1.iface.conf"), Options{})
	wantFinding(t, d, Refused, `$`, `no interface is enabled.*wan1 \(.*wan1.iface.conf:1: ENABLED=0\)`)

	// What sqm would compute, and statements, are refused at their line.
	write("ppp0.iface.conf", "UPLINK=$((1000*8))\nif true; then\n")
	d, err = SQM(filepath.Join(dir, "ppp0.iface.conf"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantFinding(t, d, Refused, `ppp0.iface.conf:1$`, `a value the shell computes`)
	wantFinding(t, d, Refused, `ppp0.iface.conf:2$`, `not an sqm setting`)
	if len(d.Interfaces) != 0 {
		t.Errorf("a refused file drafted %+v", d.Interfaces)
	}

	// A directory without interfaces says how to name one.
	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "default.conf"), []byte("UPLINK=1000\n"), 0o644)
	d, _ = SQM(empty, Options{})
	wantFinding(t, d, Refused, `$`, `no DEV.iface.conf here.*--interface DEV`)
	if d, _ = SQM(empty, Options{Interface: "eth9"}); d.Report.Refusals() != nil || d.Interfaces[0].Name != "eth9" {
		t.Errorf("the directory for eth9:\n%s", d.Report.String())
	}
}
