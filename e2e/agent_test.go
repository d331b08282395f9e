package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
)

// The agent tests share this harness: a `sluice agent` started in a test
// namespace, its HTTP API and metrics read, its log kept for failures.
// The tests are by feature: agent_reconcile (passes, reloads, drift),
// agent_hosts, agent_metrics, agent_sharing, agent_steady, agent_load,
// agent_service (bad input, the systemd unit).

// agentProc is a `sluice agent` the test started.
type agentProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string // host:port it listens on
	mu   sync.Mutex
	log  bytes.Buffer
	done chan struct{}
	err  error // Wait's, once done is closed
}

func (a *agentProc) Write(b []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.Write(b)
}

// Log is everything the agent logged so far.
func (a *agentProc) Log() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.String()
}

// startAgent runs the agent on ns with a private state directory,
// listening on a free port, and waits for its first pass.
func startAgent(t *testing.T, ns, pol string, extra ...string) *agentProc {
	t.Helper()
	return startAgentWith(t, bin, nil, ns, pol, extra...)
}

// startAgentWith is startAgent for binary (the fault-injecting one),
// with env added to the environment.
func startAgentWith(t *testing.T, binary string, env []string, ns, pol string, extra ...string) *agentProc {
	t.Helper()
	return launchAgent(t, binary, env, 10*time.Second, ns, pol, extra...)
}

// startAgentWithin is startAgent for a first pass that may take up to
// within: a policy whose first apply writes tens of thousands of
// objects, at the kernel's pace.
func startAgentWithin(t *testing.T, within time.Duration, ns, pol string, extra ...string) *agentProc {
	t.Helper()
	return launchAgent(t, bin, nil, within, ns, pol, extra...)
}

// spawnAgent starts binary with args (an agent's) and env added, its
// output kept as its log; it is killed when the test ends, its log
// printed if the test failed. It does not wait for the agent to be up.
func spawnAgent(t *testing.T, binary string, env []string, args ...string) *agentProc {
	t.Helper()
	a := &agentProc{t: t, cmd: exec.Command(binary, args...), done: make(chan struct{})}
	a.cmd.Env = append(append(os.Environ(), "SLUICE_STATE_DIR="+stateDir(t)), env...)
	a.cmd.Stdout, a.cmd.Stderr = a, a
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.done
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Log())
		}
	})
	return a
}

func launchAgent(t *testing.T, binary string, env []string, within time.Duration, ns, pol string, extra ...string) *agentProc {
	t.Helper()
	a := spawnAgent(t, binary, env, append([]string{"--netns", ns, "agent", pol, "--listen", "127.0.0.1:0", "--log-format", "json"}, extra...)...)
	info := filepath.Join(stateDir(t), "netns", ns, agent.AgentFile)
	start := time.Now()
	deadline := start.Add(within)
	for {
		select {
		case <-a.done:
			t.Fatalf("agent exited: %v\n%s", a.err, a.Log())
		default:
		}
		if b, err := os.ReadFile(info); err == nil {
			var i agent.Info
			if json.Unmarshal(b, &i) == nil && i.PID == a.cmd.Process.Pid {
				a.addr = i.Listen
				// Started: healthy, or waiting for a missing device.
				if code, body := a.get("/healthz"); code == 200 || code == 503 && strings.Contains(body, "waiting for") {
					if d := time.Since(start); d > 5*time.Second {
						t.Logf("agent healthy after %v", d.Round(time.Millisecond))
					}
					return a
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not healthy within %v:\n%s", within, a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *agentProc) get(path string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + a.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (a *agentProc) status() agent.Status {
	a.t.Helper()
	code, body := a.get("/api/v1/status")
	var st agent.Status
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		a.t.Fatalf("status: %d %.300s", code, body)
	}
	return st
}

// metric returns the value of the series whose name and labels start
// with prefix (e.g. `sluice_class_sent_bytes_total{class="bulk"`).
func (a *agentProc) metric(name string, labels ...string) (float64, bool) {
	_, body := a.get("/metrics")
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		ok := true
		for _, lv := range labels {
			if !strings.Contains(l, lv) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		return v, err == nil
	}
	return 0, false
}

// stop signals the agent and returns how long it took to exit and its
// exit code.
func (a *agentProc) stop(sig syscall.Signal) (time.Duration, int) {
	a.t.Helper()
	start := time.Now()
	a.cmd.Process.Signal(sig)
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		a.t.Fatalf("agent still running 10 s after %v", sig)
	}
	return time.Since(start), a.cmd.ProcessState.ExitCode()
}

// within polls cond every 50 ms for up to d and reports how long it took.
func within(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < d {
		if cond() {
			return time.Since(start), true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return d, cond()
}
