package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
	"sluice/plan"
	"sluice/stats"
	"sluice/testutil"
	"sluice/units"
)

// The EDT backend needs fq (and mqprio for its prod/nonprod split),
// which the host kernel lacks: these tests run in the stock-kernel lane,
// where a skip for a missing fq is a failure.

func needFq(t *testing.T) *doctorReport {
	t.Helper()
	rep := doctorJSON(t)
	testutil.NeedFeature(t, "fq", rep.Qdiscs["fq"])
	return rep
}

const edtTwoKinds = `    egress:
      backend: edt
      rate: 200mbit
      default: bulk
      classes:
        - name: prod
          rate: 20mbit
          ceil: 100mbit
          prio: 0
          match: [{proto: tcp, dport: 5201}]
        - name: bulk
          rate: 10mbit
          ceil: 100mbit
          prio: 4
`

// TestEDTApplyPlanShowReset: on an 8-queue veth an EDT egress becomes
// mqprio 7:1 (or mq) with an fq on every queue and the pacing program;
// a second plan changes nothing, show lists the aggregates, a deleted
// fq is repaired, and reset leaves the kernel's default qdisc.
func TestEDTApplyPlanShowReset(t *testing.T) {
	rep := needFq(t)
	a, _ := shardedPair(t, 8, 0)
	pol := writePolicy(t, "p.yaml", policyFor("veth0", edtTwoKinds))
	must(t, "--netns", a, "apply", "-q", pol)
	q := tcShow(t, a, "qdisc", "show", "dev", "veth0")
	root := "mq"
	if rep.Qdiscs["mqprio"] {
		root = "mqprio"
		if !strings.Contains(q, "qdisc mqprio 1: root") || !strings.Contains(q, "queues:(0:6) (7:7)") {
			t.Fatalf("no mqprio 7:1 root:\n%s", q)
		}
	} else if !strings.Contains(q, "qdisc mq 1: root") {
		t.Fatalf("no mq root:\n%s", q)
	}
	if n := strings.Count(q, "qdisc fq "); n != 8 {
		t.Fatalf("%d fq qdiscs, want one per queue:\n%s", n, q)
	}
	if f := tcShow(t, a, "filter", "show", "dev", "veth0", "egress"); !strings.Contains(f, "sluice-") {
		t.Fatalf("no pacing program on egress:\n%s", f)
	}
	if out := must(t, "--netns", a, "plan", pol); strings.TrimSpace(out) != "no changes" {
		t.Fatalf("second plan: %s", out)
	}
	s := showJSON(t, a)
	if len(s.Trees) != 1 || s.Trees[0].Backend != "edt" || len(s.Trees[0].Classes) != 2 || len(s.Trees[0].Delays) != 2 {
		t.Fatalf("show: %+v", s.Trees)
	}
	// Someone deletes an fq: apply puts it back.
	testutil.NS(t, a, "tc", "qdisc", "del", "dev", "veth0", "parent", "1:3")
	if out := must(t, "--netns", a, "plan", "--tc", pol); !strings.Contains(out, "fq") {
		t.Fatalf("plan after deleting an fq: %s", out)
	}
	must(t, "--netns", a, "apply", "-q", pol)
	if n := strings.Count(tcShow(t, a, "qdisc", "show", "dev", "veth0"), "qdisc fq "); n != 8 {
		t.Fatalf("after repair: %d fq qdiscs", n)
	}
	must(t, "--netns", a, "reset", "veth0")
	q = tcShow(t, a, "qdisc", "show", "dev", "veth0")
	if strings.Contains(q, "qdisc fq ") || strings.Contains(q, root+" 1:") || strings.Contains(q, "clsact") {
		t.Fatalf("after reset:\n%s", q)
	}
}

// TestEDTEgressCaps: a 20mbit and a 100mbit cap reach 0.93 to 0.975 of
// the rate as TCP goodput (HTB's window), on a single-queue veth (root
// fq), with 4 iperf3 flows.
func TestEDTEgressCaps(t *testing.T) {
	needFq(t)
	for _, rate := range []int{20, 100} {
		t.Run(fmt.Sprintf("%dmbit", rate), func(t *testing.T) {
			p := testutil.NewPair(t)
			must(t, "--netns", p.A, "apply", "-q", writePolicy(t, "p.yaml", policyFor(p.DevA,
				fmt.Sprintf("    egress:\n      backend: edt\n      rate: %dmbit\n", rate))))
			if q := tcShow(t, p.A, "qdisc", "show", "dev", p.DevA); !strings.Contains(q, "qdisc fq 1: root") {
				t.Fatalf("no root fq:\n%s", q)
			}
			testutil.IperfServer(t, p.B, testutil.AddrB, 5201)
			r, err := testutil.Iperf(p.A, testutil.AddrB, 5201, 4, 6)
			if err != nil {
				t.Fatal(err)
			}
			checkGoodput(t, fmt.Sprintf("edt egress %dmbit", rate), r, float64(rate)*1e6)
		})
	}
}

// TestEDTIngressCap: ingress through an 8-queue ifb with mq and fq,
// the program stamping on the ifb (a monotonic delivery time, on the
// ingress path), holds a 20mbit cap.
func TestEDTIngressCap(t *testing.T) {
	needFq(t)
	p := testutil.NewPair(t)
	must(t, "--netns", p.A, "apply", "-q", writePolicy(t, "p.yaml", policyFor(p.DevA, "    ingress:\n      backend: edt\n      rate: 20mbit\n")))
	if q := tcShow(t, p.A, "qdisc", "show", "dev", "ifb-"+p.DevA); strings.Count(q, "qdisc fq ") != 8 {
		t.Fatalf("ifb qdiscs:\n%s", q)
	}
	testutil.IperfServer(t, p.A, testutil.AddrA, 5201)
	r, err := testutil.Iperf(p.B, testutil.AddrA, 5201, 4, 6)
	if err != nil {
		t.Fatal(err)
	}
	checkGoodput(t, "edt ingress 20mbit", r, link20)
}

// TestEDTExemptionsAndHorizon: while a UDP flood of 1.5 times the cap
// keeps an ingress aggregate a horizon behind, a datagram of the same
// aggregate waits about the horizon, while NTP (UDP 123) and a
// policy-exempt port keep their timestamps and pass at once; the
// packets beyond the horizon are dropped and counted, and what passes
// is the cap. Ingress, because there the sender is another host: a
// local sender's socket buffer fills while fq holds its packets, and
// throttles it before the horizon does. The cap is low (4mbit) and the
// flood mild so that an emulated machine (the lane's) sends it steadily
// and a third of the probes pass (delayed) while the rest are dropped.
func TestEDTExemptionsAndHorizon(t *testing.T) {
	const cap = 4e6
	needFq(t)
	p := testutil.NewPair(t)
	must(t, "--netns", p.A, "apply", "-q", writePolicy(t, "p.yaml", policyFor(p.DevA,
		"    ingress:\n      backend: edt\n      rate: 4mbit\n      horizon: 100ms\n      exempt: [{proto: udp, dport: 5353}]\n")))
	for _, port := range []int{123, 124, 5353} {
		c, err := testutil.UDPEchoServer(p.A, testutil.AddrA, port)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	rtts, _, err := testutil.UDPEchoRTTs(p.B, testutil.AddrA, 124, 20, 20*time.Millisecond)
	if err != nil || len(rtts) == 0 {
		t.Fatalf("idle echo: %v, %d answers", err, len(rtts))
	}
	idle := testutil.Percentile(rtts, 50)
	testutil.IperfServer(t, p.A, testutil.AddrA, 5201)
	done := make(chan error, 1)
	go func() {
		_, err := testutil.Iperf(p.B, testutil.AddrA, 5201, 2, 25, "-u", "-b", "3M")
		done <- err
	}()
	time.Sleep(2 * time.Second)
	before := showJSON(t, p.A)
	var during stats.Sample
	if err := json.Unmarshal([]byte(must(t, "--netns", p.A, "show", "--json", "--interval", "2s")), &during); err != nil {
		t.Fatal(err)
	}
	loaded := map[int]time.Duration{}
	for _, port := range []int{124, 123, 5353} {
		rtts, lost, err := testutil.UDPEchoRTTs(p.B, testutil.AddrA, port, 30, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(rtts) == 0 {
			t.Fatalf("port %d: every datagram lost (%d)", port, lost)
		}
		loaded[port] = testutil.Percentile(rtts, 50)
		t.Logf("UDP port %d under load: median RTT %v (idle %v), %d of 30 lost beyond the horizon", port, loaded[port], idle, lost)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The paced port waits most of the horizon; the exempt ones do not.
	if loaded[124] < 50*time.Millisecond {
		t.Errorf("a paced datagram waited %v behind a saturated aggregate; want most of the 100 ms horizon", loaded[124])
	}
	for _, port := range []int{123, 5353} {
		if loaded[port] > idle+20*time.Millisecond || loaded[port] > loaded[124]/3 {
			t.Errorf("exempt port %d: median RTT %v under load (idle %v, paced %v): it was re-stamped", port, loaded[port], idle, loaded[124])
		}
	}
	c0, c1 := edtClass(t, before), edtClass(t, &during)
	if c1.Drops == 0 || c1.Drops <= c0.Drops {
		t.Errorf("horizon drops %d -> %d under a flood of 1.5 times the cap", c0.Drops, c1.Drops)
	}
	t.Logf("aggregate passed %.2f Mbit/s (wire bytes), %d horizon drops in %.1f s, backlog %d then %d bytes", c1.Measured.BitsFloat()/1e6, c1.Drops-c0.Drops, during.At.Sub(before.At).Seconds(), c0.Backlog, c1.Backlog)
	// The backlog is the aggregate's clock ahead of now, at its cap:
	// under a flood some of a horizon's worth (the aggregate's horizon:
	// 100 ms, or at 4mbit the floor of a 64 KB packet and three frames,
	// 140 ms), never more than it and a packet.
	horizon := plan.HorizonFor(100*time.Millisecond, units.FromBits(cap))
	if full := uint32(float64(horizon) / 1e9 * cap / 8); max(c0.Backlog, c1.Backlog) == 0 || max(c0.Backlog, c1.Backlog) > full+1514 {
		t.Errorf("backlog %d then %d bytes under a flood; want some, at most %d", c0.Backlog, c1.Backlog, full+1514)
	}
	// Below the cap only while the sender stalls for longer than the
	// horizon, which an emulated machine's does (the lane's TCG: 3.60
	// Mbit/s in a CI run of 2026-11-26, 3.86 in a rerun); above it
	// never.
	floor := 0.9
	if os.Getenv("SLUICE_EMULATED") == "1" {
		floor = 0.85
	}
	if m := c1.Measured.BitsFloat(); m < floor*cap || m > 1.03*cap {
		t.Errorf("the aggregate passed %.2f Mbit/s under a 4mbit cap", c1.Measured.BitsFloat()/1e6)
	}
}

func edtClass(t *testing.T, s *stats.Sample) *stats.Class {
	t.Helper()
	if len(s.Trees) != 1 || s.Trees[0].Backend != "edt" || len(s.Trees[0].Classes) != 1 {
		t.Fatalf("show: %+v", s.Trees)
	}
	return s.Trees[0].Classes[0]
}

// TestEDTNoReordering: 8 TCP flows of one aggregate on an 8-queue veth
// (mq or mqprio, an fq per queue) keep their order. fq orders a flow
// within its queue only; the program pins each flow to one queue by its
// hash, so the senders' TCP_INFO shows no reordering seen and no
// retransmission, while the aggregate holds its cap.
//
// The receiver steers every packet to one CPU (RPS). A veth hands each
// packet to the backlog of the CPU that sent it, and one fq is dequeued
// by whichever CPU runs it: two packets of one flow sent by two CPUs
// could swap at the receiver whatever the shaper did (the lane's
// 2-CPU guest saw reord_seen 1 once, with no retransmission).
func TestEDTNoReordering(t *testing.T) {
	needFq(t)
	a, b := shardedPair(t, 8, 0)
	testutil.NS(t, b, "sh", "-c", `for f in /sys/class/net/veth1/queues/rx-*/rps_cpus; do echo 1 > "$f"; done`)
	if got := testutil.NS(t, b, "cat", "/sys/class/net/veth1/queues/rx-3/rps_cpus"); strings.Trim(strings.TrimSpace(got), "0,") != "1" {
		t.Fatalf("rx-3 rps_cpus %q, want CPU 0 alone", got)
	}
	must(t, "--netns", a, "apply", "-q", writePolicy(t, "p.yaml", policyFor("veth0", "    egress:\n      backend: edt\n      rate: 40mbit\n")))
	sink, err := testutil.TCPSink(b, "10.9.0.2", 5300)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	infos, err := testutil.TCPSend(a, "10.9.0.2", 5300, 8, 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var sent uint64
	for i, in := range infos {
		t.Logf("flow %d: %d bytes acked, reord_seen %d, retransmitted segments %d, reordering %d", i, in.BytesAcked, in.ReordSeen, in.TotalRetrans, in.Reordering)
		sent += in.BytesAcked
		if in.ReordSeen != 0 || in.TotalRetrans != 0 {
			t.Errorf("flow %d: reord_seen %d, retransmitted %d: reordered or dropped", i, in.ReordSeen, in.TotalRetrans)
		}
	}
	if rate := float64(sent) * 8 / 6; rate < 0.85*40e6 || rate > 1.0*40e6 {
		t.Errorf("8 flows delivered %.2f Mbit/s under a 40mbit cap", rate/1e6)
	}
}

// TestEDTThousandHosts: a per_host class of 1,022 hosts, each capped at
// 2mbit, on ingress (an ISP's download: the senders are elsewhere, and
// the shaper forwards). Five sampled hosts, each sent 2 TCP flows at
// once, are each measured (show, wire bytes) over two windows of 4 s
// and over the whole span from the reading before them to the last (11
// s and more): none above the cap by more than 5% over the span (the
// cap holds), none below 0.8 of it in both windows, and their class
// sums them. The lane's emulated machine stalls now and then: 0.88 to
// 1.00 of the cap measured there, and once a host at 0.64 in one
// window; a shaper that under-delivers does it in both. A window's
// ends are read with the dump of 1,024 classes, which the emulated
// guest takes long and unevenly over: a clean-clone lane run read a
// host at 2.114 Mbit/s in one window and 1.987 in the next (a quarter
// of a second's skew in 4 s); over the span such a skew weighs a
// third as much.
func TestEDTThousandHosts(t *testing.T) {
	needFq(t)
	p := testutil.NewPair(t)
	sampled := []string{"10.20.0.10", "10.20.1.77", "10.20.2.3", "10.20.3.200", "10.20.3.254"}
	for _, h := range sampled {
		testutil.NS(t, p.A, "ip", "addr", "add", h+"/32", "dev", p.DevA)
	}
	testutil.NS(t, p.B, "ip", "route", "add", "10.20.0.0/22", "dev", p.DevB)
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    ingress:
      backend: edt
      rate: 1gbit
      default: rest
      classes:
        - name: subs
          rate: 500mbit
          match: [{dst: 10.20.0.0/22}]
          per_host: {by: dst, cidr: 10.20.0.0/22, rate: 1mbit, ceil: 2mbit}
        - name: rest
          rate: 100mbit
`))
	must(t, "--netns", p.A, "apply", "-q", pol)
	for i, h := range sampled {
		testutil.IperfServer(t, p.A, h, 5210+i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(sampled))
	for i, h := range sampled {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := testutil.Iperf(p.B, h, 5210+i, 2, 15); err != nil {
				errs <- err
			}
		}()
	}
	time.Sleep(3 * time.Second)
	s := showJSON(t, p.A)
	var windows [2]stats.Sample
	for i := range windows {
		if err := json.Unmarshal([]byte(must(t, "--netns", p.A, "show", "--json", "--interval", "4s")), &windows[i]); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := len(s.Trees[0].Classes); n != 1022+2 {
		t.Fatalf("%d classes, want 1,022 hosts, their class subs and rest", n)
	}
	// Per name, the better window (below the floor in both is the
	// shaper's), and the whole span (the cap must hold over it).
	best, span := map[string]float64{}, map[string]float64{}
	for _, w := range windows {
		for _, c := range w.Trees[0].Classes {
			best[c.Name] = max(best[c.Name], c.Measured.BitsFloat())
		}
	}
	secs := windows[1].At.Sub(s.At).Seconds()
	if secs < 8 {
		t.Fatalf("the readings span %.2f s; want the two 4 s windows and more", secs)
	}
	first := map[string]uint64{}
	for _, c := range s.Trees[0].Classes {
		first[c.Name] = c.Bytes
	}
	for _, c := range windows[1].Trees[0].Classes {
		span[c.Name] = float64(c.Bytes-first[c.Name]) * 8 / secs
	}
	if sum := best["subs"]; sum < 0.8*5*2e6 || span["subs"] > 1.05*5*2e6 {
		t.Errorf("class subs (its hosts summed) measured %.3f Mbit/s in its better window, %.3f over %.1f s; five hosts at 2mbit are 10", sum/1e6, span["subs"]/1e6, secs)
	}
	for _, h := range sampled {
		var ms []string
		for _, w := range windows {
			for _, c := range w.Trees[0].Classes {
				if c.Name == "subs/"+h {
					ms = append(ms, fmt.Sprintf("%.3f", c.Measured.BitsFloat()/1e6))
				}
			}
		}
		t.Logf("host %s: %s Mbit/s in the two windows, %.3f over %.1f s (cap 2mbit)", h, strings.Join(ms, ", "), span["subs/"+h]/1e6, secs)
		if m := best["subs/"+h]; m < 0.8*2e6 || span["subs/"+h] > 1.05*2e6 {
			t.Errorf("host %s measured %s Mbit/s in the two windows, %.3f over %.1f s, against its 2mbit cap: above by more than 5%% over the span, or below 0.8 of it in both windows", h, strings.Join(ms, ", "), span["subs/"+h]/1e6, secs)
		}
	}
}

// TestEDTProdLatency: seed 000's prod/nonprod split. While 8 nonprod TCP
// flows saturate their aggregate on an 8-queue veth, a prod UDP echo
// (its own aggregate, its own queues under mqprio or mq) keeps its
// idle latency: within 20% of idle at the median, plus a millisecond
// for the emulated machine's own scheduling when it is busy.
func TestEDTProdLatency(t *testing.T) {
	needFq(t)
	a, b := shardedPair(t, 8, 0)
	must(t, "--netns", a, "apply", "-q", writePolicy(t, "p.yaml", policyFor("veth0", `    egress:
      backend: edt
      rate: 100mbit
      default: nonprod
      classes:
        - name: prod
          rate: 20mbit
          ceil: 50mbit
          prio: 0
          match: [{proto: udp, dport: 7000}]
        - name: nonprod
          rate: 10mbit
          ceil: 10mbit
          prio: 3
`)))
	echo, err := testutil.UDPEchoServer(b, "10.9.0.2", 7000)
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	measure := func() (time.Duration, time.Duration) {
		rtts, lost, err := testutil.UDPEchoRTTs(a, "10.9.0.2", 7000, 100, 10*time.Millisecond)
		if err != nil || lost > 2 {
			t.Fatalf("echo: %v, %d lost", err, lost)
		}
		return testutil.Percentile(rtts, 50), testutil.Percentile(rtts, 90)
	}
	idle50, idle90 := measure()
	testutil.IperfServer(t, b, "10.9.0.2", 5201)
	done := make(chan *testutil.IperfResult, 1)
	go func() {
		r, err := testutil.Iperf(a, "10.9.0.2", 5201, 8, 8)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	time.Sleep(2 * time.Second)
	load50, load90 := measure()
	r := <-done
	t.Logf("prod echo: idle p50 %v p90 %v; with 8 nonprod flows p50 %v p90 %v", idle50, idle90, load50, load90)
	if r != nil {
		checkGoodput(t, "nonprod 8 flows, 10mbit cap", r, 10e6)
	}
	if load50 > idle50*12/10+time.Millisecond {
		t.Errorf("prod median latency %v under nonprod load, idle %v: more than 20%% (+1 ms) above", load50, idle50)
	}
}

// TestEDTAgent: the agent keeps an EDT tree applied: a deleted fq and
// a detached pacing program are put back, and /metrics carries the
// aggregate's counters and its delay histogram under traffic.
func TestEDTAgent(t *testing.T) {
	needFq(t)
	a, b := shardedPair(t, 4, 0)
	pol := writePolicy(t, "p.yaml", policyFor("veth0", edtTwoKinds))
	ag := startAgent(t, a, pol, "--interval", "500ms")
	if _, ok := within(10*time.Second, func() bool { return strings.Count(tcShow(t, a, "qdisc", "show", "dev", "veth0"), "qdisc fq ") == 4 }); !ok {
		t.Fatalf("agent did not apply the EDT tree:\n%s", tcShow(t, a, "qdisc", "show", "dev", "veth0"))
	}
	testutil.NS(t, a, "tc", "qdisc", "del", "dev", "veth0", "parent", "1:2")
	if d, ok := within(5*time.Second, func() bool { return strings.Count(tcShow(t, a, "qdisc", "show", "dev", "veth0"), "qdisc fq ") == 4 }); !ok {
		t.Fatal("a deleted fq was not put back")
	} else {
		t.Logf("deleted fq put back in %v", d)
	}
	testutil.NS(t, a, "tc", "filter", "del", "dev", "veth0", "egress")
	if d, ok := within(5*time.Second, func() bool {
		return strings.Contains(tcShow(t, a, "filter", "show", "dev", "veth0", "egress"), "sluice-")
	}); !ok {
		t.Fatal("a detached pacing program was not put back")
	} else {
		t.Logf("detached program put back in %v", d)
	}
	sink, err := testutil.TCPSink(b, "10.9.0.2", 5201)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if _, err := testutil.TCPSend(a, "10.9.0.2", 5201, 2, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, ok := within(3*time.Second, func() bool {
		v, ok := ag.metric("sluice_edt_delay_seconds_count", `class="prod"`)
		return ok && v > 100
	}); !ok {
		_, body := ag.get("/metrics")
		t.Fatalf("no delay histogram for prod's packets:\n%s", body)
	}
	bytes, _ := ag.metric("sluice_class_sent_bytes_total", `class="prod"`)
	ceil, _ := ag.metric("sluice_class_ceil_bytes_per_second", `class="prod"`)
	if bytes < 1e6 || ceil != 100e6/8 {
		t.Fatalf("prod: %v bytes sent, ceil %v bytes/s (want its 100mbit cap)", bytes, ceil)
	}
}

// TestRefusedWithoutFq: on a kernel without fq (this project's host)
// an EDT policy is refused as bad input, located at its backend key,
// and the device keeps what it had.
func TestRefusedWithoutFq(t *testing.T) {
	if doctorJSON(t).Qdiscs["fq"] {
		t.Skip("this kernel has fq: the TestEDT tests cover the backend")
	}
	ns := devNS(t, "eth0")
	before := tcShow(t, ns, "qdisc", "show", "dev", "eth0")
	pol := writePolicy(t, "p.yaml", policyFor("eth0", edtTwoKinds))
	for _, cmd := range []string{"plan", "apply"} {
		r := sluice(t, "--netns", ns, cmd, pol)
		if r.code != 2 || !strings.Contains(r.stderr, "p.yaml:4:16: eth0 egress: backend edt needs the fq qdisc (sch_fq), which this kernel lacks") {
			t.Fatalf("%s: exit %d, stderr %q", cmd, r.code, r.stderr)
		}
	}
	if after := tcShow(t, ns, "qdisc", "show", "dev", "eth0"); after != before {
		t.Fatalf("a refused apply changed the device:\n%s\n---\n%s", before, after)
	}
}

// TestEDTVersusHTBScenario runs the lab's edt-vs-htb scenario (seed
// 001's comparison and seed 000's prod latency) at 0.6 of its length:
// its expectations are the checks, and every variant must have run.
func TestEDTVersusHTBScenario(t *testing.T) {
	needFq(t)
	dir := t.TempDir()
	r := sluice(t, "lab", "run", "edt-vs-htb", "--scale", "0.6", "--out", dir, "--name", strings.TrimPrefix(testutil.Unique("evh"), testutil.Prefix))
	t.Logf("%s", r.stdout)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for _, v := range []string{"HTB-IFB", "EDT-IFB", "EDT-PROD"} {
		if !strings.Contains(r.stdout, v) {
			t.Errorf("variant %s did not run", v)
		}
	}
}

// TestEDTKilledApplyIsRecovered: an EDT apply (mqprio or mq with four
// fq on egress, an 8-queue ifb on ingress, two programs) killed before
// its first writes, its last, three between, and at its journal and
// commit (every write took 4 minutes of the lane's emulated machine, and
// found nothing more), is completed
// by the next plain apply (or undone by a reset) to exactly the state an
// undisturbed apply makes.
func TestEDTKilledApplyIsRecovered(t *testing.T) {
	needFq(t)
	pol := writePolicy(t, "edt-crash.yaml", policyFor("eth0", edtTwoKinds+"    ingress:\n      backend: edt\n      rate: 50mbit\n"))
	ref := multiQueueNS(t)
	pristine := kernelState(t, ref)
	out := must(t, "--netns", ref, "apply", "-q", pol)
	m := writesRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("apply: %s", out)
	}
	var total int
	fmt.Sscan(m[1], &total)
	want := kernelState(t, ref)
	if strings.Count(want, "qdisc fq ") != 4+8 {
		t.Fatalf("reference tree:\n%.3000s", want)
	}
	must(t, "--netns", ref, "reset", "--all")
	sameState(t, "reference reset", pristine, kernelState(t, ref))
	faults := []string{"kill-at=after-journal", "kill-at=before-commit"}
	// The first writes, the middle and the last: each point costs
	// 10-15 s in the emulated lane (the HTB tree is killed at every
	// write on the host, TestKilledApplyIsRecovered).
	for _, k := range []int{1, 3, total / 2, total - 1, total} {
		faults = append(faults, fmt.Sprintf("kill-at-write=%d", k))
	}
	for i, fault := range faults {
		t.Run(fault, func(t *testing.T) {
			ns := multiQueueNS(t)
			if r := killed(t, fault, "--netns", ns, "apply", "-q", pol); r.code != -1 {
				t.Fatalf("the apply was not killed (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
			}
			if i%4 == 3 {
				must(t, "--netns", ns, "reset", "--all")
				sameState(t, "reset after the kill", pristine, kernelState(t, ns))
				return
			}
			if r := sluice(t, "--netns", ns, "apply", "-q", pol); r.code != 0 {
				t.Fatalf("apply after the kill: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
			sameState(t, "apply after the kill", want, kernelState(t, ns))
			if out := must(t, "--netns", ns, "plan", pol); strings.TrimSpace(out) != "no changes" {
				t.Fatalf("plan after recovery:\n%.1000s", out)
			}
		})
	}
}

// TestEDTSharingController: the sharing controller on an EDT tree. Two
// nonprod aggregates of weights 1 and 3 are flooded over UDP past a
// 20mbit direction; the agent sees their packets held back (delays at
// their caps, horizon drops) and writes caps of 5 and 15mbit into their
// targets, which then pace them there. While it runs those caps are its
// state, not drift; once it is killed, apply puts the policy's back.
func TestEDTSharingController(t *testing.T) {
	needFq(t)
	a, _ := shardedPair(t, 4, 0)
	pol := writePolicy(t, "p.yaml", policyFor("veth0", `    egress:
      backend: edt
      rate: 20mbit
      default: b
      sharing: {mode: controller, quantum: 500ms}
      classes:
        - {name: a, rate: 100kbit, prio: 1, weight: 1, match: [{proto: udp, dport: 9001}]}
        - {name: b, rate: 100kbit, prio: 1, weight: 3, match: [{proto: udp, dport: 9002}]}
`))
	ag := startAgent(t, a, pol, "--interval", "500ms")
	// Each port offered a fifth to a half more than its cap, so what it
	// sends is its cap and not the generator's pace (the lane's emulated
	// CPUs fall short of a pace now and then). At 20 Mbit/s each, 40 in
	// all, a slow CI machine's guest sent b 11.75 Mbit/s of its 15.
	stopA := udpFlood(t, a, "10.9.0.2", 8e6, 9001)
	stopB := udpFlood(t, a, "10.9.0.2", 18e6, 9002)
	stopFlood := func() { stopA(); stopB() }
	defer stopFlood()
	limits := func() map[string]float64 {
		m := map[string]float64{}
		for _, sh := range ag.status().Sample.Trees[0].Sharing {
			if sh.Applied {
				m[sh.Class] = sh.Limit.BitsFloat()
			}
		}
		return m
	}
	// The reference's split: each class's 100kbit rate, and the other
	// 19.8mbit by the weights 1:3.
	took, ok := within(15*time.Second, func() bool {
		l := limits()
		return l["a"] == 5.05e6 && l["b"] == 14.95e6
	})
	if !ok {
		t.Fatalf("limits %v after 15 s, want a 5.05mbit and b 14.95mbit\n%s", limits(), must(t, "--netns", a, "show"))
	}
	t.Logf("caps in force %.1f s after the flood began", took.Seconds())
	time.Sleep(time.Second)
	rates, took := classRates(func() *stats.Sample { return ag.status().Sample }, 3*time.Second)
	rate := func(class string) float64 { return rates[class] }
	t.Logf("sent over %.1f s: a %.2f, b %.2f Mbit/s (limits %v)", took.Seconds(), rate("a")/1e6, rate("b")/1e6, limits())
	if m := rate("a"); !(m >= 4.25e6 && m <= 5.5e6) {
		t.Errorf("a sends %.2f Mbit/s under its 5mbit cap", m/1e6)
	}
	if m := rate("b"); !(m >= 12.75e6 && m <= 16.5e6) {
		t.Errorf("b sends %.2f Mbit/s under its 15mbit cap", m/1e6)
	}
	if v, _ := ag.metric("sluice_drift_repairs_total"); v != 0 {
		t.Errorf("the agent repaired its own caps %v times", v)
	}
	if out := must(t, "--netns", a, "plan", pol); !strings.Contains(out, "no changes") {
		t.Errorf("plan while the controller runs:\n%s", out)
	}
	stopFlood()
	ag.stop(syscall.SIGKILL)
	if out := must(t, "--netns", a, "plan", "--tc", pol); !strings.Contains(out, "bpf classifier") {
		t.Errorf("plan after the agent stopped does not put the policy's caps back:\n%s", out)
	}
	must(t, "--netns", a, "apply", pol)
	if out := must(t, "--netns", a, "plan", pol); !strings.Contains(out, "no changes") {
		t.Errorf("plan after apply:\n%s", out)
	}
}

// classRates is what each class sent (bits/s) over window, from two
// readings of the kernel's counters (not one pass's rate), and the span
// measured.
func classRates(read func() *stats.Sample, window time.Duration) (map[string]float64, time.Duration) {
	bytes := func() (time.Time, map[string]float64) {
		s := read()
		m := map[string]float64{}
		for _, tr := range s.Trees {
			for _, c := range tr.Classes {
				m[c.Name] = float64(c.Bytes)
			}
		}
		return s.At, m
	}
	t0, b0 := bytes()
	time.Sleep(window)
	t1, b1 := bytes()
	out := map[string]float64{}
	for k, v := range b1 {
		out[k] = (v - b0[k]) * 8 / t1.Sub(t0).Seconds()
	}
	return out, t1.Sub(t0)
}

// replaceFile writes a file as editors and provisioning tools do: a new
// file renamed over the old one, so that no reader sees it half written.
func replaceFile(t *testing.T, file, content string) {
	t.Helper()
	tmp := file + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

// A hosts_file edit that changes one subscriber's cap, of 1,000 on an
// EDT tree, is taken by the agent in place: the one entry is written
// (no plan of the 1,000 hosts, no reload), the new cap holds on real
// traffic, and plan agrees with the kernel after. An edit Load would
// refuse is refused the same way and changes nothing; one that adds a
// host takes the full reload.
func TestEDTAgentEditsHostsInPlace(t *testing.T) {
	needFq(t)
	a, _ := shardedPair(t, 4, 0)
	pol := writePolicy(t, "p.yaml", policyFor("veth0", `    egress:
      backend: edt
      rate: 200mbit
      default: rest
      classes:
        - {name: subs, rate: 100mbit, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 50mbit}
`))
	hosts := filepath.Join(filepath.Dir(pol), "hosts.csv")
	csv := func(peer string, extra bool) string {
		var b strings.Builder
		b.WriteString("name,addresses,rate,ceil\n")
		for i := range 999 {
			fmt.Fprintf(&b, "s%d,10.20.%d.%d,1mbit,10mbit\n", i, i/250, i%250+1)
		}
		fmt.Fprintf(&b, "peer,10.9.0.2,%s\n", peer)
		if extra {
			b.WriteString("late,10.30.0.1,1mbit,10mbit\n")
		}
		return b.String()
	}
	replaceFile(t, hosts, csv("1mbit,4mbit", false))
	ag := startAgent(t, a, pol, "--interval", "10s")
	stop := udpFlood(t, a, "10.9.0.2", 20e6, 9001)
	defer stop()
	time.Sleep(time.Second)
	// Read from the kernel: the agent's own reading is up to 10 s old.
	show := func() *stats.Sample {
		var s stats.Sample
		if err := json.Unmarshal([]byte(must(t, "--netns", a, "show", "--json", "--local", "--interval", "0")), &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	before, _ := classRates(show, 2*time.Second)

	replaceFile(t, hosts, csv("1mbit,12mbit", false))
	if _, ok := within(5*time.Second, func() bool { v, _ := ag.metric("sluice_host_edits_total"); return v == 1 }); !ok {
		t.Fatalf("the edit was not taken in place within 5 s:\n%s", ag.Log())
	}
	if strings.Contains(ag.Log(), "policy reloaded") {
		t.Errorf("a cap change reloaded the policy in full:\n%s", ag.Log())
	}
	for _, l := range strings.Split(ag.Log(), "\n") {
		if strings.Contains(l, "hosts edited in place") {
			t.Logf("agent: %s", l)
		}
	}
	time.Sleep(time.Second)
	after, _ := classRates(show, 2*time.Second)
	t.Logf("peer sent %.2f Mbit/s capped at 4mbit, %.2f Mbit/s at 12mbit", before["subs/peer"]/1e6, after["subs/peer"]/1e6)
	if r := before["subs/peer"]; !(r >= 3.4e6 && r <= 4.4e6) {
		t.Errorf("peer at 4mbit sent %.2f Mbit/s", r/1e6)
	}
	if r := after["subs/peer"]; !(r >= 10.2e6 && r <= 13.2e6) {
		t.Errorf("peer at 12mbit sent %.2f Mbit/s", r/1e6)
	}
	if out := must(t, "--netns", a, "plan", pol); !strings.Contains(out, "no changes") {
		t.Errorf("plan after the edit in place:\n%s", out)
	}

	// Refused as a reload refuses it: the cap in force stays.
	replaceFile(t, hosts, csv("20mbit,12mbit", false))
	var health agent.Health
	if _, ok := within(5*time.Second, func() bool { health = ag.status().Health; return health.ReloadError != "" }); !ok {
		t.Fatalf("a ceil below the rate was not refused:\n%s", ag.Log())
	}
	if want := "hosts.csv:1001:1: hosts file: host peer: ceil 12mbit is below rate 20mbit"; !strings.Contains(health.ReloadError, want) {
		t.Errorf("refusal %q, want it to say %q", health.ReloadError, want)
	}
	replaceFile(t, hosts, csv("1mbit,12mbit", true))
	if _, ok := within(10*time.Second, func() bool { return strings.Contains(ag.Log(), "policy reloaded") }); !ok {
		t.Fatalf("a host added did not reload the policy:\n%s", ag.Log())
	}
	if _, ok := within(5*time.Second, func() bool { return ag.status().Health.ReloadError == "" }); !ok {
		t.Errorf("reload error stays: %s", ag.status().Health.ReloadError)
	}
	stop()
	if out := must(t, "--netns", a, "plan", pol); !strings.Contains(out, "no changes") {
		t.Errorf("plan after the reload:\n%s", out)
	}
	if v, _ := ag.metric("sluice_host_edits_total"); v != 1 {
		t.Errorf("host edits %v, want 1", v)
	}
}

// TestEDTHostsPrioColumn: a hosts file's prio column on an EDT tree
// (what a pod's sluice.io/priority becomes): a host at prio 0 is prod,
// the others nonprod, as applied and read back (a second plan finds
// nothing to change); a prio edited in the file is a change the next
// plan shows and apply makes.
func TestEDTHostsPrioColumn(t *testing.T) {
	needFq(t)
	a, _ := shardedPair(t, 8, 0)
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts.csv")
	write := func(csv string) {
		if err := os.WriteFile(hosts, []byte(csv), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("name,addresses,rate,ceil,prio\nvoice,10.9.0.10,10mbit,20mbit,0\nbulk,10.9.0.11,10mbit,50mbit,\n")
	pol := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pol, []byte(policyFor("veth0", `    egress:
      backend: edt
      rate: 100mbit
      default: rest
      classes:
        - {name: subs, rate: 80mbit, prio: 3, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 20mbit, prio: 3}
`)), 0o644); err != nil {
		t.Fatal(err)
	}
	prios := func() map[string]uint32 {
		m := map[string]uint32{}
		for _, tr := range showJSON(t, a).Trees {
			for _, c := range tr.Classes {
				if strings.HasPrefix(c.Name, "subs/") {
					m[c.Name] = c.Prio
				}
			}
		}
		return m
	}
	must(t, "--netns", a, "apply", "-q", pol)
	if out := must(t, "--netns", a, "plan", pol); strings.TrimSpace(out) != "no changes" {
		t.Fatalf("second plan: %s", out)
	}
	if got := fmt.Sprint(prios()); got != "map[subs/bulk:1 subs/voice:0]" {
		t.Fatalf("prios %s, want voice prod (0), bulk nonprod (1)", got)
	}
	write("name,addresses,rate,ceil,prio\nvoice,10.9.0.10,10mbit,20mbit,0\nbulk,10.9.0.11,10mbit,50mbit,0\n")
	if out := must(t, "--netns", a, "plan", pol); strings.TrimSpace(out) == "no changes" {
		t.Fatal("a prio edited: the plan finds nothing to change")
	}
	must(t, "--netns", a, "apply", "-q", pol)
	if out := must(t, "--netns", a, "plan", pol); strings.TrimSpace(out) != "no changes" {
		t.Fatalf("plan after the edit: %s", out)
	}
	if got := fmt.Sprint(prios()); got != "map[subs/bulk:0 subs/voice:0]" {
		t.Fatalf("after the edit: prios %s, want both prod", got)
	}
}
