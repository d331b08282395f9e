package plan

import (
	"fmt"
	"strings"

	"sluice/units"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
)

// Sharding. HTB serialises a device behind one root lock, and creating a
// class costs time linear in the classes its qdisc already has. On a
// multi-queue device a BPF tree with host classes is therefore split:
// mq at the root, one HTB per transmit queue ("shard"), each host class
// in exactly one shard, and the classifier pins each host's packets to
// its shard's queue (skb->queue_mapping). Non-host classes are copied
// into every shard with their rate divided among the shards and their
// ceil kept, and the classifier spreads their traffic over the shards by
// flow hash. Each shard's root has the tree rate divided by the shards:
// a root class cannot borrow, so that is all a shard carries, and the
// tree rate holds in sum (shardNote says which ceils are out of reach).

// Qdisc handles of sharded trees are chosen for the kernel's qdisc
// lookup. A device's qdiscs sit in a hash of 16 buckets keyed by handle
// (hash_32(handle, 4)), each bucket a list walked to the end; the mq
// root is found before the hash, the shards are not. Every class write
// and every leaf write looks its shard up, so with 10,000 leaves spread
// over the buckets each lookup walked hundreds of them. The shards get
// majors of one bucket of their own and no leaf ever takes a major of
// that bucket, so a shard is found among the shards alone. Leaves also
// keep out of bucket 0, where HTB's own pfifos (handle 0, hashed too)
// wait to be replaced by them.
const shardBucket = 3

// qdiscBucket is the kernel's qdisc hash bucket of handle major:0.
func qdiscBucket(major uint16) int { return int(uint32(major) << 16 * 0x61C88647 >> 28) }

// shardMajors are the handle majors of the shards' HTBs, in order.
var shardMajors = func() []uint16 {
	var out []uint16
	for m := uint16(0x100); len(out) < policy.MaxShards; m++ {
		if qdiscBucket(m) == shardBucket {
			out = append(out, m)
		}
	}
	return out
}()

// shardMajor is the handle major of shard s's HTB; the mq root is 1:.
func shardMajor(s int) uint16 { return shardMajors[s] }

// Leaf qdisc majors in sharded trees: from 0x100 (below, the majors of
// unsharded trees' classes) to below the kernel's automatic handles
// (0x8000 and up), outside the shards' bucket and bucket 0.
const (
	leafLo uint16 = 0x100
	leafHi uint16 = 0x7FFF
)

func leafMajorOK(m uint16) bool { b := qdiscBucket(m); return b != shardBucket && b != 0 }

// minHostsPerShard: auto shards a tree only as far as it has this many
// hosts per shard. Shards do not lend to each other, so a shard's hosts
// share its part of the rate whatever the others leave idle; with many
// hosts per shard the demand of each is alike, with few it is not (one
// busy host against ten on other shards got its shard's whole part).
const minHostsPerShard = 32

// shardsFor decides how many shards the tree on dev gets: 1 (no
// sharding) unless it is a BPF tree with host classes on a device with
// several transmit queues. auto takes no more shards than keep every
// ceil within a shard's part of the rate and give each shard
// minHostsPerShard hosts; note says why when it took fewer than queues.
func shardsFor(d *policy.Diag, feats Features, t *policy.Tree, dev string) (n int, note string) {
	q := feats.TxQueues[dev]
	if !t.BPF || t.Shards == 1 || q < 2 || !hasHosts(t.Classes) {
		return 1, ""
	}
	if feats.XPS[dev] {
		if t.Shards > 1 {
			d.Errorf(t.ShardsPos, "%s: shards: transmit packet steering (XPS) is configured on %s and would override the queue of each host; clear /sys/class/net/%s/queues/tx-*/xps_cpus or set shards: 1",
				t.Dir, dev, dev)
		}
		return 1, "" // auto: XPS is someone's choice; do not shard under it
	}
	n = min(q, policy.MaxShards)
	if t.Shards > 1 {
		return min(n, t.Shards), ""
	}
	// auto: every ceil within a shard's part, enough hosts per shard.
	byCeil, byHosts := n, n
	if top := maxHostCeil(t); top > 0 {
		byCeil = int(t.RateBps / top)
	}
	byHosts = t.Hosts / minHostsPerShard
	m := max(min(n, byCeil, byHosts), 1)
	if m == n {
		return n, ""
	}
	var why []string
	if byCeil < n {
		why = append(why, fmt.Sprintf("a host's ceil of %s needs shards of at least that (at most %d of %s)", maxHostCeil(t).String(), max(byCeil, 1), t.RateBps.String()))
	}
	if byHosts < n {
		why = append(why, fmt.Sprintf("%d hosts fill %d shards of %d or more", t.Hosts, max(byHosts, 1), minHostsPerShard))
	}
	word := fmt.Sprintf("%d shards", m)
	if m == 1 {
		word = "one tree"
	}
	return m, fmt.Sprintf("shards: auto made %s for %d transmit queues: %s; without the agent a shard cannot lend to the others (shards: N insists; the agent balances them)", word, n, strings.Join(why, "; "))
}

// maxHostCeil is the highest ceil of t's hosts: a host lives in one
// shard (a class the shards share spreads its flows over all of them,
// and only its single flows meet a shard's limit).
func maxHostCeil(t *policy.Tree) units.Rate {
	var top units.Rate
	var walk func(cs []*policy.Class)
	walk = func(cs []*policy.Class) {
		for _, c := range cs {
			if ph := c.PerHost; ph != nil {
				if ph.HostCount() > 0 {
					top = max(top, ph.CeilBps)
				}
				for _, e := range ph.Entries {
					top = max(top, e.CeilBps)
				}
			}
			walk(c.Classes)
		}
	}
	walk(t.Classes)
	return top
}

func hasHosts(cs []*policy.Class) bool {
	for _, c := range cs {
		if c.PerHost != nil || hasHosts(c.Classes) {
			return true
		}
	}
	return false
}

// shardNote says what a tree sharded n ways cannot do: a shard's root is
// an HTB root class, which cannot borrow, so each shard carries at most
// rate/n, and so does a host (pinned to one shard) or a flow of a class
// the shards share; and the shards do not lend to each other, so the
// hosts of a busy shard cannot use what an idle one leaves. Measured:
// one host alone with a ceil of the whole 200mbit, on a tree sharded
// four ways, got 47.8 Mbit/s; one busy host against ten on the other
// shards got its whole shard (docs/sharing.md).
func shardNote(t *policy.Tree, n int) string {
	limit := t.RateBps / units.Rate(n)
	count, names := 0, []string(nil)
	over := func(name string, ceil units.Rate, k int) {
		if ceil > limit && k > 0 {
			count += k
			if len(names) < 3 {
				names = append(names, name+" "+ceil.String())
			}
		}
	}
	var walk func(cs []*policy.Class)
	walk = func(cs []*policy.Class) {
		for _, c := range cs {
			if ph := c.PerHost; ph != nil {
				over(c.Name+" (each host)", ph.CeilBps, ph.HostCount())
				for _, e := range ph.Entries {
					over(entryName(c, e), e.CeilBps, 1)
				}
			} else {
				over(c.Name, c.CeilBps, 1)
			}
			walk(c.Classes)
		}
	}
	walk(t.Classes)
	s := fmt.Sprintf("sharded into %d HTBs, one per transmit queue: without `sluice agent` each carries at most %s (rate/%d), and shards do not lend to each other: the hosts of a busy shard share its part whatever the others leave idle; the agent balances the shards' rates every %s by the hosts active in each, their sum the direction's (an idle shard keeps %s on standby, rate/%d)",
		n, limit.String(), n, ShardQuantum, max(t.RateBps/units.Rate(n*shardStandby), 1).String(), n*shardStandby)
	if count > 0 {
		more := ""
		if count > len(names) {
			more = fmt.Sprintf(" and %d more", count-len(names))
		}
		s += fmt.Sprintf("; without the agent a host or one flow gets no more, so these ceils are out of reach: %s%s", strings.Join(names, ", "), more)
	}
	return s + ". shards: 1 makes one tree; backend: edt shares the rate across queues"
}

// sharded builds the tree as n shards under mq.
func (b *builder) sharded(n int) {
	t, dev, prev := b.tree, b.dev, b.prev
	var common, hosts []string
	b.walkNames(t.Classes, func(name string, host bool) {
		if host {
			hosts = append(hosts, name)
		} else {
			common = append(common, name)
		}
	})

	// A host keeps its shard while the shard exists; new hosts go to
	// the shard with the fewest.
	b.shardOf = make(map[string]uint16, len(hosts))
	load := make([]int, n)
	for _, h := range hosts {
		if s, ok := prev.Shards[h]; ok && int(s) < n {
			b.shardOf[h] = s
			load[s]++
		}
	}
	for _, h := range hosts {
		if _, ok := b.shardOf[h]; ok {
			continue
		}
		least := 0
		for j := range load {
			if load[j] < load[least] {
				least = j
			}
		}
		b.shardOf[h] = uint16(least)
		load[least]++
	}

	// Class minors: non-host classes share theirs across shards; hosts
	// take the rest of their shard's id space, and keep their minor
	// while they keep their shard. All pools fill one map, the new
	// Alloc.Classes (a host's name is in one shard only), and the host
	// pools look up previous ids in the previous Alloc.Classes itself:
	// with 10,000 hosts, maps copied per shard were a third of a
	// re-plan.
	prevCommon := map[string]uint16{}
	b.hostIDs = make([]*idPool[uint16], n)
	classes := make(map[string]uint16, len(hosts)+len(common))
	for s := range b.hostIDs {
		p := newPool[uint16](nil, 0x10, 0xFFFE)
		p.prev, p.next = prev.Classes, classes
		p.prevOK = func(name string) bool { ps, had := prev.Shards[name]; return had && int(ps) == s }
		b.hostIDs[s] = p
	}
	for name, id := range prev.Classes {
		if s, ok := b.shardOf[name]; ok {
			if ps, had := prev.Shards[name]; had && ps == s {
				b.hostIDs[s].reserved.set(uint64(id))
			}
		} else {
			prevCommon[name] = id
		}
	}
	b.classes = newPool(prevCommon, 0x10, 0xFFFE)
	b.classes.next = classes
	for _, name := range common {
		b.minor(name)
	}
	for _, p := range b.hostIDs {
		for _, name := range common {
			p.used.set(uint64(classes[name]))
		}
	}
	for _, h := range hosts {
		if _, ok := b.minor(h); !ok {
			b.d.Errorf(t.Pos, "%s %s: shard %d ran out of class ids; more transmit queues would help", dev.Interface, t.Dir, b.shardOf[h])
			return
		}
	}
	b.leafIDs = newPool(prev.Leaves, leafLo, leafHi)
	b.leafIDs.allowed = leafMajorOK
	b.counters = newPool(prev.Counters, 1, 1<<22)
	for _, name := range common {
		b.counter(name)
	}
	b.refs = make(map[string]hostRef, len(hosts))
	for _, h := range hosts {
		b.refs[h] = hostRef{shard: b.shardOf[h], minor: classes[h], counter: b.counter(h)}
	}
	b.tables = newPool(prev.Tables, 1, 0x7FF)

	// Every class has its ids now, so the classifier's content (host
	// tables of 10,000 entries) is compiled beside the class trees, on
	// a copy of the builder with its own diagnostics: both only read
	// the pools from here on.
	hb := *b
	hb.d, hb.keyBuf = &policy.Diag{File: b.d.File}, nil
	hb.shard, hb.major = 0, shardMajor(0)
	hookDone := make(chan *bpf.Hook, 1)
	go func() { hookDone <- hb.bpfHook() }()

	def, _ := b.minor(t.Default)
	// Sized ahead: growing them by doubling was a tenth of a re-plan's
	// memory, and every page is a fault in a one-shot run.
	b.objs = make([]tc.Object, 0, 2*len(hosts)+n*(2*len(common)+2)+3)
	dev.Classes = make([]ClassInfo, 0, len(hosts)+n*(len(common)+1))
	leaves := make([]tc.Object, 0, len(hosts)+n*len(common))
	b.objs = append(b.objs, &tc.Qdisc{Dev: dev.Name, Parent: tc.HandleRoot, Handle: RootHandle, Kind: "mq"})
	b.div = units.Rate(n)
	dev.Notes = append(dev.Notes, shardNote(t, n))
	roots := make([]*tc.Class, n)
	for s := 0; s < n; s++ {
		b.shard, b.major = s, shardMajor(s)
		qh := tc.MakeHandle(b.major, 0)
		root := tc.MakeHandle(b.major, 1)
		roots[s] = &tc.Class{Dev: dev.Name, Parent: qh, Handle: root, Kind: "htb",
			Rate: max(t.RateBps/b.div, 1), Ceil: t.RateBps, Burst: BurstFor(t.RateBps, t.Dir), Cburst: BurstFor(t.RateBps, t.Dir),
			Quantum: QuantumFor(t.RateBps/b.div, t.RateBps, LeafFIFO), Name: RootClassName}
		b.objs = append(b.objs,
			&tc.Qdisc{Dev: dev.Name, Parent: tc.MakeHandle(1, uint16(s+1)), Handle: qh, Kind: "htb",
				HTB: &tc.HTBQdisc{Default: uint32(def), R2Q: b.dev.Alloc.R2Q()}, Stab: LinkStab(b.tree)},
			roots[s])
		dev.Classes = append(dev.Classes, ClassInfo{Name: RootClassName, Handle: root, Parent: qh,
			Rate: max(t.RateBps/b.div, 1), Ceil: t.RateBps, Replica: s > 0})
		b.shareGroup(nil, t.Classes, 0)
		b.classTree(t.Classes, root, &leaves)
	}
	b.objs = append(b.objs, leaves...)
	b.shard, b.major = 0, shardMajor(0)
	b.shardBalancer(roots)
	hook := <-hookDone
	b.d.Errs = append(b.d.Errs, hb.d.Errs...)
	b.d.Warnings = append(b.d.Warnings, hb.d.Warnings...)
	hook.Content.Shards = uint32(n)
	b.objs = append(b.objs, clsact(dev.Name), hook)
	dev.Objects = b.objs

	// The pools' maps are the new allocation as they stand.
	a := dev.Alloc
	a.Classes, a.Shards, a.Leaves, a.Counters = classes, b.shardOf, b.leafIDs.next, b.counters.next
}

// counter is the BPF counter of class name: its minor, except in
// sharded trees.
func (b *builder) counter(name string) uint32 {
	if b.counters == nil {
		return 0
	}
	id, _ := b.counters.get(name)
	return id
}

// leafCapacity is how many leaf majors a sharded tree can hand out.
var leafCapacity = func() int {
	n := 0
	for m := leafLo; m <= leafHi; m++ {
		if leafMajorOK(m) {
			n++
		}
	}
	return n
}()
