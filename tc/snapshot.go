package tc

// Snapshot is what tc shows of one device: its qdiscs, the classes of its
// root qdisc, and the filters on that qdisc, on each of its classes and
// on the ingress hook. `sluice import tc` turns one into a policy.
type Snapshot struct {
	Dev     string
	Qdiscs  []*Qdisc
	Classes []*Class
	// Filters by the handle they are attached at (the root qdisc's, a
	// class's, ffff: for an ingress qdisc's, HandleIngressHook
	// for clsact's).
	Filters map[Handle][]*Filter
}

// Snapshot reads dev's traffic control as Snapshot describes it.
func (c *Conn) Snapshot(dev string) (*Snapshot, error) {
	s := &Snapshot{Dev: dev, Filters: map[Handle][]*Filter{}}
	qs, err := c.Qdiscs(dev)
	if err != nil {
		return nil, err
	}
	s.Qdiscs = qs
	at := func(h Handle) error {
		fs, err := c.Filters(dev, h)
		if err != nil {
			return err
		}
		if len(fs) > 0 {
			s.Filters[h] = fs
		}
		return nil
	}
	for _, q := range qs {
		switch {
		case q.Parent == HandleRoot:
			if s.Classes, err = c.Classes(dev, q.Handle); err != nil {
				return nil, err
			}
			if err := at(q.Handle); err != nil {
				return nil, err
			}
			for _, cl := range s.Classes {
				if err := at(cl.Handle); err != nil {
					return nil, err
				}
			}
		case q.Kind == "ingress":
			if err := at(MakeHandle(0xffff, 0)); err != nil {
				return nil, err
			}
		case q.Kind == "clsact":
			if err := at(HandleIngressHook); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// IngressRedirect names the device s's ingress hook redirects packets
// to (an ifb, for a tree of its own), or "" if none exists here.
func (c *Conn) IngressRedirect(s *Snapshot) string {
	for _, parent := range []Handle{MakeHandle(0xffff, 0), HandleIngressHook} {
		for _, f := range s.Filters[parent] {
			if u := f.U32; u != nil && u.RedirectDev != "" && u.RedirectDev[0] != '?' && c.LinkExists(u.RedirectDev) {
				return u.RedirectDev
			}
		}
	}
	return ""
}
