package tc

import (
	"strings"
	"testing"
)

// The kernel keeps codel times in 1.024 µs units and says them in µs.
func TestCodelTime(t *testing.T) {
	for us, want := range map[uint32]uint32{5000: 4999, 100000: 99999, 19000: 18999, 20000: 19999, 400000: 400000, 0: 0} {
		if got := CodelTime(us); got != want {
			t.Errorf("CodelTime(%d) = %d, want %d", us, got, want)
		}
	}
}

// A change of an fq_codel leaf never names its flows, which the kernel
// takes only at creation (EINVAL on a change); an add does.
func TestFqCodelChangeLeavesFlows(t *testing.T) {
	q := &Qdisc{Dev: "eth0", Parent: MakeHandle(1, 0x11), Handle: MakeHandle(0x11, 0), Kind: "fq_codel",
		FqCodel: &FqCodel{Flows: 64, Target: 10000, Interval: 200000}}
	change, add := Batch([]Op{{Verb: Change, Obj: q}}), Batch([]Op{{Verb: Add, Obj: q}})
	if strings.Contains(change, "flows") || !strings.Contains(change, "fq_codel target 10ms interval 200ms") {
		t.Errorf("change: %q", change)
	}
	if !strings.Contains(add, "fq_codel flows 64 target 10ms interval 200ms") {
		t.Errorf("add: %q", add)
	}
	if q.FqCodel.Flows != 64 {
		t.Errorf("the planned qdisc lost its flows: %d", q.FqCodel.Flows)
	}
}
