// Command edtcpu measures what shaping costs in CPU, HTB against EDT in
// one run on one machine: a veth of -queues transmit queues in a
// throwaway namespace pair, a policy of N hosts (one of them the peer),
// and 4 iperf3 TCP flows to the peer, for each backend (none, htb: the
// BPF classifier and one HTB tree; edt: the EDT program with mq and an
// fq per queue) and host count. Each cell runs twice: with caps
// above what the machine carries (CPU-bound: the Gbit/s it reaches and
// the CPU-seconds each Gbit costs), and at -rate (the CPU that rate
// costs). CPU is the whole machine's busy time (/proc/stat) over the
// window iperf3 counts. Needs root, iperf3 and fq: this project's host
// kernel has no fq, so `make bench-edt-lane` runs it in the
// stock-kernel lane (emulated: compare within the run, not with native
// figures). Results go to -out.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"sluice/bench/internal/benchrun"
)

type cell struct {
	Backend string `json:"backend"`
	Hosts   int    `json:"hosts"`
	// Caps above the machine: goodput and CPU-seconds per Gbit.
	FreeGbps       float64 `json:"free_gbps"`
	FreeCPUs       float64 `json:"free_cpus_busy"`
	FreeCPUPerGbit float64 `json:"free_cpu_s_per_gbit"`
	// At -rate: goodput and the CPUs it keeps busy.
	RateMbit     float64 `json:"rate_mbit"`
	RateGoodput  float64 `json:"rate_goodput_mbit"`
	RateCPUs     float64 `json:"rate_cpus_busy"`
	RateCPUPerGb float64 `json:"rate_cpu_s_per_gbit"`
	Retransmits  int     `json:"retransmits_free"`
}

var (
	sluiceBin = flag.String("sluice", "", "sluice binary (default: build it)")
	queues    = flag.Int("queues", 4, "transmit queues of the veth")
	edtHosts  = flag.String("edt-hosts", "10,1000,100000", "host counts for EDT")
	htbHosts  = flag.String("htb-hosts", "10,1000,10000", "host counts for HTB (100,000 HTB classes take minutes to build)")
	secs      = flag.Int("secs", 5, "seconds each measurement counts")
	rate      = flag.Float64("rate", 200, "the capped run's rate, Mbit/s")
	runs      = flag.Int("runs", 3, "runs per measurement (the median is kept)")
	out       = flag.String("out", "bench/results/edt-cpu.json", "results file")
	backends  = flag.String("backends", "none,htb,edt", "which to measure (edt needs fq)")
)

func main() {
	flag.Parse()
	*sluiceBin = benchrun.Sluice(*sluiceBin, "sluice-bench-edtcpu")
	var cells []cell
	want := map[string]bool{}
	for _, b := range strings.Split(*backends, ",") {
		want[b] = true
	}
	if want["none"] {
		cells = append(cells, measure("none", 0))
	}
	for _, be := range []struct{ name, hosts string }{{"htb", *htbHosts}, {"edt", *edtHosts}} {
		if !want[be.name] {
			continue
		}
		for _, s := range strings.Split(be.hosts, ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				benchrun.Fail(err)
			}
			cells = append(cells, measure(be.name, n))
		}
	}
	doc := map[string]any{
		"taken":  time.Now().UTC().Format(time.RFC3339),
		"cpus":   runtime.NumCPU(),
		"kernel": strings.TrimSpace(benchrun.Output("uname", "-r")),
		"method": fmt.Sprintf("4 iperf3 TCP flows through a %d-queue veth, %d s counted after 1 s, median of %d runs by CPU per bit; CPU: /proc/stat busy time of the whole machine over the same window", *queues, *secs, *runs),
		"cells":  cells,
	}
	b, _ := json.MarshalIndent(doc, "", "  ")
	os.MkdirAll(filepath.Dir(*out), 0o755)
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		benchrun.Fail(err)
	}
	fmt.Println("wrote", *out)
}

// policy is the bench's policy for backend with n hosts, the peer
// (10.9.0.2) first, every cap at limit.
func policy(dir, backend string, n int, limit string) string {
	var csv strings.Builder
	csv.WriteString("name,addresses,rate,ceil\n")
	fmt.Fprintf(&csv, "peer,10.9.0.2,1mbit,%s\n", limit)
	for i := 1; i < n; i++ {
		fmt.Fprintf(&csv, "s%d,%s,1mbit,%s\n", i, benchrun.HostAddr(i), limit)
	}
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(csv.String()), 0o644)
	// HTB as one tree (shards: 1), as tc users build it: a sharded tree
	// carries at most rate/N per shard, so one peer could not fill it.
	be := "\n      shards: 1"
	if backend == "edt" {
		be = "\n      backend: edt"
	}
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`interfaces:
  - name: veth0
    egress:
      rate: %s%s
      default: rest
      classes:
        - {name: subs, rate: 100mbit, ceil: %s, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 10mbit, ceil: %s}
`, limit, be, limit, limit)), 0o644)
	return file
}

func measure(backend string, n int) cell {
	c := cell{Backend: backend, Hosts: n, RateMbit: *rate}
	dir, err := os.MkdirTemp("", "sluice-edtcpu")
	if err != nil {
		benchrun.Fail(err)
	}
	defer os.RemoveAll(dir)
	a, b := fmt.Sprintf("sluice-cpu-a-%d", os.Getpid()), fmt.Sprintf("sluice-cpu-b-%d", os.Getpid())
	q := strconv.Itoa(*queues)
	benchrun.Must("ip", "netns", "add", a)
	benchrun.Must("ip", "netns", "add", b)
	defer func() {
		exec.Command("ip", "-n", a, "link", "del", "veth0").Run()
		exec.Command("ip", "netns", "del", a).Run()
		exec.Command("ip", "netns", "del", b).Run()
		time.Sleep(time.Second)
	}()
	benchrun.Must("ip", "-n", a, "link", "add", "veth0", "numtxqueues", q, "numrxqueues", q, "type", "veth",
		"peer", "name", "veth1", "netns", b, "numtxqueues", q, "numrxqueues", q)
	benchrun.Must("ip", "-n", a, "addr", "add", "10.9.0.1/24", "dev", "veth0")
	benchrun.Must("ip", "-n", b, "addr", "add", "10.9.0.2/24", "dev", "veth1")
	benchrun.Must("ip", "-n", a, "link", "set", "veth0", "up")
	benchrun.Must("ip", "-n", b, "link", "set", "veth1", "up")
	benchrun.Must("ip", "-n", a, "link", "set", "lo", "up")
	benchrun.Must("ip", "-n", b, "link", "set", "lo", "up")
	srv := exec.Command("ip", "netns", "exec", b, "iperf3", "-s", "-p", "5301")
	if err := srv.Start(); err != nil {
		benchrun.Fail(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	time.Sleep(300 * time.Millisecond)
	state := filepath.Join(dir, "state")
	apply := func(limit string) {
		if backend == "none" {
			return
		}
		cmd := exec.Command(*sluiceBin, "--netns", a, "apply", "-q", policy(dir, backend, n, limit))
		cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+state)
		if o, err := cmd.CombinedOutput(); err != nil {
			benchrun.Fail(fmt.Errorf("sluice apply (%s, %d hosts): %v\n%s", backend, n, err, o))
		}
	}
	apply("40gbit")
	var bps, cpus float64
	bps, cpus, c.Retransmits = median(a)
	c.FreeGbps, c.FreeCPUs = bps/1e9, cpus
	c.FreeCPUPerGbit = c.FreeCPUs / c.FreeGbps
	if backend != "none" {
		apply(fmt.Sprintf("%gmbit", *rate))
		bps, c.RateCPUs, _ = median(a)
		c.RateGoodput = bps / 1e6
		c.RateCPUPerGb = c.RateCPUs / (bps / 1e9)
	}
	fmt.Printf("%-4s %6d hosts: free %.2f Gbit/s with %.2f CPUs busy (%.2f CPU-s/Gbit, %d retransmits); at %gmbit %.1f Mbit/s with %.2f CPUs (%.2f CPU-s/Gbit)\n",
		backend, n, c.FreeGbps, c.FreeCPUs, c.FreeCPUPerGbit, c.Retransmits, *rate, c.RateGoodput, c.RateCPUs, c.RateCPUPerGb)
	return c
}

// median runs -runs times and keeps the run of the median CPU cost per
// bit.
func median(ns string) (bps, cpus float64, retrans int) {
	type r struct {
		bps, cpus float64
		re        int
	}
	var rs []r
	for range max(*runs, 1) {
		b, c, re := run(ns)
		rs = append(rs, r{b, c, re})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].cpus/rs[i].bps < rs[j].cpus/rs[j].bps })
	m := rs[len(rs)/2]
	return m.bps, m.cpus, m.re
}

// run sends 4 TCP flows from ns to the peer and returns iperf3's
// goodput (bit/s), the CPUs the machine kept busy meanwhile, and the
// retransmits.
func run(ns string) (float64, float64, int) {
	ip := exec.Command("ip", "netns", "exec", ns, "iperf3", "-c", "10.9.0.2", "-p", "5301", "-P", "4",
		"-t", strconv.Itoa(*secs+1), "-O", "1", "-J")
	var o bytes.Buffer
	ip.Stdout = &o
	if err := ip.Start(); err != nil {
		benchrun.Fail(err)
	}
	time.Sleep(time.Second) // the omitted second
	busy0, all0 := cpuTimes()
	if err := ip.Wait(); err != nil {
		benchrun.Fail(fmt.Errorf("iperf3: %v\n%s", err, o.String()))
	}
	busy1, all1 := cpuTimes()
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
		} `json:"end"`
	}
	if err := json.Unmarshal(o.Bytes(), &r); err != nil {
		benchrun.Fail(fmt.Errorf("iperf3 output: %v", err))
	}
	// Busy share of all CPU time, times the CPUs: CPUs kept busy.
	cpus := float64(busy1-busy0) / float64(all1-all0) * float64(runtime.NumCPU())
	return r.End.SumReceived.BitsPerSecond, cpus, r.End.SumSent.Retransmits
}

// cpuTimes reads the machine's busy and total CPU time (jiffies).
func cpuTimes() (busy, all uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		benchrun.Fail(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1:]
	for i, s := range f {
		v, _ := strconv.ParseUint(s, 10, 64)
		if i >= 8 { // guest and guest_nice are in user already
			break
		}
		all += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, all
}
