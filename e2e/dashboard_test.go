package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sluice/testutil"
)

// chromium finds a headless Chromium.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-headless-shell", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no headless Chromium (scripts/install-deps.sh installs it)")
	}
	t.Skip("no headless Chromium")
	return ""
}

// The dashboard, opened in headless Chromium while traffic flows,
// renders a chart per tree and the class table (and, the tree having a
// sharing controller, its table and the limits charted), its values
// change from one screenshot to the next, and the page requests nothing
// from anywhere but the agent.
func TestDashboardInChromium(t *testing.T) {
	testutil.Slow(t)
	browser := chromium(t)
	p := testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    rtt: on
    egress:
      rate: 20mbit
      default: other
      sharing: controller
      classes:
        - name: video
          rate: 12mbit
          match:
            - { proto: udp, dport: 9000 }
        - name: other
          rate: 7800kbit
          match:
            - { proto: udp, dport: 9001 }
            - { proto: tcp, dport: 9003 }
        - name: tiny
          rate: 160kbit
          match:
            - { proto: udp, dport: 9002 }
`))
	a := startAgent(t, p.A, pol)
	for i, port := range []int{9000, 9001} {
		// Rates that change every second, so the chart moves.
		defer repeat(t, func(k int) { udpSend(t, p.A, testutil.AddrB, port, 100, 1000, float64(2+(k+i)%4)*1e6) })()
	}
	// A TCP flow in other, whose round trips the table shows.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink(ctx, t, p.B, netip.AddrPortFrom(netip.MustParseAddr(testutil.AddrB), 9003))
	go paced(ctx, t, p.A, netip.MustParseAddr(testutil.AddrA), netip.AddrPortFrom(netip.MustParseAddr(testutil.AddrB), 9003))
	time.Sleep(3 * time.Second) // a few points of history

	dir := t.TempDir()
	url := "http://" + a.addr + "/"
	run := func(args ...string) string { return headless(t, browser, dir, url, args...) }
	netlog := filepath.Join(dir, "netlog.json")
	dom := run("--dump-dom", "--log-net-log="+netlog)
	for _, want := range []string{`id="chart-veth0-egress"`, `data-class="video"`, `data-class="other"`, `id="last-result"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered page lacks %s", want)
		}
	}
	if m := regexp.MustCompile(`<body data-updates="(\d+)"`).FindStringSubmatch(dom); m == nil || m[1] == "0" {
		t.Errorf("the page never updated: %v", m)
	}
	// dygraphs draws on canvases inside the chart's div.
	chart := dom[strings.Index(dom, `id="chart-veth0-egress"`):]
	if i := strings.Index(chart, `id="legend-`); i > 0 {
		chart = chart[:i]
	}
	// Three classes, and the limit the sharing controller keeps each
	// at; a 160 kbit class beside 12 Mbit ones puts the axis on a log
	// scale, where it shows.
	if strings.Count(chart, "<canvas") < 1 || !regexp.MustCompile(`data-series="7"`).MatchString(chart) {
		t.Errorf("no chart with seven series drawn (three classes, their limits, the link's rate):\n%.1500s", chart)
	}
	// Below it, each class's drops per second and backlog.
	if !regexp.MustCompile(`id="queue-veth0-egress"[^>]*data-series="6"`).MatchString(dom) {
		t.Errorf("no drops and backlog chart of the three classes")
	}
	// With rtt: on, each class's round trips: other's TCP flow has them,
	// and the queue it waits in now (sluice's own part of them).
	if !strings.Contains(dom, "<th>round trip p50 | p95</th><th>queue now</th>") ||
		!regexp.MustCompile(`data-class="other">.*?<td class="rtt">[0-9.]+ ms \| [0-9.]+ ms</td><td class="queue">[0-9.]+ ms</td>`).MatchString(dom) {
		t.Errorf("no round trips and queue in the class table")
	}
	// Each class's measured rate against its rate and ceil.
	if n := strings.Count(dom, `class="meter"`); n != 4 {
		t.Errorf("%d rate/ceil meters, want one per class and the root's (4)", n)
	}
	if !regexp.MustCompile(`id="chart-veth0-egress"[^>]*data-scale="log"`).MatchString(dom) {
		t.Errorf("the chart's axis is not logarithmic for rates 75:1 apart:\n%.600s", chart)
	}
	if i := strings.Index(dom, `id="sharing-veth0-egress"`); i < 0 || !strings.Contains(dom[i:], "<th>demand</th>") ||
		!strings.Contains(dom[i:], "Mbit (rate)</td>") {
		// No cap: each share is written as the class's rate.
		t.Errorf("no sharing table (weight, demand, share, and the share held as the class's rate)")
	}
	// Every request the page made went to the agent. The net log holds
	// the browser's own requests too (updates, accounts): those have no
	// initiator; the page's name the agent's origin as theirs.
	origin := "http://" + a.addr
	var requests int
	for _, r := range netLogRequests(t, netlog) {
		if r.initiator != origin {
			continue
		}
		requests++
		if !strings.HasPrefix(r.url, origin+"/") {
			t.Errorf("the page requested %s, outside the agent", r.url)
		}
	}
	if requests < 5 { // two style sheets, two scripts, the API
		t.Errorf("the net log holds %d requests from the page", requests)
	}

	// Two screenshots two seconds apart differ: the page is live.
	shots := []string{filepath.Join(dir, "a.png"), filepath.Join(dir, "b.png")}
	for i, s := range shots {
		if i > 0 {
			time.Sleep(2 * time.Second)
		}
		run("--screenshot=" + s)
	}
	pa, _ := os.ReadFile(shots[0])
	pb, _ := os.ReadFile(shots[1])
	if len(pa) < 20000 || len(pb) < 20000 {
		t.Errorf("screenshots of %d and %d bytes: blank?", len(pa), len(pb))
	}
	if bytes.Equal(pa, pb) {
		t.Error("two screenshots 2 s apart are identical: the page does not update")
	}
	if out := os.Getenv("SLUICE_SCREENSHOT"); out != "" {
		os.WriteFile(out, pb, 0o644)
	}
}

// The console's hosts: the top talkers busiest first, a search that
// narrows them (from a link), the worst latency beside them, and one
// host's page charting its rate against its rate and ceil, with drops,
// backlog and round trips, once the page has asked for it.
func TestConsoleHostsInChromium(t *testing.T) {
	testutil.Slow(t)
	browser := chromium(t)
	p := testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    rtt: on
    egress:
      rate: 20mbit
      default: other
      classes:
        - name: subs
          rate: 15mbit
          per_host: {by: dst, cidr: 10.9.0.0/28, rate: 2mbit, ceil: 4mbit}
        - name: other
          rate: 5mbit
`))
	a := startAgent(t, p.A, pol)
	// The host's page asks for it first; the history keeps it from then.
	a.get("/api/v1/hosts?host=" + testutil.AddrB)
	// A TCP flow, whose round trips the host's rows and page show: alone
	// for two seconds (beside the flood below it is mostly in loss
	// recovery, and times few round trips).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink(ctx, t, p.B, netip.AddrPortFrom(netip.MustParseAddr(testutil.AddrB), 9003))
	go paced(ctx, t, p.A, netip.MustParseAddr(testutil.AddrA), netip.AddrPortFrom(netip.MustParseAddr(testutil.AddrB), 9003))
	time.Sleep(2 * time.Second)
	// 6 Mbit/s at a 4mbit ceil: capped, dropping, queued.
	defer repeat(t, func(int) { udpSend(t, p.A, testutil.AddrB, 9000, 300, 1000, 6e6) })()
	time.Sleep(3 * time.Second)

	dir := t.TempDir()
	base := "http://" + a.addr + "/"
	dom := headless(t, browser, dir, base+"#hosts", "--dump-dom")
	// The top talkers' rows (the worst latency's come after them).
	talkers := func(dom string) string { top, _, _ := strings.Cut(dom, `<section id="latency"`); return top }
	rows := regexp.MustCompile(`<tr data-host="([^"]+)"`).FindAllStringSubmatch(talkers(dom), -1)
	if len(rows) != 14 || rows[0][1] != testutil.AddrB {
		t.Fatalf("hosts view: %d rows, first %v; want the 14 hosts of the /28, %s first (the one sending)", len(rows), rows, testutil.AddrB)
	}
	if !strings.Contains(dom, "14 per-host classes") || !strings.Contains(dom, `href="#host=10.9.0.2"`) {
		t.Errorf("hosts view lacks its count or the link to the host's page")
	}
	// The worst latency: the one host with round trips, timed.
	rt := `<td class="rtt">[0-9.]+ ms \| [0-9.]+ ms</td>`
	if i := strings.Index(dom, `<section id="latency"`); i < 0 || strings.HasPrefix(dom[i:], `<section id="latency" hidden`) ||
		!regexp.MustCompile(`id="latency-list".*?<tr data-host="10\.9\.0\.2">.*?`+rt).MatchString(dom[i:]) {
		t.Errorf("no worst-latency list with 10.9.0.2's round trips:\n%.3000s", dom[max(i, 0):])
	}
	dom = headless(t, browser, dir, base+"#hosts?q=10.9.0.1&sort=drops", "--dump-dom")
	rows = regexp.MustCompile(`<tr data-host="([^"]+)"`).FindAllStringSubmatch(talkers(dom), -1)
	if len(rows) != 6 || !strings.Contains(dom, "6 of 14 per-host classes match") {
		t.Errorf("search 10.9.0.1: %d rows, want 10.9.0.1 and .10 to .14", len(rows))
	}

	dom = headless(t, browser, dir, base+"#host="+testutil.AddrB, "--dump-dom")
	if !strings.Contains(dom, `<span id="host-title">10.9.0.2</span>`) {
		t.Fatalf("no host page:\n%.2000s", dom)
	}
	chart := regexp.MustCompile(`id="hchart-veth0-egress"[^>]*`).FindString(dom)
	m := regexp.MustCompile(`data-points="(\d+)"`).FindStringSubmatch(chart)
	if !strings.Contains(chart, `data-series="3"`) || m == nil || m[1] == "0" || m[1] == "1" {
		t.Errorf("the host's chart is not measured, rate and ceil over time: %s", chart)
	}
	if !regexp.MustCompile(`id="queue-hveth0-egress"[^>]*data-series="2"`).MatchString(dom) {
		t.Errorf("no drops and backlog chart on the host's page")
	}
	if m := regexp.MustCompile(`id="rtt-hveth0-egress"[^>]*data-points="(\d+)"`).FindStringSubmatch(dom); m == nil || m[1] == "0" || m[1] == "1" {
		t.Errorf("no round-trip chart on the host's page: %v", m)
	}
	if !strings.Contains(dom, "<th>round trip p50 | p95</th>") || !regexp.MustCompile(`id="htable-veth0-egress".*?`+rt).MatchString(dom) {
		t.Errorf("the host's table lacks its round trips")
	}
	// Its counters: capped at 4 Mbit/s of 6, so it drops.
	i := strings.Index(dom, `id="htable-veth0-egress"`)
	if i < 0 || !strings.Contains(dom[i:], "4.00 Mbit</td>") || !regexp.MustCompile(`class="red">[1-9]`).MatchString(dom[i:]) {
		t.Errorf("the host's table lacks its ceil or its drops:\n%.1500s", dom[i:])
	}
	if out := os.Getenv("SLUICE_SCREENSHOT_HOST"); out != "" {
		headless(t, browser, dir, base+"#host="+testutil.AddrB, "--screenshot="+out)
	}
}

// headless opens url in headless Chromium with a profile in dir and
// returns what it prints (--dump-dom: the page once its scripts ran for
// 4 s of virtual time).
func headless(t *testing.T, browser, dir, url string, args ...string) string {
	t.Helper()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,1100",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--no-first-run", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--virtual-time-budget=4000"}
	cmd := exec.Command(browser, append(append(base, args...), url)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = io.Discard
	done := make(chan error, 1)
	cmd.Start()
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("chromium %v: %v", args, err)
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("chromium %v: no result in 60 s", args)
	}
	return out.String()
}

type netRequest struct{ url, initiator string }

// netLogRequests lists the requests in a Chromium net log
// (--log-net-log): each URL_REQUEST_START_JOB's url and initiator.
func netLogRequests(t *testing.T, file string) []netRequest {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var nl struct {
		Constants struct {
			Types map[string]int `json:"logEventTypes"`
		} `json:"constants"`
		Events []struct {
			Type   int `json:"type"`
			Params struct {
				URL       string `json:"url"`
				Initiator string `json:"initiator"`
			} `json:"params"`
		} `json:"events"`
	}
	if err := json.Unmarshal(b, &nl); err != nil {
		t.Fatalf("net log: %v", err)
	}
	start, ok := nl.Constants.Types["URL_REQUEST_START_JOB"]
	if !ok {
		t.Fatal("net log without URL_REQUEST_START_JOB events")
	}
	var out []netRequest
	for _, e := range nl.Events {
		if e.Type == start && e.Params.URL != "" {
			out = append(out, netRequest{e.Params.URL, e.Params.Initiator})
		}
	}
	return out
}
