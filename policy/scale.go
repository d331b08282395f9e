package policy

import "sluice/units"

// ScaleRates multiplies every resolved rate of p by f (0 < f): trees,
// classes, hosts, sharing caps and policers' rates. Sizes written as
// bytes (burst, cburst, quantum, limit, and a policer's buckets) are
// kept: TCP sends its window in bursts of packets, not of time, so a
// bucket scaled with the rate holds fewer of them (at a tenth of
// examples/isp.yaml, guests' 4 KB peak bucket passed one flow at a
// seventh of its 2 Mbit/s; kept at 40 KB, its rate). A test bed
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
	police := func(pl *Police) {
		if pl == nil {
			return
		}
		r(&pl.CIRBps)
		r(&pl.PIRBps)
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
