package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/lab"
	"sluice/testutil"
)

// rttBed is a client namespace whose device r0 sluice shapes, wired to a
// server namespace through a delay line of delay each way.
type rttBed struct {
	client, server string
	wire           string // the delay line's namespace
	clientAddr     netip.Addr
	serverAddr     netip.Addr
}

func newRTTBed(t *testing.T, delay time.Duration) *rttBed {
	t.Helper()
	b := &rttBed{client: testutil.NewNetns(t, "rtc"), server: testutil.NewNetns(t, "rts"),
		clientAddr: netip.MustParseAddr("10.78.0.1"), serverAddr: netip.MustParseAddr("10.78.0.2")}
	wire := testutil.NewNetns(t, "rtw")
	b.wire = wire
	for _, err := range []error{lab.Veth(b.client, "r0", wire, "r", 0), lab.Veth(wire, "s", b.server, "peer", 0)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	line, err := lab.StartDelayLine(wire, delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { line.Close() })
	for _, err := range []error{lab.Addrs(b.client, "r0", b.clientAddr), lab.Addrs(b.server, "peer", b.serverAddr),
		lab.Routes(b.client, "r0", b.server, "peer", false, b.serverAddr), lab.Routes(b.server, "peer", b.client, "r0", false, b.clientAddr)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// paced sends from namespace ns to dst, 16 KB every 20 ms (6.5 Mbit/s,
// under every rate here: no queue of the shaper's in what it times),
// until ctx ends.
func paced(ctx context.Context, t *testing.T, ns string, src netip.Addr, dst netip.AddrPort) error {
	var c net.Conn
	err := lab.InNetns(ns, func() (err error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: 5 * time.Second}
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 16<<10)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
	}
}

// sink accepts connections on at in namespace ns and reads them until
// ctx ends.
func sink(ctx context.Context, t *testing.T, ns string, at netip.AddrPort) {
	t.Helper()
	var l net.Listener
	if err := lab.InNetns(ns, func() (err error) { l, err = net.Listen("tcp", at.String()); return err }); err != nil {
		t.Fatal(err)
	}
	go func() { <-ctx.Done(); l.Close() }()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
}

var pingTime = regexp.MustCompile(`time=([0-9.]+) ms`)

// pingMedian pings dst from namespace ns n times, 50 ms apart, and
// returns the median round trip.
func pingMedian(t *testing.T, ns string, dst netip.Addr, n int) time.Duration {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "ping", "-n", "-c", strconv.Itoa(n), "-i", "0.05", dst.String()).Output()
	if err != nil {
		t.Fatalf("ping: %v\n%s", err, out)
	}
	var ms []float64
	for _, m := range pingTime.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		ms = append(ms, v)
	}
	if len(ms) < n/2 {
		t.Fatalf("%d of %d pings answered", len(ms), n)
	}
	slices.Sort(ms)
	return time.Duration(ms[len(ms)/2] * float64(time.Millisecond))
}

type rttClass struct {
	Name string `json:"name"`
	RTT  *struct {
		Samples uint64  `json:"samples"`
		P50     float64 `json:"p50_seconds"`
		P95     float64 `json:"p95_seconds"`
	} `json:"rtt"`
}

// rttShow reads `sluice show --json` in ns: each class's round trips by
// tree direction and class name.
func rttShow(t *testing.T, ns string) map[string]rttClass {
	t.Helper()
	out := must(t, "--netns", ns, "show", "--json", "--interval", "0s")
	var s struct {
		Trees []struct {
			Direction string     `json:"direction"`
			Classes   []rttClass `json:"classes"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := map[string]rttClass{}
	for _, tr := range s.Trees {
		for _, c := range tr.Classes {
			m[tr.Direction+"/"+c.Name] = c
		}
	}
	return m
}

// Round trips timed from the shaped traffic itself agree with ping over
// the same path, in the class of the packets that started them, both
// ways: uploads (the egress tree; their ACKs end the samples on the
// way in) and downloads (the ingress tree on its ifb; the client's ACKs
// end them on the way out). The classes no flow used have no samples.
func TestPassiveRTTAgreesWithPing(t *testing.T) {
	light(t)
	b := newRTTBed(t, 10*time.Millisecond)
	// The upload's class gives each server its own class: the host's
	// round trips are its own too.
	policy := `interfaces:
  - name: r0
    rtt: on
    egress:
      rate: 200mbit
      default: bulk
      classes:
        - {name: up, rate: 100mbit, match: [{dport: 5301}], per_host: {by: dst, cidr: ` + b.serverAddr.String() + `/32, rate: 50mbit, ceil: 100mbit}}
        - {name: bulk, rate: 100mbit}
    ingress:
      rate: 200mbit
      default: other
      classes:
        - {name: down, rate: 100mbit, match: [{dport: 5302}]}
        - {name: other, rate: 100mbit}
`
	pol := writePolicy(t, "rtt.yaml", policy)
	must(t, "--netns", b.client, "apply", "-q", pol)
	// Read back, the hooks are what was planned: the ingress echo on r0
	// and the observing classifiers are sluice's, and found again.
	if out := must(t, "--netns", b.client, "plan", pol); !strings.Contains(out, "no changes") {
		t.Fatalf("plan after apply:\n%s", out)
	}
	up, down := netip.AddrPortFrom(b.serverAddr, 5301), netip.AddrPortFrom(b.clientAddr, 5302)
	// load runs an upload (the client to the server's 5301) and a
	// download (the server to the client's 5302) while during runs.
	load := func(during func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		sink(ctx, t, b.server, up)
		sink(ctx, t, b.client, down)
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		wg.Add(2)
		go func() { defer wg.Done(); errs <- paced(ctx, t, b.client, b.clientAddr, up) }()
		go func() { defer wg.Done(); errs <- paced(ctx, t, b.server, b.serverAddr, down) }()
		time.Sleep(500 * time.Millisecond)
		during()
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	var ping time.Duration
	var got map[string]rttClass
	var text, hosts string
	load(func() {
		ping = pingMedian(t, b.client, b.serverAddr, 40)
		got = rttShow(t, b.client)
		text = must(t, "--netns", b.client, "show", "--interval", "0s")
		hosts = must(t, "--netns", b.client, "show", "--interval", "0s", "--hosts")
	})
	t.Logf("ping median %v; classes %s\n%s", ping, fmtRTT(got), hosts)
	host := "up/" + b.serverAddr.String()
	hostLine := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(host) + `\s+\d+\s+[0-9.]+ ms`)
	rtTable := func(s string) string { _, after, _ := strings.Cut(s, "ROUND TRIPS"); return after }
	if !regexp.MustCompile(`(?m)^\s*ROUND TRIPS\s+SAMPLES\s+P50\s+P95\s+P99\s+QUEUE NOW\s*$`).MatchString(text) ||
		!regexp.MustCompile(`(?m)^\s+up\s+\d+\s+[0-9.]+ ms`).MatchString(text) || hostLine.MatchString(rtTable(text)) {
		t.Errorf("show prints no round trips for class up, or its host's without --hosts:\n%s", text)
	}
	if !hostLine.MatchString(rtTable(hosts)) {
		t.Errorf("show --hosts prints no round trips for %s:\n%s", host, hosts)
	}
	defer func() {
		// Reset takes every hook away with the trees.
		must(t, "--netns", b.client, "reset", "--all")
		for _, hook := range []string{"ingress", "egress"} {
			out, _ := exec.Command("ip", "netns", "exec", b.client, "tc", "filter", "show", "dev", "r0", hook).CombinedOutput()
			if strings.Contains(string(out), "bpf") {
				t.Errorf("after reset, r0 %s still has:\n%s", hook, out)
			}
		}
	}()
	for _, name := range []string{"egress/up", "ingress/down"} {
		if c := got[name]; c.RTT == nil || c.RTT.Samples < 20 {
			t.Fatalf("%s: round trips %+v, want 20 samples at least", name, c.RTT)
		}
	}
	// The upload's round trip is the path beyond r0: ping's.
	p50 := time.Duration(got["egress/up"].RTT.P50 * 1e9)
	if tol := max(2*time.Millisecond, ping/10); p50 < ping-tol || p50 > ping+tol {
		t.Errorf("egress/up: passive p50 %v, ping median %v: more than %v apart", p50, ping, tol)
	}
	// The server's own, from its own histogram (a quarter octave a
	// bucket, and a round trip behind its class's): the same.
	if c := got["egress/"+host]; c.RTT == nil || c.RTT.Samples < 10 {
		t.Errorf("%s: round trips %+v, want 10 samples at least", host, c.RTT)
	} else if p50, tol := time.Duration(c.RTT.P50*1e9), max(2*time.Millisecond, ping/8); p50 < ping-tol || p50 > ping+tol {
		t.Errorf("%s: passive p50 %v, ping median %v: more than %v apart", host, p50, ping, tol)
	}
	// The download's starts where the ingress tree classifies it, on the
	// ifb, and ends when the client's ACK leaves r0: the ifb's queue and
	// the way to the host behind r0, here the client's own stack, none
	// of the delay line's.
	if p50 := time.Duration(got["ingress/down"].RTT.P50 * 1e9); p50 > ping/4 {
		t.Errorf("ingress/down: passive p50 %v; want the near side's, well under the path's %v", p50, ping)
	}
	// The other classes carried ACKs and pings only: pure ACKs start no
	// sample (their echo waits for the peer's next data).
	for _, name := range []string{"egress/bulk", "ingress/other"} {
		if c := got[name]; c.RTT == nil || c.RTT.Samples != 0 {
			t.Errorf("%s carried no data: round trips %+v, want none", name, c.RTT)
		}
	}
	// A larger flow table needs new programs on every hook; each loaded
	// takes the maps of the one already there, so samples started on one
	// side still end on the other.
	larger := writePolicy(t, "rtt.yaml", strings.Replace(policy, "rtt: on", "rtt: {flows: 8192}", 1))
	if out := must(t, "--netns", b.client, "plan", "--tc", larger); strings.Count(out, "the flow map holds 16384 flows; 8192 wanted") != 2 {
		t.Errorf("plan for a larger flow table: want both hooks replaced:\n%s", out)
	}
	must(t, "--netns", b.client, "apply", "-q", larger)
	if out := must(t, "--netns", b.client, "plan", larger); !strings.Contains(out, "no changes") {
		t.Fatalf("plan after the larger table's apply:\n%s", out)
	}
	// New programs, new maps: the histograms start again.
	for name, c := range rttShow(t, b.client) {
		if c.RTT != nil && c.RTT.Samples != 0 {
			t.Errorf("after the programs were replaced, %s: %d samples, want a new histogram", name, c.RTT.Samples)
		}
	}
	load(func() {
		time.Sleep(time.Second)
		got = rttShow(t, b.client)
	})
	for _, name := range []string{"egress/up", "ingress/down"} {
		if c := got[name]; c.RTT == nil || c.RTT.Samples < 10 {
			t.Errorf("after the programs were replaced, %s: round trips %+v, want 10 samples at least", name, c.RTT)
		}
	}
}

func fmtRTT(m map[string]rttClass) string {
	var parts []string
	for k, c := range m {
		if c.RTT != nil {
			parts = append(parts, fmt.Sprintf("%s: %d samples p50 %.2f ms p95 %.2f ms", k, c.RTT.Samples, c.RTT.P50*1e3, c.RTT.P95*1e3))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// Where the replies come back another way (an asymmetric route: here a
// second link the shaped device never sees), nothing ends the samples:
// they are given up, never read as a round trip, and show says why the
// class has none.
func TestPassiveRTTAsymmetricRoute(t *testing.T) {
	light(t)
	b := newRTTBed(t, 5*time.Millisecond)
	for _, err := range []error{lab.Veth(b.client, "r1", b.server, "back", 0),
		lab.Routes(b.server, "peer", b.client, "r0", true, b.clientAddr),
		lab.Routes(b.server, "back", b.client, "r1", false, b.clientAddr)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Strict reverse-path filtering would drop what comes in on the
	// link the reverse route does not take.
	for _, ns := range []string{b.client, b.server} {
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0",
			"net.ipv4.conf.default.rp_filter=0").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	for ns, devs := range map[string][]string{b.client: {"r0", "r1"}, b.server: {"peer", "back"}} {
		for _, d := range devs {
			exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf."+d+".rp_filter=0").Run()
		}
	}
	pol := writePolicy(t, "rtt.yaml", `interfaces:
  - name: r0
    rtt: on
    egress:
      rate: 200mbit
      default: bulk
      classes:
        - {name: up, rate: 100mbit, match: [{dport: 5301}]}
        - {name: bulk, rate: 100mbit}
`)
	must(t, "--netns", b.client, "apply", "-q", pol)
	up := netip.AddrPortFrom(b.serverAddr, 5301)
	ctx, cancel := context.WithCancel(context.Background())
	sink(ctx, t, b.server, up)
	done := make(chan error, 1)
	go func() { done <- paced(ctx, t, b.client, b.clientAddr, up) }()
	// Past the 4 s a sample waits for its echo: the flow's first is
	// given up when its next starts.
	time.Sleep(5500 * time.Millisecond)
	out := must(t, "--netns", b.client, "show", "--json", "--interval", "0s")
	text := must(t, "--netns", b.client, "show", "--interval", "0s")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var s struct {
		Trees []struct {
			Classes []struct {
				Name  string `json:"name"`
				Bytes uint64 `json:"bytes"`
				RTT   *struct {
					Samples uint64 `json:"samples"`
				} `json:"rtt"`
			} `json:"classes"`
			Counts *struct {
				Started uint64 `json:"started"`
				Timed   uint64 `json:"timed"`
				GivenUp uint64 `json:"given_up"`
			} `json:"rtt_counts"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Trees) != 1 {
		t.Fatalf("%v\n%s", err, out)
	}
	tr := s.Trees[0]
	for _, c := range tr.Classes {
		if c.Name == "up" && (c.Bytes < 1<<20 || c.RTT == nil || c.RTT.Samples != 0) {
			t.Errorf("class up: %d bytes, round trips %+v; want the upload's megabytes and no sample", c.Bytes, c.RTT)
		}
	}
	if c := tr.Counts; c == nil || c.Started < 2 || c.Timed != 0 || c.GivenUp < 1 {
		t.Errorf("round-trip counts %+v: want samples started, none timed, the first given up", c)
	}
	if !strings.Contains(text, "never answered through r0") || !strings.Contains(text, "asymmetric route") {
		t.Errorf("show does not say why no round trip is timed:\n%s", text)
	}
}

// The lab splits a class's round trips at the shaper, tested against
// the bed's known delays: an upload through a 10mbit egress class, 20
// ms of delay line beyond it, spends its queue in the class and its
// path in the delay line, so the split's path is the idle ping's round
// trip and the queue the rest; a download through the ingress tree's
// ifb has nothing beyond the router but the client, so its path is
// near nothing and its round trips are the ifb's queue. Both kernels:
// bfifo leaves here (a queue of about 50 ms), fq_codel in the lane (its
// target's few ms).
func TestPassiveRTTSplitsQueueAndPath(t *testing.T) {
	light(t)
	src := `name: split
topology: {clients: 1, modem: {delay: 10ms}}
variants:
  - name: shaped
    policy: |
      interfaces:
        - name: wan
          egress: {rate: 10mbit}
          ingress: {rate: 10mbit}
phases:
  - {name: idle, duration: 3s}
  - {name: up, duration: 6s}
  - {name: down, duration: 6s}
settle: 2s
traffic:
  - {name: up, type: tcp, from: client1, to: server, cc: cubic, phases: [up]}
  - {name: down, type: tcp, from: server, to: client1, cc: cubic, phases: [down]}
  - {name: ping, type: ping, from: client1, to: server, interval: 50ms, phases: [idle]}
`
	dir, _, r := labRunFile(t, "split", src)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("%s", r.stdout)
	rep := readReport(t, dir)
	res := rep.Results[0]
	phase := func(name string) *lab.PhaseResult {
		for _, p := range res.Phases {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no phase %s", name)
		return nil
	}
	idle := phase("idle").Probes["ping"]
	if idle == nil || idle.N < 10 {
		t.Fatalf("idle ping: %+v", idle)
	}
	rttOf := func(phase, class string) *lab.RTTStat {
		c := phaseClass(phase, class, res)
		if c == nil || c.RTT == nil || c.RTT.Samples < 20 {
			t.Fatalf("%s %s: %+v, want 20 samples at least", phase, class, c)
		}
		return c.RTT
	}
	// The upload: its path is the delay line's round trip, as the idle
	// ping read it; its queue is the class's.
	up := rttOf("up", "wan/")
	if tol := max(3, 0.15*idle.P50); math.Abs(up.Path-idle.P50) > tol {
		t.Errorf("upload: path %.1f ms (mean %.1f, queue %.1f), the idle ping %.1f: more than %.1f ms apart", up.Path, up.Mean, up.Queue, idle.P50, tol)
	}
	if up.Queue < 2 {
		t.Errorf("upload: queue %.1f ms through a full 10mbit class (mean %.1f)", up.Queue, up.Mean)
	}
	// The download: the ifb's queue, and the client's stack beyond.
	down := rttOf("down", "ifb-wan/")
	if down.Path > max(3, 0.15*idle.P50) || down.Queue < 2 {
		t.Errorf("download: path %.1f ms, queue %.1f (mean %.1f): want the queue, and a path near none", down.Path, down.Queue, down.Mean)
	}
	for _, want := range []string{"queue ", "path "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the report's table lacks %q:\n%s", want, r.stdout)
		}
	}
}

// phaseClass is the class of res in phase whose key starts with prefix
// ("wan/": the wan egress tree's), the one with the most samples.
func phaseClass(phase, prefix string, res *lab.Result) *lab.ClassStat {
	var best *lab.ClassStat
	for _, p := range res.Phases {
		if p.Name != phase {
			continue
		}
		for k, c := range p.Classes {
			if strings.HasPrefix(k, prefix) && c.RTT != nil && (best == nil || c.RTT.Samples > best.RTT.Samples) {
				best = c
			}
		}
	}
	return best
}
