package tc_test

import (
	"strings"
	"testing"

	"sluice/internal/writecap"
	"sluice/tc"
	"sluice/testutil"
)

// The codec must produce the same kernel objects tc(8) produces from the
// equivalent batch line: create one object each way, on two devices, and
// compare what the kernel reports.
func TestCodecMatchesTC(t *testing.T) {
	c, p := openPair(t)
	// Second device in A for the tc(8) side.
	testutil.NS(t, p.A, "ip", "link", "add", "ifbx", "type", "ifb")
	testutil.NS(t, p.A, "ip", "link", "set", "ifbx", "up")

	root := &tc.Qdisc{Dev: p.DevA, Parent: tc.HandleRoot, Handle: tc.MakeHandle(1, 0), Kind: "htb", HTB: &tc.HTBQdisc{Default: 0x20}}
	cls := &tc.Class{Dev: p.DevA, Parent: tc.MakeHandle(1, 0), Handle: tc.MakeHandle(1, 0x20), Kind: "htb",
		Rate: 2500000, Ceil: 12500000, Burst: 12345, Cburst: 23456, Prio: 3, Quantum: 4321}
	leaf := &tc.Qdisc{Dev: p.DevA, Parent: cls.Handle, Handle: tc.MakeHandle(0x20, 0), Kind: "bfifo", Fifo: &tc.Fifo{Limit: 30000}}
	table := &tc.Filter{Dev: p.DevA, Parent: tc.MakeHandle(1, 0), Prio: 10, Proto: tc.ProtoAll, Kind: "u32",
		Handle: tc.MakeU32Handle(5, 0, 0), U32: &tc.U32{Divisor: 1}}
	inner := &tc.Filter{Dev: p.DevA, Parent: tc.MakeHandle(1, 0), Prio: 10, Proto: tc.ProtoAll, Kind: "u32",
		Handle: tc.MakeU32Handle(5, 0, 1), U32: &tc.U32{ClassID: cls.Handle, Sel: &tc.Sel{Keys: []tc.Key{
			{Mask: 0x0000ffff, Val: 22, Off: 0, NextHdr: true}}}}}
	link := &tc.Filter{Dev: p.DevA, Parent: tc.MakeHandle(1, 0), Prio: 10, Proto: tc.ProtoAll, Kind: "u32",
		Handle: 1, U32: &tc.U32{Link: tc.MakeU32Handle(5, 0, 0), Sel: &tc.Sel{
			Flags: tc.SelVarOffset, Offmask: 0x0f00, Offshift: 6,
			Keys: []tc.Key{{Mask: 0xf0000000, Val: 0x40000000}, {Mask: 0x00ff0000, Val: 0x00060000, Off: 8}}}}}
	ops := []tc.Op{{Verb: tc.Add, Obj: root}, {Verb: tc.Add, Obj: cls}, {Verb: tc.Add, Obj: leaf},
		{Verb: tc.Add, Obj: table}, {Verb: tc.Add, Obj: inner}, {Verb: tc.Add, Obj: link}}
	for _, op := range ops {
		var err error
		switch o := op.Obj.(type) {
		case *tc.Qdisc:
			err = c.QdiscAdd(o, o.Parent != tc.HandleRoot)
		case *tc.Class:
			err = c.ClassAdd(o)
		case *tc.Filter:
			err = c.FilterAdd(o)
		}
		if err != nil {
			t.Fatalf("%s: %v", op.Obj.Describe(), err)
		}
	}
	script := strings.ReplaceAll(tc.Batch(ops), "dev "+p.DevA, "dev ifbx")
	testutil.NS(t, p.A, "sh", "-c", "tc -batch - <<'EOF'\n"+script+"EOF")

	for _, what := range []string{"qdisc", "class", "filter"} {
		a := testutil.NS(t, p.A, "tc", "-d", what, "show", "dev", p.DevA)
		b := testutil.NS(t, p.A, "tc", "-d", what, "show", "dev", "ifbx")
		if what == "qdisc" {
			// direct_qlen and refcnt follow the device (txqueuelen,
			// queues), and direct_packets_stat counts what the veth
			// sent before a class took it (IPv6's neighbour
			// discovery as its link came up), which the ifb never has.
			drop := func(s string) string {
				return dropWord(dropWord(dropWord(s, "direct_qlen"), "refcnt"), "direct_packets_stat")
			}
			a, b = drop(a), drop(b)
		}
		if a != b {
			t.Errorf("%s differ:\nsluice:\n%s\ntc:\n%s", what, a, b)
		}
	}

	// Readback decodes what was encoded.
	cl, err := c.Classes(p.DevA, tc.MakeHandle(1, 0))
	if err != nil || len(cl) != 1 {
		t.Fatalf("classes: %v %v", cl, err)
	}
	got := cl[0]
	if got.Rate != cls.Rate || got.Ceil != cls.Ceil || got.Prio != 3 || got.Quantum != 4321 ||
		got.BufferTicks != tc.XmitTicks(cls.Rate, cls.Burst) || got.CbufferTicks != tc.XmitTicks(cls.Ceil, cls.Cburst) {
		t.Errorf("class readback %+v", got)
	}
	fs, err := c.Filters(p.DevA, tc.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	var sawLink, sawInner, sawTP bool
	for _, f := range fs {
		switch {
		case f.IsTP():
			sawTP = true
		case f.Handle == 1:
			sawLink = f.U32.Link == table.Handle && f.U32.Sel.Offmask == 0x0f00 && len(f.U32.Sel.Keys) == 2
		case f.Handle == inner.Handle:
			sawInner = f.U32.ClassID == cls.Handle && f.U32.Sel.Keys[0].NextHdr && f.U32.Sel.Keys[0].Val == 22
		}
	}
	if !sawLink || !sawInner || !sawTP {
		t.Errorf("filter readback link=%v inner=%v tp=%v: %+v", sawLink, sawInner, sawTP, fs)
	}
}

func dropWord(s, w string) string {
	f := strings.Fields(s)
	for i := 0; i < len(f); i++ {
		if f[i] == w && i+1 < len(f) {
			f = append(f[:i], f[i+2:]...)
		}
	}
	return strings.Join(f, " ")
}

// openPair makes a veth pair in two fresh namespaces and a Conn to the
// first, with its writes (closed when the test ends).
func openPair(t *testing.T) (*tc.Writer, *testutil.Pair) {
	t.Helper()
	testutil.RequireRoot(t)
	p := testutil.NewPair(t)
	c, err := tc.Open(p.A)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.Writer(writecap.Token{}), p
}
