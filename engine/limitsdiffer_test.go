package engine

import (
	"net/netip"
	"testing"

	"sluice/bpf"
	"sluice/tc"
	"sluice/units"
)

// A step writes what its limits change: a class's rate or ceil, an EDT
// aggregate's cap (a target) or a group's host's cap (a host entry).
func TestLimitsDiffer(t *testing.T) {
	k := bpf.HostKeyOf(0, netip.MustParsePrefix("10.0.0.2/32"))
	hook := func(target, host units.Rate) *bpf.Hook {
		return &bpf.Hook{Dev: "eth0", Content: &bpf.Content{
			Targets: []bpf.Target{{Rate: target}},
			Hosts:   map[bpf.HostKey]bpf.Target{k: {Rate: host}},
		}}
	}
	class := func(rate, ceil units.Rate) *tc.Class { return &tc.Class{Dev: "eth0", Rate: rate, Ceil: ceil} }
	for _, c := range []struct {
		name   string
		a, b   tc.Object
		differ bool
	}{
		{"the same class", class(1, 2), class(1, 2), false},
		{"a class's ceil", class(1, 2), class(1, 3), true},
		{"the same hook", hook(5, 7), hook(5, 7), false},
		{"an aggregate's cap", hook(5, 7), hook(6, 7), true},
		{"a host's cap", hook(5, 7), hook(5, 8), true},
	} {
		if got := limitsDiffer(c.a, c.b); got != c.differ {
			t.Errorf("%s: limitsDiffer = %v, want %v", c.name, got, c.differ)
		}
	}
}
