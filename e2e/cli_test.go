package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/records"
	"sluice/testutil"
)

func TestValidateExitCodes(t *testing.T) {
	good := must(t, "validate", "../examples/office.yaml")
	if !strings.Contains(good, "valid") {
		t.Errorf("validate says %q", good)
	}
	bad := writePolicy(t, "bad.yaml", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbits\n      default: x\n")
	r := sluice(t, "validate", bad)
	if r.code != 2 || !regexp.MustCompile(`bad.yaml:4:13: egress rate: bad rate "20mbits".*did you mean 20mbit\?`).MatchString(r.stderr) {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if r := sluice(t, "validate", "/nonexistent.yaml"); r.code != 2 {
		t.Errorf("missing file: exit %d", r.code)
	}
	if r := sluice(t, "validate"); r.code != 2 {
		t.Errorf("missing argument: exit %d", r.code)
	}
	if r := sluice(t, "show", "--interval", "soon"); r.code != 2 || !strings.Contains(r.stderr, "invalid argument") {
		t.Errorf("bad flag: exit %d %s", r.code, r.stderr)
	}
}

// A namespace sluice never touched (a new one; every one after a reboot
// empties /run) has no records directory: the readers say there is
// nothing, and make none (show, munin and munin autoconf once panicked).
func TestReadersOnANewNamespace(t *testing.T) {
	ns := testutil.NewNetns(t, "new")
	for _, c := range []struct {
		args []string
		out  string
	}{
		{[]string{"show"}, "shapes nothing here"},
		{[]string{"show", "--json"}, `"trees"`},
		{[]string{"munin"}, ""},
		{[]string{"munin", "autoconf"}, "yes"},
		{[]string{"munin", "config"}, ""},
	} {
		r := sluice(t, append([]string{"--netns", ns}, c.args...)...)
		if r.code != 0 || strings.Contains(r.stderr, "panic") || !strings.Contains(r.stdout, c.out) {
			t.Errorf("%v: exit %d, want 0 and %q\n%s\n%s", c.args, r.code, c.out, r.stdout, r.stderr)
		}
	}
	if _, err := os.Stat(records.Dir(ns)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a reader made the records directory: %v", err)
	}
}

// Bad input never touches the kernel: a policy naming a missing
// interface is refused with its position, and nothing changes.
func TestMissingInterfaceChangesNothing(t *testing.T) {
	ns := devNS(t, "eth0")
	before := tcShow(t, ns, "qdisc", "show")
	pol := writePolicy(t, "p.yaml", "interfaces:\n  - name: eth0\n    egress: {rate: 10mbit}\n  - name: eth9\n    egress: {rate: 10mbit}\n")
	for _, cmd := range []string{"plan", "apply"} {
		r := sluice(t, "--netns", ns, cmd, pol)
		if r.code != 2 || !strings.Contains(r.stderr, "p.yaml:4:11: interface eth9 does not exist") || !strings.Contains(r.stderr, "(it has eth0, eth0p, lo)") {
			t.Fatalf("%s: exit %d\n%s", cmd, r.code, r.stderr)
		}
	}
	if after := tcShow(t, ns, "qdisc", "show"); after != before {
		t.Fatalf("kernel changed:\n%s\n%s", before, after)
	}
	if r := sluice(t, "--netns", "sltest-no-such-ns", "show"); r.code != 2 {
		t.Errorf("missing namespace: exit %d", r.code)
	}
}

// plan speaks the policy: trees, classes and groups of hosts, each with
// what changes in the policy's units, and a count; --tc the kernel's
// objects; --json both.
func TestPlanSpeaksThePolicy(t *testing.T) {
	ns := devNS(t, "eth0", "eth1")
	src, err := os.ReadFile("../examples/office.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// bulk's leaf is bfifo on every kernel (auto picks by kernel).
	src = []byte(strings.Replace(string(src), "          leaf: auto ", "          leaf: bfifo ", 1))
	pol := writePolicy(t, "office.yaml", string(src))
	first := must(t, "--netns", ns, "plan", pol)
	for _, want := range []string{
		"+ tree eth0/egress: rate 19mbit, 3 classes\n",
		"+ tree eth0/ingress: rate 95mbit, 2 classes\n",
		"+ class eth0/egress/web: rate 8mbit, ceil 19mbit, prio 1\n",
		"+ hosts eth1/egress/users: 254 added\n",
		"plan: trees 3 to add; classes 9 to add; hosts 254 to add\n",
	} {
		if !strings.Contains(first, want) {
			t.Errorf("first plan lacks %q:\n%s", want, first)
		}
	}
	must(t, "--netns", ns, "apply", "-q", pol)
	edited := strings.NewReplacer(
		"          rate: 8mbit", "          rate: 7mbit",
		"cidr: 192.168.1.0/24\n", "cidr: 192.168.1.0/25\n",
		"rate: 300kbit ", "rate: 200kbit ",
		"          leaf: bfifo ", "          leaf: pfifo ",
	).Replace(string(src))
	os.WriteFile(pol, []byte(edited), 0o644)
	want := `~ class eth0/egress/web: rate 8mbit -> 7mbit
~ class eth0/egress/bulk: leaf bfifo -> pfifo
~ tree eth1/egress: classification rules
~ class eth1/egress/users: rules
~ hosts eth1/egress/users: 126 changed, 128 removed
plan: tree 1 to change; classes 3 to change; hosts 126 to change, 128 to delete
`
	if got := must(t, "--netns", ns, "plan", pol); got != want {
		t.Errorf("plan of the edit:\n%s\nwant:\n%s", got, want)
	}
	var js struct {
		Changes []struct{ Op, Subject, Interface, Direction, Name, Detail string }
		Counts  map[string]map[string]int
		TC      []string
	}
	if err := json.Unmarshal([]byte(must(t, "--netns", ns, "plan", "--json", pol)), &js); err != nil {
		t.Fatal(err)
	}
	if len(js.Changes) != 5 || js.Counts["hosts"]["delete"] != 128 || len(js.TC) < 256 || js.Changes[0].Name != "web" || js.Changes[0].Detail != "rate 8mbit -> 7mbit" {
		t.Errorf("plan --json: %d changes, counts %v, %d tc lines; first %+v", len(js.Changes), js.Counts, len(js.TC), js.Changes[0])
	}
	must(t, "--netns", ns, "apply", "-q", pol)
	if out := must(t, "--netns", ns, "plan", pol); out != "no changes\n" {
		t.Errorf("plan after the edit: %q", out)
	}
}

func TestPlanApplyShowReset(t *testing.T) {
	light(t)
	ns := devNS(t, "eth0", "eth1")
	pol := "../examples/office.yaml"
	plan := must(t, "--netns", ns, "plan", "--tc", pol)
	if !strings.Contains(plan, "+ class eth0 parent 1:1 classid 1:10 htb rate 2mbit ceil 19mbit") || !strings.Contains(plan, "+ link ifb-eth0 type ifb") {
		t.Fatalf("plan:\n%.2000s", plan)
	}
	// --detailed-exitcode: 3 with changes to make (the same plan on
	// stdout, but for the tree tags a first apply draws; nothing more on
	// stderr), 0 without, 2 for bad input.
	tags := regexp.MustCompile(`r2q \d+`)
	if r := sluice(t, "--netns", ns, "plan", "--tc", "--detailed-exitcode", pol); r.code != 3 || tags.ReplaceAllString(r.stdout, "") != tags.ReplaceAllString(plan, "") || strings.Contains(r.stderr, "sluice:") {
		t.Errorf("plan --detailed-exitcode with changes: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := sluice(t, "--netns", ns, "plan", "--detailed-exitcode", "no-such.yaml"); r.code != 2 {
		t.Errorf("plan --detailed-exitcode of a missing file: exit %d", r.code)
	}
	out := must(t, "--netns", ns, "apply", "-q", pol)
	if !regexp.MustCompile(`applied: \d+ change\(s\), \d+ netlink write\(s\)`).MatchString(out) {
		t.Errorf("apply says %q", out)
	}
	if out := must(t, "--netns", ns, "plan", pol); strings.TrimSpace(out) != "no changes" {
		t.Fatalf("plan after apply: %.1000s", out)
	}
	if r := sluice(t, "--netns", ns, "plan", "--detailed-exitcode", pol); r.code != 0 || strings.TrimSpace(r.stdout) != "no changes" {
		t.Errorf("plan --detailed-exitcode without changes: exit %d\n%s", r.code, r.stdout)
	}
	if out := must(t, "--netns", ns, "apply", pol); strings.TrimSpace(out) != "no changes" {
		t.Fatalf("second apply: %.1000s", out)
	}
	text := must(t, "--netns", ns, "show", "--interval", "0", "eth0")
	for _, want := range []string{"eth0 egress", "interactive", "1:10", "ifb-eth0 ingress of eth0", "BORROWED"} {
		if !strings.Contains(text, want) {
			t.Errorf("show lacks %q:\n%s", want, text)
		}
	}
	var sample struct {
		Trees []struct {
			Device  string `json:"device"`
			Classes []struct {
				Name string `json:"name"`
				ID   string `json:"id"`
				Rate uint64 `json:"rate_bytes_per_second"`
				Ceil uint64 `json:"ceil_bytes_per_second"`
				// The names before base units, kept for one release.
				OldRate uint64 `json:"rate_bps"`
				OldCeil uint64 `json:"ceil_bps"`
				Depth   int    `json:"depth"`
			} `json:"classes"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(must(t, "--netns", ns, "show", "--json", "--interval", "100ms")), &sample); err != nil {
		t.Fatal(err)
	}
	found := false
	// Depths: the root's class 0, a top class 1, eth1's classes under
	// internet 2 (every depth read 0 once).
	depths := map[string]int{}
	for _, tr := range sample.Trees {
		for _, c := range tr.Classes {
			if tr.Device == "eth0" && c.Name == "web" && c.ID == "1:11" && c.Rate == 1000000 && c.Ceil == 2375000 &&
				c.OldRate == 8000000 && c.OldCeil == 19000000 {
				found = true
			}
			depths[tr.Device+" "+c.Name] = c.Depth
		}
	}
	if len(sample.Trees) != 3 || !found {
		t.Errorf("show --json: %+v", sample)
	}
	for name, want := range map[string]int{"eth0 (root)": 0, "eth0 web": 1, "eth1 internet": 1, "eth1 users": 2} {
		if got, ok := depths[name]; !ok || got != want {
			t.Errorf("show --json: %s at depth %d (present %v), want %d", name, got, ok, want)
		}
	}
	// --watch refreshes until interrupted: one JSON object per interval,
	// never two closer than the interval (however slow the machine: the
	// stock-kernel lane's emulated one collects slower than the host).
	cmd := exec.Command(bin, "--netns", ns, "show", "--watch", "--json", "--interval", "200ms")
	cmd.Env = append(cmd.Environ(), "SLUICE_STATE_DIR="+stateDir(t))
	pipe, _ := cmd.StdoutPipe()
	cmd.Start()
	var ats []time.Time
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 1<<20), 16<<20) // a line is ~80 KB here
	deadline := time.Now().Add(60 * time.Second)
	for len(ats) < 5 && time.Now().Before(deadline) && sc.Scan() {
		var s struct {
			At time.Time `json:"at"`
		}
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("watch line %.200q: %v", sc.Text(), err)
		}
		ats = append(ats, s.At)
	}
	cmd.Process.Signal(os.Interrupt)
	go io.Copy(io.Discard, pipe)
	cmd.Wait()
	if len(ats) < 5 {
		t.Fatalf("--watch printed %d lines in 60 s", len(ats))
	}
	for i := 1; i < len(ats); i++ {
		if gap := ats[i].Sub(ats[i-1]); gap < 190*time.Millisecond {
			t.Errorf("--watch at 200 ms: samples %d and %d only %v apart", i, i+1, gap)
		}
	}
	must(t, "--netns", ns, "reset", "--all")
	for _, dev := range []string{"eth0", "eth1"} {
		if q := tcShow(t, ns, "qdisc", "show", "dev", dev); strings.Contains(q, "htb") || strings.Contains(q, "clsact") {
			t.Errorf("%s after reset: %s", dev, q)
		}
	}
	if err := exec.Command("ip", "-n", ns, "link", "show", "ifb-eth0").Run(); err == nil {
		t.Error("ifb-eth0 still exists after reset")
	}
	if out := must(t, "--netns", ns, "show"); !strings.Contains(out, "shapes nothing") {
		t.Errorf("show after reset: %s", out)
	}
}

// doctor's findings agree with what tc(8) itself can create.
func TestDoctorAgreesWithTC(t *testing.T) {
	ns := devNS(t, "eth0")
	var rep struct {
		Qdiscs      map[string]bool `json:"qdiscs"`
		Classifiers map[string]bool `json:"classifiers"`
		Plan        []string        `json:"plan"`
		BPF         struct {
			SchedCLS bool `json:"sched_cls"`
		} `json:"bpf"`
		CC []string `json:"congestion_controls"`
	}
	if err := json.Unmarshal([]byte(must(t, "doctor", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"htb", "fq_codel", "sfq", "fq", "cake", "netem", "prio", "pfifo", "bfifo", "hfsc"} {
		out, _ := exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "9:", kind).CombinedOutput()
		exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root").Run()
		unknown := strings.Contains(string(out), "unknown")
		if rep.Qdiscs[kind] == unknown {
			t.Errorf("doctor says %s=%v, tc says %q", kind, rep.Qdiscs[kind], out)
		}
	}
	if !rep.Classifiers["u32"] || len(rep.CC) == 0 || len(rep.Plan) == 0 {
		t.Errorf("doctor: %+v", rep)
	}
	text := must(t, "doctor")
	if !strings.Contains(text, "sluice will:") || !strings.Contains(text, "qdiscs") {
		t.Errorf("doctor text:\n%s", text)
	}
}

// Leaf qdiscs and u32 mark matching end to end, where the kernel has
// them (apply, read back, export, reset); where it does not, the test
// says which feature is missing (the planner's refusal is tested in
// plan/plan_test.go).
func TestFeaturesTheKernelMayLack(t *testing.T) {
	rep := doctorJSON(t)
	for _, leaf := range []string{"fq_codel", "sfq", "fq", "cake", "pfifo", "bfifo"} {
		t.Run("leaf "+leaf, func(t *testing.T) {
			testutil.NeedFeature(t, leaf, rep.Qdiscs[leaf])
			ns := devNS(t, "eth0")
			pol := writePolicy(t, "p.yaml", "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n      leaf: "+leaf+"\n")
			must(t, "--netns", ns, "apply", "-q", pol)
			if q := tcShow(t, ns, "qdisc", "show", "dev", "eth0"); !strings.Contains(q, "qdisc "+leaf+" 10: parent 1:10") {
				t.Fatalf("no %s leaf: %s", leaf, q)
			}
			if out := must(t, "--netns", ns, "plan", pol); strings.TrimSpace(out) != "no changes" {
				t.Fatalf("%s leaf not idempotent: %s", leaf, out)
			}
			// The export builds the same on a fresh device.
			other := devNS(t, "eth0")
			path := filepath.Join(t.TempDir(), "export.sh")
			os.WriteFile(path, []byte(must(t, "--netns", ns, "export", pol, "--format", "sh")), 0o755)
			if out, err := exec.Command("ip", "netns", "exec", other, "sh", path).CombinedOutput(); err != nil {
				t.Fatalf("running the export: %v\n%s", err, out)
			}
			if a, b := dump(t, ns, []string{"eth0"}), dump(t, other, []string{"eth0"}); a != b {
				t.Fatalf("%s leaf: export differs from apply:\n%s\n---\n%s", leaf, a, b)
			}
			// Reset leaves the kernel's default.
			must(t, "--netns", ns, "reset", "eth0")
			if q := tcShow(t, ns, "qdisc", "show", "dev", "eth0"); strings.Contains(q, leaf+" 10:") || strings.Contains(q, "htb") {
				t.Fatalf("%s leaf after reset: %s", leaf, q)
			}
		})
	}
	t.Run("u32 mark", func(t *testing.T) {
		testutil.NeedFeature(t, "u32mark", rep.U32Mark)
		ns := devNS(t, "eth0")
		pol := writePolicy(t, "p.yaml", "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n      default: b\n      classes:\n        - name: a\n          rate: 1mbit\n          match: [{mark: 0x10/0xff}]\n        - name: b\n          rate: 1mbit\n")
		must(t, "--netns", ns, "apply", "-q", pol)
		if f := tcShow(t, ns, "filter", "show", "dev", "eth0"); !regexp.MustCompile(`mark 0x0*10 0x0*ff`).MatchString(f) {
			t.Fatalf("no mark match: %s", f)
		}
	})
}

type doctorReport struct {
	Qdiscs  map[string]bool `json:"qdiscs"`
	U32Mark bool            `json:"u32_mark"`
	Probed  bool            `json:"probed"`
}

func doctorJSON(t *testing.T) *doctorReport {
	t.Helper()
	var rep doctorReport
	if err := json.Unmarshal([]byte(must(t, "doctor", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	return &rep
}

// Packets marked by the sender (SO_MARK, as iptables MARK or a cgroup
// would set it) reach the class whose rule matches the mark: through
// u32 where the kernel's u32 matches marks, through sluice's BPF
// classifier where it does not (this project's CI kernel, Debian's).
func TestMarkedPacketsReachTheirClass(t *testing.T) {
	p := testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    egress:
      rate: 100mbit
      default: rest
      classes:
        - name: marked
          rate: 10mbit
          match: [{mark: 0x10/0xff}]
        - name: rest
          rate: 10mbit
`))
	must(t, "--netns", p.A, "apply", "-q", pol)
	testutil.NS(t, p.A, "ping", "-m", "272", "-c", "20", "-i", "0.01", "-q", testutil.AddrB) // 272 = 0x110: & 0xff = 0x10
	testutil.NS(t, p.A, "ping", "-m", "17", "-c", "10", "-i", "0.01", "-q", testutil.AddrB)
	testutil.NS(t, p.A, "ping", "-c", "10", "-i", "0.01", "-q", testutil.AddrB)
	got := map[string]uint64{}
	for _, c := range showJSON(t, p.A).Trees[0].Classes {
		got[c.Name] = c.Packets
	}
	if got["marked"] < 20 || got["marked"] > 22 || got["rest"] < 20 {
		t.Fatalf("class packets %v: want 20 in marked (the ARP of a second may join), the 20 others in rest", got)
	}
}

// Without root: the commands that change the kernel or build a bed say
// so up front, naming the capability and what works without (a
// permission error deep inside once advised removing sluice's records;
// the demo panicked), and validate, export and lab list work. (show,
// plan and munin read: TestReadWithoutRoot.)
func TestWithoutRoot(t *testing.T) {
	testutil.RequireRoot(t)
	dir, nb := nobodysCopy(t)
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte("interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n      default: bulk\n      classes:\n        - {name: bulk, rate: 9mbit}\n"), 0o644)
	run := func(args ...string) result {
		cmd := exec.Command(nb, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		cmd.Dir = dir
		return runCmd(t, cmd)
	}
	for _, args := range [][]string{{"apply", pol}, {"reset", "--all"}, {"demo"},
		{"lab", "up", "fair-share"}, {"lab", "run", "fair-share"}, {"lab", "down", "--all"}, {"agent", pol}} {
		r := run(args...)
		if r.code != 1 || !strings.Contains(r.stderr, "needs root (or CAP_NET_ADMIN)") || strings.Contains(r.stderr, "panic") {
			t.Errorf("%v without root: exit %d\n%s", args, r.code, r.stderr)
		}
	}
	// doctor reads what anyone may and says what only a probe would
	// tell (issue 61); as root it probes.
	if r := run("doctor"); r.code != 0 || !strings.Contains(r.stdout, "not read        qdiscs, classifiers and actions: not probed") {
		t.Errorf("doctor without root: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var unprobed struct {
		Probed bool     `json:"probed"`
		Unread []string `json:"unread"`
		Kernel string   `json:"kernel"`
	}
	if r := run("doctor", "--json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &unprobed) != nil || unprobed.Probed || len(unprobed.Unread) != 3 || unprobed.Kernel == "" {
		t.Errorf("doctor --json without root: exit %d %+v\n%s", r.code, unprobed, r.stderr)
	}
	if rep := doctorJSON(t); !rep.Probed {
		t.Error("doctor as root did not probe")
	}
	if r := run("validate", pol); r.code != 0 || !strings.Contains(r.stdout, "valid") {
		t.Errorf("validate without root: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := run("export", pol); r.code != 0 || !strings.Contains(r.stdout, "qdisc add dev eth0 root") || !strings.Contains(r.stderr, "as --kernel full --fresh") {
		t.Errorf("export without root: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := run("version"); r.code != 0 || !regexp.MustCompile(`^sluice v\S+ \(commit \S+, go1\.[0-9.]+, linux/\w+\)\n$`).MatchString(r.stdout) {
		t.Errorf("version: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	// Each scenario with how long its traffic runs: fair-share's three
	// variants of 19 s.
	if r := run("lab", "list"); r.code != 0 || !regexp.MustCompile(`(?m)^fair-share +57 s  Eight users`).MatchString(r.stdout) {
		t.Errorf("lab list without root: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// --netns and --lock-timeout are refused where they mean nothing (a
// user who gives them expects an effect that would silently not happen),
// before anything runs; where they mean something they are taken.
func TestNamespaceFlagsOnlyWhereTheyAct(t *testing.T) {
	pol := writePolicy(t, "p.yaml", "interfaces:\n  - name: eth0\n    egress: {rate: 10mbit}\n")
	for _, args := range [][]string{
		{"--netns", "x", "validate", pol},
		{"validate", "--netns", "x", pol},
		{"--netns", "x", "lab", "list"},
		{"--netns", "x", "doctor"},
		{"--lock-timeout", "1s", "version"},
	} {
		r := sluice(t, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "means nothing for `sluice ") || r.stdout != "" {
			t.Errorf("%v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	ns := devNS(t, "eth0")
	if r := sluice(t, "--netns", ns, "--lock-timeout", "5s", "plan", "--tc", pol); r.code != 0 || !strings.Contains(r.stdout, "+ qdisc eth0 root") {
		t.Errorf("plan with --netns and --lock-timeout: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := sluice(t, "--netns", ns, "munin", "config"); r.code != 0 {
		t.Errorf("munin config with --netns: exit %d\n%s", r.code, r.stderr)
	}
}
