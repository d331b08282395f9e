package plan

import (
	"sluice/bpf"
	"sluice/policy"
	"sluice/units"
)

// HostPatch is what hosts_file edits (policy.EditHosts) change in a
// plan: host table entries of EDT programs, nothing else. It lets a
// daemon that holds the plan in force change one subscriber's cap of
// 100,000 without planning the other 99,999 again.
type HostPatch struct {
	Writes  []HostWrite
	classes []classPatch
}

// HostWrite is one program's host entries before and after the edits.
type HostWrite struct {
	Hook     *bpf.Hook
	Old, New map[bpf.HostKey]bpf.Target
}

type classPatch struct {
	dev        *Device
	i          int
	rate, ceil units.Rate
}

// PatchHosts works out how edits change p, which was planned from the
// policy before them. ok is false where they reach beyond the hosts'
// own entries, and the policy must be planned in full: a host of an
// HTB tree (its class, its siblings' quanta), a tree whose sharing
// controller weighs its aggregates, or a change of whether the
// direction's rate binds as a cap shared by all aggregates. p is not
// changed: Apply the patch once the kernel has it.
func (p *Plan) PatchHosts(edits []policy.HostEdit) (hp *HostPatch, ok bool) {
	hp = &HostPatch{}
	byDev := map[*Device]*HostWrite{}
	names := map[*Device]map[string]policy.HostEdit{}
	for _, ed := range edits {
		owner := ed.Entry.Owner
		if owner == nil || owner.PerHost == nil {
			return nil, false
		}
		d, table := p.hostTable(owner.PerHost)
		if d == nil || len(d.Controllers) > 0 || d.Auto != nil {
			// rate: auto: the entries resolve at the rate in force, not
			// the base the edit resolved them at: plan again.
			return nil, false
		}
		w := byDev[d]
		if w == nil {
			w = &HostWrite{Hook: d.Hook(), Old: map[bpf.HostKey]bpf.Target{}, New: map[bpf.HostKey]bpf.Target{}}
			if w.Hook == nil || w.Hook.Content.EDT == nil {
				return nil, false
			}
			byDev[d], names[d] = w, map[string]policy.HostEdit{}
		}
		for _, a := range ed.Entry.Addrs {
			k := bpf.HostKeyOf(table, a)
			old, found := w.Hook.Content.Hosts[k]
			if !found {
				return nil, false
			}
			t := old
			setPace(&t, d.tree, d.tree.Burst.NS(ed.CeilBps), ed.RateBps, ed.CeilBps)
			if t != old {
				w.Old[k], w.New[k] = old, t
			}
		}
		names[d][entryName(owner, ed.Entry)] = ed
	}
	for d, w := range byDev {
		// The direction's rate is a shared cap only while the caps add
		// up to more (buildEDT): that must not change.
		var before, after units.Rate
		for i, ci := range d.Classes {
			if ci.Leaf != "edt" {
				continue
			}
			before += ci.Ceil
			if ed, ok := names[d][ci.Name]; ok {
				after += ed.CeilBps
				hp.classes = append(hp.classes, classPatch{d, i, ed.RateBps, ed.CeilBps})
				continue
			}
			after += ci.Ceil
		}
		if (before > d.tree.RateBps) != (after > d.tree.RateBps) {
			return nil, false
		}
		if len(w.New) > 0 {
			hp.Writes = append(hp.Writes, *w)
		}
	}
	return hp, true
}

// Apply puts the patch into the plan.
func (hp *HostPatch) Apply() {
	for _, w := range hp.Writes {
		for k, t := range w.New {
			w.Hook.Content.Hosts[k] = t
		}
	}
	for _, c := range hp.classes {
		ci := &c.dev.Classes[c.i]
		ci.Rate, ci.Ceil = c.rate, c.ceil
	}
}

// Entries counts the host entries the patch writes.
func (hp *HostPatch) Entries() int {
	n := 0
	for _, w := range hp.Writes {
		n += len(w.New)
	}
	return n
}

// hostTable finds the EDT device and host table of ph.
func (p *Plan) hostTable(ph *policy.PerHost) (*Device, uint32) {
	for _, d := range p.Devices {
		if t, ok := d.hostTables[ph]; ok && d.EDT {
			return d, t
		}
	}
	return nil, 0
}

// Hook is the device's BPF program, or nil.
func (d *Device) Hook() *bpf.Hook {
	for _, o := range d.Objects {
		if h, ok := o.(*bpf.Hook); ok {
			return h
		}
	}
	return nil
}
