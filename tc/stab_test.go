package tc_test

import (
	"fmt"
	"testing"
	"time"

	"sluice/tc"
	"sluice/testutil"
)

// A size table counts a packet as tc's does: overhead added, then ATM's
// cells (48 bytes of payload in 53), with tc's 4-byte slots.
func TestStabSize(t *testing.T) {
	for _, c := range []struct {
		stab tc.Stab
		n    int
		want int
	}{
		{tc.Stab{Overhead: 18, Linklayer: tc.LinkEthernet}, 1514, 1532},
		{tc.Stab{Overhead: -14, Linklayer: tc.LinkEthernet}, 1514, 1500},
		{tc.Stab{Overhead: 40, Linklayer: tc.LinkATM}, 1514, 1749}, // 1554 -> 33 cells
		{tc.Stab{Overhead: 40, Linklayer: tc.LinkATM}, 60, 159},    // 100 -> 3 cells
		{tc.Stab{Overhead: 0, Linklayer: tc.LinkATM}, 48, 53},      // one cell exactly
		{tc.Stab{Overhead: 0, Linklayer: tc.LinkATM}, 49, 106},     // and one byte more
		{tc.Stab{Overhead: 0, Linklayer: tc.LinkEthernet, MPU: 64}, 42, 64},
		{tc.Stab{Overhead: 8, Linklayer: tc.LinkATM}, 64000, 71232}, // past the table: 31 of its last entry and one
	} {
		if got := c.stab.Size(c.n); got != c.want {
			t.Errorf("%s: %d bytes count as %d, want %d", c.stab.String(), c.n, got, c.want)
		}
	}
}

// The kernel charges a root HTB's classes what the size table says, the
// same for sluice's table as for the one tc(8) makes from the same
// words; the table changes and goes in place.
func TestStabAsTCMakesIt(t *testing.T) {
	c, p := openPair(t)
	testutil.NS(t, p.A, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
	testutil.NS(t, p.A, "ping", "-c", "1", "-W", "2", testutil.AddrB) // the neighbour, resolved before counting
	stab := &tc.Stab{Overhead: 40, Linklayer: tc.LinkATM}
	root := &tc.Qdisc{Dev: p.DevA, Parent: tc.HandleRoot, Handle: tc.MakeHandle(1, 0), Kind: "htb", HTB: &tc.HTBQdisc{Default: 0x10}, Stab: stab}
	cls := &tc.Class{Dev: p.DevA, Parent: tc.MakeHandle(1, 0), Handle: tc.MakeHandle(1, 0x10), Kind: "htb",
		Rate: 12500000, Ceil: 12500000, Burst: 15000, Cburst: 15000, Quantum: 1514}
	charged := func(payload int) (bytes, pkts uint64) {
		t.Helper()
		before, err := c.Class(p.DevA, cls.Handle)
		if err != nil || before == nil || before.Stats == nil {
			t.Fatalf("class %s: %v", cls.Handle, err)
		}
		testutil.NS(t, p.A, "ping", "-q", "-c", "5", "-i", "0.05", "-s", fmt.Sprint(payload), "-W", "2", testutil.AddrB)
		time.Sleep(50 * time.Millisecond)
		after, err := c.Class(p.DevA, cls.Handle)
		if err != nil || after == nil || after.Stats == nil {
			t.Fatalf("class %s: %v", cls.Handle, err)
		}
		return after.Stats.Bytes - before.Stats.Bytes, after.Stats.Packets - before.Stats.Packets
	}
	check := func(who string, s *tc.Stab) {
		t.Helper()
		for _, payload := range []int{20, 500, 1400} {
			frame := 14 + 20 + 8 + payload
			want := uint64(frame)
			if s != nil {
				want = uint64(s.Size(frame))
			}
			bytes, pkts := charged(payload)
			if pkts != 5 || bytes != 5*want {
				t.Errorf("%s: 5 pings of %d-byte frames charged %d bytes in %d packets, want %d in 5", who, frame, bytes, pkts, 5*want)
			}
		}
	}
	if err := c.QdiscAdd(root, false); err != nil {
		t.Fatal(err)
	}
	if err := c.ClassAdd(cls); err != nil {
		t.Fatal(err)
	}
	q, err := c.QdiscAt(p.DevA, tc.HandleRoot)
	if err != nil || q == nil || q.Stab == nil || *q.Stab != *stab {
		t.Fatalf("root read back %+v (%v), want its stab %s", q, err, stab)
	}
	check("sluice's", stab)

	// In place: another table, then none.
	other := &tc.Stab{Overhead: 18, Linklayer: tc.LinkEthernet, MPU: 128}
	root.Stab = other
	if err := c.QdiscChange(root); err != nil {
		t.Fatal(err)
	}
	check("changed in place", other)
	root.Stab = nil
	if err := c.QdiscChange(root); err != nil {
		t.Fatal(err)
	}
	if q, _ := c.QdiscAt(p.DevA, tc.HandleRoot); q == nil || q.Stab != nil || q.HTB == nil || q.HTB.Default != 0x10 {
		t.Fatalf("after removing the table: %+v", q)
	}
	check("removed", nil)

	// tc(8)'s own table from the same words.
	testutil.NS(t, p.A, "sh", "-c", fmt.Sprintf("tc qdisc del dev %s root && tc qdisc add dev %s root handle 1: %s htb default 10 && tc class add dev %s parent 1: classid 1:10 htb rate 100mbit",
		p.DevA, p.DevA, stab, p.DevA))
	check("tc's", stab)
}
