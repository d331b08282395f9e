package e2e

import (
	"testing"
	"time"

	"sluice/testutil"
)

// A load start is met within the agent's watch of the counters, not at
// the controller's next quantum: two UDP tenants (weights 1 and 3) start
// flooding a 20mbit link under `cap: 20mbit` right after a step of a
// controller whose quantum is 5 s, and their limits (5.05 and 14.95
// Mbit/s) are in force within 3 s, by an early step
// (sluice_sharing_early_steps_total), where the quantum alone would
// take 4 s or more. On EDT (the lane: fq) the same, on the aggregates'
// caps.
func TestSharingMeetsALoadStart(t *testing.T) {
	testutil.Slow(t)
	light(t)
	t.Run("htb", func(t *testing.T) { testLoadStart(t, "") })
	t.Run("edt", func(t *testing.T) {
		needFq(t)
		testLoadStart(t, "      backend: edt\n")
	})
}

func testLoadStart(t *testing.T, backend string) {
	ceil := ""
	if backend != "" {
		ceil = ", ceil: 20mbit" // an EDT aggregate's cap is its ceil
	}
	p := testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    egress:
      rate: 20mbit
`+backend+`      default: b
      sharing: {mode: controller, quantum: 5s, cap: 20mbit}
      classes:
        - {name: a, rate: 100kbit, weight: 1`+ceil+`, match: [{proto: udp, dport: 9001}]}
        - {name: b, rate: 100kbit, weight: 3`+ceil+`, match: [{proto: udp, dport: 9002}]}
`))
	a := startAgent(t, p.A, pol)
	// limits reads the controller's decisions from the status: a's and
	// b's limits in bits, and whether both are applied.
	limits := func() (la, lb float64, applied bool) {
		st := a.status()
		if st.Sample == nil || len(st.Sample.Trees) != 1 {
			return 0, 0, false
		}
		applied = true
		n := 0
		for _, sh := range st.Sample.Trees[0].Sharing {
			switch sh.Class {
			case "a":
				la, n = sh.Limit.BitsFloat(), n+1
			case "b":
				lb, n = sh.Limit.BitsFloat(), n+1
			default:
				continue
			}
			applied = applied && sh.Applied
		}
		return la, lb, applied && n == 2
	}
	// A limiting controller decides from its second step on: wait for
	// one, then start at once, 4 s or more before the next.
	if _, ok := within(12*time.Second, func() bool {
		la, _, _ := limits()
		return la > 0
	}); !ok {
		t.Fatalf("no sharing decision within 12 s of the agent's start: %+v", a.status().Sample)
	}
	stepped := time.Now()
	if v, _ := a.metric("sluice_sharing_early_steps_total"); v != 0 {
		t.Fatalf("sluice_sharing_early_steps_total %v before any load", v)
	}
	stop := udpFlood(t, p.A, testutil.AddrB, 15e6, 9001, 9002)
	defer stop()
	started := time.Now()
	took, ok := within(3*time.Second, func() bool {
		la, lb, applied := limits()
		return applied && la == 5.05e6 && lb == 14.95e6
	})
	la, lb, applied := limits()
	if !ok {
		t.Fatalf("limits a %.0f, b %.0f (applied %v) 3 s after the load started (%.1f s after the last step), want 5050000 and 14950000",
			la, lb, applied, time.Since(stepped).Seconds())
	}
	if since := time.Since(stepped); since >= 5*time.Second {
		t.Fatalf("the check ran %.1f s after the last step: a quantum's step may have met the load", since.Seconds())
	}
	if v, _ := a.metric("sluice_sharing_early_steps_total"); v < 1 {
		t.Errorf("sluice_sharing_early_steps_total %v: the limits came by a quantum's step", v)
	}
	t.Logf("limits in force %.2f s after the load started (%.2f s after the last step)",
		took.Seconds(), started.Sub(stepped).Seconds())
}
