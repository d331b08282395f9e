package e2e

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"sluice/bpf"
	"sluice/bpf/bpftest"
	"sluice/engine"
	"sluice/kernel"
	"sluice/testutil"
)

// Once a pass finds nothing to change, the agent's passes read only the
// counters (steady), and what changes behind its back is still put
// back: a class changed with tc at the next pass (the kernel notifies
// it), a classifier map entry (no notification) by the full read that
// comes at least every engine.FullEvery. Steady passes resume after.
func TestAgentSteadyPasses(t *testing.T) {
	testutil.Slow(t)
	ns := devNS(t, "eth0")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte("name,addresses,rate,ceil\nalice,10.1.0.1,2mbit,10mbit\nbob,10.1.0.2,3mbit,10mbit\n"), 0o644)
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(hostsPolicy), 0o644)
	a := startAgent(t, ns, pol)
	steadyPasses := func() float64 {
		v, _ := a.metric("sluice_steady_passes_total")
		return v
	}
	steadyAgain := func(why string) {
		t.Helper()
		n := steadyPasses()
		if _, ok := within(6*time.Second, func() bool { return steadyPasses() >= n+2 }); !ok {
			t.Fatalf("%s: no steady passes (%v)\n%s", why, steadyPasses(), a.Log())
		}
	}
	steadyAgain("after the start")

	classes := func() string { return tcShow(t, ns, "class", "show", "dev", "eth0") }
	m := regexp.MustCompile(`class htb (\S+) parent (\S+) leaf \S+ prio \d+ rate 5Mbit `).FindStringSubmatch(classes())
	if m == nil {
		t.Fatalf("no 5mbit class:\n%s", classes())
	}
	restBack := func() bool {
		return regexp.MustCompile(`class htb ` + regexp.QuoteMeta(m[1]) + ` .* rate 5Mbit `).MatchString(classes())
	}
	testutil.NS(t, ns, "tc", "class", "change", "dev", "eth0", "parent", m[2], "classid", m[1], "htb", "rate", "1mbit", "ceil", "20mbit")
	if restBack() {
		t.Fatal("the hand change did not take")
	}
	if took, ok := within(2500*time.Millisecond, restBack); !ok {
		t.Fatalf("a class changed by hand during steady passes was not put back in 2.5 s\n%s", a.Log())
	} else {
		t.Logf("class change repaired in %v", took)
	}
	steadyAgain("after the class repair")

	// A host's map entry changed by hand, as another program could.
	// withClassifier runs fn on eth0's classifier program.
	withClassifier := func(fn func(*bpf.Writer) error) {
		k, err := kernel.Open(ns)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		// Another program's write: the classifier opened by its id,
		// as any holder of CAP_BPF could, not through sluice's reader.
		view, err := k.Reader().OpenHook("eth0", false)
		if err != nil || view == nil {
			t.Fatalf("the classifier: %v", err)
		}
		id := view.ID()
		view.Close()
		prog, err := bpftest.Writable(bpf.Open(id))
		if err != nil {
			t.Fatal(err)
		}
		defer prog.Close()
		if err := fn(prog); err != nil {
			t.Fatal(err)
		}
	}
	entries := func() (hosts map[bpf.HostKey]bpf.Target) {
		withClassifier(func(prog *bpf.Writer) error {
			c, err := prog.Read()
			if err == nil {
				hosts = c.Hosts
			}
			return err
		})
		return hosts
	}
	want := entries()
	if len(want) < 2 {
		t.Fatalf("hosts map: %v", want)
	}
	// Two hosts' entries swapped: each one's traffic in the other's
	// class.
	bad := maps.Clone(want)
	var keys []bpf.HostKey
	for key := range bad {
		keys = append(keys, key)
	}
	bad[keys[0]], bad[keys[1]] = want[keys[1]], want[keys[0]]
	withClassifier(func(prog *bpf.Writer) error { return prog.SwapHosts(want, bad, nil) })
	if maps.Equal(entries(), want) {
		t.Fatal("the injected change did not take")
	}
	if took, ok := within(engine.FullEvery+3*time.Second, func() bool { return maps.Equal(entries(), want) }); !ok {
		t.Fatalf("a map entry changed by hand was not put back within %v\n%s", engine.FullEvery+3*time.Second, a.Log())
	} else {
		t.Logf("map entry repaired in %v (full reads at least every %v)", took, engine.FullEvery)
	}
	steadyAgain("after the map repair")
}
