package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/testutil"
)

// SIGHUP re-reads the policy even when its files look unchanged, and an
// edit of a hosts_file the policy names is applied like an edit of the
// policy: a new subscriber's class appears, a removed one's goes.
// hostsPolicy shapes eth0's hosts from hosts.csv beside it, through the
// BPF classifier, with a 5mbit default class.
const hostsPolicy = `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      classifier: bpf
      default: rest
      classes:
        - name: subs
          rate: 15mbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 5mbit
`

func TestAgentReloadsHostsFileAndSIGHUP(t *testing.T) {
	testutil.Slow(t)
	light(t)
	ns := devNS(t, "eth0")
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts.csv")
	os.WriteFile(hosts, []byte("name,addresses,rate,ceil\nalice,10.1.0.1,2mbit,10mbit\nbob,10.1.0.2,3mbit,10mbit\n"), 0o644)
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(hostsPolicy), 0o644)
	a := startAgent(t, ns, pol)
	classes := func() string { return tcShow(t, ns, "class", "show", "dev", "eth0") }
	if c := classes(); !strings.Contains(c, "rate 2Mbit") || !strings.Contains(c, "rate 3Mbit") {
		t.Fatalf("hosts not shaped:\n%s", c)
	}
	os.WriteFile(hosts, []byte("name,addresses,rate,ceil\nalice,10.1.0.1,2mbit,10mbit\ncarol,10.1.0.3,4mbit,10mbit\n"), 0o644)
	if _, ok := within(2*time.Second, func() bool {
		c := classes()
		return strings.Contains(c, "rate 4Mbit") && !strings.Contains(c, "rate 3Mbit")
	}); !ok {
		t.Fatalf("hosts_file edit not applied within 2 s:\n%s\n%s", classes(), a.Log())
	}
	before := strings.Count(a.Log(), `"msg":"policy reloaded"`)
	a.cmd.Process.Signal(syscall.SIGHUP)
	if _, ok := within(2*time.Second, func() bool {
		return strings.Count(a.Log(), `"msg":"policy reloaded"`) > before && strings.Contains(a.Log(), `"forced":true`)
	}); !ok {
		t.Fatalf("SIGHUP did not reload:\n%s", a.Log())
	}
	// The reload is logged before it is counted.
	if _, ok := within(time.Second, func() bool { v, ok := a.metric("sluice_reload_total", `result="ok"`); return ok && v >= 2 }); !ok {
		v, _ := a.metric("sluice_reload_total", `result="ok"`)
		t.Errorf("sluice_reload_total{result=ok} = %v a second after the reload", v)
	}
	// A broken edit of a policy with a hosts_file is refused once, not
	// at every poll of the files.
	good, _ := os.ReadFile(pol)
	os.WriteFile(pol, append(good, []byte("bogus: [\n")...), 0o644)
	time.Sleep(2500 * time.Millisecond)
	if n := strings.Count(a.Log(), "policy refused"); n != 1 {
		t.Errorf("a broken edit was refused %d times in 2.5 s, want once:\n%s", n, a.Log())
	}
	// Put back as it was: no edit, said so, and the refusal cleared.
	mark := a.Log()
	os.WriteFile(pol, good, 0o644)
	if _, ok := within(2*time.Second, func() bool { return a.status().Health.ReloadError == "" }); !ok {
		t.Errorf("the policy put back as it was: reload error stays %q", a.status().Health.ReloadError)
	}
	if code, _ := a.get("/healthz"); code != 200 {
		t.Errorf("healthz %d after reloads", code)
	}
	// A hosts file deleted (refused: the policy names it) and put back.
	hostsNow, _ := os.ReadFile(hosts)
	os.Remove(hosts)
	if _, ok := within(2*time.Second, func() bool { return a.status().Health.ReloadError != "" }); !ok {
		t.Errorf("a deleted hosts_file was not reported")
	}
	os.WriteFile(hosts, hostsNow, 0o644)
	if _, ok := within(2*time.Second, func() bool { return a.status().Health.ReloadError == "" }); !ok {
		t.Errorf("the hosts_file put back: reload error stays %q", a.status().Health.ReloadError)
	}
	time.Sleep(300 * time.Millisecond)
	back := strings.TrimPrefix(a.Log(), mark)
	if strings.Contains(back, "hosts edited in place") || strings.Count(back, "files are back as the policy in force read them") != 2 {
		t.Errorf("files put back as they were are not an edit:\n%s", back)
	}
}
