package kernel_test

import (
	"os"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"sluice/bpf"
	"sluice/kernel"
	"sluice/records"
	"sluice/tc"
)

// What only reads (stats, the agent's controllers between passes, show,
// import) is handed a kernel.Reader or a bpf.View, never the Kernel or
// the Program: neither has a method that writes, nor one whose result
// reaches a handle that can. A method added to either must be a read,
// and named here.
func TestReadersCannotWrite(t *testing.T) {
	reads := map[reflect.Type][]string{
		reflect.TypeOf(&kernel.Reader{}): {"Close", "Qdiscs", "Classes", "ClassesOf", "Snapshot", "IngressRedirect",
			"TxBytes", "LinkBytes", "LinkExists", "IfIndex", "Recorded", "RecordedNames", "Interrupted", "OpenHook"},
		reflect.TypeOf(&bpf.View{}): {"Close", "ID", "Read", "Counts", "Colours", "LookupHosts", "Policers", "Targets",
			"Paces", "Delays", "RTT", "HostRTT", "FlowsTracked", "RTTCounts", "RTTMode"},
	}
	// The handles that write: the executor's, tc's connection, the
	// classifier's program and its maps, netlink's, the records' file
	// (its journal is the executor's), a file.
	writers := []reflect.Type{
		reflect.TypeOf(kernel.Kernel{}), reflect.TypeOf(tc.Conn{}), reflect.TypeOf(bpf.Program{}),
		reflect.TypeOf(ebpf.Map{}), reflect.TypeOf(ebpf.Program{}), reflect.TypeOf(netlink.Handle{}),
		reflect.TypeOf(records.File{}), reflect.TypeOf(os.File{}),
	}
	for typ, names := range reads {
		allowed := map[string]bool{}
		for _, n := range names {
			allowed[n] = true
		}
		if typ.Elem().NumField() != 1 || typ.Elem().Field(0).IsExported() {
			t.Errorf("%v: its one field must be unexported, the handle it reads through", typ)
		}
		for i := 0; i < typ.NumMethod(); i++ {
			m := typ.Method(i)
			if !allowed[m.Name] {
				t.Errorf("%v.%s: not one of its reads (a reader's methods only read; add a read here)", typ, m.Name)
			}
			for j := 0; j < m.Type.NumOut(); j++ {
				if w := reaches(m.Type.Out(j), writers, map[reflect.Type]bool{}); w != nil {
					t.Errorf("%v.%s returns %v, which reaches %v: a handle that writes", typ, m.Name, m.Type.Out(j), w)
				}
			}
		}
	}
	// The check itself: it finds a writer where one is reachable.
	type leaky struct{ Conn *tc.Conn }
	if reaches(reflect.TypeOf(map[string][]*leaky{}), writers, map[reflect.Type]bool{}) == nil {
		t.Error("reaches missed a tc.Conn in a struct in a map of slices")
	}
	if w := reaches(reflect.TypeOf(&bpf.Content{}), writers, map[reflect.Type]bool{}); w != nil {
		t.Errorf("bpf.Content reaches %v", w)
	}
}

// reaches returns the writer type t holds, through pointers, slices,
// arrays, maps, channels and exported struct fields, or nil.
func reaches(t reflect.Type, writers []reflect.Type, seen map[reflect.Type]bool) reflect.Type {
	if seen[t] {
		return nil
	}
	seen[t] = true
	for _, w := range writers {
		if t == w {
			return w
		}
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Chan:
		return reaches(t.Elem(), writers, seen)
	case reflect.Map:
		if w := reaches(t.Key(), writers, seen); w != nil {
			return w
		}
		return reaches(t.Elem(), writers, seen)
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			if f := t.Field(i); f.IsExported() {
				if w := reaches(f.Type, writers, seen); w != nil {
					return w
				}
			}
		}
	}
	return nil
}
