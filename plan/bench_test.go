package plan

import "testing"

// BenchmarkReplan10k re-plans a 10,000-subscriber sharded tree from its
// previous allocation: the planning part of a one-subscriber change.
func BenchmarkReplan10k(b *testing.B) {
	hosts := make([]int, 10000)
	for i := range hosts {
		hosts[i] = i
	}
	pol := shardPolicy(b, hosts, "")
	feats := withQueues(16, false)
	first, err := Build(pol, feats, nil)
	if err != nil {
		b.Fatal(err)
	}
	prev := map[string]*Alloc{"eth0": first.Devices[0].Alloc}
	b.ResetTimer()
	for b.Loop() {
		if _, err := Build(pol, feats, prev); err != nil {
			b.Fatal(err)
		}
	}
}
