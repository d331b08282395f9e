// Package plan computes, without touching the kernel, the kernel objects
// that carry out a policy: for every shaped direction an HTB tree (root
// qdisc, one class per policy class, a leaf qdisc per leaf class) and the
// u32 filters that sort packets into it, plus the ifb device and redirect
// for ingress. The result is a list of tc objects in creation order that
// the kernel layer diffs against the live system.
package plan

import (
	"sluice/units"

	"fmt"
	"net/netip"
	"sort"
	"strings"

	"sluice/policy"
	"sluice/tc"
)

// RootHandle is the handle of every HTB root qdisc sluice creates; its
// root class is 1:1.
var (
	RootHandle  = tc.MakeHandle(1, 0)
	RootClassID = tc.MakeHandle(1, 1)
)

// HookPrio is the prio of sluice's filters on a clsact hook: the
// redirect to an ifb, the BPF classifier, a policer. It is high
// (evaluated late), so that filters other tools place on a shared
// clsact run first, and above 0xC000, where tc puts a filter added
// without a prio (and the ones after it, below): sluice's filter never
// shares a u32 instance with one added by hand.
const HookPrio uint16 = 0xFF00

// LegacyHookPrio is the prio sluice used for those filters before: tc's
// default. Filters of sluice's found there are read as sluice's (and
// moved), anyone else's are left alone.
const LegacyHookPrio uint16 = 0xC000

// Filter prios. All u32 filters on one HTB share their hash tables (the
// kernel keys u32's tables by qdisc, not by the class they hang on), and
// a filter's dump lists every table of its prio: two blocks with a prio
// in common each read the other's tables and nodes back as their own,
// and a second apply "repaired" them (two per_host classes, or a gate
// class beside the root's rules). So the root block's rules take prios
// in [1, rootPrioMax], and every other block (a gate class's rules, a
// per_host class's tables) a range of its own, blockPrios wide, from a
// slot it keeps (blockRange): its rules inside, its catch-all at its
// end, a per_host class's tables at its start.
const (
	rootPrioMax uint16 = 0x7FFF
	blockPrios  uint16 = 0x100
	// Slots: 0x8000-0xBFFF, then 0xC100-0xFFFF (LegacyHookPrio's range
	// left out: the ingress hook's filters used it).
	maxBlocks   = 64 + 63
	blockPrefix = "#block/" // slot keys in Alloc.Prios
)

// blockRange is the prio range of filter block key (a gate's or a
// per_host class's): lo for its first filter, hi for its last.
func (b *builder) blockRange(key string) (lo, hi uint16, ok bool) {
	if b.blocks == nil {
		prev := map[string]uint16{}
		for k, v := range b.prev.Prios {
			if strings.HasPrefix(k, blockPrefix) {
				prev[k] = v
			}
		}
		b.blocks = newPool(prev, 1, maxBlocks)
	}
	slot, ok := b.blocks.get(blockPrefix + key)
	if !ok {
		return 0, 0, false
	}
	b.dev.Alloc.Prios[blockPrefix+key] = slot
	if slot <= 64 {
		lo = 0x8000 + (slot-1)*blockPrios
	} else {
		lo = 0xC100 + (slot-65)*blockPrios
	}
	return lo, lo + blockPrios - 1, true
}

// Features says what the target kernel can do. The zero value knows
// nothing; Everything assumes a fully featured kernel.
type Features struct {
	Qdiscs  map[string]bool
	U32Mark bool
	// BPF: the kernel loads sched_cls programs and has cls_bpf and clsact.
	BPF bool
	// RawIP names devices without a link-layer header (tun, wireguard).
	RawIP map[string]bool
	// TxQueues is each device's number of transmit queues (missing: 1);
	// XPS names devices whose transmit packet steering is configured
	// (it would override the queue sluice's classifier picks).
	TxQueues map[string]int
	XPS      map[string]bool
}

// Everything is a kernel with every qdisc and u32 mark support (used for
// export to another host and for planning without a kernel).
var Everything = Features{U32Mark: true, BPF: true, Qdiscs: map[string]bool{
	"fq_codel": true, "sfq": true, "fq": true, "cake": true, "pfifo": true, "bfifo": true, "htb": true, "clsact": true, "ingress": true,
}}

// RootClassName names a tree's own class (the direction's rate).
const RootClassName = "(root)"

// Plan is the desired state of every device a policy shapes.
type Plan struct {
	Devices []*Device
}

// Device is one HTB tree and what feeds it.
type Device struct {
	Name      string // the device carrying the tree (the ifb for ingress)
	Interface string // the policy interface
	Dir       string // policy.Egress or policy.Ingress
	Ifb       bool
	// PoliceOnly: a BPF policer on the interface's hook, without a tree.
	PoliceOnly bool
	// EDT: the EDT backend (no HTB; ClassInfo lists the aggregates).
	EDT     bool
	Classes []ClassInfo
	// Sharing notes where HTB's quanta cannot follow the weights
	// exactly (plan prints them).
	Sharing []string
	// Controllers are the sharing controllers the agent runs.
	Controllers []Controller
	// Notes say what the tree cannot do as the policy reads (plan and
	// apply print them).
	Notes []string
	Alloc *Alloc
	// hostTables are the host tables of its per_host classes (their
	// number in the BPF program), and tree the tree it was planned from:
	// what PatchHosts needs.
	hostTables map[*policy.PerHost]uint32
	tree       *policy.Tree
	// Auto is the tree's rate: auto (nil: a fixed rate): the agent sets
	// the rate (RateLimit), and the device is planned again at it
	// (rebuild, from in and feats).
	Auto  *policy.Auto
	in    *policy.Interface
	feats Features
	// floors are the least rates limits may give classes below their
	// planned rates (a balanced shard's root and copies).
	floors map[tc.Handle]units.Rate
	// Objects, in creation order: for ingress the ifb link first, then
	// the tree, then the interface's ingress hook and redirect filter.
	Objects []tc.Object
	// RTT numbers the classes' round-trip histograms (leaf class name to
	// index) where the interface times round trips; nil where not.
	RTT map[string]uint32 `json:"-"`
}

// Record is the name of the device's ownership record: the device for a
// tree, the interface and direction for a policer without a tree (an
// interface may have both).
func (d *Device) Record() string {
	if d.PoliceOnly {
		return d.Interface + "@" + d.Dir
	}
	return d.Name
}

// ClassInfo describes one planned class, for show and for humans.
type ClassInfo struct {
	Name   string     `json:"name"`
	Handle tc.Handle  `json:"id"`
	Parent tc.Handle  `json:"parent"`
	Rate   units.Rate `json:"rate"`
	Ceil   units.Rate `json:"ceil"`
	Prio   uint32     `json:"prio"`
	// Leaf is a leaf class's qdisc kind ("none": HTB's own fifo, "edt"
	// an EDT aggregate, "police" a policer); "" for an inner class.
	Leaf    string `json:"leaf,omitempty"`
	Default bool   `json:"default,omitempty"`
	// Counter is the class's BPF counter when it is not its minor (in
	// sharded trees, where minors repeat across shards); Replica marks
	// a non-host class's copy in shards other than the first.
	Counter uint32 `json:"counter,omitempty"`
	Replica bool   `json:"replica,omitempty"`
	// Hist is an EDT aggregate's delay histogram (shared by the hosts of
	// one per_host class).
	Hist uint16 `json:"hist,omitempty"`
	// RTT is the class's round-trip histogram + 1 where the interface
	// times round trips (0: none; a host's samples count in its per_host
	// class's).
	RTT uint32 `json:"rtt,omitempty"`
}

// Objects returns every object of the plan in creation order.
func (p *Plan) Objects() []tc.Object {
	var out []tc.Object
	for _, d := range p.Devices {
		out = append(out, d.Objects...)
	}
	return out
}

// Device returns the planned device named name, or nil.
func (p *Plan) Device(name string) *Device {
	for _, d := range p.Devices {
		if d.Name == name {
			return d
		}
	}
	return nil
}

// Build plans pol for a kernel with feats. prev holds each device's
// previous allocation (nil for a fresh start). Problems the kernel's
// features cause come back as policy.Errors located in the policy file.
func Build(pol *policy.Policy, feats Features, prev map[string]*Alloc) (*Plan, error) {
	d := &policy.Diag{File: pol.File}
	p := &Plan{}
	for _, in := range pol.Interfaces {
		in = markClassifier(in, feats)
		first := len(p.Devices)
		if in.RTT != nil && !feats.BPF {
			d.Errorf(in.RTT.Pos, "%s: rtt needs the BPF classifier, but this kernel cannot run it (sched_cls programs, cls_bpf or clsact missing; see sluice doctor)", in.Name)
		}
		for _, t := range []*policy.Tree{in.Egress, in.Ingress} {
			if t != nil && t.BPF && !feats.BPF {
				d.Errorf(t.Pos, "%s %s: needs the BPF classifier, but this kernel cannot run it (sched_cls programs, cls_bpf or clsact missing; see sluice doctor)", in.Name, t.Dir)
			}
			if t != nil && t.Police != nil {
				p.Devices = append(p.Devices, policeOnly(feats, in, t))
			}
		}
		if in.Egress != nil && in.Egress.Police == nil {
			p.Devices = append(p.Devices, planTree(d, feats, in, in.Egress, in.Name, prev[in.Name]))
		}
		if in.Ingress != nil && in.Ingress.Police == nil {
			ifb := policy.IfbName(in)
			p.Devices = append(p.Devices, planTree(d, feats, in, in.Ingress, ifb, prev[ifb]))
		}
		rttEchoes(feats, in, p.Devices[first:])
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	return p, nil
}

// planTree plans one direction's tree on device devName.
func planTree(d *policy.Diag, feats Features, in *policy.Interface, t *policy.Tree, devName string, prev *Alloc) *Device {
	build := buildTree
	if t.EDT() {
		build = buildEDT
	}
	dev := build(d, feats, in, t, devName, prev)
	dev.rttClasses()
	if t.IsAuto() {
		dev.Auto, dev.in, dev.feats, dev.tree = t.Auto, in, feats, t
		if t.RateBps == t.Auto.BaseBps {
			dev.Notes = append(dev.Notes, fmt.Sprintf("rate: auto: planned at its base, %s; the agent (sluice agent) moves it between %s and %s as the link's delay says",
				t.Auto.BaseBps.String(), t.Auto.MinBps.String(), t.Auto.MaxBps.String()))
		}
	}
	return dev
}

// markClassifier gives a tree that matches marks the BPF classifier
// when its classifier is auto and this kernel's u32 cannot match marks
// (CONFIG_CLS_U32_MARK off, as on the project's CI machines): u32 would
// accept the match and silently ignore it. It returns in, or a copy of
// it with such trees copied and changed (the policy is not modified).
func markClassifier(in *policy.Interface, feats Features) *policy.Interface {
	if feats.U32Mark || !feats.BPF {
		return in
	}
	needs := func(t *policy.Tree) bool {
		return t != nil && !t.BPF && t.Police == nil && t.Classifier == "auto" && matchesMarks(t.Classes)
	}
	if !needs(in.Egress) && !needs(in.Ingress) {
		return in
	}
	out := *in
	for _, t := range []**policy.Tree{&out.Egress, &out.Ingress} {
		if needs(*t) {
			bt := **t
			bt.BPF = true
			*t = &bt
		}
	}
	return &out
}

// MatchesMarks reports whether a rule of tree t matches firewall marks.
func MatchesMarks(t *policy.Tree) bool { return t != nil && matchesMarks(t.Classes) }

func matchesMarks(cs []*policy.Class) bool {
	for _, c := range cs {
		for _, m := range c.Match {
			if m.Mark != nil {
				return true
			}
		}
		if matchesMarks(c.Classes) {
			return true
		}
	}
	return false
}

// ProbesName names the rule that sends rate: auto's probes past the
// tree (plan and export show it).
const ProbesName = "(autorate probes)"

// probes is the match of rate: auto's probes that the tree's
// classifier sends to HTB's direct queue, nil where there is none to
// send (a fixed rate; EDT, which exempts them; a sharded tree, whose
// HTBs have majors of their own).
func (b *builder) probes() *policy.Match {
	if b.edt != nil || b.major != 1 || b.shard > 0 || b.div > 1 {
		return nil
	}
	return b.tree.ProbeMatch()
}

type builder struct {
	d       *policy.Diag
	feats   Features
	dev     *Device
	tree    *policy.Tree
	classes *idPool[uint16]
	tables  *idPool[uint16]
	prev    *Alloc
	byName  map[string]*policy.Class
	objs    []tc.Object
	filters []tc.Object
	// Sharded trees (see shard.go); major is the HTB being emitted.
	major   uint16
	div     units.Rate // non-host classes' rates are divided among shards
	shard   int
	shardOf map[string]uint16 // host class -> shard (the new Alloc.Shards)
	// replicas are each shard's copies of the non-host classes, with
	// their whole rates: what the shard balancer scales.
	replicas [][]Scaled
	// refs holds each host class's ids once they are all handed out: one
	// lookup per use instead of one per pool (sharded trees only).
	refs map[string]hostRef
	// hostLists caches hostsOf.
	hostLists map[*policy.Class][][]hostItem
	hostIDs   []*idPool[uint16]
	leafIDs   *idPool[uint16]
	counters  *idPool[uint32]
	keyBuf    []byte // scratch for map keys
	// edt is set while compiling an EDT tree (edt.go).
	edt *edtPlan
	// quanta holds the quanta shareGroup gave classes that share spare
	// capacity with siblings (share.go).
	quanta map[string]uint32
	// blocks hands out the prio ranges of filter blocks (blockRange).
	blocks *idPool[uint16]
	// rtt numbers the classes' round-trip histograms when the interface
	// times round trips (rtt.go), with rttFlows its flow bound.
	rtt      map[string]uint32
	rttFlows uint32
}

func buildTree(d *policy.Diag, feats Features, in *policy.Interface, t *policy.Tree, devName string, prev *Alloc) *Device {
	if prev == nil {
		prev = newAlloc()
	}
	dev := &Device{Name: devName, Interface: in.Name, Dir: t.Dir, Ifb: t.Dir == policy.Ingress, Alloc: newAlloc()}
	dev.Alloc.Tag = prev.Tag
	b := &builder{d: d, feats: feats, dev: dev, tree: t, prev: prev, byName: map[string]*policy.Class{}, major: 1, div: 1}
	b.rttSetup(in, t)
	n, note := shardsFor(d, feats, t, devName)
	if note != "" {
		dev.Notes = append(dev.Notes, note)
	}
	dev.Notes = append(dev.Notes, linkNotes(t, in.Name)...)
	if n > 1 {
		if ids := pinnedIDs(t.Classes); len(ids) > 0 {
			d.Errorf(ids[0].ClassIDPos, "%s %s: class %s: classid on a tree sharded over %d transmit queues (each shard numbers its own classes); set shards: 1 or remove classid", in.Name, t.Dir, ids[0].Name, n)
		}
		if hasSharing(t) {
			d.Errorf(t.Pos, "%s %s: sharing: controller on a tree sharded over %d transmit queues is not supported; set shards: 1", in.Name, t.Dir, n)
		}
		b.sharded(n)
		return dev
	}

	var names []string
	b.walkNames(t.Classes, func(name string, _ bool) { names = append(names, name) })
	b.capNames(t, func(name string) { names = append(names, name) })
	b.classes = newPool(prev.Classes, 0x10, policy.MaxClasses+1)
	// Ids the policy pins first: a class that held one before gives it
	// up and is numbered anew.
	for _, c := range pinnedIDs(t.Classes) {
		b.classes.take(c.Name, c.ClassID)
	}
	for _, n := range names { // new ids in policy order
		b.minor(n)
	}
	b.tables = newPool(prev.Tables, 1, 0x7FF)

	if dev.Ifb {
		b.objs = append(b.objs, &tc.Link{Name: devName, Kind: "ifb", Up: true})
	}
	def, _ := b.minor(t.Default)
	b.objs = append(b.objs, &tc.Qdisc{Dev: devName, Parent: tc.HandleRoot, Handle: RootHandle, Kind: "htb",
		HTB: &tc.HTBQdisc{Default: uint32(def), R2Q: dev.Alloc.R2Q()}, Stab: LinkStab(t)})
	b.objs = append(b.objs, &tc.Class{Dev: devName, Parent: RootHandle, Handle: RootClassID, Kind: "htb",
		Rate: t.RateBps, Ceil: t.RateBps, Burst: BurstFor(t.RateBps, t.Dir), Cburst: BurstFor(t.RateBps, t.Dir),
		Quantum: QuantumFor(t.RateBps, t.RateBps, LeafFIFO), Name: RootClassName})
	var leaves []tc.Object
	b.shareGroup(nil, t.Classes, 0)
	b.classTree(t.Classes, RootClassID, &leaves)
	b.controllers()
	b.objs = append(b.objs, leaves...)
	if t.BPF {
		b.objs = append(b.objs, clsact(devName), b.bpfHook())
	} else {
		b.block(RootHandle, t.Classes, "", nil)
		b.objs = append(b.objs, b.filters...)
		if b.rtt != nil {
			b.objs = append(b.objs, clsact(devName), b.observeHook())
		}
	}

	if dev.Ifb {
		b.objs = append(b.objs, redirect(in.Name, devName)...)
	}
	dev.Objects = b.objs
	dev.Alloc.Classes, dev.Alloc.Tables = b.classes.next, b.tables.next
	return dev
}

// walkNames registers the classes of cs by name and calls add, in
// policy order, for each class and each of its host classes.
func (b *builder) walkNames(cs []*policy.Class, add func(name string, host bool)) {
	for _, c := range cs {
		add(c.Name, false)
		b.byName[c.Name] = c
		if c.PerHost != nil {
			for _, h := range c.PerHost.Hosts() {
				add(hostName(c, h), true)
			}
			for _, e := range c.PerHost.Entries {
				add(entryName(c, e), true)
			}
		}
		b.walkNames(c.Classes, add)
	}
}

// HostClassName is the name of the class of host h of per_host class c,
// as plans, records and statistics name it.
func HostClassName(c *policy.Class, h netip.Prefix) string { return hostName(c, h) }

func hostName(c *policy.Class, h netip.Prefix) string {
	if h.Bits() == h.Addr().BitLen() {
		return c.Name + "/" + h.Addr().String()
	}
	return c.Name + "/" + h.String()
}

func (b *builder) minor(name string) (uint16, bool) {
	pool := b.classes
	if s, host := b.shardOf[name]; host {
		pool = b.hostIDs[s]
	}
	id, ok := pool.get(name)
	if !ok {
		b.d.Errorf(b.tree.Pos, "%s %s: ran out of class ids: %d classes, and one HTB holds %d (with classifier bpf a device of several transmit queues shards the tree, one HTB per queue)",
			b.dev.Interface, b.tree.Dir, b.tree.ClassCount, policy.MaxClasses)
	}
	return id, ok
}

// hostRef is where a host class's ids stand.
type hostRef struct {
	shard, minor uint16
	counter      uint32
}

func (b *builder) classID(name string) tc.Handle {
	if b.edt != nil {
		return 0 // no HTB
	}
	if r, ok := b.refs[name]; ok {
		return tc.MakeHandle(shardMajor(int(r.shard)), r.minor)
	}
	id, _ := b.minor(name)
	if s, host := b.shardOf[name]; host {
		return tc.MakeHandle(shardMajor(int(s)), id)
	}
	return tc.MakeHandle(b.major, id)
}

// classTree emits classes top-down and collects leaf qdiscs.
func (b *builder) classTree(cs []*policy.Class, parent tc.Handle, leaves *[]tc.Object) {
	var owner *policy.Class
	if len(cs) > 0 {
		owner = cs[0].Parent
	}
	capID := parent
	sh, held := b.capped(owner, cs)
	if sh != nil {
		capID = b.capClass(owner, cs, held, sh, parent)
	}
	for i, c := range cs {
		id := b.classID(c.Name)
		parent := parent
		if held != nil && held[i] {
			parent = capID
		}
		cl := &tc.Class{Dev: b.dev.Name, Parent: parent, Handle: id, Kind: "htb",
			Rate: max(c.RateBps/b.div, 1), Ceil: c.CeilBps, Prio: uint32(c.Prio), Name: c.Name}
		setBursts(cl, b.tree.Dir, b.groupRate(c.Parent), b.leafKind(c.Leaf), c.Burst, c.Cburst, c.Quantum)
		if q, ok := b.quanta[c.Name]; ok {
			cl.Quantum = q
		}
		turnBurst(cl, c.Cburst, b.parentCeil(c.Parent), !c.IsLeaf())
		if _, host := b.shardOf[c.Name]; b.div > 1 && !host {
			for len(b.replicas) <= b.shard {
				b.replicas = append(b.replicas, nil)
			}
			b.replicas[b.shard] = append(b.replicas[b.shard], Scaled{Handle: id, Rate: c.RateBps})
			cl.Controlled = true
		}
		b.objs = append(b.objs, cl)
		info := ClassInfo{Name: c.Name, Handle: id, Parent: parent, Rate: cl.Rate, Ceil: cl.Ceil, Prio: cl.Prio,
			Default: c.Name == b.tree.Default, Counter: b.counter(c.Name), Replica: b.shard > 0}
		if c.IsLeaf() {
			info.Leaf = "none" // a leaf all the same: stats and conformance count it
			leaf := b.leaf(c.Name, id, c.Leaf, c.LeafPos, c.Limit, c.RateBps/b.div, c.CeilBps, cl.Quantum, false)
			if leaf != nil {
				info.Leaf = leaf.Kind
				*leaves = append(*leaves, leaf)
			}
		}
		b.dev.Classes = append(b.dev.Classes, info)
		if !c.IsLeaf() {
			var turn uint32
			if b.reach(c) > cl.Rate {
				turn = cl.Quantum
			}
			b.shareGroup(c, c.Classes, turn)
		}
		if c.PerHost != nil {
			for _, h := range b.hostsOf(c)[b.shard] {
				b.hostClass(c, h, id, leaves)
			}
		}
		for _, e := range c.Hosts { // hosts_file entries whose parent column names c
			b.hostClass(e.Owner, hostItem{entryName(e.Owner, e), e.RateBps, e.CeilBps, entryPrio(e)}, id, leaves)
		}
		b.classTree(c.Classes, id, leaves)
	}
}

func setBursts(cl *tc.Class, dir string, link units.Rate, leaf Leaf, burst, cburst, quantum *policy.Size) {
	cl.Burst, cl.Cburst, cl.Quantum = BurstFor(cl.Rate, dir), BurstFor(cl.Ceil, dir), QuantumFor(cl.Rate, link, leaf)
	if burst != nil {
		cl.Burst = uint32(burst.Bytes)
	}
	if cburst != nil {
		cl.Cburst = uint32(cburst.Bytes)
	}
	if quantum != nil {
		cl.Quantum = uint32(quantum.Bytes)
	}
}

// LinkStab is the size table of an HTB tree's link-layer keys (nil:
// none; an EDT tree's program counts them itself, bpf.Link),
// for the HTB at the root of each transmit queue: the kernel sizes a
// packet once, at the qdisc it enters first, and every class under it
// charges that size. A GSO packet is sized once for all its segments
// (docs/policy.md, Link layer).
func LinkStab(t *policy.Tree) *tc.Stab {
	if t.Overhead == 0 && t.MPU == 0 && (t.Linklayer == "" || t.Linklayer == "ethernet" || t.Linklayer == "ptm") {
		return nil
	}
	s := &tc.Stab{Overhead: int32(t.Overhead), Linklayer: tc.LinkEthernet, MPU: uint32(t.MPU)}
	if t.Linklayer == "atm" {
		s.Linklayer = tc.LinkATM
	}
	return s
}

// linkNotes says what a tree's link-layer keys do that a user may not
// expect.
func linkNotes(t *policy.Tree, dev string) []string {
	var notes []string
	if t.Linklayer == "ptm" {
		notes = append(notes, fmt.Sprintf("linklayer ptm: every rate is shaped at 64/65 of what the policy says (VDSL2's 64b/65b encoding): the %s rate %s carries %s",
			t.Dir, t.Rate.Bps.String(), t.RateBps.String()))
	}
	if LinkStab(t) != nil && !t.EDT() { // the EDT program counts each segment
		notes = append(notes, fmt.Sprintf("overhead and linklayer are counted once per GSO packet, not per segment: for exact accounting below about 100 Mbit/s turn segmentation offloads off (ethtool -K %s gso off gro off tso off)", dev))
	}
	return notes
}

// turnBurst makes a class's cburst hold its quantum, unless the policy
// sets it. A class borrowing at its parent's level sends its quantum per
// turn at the parent's speed, and its ceil's bucket stops it after
// cburst: a class whose ceil is far below the link lost the rest of
// every turn, and waited a whole round for the next (measured in
// examples/isp.yaml: hosts with 100mbit ceils, 12500-byte cbursts and
// 167625-byte quanta got 62 and 69 of their 100 Mbit/s beside classes
// with 1gbit ceils, about a cburst and a packet per 2.4 ms round). Over
// time the ceil holds as before: a turn is a burst at the link's speed
// of at most one quantum. HTB keeps a burst as its time at the rate, in
// 32 bits of 64 ns ticks (about 274 s): a slow ceil's is held well
// within it.
//
// A class whose ceil is its parent's (parentCeil) keeps the ceil's own
// burst: the parent's bucket ends the turn as soon, and a bigger one only
// lets the class burst past its parent's pace (measured in the home
// scenario: a download class's 47500-byte cburst beside a 95mbit root's
// 11875 put ping's p95 at 45-87 ms in the download phase, 0.3-0.5 ms
// with the ceil's own).
//
// An inner class that borrows (inner, its rate below its ceil) has a
// bucket of two turns; one that cannot borrow serves its children from
// its rate's bucket. Its turn is its children's, each of which ends a
// packet or more past its quantum, and with a bucket of exactly one the
// class's round within was cut short at every turn: in the 6.1 lane (the conformance matrix's groups shape at
// quarter rates, a group capped at 1.5 Mbit/s with three one-flow hosts)
// the group's first host got the least in five of six clean-clone runs
// (2.6 to 6.5% under its share) and the last more than its share in all
// six; with the hosts_file's lines reversed the bias followed the
// classes. With two turns the first host was 2.0% under its share at
// most, and the cell's worst read 2.0 to 4.0% in five runs (3.2 to 7.7%
// with one, on the same guest, first looks).
func turnBurst(cl *tc.Class, cburst *policy.Size, parentCeil units.Rate, inner bool) {
	if cburst == nil && cl.Ceil < parentCeil {
		turn := uint64(cl.Quantum)
		if inner && cl.Rate < cl.Ceil {
			turn *= 2
		}
		cl.Cburst = max(cl.Cburst, uint32(min(turn, uint64(min(float64(cl.Ceil)*maxTurnBurstTime, 1<<30)))))
	}
}

// parentCeil is the ceil of the class that owns p's children (the tree's
// rate at the root).
func (b *builder) parentCeil(p *policy.Class) units.Rate {
	if p == nil || p.CeilBps > b.tree.RateBps {
		return b.tree.RateBps
	}
	return p.CeilBps
}

// maxTurnBurstTime bounds turnBurst's cburst, in seconds at the ceil.
const maxTurnBurstTime = 200

// leaf picks and sizes a leaf qdisc. auto takes fq_codel, then sfq, then
// a bfifo of about 50 ms at ceil, so that a kernel without an AQM never
// gets a 1000-packet queue.
// autoLeaf is what leaf auto picks on this kernel.
func (b *builder) autoLeaf() string {
	switch {
	case b.feats.Qdiscs["fq_codel"]:
		return "fq_codel"
	case b.feats.Qdiscs["sfq"]:
		return "sfq"
	}
	return "bfifo"
}

// leafKind says what a class whose leaf is kind ("" or auto: the
// tree's, then this kernel's pick) hands HTB: its quanta's floor
// (quantumFloor).
func (b *builder) leafKind(kind string) Leaf {
	if kind == "" {
		kind = b.tree.Leaf
	}
	if kind == "" || kind == "auto" {
		kind = b.autoLeaf()
	}
	switch kind {
	case "cake":
		return LeafFrames
	case "fq_codel", "fq":
		return LeafAQM
	}
	return LeafFIFO
}

// leafOf is leafKind for class c; an inner class holds no packets.
func (b *builder) leafOf(c *policy.Class) Leaf {
	if !c.IsLeaf() {
		return LeafFIFO
	}
	return b.leafKind(c.Leaf)
}

func (b *builder) leaf(owner string, class tc.Handle, kind string, at policy.Pos, limit *policy.Limit, rate, ceil units.Rate, quantum uint32, perHost bool) *tc.Qdisc {
	if kind == "" {
		kind, at = b.tree.Leaf, b.tree.LeafPos
	}
	// Errors name the per_host class, not each of its hosts.
	what, _, _ := strings.Cut(owner, "/")
	switch {
	case kind == "none":
		return nil // HTB's own pfifo
	case kind == "" || kind == "auto":
		kind = b.autoLeaf()
	case !b.feats.Qdiscs[kind]:
		b.d.Errorf(at, "class %s: leaf %s: this kernel has no %s qdisc (sch_%s is not built or loaded); use another leaf or auto",
			what, kind, kind, kind)
		return nil
	}
	q := &tc.Qdisc{Dev: b.dev.Name, Parent: class, Handle: tc.MakeHandle(class.Minor(), 0), Kind: kind, Owner: owner}
	if b.leafIDs != nil {
		key := class.AppendText(append(append(b.keyBuf[:0], owner...), '@'))
		b.keyBuf = key
		major, ok := b.leafIDs.getBytes(key)
		if !ok {
			b.d.Errorf(at, "class %s: more leaf qdiscs than one device's qdisc handles hold (%d); set leaf: none for per_host classes (HTB's own pfifo)",
				what, leafCapacity)
			return nil
		}
		q.Handle = tc.MakeHandle(major, 0)
	}
	var pk uint32
	if limit != nil {
		pk = limit.Packets
	}
	switch kind {
	case "fq_codel":
		t, iv := CodelTimes(rate)
		q.FqCodel = &tc.FqCodel{Limit: pk, Target: t, Interval: iv}
		if perHost {
			q.FqCodel.Flows = perHostFlows
		}
	case "sfq":
		q.Sfq = &tc.Sfq{Limit: pk, Perturb: 10}
	case "fq":
		q.Fq = &tc.Fq{Limit: pk}
	case "cake":
		q.Cake = &tc.Cake{SplitGSO: true, RTT: cakeRTT, Target: tc.CakeTarget(cakeRTT)}
	case "pfifo":
		q.Fifo = &tc.Fifo{Limit: pk}
	case "bfifo":
		limitOf := BfifoLimit
		if b.dev.Ifb {
			limitOf = IngressBfifoLimit
		}
		l := limitOf(rate, ceil, quantum)
		switch {
		case limit != nil && limit.Bytes > 0:
			l = limit.Bytes
		case limit != nil:
			l = limit.Packets * frameBytes
		}
		q.Fifo = &tc.Fifo{Limit: l}
	}
	return q
}

// A rule sends packets matching one class's entries to that class.
type rule struct {
	class   *policy.Class
	entries []*policy.Match
}

// rulesOf lists, in policy order, the rules of a filter block: classes
// with match entries, and the rules of children of classes without any
// (such a class only groups its children for sharing, so its children's
// rules belong to the enclosing block).
func rulesOf(cs []*policy.Class) []rule {
	var out []rule
	for _, c := range cs {
		switch {
		case len(c.Match) > 0 || c.PerHost != nil:
			out = append(out, rule{class: c, entries: c.Match})
		case len(c.Classes) > 0:
			out = append(out, rulesOf(c.Classes)...)
		}
	}
	return out
}

// block emits the filters attached at parent for classes cs, then the
// blocks of the gating classes among them.
func (b *builder) block(parent tc.Handle, cs []*policy.Class, blockKey string, catchAll *policy.Class) {
	rules := rulesOf(cs)
	keys := make([]string, len(rules))
	for i, r := range rules {
		keys[i] = blockKey + "/" + r.class.Name
	}
	lo, hi := uint16(1), rootPrioMax
	if blockKey == "" && b.probes() != nil {
		// rate: auto's probes skip the tree: HTB's direct queue (1:0).
		b.rule(parent, 1, &policy.Class{Name: ProbesName}, []*policy.Match{b.probes()}, RootHandle)
		lo = 2
	}
	if blockKey != "" {
		var ok bool
		if lo, hi, ok = b.blockRange(blockKey); !ok {
			b.d.Errorf(b.tree.Pos, "%s: more than %d gate and per_host classes for u32 filters; classifier bpf has no such limit", b.dev.Name, maxBlocks)
			return
		}
		lo, hi = lo+1, hi-1 // the catch-all takes the end
	}
	prios := orderedPrios(keys, b.prev.Prios, lo, hi)
	for i, r := range rules {
		prio := prios[keys[i]]
		b.dev.Alloc.Prios[keys[i]] = prio
		entries := r.entries
		if ph := r.class.PerHost; ph != nil {
			if ph.HostsFile != "" {
				if len(entries) > 0 {
					b.d.Errorf(ph.Pos, "class %s: per_host hosts_file with match rules needs classifier bpf (u32 cannot combine a host lookup with them)", r.class.Name)
				}
				b.hostsFileU32(parent, prio, r.class)
				continue
			}
			entries = gateEntries(entries, ph)
		}
		b.rule(parent, prio, r.class, entries, b.classID(r.class.Name))
	}
	if catchAll != nil {
		b.catchAll(parent, catchAll, blockKey, hi+1)
	}
	for _, r := range rules {
		c := r.class
		switch {
		case c.PerHost != nil && c.PerHost.HostsFile != "":
		case c.PerHost != nil:
			b.perHost(c)
		case len(c.Classes) > 0:
			var def *policy.Class
			if c.Default != "" {
				def = b.byName[c.Default]
			}
			b.block(b.classID(c.Name), c.Classes, c.Name, def)
		}
	}
}

// gateEntries narrows a per_host class's entries to its cidr, so that
// traffic outside it falls through to later rules.
func gateEntries(entries []*policy.Match, ph *policy.PerHost) []*policy.Match {
	if len(entries) == 0 {
		entries = []*policy.Match{{Fields: map[string]policy.Pos{}}}
	}
	var out []*policy.Match
	for _, e := range entries {
		m := *e
		m.Fields = map[string]policy.Pos{}
		for k, v := range e.Fields {
			m.Fields[k] = v
		}
		m.Fields[ph.By] = ph.Pos
		if ph.By == "dst" {
			if m.Dst = narrow(e.Dst, ph.CIDR); len(m.Dst) == 0 {
				continue
			}
		} else if m.Src = narrow(e.Src, ph.CIDR); len(m.Src) == 0 {
			continue
		}
		out = append(out, &m)
	}
	return out
}

func narrow(ps []netip.Prefix, cidr netip.Prefix) []netip.Prefix {
	if len(ps) == 0 {
		return []netip.Prefix{cidr}
	}
	return intersect(ps, cidr)
}

// rule emits one class's u32 filters at prio: root-table nodes in entry
// order, IPv4 transport matches in tables behind next-header links.
func (b *builder) rule(parent tc.Handle, prio uint16, c *policy.Class, entries []*policy.Match, flowid tc.Handle) {
	if len(entries) == 0 {
		return
	}
	for _, e := range entries {
		if e.Mark != nil && !b.feats.U32Mark {
			b.d.Errorf(e.Fields["mark"], "class %s: mark: this kernel's u32 cannot match marks (CONFIG_CLS_U32_MARK is not set; it would silently match every packet): leave classifier auto, or set classifier bpf, to match marks in sluice's BPF classifier",
				c.Name)
			return
		}
	}
	base := tc.Filter{Dev: b.dev.Name, Parent: parent, Prio: prio, Proto: tc.ProtoAll, Kind: "u32"}
	tp := base
	tp.Note = "class " + c.Name
	var tables, nodes []tc.Object
	node := uint32(0)
	for ei, e := range entries {
		for _, rn := range compileMatch(e) {
			node++
			if node > 0xFFF {
				b.d.Errorf(e.Pos, "class %s: the match list expands to more than 4095 u32 nodes; use fewer ranges or prefixes", c.Name)
				return
			}
			n := base
			n.Handle = node
			n.Note = fmt.Sprintf("class %s, match %d: %s", c.Name, ei+1, rn.note)
			n.U32 = &tc.U32{Sel: &tc.Sel{Keys: rn.keys}, Mark: rn.mark}
			if rn.table == nil {
				n.U32.ClassID = flowid
			} else {
				tid, ok := b.tables.get(fmt.Sprintf("%s/%d", c.Name, node))
				if !ok {
					b.d.Errorf(e.Pos, "class %s: ran out of u32 table ids", c.Name)
					return
				}
				th := tc.MakeU32Handle(uint32(tid), 0, 0)
				t := base
				t.Handle = th
				t.U32 = &tc.U32{Divisor: 1}
				tables = append(tables, &t)
				for j, keys := range rn.table {
					tn := base
					tn.Handle = tc.MakeU32Handle(uint32(tid), 0, uint32(j+1))
					tn.U32 = &tc.U32{Sel: &tc.Sel{Keys: keys}, ClassID: flowid}
					tables = append(tables, &tn)
				}
				// Transport nodes read at next-header (IHL*4) offsets.
				n.U32.Link = th
				n.U32.Sel.Flags = tc.SelVarOffset
				n.U32.Sel.Offmask = 0x0f00
				n.U32.Sel.Offshift = 6
			}
			nodes = append(nodes, &n)
		}
	}
	if len(nodes) == 0 {
		// Rules no packet can match (an IPv4 rule on IPv6 hosts): no
		// filter, where an empty u32 instance would not stay in the
		// kernel and every plan would add it again.
		return
	}
	b.filters = append(b.filters, &tp)
	b.filters = append(b.filters, tables...)
	b.filters = append(b.filters, nodes...)
}

// catchAll sends whatever reached a gating class but matched none of its
// children's rules to the class's default child.
func (b *builder) catchAll(parent tc.Handle, def *policy.Class, blockKey string, prio uint16) {
	base := tc.Filter{Dev: b.dev.Name, Parent: parent, Prio: prio, Proto: tc.ProtoAll, Kind: "u32"}
	tp := base
	tp.Note = "default of " + blockKey
	n := base
	n.Handle = 1
	n.Note = "rest of " + blockKey + " -> " + def.Name
	n.U32 = &tc.U32{Sel: &tc.Sel{Keys: []tc.Key{{}}}, ClassID: b.classID(def.Name)}
	b.filters = append(b.filters, &tp, &n)
}

// perHost emits, on the per_host class, u32 hash tables that find a
// host's class in one or two lookups (8 host bits per level) instead of
// scanning a list.
func (b *builder) perHost(c *policy.Class) {
	ph := c.PerHost
	v4 := ph.CIDR.Addr().Is4()
	addrOff := pick(v4, v4Dst, v6Dst)
	if ph.By == "src" {
		addrOff = pick(v4, v4Src, v6Src)
	}
	parent := b.classID(c.Name)
	key := c.Name + "/per_host"
	prio, _, ok := b.blockRange(key)
	if !ok {
		b.d.Errorf(ph.Pos, "%s: more than %d gate and per_host classes for u32 filters; classifier bpf has no such limit", b.dev.Name, maxBlocks)
		return
	}
	b.dev.Alloc.Prios[key] = prio
	base := tc.Filter{Dev: b.dev.Name, Parent: parent, Prio: prio, Proto: tc.ProtoAll, Kind: "u32"}
	tp := base
	tp.Note = "per-host classes of " + c.Name
	b.filters = append(b.filters, &tp)

	hostBits := ph.Prefix - ph.CIDR.Bits()
	lowBits := min(8, hostBits)
	highBits := hostBits - lowBits
	// hashSel hashes address bits [hi-n, hi) (prefix positions).
	hashSel := func(hi, n int) (off int16, mask uint32) {
		word := (hi - 1) / 32
		shift := 32*(word+1) - hi
		return int16(addrOff) + int16(4*word), (uint32(1)<<n - 1) << shift
	}
	version := tc.Key{Mask: 0xf0000000, Val: 0x40000000}
	if !v4 {
		version.Val = 0x60000000
	}
	table := func(k string, divisor uint32) uint32 {
		id, ok := b.tables.get(k)
		if !ok {
			b.d.Errorf(ph.Pos, "class %s: ran out of u32 table ids", c.Name)
			return 0
		}
		t := base
		t.Handle = tc.MakeU32Handle(uint32(id), 0, 0)
		t.U32 = &tc.U32{Divisor: divisor}
		t.Note = "hash table " + k
		b.filters = append(b.filters, &t)
		return uint32(id)
	}
	// Tables deepest first: a table must exist before a node links to it.
	hosts := ph.Hosts()
	groups := map[uint32][]netip.Prefix{}
	var order []uint32
	for _, h := range hosts {
		g := uint32(0)
		if highBits > 0 {
			g = bitsAt(h.Addr(), ph.Prefix-lowBits, highBits)
		}
		if _, seen := groups[g]; !seen {
			order = append(order, g)
		}
		groups[g] = append(groups[g], h)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	lowTables := map[uint32]uint32{}
	for _, g := range order {
		k := key
		if highBits > 0 {
			k = fmt.Sprintf("%s/%d", key, g)
		}
		lowTables[g] = table(k, 1<<lowBits)
	}
	var topTable uint32
	if highBits > 0 {
		topTable = table(key+"/top", 1<<highBits)
	}
	hoffLow, hmaskLow := hashSel(ph.Prefix, lowBits)
	for _, g := range order {
		tid := lowTables[g]
		nodeIn := map[uint32]uint32{}
		for _, h := range groups[g] {
			bucket := bitsAt(h.Addr(), ph.Prefix, lowBits)
			nodeIn[bucket]++
			var k keyset
			k.prefix(addrOff, h)
			n := base
			n.Handle = tc.MakeU32Handle(tid, bucket, nodeIn[bucket])
			n.U32 = &tc.U32{Sel: &tc.Sel{Keys: k.keys}, ClassID: b.classID(hostName(c, h))}
			b.filters = append(b.filters, &n)
		}
	}
	link := func(handle uint32, keys []tc.Key, to uint32, hoff int16, hmask uint32, note string) {
		n := base
		n.Handle = handle
		n.U32 = &tc.U32{Sel: &tc.Sel{Keys: keys, Hoff: hoff, Hmask: hmask}, Link: tc.MakeU32Handle(to, 0, 0)}
		n.Note = note
		b.filters = append(b.filters, &n)
	}
	if highBits > 0 {
		for _, g := range order {
			var k keyset
			sub := netip.PrefixFrom(groups[g][0].Addr(), ph.Prefix-lowBits).Masked()
			k.prefix(addrOff, sub)
			link(tc.MakeU32Handle(topTable, g, 1), k.keys, lowTables[g], hoffLow, hmaskLow, "hosts in "+sub.String())
		}
		var k keyset
		k.add(0, version.Mask, version.Val, false)
		k.prefix(addrOff, ph.CIDR)
		hoff, hmask := hashSel(ph.Prefix-lowBits, highBits)
		link(1, k.keys, topTable, hoff, hmask, fmt.Sprintf("%s by %s", ph.CIDR, ph.By))
		return
	}
	var k keyset
	k.add(0, version.Mask, version.Val, false)
	k.prefix(addrOff, ph.CIDR)
	link(1, k.keys, lowTables[0], hoffLow, hmaskLow, fmt.Sprintf("%s by %s", ph.CIDR, ph.By))
}

// bitsAt extracts n address bits ending at prefix position end.
func bitsAt(a netip.Addr, end, n int) uint32 {
	b := a.AsSlice()
	var v uint32
	for i := end - n; i < end; i++ {
		bit := (b[i/8] >> (7 - uint(i%8))) & 1
		v = v<<1 | uint32(bit)
	}
	return v
}

// hostItem is one host class of a per_host class.
type hostItem struct {
	name       string
	rate, ceil units.Rate
	prio       uint32
}

// hostsOf lists per_host class c's hosts by shard (all in shard 0 when
// the tree is not sharded), in policy order. Built once per class: a
// sharded tree walks its classes once per shard.
func (b *builder) hostsOf(c *policy.Class) [][]hostItem {
	if hs, ok := b.hostLists[c]; ok {
		return hs
	}
	n := 1
	if b.hostIDs != nil {
		n = len(b.hostIDs)
	}
	hs := make([][]hostItem, n)
	if each := (c.PerHost.HostCount() + len(c.PerHost.Entries)) / n; n > 1 {
		for s := range hs {
			hs[s] = make([]hostItem, 0, each+each/8+4)
		}
	}
	put := func(h hostItem) {
		if r, ok := b.refs[h.name]; ok {
			hs[r.shard] = append(hs[r.shard], h)
			return
		}
		for s := range hs { // not a sharded host: in every tree
			hs[s] = append(hs[s], h)
		}
	}
	ph := c.PerHost
	for _, h := range ph.Hosts() {
		put(hostItem{hostName(c, h), ph.RateBps, ph.CeilBps, hostPrio(c)})
	}
	for _, e := range ph.Entries {
		if e.ParentCls == c {
			put(hostItem{entryName(c, e), e.RateBps, e.CeilBps, entryPrio(e)})
		}
	}
	if b.hostLists == nil {
		b.hostLists = map[*policy.Class][][]hostItem{}
	}
	b.hostLists[c] = hs
	return hs
}

// hostClass emits host h's class (of per_host class owner) below
// parent, with its leaf.
func (b *builder) hostClass(owner *policy.Class, h hostItem, parent tc.Handle, leaves *[]tc.Object) {
	name, rate, ceil, prio := h.name, h.rate, h.ceil, h.prio
	r, sharded := b.refs[name]
	if sharded && int(r.shard) != b.shard {
		return // the host lives in another shard
	}
	ph := owner.PerHost
	id, counter := tc.MakeHandle(shardMajor(int(r.shard)), r.minor), r.counter
	if !sharded {
		id, counter = b.classID(name), b.counter(name)
	}
	hc := &tc.Class{Dev: b.dev.Name, Parent: parent, Handle: id, Kind: "htb", Rate: rate, Ceil: ceil, Prio: prio, Name: name}
	setBursts(hc, b.tree.Dir, b.groupRate(owner), b.leafKind(ph.Leaf), nil, nil, nil)
	if q, ok := b.quanta[name]; ok {
		hc.Quantum = q
	}
	turnBurst(hc, nil, b.parentCeil(owner), false)
	b.objs = append(b.objs, hc)
	hi := ClassInfo{Name: name, Handle: id, Parent: parent, Rate: rate, Ceil: ceil, Prio: prio, Counter: counter, Leaf: "none"}
	if leaf := b.leaf(name, id, ph.Leaf, ph.LeafPos, ph.Limit, rate, ceil, hc.Quantum, true); leaf != nil {
		hi.Leaf = leaf.Kind
		*leaves = append(*leaves, leaf)
	}
	b.dev.Classes = append(b.dev.Classes, hi)
}

// pinnedIDs lists the classes of cs (and below) with a classid.
func pinnedIDs(cs []*policy.Class) []*policy.Class {
	var out []*policy.Class
	for _, c := range cs {
		if c.ClassID != 0 {
			out = append(out, c)
		}
		out = append(out, pinnedIDs(c.Classes)...)
	}
	return out
}
