package engine_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/engine"
	"sluice/plan"
	"sluice/stats"
	"sluice/testutil"
	"sluice/units"
)

// A session's pass is steady (counters only, nothing planned or read
// back) after a pass that read every tree and found nothing to change,
// until something it did not write changes: a hand edit of a class,
// a link, another policy, a write of its own that is not a limit, or
// the full-read period. Its own limit writes keep it steady.
func TestSessionSteady(t *testing.T) {
	opts, pol, _ := sessionBed(t)
	opts.Full = true
	opts.FullEvery = 3 * time.Second
	s := engine.NewSession(opts)
	t.Cleanup(s.Close)
	settle := func(t *testing.T) *engine.Prepared {
		t.Helper()
		n, p := apply(t, s, pol, opts)
		s.Settled(pol, p)
		p.Close()
		if n != 0 {
			t.Fatalf("the settling pass made %d changes: %v", n, p.Diff.Changes)
		}
		return p
	}
	steady := func(t *testing.T, want bool, why string) *stats.Sample {
		t.Helper()
		smp, ok := s.Steady(pol)
		if ok != want {
			t.Fatalf("%s: steady %v, want %v", why, ok, want)
		}
		return smp
	}

	n, p := apply(t, s, pol, opts)
	s.Settled(pol, p)
	p.Close()
	if n == 0 {
		t.Fatal("the first apply changed nothing")
	}
	steady(t, false, "after a pass that wrote")
	p = settle(t)
	smp := steady(t, true, "after a pass that found nothing")
	if len(smp.Trees) != 1 || len(smp.Trees[0].Classes) < 3 {
		t.Fatalf("steady sample: %+v", smp.Trees)
	}
	names := map[string]bool{}
	for _, c := range smp.Trees[0].Classes {
		names[c.Name] = true
	}
	if !names["a"] || !names["b"] {
		t.Errorf("steady sample lacks the policy's classes: %v", names)
	}
	steady(t, true, "a second steady pass")

	a := classOf(t, p.Plan, "a")
	t.Run("own limit writes keep it steady", func(t *testing.T) {
		lp, err := s.PrepareLimits()
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.SetLimits(lp, plan.Limits{plan.ClassLimit(a): {Rate: mbit(10), Ceil: mbit(20)}})
		lp.Close()
		if err != nil || res.Changes != 1 {
			t.Fatalf("SetLimits: %v, %+v", err, res)
		}
		smp := steady(t, true, "after the session's own limit write")
		if r, c := sampled(t, smp, "a"); r != mbit(10) || c != mbit(20) {
			t.Fatalf("a: rate %v ceil %v, want 10mbit 20mbit", r, c)
		}
		if !s.LimitsHold(s.Limits()) || s.LimitsHold(plan.Limits{}) {
			t.Error("LimitsHold does not tell the limits written from others")
		}
	})

	for _, tt := range []struct {
		name   string
		change func(t *testing.T)
	}{
		{"a class changed by hand", func(t *testing.T) {
			testutil.NS(t, opts.Netns, "tc", "class", "change", "dev", "eth0", "parent", a.Parent.String(), "classid", a.Handle.String(),
				"htb", "rate", "1mbit", "ceil", "2mbit")
		}},
		{"a link added", func(t *testing.T) {
			testutil.NS(t, opts.Netns, "ip", "link", "add", "x0", "type", "veth", "peer", "name", "x1")
		}},
		{"another policy", func(t *testing.T) {
			other := *pol
			if _, ok := s.Steady(&other); ok {
				t.Error("steady for another policy")
			}
		}},
		{"the full-read period passed", func(t *testing.T) {
			time.Sleep(opts.FullEvery)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			settle(t)
			steady(t, true, "before")
			tt.change(t)
			steady(t, false, "after")
			steady(t, false, "until a full pass")
			// The full pass puts back what was changed by hand (the
			// session's limits included), and settles.
			_, fp := apply(t, s, pol, opts)
			fp.Close()
			settle(t)
			smp := steady(t, true, "after the full pass")
			if r, c := sampled(t, smp, "a"); r != mbit(10) || c != mbit(20) {
				t.Errorf("a: rate %v ceil %v after the full pass, want the limits 10mbit 20mbit", r, c)
			}
		})
	}
}

// sampled returns class name's rate and ceil as a sample read them
// (a get of the class would itself be notified).
func sampled(t *testing.T, smp *stats.Sample, name string) (rate, ceil units.Rate) {
	t.Helper()
	for _, tr := range smp.Trees {
		for _, c := range tr.Classes {
			if c.Name == name {
				return c.Rate, c.Ceil
			}
		}
	}
	t.Fatalf("no class %s in the sample", name)
	return 0, 0
}

// A steady pass reads what a full read reads: the same classes in the
// same order, with their names, depths, leaves, counters, classifier
// counts and policers, on a sharded tree with a BPF classifier, hosts
// and a policer (examples/isp.yaml). The steady pass reads the
// classifier's counters while it dumps the classes (stats.CollectTrees).
func TestSteadyReadsWhatAFullReadReads(t *testing.T) {
	testutil.RequireRoot(t)
	t.Setenv("SLUICE_STATE_DIR", t.TempDir())
	ns := testutil.NewNetns(t, "std")
	// No IPv6: its router solicitations would change the default
	// class's counters between the readings.
	testutil.NS(t, ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
	testutil.NS(t, ns, "ip", "link", "add", "eth1", "numtxqueues", "4", "type", "veth", "peer", "name", "eth1p")
	testutil.NS(t, ns, "ip", "link", "set", "eth1", "up")
	testutil.NS(t, ns, "ip", "link", "set", "eth1p", "up")
	testutil.NS(t, ns, "ip", "addr", "add", "100.64.0.1/16", "dev", "eth1")
	dir := t.TempDir()
	for _, f := range []string{"isp.yaml", "isp-hosts.csv"} {
		b, err := os.ReadFile(filepath.Join("..", "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		// Four shards, one per queue: auto picks one tree where no
		// agent balances them.
		b = []byte(strings.Replace(string(b), "shards: auto", "shards: 4", 1))
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts := engine.Options{Netns: ns, LockTimeout: 5 * time.Second, Full: true}
	pol, err := engine.Load(filepath.Join(dir, "isp.yaml"), opts)
	if err != nil {
		t.Fatal(err)
	}
	s := engine.NewSession(opts)
	t.Cleanup(s.Close)
	if n, p := apply(t, s, pol, opts); n == 0 {
		t.Fatal("the first apply changed nothing")
	} else {
		p.Close()
	}
	// Traffic for a subscriber (alice) and for the policed guests, sent
	// out of eth1 through the tree.
	for _, dst := range []string{"100.64.0.10", "100.64.99.5"} {
		testutil.NS(t, ns, "ip", "neigh", "replace", dst, "lladdr", "02:00:00:00:00:01", "dev", "eth1", "nud", "permanent")
		exec.Command("ip", "netns", "exec", ns, "ping", "-c", "3", "-i", "0.01", "-W", "0.1", dst).Run()
	}
	n, p := apply(t, s, pol, opts)
	if n != 0 {
		p.Close()
		t.Fatalf("the settling pass made %d changes: %v", n, p.Diff.Changes)
	}
	s.Settled(pol, p)
	fromLive, err := stats.CollectFrom(p.Kernel(), p.Live.Objects)
	p.Close()
	if err != nil {
		t.Fatal(err)
	}
	k, err := engine.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	full, err := stats.Collect(k.Reader(), nil)
	k.Close()
	if err != nil {
		t.Fatal(err)
	}
	steady, ok := s.Steady(pol)
	if !ok {
		t.Fatal("the pass after a settled one is not steady")
	}

	trees := func(smp *stats.Sample) string {
		b, err := json.MarshalIndent(smp.Trees, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	want := trees(full)
	for name, got := range map[string]*stats.Sample{"steady": steady, "from the live objects": fromLive} {
		if g := trees(got); g != want {
			t.Errorf("the %s reading differs from the full read:\n%s", name, lineDiff(want, g))
		}
	}

	// What the comparison must cover: every shard, the hosts, their
	// classifier counts and the policer's colours.
	if len(full.Trees) != 1 || full.Trees[0].Classifier != "bpf" {
		t.Fatalf("want one tree with the BPF classifier: %s", want)
	}
	tr := full.Trees[0]
	alice, shards := 0, 0
	for _, c := range tr.Classes {
		if c.Name == "subscribers/alice" {
			alice++
			if c.Classified != nil && c.Classified.Packets >= 3 && c.Packets >= 3 {
				alice += 10
			}
		}
		if c.Name == "(root)" {
			shards++
		}
	}
	if shards != 4 || alice < 11 {
		t.Errorf("want 4 shards' roots and alice's 3 pings counted by the classifier and her class: %d roots, alice %d", shards, alice)
	}
	if len(tr.Policers) != 1 || tr.Policers[0].Class != "guests" || tr.Policers[0].Green.Packets < 3 {
		t.Errorf("want the guests' policer with 3 green packets: %+v", tr.Policers)
	}
}

// lineDiff shows the first lines where a and b differ.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < min(len(al), len(bl)); i++ {
		if al[i] != bl[i] {
			lo, hi := max(0, i-3), min(i+4, len(al), len(bl))
			return fmt.Sprintf("line %d:\nwant %s\ngot  %s", i+1, strings.Join(al[lo:hi], "\n     "), strings.Join(bl[lo:hi], "\n     "))
		}
	}
	return fmt.Sprintf("%d lines against %d", len(al), len(bl))
}
