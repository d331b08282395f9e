package kernel_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sluice/internal/writecap"
	"sluice/kernel"
	"sluice/policy"
	"sluice/tc"
	"sluice/testutil"
)

// applyTouched runs apply as the CLI does by default: the fast path
// when ReadTouched allows it, else the full read. It returns whether
// the fast path ran and the diff it applied.
func (b *bed) applyTouched(t *testing.T, pol *policy.Policy) (bool, *kernel.Diff) {
	t.Helper()
	p := b.plan(t, pol)
	live, desired, fast, err := b.k.ReadTouched(p, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !fast {
		if live, err = b.k.ReadLive(p, nil, false); err != nil {
			t.Fatal(err)
		}
		desired = p.Objects()
	}
	d := kernel.Compute(live.Objects, desired, live.Opt)
	if _, err := b.k.Executor(writecap.Token{}).Apply(d); err != nil {
		t.Fatal(err)
	}
	if err := b.k.Executor(writecap.Token{}).Record(p, d, live, "p.yaml"); err != nil {
		t.Fatal(err)
	}
	return fast, d
}

// fullDiff is what a full read back finds still to do.
func (b *bed) fullDiff(t *testing.T, pol *policy.Policy) *kernel.Diff {
	t.Helper()
	p, live, err := b.readFull(t, pol, false)
	if err != nil {
		t.Fatal(err)
	}
	return kernel.Compute(live.Objects, p.Objects(), live.Opt)
}

func describe(d *kernel.Diff) string {
	var out []string
	for _, c := range d.Changes {
		out = append(out, c.Verb.String()+" "+c.Obj.Describe())
	}
	return strings.Join(out, "\n")
}

// TestTouchedReadsOnlyTheEdit: on a sharded BPF tree, apply's fast path
// turns a rate change, a new host and a removed host into exactly the
// changes a full read back would find, leaves nothing for a full read to
// do, and gives way to the full path when the tree is gone. It trusts
// objects the edit does not touch, which --full (a full read) repairs.
func TestTouchedReadsOnlyTheEdit(t *testing.T) {
	b := newBed(t)
	testutil.NS(t, b.ns, "ip", "link", "add", "eth0", "numtxqueues", "4", "type", "veth", "peer", "name", "eth0p", "numtxqueues", "4")
	testutil.NS(t, b.ns, "ip", "link", "set", "eth0", "up")
	dir := t.TempDir()
	load := func(hosts map[int]int) *policy.Policy {
		t.Helper()
		var csv strings.Builder
		csv.WriteString("name,addresses,rate,ceil\n")
		for i := 0; i < 40; i++ {
			if r, ok := hosts[i]; ok {
				fmt.Fprintf(&csv, "h%d,10.1.0.%d,%dmbit,50mbit\n", i, 10+i, r)
			}
		}
		os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(csv.String()), 0o644)
		os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(`interfaces:
  - name: eth0
    egress:
      rate: 100mbit
      classifier: bpf
      shards: 4
      default: rest
      classes:
        - name: subs
          rate: 80mbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 10mbit
`), 0o644)
		pol, _, err := policy.Load(filepath.Join(dir, "p.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return pol
	}
	hosts := map[int]int{}
	for i := 0; i < 30; i++ {
		hosts[i] = 2
	}
	if fast, _ := b.applyTouched(t, load(hosts)); fast {
		t.Fatal("the first apply took the fast path: there were no records")
	}
	if out := testutil.NS(t, b.ns, "tc", "qdisc", "show", "dev", "eth0"); !strings.Contains(out, "qdisc mq 1: root") {
		t.Fatalf("not sharded:\n%s", out)
	}

	// check applies the hosts through the fast path, which must find
	// exactly what a full read back finds beforehand (the edited host's
	// objects; its siblings' quanta too where their group's turn moved:
	// plan/share.go), among them the changes must names, and leave
	// nothing for a full read to do.
	sorted := func(d *kernel.Diff) string {
		lines := strings.Split(describe(d), "\n")
		sort.Strings(lines)
		return strings.Join(lines, "\n")
	}
	check := func(what string, wantFast bool, must ...string) {
		t.Helper()
		pol := load(hosts)
		want := b.fullDiff(t, pol)
		fast, d := b.applyTouched(t, pol)
		if fast != wantFast {
			t.Fatalf("%s: fast path %v, want %v", what, fast, wantFast)
		}
		if got := sorted(d); got != sorted(want) {
			t.Fatalf("%s: the fast path's changes:\n%s\nwant what a full read back found:\n%s", what, got, sorted(want))
		}
		if len(must) == 0 && !d.Empty() {
			t.Fatalf("%s: changes:\n%s", what, describe(d))
		}
		for _, m := range must {
			if !strings.Contains(describe(d), m) {
				t.Errorf("%s: no change %q in:\n%s", what, m, describe(d))
			}
		}
		if rest := b.fullDiff(t, pol); !rest.Empty() {
			t.Fatalf("%s: a full read back still finds:\n%s", what, describe(rest))
		}
	}

	hosts[7] = 3
	check("one rate", true, "change class eth0", "rate 3mbit")
	if out := testutil.NS(t, b.ns, "tc", "class", "show", "dev", "eth0"); strings.Count(out, "rate 3Mbit") != 1 {
		t.Fatalf("the new rate is not in the kernel:\n%s", out)
	}
	hosts[35] = 4
	check("a new host", true, "add class eth0", "add qdisc eth0", "change bpf", "# subs/h35")
	delete(hosts, 2)
	check("a host gone", true, "delete class eth0", "change bpf")
	check("nothing", true)

	// Behind sluice's back: an untouched host's class goes. The fast
	// path trusts the records; the full read puts it back.
	p, _ := b.k.Plan(load(hosts), kernelFeatures(t))
	var victim *tc.Class
	for _, o := range p.Objects() {
		if c, ok := o.(*tc.Class); ok && c.Name == "subs/h20" {
			victim = c
		}
	}
	testutil.NS(t, b.ns, "tc", "class", "del", "dev", "eth0", "classid", victim.Handle.String())
	if fast, d := b.applyTouched(t, load(hosts)); !fast || !d.Empty() {
		t.Fatalf("unchanged policy after drift: fast %v, changes:\n%s", fast, describe(d))
	}
	if d := b.fullDiff(t, load(hosts)); len(d.Changes) != 2 {
		t.Fatalf("a full read back finds %d change(s), want the class and its leaf:\n%s", len(d.Changes), describe(d))
	}
	if _, err := b.apply(t, load(hosts), false); err != nil {
		t.Fatal(err)
	}

	// The tree gone: the fast path gives way.
	testutil.NS(t, b.ns, "tc", "qdisc", "del", "dev", "eth0", "root")
	hosts[7] = 5
	pol := load(hosts)
	pl, _ := b.k.Plan(pol, kernelFeatures(t))
	if _, _, fast, err := b.k.ReadTouched(pl, pl, nil); err != nil || fast {
		t.Fatalf("ReadTouched on a missing tree: fast %v, err %v", fast, err)
	}
}
