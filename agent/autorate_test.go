package agent

import (
	"testing"
	"time"

	"sluice/autorate"
	"sluice/policy"
	"sluice/units"
)

// The controllers' figures move every step (50 ms); they are published
// (a new generation: the server encodes its replies again) at most every
// autoPublishEvery, while a new state or written rate is published at
// once and nothing new is not published at all.
func TestAutoPublishedOnChange(t *testing.T) {
	a := fakeAgent(10, false)
	t0 := time.Now()
	ctl, err := autorate.New(autorate.ConfigFor(units.FromBits(1e6), units.FromBits(10e6), units.FromBits(100e6), 0, false), t0)
	if err != nil {
		t.Fatal(err)
	}
	tr := &autoTree{dev: "eth0 egress", iface: "eth0", dir: "egress", ctl: ctl, written: units.FromBits(10e6),
		last: autorate.Decision{State: autorate.High, Rate: units.FromBits(10e6)}}
	a.autos = map[string]*autoTree{tr.dev: tr}
	gen := func() uint64 { return a.generation() }

	a.publishAuto(t0, true)
	g0 := gen()
	a.publishAuto(t0.Add(10*time.Millisecond), false)
	if gen() != g0 {
		t.Error("nothing changed, and a new generation was published")
	}
	tr.last.Rate = units.FromBits(10.2e6) // a figure only
	a.publishAuto(t0.Add(50*time.Millisecond), false)
	if gen() != g0 {
		t.Error("the decided rate moved 50 ms after the last publication, and it was published at once")
	}
	a.publishAuto(t0.Add(autoPublishEvery), false)
	if gen() != g0+1 || a.auto[0].RateBytesPerSecond != uint64(units.FromBits(10.2e6)) {
		t.Errorf("the decided rate moved and was not published after %v", autoPublishEvery)
	}
	tr.last.State = autorate.Bloat // what an operator acts on
	a.publishAuto(t0.Add(autoPublishEvery+time.Millisecond), false)
	if gen() != g0+2 || a.auto[0].State != "bloat" {
		t.Errorf("a new state was not published at once (state %q)", a.auto[0].State)
	}
	tr.written = units.FromBits(10.2e6)
	a.publishAuto(t0.Add(autoPublishEvery+2*time.Millisecond), false)
	if gen() != g0+3 || a.auto[0].WrittenBytesPerSecond != uint64(tr.written) {
		t.Error("a new written rate was not published at once")
	}
}

// An upload and a download of one interface on one echo prober each see
// the other's queue in half the round trip: their automatic thresholds
// keep to sharedEchoMin. Timestamps measure each way apart, and another
// interface's tree is not the other direction: both keep their own.
func TestSharedFloor(t *testing.T) {
	tree := func(iface, dir, probe string) *autoTree {
		return &autoTree{iface: iface, dir: dir, cfg: policy.Auto{Probe: probe}}
	}
	up, down, other := tree("wan", "egress", "echo"), tree("wan", "ingress", "echo"), tree("wan2", "egress", "echo")
	for _, tc := range []struct {
		name  string
		trees []*autoTree
		of    *autoTree
		want  time.Duration
	}{
		{"both ways, echo", []*autoTree{up, down}, up, sharedEchoMin},
		{"the download of both ways", []*autoTree{up, down}, down, sharedEchoMin},
		{"alone", []*autoTree{up}, up, 0},
		{"two interfaces' uploads", []*autoTree{up, other}, up, 0},
		{"timestamps", []*autoTree{tree("wan", "egress", "timestamp"), tree("wan", "ingress", "timestamp")}, nil, 0},
	} {
		of := tc.of
		if of == nil {
			of = tc.trees[0]
		}
		if got := sharedFloor(&autoProber{trees: tc.trees}, of); got != tc.want {
			t.Errorf("%s: floor %v, want %v", tc.name, got, tc.want)
		}
	}
}
