// Command rtt measures how closely sluice's passive round trips (`rtt:
// on`) agree with the truth, at 1, 10 and 100 Mbit/s. The bed is the
// lab's: a client namespace whose r0 sluice shapes at the rate, a delay
// line of 10 ms each way, a server. A TCP upload runs at half the rate
// (two full segments or 10 ms of data at a time, so that the receiver
// answers each burst at once rather than after its delayed-ACK timer)
// with a ping beside it. The truth it is held to is ping's median
// through the same class while the upload runs (the delay line's and the
// shaper's delay as a packet meets them); beside it the idle ping's and
// the sender's own smoothed RTT (ss), which averages with a weight of
// an eighth and so trails. As root; -sluice names the binary (default:
// built).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"sluice/bench/internal/benchrun"
	"sluice/lab"
)

type result struct {
	RateMbit float64 `json:"rate_mbit"`
	// The truths: ping through the idle and the loaded class, and the
	// sender's smoothed RTT (median of its readings).
	PingIdleMs    float64 `json:"ping_idle_p50_ms"`
	PingLoadedMs  float64 `json:"ping_loaded_p50_ms"`
	PingLoaded95  float64 `json:"ping_loaded_p95_ms"`
	TCPSmoothedMs float64 `json:"tcp_srtt_p50_ms"`
	// sluice's passive figures for the class, the whole run.
	PassiveP50 float64 `json:"passive_p50_ms"`
	PassiveP95 float64 `json:"passive_p95_ms"`
	Samples    uint64  `json:"samples"`
	// The passive p50's distance from the loaded ping's, and the issue's
	// bound: 1 ms or 5% of it, whichever is larger; and its distance from
	// the sender's smoothed RTT.
	ErrorMs    float64 `json:"error_ms"`
	BoundMs    float64 `json:"bound_ms"`
	ErrorTCPMs float64 `json:"error_vs_tcp_ms"`
	Goodput    float64 `json:"goodput_mbit"`
	Duration   float64 `json:"seconds"`
}

type output struct {
	CPUs    int      `json:"cpus"`
	Kernel  string   `json:"kernel"`
	Date    string   `json:"date"`
	DelayMs float64  `json:"delay_each_way_ms"`
	Results []result `json:"results"`
}

func main() {
	rates := flag.String("rates", "1,10,100", "shaper rates, Mbit/s")
	secs := flag.Int("seconds", 10, "how long the upload runs at each rate")
	out := flag.String("out", "bench/results/rtt.json", "results file")
	bin := flag.String("sluice", "", "sluice binary (default: build it)")
	flag.Parse()
	sluice := benchrun.Sluice(*bin, "sluice-bench-rtt")
	const delay = 10 * time.Millisecond
	o := output{CPUs: runtime.NumCPU(), Kernel: strings.TrimSpace(benchrun.Output("uname", "-r")),
		Date: time.Now().UTC().Format(time.DateOnly), DelayMs: float64(delay) / 1e6}
	for _, s := range strings.Split(*rates, ",") {
		mbit, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || mbit <= 0 {
			benchrun.Fail(fmt.Errorf("-rates: %q is no rate", s))
		}
		r := measure(sluice, mbit, delay, time.Duration(*secs)*time.Second)
		fmt.Printf("%5.0f Mbit/s: ping idle %.2f ms, loaded %.2f / %.2f ms; TCP srtt %.2f ms; passive %.2f / %.2f ms (%d samples): %+.2f ms from ping's (bound %.2f), %+.2f from TCP's; goodput %.2f Mbit/s\n",
			r.RateMbit, r.PingIdleMs, r.PingLoadedMs, r.PingLoaded95, r.TCPSmoothedMs, r.PassiveP50, r.PassiveP95, r.Samples, r.ErrorMs, r.BoundMs, r.ErrorTCPMs, r.Goodput)
		o.Results = append(o.Results, r)
	}
	buf, _ := json.MarshalIndent(o, "", "  ")
	if err := os.WriteFile(*out, append(buf, '\n'), 0o644); err != nil {
		benchrun.Fail(err)
	}
}

// measure builds a bed, shapes it at mbit and measures.
func measure(sluice string, mbit float64, delay, run time.Duration) result {
	tag := fmt.Sprintf("%d-%d", os.Getpid(), int(mbit))
	client, wire, server := "sluice-bench-rtt-c-"+tag, "sluice-bench-rtt-w-"+tag, "sluice-bench-rtt-s-"+tag
	for _, ns := range []string{client, wire, server} {
		benchrun.Must("ip", "netns", "add", ns)
		defer exec.Command("ip", "netns", "del", ns).Run()
	}
	ca, sa := netip.MustParseAddr("10.79.0.1"), netip.MustParseAddr("10.79.0.2")
	for _, err := range []error{lab.Veth(client, "r0", wire, "r", 0), lab.Veth(wire, "s", server, "peer", 0)} {
		if err != nil {
			benchrun.Fail(err)
		}
	}
	line, err := lab.StartDelayLine(wire, delay)
	if err != nil {
		benchrun.Fail(err)
	}
	defer line.Close()
	for _, err := range []error{lab.Addrs(client, "r0", ca), lab.Addrs(server, "peer", sa),
		lab.Routes(client, "r0", server, "peer", false, sa), lab.Routes(server, "peer", client, "r0", false, ca)} {
		if err != nil {
			benchrun.Fail(err)
		}
	}
	dir, err := os.MkdirTemp("", "sluice-bench-rtt")
	if err != nil {
		benchrun.Fail(err)
	}
	defer os.RemoveAll(dir)
	pol := filepath.Join(dir, "rtt.yaml")
	rate := strconv.FormatFloat(mbit, 'f', -1, 64) + "mbit"
	os.WriteFile(pol, []byte(`interfaces:
  - name: r0
    rtt: on
    egress:
      rate: `+rate+`
      default: all
      classes:
        - {name: all, rate: `+rate+`}
`), 0o644)
	benchrun.Must(sluice, "--netns", client, "apply", "-q", pol)
	defer exec.Command(sluice, "--netns", client, "reset", "--all").Run()

	r := result{RateMbit: mbit, Duration: run.Seconds()}
	idle := ping(client, sa, 20, 50*time.Millisecond)
	r.PingIdleMs = quantile(idle, 0.5)

	// The upload, and its sink.
	port := 5401
	var l net.Listener
	if err := lab.InNetns(server, func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(sa, uint16(port)).String())
		return err
	}); err != nil {
		benchrun.Fail(err)
	}
	defer l.Close()
	received := make(chan int64, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			received <- 0
			return
		}
		defer c.Close()
		var n int64
		buf := make([]byte, 256<<10)
		for {
			k, err := c.Read(buf)
			n += int64(k)
			if err != nil {
				received <- n
				return
			}
		}
	}()
	var c net.Conn
	if err := lab.InNetns(client, func() (err error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ca.AsSlice()}, Timeout: 5 * time.Second}
		c, err = d.Dial("tcp", netip.AddrPortFrom(sa, uint16(port)).String())
		return err
	}); err != nil {
		benchrun.Fail(err)
	}
	c.(*net.TCPConn).SetNoDelay(true)
	// Half the rate, in bursts of two full segments at least (or 10 ms
	// of data): the receiver acknowledges every second segment at once.
	halfBytes := mbit * 1e6 / 8 / 2
	chunk := max(2*1448, int(halfBytes/100))
	every := time.Duration(float64(chunk) / halfBytes * float64(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	go func() {
		buf := make([]byte, chunk)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				c.Close()
				return
			case <-tick.C:
				c.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}
	}()
	start := time.Now()
	time.Sleep(time.Second)
	// The sender's smoothed RTT, read while the ping runs.
	var srtt []float64
	done := make(chan struct{})
	go func() {
		defer close(done)
		re := regexp.MustCompile(`\brtt:([0-9.]+)/`)
		for ctx.Err() == nil {
			out, _ := exec.Command("ip", "netns", "exec", client, "ss", "-tin", "dst", netip.AddrPortFrom(sa, uint16(port)).String()).Output()
			if m := re.FindSubmatch(out); m != nil {
				v, _ := strconv.ParseFloat(string(m[1]), 64)
				srtt = append(srtt, v)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	n := int((run - 2*time.Second) / (100 * time.Millisecond))
	loaded := ping(client, sa, n, 100*time.Millisecond)
	r.PingLoadedMs, r.PingLoaded95 = quantile(loaded, 0.5), quantile(loaded, 0.95)
	// The histogram while the flow still runs: the last samples of a
	// closing flow (its FIN's) are no part of the load.
	var s struct {
		Trees []struct {
			Classes []struct {
				Name string `json:"name"`
				RTT  *struct {
					Samples uint64  `json:"samples"`
					P50     float64 `json:"p50_seconds"`
					P95     float64 `json:"p95_seconds"`
				} `json:"rtt"`
			} `json:"classes"`
		} `json:"trees"`
	}
	js, err := exec.Command(sluice, "--netns", client, "show", "--json", "--interval", "0s").Output()
	if err != nil || json.Unmarshal(js, &s) != nil {
		benchrun.Fail(fmt.Errorf("show: %v\n%s", err, js))
	}
	for _, t := range s.Trees {
		for _, cl := range t.Classes {
			if cl.Name == "all" && cl.RTT != nil {
				r.PassiveP50, r.PassiveP95, r.Samples = cl.RTT.P50*1e3, cl.RTT.P95*1e3, cl.RTT.Samples
			}
		}
	}
	<-ctx.Done()
	<-done
	r.Goodput = float64(<-received) * 8 / time.Since(start).Seconds() / 1e6
	if len(srtt) == 0 {
		benchrun.Fail(fmt.Errorf("%s: ss never read the flow's RTT", rate))
	}
	r.TCPSmoothedMs = quantile(srtt, 0.5)
	r.BoundMs = max(1, 0.05*r.PingLoadedMs)
	r.ErrorMs = r.PassiveP50 - r.PingLoadedMs
	r.ErrorTCPMs = r.PassiveP50 - r.TCPSmoothedMs
	return r
}

var pingTime = regexp.MustCompile(`time=([0-9.]+) ms`)

// ping pings dst from ns n times, every apart, and returns the times.
func ping(ns string, dst netip.Addr, n int, every time.Duration) []float64 {
	out, err := exec.Command("ip", "netns", "exec", ns, "ping", "-n", "-c", strconv.Itoa(n), "-i", strconv.FormatFloat(every.Seconds(), 'f', -1, 64), dst.String()).Output()
	if err != nil {
		benchrun.Fail(fmt.Errorf("ping: %v\n%s", err, out))
	}
	var ms []float64
	for _, m := range pingTime.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		ms = append(ms, v)
	}
	if len(ms) < n/2 {
		benchrun.Fail(fmt.Errorf("%d of %d pings answered", len(ms), n))
	}
	return ms
}

// quantile is the q quantile of xs (nearest rank).
func quantile(xs []float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := min(len(s)-1, max(0, int(q*float64(len(s))+0.5)-1))
	return s[i]
}
