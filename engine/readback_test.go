package engine

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"sluice/internal/writecap"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/testutil"
	"sluice/units"
)

// TestReadBackThenExecute: an apply is two steps, the engine's read back
// (lock, plan, runtime layer, read, diff) and the kernel's Execute, each
// round under the namespace's lock. A policy naming an interface the
// namespace lacks is an *InputError and changes nothing, unless
// SkipMissing plans without it; a rate edit takes the fast path; the
// same policy again changes nothing; the runtime layer's limits are
// laid over the plan (an auto tree's rate) and read back whole when it
// asks.
func TestReadBackThenExecute(t *testing.T) {
	testutil.RequireRoot(t)
	t.Setenv("SLUICE_STATE_DIR", t.TempDir())
	ns := testutil.NewNetns(t, "rb")
	testutil.NS(t, ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	testutil.NS(t, ns, "ip", "link", "set", "eth0", "up")
	snapshot := func() string {
		return testutil.NS(t, ns, "tc", "qdisc", "show") + testutil.NS(t, ns, "tc", "class", "show", "dev", "eth0")
	}
	parse := func(src string) *policy.Policy {
		p, _, err := policy.Parse("p.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
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
		// want: an *InputError; else the missing interfaces, whether the
		// fast path read, and the changes made.
		inputError bool
		missing    []string
		touched    bool
		changes    int // -1: some
		kernelHas  string
	}{
		{name: "a missing interface is refused", policy: src("1mbit", missing), inputError: true},
		{name: "or planned without", policy: src("1mbit", missing), skipMissing: true, missing: []string{"eth9"}, changes: -1, kernelHas: "rate 1Mbit"},
		// The siblings' quanta and queue limits follow the rate too.
		{name: "a rate edit takes the fast path", policy: src("2mbit", ""), touched: true, changes: -1, kernelHas: "rate 2Mbit"},
		{name: "the same policy changes nothing", policy: src("2mbit", ""), touched: true, kernelHas: "rate 2Mbit"},
		{name: "a layer's limits, read back whole", policy: auto, layerFull: true, changes: -1, kernelHas: "rate 30Mbit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot()
			k, err := kernel.Open(ns)
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			r := readRequest{Policy: parse(c.policy), Lock: true, SkipMissing: c.skipMissing}
			if c.layerFull {
				r.Layer = func() (plan.Limits, map[string]bool, bool) {
					return plan.Limits{plan.RateLimitOn("eth0"): {Rate: units.FromBits(30e6)}}, nil, true
				}
			}
			p, err := readBackIn(k, r)
			var pe *InputError
			if c.inputError {
				if !errors.As(err, &pe) || !strings.Contains(err.Error(), "interface eth9 does not exist") {
					t.Fatalf("want an *InputError naming eth9, got %v", err)
				}
				if after := snapshot(); after != before {
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
				t.Fatalf("%d change(s), want %d:\n%s", n, c.changes, diffLines(p.Diff))
			}
			res, err := k.Executor(writecap.Token{}).Execute(&kernel.Prepared{Plan: p.Plan, Live: p.Live, Diff: p.Diff}, "p.yaml", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Changes != len(p.Diff.Changes) {
				t.Fatalf("executed %d change(s) of %d", res.Changes, len(p.Diff.Changes))
			}
			if out := testutil.NS(t, ns, "tc", "class", "show", "dev", "eth0"); !strings.Contains(out, c.kernelHas) {
				t.Fatalf("the kernel lacks %q:\n%s", c.kernelHas, out)
			}
		})
	}
}

// diffLines says d's changes, one a line.
func diffLines(d *kernel.Diff) string {
	var out []string
	for _, c := range d.Changes {
		out = append(out, c.Verb.String()+" "+c.Obj.Describe())
	}
	return strings.Join(out, "\n")
}
