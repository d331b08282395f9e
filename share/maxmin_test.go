package share

import (
	"math"
	"math/rand"
	"testing"
)

func near(a, b float64) bool {
	if math.IsInf(a, 0) || math.IsInf(b, 0) {
		return a == b
	}
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func TestMaxMinExamples(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		name     string
		capacity float64
		ms       []Member
		want     []float64
	}{
		// Seed 000's example: 900 among three, A wants 200.
		{"seed 000", 900, []Member{{1, 200}, {1, inf}, {1, inf}}, []float64{200, 350, 350}},
		{"weights 1:2:3 all hungry", 30, []Member{{1, inf}, {2, inf}, {3, inf}}, []float64{5, 10, 15}},
		{"one idle", 30, []Member{{1, 0}, {2, inf}, {3, inf}}, []float64{0, 12, 18}},
		// Demands below capacity: the rest by weight, on top.
		{"room left", 30, []Member{{1, 2}, {2, 4}, {3, 6}}, []float64{5, 10, 15}},
		{"room left unequal", 40, []Member{{1, 10}, {1, 10}}, []float64{20, 20}},
		{"cascade", 100, []Member{{1, 10}, {1, 20}, {1, inf}, {1, inf}}, []float64{10, 20, 35, 35}},
		{"zero weight gets nothing", 10, []Member{{0, inf}, {1, inf}}, []float64{0, 10}},
		{"nothing to share", 0, []Member{{1, inf}}, []float64{0}},
	} {
		got := MaxMin(tc.capacity, tc.ms)
		for i := range got {
			if !near(got[i], tc.want[i]) {
				t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
}

// The properties the issue asks for, over random members: shares add up
// to the capacity; while the demands exceed it, no member gets more than
// it wants and every member short of its demand is at one common level
// (weight-proportional) that no satisfied member's demand exceeds;
// weights are respected; the allocation is a fixed point (demanding
// exactly one's share gives the same shares); order does not matter.
func TestMaxMinProperties(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for n := 0; n < 20000; n++ {
		ms := make([]Member, 1+r.Intn(8))
		var demand float64
		for i := range ms {
			ms[i].Weight = 0.1 + r.Float64()*10
			switch r.Intn(4) {
			case 0:
				ms[i].Demand = math.Inf(1)
			case 1:
				ms[i].Demand = 0
			default:
				ms[i].Demand = r.Float64() * 100
			}
			demand += ms[i].Demand
		}
		capacity := r.Float64() * 300
		got := MaxMin(capacity, ms)
		var sum float64
		for _, g := range got {
			sum += g
		}
		if !near(sum, capacity) {
			t.Fatalf("%v over %.3f: shares %v add up to %.6f", ms, capacity, got, sum)
		}
		if demand >= capacity {
			level := -1.0
			for i, m := range ms {
				if got[i] > m.Demand*(1+1e-9)+1e-9 {
					t.Fatalf("%v over %.3f: member %d gets %.4f above its demand", ms, capacity, i, got[i])
				}
				if got[i] < m.Demand*(1-1e-9)-1e-9 {
					l := got[i] / m.Weight
					if level >= 0 && !near(l, level) {
						t.Fatalf("%v over %.3f: members short of demand at levels %.6f and %.6f", ms, capacity, level, l)
					}
					level = l
				}
			}
			for i, m := range ms {
				if level >= 0 && near(got[i], m.Demand) && m.Demand/m.Weight > level*(1+1e-9)+1e-9 {
					t.Fatalf("%v over %.3f: member %d satisfied above the level %.6f", ms, capacity, i, level)
				}
			}
		} else {
			for i, m := range ms {
				if got[i] < m.Demand-1e-9 || !near((got[i]-m.Demand)/m.Weight, (capacity-demand)/totalWeight(ms)) {
					t.Fatalf("%v over %.3f: member %d gets %.4f, not its demand plus its weight's part of the rest", ms, capacity, i, got[i])
				}
			}
		}
		fixed := make([]Member, len(ms))
		for i, m := range ms {
			fixed[i] = Member{Weight: m.Weight, Demand: got[i]}
		}
		again := MaxMin(capacity, fixed)
		for i := range again {
			if !near(again[i], got[i]) {
				t.Fatalf("not a fixed point: %v then %v", got, again)
			}
		}
		perm := r.Perm(len(ms))
		shuffled := make([]Member, len(ms))
		for i, p := range perm {
			shuffled[i] = ms[p]
		}
		for i, s := range MaxMin(capacity, shuffled) {
			if !near(s, got[perm[i]]) {
				t.Fatalf("order matters: %v vs %v", ms, shuffled)
			}
		}
	}
	// All unbounded: shares are exactly the weights' proportions.
	for n := 0; n < 1000; n++ {
		ms := make([]Member, 2+r.Intn(6))
		for i := range ms {
			ms[i] = Member{Weight: 0.1 + r.Float64()*10, Demand: math.Inf(1)}
		}
		got := MaxMin(100, ms)
		for i := range ms {
			if !near(got[i], 100*ms[i].Weight/totalWeight(ms)) {
				t.Fatalf("weights %v: shares %v", ms, got)
			}
		}
	}
}

func totalWeight(ms []Member) float64 {
	var w float64
	for _, m := range ms {
		w += m.Weight
	}
	return w
}
