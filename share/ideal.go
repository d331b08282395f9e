package share

import (
	"fmt"
	"math"
	"sort"
)

// Class is one node of a class tree as the reference sees it: what the
// policy promises it (Rate), bounds it to (Ceil), the order (Prio) and
// proportion (Weight) in which it gets spare capacity, and, for a leaf,
// what it would send (Demand). Rates are bits per second.
type Class struct {
	Name string
	// Rate is the guarantee: the class gets up to this whenever it
	// wants it, before any sibling borrows.
	Rate float64
	// Ceil bounds what the class may use, guarantee and borrowing
	// together (+Inf for no bound of its own).
	Ceil float64
	// Prio orders borrowing: siblings of a lower Prio take spare
	// capacity first, those of the next Prio what they leave.
	Prio int
	// Weight is the class's claim on spare capacity among siblings of
	// its Prio (> 0; the policy's weight, or its rate).
	Weight float64
	// Demand (leaves) is the most the class would send; +Inf for a
	// greedy sender. Inner classes want what their children want.
	Demand float64
	// Cap, on a class whose children a sharing controller shares, bounds
	// what its children that are not Prod may use together (0: none),
	// after what the Prod children used is taken off, as seed 000's
	// controller does. Guarantees are kept whatever the cap.
	Cap float64
	// Prod marks a child that a controller never limits.
	Prod bool
	// LeafPrio, on the root, orders borrowing as HTB does: by the Prio
	// of the leaf that borrows, at every level, so a class with
	// children takes spare capacity from its parent in as many turns
	// as its leaves have prios (its own Prio is not read). Without it
	// siblings borrow by their own Prio (EDT's aggregates).
	LeafPrio bool
	Children []*Class
}

// Ideal is the hierarchical weighted max-min allocation of root's
// capacity (min of its Rate and Ceil) for the leaves' demands: the
// reference every sharing claim of sluice is measured against.
//
// Top down, a class's allocation is split among its children: first
// each child's guarantee (its Rate, or less if it wants less); what is
// left goes to the children that want more, lowest Prio first, and
// among one Prio by weighted max-min (water-filling on Weight, each
// child bounded by its Ceil and its demand); then each child's
// allocation is split among its own children the same way (with
// LeafPrio, a child with children borrows in the turn of each prio its
// leaves want more at, as HTB lends). A class
// wants the least of its Ceil and its demand (a leaf's Demand, or the
// sum of what its children want). When the guarantees alone exceed
// what the parent has (overbooked hosts), the parent's allocation is
// split by max-min weighted by Rate.
//
// The result maps every class's Name to its allocation; names must be
// unique. Nothing is handed out that nobody wants: the root gets the
// least of its capacity and its demand.
func Ideal(root *Class) (map[string]float64, error) {
	out := map[string]float64{}
	want := map[*Class]float64{}
	var measure func(c *Class) (float64, error)
	measure = func(c *Class) (float64, error) {
		if _, dup := out[c.Name]; dup {
			return 0, fmt.Errorf("class %q appears twice", c.Name)
		}
		out[c.Name] = 0
		if c.Rate < 0 || c.Ceil < 0 || math.IsNaN(c.Rate) || math.IsNaN(c.Ceil) || math.IsNaN(c.Demand) {
			return 0, fmt.Errorf("class %q: rate, ceil and demand must be numbers >= 0", c.Name)
		}
		w := c.Demand
		if len(c.Children) > 0 {
			var prod, other, otherGuaranteed float64
			for _, ch := range c.Children {
				if ch.Weight <= 0 || math.IsNaN(ch.Weight) || math.IsInf(ch.Weight, 0) {
					return 0, fmt.Errorf("class %q: weight %v: must be a positive number", ch.Name, ch.Weight)
				}
				x, err := measure(ch)
				if err != nil {
					return 0, err
				}
				if ch.Prod {
					prod += x
				} else {
					other += x
					otherGuaranteed += math.Min(x, ch.Rate)
				}
			}
			if c.Cap > 0 {
				// What split will hand out: prod first, the others
				// their guarantees and at most the cap less prod.
				other = math.Min(other, math.Max(c.Cap-prod, otherGuaranteed))
			}
			w = prod + other
		}
		w = math.Max(math.Min(w, c.Ceil), 0)
		want[c] = w
		return w, nil
	}
	if _, err := measure(root); err != nil {
		return nil, err
	}
	var parts func(c *Class, a float64) map[int]float64
	if root.LeafPrio {
		parts = func(c *Class, a float64) map[int]float64 { return leafParts(c, a, want, parts) }
	}
	var give func(c *Class, a float64)
	give = func(c *Class, a float64) {
		out[c.Name] = a
		if len(c.Children) == 0 {
			return
		}
		var sum float64
		for i, x := range split(c, a, want, parts) {
			give(c.Children[i], x)
			sum += x
		}
		if c.Cap > 0 {
			out[c.Name] = sum // the cap may leave some of a unused
		}
	}
	give(root, math.Min(want[root], math.Min(root.Rate, root.Ceil)))
	return out, nil
}

// leafParts is what class c, given a, still wants, by the Prio of the
// leaves that want it: c's a split among its children as give splits
// it, each child's parts summed, and the sum bounded by what c wants
// (its Ceil and those below it), lower prios first, as they borrow
// first.
func leafParts(c *Class, a float64, want map[*Class]float64, parts func(*Class, float64) map[int]float64) map[int]float64 {
	if len(c.Children) == 0 {
		return map[int]float64{c.Prio: math.Max(want[c]-a, 0)}
	}
	sum := map[int]float64{}
	for i, x := range split(c, a, want, parts) {
		for p, v := range parts(c.Children[i], x) {
			sum[p] += v
		}
	}
	room := math.Max(want[c]-a, 0)
	out := map[int]float64{}
	for _, p := range sortedPrios(sum) {
		out[p] = math.Min(sum[p], room)
		room -= out[p]
	}
	return out
}

func sortedPrios(m map[int]float64) []int {
	ps := make([]int, 0, len(m))
	for p := range m {
		ps = append(ps, p)
	}
	sort.Ints(ps)
	return ps
}

// split divides a (at most what c wants) among c's children. With
// parts (LeafPrio), a child with children borrows in the turn of each
// prio its leaves want more at, for what they want there.
func split(c *Class, a float64, want map[*Class]float64, parts func(*Class, float64) map[int]float64) []float64 {
	n := len(c.Children)
	got := make([]float64, n)
	var guaranteed float64
	for i, ch := range c.Children {
		got[i] = math.Min(want[ch], ch.Rate)
		guaranteed += got[i]
	}
	if guaranteed >= a {
		// Overbooked: the guarantees themselves are shared by rate.
		ms := make([]Member, n)
		for i, ch := range c.Children {
			ms[i] = Member{Weight: math.Max(ch.Rate, 1e-9), Demand: got[i]}
		}
		return waterfill(a, ms)
	}
	left := a - guaranteed
	// A controller's cap bounds what the children that are not prod
	// borrow: what prod takes first comes off it.
	capped := c.Cap > 0
	// at[i][p] is what child i wants beyond its guarantee in prio p's
	// turn: all of it at its own Prio, or, with parts, by its leaves'.
	at := make([]map[int]float64, n)
	prios := map[int]float64{}
	for i, ch := range c.Children {
		if parts != nil && len(ch.Children) > 0 {
			at[i] = parts(ch, got[i])
		} else {
			at[i] = map[int]float64{ch.Prio: math.Max(want[ch]-got[i], 0)}
		}
		for p := range at[i] {
			prios[p] = 1
		}
	}
	order := sortedPrios(prios)
	borrow := func(pick func(ch *Class) bool, budget float64) float64 {
		var used float64
		for _, p := range order {
			var ms []Member
			var idx []int
			for i, ch := range c.Children {
				if d := math.Min(at[i][p], want[ch]-got[i]); pick(ch) && d > 0 {
					ms = append(ms, Member{Weight: ch.Weight, Demand: d})
					idx = append(idx, i)
				}
			}
			if len(ms) == 0 || budget-used <= 0 {
				continue
			}
			for k, x := range waterfill(budget-used, ms) {
				got[idx[k]] += x
				used += x
			}
		}
		return used
	}
	if !capped {
		borrow(func(*Class) bool { return true }, left)
		return got
	}
	left -= borrow(func(ch *Class) bool { return ch.Prod }, left)
	var prodUse, nonprodGuaranteed float64
	for i, ch := range c.Children {
		if ch.Prod {
			prodUse += got[i]
		} else {
			nonprodGuaranteed += got[i]
		}
	}
	budget := math.Max(c.Cap-prodUse-nonprodGuaranteed, 0)
	borrow(func(ch *Class) bool { return !ch.Prod }, math.Min(left, budget))
	return got
}

// waterfill gives each member min(demand, λ·weight), λ the largest
// level capacity allows; unlike MaxMin it hands out nothing beyond the
// demands.
func waterfill(capacity float64, ms []Member) []float64 {
	out := make([]float64, len(ms))
	if capacity <= 0 {
		return out
	}
	open := make([]int, 0, len(ms))
	var weights float64
	for i, m := range ms {
		if m.Weight > 0 && m.Demand > 0 {
			open = append(open, i)
			weights += m.Weight
		}
	}
	left := capacity
	for len(open) > 0 && left > 0 {
		level := left / weights
		kept := open[:0]
		settled := false
		for _, i := range open {
			if d := ms[i].Demand; d <= level*ms[i].Weight {
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
	return out
}

// Jain is Jain's fairness index of xs: 1 when all are equal, 1/n when
// one takes everything; NaN for nothing measured.
func Jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 || len(xs) == 0 {
		return math.NaN()
	}
	return s * s / (float64(len(xs)) * s2)
}
