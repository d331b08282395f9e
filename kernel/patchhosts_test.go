package kernel_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"sluice/bpf"
	"sluice/internal/writecap"
	"sluice/kernel"
	"sluice/plan"
	"sluice/records"
)

// A hosts patch (kernel.WriteHosts: the executor's change of host
// entries, what engine.Session.EditHosts writes) writes a host's entry in the program on the device, under
// the namespace's lock, only where the entry holds what the caller
// planned; an entry changed behind its back, a lock held by another
// sluice or a program gone are refused, and nothing is written. (The
// agent's in-place hosts_file edit; the EDT tree it serves needs fq,
// so here the program is an HTB tree's classifier, whose host entries
// are the same map.)
func TestPatchHostsWritesInPlace(t *testing.T) {
	b := newBed(t, "eth0")
	pol := parse(t, `interfaces:
  - name: eth0
    egress:
      rate: 100mbit
      classifier: bpf
      default: rest
      classes:
        - {name: subs, rate: 80mbit, per_host: {by: dst, cidr: 10.1.0.0/29, rate: 1mbit, ceil: 10mbit}}
        - {name: rest, rate: 10mbit}
`)
	if _, err := b.apply(t, pol, false); err != nil {
		t.Fatal(err)
	}
	var hook *bpf.Hook
	for _, o := range b.plan(t, pol).Devices[0].Objects {
		if h, ok := o.(*bpf.Hook); ok {
			hook = h
		}
	}
	k := bpf.HostKeyOf(0, netip.MustParsePrefix("10.1.0.2/32"))
	old, ok := hook.Content.Hosts[k]
	if !ok {
		t.Fatalf("no entry for 10.1.0.2 in %d hosts", len(hook.Content.Hosts))
	}
	new := old
	new.Rate = 12345
	write := func(old bpf.Target, timeout time.Duration) error {
		_, err := kernel.WriteHosts(writecap.Token{}, b.ns, timeout, []plan.HostWrite{{Hook: hook, Old: map[bpf.HostKey]bpf.Target{k: old}, New: map[bpf.HostKey]bpf.Target{k: new}}})
		return err
	}
	live := func() bpf.Target {
		t.Helper()
		prog, err := b.k.Reader().OpenHook("eth0", false)
		if err != nil || prog == nil {
			t.Fatalf("no program: %v", err)
		}
		defer prog.Close()
		c, err := prog.Read()
		if err != nil {
			t.Fatal(err)
		}
		return c.Hosts[k]
	}

	// Another sluice holds the lock: refused after the timeout.
	l, err := records.AcquireLock(records.Dir(b.ns), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(old, 200*time.Millisecond); err == nil {
		t.Error("the patch wrote while another held the namespace's lock")
	}
	l.Release()
	if live() != old {
		t.Fatal("a refused write changed the entry")
	}

	start := time.Now()
	if err := write(old, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("one entry written in place in %v", time.Since(start))
	if got := live(); got != new {
		t.Fatalf("entry %+v, want %+v", got, new)
	}
	// The entry no longer holds old: a second write from the same plan
	// is refused (someone changed it) and leaves it alone.
	if err := write(old, time.Second); err == nil || !strings.Contains(err.Error(), "another target than planned") {
		t.Errorf("stale write: %v", err)
	}
	if live() != new {
		t.Error("a refused write changed the entry")
	}
	d, _, err := b.k.ResetPlan([]string{"eth0"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.k.Executor(writecap.Token{}).Apply(d); err != nil {
		t.Fatal(err)
	}
	if err := write(new, time.Second); err == nil || !strings.Contains(err.Error(), "not there") {
		t.Errorf("with the program gone: %v", err)
	}
}
