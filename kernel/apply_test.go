package kernel_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sluice/features"
	"sluice/internal/writecap"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
	"sluice/testutil"
)

// bed is a namespace with veth pairs named like the policy's interfaces.
type bed struct {
	ns   string
	k    *kernel.Kernel
	conn *tc.Writer // the test's own, as another tool's: not the executor's
}

func newBed(t *testing.T, devs ...string) *bed {
	t.Helper()
	testutil.RequireRoot(t)
	t.Setenv("SLUICE_STATE_DIR", t.TempDir())
	ns := testutil.NewNetns(t, "k")
	for _, d := range devs {
		testutil.NS(t, ns, "ip", "link", "add", d, "type", "veth", "peer", "name", d+"p")
		testutil.NS(t, ns, "ip", "link", "set", d, "up")
		testutil.NS(t, ns, "ip", "link", "set", d+"p", "up")
	}
	k, err := kernel.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	// The test's own handle, for what another tool would do and read.
	conn, err := tc.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &bed{ns: ns, k: k, conn: conn.Writer(writecap.Token{})}
}

func parse(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, _, err := policy.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func kernelFeatures(t *testing.T) plan.Features {
	t.Helper()
	r, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	return r.Features()
}

func (b *bed) plan(t *testing.T, pol *policy.Policy) *plan.Plan {
	t.Helper()
	p, err := b.k.Plan(pol, kernelFeatures(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readFull plans pol and reads every tree back.
func (b *bed) readFull(t *testing.T, pol *policy.Policy, force bool) (*plan.Plan, *kernel.Live, error) {
	t.Helper()
	p := b.plan(t, pol)
	live, err := b.k.ReadLive(p, nil, force)
	return p, live, err
}

// apply runs the whole apply path and returns the number of writes.
func (b *bed) apply(t *testing.T, pol *policy.Policy, force bool) (int, error) {
	t.Helper()
	p, live, err := b.readFull(t, pol, force)
	if err != nil {
		return 0, err
	}
	d := kernel.Compute(live.Objects, p.Objects(), live.Opt)
	if force {
		for i := range d.Changes {
			if q, ok := d.Changes[i].Obj.(*tc.Qdisc); ok && q.Parent == tc.HandleRoot {
				d.Changes[i].Force = true
			}
		}
	}
	res, err := b.k.Executor(writecap.Token{}).Apply(d)
	if err != nil {
		return 0, err
	}
	if err := b.k.Executor(writecap.Token{}).Record(p, d, live, "p.yaml"); err != nil {
		t.Fatal(err)
	}
	return res.Writes, nil
}

// snapshot lists everything tc shows on the namespace's devices (minus
// counters and kernel-chosen u32 root table ids), for before/after
// comparisons.
func (b *bed) snapshot(t *testing.T) string {
	t.Helper()
	var out []string
	links := testutil.Run(t, "ip", "-n", b.ns, "-o", "link", "show")
	for _, l := range strings.Split(strings.TrimSpace(links), "\n") {
		f := strings.Fields(l)
		dev := strings.TrimSuffix(strings.Split(f[1], "@")[0], ":")
		out = append(out, "link "+dev)
		// One tc for the device's three reads: the emulated lane starts
		// a program in about 100 ms, and this runs after every fault of
		// TestRollbackAtEveryStep.
		cmd := exec.Command("tc", "-n", b.ns, "-batch", "-")
		cmd.Stdin = strings.NewReader(fmt.Sprintf("qdisc show dev %[1]s\nclass show dev %[1]s\nfilter show dev %[1]s ingress\n", dev))
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tc -batch on %s: %v\n%s", dev, err, got)
		}
		for _, l := range normalize(string(got)) {
			out = append(out, dev+": "+l)
		}
		cls, err := b.k.Classes(dev, tc.MakeHandle(1, 0))
		if err == nil {
			for _, c := range cls {
				fs, _ := b.conn.Filters(dev, c.Handle)
				for _, f := range fs {
					out = append(out, f.Describe())
				}
			}
		}
		fs, _ := b.conn.Filters(dev, tc.MakeHandle(1, 0))
		for _, f := range fs {
			out = append(out, f.Describe())
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

var counters = regexp.MustCompile(`direct_packets_stat \d+ `)

// flowClasses are the classes fq_codel, sfq and cake show for the flows
// they hold at the moment: traffic, not configuration.
var flowClasses = regexp.MustCompile(`^class (fq_codel|sfq|cake|fq) `)

func normalize(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		l = counters.ReplaceAllString(strings.TrimSpace(l), "")
		if l == "" || strings.HasPrefix(l, "filter") && strings.Contains(l, "fh 8") || flowClasses.MatchString(l) {
			continue // u32 root tables: ids chosen by the kernel
		}
		out = append(out, l)
	}
	return out
}

func TestApplyExamplesCarryThePlan(t *testing.T) {
	for _, ex := range []struct {
		file string
		devs []string
	}{
		{"../examples/wondershaper.yaml", []string{"eth0"}},
		{"../examples/per-user.yaml", []string{"lan0"}},
		{"../examples/ipv6.yaml", []string{"eth0"}},
		{"../examples/office.yaml", []string{"eth0", "eth1"}},
	} {
		t.Run(ex.file, func(t *testing.T) {
			b := newBed(t, ex.devs...)
			pol, _, err := policy.Load(ex.file)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.apply(t, pol, false); err != nil {
				t.Fatal(err)
			}
			// The kernel holds exactly the plan: a fresh diff is empty.
			p, err := b.k.Plan(pol, kernelFeatures(t))
			if err != nil {
				t.Fatal(err)
			}
			live, err := b.k.ReadLive(p, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if d := kernel.Compute(live.Objects, p.Objects(), live.Opt); !d.Empty() {
				t.Fatalf("after apply the kernel differs from the plan in %d ways, first: %s %s", len(d.Changes), d.Changes[0].Verb, d.Changes[0].Obj.Describe())
			}
			// By key: a clsact two trees of an interface use (a BPF hook
			// on its egress, the redirect to its ifb on its ingress) is in
			// both devices' plans, and once in the kernel.
			count := func(objs []tc.Object) int {
				keys := map[string]bool{}
				for _, o := range objs {
					if f, ok := o.(*tc.Filter); !ok || !f.IsTP() {
						keys[o.Key()] = true
					}
				}
				return len(keys)
			}
			planned, got := count(p.Objects()), count(live.Objects)
			if got != planned {
				t.Errorf("kernel holds %d objects, plan has %d", got, planned)
			}
			// A second apply writes nothing.
			before := b.k.Writes()
			if n, err := b.apply(t, pol, false); err != nil || n != 0 || b.k.Writes() != before {
				t.Fatalf("second apply: %d writes, %v", n, err)
			}
		})
	}
}

const basePolicy = `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      default: bulk
      classes:
        - name: ssh
          rate: 2mbit
          prio: 0
          match: [{dport: 22}, {proto: icmp}]
        - name: web
          rate: 8mbit
          prio: 1
          match: [{proto: tcp, dport: [80, 443]}]
        - name: bulk
          rate: 5mbit
          prio: 2
`

func TestRateChangeIsOneWrite(t *testing.T) {
	b := newBed(t, "eth0")
	if _, err := b.apply(t, parse(t, basePolicy), false); err != nil {
		t.Fatal(err)
	}
	n, err := b.apply(t, parse(t, strings.Replace(basePolicy, "rate: 8mbit", "rate: 9mbit", 1)), false)
	if err != nil || n != 1 {
		t.Fatalf("rate change: %d writes, %v", n, err)
	}
	out := testutil.NS(t, b.ns, "tc", "class", "show", "dev", "eth0", "classid", "1:11")
	if !strings.Contains(out, "rate 9Mbit") {
		t.Fatalf("kernel says: %s", out)
	}
}

// rawHandles maps each filter node of a class (by its note) to the handle
// the kernel gave it: unchanged handles prove a node was not re-created.
func rawHandles(t *testing.T, b *bed) map[string]uint32 {
	fs, err := b.conn.Filters("eth0", tc.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, f := range fs {
		if !f.IsTP() {
			out[fmt.Sprintf("%d/%x", f.Prio, f.Handle)] = f.Raw
		}
	}
	return out
}

func TestAddAndRemoveClassTouchOnlyIt(t *testing.T) {
	b := newBed(t, "eth0")
	if _, err := b.apply(t, parse(t, basePolicy), false); err != nil {
		t.Fatal(err)
	}
	before := rawHandles(t, b)
	classesBefore := testutil.NS(t, b.ns, "tc", "class", "show", "dev", "eth0")
	withDNS := strings.Replace(basePolicy, "        - name: bulk", "        - name: dns\n          rate: 2mbit\n          match: [{proto: udp, dport: 53}]\n        - name: bulk", 1)
	n, err := b.apply(t, parse(t, withDNS), false)
	// class, leaf, table, its node, the IPv4 link node, the IPv6 node
	if err != nil || n != 6 {
		t.Fatalf("adding a class: %d writes, %v", n, err)
	}
	after := rawHandles(t, b)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("filter %s re-created (%x -> %x)", k, v, after[k])
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(classesBefore), "\n") {
		if flowClasses.MatchString(l) {
			continue // fq_codel's flows come and go with traffic
		}
		if !strings.Contains(testutil.NS(t, b.ns, "tc", "class", "show", "dev", "eth0"), l) {
			t.Errorf("class changed: %s", l)
		}
	}
	// Remove it again: back to the first state, other filters untouched.
	if _, err := b.apply(t, parse(t, basePolicy), false); err != nil {
		t.Fatal(err)
	}
	final := rawHandles(t, b)
	for k, v := range before {
		if final[k] != v {
			t.Errorf("filter %s re-created on removal (%x -> %x)", k, v, final[k])
		}
	}
	if len(final) != len(before) {
		t.Errorf("%d filter nodes, had %d", len(final), len(before))
	}
}

// A failure at any step of a multi-step apply leaves the kernel exactly
// as it was. The change from A to B deletes, changes, replaces and adds
// objects on two trees and an ingress hook.
func TestRollbackAtEveryStep(t *testing.T) {
	polA := `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      default: bulk
      classes:
        - name: ssh
          rate: 2mbit
          match: [{dport: 22}]
        - name: users
          rate: 4mbit
          per_host: {by: dst, cidr: 10.0.0.0/29}
        - name: bulk
          rate: 5mbit
`
	polB := `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      default: bulk
      classes:
        - name: web
          rate: 3mbit
          match: [{proto: tcp, dport: 80-90}]
        - name: users
          rate: 6mbit
          per_host: {by: dst, cidr: 10.0.0.0/30}
        - name: bulk
          rate: 5mbit
          leaf: pfifo
    ingress:
      rate: 30mbit
`
	for _, from := range []string{"", polA} {
		name := "from-empty"
		if from != "" {
			name = "from-A"
		}
		t.Run(name, func(t *testing.T) {
			b := newBed(t, "eth0")
			if from != "" {
				if _, err := b.apply(t, parse(t, from), false); err != nil {
					t.Fatal(err)
				}
			}
			start := b.snapshot(t)
			startState, _ := os.ReadFile(records.Dir(b.ns) + "/state.json")
			// Count the steps of the full change first.
			p, err := b.k.Plan(parse(t, polB), kernelFeatures(t))
			if err != nil {
				t.Fatal(err)
			}
			live, err := b.k.ReadLive(p, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			d := kernel.Compute(live.Objects, p.Objects(), live.Opt)
			writes := 0
			for _, c := range d.Changes {
				if f, ok := c.Obj.(*tc.Filter); ok && f.IsTP() && c.Verb == tc.Add {
					continue
				}
				writes++
				if l, ok := c.Obj.(*tc.Link); ok && c.Verb == tc.Add && l.Up {
					writes++ // add, then up
				}
			}
			if writes < 10 {
				t.Fatalf("only %d writes: not a multi-step change", writes)
			}
			for fail := 1; fail <= writes; fail++ {
				start0 := b.k.Writes()
				b.k.InjectWriteFault(func(n int, what string) error {
					if n-start0 == fail {
						return fmt.Errorf("%w at %s", tc.ErrInjected, what)
					}
					return nil
				})
				_, err := b.apply(t, parse(t, polB), false)
				b.k.InjectWriteFault(nil)
				var ae *kernel.ApplyError
				if !errors.As(err, &ae) || !errors.Is(err, tc.ErrInjected) || !ae.RolledBack {
					t.Fatalf("failure at write %d: %v", fail, err)
				}
				if now := b.snapshot(t); now != start {
					t.Fatalf("failure at write %d (%s): the kernel was not restored:\n%s", fail, ae.Op, diffLines(start, now))
				}
				if st, _ := os.ReadFile(records.Dir(b.ns) + "/state.json"); string(st) != string(startState) {
					t.Fatalf("failure at write %d: records changed", fail)
				}
			}
			// And without a fault it goes through.
			if _, err := b.apply(t, parse(t, polB), false); err != nil {
				t.Fatal(err)
			}
			if n, _ := b.apply(t, parse(t, polB), false); n != 0 {
				t.Fatalf("apply after recovery not idempotent: %d writes", n)
			}
			t.Logf("%d steps, each injected and rolled back", writes)
		})
	}
}

func diffLines(a, b string) string {
	as, bs := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(a, "\n") {
		as[l] = true
	}
	for _, l := range strings.Split(b, "\n") {
		bs[l] = true
	}
	var out []string
	for l := range as {
		if !bs[l] {
			out = append(out, "- "+l)
		}
	}
	for l := range bs {
		if !as[l] {
			out = append(out, "+ "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func TestLockKeepsAppliesApart(t *testing.T) {
	b := newBed(t, "eth0")
	held, err := records.AcquireLock(b.k.RecordsDir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = b.k.Lock(300 * time.Millisecond)
	if !errors.Is(err, records.ErrLocked) || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("second lock: %v after %v", err, time.Since(start))
	}
	if !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Errorf("error does not name the holder: %v", err)
	}
	held.Release()
	if err := b.k.Lock(time.Second); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func TestForeignRootNeedsForce(t *testing.T) {
	b := newBed(t, "eth0")
	testutil.NS(t, b.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "5:", "tbf", "rate", "1mbit", "burst", "10k", "latency", "50ms")
	before := b.snapshot(t)
	_, err := b.apply(t, parse(t, basePolicy), false)
	var fe *kernel.ForeignRootError
	if !errors.As(err, &fe) || fe.Kind != "tbf" {
		t.Fatalf("apply over a foreign root: %v", err)
	}
	if b.snapshot(t) != before {
		t.Fatal("refused apply changed the kernel")
	}
	if _, err := b.apply(t, parse(t, basePolicy), true); err != nil {
		t.Fatalf("--force: %v", err)
	}
	if out := testutil.NS(t, b.ns, "tc", "qdisc", "show", "dev", "eth0"); !strings.Contains(out, "qdisc htb 1: root") || strings.Contains(out, "tbf") {
		t.Fatalf("after --force: %s", out)
	}
}

// Reset removes sluice's objects and nothing else: a clsact sluice
// adopted keeps its other filters, a foreign device keeps its qdisc, an
// ifb sluice created goes away.
func TestResetTouchesNothingElse(t *testing.T) {
	b := newBed(t, "eth0", "other")
	testutil.NS(t, b.ns, "tc", "qdisc", "add", "dev", "other", "root", "handle", "7:", "htb", "default", "1")
	testutil.NS(t, b.ns, "tc", "qdisc", "add", "dev", "eth0", "clsact")
	testutil.NS(t, b.ns, "tc", "filter", "add", "dev", "eth0", "ingress", "prio", "10", "protocol", "ip", "u32", "match", "ip", "dst", "1.2.3.4/32", "flowid", "1:1")
	foreign := b.snapshot(t)
	pol := strings.Replace(basePolicy, "      rate: 20mbit\n", "      rate: 20mbit\n", 1) + "    ingress:\n      rate: 50mbit\n"
	if _, err := b.apply(t, parse(t, pol), false); err != nil {
		t.Fatal(err)
	}
	if !b.k.LinkExists("ifb-eth0") {
		t.Fatal("no ifb")
	}
	d, names, err := b.k.ResetPlan([]string{"eth0"}, false)
	if err != nil || len(names) != 2 {
		t.Fatalf("reset plan: %v %v", names, err)
	}
	if _, err := b.k.Executor(writecap.Token{}).Apply(d); err != nil {
		t.Fatal(err)
	}
	if err := b.k.Executor(writecap.Token{}).Forget(names); err != nil {
		t.Fatal(err)
	}
	if after := b.snapshot(t); after != foreign {
		t.Fatalf("reset left the namespace different:\n%s", diffLines(foreign, after))
	}
	if len(b.k.Records().Devices) != 0 {
		t.Errorf("records left: %v", b.k.Records().Names())
	}
}

func TestAdoptedIfbSurvivesReset(t *testing.T) {
	b := newBed(t, "eth0")
	testutil.NS(t, b.ns, "ip", "link", "add", "ifb-eth0", "type", "ifb")
	if _, err := b.apply(t, parse(t, "interfaces:\n  - name: eth0\n    ingress:\n      rate: 10mbit\n"), false); err != nil {
		t.Fatal(err)
	}
	if up := testutil.NS(t, b.ns, "ip", "link", "show", "ifb-eth0"); !strings.Contains(up, ",UP") {
		t.Errorf("adopted ifb not set up: %s", up)
	}
	d, names, err := b.k.ResetPlan([]string{"eth0"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.k.Executor(writecap.Token{}).Apply(d); err != nil {
		t.Fatal(err)
	}
	b.k.Executor(writecap.Token{}).Forget(names)
	if !b.k.LinkExists("ifb-eth0") {
		t.Fatal("reset deleted an ifb sluice did not create")
	}
	if out := testutil.NS(t, b.ns, "tc", "qdisc", "show", "dev", "eth0"); strings.Contains(out, "clsact") {
		t.Errorf("clsact sluice created is still there: %s", out)
	}
}

// Apply sends runs of changes many to a send, and the kernel carries on
// after a refused message: a refusal in the middle of a send must still
// undo the changes before it and the ones after it in the same send.
func TestRefusalMidSendRollsBackBothSides(t *testing.T) {
	b := newBed(t, "eth0")
	root := &tc.Qdisc{Dev: "eth0", Parent: tc.HandleRoot, Handle: tc.MakeHandle(1, 0), Kind: "htb", HTB: &tc.HTBQdisc{R2Q: 10}}
	if _, err := b.k.Executor(writecap.Token{}).Apply(&kernel.Diff{Changes: []kernel.Change{{Op: tc.Op{Verb: tc.Add, Obj: root}}}}); err != nil {
		t.Fatal(err)
	}
	start := b.snapshot(t)
	var changes []kernel.Change
	for i := range 40 {
		cl := &tc.Class{Dev: "eth0", Parent: tc.MakeHandle(1, 0), Handle: tc.MakeHandle(1, uint16(0x10+i)), Kind: "htb",
			Rate: 125000, Ceil: 125000, Burst: 3028, Cburst: 3028, Quantum: 67050}
		if i == 20 {
			cl.Rate = 0 // HTB refuses a class without a rate
		}
		leaf := &tc.Qdisc{Dev: "eth0", Parent: cl.Handle, Handle: tc.MakeHandle(uint16(0x100+i), 0), Kind: "bfifo", Fifo: &tc.Fifo{Limit: 9000}}
		changes = append(changes, kernel.Change{Op: tc.Op{Verb: tc.Add, Obj: cl}}, kernel.Change{Op: tc.Op{Verb: tc.Add, Obj: leaf}})
	}
	_, err := b.k.Executor(writecap.Token{}).Apply(&kernel.Diff{Changes: changes})
	var ae *kernel.ApplyError
	if !errors.As(err, &ae) || !errors.Is(err, unix.EINVAL) || ae.Step != 41 || !ae.RolledBack {
		t.Fatalf("got %v, want step 41 (class 1:24) refused and rolled back", err)
	}
	if now := b.snapshot(t); now != start {
		t.Fatalf("the kernel was not restored:\n%s", diffLines(start, now))
	}
}

// A device deleted in the middle of an apply takes sluice's objects on
// it along: there is nothing to roll back there, and the error says so
// in one line instead of one per undo step (it printed thousands).
func TestDeviceVanishingMidApply(t *testing.T) {
	b := newBed(t, "eth0")
	pol := parse(t, `interfaces:
  - name: eth0
    egress:
      rate: 100mbit
      classifier: u32
      default: rest
      classes:
        - name: subs
          rate: 80mbit
          per_host: {by: dst, cidr: 10.6.0.0/23}
        - name: rest
          rate: 10mbit
`)
	start0 := b.k.Writes()
	b.k.InjectWriteFault(func(n int, what string) error {
		if n-start0 == 700 { // after the first sends went through
			testutil.NS(t, b.ns, "ip", "link", "del", "eth0")
		}
		return nil
	})
	_, err := b.apply(t, pol, false)
	b.k.InjectWriteFault(nil)
	var ae *kernel.ApplyError
	if !errors.As(err, &ae) || !ae.RolledBack || len(ae.Vanished) != 1 || ae.Vanished[0] != "eth0" {
		t.Fatalf("want a rolled-back apply naming eth0 as vanished, got %v", err)
	}
	t.Log(err)
	if msg := err.Error(); strings.Count(msg, "\n") > 0 || len(msg) > 400 || !strings.Contains(msg, "device eth0 disappeared meanwhile") {
		t.Fatalf("error message (%d bytes):\n%.2000s", len(msg), msg)
	}
}

// --force takes out another tool's redirect on the ingress hook that
// runs before sluice's (the shaping the ingress tree replaces), and
// puts it back, with everything else, when the apply fails at any write.
func TestForceRemovesAForeignRedirectAndRollsBack(t *testing.T) {
	b := newBed(t, "eth0")
	for _, c := range [][]string{
		{"ip", "link", "add", "ifb0", "type", "ifb"},
		{"tc", "qdisc", "add", "dev", "eth0", "handle", "ffff:", "ingress"},
		{"tc", "filter", "add", "dev", "eth0", "parent", "ffff:", "protocol", "all", "prio", "10", "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "ifb0"},
	} {
		testutil.NS(t, b.ns, c[0], c[1:]...)
	}
	pol := parse(t, "interfaces:\n  - name: eth0\n    ingress: {rate: 30mbit}\n")
	p, err := b.k.Plan(pol, kernelFeatures(t))
	if err != nil {
		t.Fatal(err)
	}
	live, err := b.k.ReadLive(p, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(live.Foreign) != 1 || live.Foreign[0].Prio != 10 || !live.Foreign[0].Redirect || live.Foreign[0].Removed || live.Foreign[0].What != "redirect to ifb0" {
		t.Fatalf("without force: %+v", live.Foreign)
	}
	if live, err = b.k.ReadLive(p, nil, true); err != nil || len(live.Foreign) != 1 || !live.Foreign[0].Removed {
		t.Fatalf("with force: %+v %v", live.Foreign, err)
	}
	writes := len(kernel.Compute(live.Objects, p.Objects(), live.Opt).Changes)
	start := b.snapshot(t)
	rolled := 0
	for fail := 1; fail <= writes; fail++ {
		rolled++
		start0 := b.k.Writes()
		b.k.InjectWriteFault(func(n int, what string) error {
			if n-start0 == fail {
				return fmt.Errorf("%w at %s", tc.ErrInjected, what)
			}
			return nil
		})
		_, err := b.apply(t, pol, true)
		b.k.InjectWriteFault(nil)
		var ae *kernel.ApplyError
		if !errors.As(err, &ae) {
			rolled--
			break // fewer writes than changes: the apply went through
		}
		// The redirect put back is a new action instance: its index
		// is the kernel's next.
		if now := actionIndex.ReplaceAllString(b.snapshot(t), "index N"); now != actionIndex.ReplaceAllString(start, "index N") {
			t.Fatalf("failure at write %d (%s): the kernel was not restored:\n%s", fail, ae.Op, diffLines(start, now))
		}
	}
	if rolled < 3 {
		t.Fatalf("only %d faults injected and rolled back", rolled)
	}
	t.Logf("%d writes failed in turn, each rolled back", rolled)
	if _, err := b.apply(t, pol, true); err != nil {
		t.Fatal(err)
	}
	if out := testutil.NS(t, b.ns, "tc", "filter", "show", "dev", "eth0", "ingress"); strings.Contains(out, "ifb0") || !strings.Contains(out, "ifb-eth0") {
		t.Fatalf("after --force:\n%s", out)
	}
}

var actionIndex = regexp.MustCompile(`index \d+`)
