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
	out := make([]float64, len(ms))
	if capacity <= 0 || len(ms) == 0 {
		return out
	}
	open := make([]int, 0, len(ms))
	var weights float64
	for i, m := range ms {
		if m.Weight > 0 {
			open = append(open, i)
			weights += m.Weight
		}
	}
	if len(open) == 0 {
		return out
	}
	all := weights
	left := capacity
	for len(open) > 0 {
		level := left / weights
		kept := open[:0]
		settled := false
		for _, i := range open {
			if d := max(ms[i].Demand, 0); d <= level*ms[i].Weight {
				out[i] = d
				left -= d
				weights -= ms[i].Weight
				settled = true
			} else {
				kept = append(kept, i)
			}
		}
		open = kept
		if !settled {
			for _, i := range open {
				out[i] = level * ms[i].Weight
			}
			return out
		}
	}
	// Every demand met: the rest goes to everyone by weight.
	if left > 0 {
		for i, m := range ms {
			if m.Weight > 0 {
				out[i] += left * m.Weight / all
			}
		}
	}
	return out
}
