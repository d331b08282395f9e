package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/testutil"
)

// The package as a user gets it: installed with dpkg on a machine whose
// init is systemd, its units started, reloaded and stopped with
// systemctl. systemd runs as PID 1 of its own namespaces
// (testdata/systemd-boot.sh), so the units' sandboxing is systemd's
// own; the host's files and links are not touched. In the stock-kernel
// lane the package is the one vmlane/vmtest.sh built (SLUICE_TEST_DEB).
func TestDebUnitsStartUnderSystemd(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	for _, tool := range []string{"unshare", "nsenter", "dpkg", "/lib/systemd/systemd"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("no %s (scripts/install-deps.sh installs it)", tool)
			}
			t.Skipf("no %s", tool)
		}
	}
	deb := os.Getenv("SLUICE_TEST_DEB")
	if deb == "" {
		deb = makeDeb(t)
	}
	m := bootSystemd(t, deb)

	if st := m.must("dpkg-query", "-W", "-f", "${Status}|${Conffiles}", "sluice"); !strings.HasPrefix(st, "install ok installed|") || !strings.Contains(st, "/etc/sluice/policy.yaml ") {
		t.Fatalf("dpkg says %q: not installed, or the policy is not a conffile", st)
	}
	for _, u := range []string{"sluice-agent", "sluice-apply"} {
		if st, _ := m.run("systemctl", "is-enabled", u); st != "disabled" {
			t.Errorf("%s is %q after install; the package enables neither unit", u, st)
		}
	}

	// The units as installed, scored by the running systemd itself.
	for _, u := range []string{"sluice-agent", "sluice-apply"} {
		out, _ := m.run("systemd-analyze", "security", "--no-pager", u+".service")
		if sm := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindStringSubmatch(out); sm == nil {
			t.Errorf("systemd-analyze security %s: no score:\n%.500s", u, out)
		} else if v, _ := strconv.ParseFloat(sm[1], 64); v > 2.5 {
			t.Errorf("%s as installed: exposure %s, want 2.5 at most", u, sm[1])
		} else {
			t.Logf("%s: systemd-analyze security %s", u, sm[1])
		}
	}

	// The installed policy is a template: the oneshot refuses it and the
	// agent exits 2 (each unit fails, saying to edit it) and nothing is
	// shaped; deleting its template line puts it in force.
	if out, err := m.run("systemctl", "start", "sluice-apply"); err == nil {
		t.Errorf("sluice-apply started with the installed template:\n%s", out)
	}
	m.waitActive("sluice-apply", "failed")
	if j := m.must("journalctl", "-u", "sluice-apply", "-o", "cat", "--no-pager"); !strings.Contains(j, "this is the template sluice installs") {
		t.Errorf("sluice-apply's journal does not say the policy is the template:\n%s", j)
	}
	m.must("systemctl", "reset-failed", "sluice-apply")
	// The agent exits 2 (bad input), which its unit does not restart.
	m.run("systemctl", "enable", "--now", "sluice-agent")
	m.waitActive("sluice-agent", "failed")
	if st := m.must("systemctl", "show", "-p", "ExecMainStatus,NRestarts", "sluice-agent"); !strings.Contains(st, "ExecMainStatus=2") || !strings.Contains(st, "NRestarts=0") {
		t.Errorf("the agent on the template: %q, want exit 2 and no restart", st)
	}
	if j := m.must("journalctl", "-u", "sluice-agent", "-o", "cat", "--no-pager"); !strings.Contains(j, "this is the template sluice installs") {
		t.Errorf("the agent's journal does not say the policy is the template:\n%s", j)
	}
	if q := m.must("tc", "qdisc", "show", "dev", "eth0"); strings.Contains(q, "htb") {
		t.Fatalf("eth0 was shaped with the template:\n%s", q)
	}
	m.must("sed", "-i", "/^template: true/d", "/etc/sluice/policy.yaml")
	m.must("systemctl", "restart", "sluice-agent")

	// The agent: started, serving, shaping the policy's interface.
	m.waitActive("sluice-agent", "active")
	m.waitHealthy()
	if q := m.must("tc", "qdisc", "show", "dev", "eth0"); !strings.Contains(q, "htb 1: root") {
		t.Fatalf("the agent runs but eth0 has no HTB root:\n%s", q)
	}
	if st := m.must("systemctl", "is-enabled", "sluice-agent"); st != "enabled" {
		t.Errorf("enable left it %q", st)
	}
	// The records are the group sluice's to read (the package made it,
	// the unit runs with it): a member reads them without root.
	if st := m.must("stat", "-c", "%a %U %G", "/run/sluice"); st != "750 root sluice" {
		t.Errorf("/run/sluice is %q, want 750 root sluice", st)
	}
	gid := strings.Split(m.must("getent", "group", "sluice"), ":")
	if len(gid) < 3 {
		t.Fatalf("no group sluice: %v", gid)
	}
	if out, err := m.run("setpriv", "--reuid=65534", "--regid=65534", "--groups="+gid[2], "sluice", "show", "--local", "--interval", "0"); err != nil || !strings.Contains(out, "eth0 egress") {
		ls, _ := m.run("ls", "-la", "/run/sluice")
		t.Errorf("show as nobody in the group sluice: %v\n%s\n%s", err, out, ls)
	}
	// systemctl reload: the edit is applied.
	m.must("sed", "-i", "s/19mbit/25mbit/g", "/etc/sluice/policy.yaml")
	m.must("systemctl", "reload", "sluice-agent")
	m.waitFor("the reloaded rate on eth0", func() bool {
		c, _ := m.run("tc", "class", "show", "dev", "eth0", "classid", "1:1")
		return strings.Contains(c, "rate 25Mbit")
	})
	if j := m.must("journalctl", "-u", "sluice-agent", "-o", "cat", "--no-pager"); !strings.Contains(j, `"msg":"applied"`) {
		t.Errorf("the journal has no summary of the agent's passes:\n%s", j)
	}
	// Stopped, it leaves the shaping in place.
	m.stopAgent()
	if q := m.must("tc", "qdisc", "show", "dev", "eth0"); !strings.Contains(q, "htb 1: root") {
		t.Errorf("stopping the agent removed the shaping:\n%s", q)
	}

	// The oneshot unit: applies (nothing left to change), stays active,
	// gives way to the agent, and removes what sluice made when stopped.
	m.must("systemctl", "start", "sluice-apply")
	m.waitActive("sluice-apply", "active")
	m.must("systemctl", "start", "sluice-agent")
	m.waitActive("sluice-agent", "active")
	m.waitActive("sluice-apply", "inactive")
	m.waitHealthy()
	m.waitFor("the agent's tree after the apply unit gave way", func() bool {
		c, _ := m.run("tc", "class", "show", "dev", "eth0", "classid", "1:1")
		return strings.Contains(c, "rate 25Mbit")
	})
	m.stopAgent()
	m.must("systemctl", "start", "sluice-apply")
	m.waitActive("sluice-apply", "active")
	m.must("systemctl", "stop", "sluice-apply")
	m.waitActive("sluice-apply", "inactive")
	if q := m.must("tc", "qdisc", "show", "dev", "eth0"); strings.Contains(q, "htb") {
		t.Errorf("stopping sluice-apply left the tree:\n%s", q)
	}
	if failed := m.must("systemctl", "list-units", "--failed", "--plain", "--no-legend", "sluice-*"); failed != "" {
		t.Errorf("failed units: %s", failed)
	}
}

// machine is a systemd booted in namespaces of its own.
type machine struct {
	t       *testing.T
	pid     int // systemd's, as the host sees it
	netns   string
	console *bytes.Buffer
}

// bootSystemd starts testdata/systemd-boot.sh with the package and
// waits until systemd says it is running; everything goes with the
// namespaces' PID 1 when the test ends.
func bootSystemd(t *testing.T, deb string) *machine {
	t.Helper()
	abs, err := filepath.Abs(deb)
	if err != nil {
		t.Fatal(err)
	}
	console := &bytes.Buffer{}
	cmd := exec.Command("unshare", "--mount", "--pid", "--net", "--cgroup", "--uts", "--fork", "--kill-child",
		"bash", "testdata/systemd-boot.sh", abs)
	cmd.Stdout, cmd.Stderr = console, console
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &machine{t: t, console: console}
	t.Cleanup(func() {
		if m.netns != "" {
			exec.Command("ip", "netns", "delete", m.netns).Run()
		}
		if m.pid > 0 {
			syscall.Kill(m.pid, syscall.SIGKILL)
		}
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("boot log:\n%s", console)
		}
	})
	// Under emulation (the lane) dpkg and the boot take a while.
	deadline := time.Now().Add(3 * time.Minute)
	for m.pid == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("systemd did not start:\n%s", console)
		}
		time.Sleep(200 * time.Millisecond)
		if pid := childOf(cmd.Process.Pid); pid > 0 {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "systemd" {
				m.pid = pid
			}
		}
		if syscall.Kill(cmd.Process.Pid, 0) != nil {
			t.Fatalf("the boot script ended:\n%s", console)
		}
	}
	for {
		st, _ := m.run("systemctl", "is-system-running")
		if st == "running" || st == "degraded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("systemd is %q after 3 minutes:\n%s", st, console)
		}
		time.Sleep(500 * time.Millisecond)
	}
	m.netns = testutil.Unique("deb")
	testutil.Run(t, "ip", "netns", "attach", m.netns, strconv.Itoa(m.pid))
	return m
}

// childOf returns the first child of pid, or 0.
func childOf(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	c, _ := strconv.Atoi(f[0])
	return c
}

// run runs a command inside the machine and returns its trimmed output.
func (m *machine) run(name string, args ...string) (string, error) {
	a := append([]string{"-t", strconv.Itoa(m.pid), "-m", "-p", "-n", "-u", "--", name}, args...)
	out, err := exec.Command("nsenter", a...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (m *machine) must(name string, args ...string) string {
	m.t.Helper()
	out, err := m.run(name, args...)
	if err != nil {
		m.t.Fatalf("%s %s: %v\n%s\n%s", name, strings.Join(args, " "), err, out, m.status())
	}
	return out
}

// status is what systemd and the journal say of sluice's units.
func (m *machine) status() string {
	st, _ := m.run("systemctl", "status", "--no-pager", "-l", "sluice-agent", "sluice-apply")
	j, _ := m.run("journalctl", "--no-pager", "-n", "30", "-u", "sluice-agent", "-u", "sluice-apply")
	return st + "\n" + j
}

func (m *machine) waitFor(what string, ok func() bool) {
	m.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			m.t.Fatalf("no %s after 60 s\n%s", what, m.status())
		}
	}
}

func (m *machine) waitActive(unit, want string) {
	m.t.Helper()
	m.waitFor(unit+" "+want, func() bool {
		st, _ := m.run("systemctl", "is-active", unit)
		return st == want
	})
}

// stopAgent stops sluice-agent and waits until it is inactive. The
// systemd of these namespaces has no cgroups of its own ("Couldn't move
// remaining userspace processes") and once SIGKILLed the agent at once
// after its SIGTERM, long before the unit's 5 s stop timeout (the 6.1
// lane, 2026-11-28: "stopped; shaping left in place" logged, the unit
// failed with signal KILL 2.26 s after it started; a clean-clone run on
// 2026-12-03 KILLed it 50 ms after its SIGTERM, before it could log its
// stop). A kill sooner than 4 s after the SIGTERM is systemd's own
// doing; an agent that hangs on the way out is killed only at the
// unit's 5 s timeout, and fails here. That the agent answers SIGTERM
// within 2 s, the shaping in place, TestAgentRepairsDriftAndReloads checks
// where no systemd stands between.
func (m *machine) stopAgent() {
	m.t.Helper()
	m.must("systemctl", "stop", "sluice-agent")
	m.waitFor("sluice-agent inactive", func() bool {
		st, _ := m.run("systemctl", "is-active", "sluice-agent")
		if st == "failed" {
			if why := m.killedAfterCleanStop(); why != "" {
				m.t.Logf("systemd SIGKILLed the agent %s: its own doing, not the agent's", why)
				m.must("systemctl", "reset-failed", "sluice-agent")
				return true
			}
		}
		return st == "inactive"
	})
}

// killedAfterCleanStop says how soon after its last "stopping" the agent
// was SIGKILLed, where that was sooner than its unit's stop timeout
// could have done it, and whether it had logged its clean stop by
// then; "" otherwise.
func (m *machine) killedAfterCleanStop() string {
	show := func(p string) string {
		out, _ := m.run("systemctl", "show", "-p", p, "--value", "sluice-agent")
		return out
	}
	if show("Result") != "signal" || show("ExecMainStatus") != "9" {
		return ""
	}
	exited, err := strconv.ParseInt(show("ExecMainExitTimestampMonotonic"), 10, 64)
	if err != nil || exited == 0 {
		return ""
	}
	j, _ := m.run("journalctl", "-u", "sluice-agent", "-o", "json", "--no-pager")
	var stopping int64
	stopped := false
	for _, line := range strings.Split(j, "\n") {
		var e struct {
			Message   string `json:"MESSAGE"`
			Monotonic string `json:"__MONOTONIC_TIMESTAMP"`
		}
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		switch {
		case strings.Contains(e.Message, `"msg":"stopping"`):
			stopping, _ = strconv.ParseInt(e.Monotonic, 10, 64)
			stopped = false
		case strings.Contains(e.Message, "stopped; shaping left in place"):
			stopped = true
		}
	}
	d := time.Duration(exited-stopping) * time.Microsecond
	if stopping == 0 || d < 0 || d >= 4*time.Second {
		return ""
	}
	if !stopped {
		return fmt.Sprintf("%.2f s after its SIGTERM, before it logged its stop", d.Seconds())
	}
	return fmt.Sprintf("%.2f s after its SIGTERM, which it had answered (\"stopped; shaping left in place\")", d.Seconds())
}

// waitHealthy waits for the agent's /healthz to answer 200 on the
// address the unit gives it, inside the machine's network namespace.
func (m *machine) waitHealthy() {
	m.t.Helper()
	status := regexp.MustCompile(`^HTTP/1\.[01] (\d+)`)
	m.waitFor("200 from /healthz", func() bool {
		var line string
		err := testutil.InNetns(m.netns, func() error {
			c, err := net.DialTimeout("tcp", "127.0.0.1:9464", 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1:9464\r\n\r\n")
			line, err = bufio.NewReader(c).ReadString('\n')
			return err
		})
		s := status.FindStringSubmatch(line)
		return err == nil && s != nil && s[1] == "200"
	})
}
