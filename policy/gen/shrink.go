package gen

// Shrink cuts p down while fails still holds: interfaces, trees, rtt:,
// classes, rules, keys of a rule, per_host blocks, ceils, leaves and
// prios go one at a time, until none can go. It returns the smallest
// failing policy it found (p itself if nothing could go).
func Shrink(p *Policy, fails func(*Policy) bool) *Policy {
	for progress := true; progress; {
		progress = false
		for k := 0; ; k++ {
			c := p.clone()
			if !c.cut(k) {
				break
			}
			if fails(c) {
				p, progress = c, true
				break
			}
		}
	}
	return p
}

// cut makes the k-th of the cuts p allows, reporting whether there was
// one.
func (p *Policy) cut(k int) bool {
	n := 0
	try := func(ok bool, do func()) bool {
		if !ok {
			return false
		}
		if n == k {
			do()
			return true
		}
		n++
		return false
	}
	for i := range p.Interfaces {
		if try(len(p.Interfaces) > 1, func() { p.Interfaces = append(p.Interfaces[:i], p.Interfaces[i+1:]...) }) {
			return true
		}
	}
	for _, ifc := range p.Interfaces {
		if try(ifc.Egress != nil && ifc.Ingress != nil, func() { ifc.Egress = nil }) ||
			try(ifc.Egress != nil && ifc.Ingress != nil, func() { ifc.Ingress = nil }) || try(ifc.RTT != "", func() { ifc.RTT = "" }) {
			return true
		}
		for _, t := range []*Tree{ifc.Egress, ifc.Ingress} {
			if t == nil {
				continue
			}
			if try(t.Classifier != "", func() { t.Classifier = "" }) || try(t.Leaf != "", func() { t.Leaf = "" }) {
				return true
			}
			if t.cutClasses(&t.Classes, try) {
				return true
			}
		}
	}
	return false
}

func (t *Tree) cutClasses(cs *[]*Class, try func(bool, func()) bool) bool {
	for i, c := range *cs {
		if try(len(*cs) > 1 && !c.holds(t.Default), func() { *cs = append((*cs)[:i:i], (*cs)[i+1:]...) }) {
			return true
		}
		if try(len(c.Classes) > 0 && !c.holds(t.Default), func() { c.Classes = nil }) ||
			try(c.PerHost != nil, func() { c.PerHost = nil }) ||
			try(c.Police != nil, func() { c.Police = nil }) ||
			try(c.PerHost != nil && len(c.PerHost.Hosts) > 1, func() { c.PerHost.Hosts = c.PerHost.Hosts[1:] }) ||
			try(c.PerHost != nil && len(c.PerHost.Groups) > 0, func() { c.PerHost.dropGroups() }) ||
			try(c.Ceil > 0, func() { c.Ceil = 0 }) ||
			try(c.Leaf != "", func() { c.Leaf = "" }) ||
			try(c.Prio > 0, func() { c.Prio = 0 }) {
			return true
		}
		for j := range c.Match {
			if try(true, func() { c.Match = append(c.Match[:j:j], c.Match[j+1:]...) }) {
				return true
			}
			m := c.Match[j]
			for x := range m {
				if try(len(m) > 1, func() { c.Match[j] = append(m[:x:x], m[x+1:]...) }) {
					return true
				}
			}
		}
		if t.cutClasses(&c.Classes, try) {
			return true
		}
	}
	return false
}

// holds reports whether c is, or has below it, the class named name.
func (c *Class) holds(name string) bool {
	if c.Name == name {
		return true
	}
	for _, k := range c.Classes {
		if k.holds(name) {
			return true
		}
	}
	return false
}

func (p *Policy) clone() *Policy {
	out := &Policy{}
	for _, ifc := range p.Interfaces {
		out.Interfaces = append(out.Interfaces, &Interface{Name: ifc.Name, Egress: ifc.Egress.clone(), Ingress: ifc.Ingress.clone(), RTT: ifc.RTT})
	}
	return out
}

func (t *Tree) clone() *Tree {
	if t == nil {
		return nil
	}
	c := *t
	c.Classes = cloneClasses(t.Classes)
	if t.Police != nil {
		pol := *t.Police
		c.Police = &pol
	}
	return &c
}

func cloneClasses(cs []*Class) []*Class {
	var out []*Class
	for _, c := range cs {
		k := *c
		k.Match = nil
		for _, m := range c.Match {
			k.Match = append(k.Match, append(Match(nil), m...))
		}
		if c.PerHost != nil {
			ph := *c.PerHost
			ph.Hosts = append([]Host(nil), ph.Hosts...)
			ph.Groups = append([]Group(nil), ph.Groups...)
			k.PerHost = &ph
		}
		if c.Police != nil {
			pol := *c.Police
			k.Police = &pol
		}
		k.Classes = cloneClasses(c.Classes)
		out = append(out, &k)
	}
	return out
}

// dropGroups takes the groups_file away, and the hosts out of groups.
func (ph *PerHost) dropGroups() {
	ph.Groups = nil
	for i := range ph.Hosts {
		ph.Hosts[i].Group = ""
	}
}
