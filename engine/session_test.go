package engine_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"sluice/engine"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
	"sluice/testutil"
	"sluice/units"
)

const controlled = `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: b
      sharing: controller
      classes:
        - {name: a, rate: 1mbit, match: [{dport: 1}]}
        - {name: b, rate: 1mbit}
`

func mbit(n float64) units.Rate { return units.FromBits(n * 1e6) }

// sessionBed is a namespace with eth0, its own records, and the
// controller policy above.
func sessionBed(t *testing.T) (engine.Options, *policy.Policy, *records.Lock) {
	t.Helper()
	testutil.RequireRoot(t)
	t.Setenv("SLUICE_STATE_DIR", t.TempDir())
	ns := testutil.NewNetns(t, "eng")
	testutil.NS(t, ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	testutil.NS(t, ns, "ip", "link", "set", "eth0", "up")
	pol, _, err := policy.Parse("p.yaml", []byte(controlled))
	if err != nil {
		t.Fatal(err)
	}
	// A session's limits stand for others while its process holds the
	// agent lock, as the agent does.
	l, err := records.AcquireAgentLock(records.Dir(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Release)
	return engine.Options{Netns: ns, LockTimeout: 5 * time.Second}, pol, l
}

// liveClass reads class name's rate and ceil from the kernel.
func liveClass(t *testing.T, opts engine.Options, p *plan.Plan, name string) (rate, ceil units.Rate) {
	t.Helper()
	c := classOf(t, p, name)
	conn, err := tc.Open(opts.Netns)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	live, err := conn.Class(c.Dev, c.Handle)
	if err != nil || live == nil {
		t.Fatalf("class %s: %v %v", name, live, err)
	}
	return live.Rate, live.Ceil
}

func classOf(t *testing.T, p *plan.Plan, name string) *tc.Class {
	t.Helper()
	for _, o := range p.Objects() {
		if c, ok := o.(*tc.Class); ok && c.Name == name {
			return c
		}
	}
	t.Fatalf("no class %s", name)
	return nil
}

// apply prepares and applies pol once, through s or (nil) as `sluice
// apply` does, and returns how many changes it made.
func apply(t *testing.T, s *engine.Session, pol *policy.Policy, opts engine.Options) (int, *engine.Prepared) {
	t.Helper()
	var p *engine.Prepared
	var err error
	if s != nil {
		p, err = s.Prepare(pol)
	} else {
		p, err = engine.PreparePolicy(pol, opts)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(); err != nil {
		p.Close()
		t.Fatal(err)
	}
	return len(p.Diff.Changes), p
}

// A session's limits land in the kernel through the executor, stay
// through its own passes and a plain apply while the lease holds (on
// the fast path and the full one), and give way to the policy once it
// ends; a new session starts without them.
func TestSessionLimits(t *testing.T) {
	opts, pol, lock := sessionBed(t)
	s := engine.NewSession(opts)
	_, p := apply(t, s, pol, opts)
	a := classOf(t, p.Plan, "a")
	res, err := s.SetLimits(p, plan.Limits{plan.ClassLimit(a): {Rate: mbit(10), Ceil: mbit(20)}})
	p.Close()
	if err != nil {
		t.Fatal(err)
	}
	if res.Changes != 1 {
		t.Errorf("setting one class's limits made %d changes", res.Changes)
	}
	if r, c := liveClass(t, opts, p.Plan, "a"); r != mbit(10) || c != mbit(20) {
		t.Fatalf("a: rate %v ceil %v, want 10mbit 20mbit", r, c)
	}
	for _, tt := range []struct {
		name string
		sess *engine.Session
		full bool
	}{
		{"the session's next pass", s, true},
		{"apply while the lease holds, fast path", nil, false},
		{"apply while the lease holds, full read", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := opts
			o.Full = tt.full
			n, p := apply(t, tt.sess, pol, o)
			p.Close()
			if n != 0 {
				t.Errorf("%d changes, want none: %v", n, p.Diff.Changes)
			}
			if r, c := liveClass(t, opts, p.Plan, "a"); r != mbit(10) || c != mbit(20) {
				t.Errorf("a: rate %v ceil %v, want 10mbit 20mbit", r, c)
			}
		})
	}
	t.Run("a new session", func(t *testing.T) {
		n, p := apply(t, engine.NewSession(opts), pol, opts)
		p.Close()
		policyBack(t, opts, p, n, a)
	})
	t.Run("the agent lock released (a killed agent)", func(t *testing.T) {
		_, p := apply(t, s, pol, opts) // the old session puts its limits back
		p.Close()
		lock.Release()
		defer func() {
			var err error
			if lock, err = records.AcquireAgentLock(records.Dir(opts.Netns)); err != nil {
				t.Fatal(err)
			}
		}()
		n, p := apply(t, nil, pol, opts)
		p.Close()
		policyBack(t, opts, p, n, a)
	})
	t.Run("the lease ended", func(t *testing.T) {
		_, p := apply(t, s, pol, opts) // the old session puts its limits back
		p.Close()
		if err := s.Release(); err != nil {
			t.Fatal(err)
		}
		n, p := apply(t, nil, pol, engine.Options{Netns: opts.Netns, LockTimeout: opts.LockTimeout})
		p.Close()
		policyBack(t, opts, p, n, a) // on the fast path
		if _, err := os.Stat(filepath.Join(records.Dir(opts.Netns), "limits.json")); !os.IsNotExist(err) {
			t.Errorf("the limits record is still there (%v)", err)
		}
	})
}

// policyBack checks that an apply of n changes put class a's policy
// rate and ceil back.
func policyBack(t *testing.T, opts engine.Options, p *engine.Prepared, n int, a *tc.Class) {
	t.Helper()
	if r, c := liveClass(t, opts, p.Plan, "a"); n != 1 || r != a.Rate || c != a.Ceil {
		t.Errorf("%d changes; a: rate %v ceil %v, want the policy's %v %v", n, r, c, a.Rate, a.Ceil)
	}
}

// A write the kernel refuses rolls the step back, the record with it.
func TestSessionLimitsRollBack(t *testing.T) {
	opts, pol, _ := sessionBed(t)
	s := engine.NewSession(opts)
	_, p := apply(t, s, pol, opts)
	defer p.Close()
	a, b := classOf(t, p.Plan, "a"), classOf(t, p.Plan, "b")
	writes := engine.KernelOf(p).Writes()
	engine.KernelOf(p).InjectWriteFault(func(n int, _ string) error {
		if n == writes+2 {
			return tc.ErrInjected // the second class
		}
		return nil
	})
	_, err := s.SetLimits(p, plan.Limits{plan.ClassLimit(a): {Rate: mbit(10), Ceil: mbit(20)}, plan.ClassLimit(b): {Rate: mbit(5), Ceil: mbit(20)}})
	if err == nil {
		t.Fatal("a refused write: no error")
	}
	for _, c := range []*tc.Class{a, b} {
		if r, ce := liveClass(t, opts, p.Plan, c.Name); r != c.Rate || ce != c.Ceil {
			t.Errorf("%s: rate %v ceil %v after the rollback, want %v %v", c.Name, r, ce, c.Rate, c.Ceil)
		}
	}
	if len(s.Limits()) != 0 {
		t.Errorf("the session took the refused limits: %v", s.Limits())
	}
	rec, err := records.LoadLimits(records.Dir(opts.Netns))
	if err != nil || rec.Held(time.Now()) {
		t.Errorf("the limits record after the rollback: %+v, %v", rec, err)
	}
}

const autoRated = `interfaces:
  - name: eth0
    egress:
      rate: auto
      auto: {min: 5mbit, base: 20mbit, max: 80mbit}
      default: bulk
      classes:
        - {name: voip, rate: 1mbit, ceil: 50%, match: [{dport: 5060}]}
        - name: web
          rate: 10%
          match: [{dport: 443}]
          classes:
            - {name: w1, rate: 50%, leaf: bfifo}
            - {name: w2, rate: 50%}
        - {name: bulk, rate: 70%, leaf: bfifo}
`

// rate: auto's rate goes through the session: the tree is planned
// again at it and every object a rate reaches changes in place (the
// root, percentages, inner classes, a bfifo's limit); the session's
// next pass and a plain apply within the lease keep it; once the lease
// ends a plain apply puts the base back.
func TestSessionAutoRate(t *testing.T) {
	opts, _, _ := sessionBed(t)
	pol, _, err := policy.Parse("p.yaml", []byte(autoRated))
	if err != nil {
		t.Fatal(err)
	}
	s := engine.NewSession(opts)
	_, p := apply(t, s, pol, opts)
	dev := p.Plan.Devices[0]
	if r, _ := liveClass(t, opts, p.Plan, plan.RootClassName); r != mbit(20) {
		t.Fatalf("applied at %v, want the base 20mbit", r)
	}
	bfifo := func() uint32 {
		conn, err := tc.Open(opts.Netns)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		q, err := conn.QdiscAt("eth0", classOf(t, p.Plan, "bulk").Handle)
		if err != nil || q == nil || q.Fifo == nil {
			t.Fatalf("bulk's bfifo: %v %v", q, err)
		}
		return q.Fifo.Limit
	}
	baseLimit := bfifo()
	res, err := s.SetLimits(p, plan.Limits{plan.RateLimit(dev): {Rate: mbit(10)}})
	p.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]units.Rate{
		plan.RootClassName: {mbit(10), mbit(10)},
		"voip":             {mbit(1), mbit(5)},
		"web":              {mbit(1), mbit(10)},
		"w1":               {mbit(0.5), mbit(10)},
		"bulk":             {mbit(7), mbit(10)},
	}
	check := func(when string) {
		t.Helper()
		for name, w := range want {
			if r, c := liveClass(t, opts, p.Plan, name); r != w[0] || c != w[1] {
				t.Errorf("%s: %s at %v/%v, want %v/%v", when, name, r, c, w[0], w[1])
			}
		}
	}
	check("after the rate's write")
	if res.Changes < len(want) {
		t.Errorf("the rate's write made %d changes, want at least %d", res.Changes, len(want))
	}
	if l := bfifo(); l >= baseLimit {
		t.Errorf("bulk's bfifo holds %d bytes at half the rate, %d at the base: its limit did not follow", l, baseLimit)
	}
	for _, tt := range []struct {
		name string
		sess *engine.Session
	}{{"the session's next pass", s}, {"apply while the lease holds", nil}} {
		n, p := apply(t, tt.sess, pol, opts)
		p.Close()
		if n != 0 {
			t.Errorf("%s: %d changes, want none: %v", tt.name, n, p.Diff.Changes)
		}
		check(tt.name)
	}
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	n, p := apply(t, nil, pol, engine.Options{Netns: opts.Netns, LockTimeout: opts.LockTimeout})
	p.Close()
	if r, c := liveClass(t, opts, p.Plan, "bulk"); n == 0 || r != mbit(14) || c != mbit(20) {
		t.Errorf("after the lease: %d changes, bulk at %v/%v, want the base's 14mbit/20mbit", n, r, c)
	}
	if l := bfifo(); l != baseLimit {
		t.Errorf("after the lease: bulk's bfifo holds %d bytes, want the base's %d", l, baseLimit)
	}
}
