package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
	"sluice/lab"
	"sluice/testutil"
)

// rate: auto, end to end: the agent behind an 8 Mbit/s modem with
// 300 ms of buffer, a base of 16mbit. Under an upload its controller
// reads the modem's queue in the reflectors' replies and brings the
// rate down to what the modem carries, and the kernel's root class
// holds what it decided; idle, the rate drifts back up toward the
// base; a reflector that stops answering is replaced by the spare; all
// of them silent, the rate holds. Status and metrics show each of it.
func TestAgentAutoRate(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	testutil.Quiet(t)
	t.Setenv("SLUICE_STATE_DIR", stateDir(t))
	name := strings.TrimPrefix(testutil.Unique("ar"), testutil.Prefix)
	b, err := lab.Up(name, lab.Topology{Modem: lab.Modem{Up: "8mbit", Down: "100mbit", Buffer: "300ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Down() })
	// Three more reflectors on the server, beyond the modem as the
	// Internet is (the router's default route): three pinged, one spare.
	refl := []string{lab.Server4.String(), "198.51.100.3", "198.51.100.4", "198.51.100.5"}
	for _, a := range refl[1:] {
		testutil.NS(t, b.Server, "ip", "addr", "add", a+"/32", "dev", "lo")
	}
	testutil.NS(t, b.Router, "ip", "route", "add", "198.51.100.0/24", "via", lab.Server4.String(), "dev", "wan")
	for _, a := range refl {
		if _, err := testutil.Ping(b.Router, a, 1, 100*time.Millisecond); err != nil {
			t.Fatalf("reflector %s does not answer the router: %v", a, err)
		}
	}
	pol := writePolicy(t, "auto.yaml", fmt.Sprintf(`interfaces:
  - name: wan
    egress:
      rate: auto
      auto: {min: 2mbit, base: 16mbit, max: 24mbit, reflectors: [%s], delay_threshold: 10ms}
      default: bulk
      classes:
        - {name: interactive, rate: 10%%, prio: 0, match: [{dport: 22}]}
        - {name: bulk, rate: 90%%, prio: 1, leaf: bfifo}
`, strings.Join(refl, ", ")))
	a := startAgent(t, b.Router, pol, "--interval", "500ms")
	auto := func() agent.AutoStatus {
		t.Helper()
		st := a.status()
		if len(st.Autorate) != 1 {
			t.Fatalf("status: %d autorate entries, want 1", len(st.Autorate))
		}
		return st.Autorate[0]
	}
	mbit := func(bytes uint64) float64 { return float64(bytes) * 8 / 1e6 }
	if s := auto(); s.Device != "wan" || s.Direction != "egress" || mbit(s.RateBytesPerSecond) != 16 || s.Probe != "echo" ||
		s.ThresholdSeconds != 0.010 || s.ThresholdAuto {
		t.Fatalf("at the start: %+v; want wan egress at the base 16mbit, probing with echo, the threshold 10 ms as written", s)
	}

	// An upload: the modem's queue fills, the rate comes down.
	sink, err := testutil.TCPSink(b.Server, lab.Server4.String(), 5201)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	stop := make(chan struct{})
	sent := make(chan error, 1)
	client := b.Clients[0]
	go func() { _, err := testutil.TCPSendUntil(client, lab.Server4.String(), 5201, 4, stop); sent <- err }()
	// The rules probe above the capacity until the delay answers: the
	// rate is a sawtooth around what the modem carries. Its mean over
	// the last 4 s of 14 must lie near it, the root class hold what the
	// agent wrote, and the modem's queue stay short.
	time.Sleep(10 * time.Second)
	var rates []float64
	var loaded agent.AutoStatus
	rootOK := false
	for i := 0; i < 8; i++ {
		s1 := auto()
		root := rootRate(t, b.Router)
		s2 := auto()
		for _, w := range []uint64{s1.WrittenBytesPerSecond, s2.WrittenBytesPerSecond} {
			if w > 0 && root > 0.995*float64(w) && root < 1.005*float64(w) {
				rootOK = true
			}
		}
		rates = append(rates, mbit(s2.RateBytesPerSecond))
		loaded = s2
		time.Sleep(500 * time.Millisecond)
	}
	// The router's own ping skips the tree as the probes do: it sees
	// the modem's queue alone.
	rtt, perr := testutil.Ping(b.Router, lab.Server4.String(), 20, 100*time.Millisecond)
	// The probes went to HTB's direct queue, past bulk's full bfifo.
	if direct := directPackets(t, b.Router, "wan"); direct < 100 {
		t.Errorf("HTB's direct queue passed %d packets; the probes (20 a second) must skip the tree", direct)
	}
	close(stop)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	mean := testutil.Mean(rates)
	t.Logf("under load: rates %.2f (mean %.2f Mbit/s), ping %v; %+v", rates, mean, rtt, loaded)
	if mean > 8.8 || mean < 5 {
		t.Errorf("under an upload through an 8 Mbit/s modem the rate averages %.2f Mbit/s; want about the modem's (5 to 8.8)", mean)
	}
	if !rootOK {
		t.Errorf("the root class never held what the agent wrote: the decisions do not reach the kernel")
	}
	if perr != nil || rtt > 60*time.Millisecond {
		t.Errorf("ping under load %v (%v); want under 60 ms: the unshaped modem queues 300 ms", rtt, perr)
	}
	for _, r := range loaded.Reflectors {
		if r.Active && r.BaselineSeconds <= 0 {
			t.Errorf("reflector %s has no baseline", r.Addr)
		}
	}
	if out := must(t, "--netns", b.Router, "show"); !strings.Contains(out, "rate: auto wan egress: ") || !strings.Contains(out, "of 4 reflectors pinged (echo)") ||
		!strings.Contains(out, "threshold 10.0 ms,") {
		t.Errorf("show does not print rate: auto's state:\n%s", out)
	}
	if v, ok := a.metric("sluice_autorate_rate_bytes_per_second", `device="wan"`, `direction="egress"`); !ok || v <= 0 {
		t.Errorf("metric sluice_autorate_rate_bytes_per_second: %v %v", v, ok)
	}
	if v, ok := a.metric("sluice_autorate_threshold_seconds", `device="wan"`, `direction="egress"`); !ok || v != 0.010 {
		t.Errorf("metric sluice_autorate_threshold_seconds: %v %v; want 0.010", v, ok)
	}

	// Idle: the rate drifts back toward the base, 1% a second. Idle
	// from 2 s after the load: the modem's queue has drained by then, and
	// the samples that showed it have left the controller's window (the
	// decisions on them hold the rate: TestLoadEndingHoldsTheRate).
	// The drift is measured from the first reading that says idle (or
	// low): a queue slow to drain (a busy machine's) keeps the window's
	// samples over the threshold for a while, and a decision on them
	// may still lower the rate (one CI run: 8.21 to 8.17 Mbit/s in the
	// 5 s after a reading taken while they did).
	time.Sleep(2 * time.Second)
	quiet := auto()
	for end := time.Now().Add(5 * time.Second); quiet.State != "idle" && quiet.State != "low" && time.Now().Before(end); quiet = auto() {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(5 * time.Second)
	idle := auto()
	if float64(idle.RateBytesPerSecond) < 1.03*float64(quiet.RateBytesPerSecond) || (idle.State != "idle" && idle.State != "low") {
		t.Errorf("idle for 5 s: %s at %.2f Mbit/s, from %.2f (%s); want idle and up by 1%% a second", idle.State, mbit(idle.RateBytesPerSecond), mbit(quiet.RateBytesPerSecond), quiet.State)
	}

	// Every reflector answered: none was replaced. The modem's full
	// buffer drops probes too under load; those are the queue's, not
	// the reflectors' (one CI run replaced one for them, and the spare
	// then had nothing left to show).
	if s := auto(); s.Replaced != 0 {
		t.Errorf("a reflector was replaced before any stopped answering: %+v", s)
	}

	// One reflector goes silent: the spare replaces it.
	testutil.NS(t, b.Server, "ip", "addr", "del", refl[1]+"/32", "dev", "lo")
	deadline := time.Now().Add(8 * time.Second)
	for {
		s := auto()
		act := map[string]bool{}
		for _, r := range s.Reflectors {
			act[r.Addr] = r.Active
		}
		if s.Replaced >= 1 && !act[refl[1]] && act[refl[3]] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a silent reflector not replaced in 8 s: %+v", s)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v, ok := a.metric("sluice_autorate_reflectors_replaced_total", `device="wan"`); !ok || v < 1 {
		t.Errorf("metric sluice_autorate_reflectors_replaced_total: %v %v", v, ok)
	}

	// All of them silent: the rate holds, and the state says why.
	testutil.NS(t, b.Server, "sysctl", "-qw", "net.ipv4.icmp_echo_ignore_all=1")
	time.Sleep(3 * time.Second)
	before := auto()
	time.Sleep(3 * time.Second)
	after := auto()
	if after.State != "stall" && after.State != "no-replies" {
		t.Errorf("no reflector answers: state %s, want stall or no-replies", after.State)
	}
	if after.RateBytesPerSecond != before.RateBytesPerSecond {
		t.Errorf("no reflector answers: the rate moved from %.3f to %.3f Mbit/s; it must hold", mbit(before.RateBytesPerSecond), mbit(after.RateBytesPerSecond))
	}
}

// rootRate reads the wan tree's root class rate (bytes/s) with show.
func rootRate(t *testing.T, ns string) float64 {
	t.Helper()
	out := must(t, "--netns", ns, "show", "--json", "--local", "--interval", "0")
	i := strings.Index(out, `"name": "(root)"`)
	if i < 0 {
		t.Fatalf("show: no root class\n%s", out)
	}
	var rate float64
	rest := out[i:]
	j := strings.Index(rest, `"rate_bytes_per_second": `)
	if j < 0 {
		t.Fatalf("show: no rate\n%s", out)
	}
	fmt.Sscanf(rest[j+len(`"rate_bytes_per_second": `):], "%g", &rate)
	return rate
}

// directPackets reads HTB's direct_packets_stat on dev.
func directPackets(t *testing.T, ns, dev string) int {
	t.Helper()
	out := testutil.NS(t, ns, "tc", "qdisc", "show", "dev", dev, "root")
	i := strings.Index(out, "direct_packets_stat ")
	if i < 0 {
		t.Fatalf("no direct_packets_stat in %q", out)
	}
	var n int
	fmt.Sscanf(out[i+len("direct_packets_stat "):], "%d", &n)
	return n
}

// The variable-rate scenario's rate: auto variant: a link whose
// capacity moves every 10 s, bulk TCP both ways. Its expectations pass
// (docs/autorate.md says what they hold and what is not met yet), and
// the report carries both controllers' series: the rate follows the
// modem's line rate down and up. In the stock-kernel lane (an emulated
// guest) the same at a fifth of the upload's rates and a tenth of the
// download's, beside the unshaped reference
// (testdata/variable-rate-lane.yaml).
func TestVariableRateScenario(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	testutil.Quiet(t)
	dir := t.TempDir()
	scenario, variants, want, scale := "variable-rate", "auto", 28, 1.0
	downScale := scale
	if os.Getenv("SLUICE_EMULATED") == "1" {
		scenario, variants, want, scale, downScale = "testdata/variable-rate-lane.yaml", "unshaped,auto", 15, 0.2, 0.1
	}
	// A run that misses is run once more, and the second must pass. Under
	// emulation the guest stalls now and then on a busy machine (a CI
	// run's fast phase passed 2.9 and 3.8 Mbit/s in seconds where the
	// shaper let 14 to 20 through, then read the stall as the line's
	// capacity; its unshaped TCP carried 8.6 of the 20). On the host, in
	// about one run of eight (one of eight here on 2026-12-03, and one
	// clean-clone CI run), the download's HTB on the ifb passes 0.87 to
	// 0.91 of its rate by its own counters for the whole run, its bfifo
	// full and dropping: the controller, which grows only while what
	// passes is 90% of the rate, then held 50 of the fast phase's 100
	// Mbit/s, and the rise carried 0.58 and 0.66 of its line
	// (docs/autorate.md, What was measured). A controller that follows
	// the line wrongly does it twice.
	const tries = 2
	var (
		r   result
		res variableRateResult
	)
	for try := 1; ; try++ {
		r = sluice(t, "lab", "run", scenario, "--variant", variants, "--out", dir, "--name", strings.TrimPrefix(testutil.Unique("vr"), testutil.Prefix))
		t.Logf("%s", r.stdout)
		var failed []string
		for _, line := range strings.Split(r.stdout, "\n") {
			if strings.HasPrefix(line, "FAIL  ") {
				failed = append(failed, line)
			}
		}
		res = readVariableRate(t, dir)
		n := strings.Count(r.stdout, "PASS  ")
		if n == want && r.code == 0 && len(failed) == 0 {
			break
		}
		// What each controller did, a line a second, to tell a slow
		// decision from a stall or a bed that lost time.
		trace := res.trace()
		if try < tries {
			t.Logf("run %d of %d: exit %d, %d expectations passed, want %d: running it again\n%s\n%s", try, tries, r.code, n, want, strings.Join(failed, "\n"), trace)
			continue
		}
		for _, line := range failed {
			t.Errorf("%s", line)
		}
		t.Fatalf("exit %d, %d expectations passed, want %d\n%s\n%s", r.code, n, want, r.stderr, trace)
	}
	if res.Variant != "auto" {
		t.Fatalf("the last variant is %q, want auto", res.Variant)
	}
	// The rate's mean over each loaded phase's last 5 s, against the
	// modem's line rate: it must follow it down and back up.
	mean := func(rates []float64, from, to float64) float64 {
		var s float64
		n := 0
		for i := int(from / res.Bucket); i < int(to/res.Bucket) && i < len(rates); i++ {
			s += rates[i]
			n++
		}
		return s / float64(max(n, 1))
	}
	lines := map[string][]float64{"wan": {20e6, 8e6, 15e6, 8e6}, "ifb-wan": {100e6, 40e6, 80e6, 20e6}}
	scales := map[string]float64{"wan": scale, "ifb-wan": downScale}
	for dev, l := range lines {
		for i := range l {
			l[i] *= scales[dev]
		}
	}
	if len(res.Autorate) != 2 {
		t.Fatalf("%d autorate series, want 2 (wan, ifb-wan)", len(res.Autorate))
	}
	for _, a := range res.Autorate {
		line, ok := lines[a.Device]
		if !ok {
			t.Fatalf("a series for %s", a.Device)
		}
		for i, c := range line {
			m := mean(a.Rate, float64(i*10+5), float64(i*10+10))
			if m < 0.6*c || m > 1.2*c {
				t.Errorf("%s, phase %d: the rate averaged %.1f Mbit/s over the link's %.0f", a.Device, i+1, m/1e6, c/1e6)
			}
		}
	}
}

// variableRateResult is the last variant's result in a variable-rate
// run's report.json: its controllers' series.
type variableRateResult struct {
	Variant  string  `json:"variant"`
	Bucket   float64 `json:"bucket_s"`
	Autorate []struct {
		Device string    `json:"device"`
		Rate   []float64 `json:"rate_bps"`
		Passed []float64 `json:"passed_bps"`
		Delay  []float64 `json:"delay_ms"`
		State  []string  `json:"state"`
	} `json:"autorate"`
}

func readVariableRate(t *testing.T, dir string) variableRateResult {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []variableRateResult `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Results) == 0 {
		t.Fatalf("report.json: %v", err)
	}
	return rep.Results[len(rep.Results)-1]
}

// trace is what each controller did, a line a second.
func (res variableRateResult) trace() string {
	var tl strings.Builder
	for _, a := range res.Autorate {
		fmt.Fprintf(&tl, "%s: second, rate / passed Mbit/s, delay ms, state\n", a.Device)
		step := max(int(1/max(res.Bucket, 1e-3)), 1)
		for i := 0; i < len(a.Rate); i += step {
			at := func(v []float64) float64 {
				if i < len(v) {
					return v[i]
				}
				return 0
			}
			st := ""
			if i < len(a.State) {
				st = a.State[i]
			}
			fmt.Fprintf(&tl, "  %3.0f  %6.1f / %6.1f  %6.1f  %s\n", float64(i)*res.Bucket, at(a.Rate)/1e6, at(a.Passed)/1e6, at(a.Delay), st)
		}
	}
	return tl.String()
}

// delay_threshold: auto, the default, end to end: on the lab's path
// (veths, no jitter to speak of) the threshold comes down from where it
// starts (50 ms) to its floor within seconds: 15 ms while an upload and
// a download share one echo prober (each sees the other's queue in half
// the round trip), 5 ms for a direction alone on its prober, as after
// the download moves to timestamps (a SIGHUP). Status, show and the
// metric say which, and that it is automatic.
func TestAgentAutoThreshold(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.Quiet(t)
	t.Setenv("SLUICE_STATE_DIR", stateDir(t))
	name := strings.TrimPrefix(testutil.Unique("at"), testutil.Prefix)
	b, err := lab.Up(name, lab.Topology{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Down() })
	src := func(ingressProbe string) string {
		return fmt.Sprintf(`interfaces:
  - name: wan
    egress:
      rate: auto
      auto: {min: 2mbit, base: 16mbit, max: 24mbit, reflectors: [%[1]s]}
      default: bulk
      classes:
        - {name: bulk, rate: 100%%}
    ingress:
      rate: auto
      auto: {min: 2mbit, base: 16mbit, max: 24mbit, reflectors: [%[1]s], probe: %[2]s}
      default: bulk
      classes:
        - {name: bulk, rate: 100%%}
`, lab.Server4, ingressProbe)
	}
	pol := writePolicy(t, "auto.yaml", src("echo"))
	a := startAgent(t, b.Router, pol, "--interval", "500ms")
	// thresholds waits for both directions' automatic thresholds to lie
	// in [lo, hi] seconds, and returns them.
	thresholds := func(lo, hi float64) map[string]float64 {
		t.Helper()
		got := map[string]float64{}
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			clear(got)
			ok := true
			for _, s := range a.status().Autorate {
				got[s.Direction] = s.ThresholdSeconds
				ok = ok && s.ThresholdAuto && s.ThresholdSeconds >= lo && s.ThresholdSeconds <= hi
			}
			if ok && len(got) == 2 || time.Now().After(end) {
				return got
			}
		}
	}
	// The floor exactly: the path's jitter would have to move 7.5 ms
	// from one sample to the next to lift it.
	if got := thresholds(0.015, 0.015); got["egress"] != 0.015 || got["ingress"] != 0.015 {
		t.Fatalf("sharing one echo prober the thresholds are %v s; want 0.015 s each, automatic", got)
	}
	if out := must(t, "--netns", b.Router, "show"); strings.Count(out, "threshold 15.0 ms (auto)") != 2 {
		t.Errorf("show does not give both automatic thresholds:\n%s", out)
	}
	if v, ok := a.metric("sluice_autorate_threshold_seconds", `device="ifb-wan"`, `direction="ingress"`); !ok || v != 0.015 {
		t.Errorf("metric sluice_autorate_threshold_seconds for the download: %v %v; want 0.015", v, ok)
	}

	if err := os.WriteFile(pol, []byte(src("timestamp")), 0o644); err != nil {
		t.Fatal(err)
	}
	a.cmd.Process.Signal(syscall.SIGHUP)
	// The floor, or just above it on a busy machine (a test beside
	// this one moves the samples by a few ms now and then).
	if got := thresholds(0.005, 0.008); got["egress"] > 0.008 || got["ingress"] > 0.008 || got["egress"] < 0.005 || got["ingress"] < 0.005 {
		t.Fatalf("each direction alone on its prober, the thresholds are %v s; want 5 to 8 ms each, automatic", got)
	}
}
