package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"sluice/features"
	"sluice/records"
	"sluice/testutil"
)

var statCounters = regexp.MustCompile(`direct_packets_stat \d+`)

// plainName is a device name tc -batch reads as one word.
var plainName = regexp.MustCompile(`^[A-Za-z0-9_.:@-]+$`)

// dump is what tc(8) shows of every device's qdiscs, classes and filters
// (root block, every class's block, ingress hook). The per-class filter
// listings go to one `tc -batch`: a tc process per class (hundreds for
// office.yaml) took two minutes in the emulated lane.
func dump(t *testing.T, ns string, devs []string) string {
	t.Helper()
	var b strings.Builder
	for _, d := range devs {
		b.WriteString(tcShow(t, ns, "-d", "qdisc", "show", "dev", d))
		var cls string
		for _, l := range strings.SplitAfter(tcShow(t, ns, "-d", "class", "show", "dev", d), "\n") {
			if !flowClasses.MatchString(l) {
				cls += l
			}
		}
		b.WriteString(cls)
		parents := []string{"", "ingress"}
		for _, m := range regexp.MustCompile(`class htb (\S+) `).FindAllStringSubmatch(cls, -1) {
			parents = append(parents, "parent "+m[1])
		}
		if !plainName.MatchString(d) {
			// tc -batch splits on quotes: a hostile name goes one
			// command at a time.
			for _, p := range parents {
				b.WriteString(tcShow(t, ns, append([]string{"-d", "filter", "show", "dev", d}, strings.Fields(p)...)...))
			}
			continue
		}
		batch := ""
		for _, p := range parents {
			batch += strings.TrimSpace("filter show dev "+d+" "+p) + "\n"
		}
		cmd := exec.Command("ip", "netns", "exec", ns, "tc", "-d", "-batch", "-")
		cmd.Stdin = strings.NewReader(batch)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tc -batch (%s): %v\n%s", batch, err, out)
		}
		b.Write(out)
	}
	return statCounters.ReplaceAllString(b.String(), "")
}

// The export, run by the real tc on a fresh device, builds exactly what
// apply builds: both kernels' dumps are identical.
func TestExportReproducesApply(t *testing.T) {
	for _, ex := range []struct {
		file string
		devs []string
	}{
		{"../examples/office.yaml", []string{"eth0", "eth1", "ifb-eth0"}},
		{"../examples/wondershaper.yaml", []string{"eth0", "ifb-eth0"}},
		{"../examples/ipv6.yaml", []string{"eth0"}},
	} {
		t.Run(filepath.Base(ex.file), func(t *testing.T) {
			var real []string
			for _, d := range ex.devs {
				if !strings.HasPrefix(d, "ifb-") {
					real = append(real, d)
				}
			}
			applied, exported := devNS(t, real...), devNS(t, real...)
			must(t, "--netns", applied, "apply", "-q", ex.file)

			for _, format := range []string{"sh", "tc"} {
				script := must(t, "--netns", applied, "export", ex.file, "--format", format)
				if format == "tc" {
					if !strings.Contains(script, "tc -batch") || strings.Contains(script, "\nqdisc") == false {
						t.Errorf("tc format:\n%.500s", script)
					}
					continue
				}
				path := filepath.Join(t.TempDir(), "export.sh")
				os.WriteFile(path, []byte(script), 0o755)
				out, err := exec.Command("ip", "netns", "exec", exported, "sh", path).CombinedOutput()
				if err != nil || len(out) > 0 {
					// tc prints the kernel's warnings (quantum too big or
					// small) on stderr: there must be none.
					t.Fatalf("running the export: %v\n%s", err, out)
				}
			}
			a, b := dump(t, applied, ex.devs), dump(t, exported, ex.devs)
			if a != b {
				t.Fatalf("kernels differ:\n--- apply\n%s\n--- export\n%s", a, b)
			}
			if !strings.Contains(a, "class htb") || !strings.Contains(a, "filter") {
				t.Fatalf("empty dump:\n%s", a)
			}
		})
	}
}

// TestExportBPFTreeAsU32: a tree sluice classifies in BPF is exported as
// its u32 equivalent, which tc accepts and which classifies the same
// way (TestHostsFileU32); a tree with policers says it has none.
func TestExportBPFTreeAsU32(t *testing.T) {
	ns := devNS(t, "eth1")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte("name,addresses,rate,ceil\nh1,10.1.0.1,1mbit,5mbit\nh2,10.1.0.0/24 fd00::/64,1mbit,5mbit\n"), 0o644)
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(`interfaces:
  - name: eth1
    egress:
      rate: 100mbit
      default: rest
      classes:
        - name: subs
          rate: 50mbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 10mbit
`), 0o644)
	script := must(t, "export", "--fresh", file)
	if !strings.Contains(script, "# eth1 egress: sluice classifies it in BPF; written here as the equivalent u32 filters") ||
		!strings.Contains(script, "divisor 256") || strings.Contains(script, "not reproducible") {
		t.Fatalf("export of a BPF tree:\n%s", script)
	}
	sf := filepath.Join(dir, "export.tc")
	os.WriteFile(sf, []byte(script), 0o644)
	testutil.NS(t, ns, "tc", "-batch", sf)
	if f := tcShow(t, ns, "filter", "show", "dev", "eth1"); strings.Count(f, "flowid 1:") < 3 {
		t.Errorf("tc -batch of the export left these filters:\n%s", f)
	}
	// A tree with no tc equivalent on any kernel: refused, naming the
	// tree and why, unless --partial.
	if r := sluice(t, "export", "--fresh", "../examples/isp.yaml"); r.code != 2 || r.stdout != "" ||
		!strings.Contains(r.stderr, "eth1 egress (../examples/isp.yaml:") || !strings.Contains(r.stderr, "class guests polices") {
		t.Errorf("export of a policing tree: exit %d\n%s\n%.300s", r.code, r.stderr, r.stdout)
	}
	if out := must(t, "export", "--fresh", "--partial", "../examples/isp.yaml"); !strings.Contains(out, "# not reproduced (--partial): eth1 egress") ||
		!strings.Contains(out, "# not reproducible with tc: bpf classifier") {
		t.Errorf("export --partial of a policing tree:\n%.600s", out)
	}
	if r := sluice(t, "export", "--fresh", "../examples/edt.yaml"); r.code != 2 || !strings.Contains(r.stderr, "backend edt") {
		t.Errorf("export of an EDT tree: exit %d\n%s", r.code, r.stderr)
	}
}

// A tree with a mark rule that this kernel classifies in BPF (its u32
// cannot match marks) is exported with its u32 filters, `match mark`
// included, not without filters (issue 57: the script sent everything
// to the default class, exit 0). Where the kernel's u32 matches marks
// (the stock-kernel lane), the script run by tc in a namespace without
// sluice classifies marked packets as apply does.
func TestExportMarkRuleReproducesClassification(t *testing.T) {
	testutil.RequireRoot(t)
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	pols := func(dev string) string {
		return policyFor(dev, `    egress:
      rate: 100mbit
      default: rest
      classes:
        - name: voip
          rate: 10mbit
          match: [{mark: 0x10/0xff}, {proto: udp, dport: 5060}]
        - name: rest
          rate: 10mbit
`)
	}
	applied, exported := testutil.NewPair(t), testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", pols(applied.DevA))
	must(t, "--netns", applied.A, "apply", "-q", pol)
	script := must(t, "--netns", applied.A, "export", pol)
	if !strings.Contains(script, "match mark 0x10 0xff flowid 1:10") {
		t.Fatalf("no mark filter in the export:\n%s", script)
	}
	if !rep.U32Mark && !strings.Contains(script, "needs CONFIG_CLS_U32_MARK") {
		t.Errorf("the export does not say its mark filters need CONFIG_CLS_U32_MARK:\n%s", script)
	}
	sf := filepath.Join(t.TempDir(), "export.tc")
	os.WriteFile(sf, []byte(script), 0o644)
	testutil.NS(t, exported.A, "tc", "-batch", sf)
	testutil.NeedFeature(t, "u32mark", rep.U32Mark)
	// 272 = 0x110: & 0xff = 0x10, so voip; mark 17 and none: rest.
	counts := func(ns string) (voip, rest uint64) {
		for _, args := range [][]string{{"-m", "272", "-c", "20"}, {"-m", "17", "-c", "10"}, {"-c", "10"}} {
			testutil.NS(t, ns, "ping", append(args, "-i", "0.01", "-q", testutil.AddrB)...)
		}
		out := tcShow(t, ns, "-s", "class", "show", "dev", "veth0")
		for _, m := range regexp.MustCompile(`class htb 1:(\d+) .*\n\s*Sent \d+ bytes (\d+) pkt`).FindAllStringSubmatch(out, -1) {
			n, _ := strconv.ParseUint(m[2], 10, 64)
			switch m[1] {
			case "10":
				voip = n
			case "11":
				rest = n
			}
		}
		return voip, rest
	}
	av, ar := counts(applied.A)
	ev, er := counts(exported.A)
	if av < 20 || av > 22 || ar < 20 || ev < 20 || ev > 22 || er < 20 {
		t.Fatalf("packets voip/rest: apply %d/%d, the export run by tc %d/%d: want 20 marked in voip (an ARP may join), the 20 others in rest", av, ar, ev, er)
	}
}

// Device names are almost free text ("$(id>x)" is a legal name) and a
// policy's path may hold a newline: the exported script quotes every
// name, keeps every comment on its line, runs nothing it should not,
// and builds exactly what apply builds on the same hostile devices.
func TestExportQuotesHostileNames(t *testing.T) {
	testutil.RequireRoot(t)
	const wan, lan, ifb = "$(id>x)", "a'b`id>y`", "\"i;id>z\""
	mk := func() string {
		ns := testutil.NewNetns(t, "x")
		for _, d := range []string{wan, lan} {
			testutil.NS(t, ns, "ip", "link", "add", "name", d, "type", "veth", "peer", "name", "p"+testutil.Unique("")[6:])
			testutil.NS(t, ns, "ip", "link", "set", "dev", d, "up")
		}
		return ns
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "p\nid>w\n.yaml")
	src := `interfaces:
  - name: '` + wan + `'
    egress:
      rate: 20mbit
      default: bulk
      classes:
        - name: ssh
          rate: 5mbit
          match: [{dport: 22}]
        - name: bulk
          rate: 10mbit
    ingress:
      rate: 50mbit
      ifb: '` + ifb + `'
  - name: "` + lan + `"
    egress: {rate: 30mbit}
`
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	applied := mk()
	must(t, "--netns", applied, "apply", "-q", file)
	devs := []string{wan, lan, ifb}
	for _, format := range []string{"sh", "tc"} {
		t.Run(format, func(t *testing.T) {
			exported := mk()
			script := must(t, "--netns", applied, "export", file, "--format", format)
			for _, l := range strings.Split(script, "\n") {
				if strings.HasPrefix(l, "id>") {
					t.Fatalf("the policy's path broke out of its comment:\n%s", script)
				}
			}
			work := t.TempDir()
			path := filepath.Join(work, "export")
			os.WriteFile(path, []byte(script), 0o755)
			var cmd *exec.Cmd
			if format == "sh" {
				cmd = exec.Command("ip", "netns", "exec", exported, "sh", path)
			} else {
				testutil.NS(t, exported, "ip", "link", "add", "name", ifb, "type", "ifb")
				testutil.NS(t, exported, "ip", "link", "set", "dev", ifb, "up")
				cmd = exec.Command("ip", "netns", "exec", exported, "tc", "-batch", path)
			}
			cmd.Dir = work
			if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
				t.Fatalf("running the export: %v\n%s\n%s", err, out, script)
			}
			for _, f := range []string{"x", "y", "z", "w"} {
				if _, err := os.Stat(filepath.Join(work, f)); err == nil {
					t.Errorf("the script ran a command hidden in a name (%s was created):\n%s", f, script)
				}
			}
			a, b := dump(t, applied, devs), dump(t, exported, devs)
			a, b = stateNoise[0].re.ReplaceAllString(a, "r2q TAG"), stateNoise[0].re.ReplaceAllString(b, "r2q TAG")
			if a != b || !strings.Contains(a, "class htb") {
				t.Fatalf("kernels differ:\n--- apply\n%s\n--- export\n%s", a, b)
			}
		})
	}
	// A name tc -batch cannot hold is refused, with where it stands.
	bad := writePolicy(t, "hash.yaml", "interfaces:\n  - name: 'eth#0'\n    egress: {rate: 10mbit}\n")
	if r := sluice(t, "export", bad); r.code != 2 || !strings.Contains(r.stderr, "hash.yaml:2:11: interface: device name \"eth#0\" cannot be written in a tc -batch script") {
		t.Fatalf("export of eth#0: exit %d\n%s", r.code, r.stderr)
	}
}
