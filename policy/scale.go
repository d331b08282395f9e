package policy

import "sluice/units"

// ScaleRates multiplies every resolved rate of p by f (0 < f): trees,
// classes, hosts, sharing caps and policers (whose buckets scale too, so
// that a burst lasts as long as before, never below two frames). Sizes
// written as bytes (burst, cburst, quantum, limit) are kept. A test bed
// that carries less than the policy's link uses it to run the same
// policy slower (package conform); weights and shares do not change,
// since every rate moves together.
func (p *Policy) ScaleRates(f float64) {
	for _, in := range p.Interfaces {
		for _, t := range []*Tree{in.Egress, in.Ingress} {
			if t != nil {
				t.ScaleRates(f)
			}
		}
	}
}

// ScaleRates is Policy.ScaleRates for one tree.
func (t *Tree) ScaleRates(f float64) {
	if f <= 0 || f == 1 {
		return
	}
	r := func(x *units.Rate) {
		if *x > 0 {
			*x = max(units.Rate(float64(*x)*f), 1)
		}
	}
	b := func(x *uint64) {
		if *x > 0 {
			*x = max(uint64(float64(*x)*f), 2*1514)
		}
	}
	police := func(pl *Police) {
		if pl == nil {
			return
		}
		r(&pl.CIRBps)
		r(&pl.PIRBps)
		b(&pl.CBSBytes)
		b(&pl.EBSBytes)
		b(&pl.PBSBytes)
	}
	seen := map[*HostEntry]bool{}
	var walk func(cs []*Class)
	walk = func(cs []*Class) {
		for _, c := range cs {
			r(&c.RateBps)
			r(&c.CeilBps)
			police(c.Police)
			if c.Sharing != nil {
				r(&c.Sharing.CapBps)
			}
			if ph := c.PerHost; ph != nil {
				r(&ph.RateBps)
				r(&ph.CeilBps)
				if ph.Scale == 0 {
					ph.Scale = 1
				}
				ph.Scale *= f
				for _, e := range ph.Entries {
					if !seen[e] {
						seen[e] = true
						r(&e.RateBps)
						r(&e.CeilBps)
					}
				}
			}
			walk(c.Classes)
		}
	}
	r(&t.RateBps)
	if t.Scale == 0 {
		t.Scale = 1
	}
	t.Scale *= f
	if a := t.Auto; a != nil {
		r(&a.MinBps)
		r(&a.BaseBps)
		r(&a.MaxBps)
	}
	police(t.Police)
	if t.Sharing != nil {
		r(&t.Sharing.CapBps)
	}
	walk(t.Classes)
}
