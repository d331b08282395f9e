package plan

import (
	"fmt"

	"sluice/bpf"
	"sluice/policy"
)

// Round trips (an interface's `rtt:`): the classifier that sorts a
// tree's packets also starts their round trips (bpf.RTT), and the
// interface's hook the other way ends them. Where HTB's u32 filters
// classify, an observing copy of the classifier runs on the tree
// device's hook only to attribute samples to classes. The hooks of an
// interface share the flows and the histograms; the histograms are
// numbered across the interface's two trees:
//
//	0        egress traffic of no class
//	1..127   the egress tree's leaf classes, in policy order
//	128      ingress traffic of no class
//	129..255 the ingress tree's
//
// Echoes: an egress tree's samples end on the interface's ingress (the
// ifb's hook where an ingress tree redirects there: it sees each packet
// on arrival, before the ifb's queue), an ingress tree's on the
// interface's egress.

// RTTIngressBase is the first round-trip histogram of an ingress tree.
const RTTIngressBase = bpf.MaxRTTHists / 2

// rttIndexes numbers tree t's leaf classes (a per_host class's hosts
// share its histogram) for round-trip histograms; classes beyond the
// direction's half share its "no class" histogram.
func rttIndexes(t *policy.Tree) map[string]uint32 {
	base := uint32(0)
	if t.Dir == policy.Ingress {
		base = RTTIngressBase
	}
	out := map[string]uint32{}
	var walk func(cs []*policy.Class)
	walk = func(cs []*policy.Class) {
		for _, c := range cs {
			if len(c.Classes) > 0 {
				walk(c.Classes)
				continue
			}
			if n := uint32(len(out)) + 1; n < RTTIngressBase {
				out[c.Name] = base + n
			} else {
				out[c.Name] = base
			}
		}
	}
	walk(t.Classes)
	return out
}

// rttSetup readies b to time round trips when in has `rtt:`.
func (b *builder) rttSetup(in *policy.Interface, t *policy.Tree) {
	if in.RTT == nil || !b.feats.BPF { // Build refuses the latter
		return
	}
	b.rtt = rttIndexes(t)
	b.rttFlows = in.RTT.Flows
	b.dev.RTT = b.rtt
}

// rttOf is the round-trip histogram of class name (its per_host class
// for a host), 0 where round trips are not timed.
func (b *builder) rttOf(name string) uint32 {
	if i, ok := b.rtt[name]; ok {
		return i
	}
	if cl := b.byName[name]; cl != nil && cl.Parent != nil {
		return b.rttOf(cl.Parent.Name)
	}
	return 0
}

// observeHook is the classifier for round trips alone on a tree HTB's
// u32 filters classify.
func (b *builder) observeHook() *bpf.Hook {
	h := b.bpfHook()
	h.Content.SetPriority = false
	h.Content.RTT.Observe = true
	h.Note = "times the round trips of the HTB tree on " + b.dev.Name + " (u32 classifies)"
	return h
}

// rttEchoes completes the round-trip hooks of interface in, whose
// devices devs are: each tree's samples must end on a hook the other
// way, and every hook of the interface shares its maps with the others
// (Siblings).
func rttEchoes(feats Features, in *policy.Interface, devs []*Device) {
	if in.RTT == nil {
		return
	}
	var egressTree, ingressTree, egressPolice, ingressPolice *Device
	for _, d := range devs {
		switch {
		case d.PoliceOnly && d.Dir == policy.Egress:
			egressPolice = d
		case d.PoliceOnly:
			ingressPolice = d
		case d.Dir == policy.Egress:
			egressTree = d
		default:
			ingressTree = d
		}
	}
	l2 := uint32(14)
	if feats.RawIP[in.Name] {
		l2 = 0
	}
	echoOnly := func(dev string, ingress bool) *bpf.Hook {
		return &bpf.Hook{Dev: dev, Ingress: ingress, Prio: HookPrio,
			Content: &bpf.Content{L2Len: l2, Ingress: ingress, Blocks: []bpf.Block{{}}, Targets: []bpf.Target{{}},
				Hosts: map[bpf.HostKey]bpf.Target{}, RTT: &bpf.RTT{Echo: true, Observe: true, Flows: in.RTT.Flows}},
			Note: fmt.Sprintf("ends the round trips of %s's other direction", in.Name)}
	}
	echo := func(d *Device, dev string, ingress bool) {
		if h := d.hookOn(dev, ingress); h != nil {
			if h.Content.RTT == nil {
				h.Content.RTT = &bpf.RTT{Flows: in.RTT.Flows}
			}
			h.Content.RTT.Echo = true
		}
	}
	// The egress tree's samples end on the way in.
	if egressTree != nil {
		switch {
		case ingressTree != nil:
			echo(ingressTree, ingressTree.Name, false)
		case ingressPolice != nil:
			echo(ingressPolice, in.Name, true)
		default:
			egressTree.Objects = append(egressTree.Objects, clsact(in.Name), echoOnly(in.Name, true))
		}
	}
	// The ingress tree's on the way out.
	if ingressTree != nil {
		switch {
		case egressTree != nil:
			echo(egressTree, in.Name, false)
		case egressPolice != nil:
			echo(egressPolice, in.Name, false)
		default:
			ingressTree.Objects = append(ingressTree.Objects, clsact(in.Name), echoOnly(in.Name, false))
		}
	}
	var hooks []*bpf.Hook
	for _, d := range devs {
		for _, o := range d.Objects {
			if h, ok := o.(*bpf.Hook); ok && h.Content.RTT != nil {
				hooks = append(hooks, h)
			}
		}
	}
	for _, h := range hooks {
		h.Siblings = nil
		for _, o := range hooks {
			if o != h {
				h.Siblings = append(h.Siblings, bpf.Site{Dev: o.Dev, Ingress: o.Ingress})
			}
		}
	}
}

// hookOn is d's BPF hook on dev's ingress or egress, or nil.
func (d *Device) hookOn(dev string, ingress bool) *bpf.Hook {
	for _, o := range d.Objects {
		if h, ok := o.(*bpf.Hook); ok && h.Dev == dev && h.Ingress == ingress {
			return h
		}
	}
	return nil
}

// rttClasses gives each of d's policy classes its round-trip histogram
// (ClassInfo.RTT). Hosts have none of their own: their samples count in
// their per_host class's.
func (d *Device) rttClasses() {
	if d.RTT == nil {
		return
	}
	for i := range d.Classes {
		if idx, ok := d.RTT[d.Classes[i].Name]; ok {
			d.Classes[i].RTT = idx + 1
		}
	}
}
