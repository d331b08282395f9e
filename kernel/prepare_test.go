package kernel_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"sluice/internal/writecap"
	"sluice/kernel"
	"sluice/plan"
	"sluice/testutil"
	"sluice/units"
)

// TestPrepareThenExecute: an apply is two calls, Prepare and Execute,
// each round under the namespace's lock. A policy naming an interface
// the namespace lacks is a *PolicyError and changes nothing, unless
// SkipMissing plans without it; a rate edit takes the fast path; the
// same policy again changes nothing; the runtime layer's limits are
// laid over the plan (an auto tree's rate) and read back whole when it
// asks.
func TestPrepareThenExecute(t *testing.T) {
	b := newBed(t, "eth0")
	src := func(rate, extra string) string {
		return `interfaces:
  - name: eth0
    egress: {rate: 40mbit, default: other, classes: [{name: ssh, rate: ` + rate + `}, {name: other, rate: 5mbit}]}
` + extra
	}
	// The tree's rate is the runtime layer's to set (rate: auto).
	auto := strings.Replace(src("2mbit", ""), "rate: 40mbit,", "rate: auto, auto: {min: 10mbit, base: 40mbit, max: 40mbit, reflectors: [192.0.2.1]},", 1)
	missing := `  - name: eth9
    egress: {rate: 10mbit}
`
	for _, c := range []struct {
		name, policy string
		skipMissing  bool
		layerFull    bool
		// want: a *PolicyError; else the missing interfaces, whether the
		// fast path read, and the changes made.
		policyError bool
		missing     []string
		touched     bool
		changes     int // -1: some
		kernelHas   string
	}{
		{name: "a missing interface is refused", policy: src("1mbit", missing), policyError: true},
		{name: "or planned without", policy: src("1mbit", missing), skipMissing: true, missing: []string{"eth9"}, changes: -1, kernelHas: "rate 1Mbit"},
		// The siblings' quanta and queue limits follow the rate too.
		{name: "a rate edit takes the fast path", policy: src("2mbit", ""), touched: true, changes: -1, kernelHas: "rate 2Mbit"},
		{name: "the same policy changes nothing", policy: src("2mbit", ""), touched: true, kernelHas: "rate 2Mbit"},
		{name: "a layer's limits, read back whole", policy: auto, layerFull: true, changes: -1, kernelHas: "rate 30Mbit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := b.snapshot(t)
			k, err := kernel.Open(b.ns)
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			r := kernel.Request{Policy: parse(t, c.policy), Lock: true, SkipMissing: c.skipMissing}
			if c.layerFull {
				r.Layer = func() (plan.Limits, map[string]bool, bool) {
					return plan.Limits{plan.RateLimitOn("eth0"): {Rate: units.FromBits(30e6)}}, nil, true
				}
			}
			p, err := k.Prepare(r)
			var pe *kernel.PolicyError
			if c.policyError {
				if !errors.As(err, &pe) || !strings.Contains(err.Error(), "interface eth9 does not exist") {
					t.Fatalf("want a *PolicyError naming eth9, got %v", err)
				}
				if after := b.snapshot(t); after != before {
					t.Fatalf("a refused policy changed the kernel:\n%s\nthen:\n%s", before, after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Missing, c.missing) || p.Touched != c.touched {
				t.Fatalf("missing %v, fast path %v: want %v, %v", p.Missing, p.Touched, c.missing, c.touched)
			}
			if c.layerFull && (len(p.Limits) != 1 || p.Touched) {
				t.Fatalf("limits %v, fast path %v: want the layer's, and a full read", p.Limits, p.Touched)
			}
			if n := len(p.Diff.Changes); c.changes >= 0 && n != c.changes || c.changes < 0 && n == 0 {
				t.Fatalf("%d change(s), want %d:\n%s", n, c.changes, describe(p.Diff))
			}
			res, err := k.Executor(writecap.Token{}).Execute(p, "p.yaml", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Changes != len(p.Diff.Changes) {
				t.Fatalf("executed %d change(s) of %d", res.Changes, len(p.Diff.Changes))
			}
			if out := testutil.NS(t, b.ns, "tc", "class", "show", "dev", "eth0"); !strings.Contains(out, c.kernelHas) {
				t.Fatalf("the kernel lacks %q:\n%s", c.kernelHas, out)
			}
		})
	}
}
