package kernel

import (
	"net/netip"
	"reflect"
	"testing"

	"sluice/bpf"
	"sluice/tc"
)

// readbackOnly are fields the kernel fills in on readback; a plan never
// sets them, so fingerprints leave them out.
var readbackOnly = map[string]bool{
	"Link.Index": true, "Link.RawIP": true,
	"Qdisc.Stats":       true,
	"Class.BufferTicks": true, "Class.CbufferTicks": true, "Class.Level": true, "Class.Stats": true, "Class.HTB": true,
	"Filter.Raw": true, "BPF.FD": true, "BPF.ID": true, "U32.Actions": true, // the kinds of another tool's actions
	"Filter.FW": true, "Filter.Matchall": true, "Filter.Flower": true, // read back for import tc; sluice never makes them
	"Hook.Base": true, "Hook.Version": true, "Hook.ProgID": true, "Hook.Capacity": true, "Hook.HistCap": true, "Hook.FlowCap": true,
}

// fill allocates every optional part of v (pointers, one slice element)
// so that each scalar field below can be mutated.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(v.Elem())
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() && !readbackOnly[v.Type().Name()+"."+v.Type().Field(i).Name] {
				fill(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.Append(v, reflect.New(v.Type().Elem()).Elem()))
		}
		fill(v.Index(0))
	}
}

// eachScalar calls f with every settable scalar field under v and a
// function that sets it to a new value and one that restores it.
func eachScalar(v reflect.Value, path string, f func(path string, set, undo func())) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			eachScalar(v.Elem(), path, f)
			saved := reflect.ValueOf(v.Interface())
			f(path+"=nil", func() { v.Set(reflect.Zero(v.Type())) }, func() { v.Set(saved) })
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			fd := v.Type().Field(i)
			if !fd.IsExported() || readbackOnly[v.Type().Name()+"."+fd.Name] {
				continue
			}
			eachScalar(v.Field(i), path+"."+fd.Name, f)
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			eachScalar(v.Index(i), path+"[]", f)
		}
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			eachScalar(v.Index(i), path+"[i]", f)
		}
	case reflect.Map: // the host table: TestFingerprintHostTable
	default:
		saved := reflect.ValueOf(v.Interface())
		f(path, func() {
			switch v.Kind() {
			case reflect.String:
				v.SetString(v.String() + "x")
			case reflect.Bool:
				v.SetBool(!v.Bool())
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
				v.SetInt(v.Int() + 3)
			case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
				v.SetUint(v.Uint() + 3)
			default:
				panic("no mutation for " + path)
			}
		}, func() { v.Set(saved) })
	}
}

// TestFingerprintCoversEveryField changes each field of each object
// type, one at a time, and wants a different fingerprint every time.
func TestFingerprintCoversEveryField(t *testing.T) {
	objs := []tc.Object{&tc.Link{}, &tc.Qdisc{}, &tc.Class{}, &tc.Filter{}, &bpf.Hook{}}
	for _, o := range objs {
		v := reflect.ValueOf(o)
		fill(v)
		if h, ok := o.(*bpf.Hook); ok {
			h.Content.Hosts = map[bpf.HostKey]bpf.Target{
				bpf.HostKeyOf(1, netip.MustParsePrefix("10.0.0.1/32")): {Classid: 0x10010, Counter: 1, Queue: 1}}
		}
		base := fingerprintOf(o)
		n := 0
		eachScalar(v.Elem(), reflect.TypeOf(o).Elem().Name(), func(path string, set, undo func()) {
			set()
			if fingerprintOf(o) == base {
				t.Errorf("%s: changing it leaves the fingerprint as it was", path)
			}
			undo()
			if fingerprintOf(o) != base {
				t.Fatalf("%s: undo did not restore the fingerprint", path)
			}
			n++
		})
		if n < 4 {
			t.Errorf("%T: only %d fields checked", o, n)
		}
	}
}

func TestFingerprintHostTable(t *testing.T) {
	p1, p2 := netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32")
	mk := func(m map[netip.Prefix]bpf.Target) *bpf.Hook {
		c := &bpf.Content{Hosts: map[bpf.HostKey]bpf.Target{}}
		for p, tg := range m {
			c.Hosts[bpf.HostKeyOf(1, p)] = tg
		}
		return &bpf.Hook{Dev: "d", Content: c}
	}
	a, b := bpf.Target{Classid: 0x10010, Counter: 1}, bpf.Target{Classid: 0x10011, Counter: 2}
	base := fingerprintOf(mk(map[netip.Prefix]bpf.Target{p1: a, p2: b}))
	for name, m := range map[string]map[netip.Prefix]bpf.Target{
		"swapped targets": {p1: b, p2: a},
		"one host gone":   {p1: a},
		"other counter":   {p1: a, p2: {Classid: 0x10011, Counter: 3}},
		"other queue":     {p1: a, p2: {Classid: 0x10011, Counter: 2, Queue: 1}},
	} {
		if fingerprintOf(mk(m)) == base {
			t.Errorf("%s: same fingerprint", name)
		}
	}
	if fingerprintOf(mk(map[netip.Prefix]bpf.Target{p2: b, p1: a})) != base {
		t.Error("the same table gives another fingerprint")
	}
}
