package engine_test

import (
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
