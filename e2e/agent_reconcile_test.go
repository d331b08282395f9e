package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
	"sluice/features"
	"sluice/records"
	"sluice/testutil"
)

const agentPolicy = `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      default: bulk
      classes:
        - name: interactive
          rate: 5mbit
          prio: 0
          leaf: pfifo
          match:
            - { proto: tcp, dport: 22 }
        - name: bulk
          rate: %s
          leaf: pfifo
`

// A policy being written in place, line by line, is read once it has
// settled (unchanged for a poll) or when it is renamed into place; a
// rewrite that ends where it began changes nothing on the way. The
// agent once applied the half-written files it read: a 12-class policy
// rewritten over 3 s lost 10 classes and got them back.
func TestAgentWaitsForFilesToSettle(t *testing.T) {
	testutil.Slow(t)
	light(t)
	ns := devNS(t, "eth0")
	var src strings.Builder
	src.WriteString("interfaces:\n  - name: eth0\n    egress:\n      rate: 200mbit\n      default: c12\n      classes:\n")
	for i := 1; i <= 12; i++ {
		fmt.Fprintf(&src, "        - {name: c%d, rate: %dmbit, leaf: pfifo, match: [{proto: tcp, dport: %d}]}\n", i, i, 1000+i)
	}
	text := src.String()
	pol := writePolicy(t, "p.yaml", text)
	// At debug level, every object changed is logged (below, none must
	// be while the file is rewritten).
	a := startAgent(t, ns, pol, "--log-level", "debug")
	if _, ok := within(3*time.Second, func() bool { return strings.Count(tcShow(t, ns, "class", "show", "dev", "eth0"), "class htb") == 13 }); !ok {
		t.Fatalf("not applied:\n%s", a.Log())
	}
	if n := strings.Count(a.Log(), `"msg":"change","why":"start"`); n < 13 {
		t.Errorf("the first apply logged %d objects at debug level, want every one (13 classes at least):\n%s", n, a.Log())
	}
	before := a.Log()
	// In place, as a config tool writing line by line: 18 lines over 2.7 s.
	f, err := os.OpenFile(pol, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.SplitAfter(text, "\n") {
		f.WriteString(line)
		time.Sleep(150 * time.Millisecond)
	}
	f.Close()
	time.Sleep(1500 * time.Millisecond)
	during := strings.TrimPrefix(a.Log(), before)
	if n := strings.Count(during, `"msg":"change"`); n != 0 || strings.Contains(during, "policy refused") {
		t.Errorf("a rewrite in place that ends unchanged made %d changes or a refusal:\n%s", n, during)
	}
	// Renamed into place: read at once, however soon after.
	tmp := pol + ".new"
	os.WriteFile(tmp, []byte(strings.Replace(text, "rate: 3mbit", "rate: 33mbit", 1)), 0o644)
	start := time.Now()
	os.Rename(tmp, pol)
	took, ok := within(2*time.Second, func() bool { return strings.Contains(tcShow(t, ns, "class", "show", "dev", "eth0"), "rate 33Mbit") })
	if !ok {
		t.Fatalf("a policy renamed into place was not applied:\n%s", a.Log())
	}
	t.Logf("rewrite in place: no changes; renamed into place: applied in %v (%v after the rename)", took, time.Since(start).Round(time.Millisecond))
}

// The agent keeps the policy applied: a class changed by hand and a
// deleted root qdisc are put back within two intervals, an edit of the
// policy is applied within 2 s as one class change, a broken edit is
// refused (logged and shown by the API) while the old policy stays, a
// second agent is refused, and SIGTERM leaves the shaping in place.
func TestAgentRepairsDriftAndReloads(t *testing.T) {
	testutil.Slow(t)
	light(t)
	ns := devNS(t, "eth0")
	pol := writePolicy(t, "p.yaml", fmt.Sprintf(agentPolicy, "15mbit"))
	a := startAgent(t, ns, pol)
	classRate := func(id string) string {
		m := regexp.MustCompile(`class htb ` + regexp.QuoteMeta(id) + ` .* rate (\S+) `).FindStringSubmatch(tcShow(t, ns, "class", "show", "dev", "eth0"))
		if m == nil {
			return ""
		}
		return m[1]
	}
	if r := classRate("1:11"); r != "15Mbit" {
		t.Fatalf("bulk rate %q after start\n%s", r, a.Log())
	}

	testutil.NS(t, ns, "tc", "class", "change", "dev", "eth0", "parent", "1:1", "classid", "1:11", "htb", "rate", "1mbit", "ceil", "20mbit")
	if took, ok := within(2500*time.Millisecond, func() bool { return classRate("1:11") == "15Mbit" }); !ok {
		t.Fatalf("class changed by hand not repaired in 2.5 s (two intervals): %s", classRate("1:11"))
	} else {
		t.Logf("class change repaired in %v", took)
	}
	// The pass that wrote the class reads the counters before it counts
	// the repair and logs it: tc can see the repair first (a clean-clone
	// run read the metric 0 in between, 2026-11-28).
	if _, ok := within(time.Second, func() bool { v, ok := a.metric("sluice_drift_repairs_total"); return ok && v >= 1 }); !ok {
		v, ok := a.metric("sluice_drift_repairs_total")
		t.Errorf("sluice_drift_repairs_total = %v (%v) a second after the repair", v, ok)
	}
	// At info level: one line a pass, no line an object.
	if _, ok := within(time.Second, func() bool {
		return strings.Contains(a.Log(), `"msg":"repaired drift","changes":1,`) && strings.Contains(a.Log(), `"summary":"change 1 class: class/eth0/1:11"`)
	}); !ok {
		t.Errorf("the repair is not logged:\n%s", a.Log())
	}
	if strings.Contains(a.Log(), `"msg":"change"`) || strings.Count(a.Log(), `"msg":"applied","why":"start"`) != 1 {
		t.Errorf("the first apply is not one line at info level:\n%s", a.Log())
	}

	testutil.NS(t, ns, "tc", "qdisc", "del", "dev", "eth0", "root")
	if took, ok := within(2500*time.Millisecond, func() bool { return classRate("1:11") == "15Mbit" && classRate("1:10") == "5Mbit" }); !ok {
		t.Fatalf("deleted root qdisc not repaired in 2.5 s:\n%s", tcShow(t, ns, "qdisc", "show", "dev", "eth0"))
	} else {
		t.Logf("root qdisc deletion repaired in %v", took)
	}
	var st agent.Status
	if _, ok := within(time.Second, func() bool { st = a.status(); return st.Health.Repairs >= 2 && !st.Health.LastRepair.IsZero() }); !ok {
		t.Errorf("status health a second after two repairs: %+v", st.Health)
	}

	// An edit: one class's rate. pfifo leaves do not depend on the rate,
	// so it is exactly one class change.
	before := a.Log()
	os.WriteFile(pol, []byte(fmt.Sprintf(agentPolicy, "12mbit")), 0o644)
	if took, ok := within(2*time.Second, func() bool { return classRate("1:11") == "12Mbit" }); !ok {
		t.Fatalf("edited policy not applied within 2 s: %s", classRate("1:11"))
	} else {
		t.Logf("policy edit applied in %v", took)
	}
	time.Sleep(200 * time.Millisecond)
	reload := strings.TrimPrefix(a.Log(), before)
	if !strings.Contains(reload, `"msg":"applied","why":"reload","changes":1,`) || !strings.Contains(reload, `"summary":"change 1 class: class/eth0/1:11"`) {
		t.Errorf("reload did not make one class change:\n%s", reload)
	}

	// A broken edit: refused, logged with its position, shown by the
	// API; the kernel keeps the policy in force.
	os.WriteFile(pol, []byte(fmt.Sprintf(agentPolicy, "12mbitz")), 0o644)
	if _, ok := within(2*time.Second, func() bool { st = a.status(); return st.Health.ReloadError != "" }); !ok {
		t.Fatalf("broken edit not reported: %+v", st.Health)
	}
	if !strings.Contains(st.Health.ReloadError, "p.yaml:14:17") || !strings.Contains(a.Log(), `policy refused; the one in force stays`) {
		t.Errorf("reload error %q; log:\n%s", st.Health.ReloadError, a.Log())
	}
	time.Sleep(1500 * time.Millisecond)
	if r := classRate("1:11"); r != "12Mbit" {
		t.Errorf("after a broken edit the bulk rate is %s", r)
	}
	if code, _ := a.get("/healthz"); code != 200 {
		t.Errorf("healthz %d while the old policy is in force", code)
	}
	// Fixing it clears the error.
	os.WriteFile(pol, []byte(fmt.Sprintf(agentPolicy, "10mbit")), 0o644)
	if _, ok := within(2*time.Second, func() bool {
		st = a.status()
		return st.Health.ReloadError == "" && classRate("1:11") == "10Mbit"
	}); !ok {
		t.Errorf("fixed edit: %+v, rate %s", st.Health, classRate("1:11"))
	}

	// An edit that validates but does not plan on this kernel (a leaf
	// qdisc it lacks): refused as a broken one is, the policy in force
	// stays and drift is still repaired (it was once taken as reloaded,
	// and every pass then failed).
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	lacks := ""
	for _, q := range []string{"fq_codel", "sfq", "cake", "fq"} {
		if !rep.Features().Qdiscs[q] {
			lacks = q
			break
		}
	}
	if lacks == "" {
		t.Log("this kernel has every leaf qdisc: no edit that validates fails to plan here")
	} else {
		os.WriteFile(pol, []byte(strings.Replace(fmt.Sprintf(agentPolicy, "9mbit"), "          rate: 9mbit\n          leaf: pfifo", "          rate: 9mbit\n          leaf: "+lacks, 1)), 0o644)
		if _, ok := within(2*time.Second, func() bool { st = a.status(); return st.Health.ReloadError != "" }); !ok {
			t.Fatalf("an edit with a %s leaf on a kernel without it was not refused: %+v", lacks, st.Health)
		}
		if !strings.Contains(st.Health.ReloadError, "cannot be applied here") || !strings.Contains(st.Health.ReloadError, lacks) {
			t.Errorf("reload error %q", st.Health.ReloadError)
		}
		testutil.NS(t, ns, "tc", "class", "change", "dev", "eth0", "parent", "1:1", "classid", "1:11", "htb", "rate", "1mbit", "ceil", "20mbit")
		if _, ok := within(2500*time.Millisecond, func() bool { return classRate("1:11") == "10Mbit" }); !ok {
			t.Errorf("after a refused edit, drift is not repaired to the policy in force: %s\n%s", classRate("1:11"), a.Log())
		}
		if st = a.status(); st.Health.LastError != "" {
			t.Errorf("passes fail after a refused edit: %s", st.Health.LastError)
		}
		os.WriteFile(pol, []byte(fmt.Sprintf(agentPolicy, "10mbit")), 0o644)
		if _, ok := within(2*time.Second, func() bool { st = a.status(); return st.Health.ReloadError == "" }); !ok {
			t.Errorf("the policy back: %+v", st.Health)
		}
	}

	// One agent per namespace.
	r := runSluice(t, bin, []string{"SLUICE_STATE_DIR=" + stateDir(t)}, "--netns", ns, "agent", pol, "--listen", "127.0.0.1:0")
	if r.code != 1 || !strings.Contains(r.stderr, "another sluice agent runs in this network namespace") {
		t.Errorf("second agent: exit %d %s", r.code, r.stderr)
	}
	// The command line still works beside it.
	if out := must(t, "--netns", ns, "plan", pol); strings.TrimSpace(out) != "no changes" {
		t.Errorf("plan beside the agent:\n%s", out)
	}

	took, code := a.stop(syscall.SIGTERM)
	if code != 0 || took > 2*time.Second {
		t.Errorf("SIGTERM: exit %d after %v (want 0 within 2 s)", code, took)
	}
	if r := classRate("1:11"); r != "10Mbit" {
		t.Errorf("after SIGTERM the tree is gone (bulk rate %q); it must stay", r)
	}

	// --reset-on-exit removes what it applied, and only that.
	b := startAgent(t, ns, pol, "--reset-on-exit")
	took, code = b.stop(syscall.SIGINT)
	if code != 0 || took > 2*time.Second {
		t.Errorf("SIGINT with --reset-on-exit: exit %d after %v", code, took)
	}
	if q := tcShow(t, ns, "qdisc", "show", "dev", "eth0"); strings.Contains(q, "htb") {
		t.Errorf("--reset-on-exit left:\n%s", q)
	}
}

// A device that is missing is waited for while the others are shaped;
// when it appears, it is shaped.
func TestAgentWaitsForMissingDevice(t *testing.T) {
	ns := devNS(t, "eth0")
	pol := writePolicy(t, "p.yaml", fmt.Sprintf(agentPolicy, "15mbit")+"  - name: eth1\n    egress: {rate: 7mbit}\n")
	a := startAgent(t, ns, pol)
	st := a.status()
	if len(st.Health.Waiting) != 1 || st.Health.Waiting[0] != "eth1" || st.Health.LastResult == "error" {
		t.Fatalf("health with eth1 missing: %+v", st.Health)
	}
	if !strings.Contains(tcShow(t, ns, "class", "show", "dev", "eth0"), "rate 15Mbit") {
		t.Fatal("eth0 not shaped while eth1 is missing")
	}
	testutil.NS(t, ns, "ip", "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p")
	testutil.NS(t, ns, "ip", "link", "set", "eth1", "up")
	if _, ok := within(3*time.Second, func() bool {
		return strings.Contains(tcShow(t, ns, "class", "show", "dev", "eth1"), "rate 7Mbit")
	}); !ok {
		t.Fatalf("eth1 not shaped after it appeared:\n%s", a.Log())
	}
	// Deleted and made again: a new device, shaped again.
	testutil.NS(t, ns, "ip", "link", "del", "eth1")
	testutil.NS(t, ns, "ip", "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p")
	if _, ok := within(3*time.Second, func() bool {
		return strings.Contains(tcShow(t, ns, "class", "show", "dev", "eth1"), "rate 7Mbit")
	}); !ok {
		t.Fatalf("eth1 not shaped after it was made again:\n%s", a.Log())
	}
	if st := a.status(); len(st.Health.Waiting) != 0 || st.Health.LastResult == "error" {
		t.Errorf("health: %+v", st.Health)
	}
}
