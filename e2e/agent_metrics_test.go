package e2e

import (
	"encoding/json"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/testutil"
)

// udpSend sends n datagrams of size bytes from ns to addr:port at about
// rate bits/s and returns how many bytes of payload it sent.
func udpSend(t *testing.T, ns, addr string, port, n, size int, rate float64) int {
	t.Helper()
	var conn net.Conn
	if err := testutil.InNetns(ns, func() (err error) {
		conn, err = net.Dial("udp", net.JoinHostPort(addr, strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, size)
	gap := time.Duration(float64(size*8) / rate * float64(time.Second))
	start := time.Now()
	sent := 0
	for i := 0; i < n; i++ {
		if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d)
		}
		if _, err := conn.Write(buf); err == nil {
			sent += size
		}
	}
	return sent
}

// udpFlood sends 1000-byte datagrams from ns to addr at rate (bits/s)
// to each port until the returned stop is called (more than once is
// fine).
func udpFlood(t *testing.T, ns, addr string, rate float64, ports ...int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, port := range ports {
		wg.Add(1)
		go func(port int) {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				udpSend(t, ns, addr, port, int(rate/8000/4), 1000, rate) // a quarter second at a time
			}
		}(port)
	}
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// tcClassBytes reads a class's sent bytes with tc -s.
func tcClassBytes(t *testing.T, ns, dev, id string) float64 {
	t.Helper()
	out := tcShow(t, ns, "-s", "class", "show", "dev", dev, "classid", id)
	m := regexp.MustCompile(`Sent (\d+) bytes`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no counters for %s:\n%s", id, out)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// The counters on /metrics are the kernel's (tc -s agrees) and count
// what the generator sent (its payload plus UDP, IP and Ethernet
// headers), within 2%; `sluice show` prints the agent's reading and
// `sluice munin` its counters.
func TestAgentMetricsMatchTraffic(t *testing.T) {
	testutil.Slow(t)
	light(t)
	p := testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", policyFor(p.DevA, `    egress:
      rate: 20mbit
      default: other
      classes:
        - name: udp
          rate: 10mbit
          match:
            - { proto: udp, dport: 9000 }
        - name: other
          rate: 10mbit
`))
	a := startAgent(t, p.A, pol, "--interval", "500ms")
	const n, size = 3000, 1000
	payload := udpSend(t, p.A, testutil.AddrB, 9000, n, size, 8e6)
	time.Sleep(1500 * time.Millisecond) // three passes
	wire := float64(payload) * float64(size+8+20+14) / size
	got, ok := a.metric("sluice_class_sent_bytes_total", `class="udp"`, `direction="egress"`, `device="veth0"`)
	kern := tcClassBytes(t, p.A, p.DevA, "1:10")
	t.Logf("generator: %d datagrams, %.0f bytes on the wire; metrics %.0f; tc -s %.0f", n, wire, got, kern)
	if !ok || got < wire*0.98 || got > wire*1.02 {
		t.Errorf("sluice_class_sent_bytes_total %.0f, want %.0f within 2%%", got, wire)
	}
	if kern < got*0.98 || kern > got*1.02 {
		t.Errorf("tc -s says %.0f, metrics %.0f", kern, got)
	}
	if pk, _ := a.metric("sluice_class_sent_packets_total", `class="udp"`); pk < n*0.98 || pk > n*1.02 {
		t.Errorf("packets %.0f, want %d", pk, n)
	}
	if v, ok := a.metric("sluice_class_rate_bytes_per_second", `class="udp"`); !ok || v != 10e6/8 {
		t.Errorf("sluice_class_rate_bytes_per_second %v", v)
	}
	if v, ok := a.metric("sluice_class_ceil_bytes_per_second", `class="udp"`); !ok || v != 20e6/8 {
		t.Errorf("sluice_class_ceil_bytes_per_second %v", v)
	}
	if v, ok := a.metric("sluice_reconcile_total", `result="ok"`); !ok || v < 2 {
		t.Errorf("sluice_reconcile_total{result=ok} %v", v)
	}
	for _, m := range []string{"sluice_class_dropped_packets_total", "sluice_class_overlimits_total", "sluice_class_backlog_bytes",
		"sluice_apply_duration_seconds_count", "go_goroutines", "process_open_fds"} {
		if _, ok := a.metric(m); !ok {
			t.Errorf("no %s on /metrics", m)
		}
	}

	// show asks the agent: the same reading.
	out := must(t, "--netns", p.A, "show", "--json")
	var s struct {
		Trees []struct {
			Classes []struct {
				Name  string `json:"name"`
				Bytes uint64 `json:"bytes"`
			} `json:"classes"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Trees) != 1 {
		t.Fatalf("show --json: %v\n%s", err, out)
	}
	for _, c := range s.Trees[0].Classes {
		if c.Name == "udp" && (float64(c.Bytes) < got*0.98 || float64(c.Bytes) > got*1.02) {
			t.Errorf("show says %d bytes, metrics %.0f", c.Bytes, got)
		}
	}
	if text := must(t, "--netns", p.A, "show"); !strings.Contains(text, "from the sluice agent") {
		t.Errorf("show did not ask the agent:\n%s", text)
	}
	if text := must(t, "--netns", p.A, "show", "--local", "--interval", "0"); strings.Contains(text, "from the sluice agent") {
		t.Errorf("show --local asked the agent:\n%s", text)
	}

	// munin: a graph per device and direction, a DERIVE line per class,
	// values in bits.
	cfg := must(t, "--netns", p.A, "munin", "config")
	for _, want := range []string{"multigraph sluice_veth0_egress", "graph_title sluice veth0 egress", "c_udp.label udp", "c_udp.type DERIVE", "c_other.min 0"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("munin config lacks %q:\n%s", want, cfg)
		}
	}
	vals := must(t, "--netns", p.A, "munin")
	m := regexp.MustCompile(`(?m)^c_udp\.value (\d+)$`).FindStringSubmatch(vals)
	if m == nil {
		t.Fatalf("munin values:\n%s", vals)
	}
	if v, _ := strconv.ParseFloat(m[1], 64); v < got*8*0.98 || v > got*8*1.02 {
		t.Errorf("munin says %s bits, metrics %.0f bytes", m[1], got)
	}
	if r := sluice(t, "--netns", p.A, "munin", "bogus"); r.code != 2 {
		t.Errorf("munin bogus: exit %d", r.code)
	}
}
