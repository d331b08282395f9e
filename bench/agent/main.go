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
}

type output struct {
	CPUs    int      `json:"cpus"`
	Kernel  string   `json:"kernel"`
	Date    string   `json:"date"`
	Results []result `json:"results"`
}

var sluiceBin = flag.String("sluice", "", "sluice binary (default: build ./cmd/sluice)")

func main() {
	sizes := flag.String("hosts", "1000,10000", "subscriber counts")
	out := flag.String("out", "bench/results/agent.json", "results file")
	flag.Parse()
	*sluiceBin = benchrun.Sluice(*sluiceBin, "sluice-bench-agent")
	o := output{CPUs: runtime.NumCPU(), Kernel: strings.TrimSpace(benchrun.Output("uname", "-r")), Date: time.Now().UTC().Format(time.DateOnly)}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			benchrun.Fail(err)
		}
		r := measure(n)
		fmt.Printf("%6d hosts: first apply %.2f s, steady pass %.0f ms, scrape %.1f ms (%d series), with hosts %.1f ms (%d series; %.1f ms inflated as read), status %.1f ms (%d KB), RSS %.0f MB, CPU %.1f%%\n",
			n, r.FirstApplyS, median(r.PassMs), r.ScrapeMs, r.ScrapeSeries, r.HostScrapeMs, r.HostSeries, r.HostScrapeInflatedMs, r.StatusMs, r.StatusBytes/1024, r.RSSMB, r.CPUPercentIdle)
		o.Results = append(o.Results, r)
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
	os.WriteFile(pol, []byte(`interfaces:
  - name: veth0
    egress:
      rate: 10gbit
      default: rest
      classes:
        - name: voice
          rate: 100mbit
          prio: 0
          match: [{dscp: EF}]
        - name: subs
          rate: 9gbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 500mbit
`), 0o644)
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
	for _, hostMetrics := range []bool{false, true} {
		args := []string{"--netns", ns, "agent", pol, "--listen", "127.0.0.1:0"}
		if hostMetrics {
			args = append(args, "--host-metrics")
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
		if !hostMetrics {
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
		} else {
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
