package kernel_test

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"sluice/bpf"
	"sluice/plan"
	"sluice/tc"
	"sluice/testutil"
)

// After an upgrade, the classifier on a device is an earlier sluice's:
// a program of another version whose maps the new code cannot read
// (here: none at all). apply replaces it with the current one instead
// of failing to read it.
func TestApplyReplacesAnEarlierProgram(t *testing.T) {
	b := newBed(t, "eth0")
	pol := parse(t, "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n      classifier: bpf\n")
	if _, err := b.apply(t, pol, false); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	f := &tc.Filter{Dev: "eth0", Parent: tc.HandleEgressHook, Prio: plan.HookPrio, Proto: tc.ProtoAll, Kind: "bpf", Handle: 1,
		BPF: &tc.BPF{FD: old.FD(), Name: bpf.NamePrefix + "0123456789ab", DA: true}}
	if err := b.conn.FilterDel(f); err != nil {
		t.Fatal(err)
	}
	if err := b.conn.FilterAdd(f); err != nil {
		t.Fatal(err)
	}
	n, err := b.apply(t, pol, false)
	if err != nil {
		t.Fatalf("apply over an earlier program: %v", err)
	}
	show := testutil.NS(t, b.ns, "tc", "filter", "show", "dev", "eth0", "egress")
	if n == 0 || !strings.Contains(show, bpf.FilterName()) || strings.Contains(show, "0123456789ab") {
		t.Fatalf("%d changes; the earlier program is still attached:\n%s", n, show)
	}
}
