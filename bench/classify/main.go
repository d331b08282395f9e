// Command classify measures the BPF classifier's cost per packet for a
// growing number of hosts: BPF_PROG_TEST_RUN runs the loaded program in
// the kernel many times on one packet and reports the mean time per run.
// The content is what a policy with a few port rules and a per_host
// hosts_file compiles to, so every packet walks the rules and then one
// LPM lookup. Results go to bench/results/classify.json; docs/benchmarks.md
// shows them. Needs root (loading BPF).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"sluice/bench/internal/benchrun"
	"sluice/bpf"
	"sluice/bpf/bpftest"
	"sluice/plan"
	"sluice/policy"
	"sluice/testutil"
)

// Flows, for the round-trip rows: the TCP flows the program tracks
// when the measured packet passes.
type result struct {
	Flows int `json:"flows,omitempty"`
	// Backend: htb (classify, hand the class to HTB) or edt (classify,
	// then pace: take a slot on the aggregate's clock, stamp the packet).
	Backend  string  `json:"backend"`
	Hosts    int     `json:"hosts"`
	Rules    int     `json:"rules"`
	Packet   string  `json:"packet"`
	NsPerPkt float64 `json:"ns_per_packet"`
	Repeat   int     `json:"repeat"`
}

// content compiles a policy with three rule classes and n hosts, for
// HTB or for the EDT backend.
func content(n int, edt bool) (*bpf.Content, error) {
	dir, err := os.MkdirTemp("", "sluice-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	f, err := os.Create(filepath.Join(dir, "hosts.csv"))
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(f, "name,addresses,rate,ceil")
	for i := 0; i < n; i++ {
		fmt.Fprintf(f, "h%d,%s,1mbit,100mbit\n", i, hostAddr(i))
	}
	f.Close()
	backend := "classifier: bpf"
	if edt {
		backend = "backend: edt"
	}
	src := `interfaces:
  - name: eth0
    egress:
      rate: 10gbit
      default: rest
      ` + backend + `
      classes:
        - {name: ssh, rate: 10mbit, match: [{dport: 22}]}
        - {name: dns, rate: 10mbit, match: [{proto: udp, dport: 53}]}
        - {name: voip, rate: 10mbit, match: [{dscp: EF}]}
        - {name: subs, rate: 9gbit, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 100mbit}
`
	os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(src), 0o644)
	pol, _, err := policy.Load(filepath.Join(dir, "p.yaml"))
	if err != nil {
		return nil, err
	}
	p, err := plan.Build(pol, plan.Everything, nil)
	if err != nil {
		return nil, err
	}
	if h := p.Devices[0].Hook(); h != nil {
		return h.Content, nil
	}
	return nil, fmt.Errorf("no bpf hook planned")
}

func hostAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

func main() {
	out := flag.String("out", "bench/results/classify.json", "where to write the results")
	repeat := flag.Int("repeat", 2_000_000, "runs per measurement (0: skip BPF_PROG_TEST_RUN)")
	vethHosts := flag.String("veth-hosts", "10,1000,10000", "host counts for the packet rate through a veth (empty: skip)")
	vethPackets := flag.Int("veth-packets", 300_000, "packets per round through the veth")
	sluiceBin := flag.String("sluice", "", "sluice binary for the veth runs (default: build it)")
	setups := flag.String("veth-setups", "none,htb,u32-script,u32,bpf,edt", "what the veth runs compare (edt needs fq: where it is missing the row says so)")
	htbMax := flag.Int("veth-htb-max", 0, "host counts above this run only none and edt through the veth (0: no limit)")
	flag.Parse()
	var results []result
	// 100,000 hosts exceed one HTB's class ids (sharding is still to
	// come), so the largest case plans 30,000 and adds the rest to the
	// host table directly: the lookup cost is what is measured.
	for _, run := range []struct {
		backend string
		n       int
	}{{"htb", 10}, {"htb", 1000}, {"htb", 10000}, {"htb", 100000}, {"edt", 10}, {"edt", 1000}, {"edt", 10000}, {"edt", 100000}} {
		if *repeat == 0 {
			break // -repeat 0: the veth runs only
		}
		n := run.n
		c, err := content(min(n, 30000), run.backend == "edt")
		if err != nil {
			benchrun.Fail(err)
		}
		if c.EDT != nil {
			// Every run takes a slot and is stamped: with the default
			// horizon, millions of runs at one instant would measure the
			// drop path instead.
			c.EDT.Horizon = 1 << 62
		}
		var tmpl bpf.Target
		for _, t := range c.Hosts {
			tmpl = t
			break
		}
		for i := 30000; i < n; i++ {
			c.Hosts[bpf.HostKeyOf(0, netip.PrefixFrom(hostAddr(i), 32))] = tmpl
		}
		prog, err := bpftest.Writable(bpf.Load(c))
		if err != nil {
			benchrun.Fail(err)
		}
		for _, pk := range []struct {
			name string
			p    testutil.Packet
		}{
			{"tcp to the last host", testutil.Packet{Src: netip.MustParseAddr("192.0.2.1"), Dst: hostAddr(n - 1), Proto: 6, Sport: 443, Dport: 40000, Payload: 1000}},
			{"udp dns (an early rule)", testutil.Packet{Src: netip.MustParseAddr("192.0.2.1"), Dst: hostAddr(0), Proto: 17, Sport: 40000, Dport: 53, Payload: 60}},
		} {
			d, err := prog.Benchmark(pk.p.Frame(), *repeat)
			if err != nil {
				benchrun.Fail(err)
			}
			r := result{Backend: run.backend, Hosts: n, Rules: len(c.Rules), Packet: pk.name, NsPerPkt: float64(d) / float64(time.Nanosecond), Repeat: *repeat}
			fmt.Printf("%s %7d hosts  %-24s %6.1f ns/packet\n", run.backend, n, pk.name, r.NsPerPkt)
			results = append(results, r)
		}
		prog.Close()
	}
	if *repeat > 0 {
		results = append(results, measureRTT(*repeat)...)
	}
	// The same rules through a veth: u32 filters against the BPF
	// classifier, with no tc and a plain HTB as the baselines.
	var veth []vethResult
	if *vethHosts != "" {
		*sluiceBin = benchrun.Sluice(*sluiceBin, "sluice-bench-classify")
		for _, f := range strings.Split(*vethHosts, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				benchrun.Fail(fmt.Errorf("-veth-hosts %q: %v", f, err))
			}
			veth = append(veth, measureVeth(*sluiceBin, n, *vethPackets, strings.Split(*setups, ","), *htbMax)...)
		}
	}
	os.MkdirAll(filepath.Dir(*out), 0o755)
	b, _ := json.MarshalIndent(map[string]any{"taken": time.Now().UTC().Format(time.RFC3339), "cpus": runtime.NumCPU(),
		"method": "BPF_PROG_TEST_RUN, mean of repeat runs on one CPU", "results": results,
		"veth_method": "a raw packet socket sends small TCP frames to the last host out of a veth through the applied tree, best of 5 rounds; time per packet is the whole transmit path",
		"veth":        veth}, "", "  ")
	os.WriteFile(*out, append(b, '\n'), 0o644)
}

// measureRTT is the cost round-trip timing (rtt: on) adds to a packet:
// the classifier of 1,000 hosts with and without it, on a TCP data
// segment with timestamps, with 100,000 other flows tracked (each
// started by a packet of its own first). The measured packet repeats
// one flow and one TSval, the common case: a lookup of its flow and
// nothing to start.
func measureRTT(repeat int) []result {
	const hosts, flows = 1000, 100000
	var out []result
	for _, rtt := range []bool{false, true} {
		c, err := content(hosts, false)
		if err != nil {
			benchrun.Fail(err)
		}
		backend := "htb"
		if rtt {
			c.RTT, backend = &bpf.RTT{Record: true, Flows: 2 * flows}, "htb+rtt"
		}
		prog, err := bpftest.Writable(bpf.Load(c))
		if err != nil {
			benchrun.Fail(err)
		}
		pkt := func(i int) []byte {
			p := testutil.Packet{Src: netip.AddrFrom4([4]byte{192, 0, 2, byte(i >> 16)}), Dst: hostAddr(i % hosts), Proto: 6,
				Sport: uint16(1024 + i&0xffff), Dport: 40000, TCPFlags: 0x10, Payload: 1000,
				TCPOptions: testutil.TCPTimestamps(uint32(i+1), 1)}
			return p.Frame()
		}
		if rtt {
			for i := 1; i <= flows; i++ {
				if _, err := prog.Run(bpf.Packet{Frame: pkt(i)}); err != nil {
					benchrun.Fail(err)
				}
			}
		}
		d, err := prog.Benchmark(pkt(0), repeat)
		if err != nil {
			benchrun.Fail(err)
		}
		r := result{Backend: backend, Hosts: hosts, Flows: flows, Rules: len(c.Rules), Packet: "tcp data with timestamps",
			NsPerPkt: float64(d) / float64(time.Nanosecond), Repeat: repeat}
		if !rtt {
			r.Flows = 0
		}
		fmt.Printf("%-7s %7d hosts %6d flows  %-24s %6.1f ns/packet\n", backend, hosts, r.Flows, r.Packet, r.NsPerPkt)
		out = append(out, r)
		prog.Close()
	}
	return append(out, measureChurn(hosts))
}

// measureChurn runs 1,000,000 flows, each new, through a classifier
// whose flow map holds 131,072: every packet misses its flow, starts a
// sample and displaces the least recently seen. The map holds no more
// than its size, and its memory, preallocated, does not change.
func measureChurn(hosts int) result {
	const total, capacity = 1_000_000, 131072
	c, err := content(hosts, false)
	if err != nil {
		benchrun.Fail(err)
	}
	c.RTT = &bpf.RTT{Record: true, Flows: capacity}
	prog, err := bpftest.Writable(bpf.Load(c))
	if err != nil {
		benchrun.Fail(err)
	}
	defer prog.Close()
	start := time.Now()
	for i := 0; i < total; i++ {
		p := testutil.Packet{Src: netip.AddrFrom4([4]byte{198, 18, byte(i >> 16), byte(i >> 8)}), Dst: hostAddr(i % hosts), Proto: 6,
			Sport: uint16(1024 + i&0xff), Dport: 443, TCPFlags: 0x18, Payload: 1000, TCPOptions: testutil.TCPTimestamps(uint32(i+1), 1)}
		if _, err := prog.Run(bpf.Packet{Frame: p.Frame()}); err != nil {
			benchrun.Fail(err)
		}
	}
	took := time.Since(start)
	n, err := prog.FlowsTracked()
	if err != nil {
		benchrun.Fail(err)
	}
	if n > capacity {
		benchrun.Fail(fmt.Errorf("the flow map holds %d flows, more than its %d", n, capacity))
	}
	rc, _ := prog.RTTCounts()
	fmt.Printf("htb+rtt churn: %d new flows through a map of %d: %d held after, %d samples started (%v, each a syscall)\n", total, capacity, n, rc.Recorded, took.Round(time.Millisecond))
	// No time per packet: each run is a syscall, which the benchmarks
	// above take out by repeating one packet in the kernel.
	return result{Backend: "htb+rtt churn", Hosts: hosts, Flows: n, Rules: len(c.Rules), Packet: fmt.Sprintf("%d new tcp flows, map of %d", total, capacity), Repeat: 1}
}
