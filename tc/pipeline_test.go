package tc_test

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"sluice/tc"
)

// Held writes go to the kernel many to a send; each must still get its
// own outcome, also across sends, also when the last of a send fails,
// and the kernel must hold exactly the writes reported applied.
func TestHeldWritesEachGetTheirOutcome(t *testing.T) {
	c, p := openPair(t)
	root := &tc.Qdisc{Dev: p.DevA, Parent: tc.HandleRoot, Handle: tc.MakeHandle(1, 0), Kind: "htb", HTB: &tc.HTBQdisc{R2Q: 10}}
	class := func(minor uint16, parent tc.Handle) *tc.Class {
		return &tc.Class{Dev: p.DevA, Parent: parent, Handle: tc.MakeHandle(1, minor), Kind: "htb",
			Rate: 125000, Ceil: 125000, Burst: 3028, Cburst: 3028, Quantum: 67050}
	}
	c.Hold()
	defer c.Release()
	if err := c.QdiscAdd(root, false); err != nil {
		t.Fatal(err)
	}
	// 700 classes: three sends. Every 97th has no rate, every 89th
	// repeats the class before it, and the very last write (of the last
	// send) fails too.
	const n = 700
	want := map[uint16]bool{}
	var wantErr []error
	wantErr = append(wantErr, nil) // the root
	for i := 1; i <= n; i++ {
		minor := uint16(0x10 + i)
		cl := class(minor, tc.MakeHandle(1, 0))
		var e error
		switch {
		case i%97 == 0 || i == n:
			cl.Rate = 0
			e = unix.EINVAL
		case i%89 == 0:
			cl.Handle-- // the class before it exists already
			e = unix.EEXIST
		default:
			want[minor] = true
		}
		if err := c.ClassAdd(cl); err != nil {
			t.Fatal(err)
		}
		wantErr = append(wantErr, e)
	}
	// A refusal with the kernel's own words (extended ack), last.
	if err := c.QdiscAdd(&tc.Qdisc{Dev: p.DevA, Parent: tc.MakeHandle(1, 0xFFF0), Handle: tc.MakeHandle(0x11, 0), Kind: "bfifo", Fifo: &tc.Fifo{Limit: 9000}}, true); err != nil {
		t.Fatal(err)
	}
	wantErr = append(wantErr, unix.ENOENT)
	if c.Held() != n+2 {
		t.Fatalf("%d writes held, want %d", c.Held(), n+2)
	}
	errs := c.Flush()
	if len(errs) != n+2 || c.Held() != 0 {
		t.Fatalf("%d outcomes for %d writes, %d still held", len(errs), n+2, c.Held())
	}
	if e := errs[n+1]; e == nil || !strings.Contains(e.Error(), "qdisc add "+p.DevA+" 1:fff0: no such file or directory: ") {
		t.Fatalf("a qdisc below no class: %v, want the kernel's message", e)
	}
	for i, e := range errs {
		switch {
		case wantErr[i] == nil && e != nil:
			t.Fatalf("write %d failed: %v", i, e)
		case wantErr[i] != nil && !errors.Is(e, wantErr[i]):
			t.Fatalf("write %d: %v, want %v", i, e, wantErr[i])
		case e != nil && i <= n && !strings.HasPrefix(e.Error(), "class add "+p.DevA+" 1:"):
			t.Fatalf("write %d: %q does not say which write failed", i, e)
		}
	}
	t.Logf("e.g. %v; %v; %v", errs[97], errs[89], errs[n+1])
	live, err := c.Classes(p.DevA, tc.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint16]bool{}
	for _, cl := range live {
		got[cl.Handle.Minor()] = true
	}
	if len(got) != len(want) {
		t.Fatalf("the kernel has %d classes, %d writes succeeded", len(got), len(want))
	}
	for m := range want {
		if !got[m] {
			t.Fatalf("class 1:%x reported applied, not in the kernel", m)
		}
	}
	// Released, writes go one at a time again.
	c.Release()
	if err := c.ClassAdd(class(0x10, tc.MakeHandle(1, 0))); err != nil || c.Held() != 0 {
		t.Fatalf("write after Release: %v, %d held", err, c.Held())
	}
}
