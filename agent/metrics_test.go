package agent

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sluice/bpf"
	"sluice/stats"
)

// fakeAgent is an agent with a reading of one tree of n hosts, for the
// metrics and API without a kernel.
func fakeAgent(n int, hostMetrics bool) *Agent {
	a := &Agent{cfg: Config{HostMetrics: hostMetrics, History: 10}, hist: newHistory(10)}
	t := &stats.Tree{Device: "eth0", Interface: "eth0", Direction: "egress", Classifier: "bpf"}
	t.Classes = append(t.Classes, &stats.Class{Name: "(root)", ID: "1:1", Rate: 1e9 / 8, Ceil: 1e9 / 8, Bytes: 1e9})
	t.Classes = append(t.Classes, &stats.Class{Name: "subs", ID: "1:10", Parent: "1:1", Rate: 8e8 / 8, Ceil: 1e9 / 8, Bytes: 9e8})
	for i := 0; i < n; i++ {
		t.Classes = append(t.Classes, &stats.Class{Name: fmt.Sprintf("subs/10.%d.%d.%d", i>>16, i>>8&0xff, i&0xff),
			ID: fmt.Sprintf("1:%x", 0x100+i), Parent: "1:10", Depth: 2, Rate: 2e6 / 8, Ceil: 2e7 / 8,
			Bytes: uint64(i) * 1000, Packets: uint64(i), Drops: uint32(i % 7)})
		if i%4 != 3 { // most hosts have round trips, from 1 ms to 150 ms
			h := new(bpf.HostRTTHist)
			h.B[20+i%20], h.B[23+i%17] = uint32(5+i%9), uint32(i%4*3)
			for _, n := range h.B {
				h.Count += n
			}
			h.Sum = uint64(h.Count) * 20e6
			t.Classes[len(t.Classes)-1].RTT = stats.NewHostRTT(h)
		}
	}
	t.Policers = []*stats.Policer{{Class: "guests", Green: stats.Count{Packets: 10}, Yellow: stats.Count{Packets: 2}, Red: stats.Count{Packets: 1}}}
	a.sample = &stats.Sample{At: time.Now(), Trees: []*stats.Tree{t}}
	a.metrics = newMetrics(a)
	return a
}

func scrape(t testing.TB, a *Agent) string {
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestMetricsLabels(t *testing.T) {
	out := scrape(t, fakeAgent(3, false))
	for _, want := range []string{
		`sluice_class_sent_bytes_total{class="subs",device="eth0",direction="egress"} 9e+08`,
		`sluice_class_rate_bytes_per_second{class="subs",device="eth0",direction="egress"} 1e+08`,
		`sluice_class_ceil_bytes_per_second{class="(root)",device="eth0",direction="egress"} 1.25e+08`,
		// The names before base units, kept one release.
		`sluice_class_rate_bytes{class="subs",device="eth0",direction="egress"} 1e+08`,
		`sluice_class_ceil_bytes{class="(root)",device="eth0",direction="egress"} 1.25e+08`,
		`sluice_policer_packets_total{class="guests",color="yellow",device="eth0",direction="egress"} 2`,
		`sluice_policer_packets_total{class="guests",color="red",device="eth0",direction="egress"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in\n%s", want, out)
		}
	}
	if strings.Contains(out, "10.0.0.1") {
		t.Error("per-host series without --host-metrics")
	}
	out = scrape(t, fakeAgent(3, true))
	want := `sluice_class_dropped_packets_total{class="subs",device="eth0",direction="egress",host="10.0.0.2"} 2`
	if !strings.Contains(out, want) {
		t.Errorf("no %s in\n%s", want, out)
	}
}

// A class's round trips are exported as a Prometheus histogram whose
// bounds hold exactly the samples below them: 30 samples of 12 ms (a
// fine bucket from 11.53 to 12.06 ms) count under 15 ms, not under 10 ms.
func TestRTTMetric(t *testing.T) {
	a := fakeAgent(0, false)
	h := &bpf.RTTHist{}
	k := 16*10 + 6 // 12 ms: 11718 units of 1024 ns, octave 10 (bit length 14), sixteenth 6
	h.B[k], h.Count, h.Sum = 30, 30, 30*12e6
	a.sample.Trees[0].Classes[1].RTT = stats.NewRTT(h)
	out := scrape(t, a)
	for _, want := range []string{
		`sluice_rtt_seconds_bucket{class="subs",device="eth0",direction="egress",le="0.01"} 0`,
		`sluice_rtt_seconds_bucket{class="subs",device="eth0",direction="egress",le="0.015"} 30`,
		`sluice_rtt_seconds_bucket{class="subs",device="eth0",direction="egress",le="+Inf"} 30`,
		`sluice_rtt_seconds_sum{class="subs",device="eth0",direction="egress"} 0.36`,
		`sluice_rtt_seconds_count{class="subs",device="eth0",direction="egress"} 30`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in\n%s", want, out)
		}
	}
	if p50 := a.sample.Trees[0].Classes[1].RTT.P50; p50 < 0.0115 || p50 > 0.0124 {
		t.Errorf("p50 %v, want within the 12 ms bucket", p50)
	}
	if strings.Contains(out, "sluice_host_rtt_seconds") {
		t.Error("per-host round trips without --host-metrics")
	}
}

// With --host-metrics each host with samples has its own histogram, its
// bounds octave edges of the host's histogram: 7 samples of 12 ms and 3
// of 30 ms (quarter-octave buckets 10.5 to 12.6 and 29.4 to 33.6 ms)
// count under 16.8 ms (2^9 units of 32768 ns) and 33.6 ms; a host
// without samples has none.
func TestHostRTTMetric(t *testing.T) {
	a := fakeAgent(2, true)
	h := &bpf.HostRTTHist{}
	h.B[4*7+1], h.B[4*8+3], h.Count, h.Sum = 7, 3, 10, 7*12e6+3*30e6
	a.sample.Trees[0].Classes[2].RTT = stats.NewHostRTT(h)
	a.sample.Trees[0].Classes[3].RTT = &stats.RTT{}
	out := scrape(t, a)
	lbl := `class="subs",device="eth0",direction="egress",host="10.0.0.0"`
	for _, want := range []string{
		`sluice_host_rtt_seconds_bucket{` + lbl + `,le="0.008388608"} 0`,
		`sluice_host_rtt_seconds_bucket{` + lbl + `,le="0.016777216"} 7`,
		`sluice_host_rtt_seconds_bucket{` + lbl + `,le="0.033554432"} 10`,
		`sluice_host_rtt_seconds_bucket{` + lbl + `,le="+Inf"} 10`,
		`sluice_host_rtt_seconds_sum{` + lbl + `} 0.174`,
		`sluice_host_rtt_seconds_count{` + lbl + `} 10`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in\n%s", want, out)
		}
	}
	if strings.Contains(out, `host_rtt_seconds_count{class="subs",device="eth0",direction="egress",host="10.0.0.1"}`) {
		t.Errorf("a host without samples has series:\n%s", out)
	}
}

// BenchmarkScrape10000Hosts is a scrape of a 10,000-host tree with
// per-host series (the worst case): the bound is 200 ms.
func BenchmarkScrape10000Hosts(b *testing.B) {
	a := fakeAgent(10000, true)
	for b.Loop() {
		scrape(b, a)
	}
}

// The loop replaces the reading while the API, the charts and scrapes
// read it: run under -race (make unit).
func TestConcurrentReaders(t *testing.T) {
	a := fakeAgent(50, true)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 50; i++ {
			s := fakeAgent(50, true).sample
			a.mu.Lock()
			a.sample = s
			a.health.Reconciles++
			a.mu.Unlock()
			a.hist.add(s)
		}
	}()
	for _, path := range []string{"/metrics", "/api/v1/status", "/api/v1/history", "/healthz"} {
		for i := 0; i < 10; i++ {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	<-done
	// Each of the two classes' rate, backlog and drops per second.
	if h := a.hist.snapshot(); len(h.At) != 10 || len(h.Series) != 6 {
		t.Errorf("history keeps %d passes of %d series, want 10 of 6 (hosts are not charted)", len(h.At), len(h.Series))
	}
}

// The status without hosts says per tree how many host classes it left
// out: the dashboard once printed the global count under every tree.
func TestStatusCountsHostsPerTree(t *testing.T) {
	a := fakeAgent(5, false)
	other := &stats.Tree{Device: "eth1", Interface: "eth1", Direction: "egress", Classifier: "u32",
		Classes: []*stats.Class{{Name: "(root)", ID: "1:1"}, {Name: "bulk", ID: "1:10", Parent: "1:1"}}}
	a.sample.Trees = append(a.sample.Trees, other)
	st := a.Status(false)
	if st.HostClasses != 5 || len(st.Sample.Trees) != 2 {
		t.Fatalf("status: %d host classes, %d trees", st.HostClasses, len(st.Sample.Trees))
	}
	if got := []int{st.Sample.Trees[0].HostClasses, st.Sample.Trees[1].HostClasses}; got[0] != 5 || got[1] != 0 {
		t.Errorf("per tree %v, want [5 0]", got)
	}
	if n := len(st.Sample.Trees[0].Classes); n != 2 {
		t.Errorf("the tree kept %d classes, want its 2 that are not hosts", n)
	}
	if a.sample.Trees[0].HostClasses != 0 || len(a.sample.Trees[0].Classes) != 7 {
		t.Error("the status changed the agent's own reading")
	}
}
