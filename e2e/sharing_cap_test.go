package e2e

import (
	"encoding/json"
	"testing"
	"time"

	"sluice/testutil"
)

// A sharing's cap holds with no agent running (nothing has measured or
// limited anything): two UDP tenants flooding a 20mbit link under `cap:
// 50%` send 10 Mbit/s together, not 20, and a prod class beside them
// keeps its own rate outside the cap. On HTB the tenants hang under a
// "(cap)" class, prod under the root; on EDT (the lane: fq) their
// aggregates take a slot on a "(cap)" aggregate's clock.
func TestSharingCapHoldsWithoutTheAgent(t *testing.T) {
	testutil.Slow(t)
	light(t)
	t.Run("htb", func(t *testing.T) { testSharingCap(t, "") })
	t.Run("edt", func(t *testing.T) {
		needFq(t)
		testSharingCap(t, "      backend: edt\n")
	})
}

func testSharingCap(t *testing.T, backend string) {
	edt := backend != ""
	ceil := ""
	if edt {
		ceil = ", ceil: 20mbit" // an EDT aggregate's cap is its ceil
	}
	p := testutil.NewPair(t)
	// policy is prod and two tenants under sharing.
	policy := func(file, sharing string) string {
		return writePolicy(t, file, policyFor(p.DevA, `    egress:
      rate: 20mbit
`+backend+`      default: b
      sharing: `+sharing+`
      classes:
        - {name: prod, rate: 2mbit, prio: 0`+ceil+`, match: [{proto: udp, dport: 9003}]}
        - {name: a, rate: 100kbit, prio: 1, weight: 1`+ceil+`, match: [{proto: udp, dport: 9001}]}
        - {name: b, rate: 100kbit, prio: 1, weight: 3`+ceil+`, match: [{proto: udp, dport: 9002}]}
`))
	}
	must(t, "--netns", p.A, "apply", policy("p.yaml", "{mode: controller, cap: 50%}"))
	type class struct {
		Name, ID, Parent string
		Ceil             float64 `json:"ceil_bytes_per_second"`
		Bytes            uint64  `json:"bytes"`
	}
	read := func() (map[string]class, time.Time) {
		out := must(t, "--netns", p.A, "show", "--json", "--local", "--interval", "0")
		var s struct {
			Trees []struct{ Classes []class } `json:"trees"`
		}
		if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Trees) != 1 {
			t.Fatalf("show: %v\n%s", err, out)
		}
		m := map[string]class{}
		for _, c := range s.Trees[0].Classes {
			m[c.Name] = c
		}
		return m, time.Now()
	}
	c, _ := read()
	capc, ok := c["(cap)"]
	if !ok || capc.Ceil*8 != 10e6 {
		t.Fatalf("no (cap) class with a 10mbit ceil: %+v", c)
	}
	if !edt && (c["a"].Parent != capc.ID || c["b"].Parent != capc.ID || c["prod"].Parent == capc.ID) {
		t.Fatalf("a and b belong under (cap) %s, prod beside it: %+v", capc.ID, c)
	}
	stop := udpFlood(t, p.A, testutil.AddrB, 15e6, 9001, 9002)
	defer stop()
	stopProd := udpFlood(t, p.A, testutil.AddrB, 1.5e6, 9003)
	defer stopProd()
	time.Sleep(2 * time.Second)
	c0, t0 := read()
	time.Sleep(3 * time.Second)
	c1, t1 := read()
	dt := t1.Sub(t0).Seconds()
	rate := func(n string) float64 { return float64(c1[n].Bytes-c0[n].Bytes) * 8 / dt }
	tenants, prod := rate("a")+rate("b"), rate("prod")
	t.Logf("tenants %.2f Mbit/s (a %.2f, b %.2f), prod %.2f", tenants/1e6, rate("a")/1e6, rate("b")/1e6, prod/1e6)
	if tenants > 10.5e6 || tenants < 9e6 {
		t.Errorf("the tenants sent %.2f Mbit/s together with no agent running; the cap is 10mbit", tenants/1e6)
	}
	if prod < 1.35e6 {
		t.Errorf("prod sent %.2f Mbit/s of its 1.5 beside the capped tenants", prod/1e6)
	}
	// Taking the cap away moves the tenants back under the root (their
	// classes are made again) and leaves no (cap) class behind.
	pol2 := policy("p2.yaml", "{mode: controller}")
	must(t, "--netns", p.A, "apply", pol2)
	c2, _ := read()
	if _, ok := c2["(cap)"]; ok || c2["a"].Parent != c2["prod"].Parent {
		t.Errorf("without a cap: %+v", c2)
	}
	if out := must(t, "--netns", p.A, "plan", pol2); !contains(out, "no changes") {
		t.Errorf("plan after the cap went:\n%s", out)
	}
}
