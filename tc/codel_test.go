package tc

import (
	"strings"
	"testing"
)

// kernelSays is what the kernel's dump says a codel time sent as us is
// (sch_fq_codel: us_to_codel_time, then codel_time_to_us).
func kernelSays(us uint32) uint32 { return uint32((uint64(us) * 1000 >> 10 << 10) / 1000) }

// A codel time read back and sent again sets the kernel's very units
// (a rollback restores what it read), and a whole millisecond reads back
// as itself.
func TestCodelFromKernel(t *testing.T) {
	if kernelSays(5000) != 4999 || codelFromKernel(4999) != 5000 || CodelReadBack(100000) != 100000 {
		t.Fatalf("5 ms says %d, reads %d; 100 ms reads %d", kernelSays(5000), codelFromKernel(4999), CodelReadBack(100000))
	}
	for us := uint32(1); us < 2_000_000; us += 7 {
		back := codelFromKernel(kernelSays(us))
		if codelUnits(back) != codelUnits(us) || !SameCodelTime(back, us) {
			t.Fatalf("%d µs: read back as %d, %d units for %d", us, back, codelUnits(back), codelUnits(us))
		}
		if us%1000 == 0 && back != us {
			t.Fatalf("%d µs read back as %d", us, back)
		}
	}
	if SameCodelTime(5000, 5001) {
		t.Error("5000 and 5001 µs are other units")
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
