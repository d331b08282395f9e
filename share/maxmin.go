// Package share computes how a link's capacity is split between the
// classes that want it: weighted max-min fairness (MaxMin) and seed
// 000's controller around it (Controller), which turns each quantum's
// measured demand into a limit per class, applied only once a class
// uses most of it ("delayed limits").
//
// Everything here is pure: the agent feeds it counters and writes the
// limits it returns, and tests drive it with a fake clock.
package share

// Member is one claimant of a max-min allocation.
type Member struct {
	// Weight is the member's relative claim (> 0).
	Weight float64
	// Demand is the most the member can use; +Inf for no bound.
	Demand float64
}

// MaxMin splits capacity between members by weighted max-min fairness:
// every member gets min(demand, λ·weight), λ the largest level that the
// capacity allows (water-filling: members wanting less than their
// weighted share keep what they want, the rest is split again among the
// others by weight). When the demands add up to less than the capacity,
// what is left is split among all members by weight, as seed 000 does,
// so the shares always add up to the capacity: a member whose demand
// grows finds room at once.
//
// Members of weight 0 or less get nothing; with none left the result is
// all zeros.
func MaxMin(capacity float64, ms []Member) []float64 {
	return spreadRest(capacity, ms, waterfill(capacity, ms))
}

// spreadRest hands what out leaves of capacity (every demand met) to
// every member by weight, so that the shares add up to the capacity.
func spreadRest(capacity float64, ms []Member, out []float64) []float64 {
	var used, all float64
	for i, m := range ms {
		used += out[i]
		if m.Weight > 0 {
			all += m.Weight
		}
	}
	if left := capacity - used; left > 0 && all > 0 {
		for i, m := range ms {
			if m.Weight > 0 {
				out[i] += left * m.Weight / all
			}
		}
	}
	return out
}

// MaxMinOver is MaxMin above guarantees, as HTB and the reference
// (Ideal) share a parent: each member first gets its floor (its rate,
// or its demand if less), then what is left is split by weighted
// max-min among those that want more, and what nobody wants by weight
// among all; the shares add up to the capacity. When the floors alone
// exceed the capacity (overbooked), it is split by max-min weighted by
// the floors. floors[i] belongs to ms[i].
//
// Splitting by weight alone, a tenant of weight 1 and rate 5mbit
// beside one of weight 3 and rate 10mbit, under a cap of 80mbit, got
// 20 where HTB and the reference give it 5 + 65/4 = 21.25
// (examples/sharing.yaml's conformance run).
func MaxMinOver(capacity float64, ms []Member, floors []float64) []float64 {
	out := make([]float64, len(ms))
	var guaranteed float64
	for i, m := range ms {
		if m.Weight > 0 {
			out[i] = max(min(m.Demand, floors[i]), 0)
			guaranteed += out[i]
		}
	}
	if guaranteed >= capacity {
		byRate := make([]Member, len(ms))
		for i := range ms {
			byRate[i] = Member{Weight: max(floors[i], 1e-9), Demand: out[i]}
		}
		return waterfill(capacity, byRate)
	}
	more := make([]Member, len(ms))
	for i, m := range ms {
		more[i] = Member{Weight: m.Weight, Demand: m.Demand - out[i]}
	}
	for i, x := range waterfill(capacity-guaranteed, more) {
		out[i] += x
	}
	return spreadRest(capacity, ms, out)
}
