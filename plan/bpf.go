package plan

import (
	"fmt"
	"net/netip"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
	"sluice/units"
)

// clsact is the qdisc that carries the BPF hooks of dev.
func clsact(dev string) *tc.Qdisc {
	return &tc.Qdisc{Dev: dev, Parent: tc.HandleIngress, Handle: tc.MakeHandle(0xFFFF, 0), Kind: "clsact"}
}

// l2len is the link-layer header the program skips on dev.
func (b *builder) l2len(dev string) uint32 {
	if b.feats.RawIP[dev] {
		return 0
	}
	return 14
}

// bpfHook compiles the tree's classification into the content of the
// BPF classifier on the tree device's egress hook: the same first-match
// rules as the u32 filters (block 0 is the root's list, one block per
// gating class), host tables for per_host classes, and a target per
// class a packet can end in. The program hands the class to HTB through
// skb->priority, so the HTB tree itself carries no filters.
func (b *builder) bpfHook() *bpf.Hook {
	t := b.tree
	c := &bpf.Content{L2Len: b.l2len(b.dev.Name), SetPriority: true, Hosts: make(map[bpf.HostKey]bpf.Target, hostKeys(t.Classes))}
	if b.rtt != nil {
		c.RTT = &bpf.RTT{Record: true, Flows: b.rttFlows}
	}
	targets := map[string]uint32{}
	policers := map[*policy.Police]uint16{}
	policer := func(cl *policy.Class) uint16 {
		if cl == nil || cl.Police == nil {
			return 0
		}
		if n, ok := policers[cl.Police]; ok {
			return n
		}
		c.Policers = append(c.Policers, policerOf(cl.Police))
		n := uint16(len(c.Policers))
		policers[cl.Police] = n
		return n
	}
	targetOf := func(name string) uint32 {
		if i, ok := targets[name]; ok {
			return i
		}
		id := b.classID(name)
		i := uint32(len(c.Targets))
		cl := b.byName[name]
		t := bpf.Target{Classid: uint32(id), Counter: b.counterOf(name, id), Policer: policer(cl), Rtt: b.rttOf(name)}
		if b.edt != nil {
			prio := uint32(cl.Prio)
			if cl.Group != "" { // a group is of its hosts' kind
				prio = hostPrio(cl.Parent)
			}
			b.pace(&t, name, cl, cl.RateBps, cl.CeilBps, false, prio)
		}
		c.Targets = append(c.Targets, t)
		targets[name] = i
		return i
	}
	c.Default = targetOf(t.Default)

	type pending struct {
		idx int
		cs  []*policy.Class
		def *policy.Class
	}
	c.Blocks = []bpf.Block{{}}
	queue := []pending{{0, t.Classes, nil}}
	tables := uint32(0)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		first := len(c.Rules)
		if m := b.probes(); m != nil && p.idx == 0 {
			// rate: auto's probes skip the tree: a priority equal to
			// HTB's own handle sends a packet to its direct queue.
			target := uint32(len(c.Targets))
			c.Targets = append(c.Targets, bpf.Target{Classid: uint32(RootHandle)})
			for _, rule := range bpfRules(m) {
				rule.Kind, rule.Target = bpf.KindClass, target
				c.Rules = append(c.Rules, rule)
			}
		}
		for _, r := range rulesOf(p.cs) {
			cl := r.class
			var kind uint8
			var target uint32
			var aux uint16
			entries := r.entries
			switch {
			case cl.PerHost != nil:
				ph := cl.PerHost
				kind, target = bpf.KindHosts, tables
				tables++
				if ph.By == "src" {
					aux |= bpf.HostsBySrc
				}
				if ph.HostsFile != "" {
					aux |= bpf.HostsFallThrough // unlisted addresses go on to later rules
				}
				if ph.CIDR.IsValid() && ph.HostsFile == "" {
					entries = gateEntries(entries, ph)
				} else if len(entries) == 0 {
					entries = []*policy.Match{{Fields: map[string]policy.Pos{}}}
				}
				if b.dev.hostTables == nil {
					b.dev.hostTables = map[*policy.PerHost]uint32{}
				}
				b.dev.hostTables[ph] = target
				b.hostTable(c, cl, target, targetOf)
			case len(cl.Classes) > 0:
				kind, target = bpf.KindGate, uint32(len(c.Blocks))
				c.Blocks = append(c.Blocks, bpf.Block{})
				var def *policy.Class
				if cl.Default != "" {
					def = b.byName[cl.Default]
				}
				queue = append(queue, pending{int(target), cl.Classes, def})
			default:
				kind, target = bpf.KindClass, targetOf(cl.Name)
			}
			for _, e := range entries {
				for _, rule := range bpfRules(e) {
					rule.Kind, rule.Target, rule.Aux = kind, target, aux
					c.Rules = append(c.Rules, rule)
				}
			}
		}
		blk := bpf.Block{First: uint32(first), Count: uint32(len(c.Rules) - first)}
		if p.def != nil {
			blk.Fallback, blk.HasFallback = targetOf(p.def.Name), 1
		}
		c.Blocks[p.idx] = blk
	}
	if len(c.Rules) > bpf.MaxRules {
		b.d.Errorf(t.Pos, "%s %s: the match rules expand to %d BPF rules; at most %d fit", b.dev.Interface, t.Dir, len(c.Rules), bpf.MaxRules)
	}
	if len(c.Blocks) > bpf.MaxBlocks {
		b.d.Errorf(t.Pos, "%s %s: %d classes with children and match rules; at most %d fit the BPF classifier", b.dev.Interface, t.Dir, len(c.Blocks)-1, bpf.MaxBlocks-1)
	}
	if err := c.Validate(); err != nil && len(b.d.Errs) == 0 {
		b.d.Errorf(t.Pos, "%s %s: %v", b.dev.Interface, t.Dir, err)
	}
	return &bpf.Hook{Dev: b.dev.Name, Prio: HookPrio, Content: c, Note: "classifies into the HTB tree on " + b.dev.Name}
}

// hostKeys counts the host table entries of the per_host classes in cs.
func hostKeys(cs []*policy.Class) int {
	n := 0
	for _, c := range cs {
		if ph := c.PerHost; ph != nil {
			n += ph.HostCount()
			for _, e := range ph.Entries {
				n += len(e.Addrs)
			}
		}
		n += hostKeys(c.Classes)
	}
	return n
}

// hostTable fills table n with the host classes of per_host class cl.
// On EDT a host of a group (groups_file) also names the group's target,
// from targetOf, whose clock it takes slots on.
func (b *builder) hostTable(c *bpf.Content, cl *policy.Class, n uint32, targetOf func(string) uint32) {
	ph := cl.PerHost
	add := func(name string, rate, ceil units.Rate, prio uint32, group *policy.Class, prefixes ...netip.Prefix) {
		var t bpf.Target
		if r, ok := b.refs[name]; ok {
			t = bpf.Target{Classid: uint32(tc.MakeHandle(shardMajor(int(r.shard)), r.minor)), Counter: r.counter,
				Queue: r.shard + 1} // the host's shard
		} else {
			id := b.classID(name)
			t = bpf.Target{Classid: uint32(id), Counter: b.counterOf(name, id)}
		}
		if b.edt != nil {
			b.pace(&t, name, cl, rate, ceil, true, prio)
			if group != nil {
				t.Group = targetOf(group.Name) + 1
				// Its own delays tell its group's controller whether its
				// cap or the group's holds it back.
				if h, ok := b.edt.hists.get(name); ok {
					t.Hist = h
					b.dev.Classes[len(b.dev.Classes)-1].Hist = h
				}
			}
		}
		t.Rtt = b.rttOf(cl.Name)
		var keys []bpf.HostKey
		for _, p := range prefixes {
			k := bpf.HostKeyOf(n, p)
			c.Hosts[k] = t
			keys = append(keys, k)
		}
		if b.edt != nil && group != nil {
			b.edt.groupHost(group, Controlled{Name: name, ID: fmt.Sprintf("edt:%d", t.Counter), Hosts: keys,
				Weight: float64(max(rate, 1)), Rate: rate, Ceil: ceil, Prod: t.Prod == 1})
		}
	}
	for _, h := range ph.Hosts() {
		add(hostName(cl, h), ph.RateBps, ph.CeilBps, hostPrio(cl), nil, h)
	}
	for _, e := range ph.Entries {
		var group *policy.Class
		if e.ParentCls != nil && e.ParentCls.Group != "" {
			group = e.ParentCls
		}
		add(entryName(cl, e), e.RateBps, e.CeilBps, entryPrio(e), group, e.Addrs...)
	}
}

// counterOf is the BPF counter of class name with handle id.
func (b *builder) counterOf(name string, id tc.Handle) uint32 {
	if n := b.counter(name); n != 0 {
		return n
	}
	return uint32(id.Minor())
}

// entryName is the class name of a hosts_file entry.
func entryName(cl *policy.Class, e *policy.HostEntry) string {
	if cl == e.Owner && e.ClassName != "" {
		return e.ClassName // one string per host, not one per use
	}
	return cl.Name + "/" + e.Name
}

// bpfRules compiles one match entry into BPF rules whose union is
// exactly the entry (the same alternatives u32 gets; lists of DSCPs
// become one bit set, port ranges stay ranges).
func bpfRules(m *policy.Match) []bpf.Rule {
	var base bpf.Rule
	if m.Mark != nil {
		base.Flags |= bpf.RuleMark
		base.MarkVal, base.MarkMask = m.Mark.Val&m.Mark.Mask, m.Mark.Mask
	}
	onlyMark := true
	for f := range m.Fields {
		if f != "mark" {
			onlyMark = false
		}
	}
	if onlyMark && m.Mark != nil {
		return []bpf.Rule{base} // family 0: every packet, IP or not
	}
	var out []bpf.Rule
	for _, a := range alternatives(m) {
		r := base
		r.Family = 6
		if a.v4 {
			r.Family = 4
		}
		if a.proto >= 0 {
			r.Flags |= bpf.RuleProto
			r.Proto = uint8(a.proto)
		}
		if a.src.IsValid() {
			r.SetPrefix(false, a.src)
		}
		if a.dst.IsValid() {
			r.SetPrefix(true, a.dst)
		}
		for _, d := range a.dscps {
			r.DscpSet |= 1 << uint(d)
		}
		if a.tos != nil {
			r.Flags |= bpf.RuleTOS
			r.TosVal, r.TosMask = a.tos.Val&a.tos.Mask, a.tos.Mask
		}
		if a.tcpAck {
			r.Flags |= bpf.RuleTCPAck
		}
		if a.tcpSyn {
			r.Flags |= bpf.RuleTCPSyn
		}
		sports, dports := a.sports, a.dports
		if len(sports)+len(dports) == 0 {
			r.SportHi, r.DportHi = 0xFFFF, 0xFFFF
			out = append(out, r)
			continue
		}
		r.Flags |= bpf.RuleL4
		all := []policy.PortRange{{Lo: 0, Hi: 0xFFFF}}
		if len(sports) == 0 {
			sports = all
		}
		if len(dports) == 0 {
			dports = all
		}
		for _, s := range sports {
			for _, d := range dports {
				rr := r
				rr.SportLo, rr.SportHi, rr.DportLo, rr.DportHi = s.Lo, s.Hi, d.Lo, d.Hi
				out = append(out, rr)
			}
		}
	}
	return out
}

// policerOf turns a policy policer into the program's.
func policerOf(p *policy.Police) bpf.Policer {
	out := bpf.Policer{Mode: bpf.SrTCM, Aware: p.Mode == "aware", CIR: uint64(p.CIRBps), CBS: p.CBSBytes, EBS: p.EBSBytes}
	if p.TwoRate() {
		out.Mode, out.PIR, out.EBS = bpf.TrTCM, uint64(p.PIRBps), p.PBSBytes
	}
	for i, a := range p.Actions {
		switch a.Kind {
		case "drop":
			out.Act[i] = bpf.ActDrop
		case "remark":
			out.Act[i], out.DSCP[i] = bpf.ActRemark, a.DSCP
		}
	}
	return out
}

// policeOnly plans a direction that only polices: the program on the
// interface's own hook, no tree, no ifb.
func policeOnly(feats Features, in *policy.Interface, t *policy.Tree) *Device {
	dev := &Device{Name: in.Name, Interface: in.Name, Dir: t.Dir, PoliceOnly: true, Alloc: newAlloc()}
	l2 := uint32(14)
	if feats.RawIP[in.Name] {
		l2 = 0
	}
	c := &bpf.Content{L2Len: l2, Ingress: t.Dir == policy.Ingress, Blocks: []bpf.Block{{}}, Targets: []bpf.Target{{Counter: 1, Policer: 1}},
		Policers: []bpf.Policer{policerOf(t.Police)}, Hosts: map[bpf.HostKey]bpf.Target{}}
	dev.Objects = []tc.Object{clsact(in.Name),
		&bpf.Hook{Dev: in.Name, Ingress: t.Dir == policy.Ingress, Prio: HookPrio, Content: c,
			Note: fmt.Sprintf("polices %s %s", in.Name, t.Dir)}}
	dev.Classes = []ClassInfo{{Name: "police", Rate: t.Police.CIRBps, Ceil: max(t.Police.CIRBps, t.Police.PIRBps), Leaf: "police"}}
	return dev
}
