// Command probe measures what the rate controller's probing costs: the
// CPU of a prober at 20 Hz (three reflectors in another namespace, over
// a veth), echo and timestamp, beside a bare 20 Hz timer in the same
// process, the floor any loop that wakes that often pays. As root.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"sluice/bench/internal/benchrun"
	"sluice/lab"
	"sluice/probe"
)

type result struct {
	Mode       string  `json:"mode"`
	Seconds    float64 `json:"seconds"`
	Replies    int     `json:"replies"`
	Lost       int     `json:"lost"`
	CPUPercent float64 `json:"cpu_percent_of_a_core"`
}

type output struct {
	CPUs    int      `json:"cpus"`
	Kernel  string   `json:"kernel"`
	Date    string   `json:"date"`
	Hz      float64  `json:"hz"`
	Results []result `json:"results"`
}

func cpu() time.Duration {
	var r syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

func main() {
	secs := flag.Int("seconds", 30, "how long each mode runs")
	out := flag.String("out", "bench/results/probe.json", "results file")
	flag.Parse()
	d := time.Duration(*secs) * time.Second
	const interval = 50 * time.Millisecond
	a, b := fmt.Sprintf("sluice-bench-probe-a-%d", os.Getpid()), fmt.Sprintf("sluice-bench-probe-b-%d", os.Getpid())
	benchrun.Must("ip", "netns", "add", a)
	benchrun.Must("ip", "netns", "add", b)
	defer func() {
		exec.Command("ip", "netns", "del", a).Run()
		exec.Command("ip", "netns", "del", b).Run()
	}()
	benchrun.Must("ip", "-n", a, "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns", b)
	benchrun.Must("ip", "-n", a, "addr", "add", "10.9.0.1/24", "dev", "veth0")
	var reflectors []netip.Addr
	for i := 2; i <= 4; i++ {
		addr := fmt.Sprintf("10.9.0.%d", i)
		benchrun.Must("ip", "-n", b, "addr", "add", addr+"/24", "dev", "veth0")
		reflectors = append(reflectors, netip.MustParseAddr(addr))
	}
	benchrun.Must("ip", "-n", a, "link", "set", "veth0", "up")
	benchrun.Must("ip", "-n", b, "link", "set", "veth0", "up")
	time.Sleep(time.Second) // the link's carrier and addresses settle

	o := output{CPUs: runtime.NumCPU(), Kernel: strings.TrimSpace(benchrun.Output("uname", "-r")), Date: time.Now().UTC().Format(time.DateOnly), Hz: float64(time.Second / interval)}
	// The floor: a bare timer at the same rate.
	c0 := cpu()
	tick := time.NewTicker(interval)
	for end := time.Now().Add(d); time.Now().Before(end); {
		<-tick.C
	}
	tick.Stop()
	o.Results = append(o.Results, result{Mode: "timer only", Seconds: d.Seconds(), CPUPercent: 100 * (cpu() - c0).Seconds() / d.Seconds()})
	for _, ts := range []bool{false, true} {
		var p *probe.Prober
		if err := lab.InNetns(a, func() (err error) {
			p, err = probe.Open(probe.Config{Reflectors: reflectors, Interval: interval, Timestamp: ts})
			return err
		}); err != nil {
			benchrun.Fail(err)
		}
		r := result{Mode: "echo", Seconds: d.Seconds()}
		if ts {
			r.Mode = "timestamp"
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		c0 := cpu()
		if err := p.Run(ctx, func(probe.Reply) { r.Replies++ }, func(netip.Addr, time.Time) { r.Lost++ }); err != nil {
			benchrun.Fail(err)
		}
		r.CPUPercent = 100 * (cpu() - c0).Seconds() / d.Seconds()
		cancel()
		p.Close()
		o.Results = append(o.Results, r)
	}
	for _, r := range o.Results {
		fmt.Printf("%-10s %3.0f s: %4d replies, %d lost, CPU %.2f%% of a core\n", r.Mode, r.Seconds, r.Replies, r.Lost, r.CPUPercent)
	}
	buf, _ := json.MarshalIndent(o, "", "  ")
	if err := os.WriteFile(*out, append(buf, '\n'), 0o644); err != nil {
		benchrun.Fail(err)
	}
}
