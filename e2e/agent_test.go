package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
	"sluice/kernel"
	"sluice/records"
	"sluice/testutil"
)

// agentProc is a `sluice agent` the test started.
type agentProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string // host:port it listens on
	mu   sync.Mutex
	log  bytes.Buffer
	done chan struct{}
	err  error // Wait's, once done is closed
}

func (a *agentProc) Write(b []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.Write(b)
}

// Log is everything the agent logged so far.
func (a *agentProc) Log() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.String()
}

// startAgent runs the agent on ns with a private state directory,
// listening on a free port, and waits for its first pass.
func startAgent(t *testing.T, ns, pol string, extra ...string) *agentProc {
	t.Helper()
	return startAgentWith(t, bin, nil, ns, pol, extra...)
}

// startAgentWith is startAgent for binary (the fault-injecting one),
// with env added to the environment.
func startAgentWith(t *testing.T, binary string, env []string, ns, pol string, extra ...string) *agentProc {
	t.Helper()
	args := append([]string{"--netns", ns, "agent", pol, "--listen", "127.0.0.1:0", "--log-format", "json"}, extra...)
	a := &agentProc{t: t, cmd: exec.Command(binary, args...), done: make(chan struct{})}
	a.cmd.Env = append(append(os.Environ(), "SLUICE_STATE_DIR="+stateDir(t)), env...)
	a.cmd.Stdout, a.cmd.Stderr = a, a
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.done
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Log())
		}
	})
	info := filepath.Join(stateDir(t), "netns", ns, agent.AgentFile)
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-a.done:
			t.Fatalf("agent exited: %v\n%s", a.err, a.Log())
		default:
		}
		if b, err := os.ReadFile(info); err == nil {
			var i agent.Info
			if json.Unmarshal(b, &i) == nil && i.PID == a.cmd.Process.Pid {
				a.addr = i.Listen
				// Started: healthy, or waiting for a missing device.
				if code, body := a.get("/healthz"); code == 200 || code == 503 && strings.Contains(body, "waiting for") {
					return a
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not healthy within 10 s:\n%s", a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *agentProc) get(path string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + a.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (a *agentProc) status() agent.Status {
	a.t.Helper()
	code, body := a.get("/api/v1/status")
	var st agent.Status
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		a.t.Fatalf("status: %d %.300s", code, body)
	}
	return st
}

// metric returns the value of the series whose name and labels start
// with prefix (e.g. `sluice_class_sent_bytes_total{class="bulk"`).
func (a *agentProc) metric(name string, labels ...string) (float64, bool) {
	_, body := a.get("/metrics")
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		ok := true
		for _, lv := range labels {
			if !strings.Contains(l, lv) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		return v, err == nil
	}
	return 0, false
}

// stop signals the agent and returns how long it took to exit and its
// exit code.
func (a *agentProc) stop(sig syscall.Signal) (time.Duration, int) {
	a.t.Helper()
	start := time.Now()
	a.cmd.Process.Signal(sig)
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		a.t.Fatalf("agent still running 10 s after %v", sig)
	}
	return time.Since(start), a.cmd.ProcessState.ExitCode()
}

// within polls cond every 50 ms for up to d and reports how long it took.
func within(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < d {
		if cond() {
			return time.Since(start), true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return d, cond()
}

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
	if v, ok := a.metric("sluice_drift_repairs_total"); !ok || v < 1 {
		t.Errorf("sluice_drift_repairs_total = %v (%v)", v, ok)
	}
	// At info level: one line a pass, no line an object.
	if !strings.Contains(a.Log(), `"msg":"repaired drift","changes":1,`) || !strings.Contains(a.Log(), `"summary":"change 1 class: class/eth0/1:11"`) {
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
	if st := a.status(); st.Health.Repairs < 2 || st.Health.LastRepair.IsZero() {
		t.Errorf("status health after two repairs: %+v", st.Health)
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
	var st agent.Status
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
	rep, err := kernel.ProbeCached(records.Dir(""))
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

// udpSend sends n datagrams of size bytes from ns to addr:port at about
// rate bits/s and returns how many bytes of payload it sent.
func udpSend(t *testing.T, ns, addr string, port, n, size int, rate float64) int {
	t.Helper()
	var conn net.Conn
	if err := testutil.InNetns(ns, func() (err error) {
		conn, err = net.Dial("udp", net.JoinHostPort(addr, strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, size)
	gap := time.Duration(float64(size*8) / rate * float64(time.Second))
	start := time.Now()
	sent := 0
	for i := 0; i < n; i++ {
		if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d)
		}
		if _, err := conn.Write(buf); err == nil {
			sent += size
		}
	}
	return sent
}

// udpFlood sends 1000-byte datagrams from ns to addr at rate (bits/s)
// to each port until the returned stop is called (more than once is
// fine).
func udpFlood(t *testing.T, ns, addr string, rate float64, ports ...int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, port := range ports {
		wg.Add(1)
		go func(port int) {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				udpSend(t, ns, addr, port, int(rate/8000/4), 1000, rate) // a quarter second at a time
			}
		}(port)
	}
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// tcClassBytes reads a class's sent bytes with tc -s.
func tcClassBytes(t *testing.T, ns, dev, id string) float64 {
	t.Helper()
	out := tcShow(t, ns, "-s", "class", "show", "dev", dev, "classid", id)
	m := regexp.MustCompile(`Sent (\d+) bytes`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no counters for %s:\n%s", id, out)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// The counters on /metrics are the kernel's (tc -s agrees) and count
// what the generator sent (its payload plus UDP, IP and Ethernet
// headers), within 2%; `sluice show` prints the agent's reading and
// `sluice munin` its counters.
func TestAgentMetricsMatchTraffic(t *testing.T) {
	p := testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    egress:
      rate: 20mbit
      default: other
      classes:
        - name: udp
          rate: 10mbit
          match:
            - { proto: udp, dport: 9000 }
        - name: other
          rate: 10mbit
`))
	a := startAgent(t, p.A, pol, "--interval", "500ms")
	const n, size = 3000, 1000
	payload := udpSend(t, p.A, testutil.AddrB, 9000, n, size, 8e6)
	time.Sleep(1500 * time.Millisecond) // three passes
	wire := float64(payload) * float64(size+8+20+14) / size
	got, ok := a.metric("sluice_class_sent_bytes_total", `class="udp"`, `direction="egress"`, `device="veth0"`)
	kern := tcClassBytes(t, p.A, p.DevA, "1:10")
	t.Logf("generator: %d datagrams, %.0f bytes on the wire; metrics %.0f; tc -s %.0f", n, wire, got, kern)
	if !ok || got < wire*0.98 || got > wire*1.02 {
		t.Errorf("sluice_class_sent_bytes_total %.0f, want %.0f within 2%%", got, wire)
	}
	if kern < got*0.98 || kern > got*1.02 {
		t.Errorf("tc -s says %.0f, metrics %.0f", kern, got)
	}
	if pk, _ := a.metric("sluice_class_sent_packets_total", `class="udp"`); pk < n*0.98 || pk > n*1.02 {
		t.Errorf("packets %.0f, want %d", pk, n)
	}
	if v, ok := a.metric("sluice_class_rate_bytes_per_second", `class="udp"`); !ok || v != 10e6/8 {
		t.Errorf("sluice_class_rate_bytes_per_second %v", v)
	}
	if v, ok := a.metric("sluice_class_ceil_bytes_per_second", `class="udp"`); !ok || v != 20e6/8 {
		t.Errorf("sluice_class_ceil_bytes_per_second %v", v)
	}
	if v, ok := a.metric("sluice_reconcile_total", `result="ok"`); !ok || v < 2 {
		t.Errorf("sluice_reconcile_total{result=ok} %v", v)
	}
	for _, m := range []string{"sluice_class_dropped_packets_total", "sluice_class_overlimits_total", "sluice_class_backlog_bytes",
		"sluice_apply_duration_seconds_count", "go_goroutines", "process_open_fds"} {
		if _, ok := a.metric(m); !ok {
			t.Errorf("no %s on /metrics", m)
		}
	}

	// show asks the agent: the same reading.
	out := must(t, "--netns", p.A, "show", "--json")
	var s struct {
		Trees []struct {
			Classes []struct {
				Name  string `json:"name"`
				Bytes uint64 `json:"bytes"`
			} `json:"classes"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Trees) != 1 {
		t.Fatalf("show --json: %v\n%s", err, out)
	}
	for _, c := range s.Trees[0].Classes {
		if c.Name == "udp" && (float64(c.Bytes) < got*0.98 || float64(c.Bytes) > got*1.02) {
			t.Errorf("show says %d bytes, metrics %.0f", c.Bytes, got)
		}
	}
	if text := must(t, "--netns", p.A, "show"); !strings.Contains(text, "from the sluice agent") {
		t.Errorf("show did not ask the agent:\n%s", text)
	}
	if text := must(t, "--netns", p.A, "show", "--local", "--interval", "0"); strings.Contains(text, "from the sluice agent") {
		t.Errorf("show --local asked the agent:\n%s", text)
	}

	// munin: a graph per device and direction, a DERIVE line per class,
	// values in bits.
	cfg := must(t, "--netns", p.A, "munin", "config")
	for _, want := range []string{"multigraph sluice_veth0_egress", "graph_title sluice veth0 egress", "c_udp.label udp", "c_udp.type DERIVE", "c_other.min 0"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("munin config lacks %q:\n%s", want, cfg)
		}
	}
	vals := must(t, "--netns", p.A, "munin")
	m := regexp.MustCompile(`(?m)^c_udp\.value (\d+)$`).FindStringSubmatch(vals)
	if m == nil {
		t.Fatalf("munin values:\n%s", vals)
	}
	if v, _ := strconv.ParseFloat(m[1], 64); v < got*8*0.98 || v > got*8*1.02 {
		t.Errorf("munin says %s bits, metrics %.0f bytes", m[1], got)
	}
	if r := sluice(t, "--netns", p.A, "munin", "bogus"); r.code != 2 {
		t.Errorf("munin bogus: exit %d", r.code)
	}
}

// The API refuses what it does not know with a clear JSON error, and
// the agent refuses bad flags and a bad policy at start (exit 2).
func TestAgentBadInput(t *testing.T) {
	ns := devNS(t, "eth0")
	pol := writePolicy(t, "p.yaml", fmt.Sprintf(agentPolicy, "15mbit"))
	env := []string{"SLUICE_STATE_DIR=" + stateDir(t)}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--netns", ns, "agent", writePolicy(t, "bad.yaml", fmt.Sprintf(agentPolicy, "15mbitz"))}, "bad.yaml:14:17"},
		{[]string{"--netns", ns, "agent", pol, "--interval", "1ms"}, "--interval 1ms: must be between 100ms and 1h"},
		{[]string{"--netns", ns, "agent", pol, "--log-format", "xml"}, `--log-format "xml"`},
		{[]string{"--netns", "", "agent", pol}, "--netns"},
		{[]string{"--netns", ns, "agent", pol, "--listen", "256.0.0.1:x"}, "--listen"},
	} {
		r := runSluice(t, bin, env, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %s", c.args, r.code, r.stderr)
		}
	}
	if q := tcShow(t, ns, "qdisc", "show", "dev", "eth0"); strings.Contains(q, "htb") {
		t.Errorf("refused agents changed the kernel:\n%s", q)
	}
	a := startAgent(t, ns, pol)
	for path, want := range map[string]int{
		"/api/v1/status?hosts=maybe": 400, "/api/v1/status?x=1": 400, "/api/v1/history?x=1": 400,
		"/nope": 404, "/api/v1/status?hosts=0": 200, "/static/dygraph.min.js": 200, "/": 200,
	} {
		code, body := a.get(path)
		if code != want {
			t.Errorf("GET %s: %d (want %d) %.200s", path, code, want, body)
		}
		if want >= 400 && !strings.Contains(body, `"error"`) {
			t.Errorf("GET %s: no JSON error: %s", path, body)
		}
	}
}

// The systemd unit in deploy/ is valid (systemd-analyze verify), and the
// agent does its whole job, BPF classifier included, with no capability
// beyond the unit's CapabilityBoundingSet.
func TestSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile("../deploy/sluice-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.+)$`).FindSubmatch(unit)
	if m == nil {
		t.Fatal("the unit sets no CapabilityBoundingSet")
	}
	var caps []string
	for _, c := range strings.Fields(string(m[1])) {
		caps = append(caps, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	if sa, err := exec.LookPath("systemd-analyze"); err == nil {
		dir := t.TempDir()
		// The oneshot apply unit too (make install's other unit).
		for _, name := range []string{"sluice-agent.service", "sluice-apply.service"} {
			u, err := os.ReadFile("../deploy/" + name)
			if err != nil {
				t.Fatal(err)
			}
			fixed := strings.ReplaceAll(string(u), "/usr/local/bin/sluice", bin)
			os.WriteFile(filepath.Join(dir, name), []byte(fixed), 0o644)
			if out, err := exec.Command(sa, "verify", filepath.Join(dir, name)).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
				t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
			}
		}
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	ns := devNS(t, "eth0")
	pol := writePolicy(t, "p.yaml", `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      classifier: bpf
      default: bulk
      classes:
        - name: voip
          rate: 5mbit
          prio: 0
          match: [{proto: udp, dport: 5060}]
        - name: bulk
          rate: 15mbit
`)
	args := []string{"--bounding-set", "-all," + strings.Join(caps, ","), "--inh-caps", "-all", "--", bin,
		"--netns", ns, "agent", pol, "--listen", "127.0.0.1:0"}
	cmd := exec.Command(setpriv, args...)
	cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+stateDir(t))
	var log bytes.Buffer
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ok := func() bool {
		return strings.Contains(tcShow(t, ns, "filter", "show", "dev", "eth0", "egress"), "bpf") &&
			strings.Contains(tcShow(t, ns, "class", "show", "dev", "eth0"), "rate 5Mbit")
	}
	if _, done := within(10*time.Second, ok); !done {
		t.Fatalf("with the unit's capabilities (%v) the agent did not apply the policy:\n%s", caps, log.String())
	}
	// Reading the tree back (BPF program by id) works too: a detached
	// program is put back.
	testutil.NS(t, ns, "tc", "filter", "del", "dev", "eth0", "egress")
	if _, done := within(3*time.Second, ok); !done {
		t.Fatalf("detached classifier not repaired with the unit's capabilities:\n%s", log.String())
	}
	if strings.Contains(log.String(), "level=ERROR") {
		t.Errorf("errors with the unit's capabilities:\n%s", log.String())
	}
}

// SIGHUP re-reads the policy even when its files look unchanged, and an
// edit of a hosts_file the policy names is applied like an edit of the
// policy: a new subscriber's class appears, a removed one's goes.
// hostsPolicy shapes eth0's hosts from hosts.csv beside it, through the
// BPF classifier, with a 5mbit default class.
const hostsPolicy = `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      classifier: bpf
      default: rest
      classes:
        - name: subs
          rate: 15mbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 5mbit
`

func TestAgentReloadsHostsFileAndSIGHUP(t *testing.T) {
	ns := devNS(t, "eth0")
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts.csv")
	os.WriteFile(hosts, []byte("name,addresses,rate,ceil\nalice,10.1.0.1,2mbit,10mbit\nbob,10.1.0.2,3mbit,10mbit\n"), 0o644)
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(hostsPolicy), 0o644)
	a := startAgent(t, ns, pol)
	classes := func() string { return tcShow(t, ns, "class", "show", "dev", "eth0") }
	if c := classes(); !strings.Contains(c, "rate 2Mbit") || !strings.Contains(c, "rate 3Mbit") {
		t.Fatalf("hosts not shaped:\n%s", c)
	}
	os.WriteFile(hosts, []byte("name,addresses,rate,ceil\nalice,10.1.0.1,2mbit,10mbit\ncarol,10.1.0.3,4mbit,10mbit\n"), 0o644)
	if _, ok := within(2*time.Second, func() bool {
		c := classes()
		return strings.Contains(c, "rate 4Mbit") && !strings.Contains(c, "rate 3Mbit")
	}); !ok {
		t.Fatalf("hosts_file edit not applied within 2 s:\n%s\n%s", classes(), a.Log())
	}
	before := strings.Count(a.Log(), `"msg":"policy reloaded"`)
	a.cmd.Process.Signal(syscall.SIGHUP)
	if _, ok := within(2*time.Second, func() bool {
		return strings.Count(a.Log(), `"msg":"policy reloaded"`) > before && strings.Contains(a.Log(), `"forced":true`)
	}); !ok {
		t.Fatalf("SIGHUP did not reload:\n%s", a.Log())
	}
	if v, ok := a.metric("sluice_reload_total", `result="ok"`); !ok || v < 2 {
		t.Errorf("sluice_reload_total{result=ok} = %v", v)
	}
	// A broken edit of a policy with a hosts_file is refused once, not
	// at every poll of the files.
	good, _ := os.ReadFile(pol)
	os.WriteFile(pol, append(good, []byte("bogus: [\n")...), 0o644)
	time.Sleep(2500 * time.Millisecond)
	if n := strings.Count(a.Log(), "policy refused"); n != 1 {
		t.Errorf("a broken edit was refused %d times in 2.5 s, want once:\n%s", n, a.Log())
	}
	// Put back as it was: no edit, said so, and the refusal cleared.
	mark := a.Log()
	os.WriteFile(pol, good, 0o644)
	if _, ok := within(2*time.Second, func() bool { return a.status().Health.ReloadError == "" }); !ok {
		t.Errorf("the policy put back as it was: reload error stays %q", a.status().Health.ReloadError)
	}
	if code, _ := a.get("/healthz"); code != 200 {
		t.Errorf("healthz %d after reloads", code)
	}
	// A hosts file deleted (refused: the policy names it) and put back.
	hostsNow, _ := os.ReadFile(hosts)
	os.Remove(hosts)
	if _, ok := within(2*time.Second, func() bool { return a.status().Health.ReloadError != "" }); !ok {
		t.Errorf("a deleted hosts_file was not reported")
	}
	os.WriteFile(hosts, hostsNow, 0o644)
	if _, ok := within(2*time.Second, func() bool { return a.status().Health.ReloadError == "" }); !ok {
		t.Errorf("the hosts_file put back: reload error stays %q", a.status().Health.ReloadError)
	}
	time.Sleep(300 * time.Millisecond)
	back := strings.TrimPrefix(a.Log(), mark)
	if strings.Contains(back, "hosts edited in place") || strings.Count(back, "files are back as the policy in force read them") != 2 {
		t.Errorf("files put back as they were are not an edit:\n%s", back)
	}
}

// The sharing controller: two UDP tenants of weights 1 and 3 flood a
// 20mbit link with equal quanta; the agent holds them to their weighted
// shares (5 and 15 Mbit/s), shows the decision in its status, metrics
// and history, and does not count its own writes as drift. While it
// runs, a plain apply and plan keep them; once it is killed, apply puts
// the policy's back. Without a cap it gives the shares as the classes'
// rates (the ceils stay the policy's); with one, as their ceils.
func TestAgentSharingController(t *testing.T) {
	for _, tc := range []struct{ name, sharing, field string }{
		{"rates", "{mode: controller, quantum: 500ms}", "rate_bps"},
		{"ceils", "{mode: controller, quantum: 500ms, cap: 20mbit}", "ceil_bps"},
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
					Rate float64 `json:"rate_bps"`
					Ceil float64 `json:"ceil_bps"`
				} `json:"classes"`
			} `json:"trees"`
		}
		if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Trees) != 1 {
			t.Fatalf("show: %v\n%s", err, out)
		}
		m := map[string][2]float64{}
		for _, c := range s.Trees[0].Classes {
			m[c.Name] = [2]float64{c.Rate, c.Ceil}
		}
		return m
	}
	// held is the field the controller writes; the other stays the
	// policy's.
	held := func(c [2]float64) float64 {
		if field == "rate_bps" {
			return c[0]
		}
		return c[1]
	}
	other := func(c [2]float64) float64 {
		if field == "rate_bps" {
			return c[1]
		}
		return c[0]
	}
	policyOther := map[bool]float64{true: 20e6, false: 100e3}[field == "rate_bps"]
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
		shares = append(shares, fmt.Sprintf("%s:%v:%.0f:%.0f:%v", sh.Class, sh.Weight, sh.Share, sh.Limit, sh.Applied))
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
	what := map[bool]string{true: "writing their rates", false: "writing their ceils"}[field == "rate_bps"]
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
