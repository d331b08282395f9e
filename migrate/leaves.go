package migrate

// FitLeaves makes the draft's leaves ones this kernel builds: a leaf
// the old tool used that the kernel lacks (sfq, fq_codel or cake on a
// kernel built without them) becomes auto, the best this kernel has,
// reported as approximated with how to put it back. has reports
// whether the kernel has a qdisc kind. Without it (an import not run
// as root reads no kernel) nothing changes and the plan says what the
// kernel lacks.
func (d *Draft) FitLeaves(has func(kind string) bool) {
	if has == nil {
		return
	}
	fit := func(at At, what string, leaf *string) {
		switch *leaf {
		case "", "auto", "none", "pfifo", "bfifo":
			return
		}
		if has(*leaf) {
			return
		}
		d.Report.Approx(at, what+": leaf "+*leaf, "this kernel has no %s (sch_%s): leaf auto, the best it has, in its place; on a kernel with %s write leaf: %s back",
			*leaf, *leaf, *leaf, *leaf)
		*leaf = "auto"
	}
	var walk func(cs []*Class)
	walk = func(cs []*Class) {
		for _, c := range cs {
			fit(c.At, "class "+c.Name, &c.Leaf)
			if c.PerHost != nil {
				fit(c.At, "class "+c.Name+"'s hosts", &c.PerHost.Leaf)
			}
			walk(c.Classes)
		}
	}
	for _, ifc := range d.Interfaces {
		for _, t := range []*Tree{ifc.Egress, ifc.Ingress} {
			if t == nil {
				continue
			}
			fit(t.At, "interface "+ifc.Name, &t.Leaf)
			walk(t.Classes)
		}
	}
}
