package agent

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unsafe"

	"sluice/stats"
)

// Wrong methods are 405 with Allow, unknown paths 404, a Host that is
// not the agent's 421 (DNS rebinding), and no page may frame the
// dashboard.
func TestHTTPMethodsHostsAndFrames(t *testing.T) {
	a := fakeAgent(3, false)
	a.hostNames = hostNames([]string{"gw.example"})
	a.health.Reconciles = 1
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	do := func(method, path, host string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		method, path, host string
		code               int
	}{
		{"GET", "/api/v1/status", "", 200},
		{"POST", "/api/v1/status", "", 405},
		{"DELETE", "/metrics", "", 405},
		{"PUT", "/static/app.js", "", 405},
		{"GET", "/nothing", "", 404},
		{"GET", "/healthz", "localhost:9464", 200},
		{"GET", "/healthz", "[::1]:9464", 200},
		{"GET", "/healthz", "GW.example:9464", 200},
		{"GET", "/api/v1/status", "attacker.example:9464", 421},
		{"GET", "/", "attacker.example", 421},
	} {
		resp := do(c.method, c.path, c.host)
		if resp.StatusCode != c.code {
			t.Errorf("%s %s Host %q: %d, want %d", c.method, c.path, c.host, resp.StatusCode, c.code)
		}
		if c.code == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s %s: Allow %q", c.method, c.path, resp.Header.Get("Allow"))
		}
		if !strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") || resp.Header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s %s: frame headers %v", c.method, c.path, resp.Header)
		}
	}
}

// /healthz means the policy is in force: not while a device of it is
// waited for (a policy whose devices are all missing shapes nothing).
func TestHealthMeansInForce(t *testing.T) {
	a := fakeAgent(0, false)
	if ok, why := a.Healthy(); ok || why != "starting" {
		t.Errorf("before a pass: %v %q", ok, why)
	}
	a.health.Reconciles, a.health.LastResult = 1, "ok"
	if ok, _ := a.Healthy(); !ok {
		t.Error("after a pass that worked: unhealthy")
	}
	a.health.Waiting = []string{"eth0", "eth1"}
	if ok, why := a.Healthy(); ok || !strings.Contains(why, "waiting for eth0, eth1") {
		t.Errorf("waiting: %v %q", ok, why)
	}
	a.health.Waiting, a.health.ReloadError = nil, "p.yaml:3:1: bad"
	if ok, why := a.Healthy(); !ok || !strings.Contains(why, "refused") {
		t.Errorf("a refused edit, the old policy in force: %v %q", ok, why)
	}
	a.health.LastResult, a.health.LastError = "error", "boom"
	if ok, why := a.Healthy(); ok || why != "boom" {
		t.Errorf("a failed pass: %v %q", ok, why)
	}
}

// A reply is encoded once per reading and shared by every request until
// the reading changes: clients that never read hold one buffer between
// them, not one each.
func TestRepliesSharedPerReading(t *testing.T) {
	a := fakeAgent(2000, false)
	builds := 0
	get := func() []byte {
		return a.replies.get("status", a.generation(), func() any { builds++; return a.Status(true) })
	}
	first := get()
	for i := 0; i < 50; i++ {
		if b := get(); &b[0] != &first[0] {
			t.Fatal("a second request got a buffer of its own")
		}
	}
	if builds != 1 {
		t.Errorf("%d encodings for 51 requests of one reading", builds)
	}
	a.mu.Lock()
	a.gen++
	a.mu.Unlock()
	if get(); builds != 2 {
		t.Errorf("a new reading was not encoded afresh (%d encodings)", builds)
	}
}

// The server holds at most max connections. Idle ones (silent, or kept
// alive) give their place to a new one, the longest idle first, so that
// clients holding connections cannot keep out one that asks; when every
// connection is answering a request, the one busy the longest gives way.
// (Its clock moves connGrace at each reading: every connection is past
// the grace TestConnLimiterFavoursClientsThatAsk tests.)
func TestConnLimiter(t *testing.T) {
	const max = 8
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := &connLimiter{Listener: ln, max: max, conns: map[net.Conn]*connUse{}}
	var at time.Time
	lim.now = func() time.Time { at = at.Add(connGrace); return at } // under lim.mu
	release := make(chan struct{})
	srv := &http.Server{ConnState: lim.state, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			<-release
		}
		fmt.Fprintln(w, "ok")
	})}
	go srv.Serve(lim)
	defer srv.Close()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ask := func(c net.Conn, path string) (string, error) {
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", path)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	}
	var idle []net.Conn
	for i := 0; i < 3*max; i++ {
		idle = append(idle, dial())
	}
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	c := dial()
	if line, err := ask(c, "/"); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("a client that asks, beside %d idle ones: %q %v", 3*max, line, err)
	}
	c.Close()
	if n := lim.held(); n > max {
		t.Errorf("%d connections held, limit %d", n, max)
	}
	// The oldest idle ones were closed: reading them says so.
	idle[0].SetReadDeadline(time.Now().Add(time.Second))
	if _, err := idle[0].Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("the longest idle connection was not closed: %v", err)
	}
	// Every connection busy: a new one is closed, and let in once one ends.
	// Each busy one is let in once the one before is answering: a
	// connection that has not sent its request yet is idle, and the
	// next one may take its place.
	busyNow := func() int {
		lim.mu.Lock()
		defer lim.mu.Unlock()
		n := 0
		for _, u := range lim.conns {
			if u.busy {
				n++
			}
		}
		return n
	}
	var busy []net.Conn
	for i := 0; i < max; i++ {
		b := dial()
		fmt.Fprintf(b, "GET /block HTTP/1.1\r\nHost: localhost\r\n\r\n")
		busy = append(busy, b)
		for deadline := time.Now().Add(2 * time.Second); busyNow() <= i && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if n := busyNow(); n != max {
		t.Fatalf("%d connections busy, want %d", n, max)
	}
	// A new one is answered all the same: the connection busy the
	// longest gives way (clients that ask and never read must not keep
	// out /healthz, issue 58).
	late := dial()
	if line, err := ask(late, "/"); err != nil || !strings.Contains(line, "200") {
		t.Errorf("while every connection was busy: %q %v", line, err)
	}
	busy[0].SetReadDeadline(time.Now().Add(time.Second))
	if _, err := busy[0].Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("the connection busy the longest was not closed: %v", err)
	}
	if n := lim.held(); n > max {
		t.Errorf("%d connections held, limit %d", n, max)
	}
	close(release)
	for _, b := range busy {
		b.Close()
	}
	time.Sleep(100 * time.Millisecond)
	again := dial()
	defer again.Close()
	if line, err := ask(again, "/"); err != nil || !strings.Contains(line, "200") {
		t.Errorf("after the busy ones ended: %q %v", line, err)
	}
}

// At the limit a connection that asked (its request waiting to be read)
// outlasts every silent one, whatever their ages; a silent one is let be
// connGrace before it gives way to a client that asks; and a new
// connection that is silent itself, while every silent one held is
// within its grace, is closed instead. Clients reconnecting as fast as
// they were closed otherwise made each new connection the oldest within
// milliseconds, and /healthz requests were closed unread.
func TestConnLimiterFavoursClientsThatAsk(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var now time.Time
	lim := &connLimiter{Listener: ln, max: 3, conns: map[net.Conn]*connUse{}, now: func() time.Time { return now }}
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	dial := func(asks bool) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if asks {
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
		}
		clients = append(clients, c)
		time.Sleep(20 * time.Millisecond) // on the server's side, accepted and read
		return c
	}
	accept := func() {
		t.Helper()
		c, err := lim.Accept()
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		now = now.Add(time.Millisecond) // an order of age
	}
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !strings.Contains(err.Error(), "timeout")
	}
	a, b, c := dial(true), dial(false), dial(false)
	accept()
	accept()
	accept()
	now = now.Add(10 * time.Millisecond)
	d, e := dial(false), dial(true)
	accept() // d closed at once, e in b's place (the oldest silent one)
	if dc, bc := closed(d), closed(b); !dc || !bc {
		t.Errorf("a silent newcomer while the silent ones are young: closed %v (want true); the oldest silent one closed %v (want true)", dc, bc)
	}
	now = now.Add(connGrace)
	f := dial(true)
	accept() // in c's place: silent, though a asked before it
	if cc, ac := closed(c), closed(a); !cc || ac {
		t.Errorf("a client that asks, past the grace: the silent one closed %v (want true), the older one that asked %v (want false)", cc, ac)
	}
	dial(true)
	accept() // every one asked: the oldest gives way
	if ac, ec, fc := closed(a), closed(e), closed(f); !ac || ec || fc {
		t.Errorf("every held one asked: the oldest closed %v (want true), the others %v %v (want false)", ac, ec, fc)
	}
	if n := lim.held(); n != 3 {
		t.Errorf("%d held, want 3", n)
	}
}

// The agent's listener hands over a connection only once it has sent
// something: a silent client costs the agent nothing.
func TestListenHTTPDefersSilentClients(t *testing.T) {
	ln, err := listenHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			got <- c
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s := <-got:
		s.Close()
		t.Fatal("a client that sent nothing was handed to the server")
	case <-time.After(300 * time.Millisecond):
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\n")
	select {
	case s := <-got:
		s.Close()
	case <-time.After(2 * time.Second):
		t.Fatal("a client that asked was not handed to the server")
	}
}

// The history keeps its own copy of each series' name, never the
// reading's: a reading's names may point into a pass's whole records
// buffer, which a kept name would keep alive.
func TestHistoryDoesNotPinReadings(t *testing.T) {
	h := newHistory(5)
	buf := []byte(strings.Repeat("x", 1<<20) + "eth0egressbulk")
	big := unsafe.String(&buf[0], len(buf))
	n := len(big)
	s := &stats.Sample{At: time.Now(), Trees: []*stats.Tree{{Interface: big[n-14 : n-10], Direction: big[n-10 : n-4],
		Classes: []*stats.Class{{Name: big[n-4:], Measured: 1}}}}}
	h.add(s)
	h.add(s)
	lo, hi := uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&buf[0]))+uintptr(len(buf))
	for _, row := range h.rate {
		for _, p := range row {
			for _, str := range []string{p.key.Interface, p.key.Direction, p.key.Class} {
				if at := uintptr(unsafe.Pointer(unsafe.StringData(str))); at >= lo && at < hi {
					t.Fatalf("the history keeps %q inside the reading's buffer", str)
				}
			}
		}
	}
	if p0, p1 := h.rate[0][0].key.Class, h.rate[1][0].key.Class; unsafe.StringData(p0) != unsafe.StringData(p1) {
		t.Error("each pass keeps a copy of its own of a name the history already holds")
	}
}

// Classes come and go (a pod a second churns through a Kubernetes
// node): the history forgets the names and drop counters of those that
// left its window, so that it holds what it charts, not every class
// that ever was (each kept name grew the agent's heap for hours: the
// Kubernetes soak's RSS rose 0.6 MB a minute).
func TestHistoryForgetsClassesGone(t *testing.T) {
	h := newHistory(5)
	t0 := time.Now()
	for i := range 1000 {
		s := &stats.Sample{At: t0.Add(time.Duration(i) * time.Second), Trees: []*stats.Tree{{Interface: "eth0", Direction: "egress",
			Classes: []*stats.Class{{Name: "bulk", Measured: 1}, {Name: fmt.Sprintf("churn-%d", i), Measured: 1, Drops: uint32(i)}}}}}
		h.add(s)
	}
	// 5 passes of 2 classes, 3 series each (rate, backlog, drops), and
	// the sweep runs every 5 passes: at most twice that between sweeps.
	if len(h.keys) > 2*5*2*3 || len(h.drops) > 2 {
		t.Errorf("after 1,000 classes came and went the history keeps %d names and %d drop counters", len(h.keys), len(h.drops))
	}
	// What it charts is still there: bulk's rate over the window, and
	// the drops per second of the newest class.
	var bulk, drops bool
	for _, se := range h.snapshot().Series {
		bulk = bulk || se.Class == "bulk" && se.Kind == "" && len(se.Values) == 5
		drops = drops || se.Class == "churn-999" && se.Kind == "backlog"
	}
	if !bulk || !drops {
		t.Errorf("the history lost series still in its window: bulk %v, churn-999 %v", bulk, drops)
	}
}

// The agent's own health is in its metrics from the first scrape: the
// build, whether the policy is in force, when a pass last worked, and
// every reload result at 0 (an alert on refusals needs the series
// before the first refusal).
func TestHealthMetrics(t *testing.T) {
	a := fakeAgent(1, false)
	body := scrape(t, a)
	for _, want := range []string{`sluice_build_info{commit="`, "sluice_healthy 0", "sluice_last_success_timestamp_seconds 0",
		`sluice_reload_total{result="refused"} 0`, `sluice_reconcile_total{result="error"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in the scrape", want)
		}
	}
	a.mu.Lock()
	a.health.Reconciles, a.health.LastResult, a.health.LastSuccess = 1, "ok", time.Unix(1700000000, 0)
	a.mu.Unlock()
	body = scrape(t, a)
	for _, want := range []string{"sluice_healthy 1", "sluice_last_success_timestamp_seconds 1.7e+09"} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in the scrape after a pass", want)
		}
	}
}
