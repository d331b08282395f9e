package migrate

import (
	"fmt"
	"net/netip"
	"slices"
)

// collapseMin is how many single-host leaves in a row become one
// per_host class: below it, classes read better than a hosts file.
const collapseMin = 8

// collapseHosts replaces each run of at least collapseMin sibling leaf
// classes that match one host each (their only rules: source, or
// destination, addresses) by a per_host class over a hosts file, one
// line per class with its rate and ceil: what old scripts wrote as a
// class and a filter per customer is sluice's hosts file (a lookup,
// not a scan of filters). Only runs that keep the meaning collapse:
// the same direction, prio and leaf, no bursts or quanta of their own,
// no class named as a default, and no address in two classes (a hosts
// file takes the longest prefix, filters the first).
func (d *Draft) collapseHosts() {
	for _, ifc := range d.Interfaces {
		for _, side := range []struct {
			dir string
			t   *Tree
		}{{"egress", ifc.Egress}, {"ingress", ifc.Ingress}} {
			if side.t == nil {
				continue
			}
			taken, defaults := map[string]bool{}, map[string]bool{side.t.Default: true}
			for _, c := range allClasses(side.t.Classes) {
				taken[c.Name] = true
				defaults[c.Default] = true
			}
			file := fmt.Sprintf("hosts-%s-%s.csv", className(ifc.Name, "dev"), side.dir)
			var walk func(cs []*Class) []*Class
			walk = func(cs []*Class) []*Class {
				for _, c := range cs {
					c.Classes = walk(c.Classes)
				}
				var out []*Class
				for i := 0; i < len(cs); {
					by, _, ok := singleHost(cs[i])
					if !ok || defaults[cs[i].Name] {
						out = append(out, cs[i])
						i++
						continue
					}
					j := i + 1
					for j < len(cs) && !defaults[cs[j].Name] && sameHostKind(cs[i], cs[j], by) {
						j++
					}
					if run := cs[i:j]; len(run) >= collapseMin && !overlapping(run) && d.Hosts[file] == nil {
						out = append(out, d.hostsClass(run, by, file, taken))
					} else {
						out = append(out, run...)
					}
					i = j
				}
				return out
			}
			side.t.Classes = walk(side.t.Classes)
		}
	}
}

// singleHost: c is a leaf whose every rule names addresses on one side
// and nothing else.
func singleHost(c *Class) (by string, addrs []string, ok bool) {
	if len(c.Classes) > 0 || c.PerHost != nil || c.Default != "" || c.Burst != "" || c.Cburst != "" || c.Quantum != "" || len(c.Match) == 0 {
		return "", nil, false
	}
	for _, m := range c.Match {
		only := m.Proto == "" && m.DSCP == "" && m.TOS == "" && !m.TCPAck && !m.TCPSyn && m.Mark == "" && len(m.Sport)+len(m.Dport)+len(m.NotSrc)+len(m.NotDst) == 0
		side := ""
		switch {
		case !only:
		case len(m.Src) > 0 && len(m.Dst) == 0:
			side = "src"
		case len(m.Dst) > 0 && len(m.Src) == 0:
			side = "dst"
		}
		if side == "" || by != "" && side != by {
			return "", nil, false
		}
		by = side
		addrs = append(addrs, m.Src...)
		addrs = append(addrs, m.Dst...)
	}
	for _, a := range addrs {
		if _, err := hostPrefix(a); err != nil {
			return "", nil, false
		}
	}
	return by, addrs, true
}

func sameHostKind(a, b *Class, by string) bool {
	bb, _, ok := singleHost(b)
	samePrio := a.Prio == nil && b.Prio == nil || a.Prio != nil && b.Prio != nil && *a.Prio == *b.Prio
	return ok && bb == by && samePrio && a.Leaf == b.Leaf && a.Limit == b.Limit
}

func hostPrefix(a string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(a); err == nil {
		return p.Masked(), nil
	}
	ad, err := netip.ParseAddr(a)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(ad, ad.BitLen()), nil
}

// overlapping: some address of the run is in two of its classes, or
// covers everything (a default in all but name).
func overlapping(run []*Class) bool {
	var ps []netip.Prefix
	owner := map[netip.Prefix]*Class{}
	for _, c := range run {
		_, addrs, _ := singleHost(c)
		for _, a := range addrs {
			p, _ := hostPrefix(a)
			if p.Bits() == 0 {
				return true
			}
			if o, dup := owner[p]; dup && o != c {
				return true
			}
			owner[p] = c
			if p.Bits() < p.Addr().BitLen() {
				ps = append(ps, p)
			}
		}
	}
	// Prefixes shorter than a host: against every other address.
	for _, p := range ps {
		for q, c := range owner {
			if q != p && p.Overlaps(q) && owner[p] != c {
				return true
			}
		}
	}
	return false
}

// hostsClass makes the per_host class for a run, its hosts in file.
func (d *Draft) hostsClass(run []*Class, by, file string, taken map[string]bool) *Class {
	first := run[0]
	var rate, ceil float64
	var hosts []Host
	for _, c := range run {
		_, addrs, _ := singleHost(c)
		r, cl := c.rateBits, c.ceilBits
		if r == 0 {
			r, _ = tcRate(c.Rate)
		}
		if cl == 0 {
			cl, _ = tcRate(c.Ceil)
		}
		rate += r
		ceil = max(ceil, cl, r)
		hosts = append(hosts, Host{Name: c.Name, Addresses: slices.Clone(addrs), Rate: c.Rate, Ceil: c.Ceil, Comment: classComment(c), Origin: c.Origin})
	}
	if d.Hosts == nil {
		d.Hosts = map[string][]Host{}
	}
	d.Hosts[file] = hosts
	name := uniqueName("hosts", taken)
	c := &Class{At: first.At, Name: name, Rate: bitRate(rate), Ceil: bitRate(ceil), rateBits: rate, ceilBits: ceil,
		Comment: fmt.Sprintf("%d classes of one host each (%s to %s), a line each of %s", len(run), first.Name, run[len(run)-1].Name, file),
		PerHost: &PerHost{By: by, HostsFile: file, Prio: first.Prio, Leaf: first.Leaf, Limit: first.Limit}}
	d.Report.Exact(first.At, fmt.Sprintf("%d single-host classes", len(run)), "per_host class %s (by %s) over %s: one line per class, its rate and ceil kept; a lookup instead of a filter per host", name, by, file)
	return c
}
