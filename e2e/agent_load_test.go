package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sluice/agent"
	"sluice/testutil"
)

// The bounds the agent keeps under a hostile load (docs/agent.md, Under
// load): its descriptors within the HTTP server's connection limit and
// the policy's own, its memory within loadRSSMB at 10,000 hosts.
const (
	loadHosts    = 10000
	loadIdle     = 2000                // connections opened and left idle
	loadSlow     = 200                 // clients that ask for the whole status and never read
	loadHogs     = 8                   // scrapers that never read, and clients flooding /api/v1/hosts
	loadRate     = 50                  // requests a second from well-behaved clients
	loadDuration = 30 * time.Second    // SLUICE_LOAD_SOAK for longer (make soak)
	loadFDs      = agent.MaxConns + 64 // and the agent's own (netlink, BPF, files)
	loadRSSMB    = 300
)

// TestAgentUnderLoad: at 10,000 hosts, while thousands of clients hold
// idle connections, hundreds ask for the full status and never read it,
// scrapers never read /metrics, others flood /api/v1/hosts with
// searches, and others scrape at 50 requests a second, the agent keeps its
// interval, repairs drift within two intervals, and its descriptors and
// memory stay bounded. (Before the HTTP server was bounded, 20,000 idle
// connections ran it out of descriptors and its passes failed; 200
// readers that never read took it to 1.7 GB.)
//
// With SLUICE_LOAD_SOAK (make soak) it runs that long, drift injected
// every minute, and the agent's RSS at the end must be within 20% of
// its RSS after the first minute.
func TestAgentUnderLoad(t *testing.T) {
	testutil.Slow(t)
	duration := loadDuration
	if v := os.Getenv("SLUICE_LOAD_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 2*time.Minute {
			t.Fatalf("SLUICE_LOAD_SOAK=%q: want a duration of at least 2m", v)
		}
		duration = d
	}
	ns := devNS(t, "eth0")
	dir := t.TempDir()
	var csv strings.Builder
	csv.WriteString("name,addresses,rate,ceil\n")
	for i := 0; i < loadHosts; i++ {
		fmt.Fprintf(&csv, "h%d,10.%d.%d.%d,,\n", i, 64+i>>16, i>>8&0xff, i&0xff)
	}
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(csv.String()), 0o644)
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(`interfaces:
  - name: eth0
    egress:
      rate: 10gbit
      default: rest
      classes:
        - name: voice
          rate: 100mbit
          prio: 0
          match: [{dscp: EF}]
        - name: subs
          rate: 9gbit
          per_host: {by: dst, hosts_file: hosts.csv, rate: 2mbit, ceil: 20mbit}
        - name: rest
          rate: 500mbit
`), 0o644)
	// The first pass writes 20,009 objects. How long the kernel takes
	// is no claim of this test, and varies by its build: on 6.18.44
	// fc-v509 well under a second, on fc-v1045 14 s, where creating
	// HTB classes grows with the square of their number (1,000 in 0.09
	// s, 8,000 in 5.7 s, by tc -batch alone).
	a := startAgentWithin(t, 90*time.Second, ns, pol)
	pid := a.cmd.Process.Pid
	before := a.status().Health.Reconciles
	rss0, fds0 := procRSSMB(pid), procFDs(pid)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var conns []net.Conn
	var cmu sync.Mutex
	defer func() {
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
	}()
	keep := func(c net.Conn) {
		cmu.Lock()
		conns = append(conns, c)
		cmu.Unlock()
	}
	// hold runs a client that connects, sends request (nothing: an idle
	// connection) and then never reads, for up to 35 s, again and again
	// until the load stops: the server may close it sooner.
	hold := func(request string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", a.addr, 5*time.Second)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				keep(c)
				if request == "" {
					c.Read(make([]byte, 1)) // until the server gives up on it
				} else {
					fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", request)
					select {
					case <-stop:
					case <-time.After(35 * time.Second):
					}
				}
				c.Close()
			}
		}()
	}
	// Idle connections, opened again as the server closes them; readers
	// that ask for everything and never read; scrapers that never read
	// (the in-flight slots must not be theirs); and clients flooding
	// /api/v1/hosts with searches of their own.
	for i := 0; i < loadIdle; i++ {
		hold("")
	}
	for i := 0; i < loadSlow; i++ {
		hold("/api/v1/status")
	}
	for i := 0; i < loadHogs; i++ {
		hold("/metrics")
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			client := http.Client{Timeout: 5 * time.Second}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if resp, err := client.Get(fmt.Sprintf("http://%s/api/v1/hosts?q=h%d%d&limit=1000", a.addr, i, n%1000)); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				} else {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}(i)
	}
	// Well-behaved clients.
	var ok, failed atomic.Int64
	var healthAsked, healthOK atomic.Int64
	var emu sync.Mutex
	errKinds := map[string]int{} // how /healthz failed, for the log
	wg.Add(1)
	go func() {
		defer wg.Done()
		client := http.Client{Timeout: 5 * time.Second}
		paths := []string{"/metrics", "/api/v1/status?hosts=0", "/healthz", "/api/v1/history"}
		tick := time.NewTicker(time.Second / loadRate)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			go func(p string) {
				if p == "/healthz" {
					healthAsked.Add(1)
				}
				resp, err := client.Get("http://" + a.addr + p)
				if err != nil {
					failed.Add(1)
					if p == "/healthz" {
						emu.Lock()
						k := err.Error()
						if i := strings.LastIndex(k, ": "); i >= 0 {
							k = k[i+2:]
						}
						errKinds[k]++
						emu.Unlock()
					}
					return
				}
				resp.Body.Close()
				ok.Add(1)
				if p == "/healthz" && resp.StatusCode == 200 {
					healthOK.Add(1)
				}
			}(paths[i%len(paths)])
		}
	}()

	start := time.Now()
	var rssMax, rssMinute float64
	fdsMax := 0
	var repaired atomic.Int64 // the slowest repair, ns; -1 once one was not
	drifts := 0
	nextDrift := min(duration/3, time.Minute)
	// RSS every tenth of the run: a plateau and a slow leak differ in
	// the curve's last tenths.
	var curve []string
	nextSample := time.Duration(0)
	for time.Since(start) < duration {
		time.Sleep(time.Second)
		rssMax, fdsMax = max(rssMax, procRSSMB(pid)), max(fdsMax, procFDs(pid))
		if time.Since(start) >= nextSample {
			curve = append(curve, fmt.Sprintf("%.0f", procRSSMB(pid)))
			nextSample += duration / 10
		}
		if rssMinute == 0 && time.Since(start) >= time.Minute {
			rssMinute = procRSSMB(pid)
		}
		if time.Since(start) > nextDrift {
			nextDrift += time.Minute
			drifts++
			// Drift under load: the voice class changed by hand.
			out := tcShow(t, ns, "class", "show", "dev", "eth0")
			id := classIDWithRate(out, "100Mbit")
			if id == "" {
				t.Fatalf("no 100mbit class:\n%.2000s", out)
			}
			tcShow(t, ns, "class", "change", "dev", "eth0", "parent", "1:1", "classid", id, "htb", "rate", "1mbit", "ceil", "10gbit")
			at := time.Now()
			if _, done := within(5*time.Second, func() bool {
				return classIDWithRate(tcShow(t, ns, "class", "show", "dev", "eth0"), "100Mbit") == id
			}); !done {
				repaired.Store(-1)
			} else if took := int64(time.Since(at)); repaired.Load() >= 0 && took > repaired.Load() {
				repaired.Store(took)
			}
		}
	}
	rssEnd := procRSSMB(pid)
	close(stop)
	cmu.Lock()
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	cmu.Unlock()
	wg.Wait()
	// The API may not answer while its connections are all held (that
	// is the bound); once the load is gone it does, and its count of
	// passes shows whether they kept their interval meanwhile.
	st := a.status()
	elapsed := time.Since(start)
	passes := st.Health.Reconciles - before
	worst := time.Duration(repaired.Load())
	t.Logf("under load for %v at %d hosts: %d passes, %d drifts repaired within %v, RSS %.0f -> max %.0f MB (%.0f after a minute, %.0f at the end), fds %d -> max %d, well-behaved requests %d ok, %d failed",
		duration, loadHosts, passes, drifts, worst.Round(time.Millisecond), rss0, rssMax, rssMinute, rssEnd, fds0, fdsMax, ok.Load(), failed.Load())
	t.Logf("RSS every %v (MB): %s", duration/10, strings.Join(curve, " "))
	if want := uint64(0.8 * elapsed.Seconds()); passes < want {
		t.Errorf("%d passes in %v at a 1 s interval (want at least %d): the load held the passes back", passes, elapsed.Round(time.Second), want)
	}
	if drifts == 0 || worst < 0 || worst > 2500*time.Millisecond {
		t.Errorf("a class changed by hand under load: %d drifts, the slowest repaired after %v (want within two intervals; negative: not in 5 s)", drifts, worst)
	}
	// Growth is judged on the curve, not on two readings: one reading
	// lands on a collection's peak or after it (35 minutes: the tenths
	// 115 115 115 119 115 117 111 116 102 112 MB, the last reading 138).
	if duration >= 5*time.Minute && len(curve) >= 7 {
		early, late := medianOf(curve[1:4]), medianOf(curve[len(curve)-3:])
		if late > 1.2*early {
			t.Errorf("RSS grew from a median %.0f MB early to %.0f MB at the end (more than 20%%): %s", early, late, strings.Join(curve, " "))
		}
	}
	if st.Health.LastResult == "error" {
		t.Errorf("passes failed under load: %s", st.Health.LastError)
	}
	if fdsMax > loadFDs {
		t.Errorf("%d descriptors open under load, bound %d", fdsMax, loadFDs)
	}
	if rssMax > loadRSSMB {
		t.Errorf("RSS %.0f MB under load, bound %d MB", rssMax, loadRSSMB)
	}
	if ok.Load() == 0 {
		t.Error("no well-behaved request was answered under load")
	}
	// The readiness probe is answered whatever the others hold (issue
	// 58: 260 clients that asked and never read left 0 of 10 answered).
	if asked := healthAsked.Load(); asked == 0 || float64(healthOK.Load()) < 0.8*float64(asked) {
		emu.Lock()
		t.Errorf("/healthz answered %d of %d times under load; want 80%% at least (failures: %v)", healthOK.Load(), asked, errKinds)
		emu.Unlock()
	}
}

// classIDWithRate finds the HTB class of `tc class show` with rate r.
func classIDWithRate(out, r string) string {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[1] == "htb" && strings.Contains(l, " rate "+r+" ") {
			return f[2]
		}
	}
	return ""
}

func procRSSMB(pid int) float64 { return procStatusMB(pid, "VmRSS:") }

// procStatusMB reads a size field of /proc/PID/status (VmRSS:, RssAnon:,
// RssFile:) in MB: what of the RSS is the binary's pages, and what the
// process allocated, tells a leak from code paths paged in.
func procStatusMB(pid int, field string) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func procFDs(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// medianOf is the median of numbers written as text.
func medianOf(xs []string) float64 {
	v := make([]float64, 0, len(xs))
	for _, x := range xs {
		f, _ := strconv.ParseFloat(x, 64)
		v = append(v, f)
	}
	sort.Float64s(v)
	return v[len(v)/2]
}
