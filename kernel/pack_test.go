package kernel

import (
	"reflect"
	"testing"

	"sluice/plan"
	"sluice/tc"
)

func TestPackRoundTrip(t *testing.T) {
	a := &plan.Alloc{Classes: map[string]uint16{"subs": 0x10, "subs/h1": 0x11}, Prios: map[string]uint16{"1:/a": 3},
		Tables: map[string]uint16{"t": 1}, Shards: map[string]uint16{"subs/h1": 2}, Leaves: map[string]uint16{"x@111:11": 0x105},
		Counters: map[string]uint32{"subs/h1": 70000}}
	classes := []plan.ClassInfo{{Name: "subs", Handle: tc.MakeHandle(0x111, 0x10), Parent: tc.MakeHandle(0x111, 1), Rate: 1e7, Ceil: 2e7,
		Prio: 3, Leaf: "bfifo", Default: true, Counter: 9, Replica: true}, {Name: "rest"}}
	objects := map[string]uint64{"class/eth0/111:10": 1<<63 | 5, "qdisc/eth0/root": 7}
	b := pack(a, classes, objects)
	a2, c2, o2, err := unpack(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, a2) || !reflect.DeepEqual(classes, c2) || !reflect.DeepEqual(objects, o2) {
		t.Fatalf("round trip differs:\n%+v\n%+v\n%+v", a2, c2, o2)
	}
	// An unsharded tree's allocation keeps its absent maps absent.
	a3, _, _, _ := unpack(pack(&plan.Alloc{Classes: map[string]uint16{}, Prios: map[string]uint16{}, Tables: map[string]uint16{}}, nil, nil))
	if a3.Shards != nil || a3.Classes == nil {
		t.Fatalf("unsharded allocation: %+v", a3)
	}
	// Every truncation and a trailing byte are refused, never half read.
	for i := 0; i < len(b); i++ {
		if _, _, _, err := unpack(b[:i]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", i, len(b))
		}
	}
	if _, _, _, err := unpack(append(b, 0)); err == nil {
		t.Fatal("a trailing byte: no error")
	}
}
