package records

import (
	"sluice/units"

	"bytes"
	"fmt"
	"reflect"
	"testing"

	"sluice/tc"
)

func TestPackRoundTrip(t *testing.T) {
	a := &Alloc{Classes: map[string]uint16{"subs": 0x10, "subs/h1": 0x11}, Prios: map[string]uint16{"1:/a": 3},
		Tables: map[string]uint16{"t": 1}, Shards: map[string]uint16{"subs/h1": 2}, Leaves: map[string]uint16{"x@111:11": 0x105},
		Counters: map[string]uint32{"subs/h1": 70000}}
	classes := []Class{{Name: "subs", Handle: tc.MakeHandle(0x111, 0x10), Parent: tc.MakeHandle(0x111, 1), Rate: 1e7, Ceil: 2e7,
		Prio: 3, Leaf: "bfifo", Default: true, Counter: 9, Replica: true}, {Name: "rest"}}
	objects := map[string]uint64{"class/eth0/111:10": 1<<63 | 5, "qdisc/eth0/root": 7}
	b := packed(t, a, classes, objects)
	a2, c2, o2, err := unpack(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, a2) || !reflect.DeepEqual(classes, c2) || !reflect.DeepEqual(objects, o2) {
		t.Fatalf("round trip differs:\n%+v\n%+v\n%+v", a2, c2, o2)
	}
	// An unsharded tree's allocation keeps its absent maps absent.
	a3, _, _, _ := unpack(packed(t, &Alloc{Classes: map[string]uint16{}, Prios: map[string]uint16{}, Tables: map[string]uint16{}}, nil, nil))
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

// A tree of 10,000 hosts streams out in many writes and reads back whole.
func TestPackStreamsLargeTrees(t *testing.T) {
	a := &Alloc{Classes: map[string]uint16{}, Prios: map[string]uint16{}, Tables: map[string]uint16{},
		Shards: map[string]uint16{}, Leaves: map[string]uint16{}, Counters: map[string]uint32{}}
	var classes []Class
	objects := map[string]uint64{}
	for i := range 10000 {
		name := fmt.Sprintf("subs/s%d", i)
		a.Classes[name], a.Shards[name], a.Counters[name] = uint16(i), uint16(i%16), uint32(i)
		a.Leaves[name+"@100:1"] = uint16(i)
		classes = append(classes, Class{Name: name, Handle: tc.Handle(i), Rate: units.Rate(i) * 1000})
		objects["class/eth0/"+name] = uint64(i) * 0x9E3779B97F4A7C15
	}
	var w countingWriter
	b := packed(t, a, classes, objects)
	if _, err := pack(&w, a, classes, objects); err != nil || w.writes < 10 {
		t.Fatalf("%d writes (%v): the bulk was not streamed", w.writes, err)
	}
	a2, c2, o2, err := unpack(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, a2) || !reflect.DeepEqual(classes, c2) || !reflect.DeepEqual(objects, o2) {
		t.Fatal("round trip of 10,000 hosts differs")
	}
}

type countingWriter struct{ writes int }

func (w *countingWriter) Write(b []byte) (int, error) { w.writes++; return len(b), nil }

func packed(t *testing.T, a *Alloc, classes []Class, objects map[string]uint64) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := pack(&buf, a, classes, objects)
	if err != nil || n != buf.Len() {
		t.Fatalf("pack: %d bytes reported, %d written, %v", n, buf.Len(), err)
	}
	return buf.Bytes()
}
