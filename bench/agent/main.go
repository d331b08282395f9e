// Command agent measures what `sluice agent` costs on a large tree: a
// namespace with a 16-queue veth shaped for N subscribers (one HTB class
// and leaf each, the BPF classifier), the agent keeping it. It records
// the steady reconcile pass (plan, read every tree back, diff), a
// /metrics scrape with and without per-host series, /api/v1/status, and
// the agent's memory, and writes bench/results/agent.json.
//
//	go run ./bench/agent [-hosts 1000,10000]
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sluice/agent"
	"sluice/bench/internal/benchrun"
	"sluice/lab"
	"sluice/testutil"
)

type result struct {
	Hosts int `json:"hosts"`
	// FirstApplyS: from start to the first healthy pass.
	FirstApplyS float64 `json:"first_apply_s"`
	// PassMs: a steady pass (nothing to repair), median of the passes
	// sampled.
	PassMs []float64 `json:"pass_ms"`
	// Scrapes of /metrics: without per-host series (the default), and
	// with --host-metrics.
	ScrapeMs     float64 `json:"scrape_ms"`
	ScrapeSeries int     `json:"scrape_series"`
	HostScrapeMs float64 `json:"host_scrape_ms"`
	HostSeries   int     `json:"host_scrape_series"`
	// HostScrapeInflatedMs is the same scrape read as Go's client reads
	// it by default: asking for gzip and inflating the body as it comes,
	// so the client's inflating is in the time (the measurement before
	// 2026-11-28). The others time the agent's answer: the request to
	// its last byte, gzip as Prometheus asks for it, kept compressed.
	HostScrapeInflatedMs float64 `json:"host_scrape_inflated_ms"`
	StatusMs             float64 `json:"status_ms"`
	StatusBytes          int     `json:"status_bytes"`
	RSSMB                float64 `json:"rss_mb"`
	CPUPercentIdle       float64 `json:"cpu_percent_steady"`
	// CPUPercentController is the same tree's idle cost with a sharing
	// controller over its top-level classes (cap 80%): its steps, and
	// the load-start watch between them (docs/sharing.md).
	CPUPercentController float64 `json:"cpu_percent_steady_controller"`
}

// autoResult is the agent's cost with rate: auto both ways (one echo
// prober at 20 Hz, two controllers deciding every 50 ms, the rates
// written as they move), on the lab's test bed behind a 20/100 Mbit/s
// modem: idle, and under bulk TCP both ways (the controllers decide on
// a queue, the limits are written).
type autoResult struct {
	Seconds        float64 `json:"seconds"`
	CPUPercentIdle float64 `json:"cpu_percent_idle"`
	CPUPercentLoad float64 `json:"cpu_percent_loaded"`
	// Writes is how many rates were written in the loaded span.
	Writes float64 `json:"rate_writes_loaded"`
	RSSMB  float64 `json:"rss_mb"`
}

type output struct {
	CPUs    int      `json:"cpus"`
	Kernel  string   `json:"kernel"`
	Date    string   `json:"date"`
	Results []result `json:"results"`
	// Autorate: rate: auto's cost (-autorate).
	Autorate *autoResult `json:"autorate,omitempty"`
}

var sluiceBin = flag.String("sluice", "", "sluice binary (default: build ./cmd/sluice)")

func main() {
	sizes := flag.String("hosts", "1000,10000", "subscriber counts")
	auto := flag.Duration("autorate", 20*time.Second, "how long to measure rate: auto's cost idle, then loaded (0: not)")
	out := flag.String("out", "bench/results/agent.json", "results file")
	flag.Parse()
	*sluiceBin = benchrun.Sluice(*sluiceBin, "sluice-bench-agent")
	o := output{CPUs: runtime.NumCPU(), Kernel: strings.TrimSpace(benchrun.Output("uname", "-r")), Date: time.Now().UTC().Format(time.DateOnly)}
	for _, s := range strings.Split(*sizes, ",") {
		if s == "" {
			continue // -hosts "": rate: auto's cost alone
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			benchrun.Fail(err)
		}
		r := measure(n)
		fmt.Printf("%6d hosts: first apply %.2f s, steady pass %.0f ms, scrape %.1f ms (%d series), with hosts %.1f ms (%d series; %.1f ms inflated as read), status %.1f ms (%d KB), RSS %.0f MB, CPU %.1f%% (%.1f%% with a sharing controller)\n",
			n, r.FirstApplyS, median(r.PassMs), r.ScrapeMs, r.ScrapeSeries, r.HostScrapeMs, r.HostSeries, r.HostScrapeInflatedMs, r.StatusMs, r.StatusBytes/1024, r.RSSMB, r.CPUPercentIdle, r.CPUPercentController)
		o.Results = append(o.Results, r)
	}
	if *auto > 0 {
		r := measureAutorate(*auto)
		fmt.Printf("rate: auto both ways, echo at 20 Hz: CPU %.1f%% of a core idle, %.1f%% under bulk TCP both ways (%.0f rate writes in %.0f s), RSS %.0f MB\n",
			r.CPUPercentIdle, r.CPUPercentLoad, r.Writes, r.Seconds, r.RSSMB)
		o.Autorate = &r
	}
	b, _ := json.MarshalIndent(o, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		benchrun.Fail(err)
	}
}

func measure(n int) result {
	dir, err := os.MkdirTemp("", "sluice-bench-agent")
	if err != nil {
		benchrun.Fail(err)
	}
	defer os.RemoveAll(dir)
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(benchrun.HostsCSV(n, -1)), 0o644)
	// tree is the policy's text, with a sharing line (or none).
	tree := func(sharing string) string {
		return `interfaces:
  - name: veth0
    egress:
      rate: 10gbit
      default: rest
` + sharing + `      classes:
        - name: voice
          rate: 100mbit
          prio: 0
          match: [{dscp: EF}]
        - name: subs
          rate: 9gbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 500mbit
`
	}
	os.WriteFile(pol, []byte(tree("")), 0o644)
	controlled := filepath.Join(dir, "controlled.yaml")
	os.WriteFile(controlled, []byte(tree("      shards: 1\n      sharing: {mode: controller, cap: 80%}\n")), 0o644)
	ns := fmt.Sprintf("sluice-bench-agent-%d", os.Getpid())
	benchrun.Must("ip", "netns", "add", ns)
	defer func() {
		exec.Command("ip", "-n", ns, "link", "del", "veth0").Run()
		exec.Command("ip", "netns", "del", ns).Run()
	}()
	benchrun.Must("ip", "-n", ns, "link", "add", "veth0", "numtxqueues", "16", "numrxqueues", "16", "type", "veth",
		"peer", "name", "veth1", "numtxqueues", "16", "numrxqueues", "16")
	benchrun.Must("ip", "-n", ns, "link", "set", "veth0", "up")
	state := filepath.Join(dir, "state")

	r := result{Hosts: n}
	for _, run := range []string{"plain", "host-metrics", "controller"} {
		hostMetrics := run == "host-metrics"
		args := []string{"--netns", ns, "agent", pol, "--listen", "127.0.0.1:0"}
		switch run {
		case "host-metrics":
			args = append(args, "--host-metrics")
		case "controller":
			args[3] = controlled
		}
		cmd := exec.Command(*sluiceBin, args...)
		cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+state)
		var log bytes.Buffer
		cmd.Stderr = &log
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			benchrun.Fail(err)
		}
		base := waitHealthy(cmd, filepath.Join(state, "netns", ns, agent.AgentFile), &log)
		switch {
		case run == "controller":
			time.Sleep(3 * time.Second) // the policy applied, the controller's first steps
			cpu0 := cpuSeconds(cmd.Process.Pid)
			time.Sleep(10 * time.Second)
			r.CPUPercentController = (cpuSeconds(cmd.Process.Pid) - cpu0) / 10 * 100
		case !hostMetrics:
			r.FirstApplyS = time.Since(t0).Seconds()
			// Steady passes: each pass's duration, as the agent reports it.
			var last float64
			for len(r.PassMs) < 15 {
				time.Sleep(300 * time.Millisecond)
				var st agent.Status
				json.Unmarshal([]byte(get(base+"/api/v1/status?hosts=0")), &st)
				if st.Health.LastResult == "ok" && st.Health.ApplySeconds != last {
					last = st.Health.ApplySeconds
					r.PassMs = append(r.PassMs, st.Health.ApplySeconds*1000)
				}
			}
			cpu0 := cpuSeconds(cmd.Process.Pid)
			time.Sleep(5 * time.Second)
			r.CPUPercentIdle = (cpuSeconds(cmd.Process.Pid) - cpu0) / 5 * 100
			r.ScrapeMs, r.ScrapeSeries = timeGet(base + "/metrics")
			r.StatusMs, r.StatusBytes = timeGet(base + "/api/v1/status")
			r.RSSMB = rssMB(cmd.Process.Pid)
		default:
			time.Sleep(1500 * time.Millisecond)
			r.HostScrapeMs, r.HostSeries = timeGet(base + "/metrics")
			r.HostScrapeInflatedMs = timeInflated(base + "/metrics")
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	return r
}

func waitHealthy(cmd *exec.Cmd, info string, log *bytes.Buffer) string {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(info); err == nil {
			var i agent.Info
			if json.Unmarshal(b, &i) == nil && i.PID == cmd.Process.Pid {
				base := "http://" + i.Listen
				if resp, err := http.Get(base + "/healthz"); err == nil {
					resp.Body.Close()
					if resp.StatusCode == 200 {
						return base
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	cmd.Process.Kill()
	benchrun.Fail(fmt.Errorf("agent not healthy in 5 minutes:\n%s", log.String()))
	return ""
}

func get(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		benchrun.Fail(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// raw is a client that leaves a gzip body compressed, as a scraper
// that stores or forwards it receives it.
var raw = &http.Client{Transport: &http.Transport{DisableCompression: true}}

// getRaw fetches url asking for gzip, as Prometheus does, and returns
// the body as sent, compressed or not.
func getRaw(url string) ([]byte, bool) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := raw.Do(req)
	if err != nil {
		benchrun.Fail(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		benchrun.Fail(fmt.Errorf("%s: %v %v", url, resp.Status, err))
	}
	return b, resp.Header.Get("Content-Encoding") == "gzip"
}

// timeGet fetches url 7 times, a pass apart, and returns the median
// time in ms of the answer (getRaw) and, for /metrics, the number of
// series (else the body's size).
func timeGet(url string) (float64, int) {
	var body []byte
	var zipped bool
	ms := timed(func() { body, zipped = getRaw(url) })
	if zipped { // the last answer, inflated once the clock has stopped
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err == nil {
			body, err = io.ReadAll(zr)
		}
		if err != nil {
			benchrun.Fail(fmt.Errorf("%s: %v", url, err))
		}
	}
	if strings.HasSuffix(url, "/metrics") {
		n := 0
		for _, l := range strings.Split(string(body), "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				n++
			}
		}
		return ms, n
	}
	return ms, len(body)
}

// timeInflated is timeGet's time with Go's default client, which asks
// for gzip and inflates as it reads.
func timeInflated(url string) float64 { return timed(func() { get(url) }) }

// timed runs fetch 7 times, a pass (1 s) apart, and returns the median
// time in ms: each fetch reads a new reading, as a Prometheus scraping
// every 15 s does, and none is served from what the last one encoded.
func timed(fetch func()) float64 {
	var ts []float64
	for i := 0; i < 7; i++ {
		time.Sleep(1100 * time.Millisecond)
		t0 := time.Now()
		fetch()
		ts = append(ts, float64(time.Since(t0).Microseconds())/1000)
	}
	return median(ts)
}

func cpuSeconds(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func rssMB(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// measureAutorate runs the agent with rate: auto both ways on a lab
// test bed for d idle, then d under bulk TCP both ways (4 flows each),
// and reads its CPU time and its rate writes.
func measureAutorate(d time.Duration) autoResult {
	name := fmt.Sprintf("bar%d", os.Getpid()%100000)
	b, err := lab.Up(name, lab.Topology{Modem: lab.Modem{Up: "20mbit", Down: "100mbit", Buffer: "200ms"}})
	if err != nil {
		benchrun.Fail(err)
	}
	defer b.Down()
	dir, err := os.MkdirTemp("", "sluice-bench-auto")
	if err != nil {
		benchrun.Fail(err)
	}
	defer os.RemoveAll(dir)
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(fmt.Sprintf(`interfaces:
  - name: wan
    egress:
      rate: auto
      auto: {min: 4mbit, base: 12mbit, max: 20mbit, reflectors: [%[1]s]}
      default: bulk
      classes:
        - {name: interactive, rate: 10%%, prio: 0, match: [{proto: icmp}, {tcp_ack: true}]}
        - {name: bulk, rate: 90%%, prio: 1}
    ingress:
      rate: auto
      auto: {min: 10mbit, base: 50mbit, max: 100mbit, reflectors: [%[1]s]}
      default: bulk
      classes:
        - {name: bulk, rate: 100%%}
`, lab.Server4)), 0o644)
	state := filepath.Join(dir, "state")
	cmd := exec.Command(*sluiceBin, "--netns", b.Router, "agent", pol, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+state)
	var log bytes.Buffer
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		benchrun.Fail(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	base := waitHealthy(cmd, filepath.Join(state, "netns", b.Router, agent.AgentFile), &log)
	writes := func() float64 {
		for _, line := range strings.Split(get(base+"/metrics"), "\n") {
			if v, ok := strings.CutPrefix(line, "sluice_autorate_writes_total "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		return 0
	}
	time.Sleep(2 * time.Second) // the controllers' first samples
	r := autoResult{Seconds: d.Seconds()}
	cpu0 := cpuSeconds(cmd.Process.Pid)
	time.Sleep(d)
	r.CPUPercentIdle = (cpuSeconds(cmd.Process.Pid) - cpu0) / d.Seconds() * 100

	client, _ := lab.ClientAddr(1)
	var sinks []io.Closer
	for _, s := range []struct{ ns, addr string }{{b.Server, lab.Server4.String()}, {b.Clients[0], client.String()}} {
		sink, err := testutil.TCPSink(s.ns, s.addr, 5201)
		if err != nil {
			benchrun.Fail(err)
		}
		sinks = append(sinks, sink)
	}
	defer func() {
		for _, s := range sinks {
			s.Close()
		}
	}()
	stop := make(chan struct{})
	done := make(chan struct{}, 2)
	for _, f := range []struct{ ns, to string }{{b.Clients[0], lab.Server4.String()}, {b.Server, client.String()}} {
		go func() { testutil.TCPSendUntil(f.ns, f.to, 5201, 4, stop); done <- struct{}{} }()
	}
	time.Sleep(3 * time.Second) // the load's start: the rates move
	w0, cpu0 := writes(), cpuSeconds(cmd.Process.Pid)
	time.Sleep(d)
	r.CPUPercentLoad = (cpuSeconds(cmd.Process.Pid) - cpu0) / d.Seconds() * 100
	r.Writes = writes() - w0
	r.RSSMB = rssMB(cmd.Process.Pid)
	close(stop)
	<-done
	<-done
	return r
}
