// Command utilization measures how much of a configured HTB rate TCP
// traffic actually gets, with sluice's burst/cburst/quantum defaults and
// with tc's, side by side in one run, from 1mbit to 5gbit.
//
// Each point: two network namespaces joined by a veth pair; one class at
// the rate on the sender's egress, the same bfifo leaf for both
// configurations; 4 iperf3 TCP flows. Reported: iperf3's goodput
// (receiver side), the wire rate the kernel's class counters saw over
// the same window, retransmits. Run as root: `make bench`.
package main

import (
	"sluice/units"

	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"sluice/plan"
	"sluice/policy"
	"sluice/tc"
)

type point struct {
	RateMbit    float64 `json:"rate_mbit"`
	Config      string  `json:"config"` // "sluice" or "tc-default"
	Burst       uint32  `json:"burst_bytes"`
	Quantum     uint32  `json:"quantum_bytes"`
	GoodputMbit float64 `json:"goodput_mbit"`
	Goodput     float64 `json:"goodput_ratio"` // goodput / rate
	Wire        float64 `json:"wire_ratio"`    // class bytes on the wire / rate
	Retransmits int     `json:"retransmits"`
	Warning     string  `json:"kernel_warning,omitempty"`
}

func run(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	return string(out), err
}

func must(args ...string) string {
	out, err := run(args...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n%s", strings.Join(args, " "), err, out)
		os.Exit(1)
	}
	return out
}

func main() {
	rates := flag.String("rates", "1,5,20,100,1000,2500,5000", "rates to measure, in mbit")
	secs := flag.Int("seconds", 6, "seconds per measurement (the first is not counted)")
	out := flag.String("out", "bench/results/utilization.json", "machine-readable results")
	md := flag.String("md", "docs/benchmarks.md", "markdown page whose utilization table is rewritten")
	bursts := flag.String("burst-study", "", "instead: the distribution of goodput over -runs runs per rate for each of these burst times (ms, like 1,2,4)")
	runs := flag.Int("runs", 20, "runs per rate and burst time in the burst study")
	studyOut := flag.String("burst-out", "bench/results/burst.json", "the burst study's machine-readable results")
	ifb := flag.Bool("ifb", false, "shape on an ifb behind the receiver's ingress, as a policy's download is (the burst study's -burst-out and table then default to their ifb ones)")
	flag.Parse()
	if *ifb && *bursts == "" {
		fmt.Fprintln(os.Stderr, "-ifb: only with -burst-study (the utilization table is the egress one)")
		os.Exit(2)
	}

	a, b := fmt.Sprintf("slbench-a%d", os.Getpid()), fmt.Sprintf("slbench-b%d", os.Getpid())
	must("ip", "netns", "add", a)
	defer run("ip", "netns", "del", a)
	must("ip", "netns", "add", b)
	defer run("ip", "netns", "del", b)
	must("ip", "link", "add", "veth0", "netns", a, "type", "veth", "peer", "name", "veth1", "netns", b)
	must("ip", "-n", a, "addr", "add", "10.7.0.1/24", "dev", "veth0")
	must("ip", "-n", b, "addr", "add", "10.7.0.2/24", "dev", "veth1")
	for _, s := range [][2]string{{a, "veth0"}, {b, "veth1"}, {a, "lo"}, {b, "lo"}} {
		must("ip", "-n", s[0], "link", "set", s[1], "up")
	}
	srv := exec.Command("ip", "netns", "exec", b, "iperf3", "-s", "-p", "5299")
	srv.Start()
	defer srv.Process.Kill()
	time.Sleep(300 * time.Millisecond)

	// The shaper: the sender's egress, or (-ifb) an ifb that the
	// receiver's ingress redirects to, as sluice shapes a download.
	bd := bed{ns: a, dev: "veth0", dir: policy.Egress}
	if *ifb {
		bd = bed{ns: b, dev: "ifb0", dir: policy.Ingress}
		must("ip", "-n", b, "link", "add", "ifb0", "type", "ifb")
		must("ip", "-n", b, "link", "set", "ifb0", "up")
		must("tc", "-n", b, "qdisc", "add", "dev", "veth1", "clsact")
		must("tc", "-n", b, "filter", "add", "dev", "veth1", "ingress", "protocol", "all", "prio", "1",
			"u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "ifb0")
	}
	conn, err := tc.Open(bd.ns)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	bd.conn = conn

	if *bursts != "" {
		out, marks := *studyOut, burstMarks
		if *ifb {
			marks = burstIfbMarks
			if !flagSet("burst-out") {
				out = "bench/results/burst-ifb.json"
			}
		}
		burstStudy(bd, a, *rates, *bursts, *runs, *secs, out, *md, marks)
		return
	}
	var points []point
	for _, rs := range strings.Split(*rates, ",") {
		mbit, err := strconv.ParseFloat(rs, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bad rate", rs)
			os.Exit(2)
		}
		for _, cfg := range []string{"tc-default", "sluice"} {
			p := measure(bd, a, mbit, cfg, *secs)
			points = append(points, p)
			fmt.Printf("%7.0fmbit %-10s burst %7d quantum %6d  goodput %8.2f Mbit/s = %.4f  wire %.4f  retrans %d %s\n",
				mbit, cfg, p.Burst, p.Quantum, p.GoodputMbit, p.Goodput, p.Wire, p.Retransmits, p.Warning)
		}
	}
	os.MkdirAll(filepath.Dir(*out), 0o755)
	js, _ := json.MarshalIndent(map[string]any{
		"benchmark": "utilization", "taken": time.Now().UTC().Format(time.RFC3339),
		"kernel": strings.TrimSpace(must("uname", "-r")), "cpus": strings.TrimSpace(must("nproc")),
		"flows": 4, "seconds": *secs, "points": points,
	}, "", "  ")
	os.WriteFile(*out, append(js, '\n'), 0o644)
	if *md != "" {
		if err := rewriteTable(*md, points, *secs); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

// bed is where the class under test shapes.
type bed struct {
	ns, dev string
	dir     string // policy.Ingress: dev is an ifb behind the receiver's ingress
	conn    *tc.Conn
}

func flagSet(name string) (set bool) {
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// measure runs iperf3 from the sender's namespace ns through one class at
// mbit on bd.
func measure(bd bed, ns string, mbit float64, cfg string, secs int) point {
	rate := units.FromBits(mbit * 1e6)
	p := point{RateMbit: mbit, Config: cfg}
	run("tc", "-n", bd.ns, "qdisc", "del", "dev", bd.dev, "root")
	must("tc", "-n", bd.ns, "qdisc", "add", "dev", bd.dev, "root", "handle", "1:", "htb", "default", "10")
	args := []string{"tc", "-n", bd.ns, "class", "add", "dev", bd.dev, "parent", "1:", "classid", "1:10", "htb",
		"rate", rate.TC(), "ceil", rate.TC()}
	if cfg == "sluice" || strings.HasPrefix(cfg, "burst=") {
		p.Burst, p.Quantum = plan.BurstFor(rate, bd.dir), plan.QuantumFor(rate, rate, plan.LeafFIFO)
		if ms, ok := strings.CutPrefix(cfg, "burst="); ok { // the burst study: another burst time
			t, _ := strconv.ParseFloat(strings.TrimSuffix(ms, "ms"), 64)
			p.Burst = max(uint32(float64(rate)*t/1000), 2*1514)
		}
		args = append(args, "burst", fmt.Sprintf("%db", p.Burst), "cburst", fmt.Sprintf("%db", p.Burst), "quantum", fmt.Sprint(p.Quantum))
	}
	if out, err := run(args...); err != nil {
		fmt.Fprintf(os.Stderr, "%v: %s", err, out)
		os.Exit(1)
	} else if strings.Contains(out, "Warning") {
		p.Warning = strings.TrimSpace(out)
	}
	// The same leaf for both: what sluice's auto picks on a kernel
	// without an AQM.
	must("tc", "-n", bd.ns, "qdisc", "add", "dev", bd.dev, "parent", "1:10", "handle", "10:", "bfifo", "limit", fmt.Sprint(plan.BfifoLimit(rate, rate, plan.QuantumFor(rate, rate, plan.LeafFIFO))))
	if cfg == "tc-default" {
		cls, _ := bd.conn.Classes(bd.dev, tc.MakeHandle(1, 0))
		for _, c := range cls {
			p.Burst, p.Quantum = c.Burst, c.Quantum
		}
	}
	// The server stays busy until the previous run's connections are
	// gone: wait for them, so that no run is refused.
	for try := 0; try < 100; try++ {
		if o, _ := run("ip", "netns", "exec", ns, "ss", "-Htn", "state", "connected", "exclude", "time-wait", "( dport = :5299 )"); strings.TrimSpace(o) == "" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	ip := exec.Command("ip", "netns", "exec", ns, "iperf3", "-c", "10.7.0.2", "-p", "5299", "-P", "4", "-t", fmt.Sprint(secs), "-O", "1", "-J")
	var outBuf strings.Builder
	ip.Stdout = &outBuf
	ip.Start()
	// Count wire bytes over the same window iperf3 counts.
	time.Sleep(time.Second + 100*time.Millisecond)
	b0, t0 := classBytes(bd), time.Now()
	time.Sleep(time.Duration(secs-1)*time.Second - 300*time.Millisecond)
	b1, t1 := classBytes(bd), time.Now()
	ip.Wait()
	p.Wire = float64(b1-b0) / t1.Sub(t0).Seconds() / float64(rate)
	var r struct {
		End struct {
			SumReceived struct {
				BPS float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
		} `json:"end"`
	}
	json.Unmarshal([]byte(outBuf.String()), &r)
	p.GoodputMbit = r.End.SumReceived.BPS / 1e6
	p.Goodput = r.End.SumReceived.BPS / (mbit * 1e6)
	p.Retransmits = r.End.SumSent.Retransmits
	return p
}

func classBytes(bd bed) uint64 {
	cls, err := bd.conn.Classes(bd.dev, tc.MakeHandle(1, 0))
	if err != nil {
		return 0
	}
	for _, c := range cls {
		if c.Handle == tc.MakeHandle(1, 0x10) && c.Stats != nil {
			return c.Stats.Bytes
		}
	}
	return 0
}

// headerCeiling is TCP payload per Ethernet frame with timestamps:
// 1448 of 1514 bytes. Goodput divided by it is the class's utilization.
const headerCeiling = 1448.0 / 1514.0

const (
	beginMark = "<!-- utilization:begin -->"
	endMark   = "<!-- utilization:end -->"
)

// rewriteTable replaces the table between the markers in the page.
func rewriteTable(path string, points []point, secs int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, beginMark), strings.Index(s, endMark)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s ... %s markers", path, beginMark, endMark)
	}
	var t strings.Builder
	fmt.Fprintf(&t, "%s\nMeasured %s on %s, %s CPUs, 4 TCP flows, %d s each (first second not counted).\n\n",
		beginMark, time.Now().UTC().Format("2006-01-02"), strings.TrimSpace(must("uname", "-r")), strings.TrimSpace(must("nproc")), secs)
	t.WriteString("| rate | tc defaults: burst, quantum | goodput/rate | utilization | wire/rate | sluice: burst, quantum | goodput/rate | utilization | wire/rate |\n")
	t.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for k := 0; k+1 < len(points); k += 2 {
		d, s := points[k], points[k+1]
		warn := ""
		if d.Warning != "" {
			warn = " (kernel warns)"
		}
		fmt.Fprintf(&t, "| %s | %d B, %d B%s | %.4f | %.3f | %.3f | %d B, %d B | %.4f | **%.3f** | %.3f |\n",
			units.FromBits(d.RateMbit*1e6).TC(), d.Burst, d.Quantum, warn, d.Goodput, d.Goodput/headerCeiling, d.Wire,
			s.Burst, s.Quantum, s.Goodput, s.Goodput/headerCeiling, s.Wire)
	}
	t.WriteString(endMark)
	s = s[:i] + t.String() + s[j+len(endMark):]
	return os.WriteFile(path, []byte(s), 0o644)
}

// burstStudy measures, for each rate and burst time, the goodput of runs
// runs, interleaved (run i of every burst time before run i+1 of any),
// so that a noisy minute of the machine hits every burst time alike.
func burstStudy(bd bed, ns, rates, bursts string, runs, secs int, out, md string, marks [2]string) {
	type cell struct {
		RateMbit float64   `json:"rate_mbit"`
		BurstMs  float64   `json:"burst_ms"`
		Burst    uint32    `json:"burst_bytes"`
		Goodput  []float64 `json:"goodput_ratios"`
	}
	var cells []*cell
	for _, rs := range strings.Split(rates, ",") {
		mbit, _ := strconv.ParseFloat(rs, 64)
		for _, bs := range strings.Split(bursts, ",") {
			ms, _ := strconv.ParseFloat(bs, 64)
			cells = append(cells, &cell{RateMbit: mbit, BurstMs: ms})
		}
	}
	for i := 0; i < runs; i++ {
		for _, c := range cells {
			p := measure(bd, ns, c.RateMbit, fmt.Sprintf("burst=%gms", c.BurstMs), secs)
			c.Burst = p.Burst
			c.Goodput = append(c.Goodput, p.Goodput)
			fmt.Printf("run %2d %6.0fmbit burst %gms (%d B): goodput/rate %.4f\n", i+1, c.RateMbit, c.BurstMs, p.Burst, p.Goodput)
		}
	}
	os.MkdirAll(filepath.Dir(out), 0o755)
	js, _ := json.MarshalIndent(map[string]any{
		"benchmark": "burst", "ifb": bd.dir == policy.Ingress, "taken": time.Now().UTC().Format(time.RFC3339),
		"kernel": strings.TrimSpace(must("uname", "-r")), "cpus": strings.TrimSpace(must("nproc")),
		"flows": 4, "seconds": secs, "runs": runs, "cells": cells,
	}, "", "  ")
	os.WriteFile(out, append(js, '\n'), 0o644)
	if md == "" {
		return
	}
	var t strings.Builder
	where := "one class"
	if bd.dir == policy.Ingress {
		where = "one class on an ifb behind the receiver's ingress"
	}
	fmt.Fprintf(&t, "%s\nMeasured %s on %s, %s CPUs: 4 TCP flows through %s, %d runs of %d s per cell, interleaved.\n\n",
		marks[0], time.Now().UTC().Format("2006-01-02"), strings.TrimSpace(must("uname", "-r")), strings.TrimSpace(must("nproc")), where, runs, secs)
	t.WriteString("| rate | burst | worst goodput/rate | 10th percentile | median | runs below 0.93 |\n|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range cells {
		g := append([]float64(nil), c.Goodput...)
		sort.Float64s(g)
		below := 0
		for _, v := range g {
			if v < 0.93 {
				below++
			}
		}
		fmt.Fprintf(&t, "| %s | %g ms (%d B) | %.4f | %.4f | %.4f | %d of %d |\n", units.FromBits(c.RateMbit*1e6).TC(),
			c.BurstMs, c.Burst, g[0], g[len(g)/10], g[len(g)/2], below, len(g))
	}
	t.WriteString(marks[1])
	b, err := os.ReadFile(md)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	s := string(b)
	i, j := strings.Index(s, marks[0]), strings.Index(s, marks[1])
	if i < 0 || j < i {
		fmt.Fprintf(os.Stderr, "%s: no %s ... %s markers\n", md, marks[0], marks[1])
		return
	}
	os.WriteFile(md, []byte(s[:i]+t.String()+s[j+len(marks[1]):]), 0o644)
}

var (
	burstMarks    = [2]string{"<!-- burst:begin -->", "<!-- burst:end -->"}
	burstIfbMarks = [2]string{"<!-- burst-ifb:begin -->", "<!-- burst-ifb:end -->"}
)
