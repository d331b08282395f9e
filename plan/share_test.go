package plan

import (
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/policy"
	"sluice/tc"
	"sluice/units"
)

func TestShareQuanta(t *testing.T) {
	mbit := func(n float64) units.Rate { return units.Rate(n * 125000) }
	gbit := mbit(1000) // the floor is 64 KB: quanta as before the floor moved
	for _, tc := range []struct {
		name string
		link units.Rate
		sibs []sibling
		want []uint32
		note string
		turn uint32
	}{
		{"weights 1:2:3", gbit, []sibling{{name: "a", rate: mbit(0.3), weight: 1}, {name: "b", rate: mbit(0.3), weight: 2}, {name: "c", rate: mbit(0.3), weight: 3}},
			[]uint32{67050, 134100, 201150}, "", 0},
		{"rates 1:5 (the issue's)", gbit, []sibling{{name: "a", rate: mbit(1), weight: 1e6}, {name: "b", rate: mbit(5), weight: 5e6}},
			[]uint32{67050, 335250}, "", 0},
		{"equal rates keep tc's floor", gbit, []sibling{{name: "a", rate: mbit(2), weight: 2e6}, {name: "b", rate: mbit(2), weight: 2e6}},
			[]uint32{67050, 67050}, "", 0},
		{"fast classes start from 1 ms of the lightest", gbit, []sibling{{name: "a", rate: mbit(1000), weight: 1}, {name: "b", rate: mbit(1000), weight: 2}},
			[]uint32{125000, 250000}, "", 0},
		{"a light class never falls below its own floor", gbit, []sibling{{name: "a", rate: mbit(1000), weight: 1}, {name: "b", rate: mbit(1), weight: 1}},
			[]uint32{125000, 125000}, "", 0},
		{"prios share separately", gbit, []sibling{{name: "a", rate: mbit(1), weight: 1, prio: 0}, {name: "b", rate: mbit(1), weight: 3, prio: 0}, {name: "c", rate: mbit(1), weight: 1, prio: 1}, {name: "d", rate: mbit(1), weight: 2, prio: 1}},
			[]uint32{67050, 201150, 67050, 134100}, "", 0},
		{"explicit quanta are kept out of the scale", gbit, []sibling{{name: "a", rate: mbit(1), weight: 1, fixed: true}, {name: "b", rate: mbit(1), weight: 2}, {name: "c", rate: mbit(1), weight: 4}},
			[]uint32{0, 67050, 134100}, "", 0},
		// The case: a 100kbit default class beside 1, 2 and 4
		// mbit on 21mbit. The anchor is a (d is lighter than c's
		// fifteenth): a gets the floor (4 ms of the link), b and c their
		// multiples; d its weight's quantum, a frame at least.
		{"a small default class", mbit(21), []sibling{{name: "a", rate: mbit(1), weight: 1e6}, {name: "b", rate: mbit(2), weight: 2e6},
			{name: "c", rate: mbit(4), weight: 4e6}, {name: "d", rate: mbit(0.1), weight: 1e5}},
			[]uint32{10500, 21000, 42000, 1514}, "prio 0: the weight of d is less than 1/15 of the heaviest sibling's", 0},
		{"a slow link's floor is three frames", mbit(8), []sibling{{name: "a", rate: mbit(1), weight: 1}, {name: "b", rate: mbit(1), weight: 1}},
			[]uint32{4542, 4542}, "", 0},
		{"weights 15:1 are followed", gbit, []sibling{{name: "a", rate: mbit(1), weight: 1}, {name: "b", rate: mbit(1), weight: 15}},
			[]uint32{67050, 1005750}, "", 0},
		{"beyond 15:1 the lighter member is below its floor", gbit, []sibling{{name: "a", rate: mbit(1), weight: 1}, {name: "b", rate: mbit(100), weight: 100}},
			[]uint32{1514, 67050}, "prio 0: the weight of a is less than 1/15 of the heaviest sibling's", 0},
		{"fast classes stop at 1 MiB", gbit, []sibling{{name: "a", rate: mbit(1000), weight: 1}, {name: "b", rate: mbit(1000), weight: 15}},
			[]uint32{125000, maxQuantumW}, "prio 0: the weight of b is too far above the lightest sibling's for HTB's quanta (at most 1048576 bytes)", 0},
		// examples/isp.yaml's top: subscribers (800mbit) cannot borrow,
		// its hosts' ceils adding up to less than its rate, so the
		// anchor is guests, the lightest within 1/15 of business, and
		// every class that borrows keeps its floor.
		{"a class that cannot borrow is out of the scale", gbit, []sibling{{name: "voice", rate: mbit(50), weight: 50}, {name: "subscribers", rate: mbit(800), weight: 800, bounded: true},
			{name: "business", rate: mbit(100), weight: 100}, {name: "guests", rate: mbit(20), weight: 20}, {name: "other", rate: mbit(30), weight: 30}},
			[]uint32{167625, 100000, 335250, 67050, 100575}, "", 0},
		// business's hosts take their turns as business's: they add up
		// to its quantum, by weight.
		{"children of a borrowing class add up to its turn", mbit(100), []sibling{{name: "dave", rate: mbit(50), weight: 50}, {name: "erin", rate: mbit(50), weight: 50}},
			[]uint32{167625, 167625}, "", 335250},
		{"a turn smaller than the floors changes nothing", mbit(100), []sibling{{name: "a", rate: mbit(50), weight: 1}, {name: "b", rate: mbit(50), weight: 2}},
			[]uint32{50000, 100000}, "", 60000},
		{"a turn is split by prio group", mbit(100), []sibling{{name: "a", rate: mbit(50), weight: 1}, {name: "b", rate: mbit(50), weight: 3}, {name: "c", rate: mbit(50), weight: 1, prio: 1}},
			[]uint32{100000, 300000, 400000}, "", 400000},
	} {
		q, notes := shareQuanta(tc.sibs, tc.link, tc.turn)
		for i := range q {
			if q[i] != tc.want[i] {
				t.Errorf("%s: quanta %v, want %v", tc.name, q, tc.want)
				break
			}
		}
		switch {
		case tc.note == "" && len(notes) > 0:
			t.Errorf("%s: unexpected note %q", tc.name, notes)
		case tc.note != "" && (len(notes) != 1 || !strings.Contains(notes[0], tc.note)):
			t.Errorf("%s: notes %q, want one with %q", tc.name, notes, tc.note)
		}
	}
}

// Properties over random groups: every member within the anchor range
// gets at least its floor and the light ones at least a frame; within a
// prio, quanta follow the weights up to rounding unless capped or
// floored; a group's quanta add up to at least its turn unless capped;
// a bounded member gets its floor and changes no other's quantum.
func TestShareQuantaProperties(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	for n := 0; n < 4000; n++ {
		sibs := make([]sibling, 2+r.Intn(8))
		for i := range sibs {
			sibs[i] = sibling{rate: units.Rate(1000 + r.Int63n(2e8)), weight: 1 + r.Float64()*40, prio: uint32(r.Intn(2)), bounded: r.Intn(5) == 0}
		}
		link := units.Rate(1e5 + r.Int63n(2e8))
		var turn uint32
		if r.Intn(2) == 0 {
			turn = uint32(r.Int63n(3 << 20))
		}
		q, _ := shareQuanta(sibs, link, turn)
		var heaviest [2]float64
		for _, s := range sibs {
			if !s.bounded {
				heaviest[s.prio] = max(heaviest[s.prio], s.weight)
			}
		}
		floored := func(i int) bool {
			s := sibs[i]
			return s.weight*anchorRange >= heaviest[s.prio] && q[i] == QuantumFor(s.rate, link, s.leaf) || q[i] == frameBytes
		}
		var sum [2]uint64
		var capped [2]bool
		for i, s := range sibs {
			lo := QuantumFor(s.rate, link, s.leaf)
			if s.bounded {
				if q[i] != lo {
					t.Fatalf("%+v: bounded, quantum %d, want its floor %d", s, q[i], lo)
				}
				continue
			}
			sum[s.prio] += uint64(q[i])
			capped[s.prio] = capped[s.prio] || q[i] == maxQuantumW
			if s.weight*anchorRange < heaviest[s.prio] {
				lo = frameBytes
			}
			if q[i] < lo || q[i] > maxQuantumW {
				t.Fatalf("%+v: quantum %d outside [%d, %d]", s, q[i], lo, maxQuantumW)
			}
			for j, o := range sibs {
				if o.prio != s.prio || o.bounded || q[i] == maxQuantumW || q[j] == maxQuantumW {
					continue
				}
				got, want := float64(q[i])/float64(q[j]), s.weight/o.weight
				if math.Abs(got/want-1) > 0.001 && !floored(i) && !floored(j) {
					t.Fatalf("%+v vs %+v: quanta %d:%d, weights %.3f:%.3f", s, o, q[i], q[j], s.weight, o.weight)
				}
			}
		}
		for p := range sum {
			if sum[p] > 0 && !capped[p] && sum[p]+8 < uint64(turn) {
				t.Fatalf("prio %d: quanta add up to %d, below the turn %d (%+v: %v)", p, sum[p], turn, sibs, q)
			}
		}
		// Bounded members are outside the scale: dropping them leaves
		// the others' quanta as they were.
		var rest []sibling
		var restQ []uint32
		for i, s := range sibs {
			if !s.bounded {
				rest = append(rest, s)
				restQ = append(restQ, q[i])
			}
		}
		if len(rest) > 0 {
			q2, _ := shareQuanta(rest, link, turn)
			for i := range q2 {
				if q2[i] != restQ[i] {
					t.Fatalf("bounded members changed the others' quanta: %v, without them %v", restQ, q2)
				}
			}
		}
	}
}

// Through the planner: weights set the quanta, hosts share by rate, and
// an edit that leaves the lightest host alone changes one class.
func TestPlanWeights(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte("name,addresses,rate,ceil\nh1,10.0.0.1,2mbit,30mbit\nh2,10.0.0.2,4mbit,30mbit\nh3,10.0.0.3,6mbit,30mbit\n"), 0o644)
	src := `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: c
      classes:
        - {name: a, rate: 1mbit, weight: 1, match: [{dport: 1}]}
        - {name: b, rate: 1mbit, weight: 2, match: [{dport: 2}]}
        - {name: c, rate: 1mbit, weight: 3}
        - {name: voice, rate: 1mbit, prio: 2}
        - {name: subs, rate: 20mbit, prio: 1, per_host: {by: dst, hosts_file: hosts.csv}}
`
	// a, b, c and voice are prio 0 siblings: weights 1, 2, 3 against
	// voice's rate would mix units, so voice is moved to prio 2 and subs
	// (by rate) to prio 1.
	src = strings.Replace(src, "{name: voice, rate: 1mbit, prio: 0}", "{name: voice, rate: 1mbit, prio: 2}", 1)
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(src), 0o644)
	quanta := func() map[string]uint32 {
		p, _, err := policy.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := Build(p, Everything, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint32{}
		for _, o := range pl.Devices[0].Objects {
			if c, ok := o.(*tc.Class); ok {
				out[c.Name] = c.Quantum
			}
		}
		return out
	}
	q := quanta()
	// fq_codel leaves (this kernel has it): the floor is 1 ms of what
	// the group shares, three frames for the 30mbit tree's classes and
	// subs's 20mbit hosts alike.
	for name, want := range map[string]uint32{"a": 4542, "b": 9084, "c": 13626, "voice": 4542,
		"subs/h1": 4542, "subs/h2": 9084, "subs/h3": 13626} {
		if q[name] != want {
			t.Errorf("class %s: quantum %d, want %d (all: %v)", name, q[name], want, q)
		}
	}
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte("name,addresses,rate,ceil\nh1,10.0.0.1,2mbit,30mbit\nh2,10.0.0.2,4mbit,30mbit\nh3,10.0.0.3,8mbit,30mbit\n"), 0o644)
	q2 := quanta()
	changed := 0
	for name := range q {
		if q2[name] != q[name] {
			changed++
		}
	}
	if changed != 1 || q2["subs/h3"] != 18168 {
		t.Errorf("h3 to 8mbit: %d quanta changed (want 1), h3's %d (want 18168)", changed, q2["subs/h3"])
	}
	// A host lighter than all the others rescales its siblings: the
	// lightest gets the floor.
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte("name,addresses,rate,ceil\nh0,10.0.0.9,1mbit,30mbit\nh1,10.0.0.1,2mbit,30mbit\nh2,10.0.0.2,4mbit,30mbit\nh3,10.0.0.3,8mbit,30mbit\n"), 0o644)
	q3 := quanta()
	if q3["subs/h0"] != 4542 || q3["subs/h1"] != 9084 || q3["subs/h3"] != 36336 || q3["a"] != q["a"] {
		t.Errorf("a 1mbit host joins: %v", q3)
	}
}

// An EDT tree's controller: each child is an aggregate; the plan names
// its target, and the hook lists the targets whose rate the controller
// sets (nonprod only: prod beside nonprod is never limited).
func TestPlanEDTController(t *testing.T) {
	p := parseEDT(t, `interfaces:
  - name: eth0
    egress:
      backend: edt
      rate: 30mbit
      default: b
      sharing: {mode: controller, cap: 80%}
      classes:
        - {name: prod, rate: 2mbit, prio: 0, match: [{dport: 22}]}
        - {name: a, rate: 1mbit, prio: 1, weight: 1, match: [{dport: 80}]}
        - {name: b, rate: 1mbit, prio: 1, weight: 2}
`)
	pl, err := Build(p, Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := pl.Devices[0]
	hook, _ := edtOf(t, d)
	if len(d.Controllers) != 1 {
		t.Fatalf("controllers %+v", d.Controllers)
	}
	c := d.Controllers[0]
	if c.Capacity != 3e6 || c.Horizon != policy.DefaultHorizon || len(c.Children) != 3 {
		t.Fatalf("controller %+v", c)
	}
	var controlled []string
	for _, ch := range c.Children {
		tg := hook.Content.Targets[ch.Target]
		if tg.Rate != ch.Ceil || tg.Counter == 0 || ch.ID == "" {
			t.Errorf("%s: target %d %+v, child %+v", ch.Name, ch.Target, tg, ch)
		}
		if ch.Prod != (ch.Name == "prod") {
			t.Errorf("%s: prod %v", ch.Name, ch.Prod)
		}
		for _, i := range hook.Controlled {
			if i == ch.Target {
				controlled = append(controlled, ch.Name)
			}
		}
	}
	if strings.Join(controlled, ",") != "a,b" {
		t.Errorf("controlled targets %v, want a and b", controlled)
	}
}

// A controller over an HTB tree gives the shares as rates (Assure) where
// the parent guarantees all it shares: the direction's top level, or a
// class whose rate is its ceil. With a cap, or under a class that only
// borrows part of what its children share, the shares are ceils; an
// EDT tree's are caps. A cap bounds the controller (share's Bound): a
// child given no limit is held to its open share, not its ceil.
func TestPlanControllerAssures(t *testing.T) {
	for _, tc := range []struct {
		name, src     string
		assure, bound []bool
	}{
		{"top level", `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: b
      sharing: controller
      classes:
        - {name: a, rate: 1mbit, weight: 1, match: [{dport: 1}]}
        - {name: b, rate: 1mbit, weight: 2}
`, []bool{true}, []bool{false}},
		{"cap", `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: b
      sharing: {mode: controller, cap: 80%}
      classes:
        - {name: a, rate: 1mbit, weight: 1, match: [{dport: 1}]}
        - {name: b, rate: 1mbit, weight: 2}
`, []bool{false}, []bool{true}},
		{"under classes", `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: other
      classes:
        - name: full
          rate: 10mbit
          ceil: 10mbit
          sharing: controller
          classes:
            - {name: a, rate: 1mbit, match: [{dport: 1}]}
            - {name: b, rate: 1mbit, match: [{dport: 2}]}
        - name: borrows
          rate: 10mbit
          ceil: 20mbit
          sharing: controller
          classes:
            - {name: c, rate: 1mbit, match: [{dport: 3}]}
            - {name: d, rate: 1mbit, match: [{dport: 4}]}
        - {name: other, rate: 1mbit}
`, []bool{true, false}, []bool{false, false}},
		{"edt", `interfaces:
  - name: eth0
    egress:
      backend: edt
      rate: 30mbit
      default: b
      sharing: controller
      classes:
        - {name: a, rate: 1mbit, match: [{dport: 1}]}
        - {name: b, rate: 1mbit}
`, []bool{false}, []bool{false}},
		{"edt cap", `interfaces:
  - name: eth0
    egress:
      backend: edt
      rate: 30mbit
      default: b
      sharing: {mode: controller, cap: 20mbit}
      classes:
        - {name: a, rate: 1mbit, match: [{dport: 1}]}
        - {name: b, rate: 1mbit}
`, []bool{false}, []bool{true}},
	} {
		pl, err := Build(parseEDT(t, tc.src), Everything, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got, bound []bool
		for _, c := range pl.Devices[0].Controllers {
			got = append(got, c.Assure)
			bound = append(bound, c.Bound)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.assure) {
			t.Errorf("%s: assure %v, want %v", tc.name, got, tc.assure)
		}
		if fmt.Sprint(bound) != fmt.Sprint(tc.bound) {
			t.Errorf("%s: bound %v, want %v", tc.name, bound, tc.bound)
		}
	}
}

// A child lighter than HTB's quanta weigh (below 1/15 of the heaviest
// sibling of its prio) is capped: an assuring controller holds its share
// as its ceil too. Prod children never are.
func TestPlanControllerCapsTheLight(t *testing.T) {
	pl, err := Build(parseEDT(t, `interfaces:
  - name: eth0
    egress:
      rate: 21mbit
      default: d
      sharing: controller
      classes:
        - {name: rt, rate: 10kbit, prio: 0, match: [{dport: 22}]}
        - {name: a, rate: 1mbit, prio: 1, match: [{dport: 1}]}
        - {name: b, rate: 2mbit, prio: 1, match: [{dport: 2}]}
        - {name: c, rate: 4mbit, prio: 1, match: [{dport: 3}]}
        - {name: d, rate: 25kbit, prio: 1}
`), Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	capped := map[string]bool{}
	for _, c := range pl.Devices[0].Controllers[0].Children {
		capped[c.Name] = c.Capped
	}
	if want := map[string]bool{"rt": false, "a": false, "b": false, "c": false, "d": true}; fmt.Sprint(capped) != fmt.Sprint(want) {
		t.Errorf("capped %v, want %v", capped, want)
	}
}
