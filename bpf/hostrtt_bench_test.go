package bpf_test

import (
	"net/netip"
	"testing"

	"sluice/bpf"
	"sluice/bpf/bpftest"
	"sluice/testutil"
)

// BenchmarkHostRTTRead10000 is what a reading of a 10,000-host tree
// with rtt: on adds: the hosts' histograms, in one batch.
func BenchmarkHostRTTRead10000(b *testing.B) {
	testutil.RequireRoot(b)
	c := &bpf.Content{L2Len: 14, RTT: &bpf.RTT{Record: true}, Targets: []bpf.Target{{Classid: 0x10010, Counter: 1}},
		Blocks: []bpf.Block{{}}, Hosts: map[bpf.HostKey]bpf.Target{}}
	idx := make([]uint32, 0, 10000)
	for i := 0; i < 10000; i++ {
		a := netip.AddrFrom4([4]byte{10, 64, byte(i >> 8), byte(i)})
		c.Hosts[bpf.HostKeyOf(0, netip.PrefixFrom(a, 32))] = bpf.Target{Classid: 0x10100 + uint32(i), Counter: uint32(2 + i)}
		idx = append(idx, uint32(2+i))
	}
	p, err := bpftest.Writable(bpf.Load(c))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	for b.Loop() {
		if _, err := p.HostRTT(idx); err != nil {
			b.Fatal(err)
		}
	}
}
