package testutil

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"sluice/share"
)

// IperfServer starts `iperf3 -s` bound to addr:port inside ns and stops
// it when the test ends.
func IperfServer(t testing.TB, ns, addr string, port int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "iperf3", "-s", "-B", addr, "-p", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	// Wait for it to listen.
	for i := 0; i < 100; i++ {
		if exec.Command("ip", "netns", "exec", ns, "sh", "-c", fmt.Sprintf("ss -ltn | grep -q '%s:%d'", bracket(addr), port)).Run() == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("iperf3 server on %s:%d did not start", addr, port)
}

func bracket(addr string) string {
	for _, c := range addr {
		if c == ':' {
			return "[" + addr + "]"
		}
	}
	return addr
}

// IperfResult is what an iperf3 client measured.
type IperfResult struct {
	Goodput     float64   // bits per second received, summed over flows
	Flows       []float64 // per flow
	Retransmits int
}

// Iperf runs an iperf3 client in ns against addr:port with flows TCP
// streams for secs seconds (the first omitted second not counted).
func Iperf(ns, addr string, port, flows, secs int, extra ...string) (*IperfResult, error) {
	args := []string{"netns", "exec", ns, "iperf3", "-c", addr, "-p", strconv.Itoa(port), "-P", strconv.Itoa(flows),
		"-t", strconv.Itoa(secs), "-O", "1", "-J"}
	args = append(args, extra...)
	var out []byte
	var err error
	// A server is busy for a moment after its previous test, and
	// between tests iperf3 closes and reopens its listening socket, so
	// a client that comes back at once may find nobody listening (seen
	// in CI: "unable to connect to server: Connection refused"), or its
	// control connection reset before the test starts ("unable to
	// receive control message: Connection reset by peer", seen once in
	// a suite run). A client that failed before measuring anything is
	// tried again; one that failed during its test is not.
	for try := 0; try < 50; try++ {
		out, err = exec.Command("ip", args...).Output()
		if !iperfNeverStarted(out) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var r struct {
		End struct {
			Streams []struct {
				Receiver struct {
					BPS float64 `json:"bits_per_second"`
				} `json:"receiver"`
			} `json:"streams"`
			SumReceived struct {
				BPS float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		return nil, fmt.Errorf("iperf3: %v %v: %s", err, jerr, out)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("iperf3: %s", r.Error)
	}
	res := &IperfResult{Goodput: r.End.SumReceived.BPS, Retransmits: r.End.SumSent.Retransmits}
	for _, s := range r.End.Streams {
		res.Flows = append(res.Flows, s.Receiver.BPS)
	}
	return res, nil
}

// iperfNeverStarted: iperf3's JSON says it failed before its first
// interval (busy, refused, reset while setting up).
func iperfNeverStarted(out []byte) bool {
	var r struct {
		Intervals []json.RawMessage `json:"intervals"`
		Error     string            `json:"error"`
	}
	if json.Unmarshal(out, &r) != nil {
		return false
	}
	return r.Error != "" && len(r.Intervals) == 0
}

// Jain is Jain's fairness index of xs: 1 is perfectly fair.
func Jain(xs []float64) float64 { return share.Jain(xs) }

// Ping runs count pings from ns to addr every interval and returns the
// average RTT.
func Ping(ns, addr string, count int, interval time.Duration) (time.Duration, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "ping", "-n", "-q", "-c", strconv.Itoa(count),
		"-i", fmt.Sprintf("%.3f", interval.Seconds()), addr).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ping: %v: %s", err, out)
	}
	var min, avg, max, mdev float64
	for _, line := range splitLines(string(out)) {
		if n, _ := fmt.Sscanf(line, "rtt min/avg/max/mdev = %f/%f/%f/%f ms", &min, &avg, &max, &mdev); n == 4 {
			return time.Duration(avg * float64(time.Millisecond)), nil
		}
	}
	return 0, fmt.Errorf("ping: no summary in %s", out)
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// Mean of xs.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
