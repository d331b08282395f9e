package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/testutil"
)

// The sharing controller: two UDP tenants of weights 1 and 3 flood a
// 20mbit link with equal quanta; the agent holds them to their weighted
// shares (5 and 15 Mbit/s), shows the decision in its status, metrics
// and history, and does not count its own writes as drift. While it
// runs, a plain apply and plan keep them; once it is killed, apply puts
// the policy's back. Without a cap it gives the shares as the classes'
// rates (the ceils stay the policy's); with one, as their ceils.
func TestAgentSharingController(t *testing.T) {
	testutil.Slow(t)
	light(t)
	for _, tc := range []struct{ name, sharing, field string }{
		{"rates", "{mode: controller, quantum: 500ms}", "rate_bytes_per_second"},
		{"ceils", "{mode: controller, quantum: 500ms, cap: 20mbit}", "ceil_bytes_per_second"},
	} {
		t.Run(tc.name, func(t *testing.T) { testSharingController(t, tc.sharing, tc.field) })
	}
}

func testSharingController(t *testing.T, sharing, field string) {
	p := testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    egress:
      rate: 20mbit
      default: b
      sharing: `+sharing+`
      classes:
        - {name: a, rate: 100kbit, weight: 1, quantum: 67050, match: [{proto: udp, dport: 9001}]}
        - {name: b, rate: 100kbit, weight: 3, quantum: 67050, match: [{proto: udp, dport: 9002}]}
`))
	a := startAgent(t, p.A, pol, "--interval", "500ms")
	stopFlood := udpFlood(t, p.A, testutil.AddrB, 15e6, 9001, 9002)
	defer stopFlood()
	// classes reads each class's rate and ceil back.
	classes := func() map[string][2]float64 {
		out := must(t, "--netns", p.A, "show", "--json", "--local", "--interval", "0")
		var s struct {
			Trees []struct {
				Classes []struct {
					Name string  `json:"name"`
					Rate float64 `json:"rate_bytes_per_second"`
					Ceil float64 `json:"ceil_bytes_per_second"`
				} `json:"classes"`
			} `json:"trees"`
		}
		if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Trees) != 1 {
			t.Fatalf("show: %v\n%s", err, out)
		}
		m := map[string][2]float64{}
		for _, c := range s.Trees[0].Classes {
			m[c.Name] = [2]float64{c.Rate * 8, c.Ceil * 8} // bits, as the policy's
		}
		return m
	}
	// held is the field the controller writes; the other stays the
	// policy's.
	held := func(c [2]float64) float64 {
		if field == "rate_bytes_per_second" {
			return c[0]
		}
		return c[1]
	}
	other := func(c [2]float64) float64 {
		if field == "rate_bytes_per_second" {
			return c[1]
		}
		return c[0]
	}
	policyOther := map[bool]float64{true: 20e6, false: 100e3}[field == "rate_bytes_per_second"]
	// The reference's split: each class's 100kbit rate, and the other
	// 19.8mbit by the weights 1:3.
	took, ok := within(8*time.Second, func() bool {
		c := classes()
		return held(c["a"]) == 5.05e6 && held(c["b"]) == 14.95e6
	})
	if !ok {
		t.Fatalf("classes %v after 8 s, want %s a 5.05mbit and b 14.95mbit (100kbit each, and 19.8mbit by 1:3)", classes(), field)
	}
	if c := classes(); other(c["a"]) != policyOther || other(c["b"]) != policyOther {
		t.Errorf("classes %v: the controller moved what it does not hold (want %.0f)", c, policyOther)
	}
	t.Logf("shares in force %.1f s after the flood began", took.Seconds())

	st := a.status()
	var shares []string
	for _, sh := range st.Sample.Trees[0].Sharing {
		shares = append(shares, fmt.Sprintf("%s:%v:%.0f:%.0f:%v", sh.Class, sh.Weight, sh.Share.BitsFloat(), sh.Limit.BitsFloat(), sh.Applied))
	}
	if got := strings.Join(shares, " "); got != "a:1:5050000:5050000:true b:3:14950000:14950000:true" {
		t.Errorf("status sharing %q", got)
	}
	if v, ok := a.metric("sluice_sharing_limit_bytes_per_second", `class="a"`); !ok || v != 5.05e6/8 {
		t.Errorf("sluice_sharing_limit_bytes_per_second{class=a} %v %v", v, ok)
	}
	if v, ok := a.metric("sluice_sharing_limit_bits", `class="a"`); !ok || v != 5.05e6 {
		t.Errorf("sluice_sharing_limit_bits{class=a} (deprecated, kept a release) %v %v", v, ok)
	}
	if v, ok := a.metric("sluice_sharing_demand_bytes_per_second", `class="b"`); !ok || v != 20e6/8 {
		t.Errorf("sluice_sharing_demand_bytes_per_second{class=b} %v (b is held back: its demand counts as its ceil)", v)
	}
	if v, ok := a.metric("sluice_sharing_writes_total"); !ok || v < 2 {
		t.Errorf("sluice_sharing_writes_total %v", v)
	}
	_, hist := a.get("/api/v1/history")
	if !strings.Contains(hist, `"kind":"limit"`) || !strings.Contains(hist, `"kind":"share"`) {
		t.Errorf("history has no sharing series: %.300s", hist)
	}
	if text := must(t, "--netns", p.A, "show"); !strings.Contains(text, "SHARING") || !strings.Contains(text, "(held back)") {
		t.Errorf("show lacks the sharing table:\n%s", text)
	}
	// Not drift, and not undone by the user's own apply or plan.
	time.Sleep(1500 * time.Millisecond)
	if v, _ := a.metric("sluice_drift_repairs_total"); v != 0 {
		t.Errorf("the agent repaired its own writes %v times", v)
	}
	what := map[bool]string{true: "writing their rates", false: "writing their ceils"}[field == "rate_bytes_per_second"]
	if r := sluice(t, "--netns", p.A, "plan", pol); r.code != 0 || !strings.Contains(r.stdout, "no changes") || !strings.Contains(r.stderr, what) {
		t.Errorf("plan while the controller runs (want no changes, and a note %q): exit %d\n%s%s", what, r.code, r.stdout, r.stderr)
	}
	if out := must(t, "--netns", p.A, "apply", pol); !strings.Contains(out, "no changes") {
		t.Errorf("apply while the controller runs:\n%s", out)
	}
	if c := classes(); held(c["a"]) != 5.05e6 {
		t.Errorf("classes after apply %v", c)
	}
	// Killed, the agent leaves its shares behind, stale: the next plain
	// apply puts the policy's back.
	stopFlood()
	a.stop(syscall.SIGKILL)
	out := must(t, "--netns", p.A, "apply", pol)
	if c := classes(); c["a"] != [2]float64{100e3, 20e6} || c["b"] != [2]float64{100e3, 20e6} {
		t.Errorf("apply after the agent stopped: classes %v, want the policy's 100kbit and 20mbit\n%s", c, out)
	}
}
