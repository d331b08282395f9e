package kernel

import (
	"strings"
	"sync"

	"sluice/bpf"
	"sluice/plan"
	"sluice/records"
	"sluice/tc"
)

// maxTouched bounds apply's fast path: past it, one read of the whole
// tree costs less than a read per touched object.
const maxTouched = 2000

// ReadTouched is apply's fast path for edits that touch few objects
// (one subscriber's rate, a host added or removed). Instead of reading
// every tree back, it compares the plan's objects with the fingerprints
// the last apply recorded and reads from the kernel only the objects
// whose fingerprints differ, or that the plan no longer has. It returns
// them with those planned objects; their diff is the whole change.
//
// What it reads must be leaf-level host objects: HTB classes without
// children, their leaf qdiscs, and the classifier's maps. Anything
// else (a root, a shard, a class with children, a filter, an ifb), a
// tree without fingerprints, a missing root qdisc or classifier, or
// more than maxTouched objects sends the caller to the full path
// (ok false). Objects the edit does not touch are trusted to be as
// recorded: `apply --full` and `plan` read everything.
//
// The runtime layer (plan.Limits) differs from the fingerprints, which
// are the policy's: over is p with the limits laid over it (the same
// devices and objects, in the same order), what the kernel is to hold,
// and force names the objects to read back whatever their
// fingerprints say (those the limits record or the new limits touch).
// A class read only for that may have children: only its rate and
// ceil can differ.
func (k *Kernel) ReadTouched(p, over *plan.Plan, force map[string]bool) (l *Live, desired []tc.Object, ok bool, err error) {
	defer k.conn.Pin()()
	if len(p.Devices) != len(k.recs.Devices) || k.recs.Interrupted() {
		return nil, nil, false, nil // a tree to remove, or an apply to finish
	}
	l = &Live{Opt: Options{Replace: map[string]bool{}, Shared: map[string]bool{}},
		Adopted: map[string]bool{}, HookShared: map[string]bool{}}
	deltas := map[string]*fpDelta{}
	for di, d := range p.Devices {
		want := over.Devices[di].Objects
		rec := k.recs.Devices[d.Record()]
		if rec == nil || rec.Objects == nil || d.Ifb {
			return nil, nil, false, nil
		}
		keys, fps := keyedFingerprints(d.Objects)
		var hook *bpf.Hook
		// Classes that have children (by parent handle: a tree's
		// objects are on its device).
		parents := map[tc.Handle]bool{}
		for _, o := range d.Objects {
			switch x := o.(type) {
			case *tc.Class:
				parents[x.Parent] = true
			case *bpf.Hook:
				hook = x
			}
		}
		delta := &fpDelta{set: map[string]uint64{}}
		deltas[d.Record()] = delta
		var touched, wanted []tc.Object
		limitOnly := map[tc.Object]bool{}
		found := 0
		for i, o := range d.Objects {
			fp, had := rec.Objects[keys[i]]
			if had {
				found++
			}
			switch {
			case !had || fp != fps[i]:
				delta.set[keys[i]] = fps[i]
			case force[keys[i]]:
				limitOnly[o] = true
			default:
				continue
			}
			touched = append(touched, o)
			wanted = append(wanted, want[i])
		}
		var removed []string
		if found < len(rec.Objects) { // some recorded object is not planned
			planned := make(map[string]bool, len(keys))
			for _, key := range keys {
				planned[key] = true
			}
			for key := range rec.Objects {
				if !planned[key] {
					removed = append(removed, key)
				}
			}
			delta.del = removed
		}
		if len(touched)+len(removed) > maxTouched {
			return nil, nil, false, nil
		}
		// The tree must still be there, as recorded.
		if !d.PoliceOnly && !k.treeIntact(d, rec) {
			return nil, nil, false, nil
		}
		var hookFilter *tc.Filter
		if hook != nil {
			parent := tc.HandleEgressHook
			if hook.Ingress {
				parent = tc.HandleIngressHook
			}
			fs, err := k.conn.Filters(hook.Dev, parent)
			if err != nil {
				return nil, nil, false, nil
			}
			if hookFilter = ourFilter(fs); hookFilter == nil {
				return nil, nil, false, nil
			}
		}
		for ti, o := range touched {
			var live tc.Object
			switch x := o.(type) {
			case *tc.Class:
				if parents[x.Handle] && !limitOnly[o] || x.Dev != d.Name {
					return nil, nil, false, nil
				}
				c, ok, err := k.leafClass(x.Dev, x.Handle)
				if limitOnly[o] {
					c, err = k.conn.Class(x.Dev, x.Handle)
					ok = true
				}
				if err != nil || !ok {
					return nil, nil, false, err
				}
				if c != nil {
					live = c
				}
			case *tc.Qdisc:
				if x.Parent.Minor() == 0 || x.Parent == tc.HandleRoot || x.Parent == tc.HandleIngress {
					return nil, nil, false, nil
				}
				q, err := k.leafQdisc(x.Dev, x.Parent)
				if err != nil {
					return nil, nil, false, err
				}
				if q != nil {
					live = q
				}
			case *bpf.Hook:
				if hookFilter == nil || x != hook {
					return nil, nil, false, nil
				}
				h, err := readHookProgram(x.Dev, x.Ingress, hookFilter)
				if err != nil {
					return nil, nil, false, err
				}
				live = h
			default:
				return nil, nil, false, nil
			}
			if live != nil {
				l.Objects = append(l.Objects, live)
			}
			desired = append(desired, wanted[ti])
		}
		for _, key := range removed {
			kind, rest, _ := strings.Cut(key, "/")
			dev, hs, _ := strings.Cut(rest, "/")
			h, err := tc.ParseHandle(hs)
			if err != nil || dev != d.Name {
				return nil, nil, false, nil
			}
			switch kind {
			case "class":
				c, ok, err := k.leafClass(dev, h)
				if err != nil || !ok {
					return nil, nil, false, err
				}
				if c != nil {
					l.Objects = append(l.Objects, c)
				}
			case "qdisc":
				if h.Minor() == 0 || h == tc.HandleRoot || h == tc.HandleIngress {
					return nil, nil, false, nil
				}
				q, err := k.leafQdisc(dev, h)
				if err != nil {
					return nil, nil, false, err
				}
				if q != nil {
					l.Objects = append(l.Objects, q)
				}
			default:
				return nil, nil, false, nil
			}
		}
	}
	l.deltas, l.deltaPlan = deltas, p
	return l, desired, true, nil
}

// treeIntact checks with a few gets that the tree's HTB qdiscs are the
// ones the record describes: the root (or mq and every shard under it)
// in place, carrying the tree's tag. A root deleted and made again by
// someone else, or a shard deleted with its thousands of classes, fails
// it; the full read then sees what happened.
func (k *Kernel) treeIntact(d *plan.Device, rec *records.Tree) bool {
	r2q := rec.R2Q()
	root, err := k.conn.QdiscAt(d.Name, tc.HandleRoot)
	if err != nil || root == nil || root.Handle.String() != rec.Root {
		return false
	}
	switch root.Kind {
	case "htb", "fq":
		return carriesTag(root, r2q)
	case "mq", "mqprio":
		shards := 0
		for _, o := range d.Objects {
			q, ok := o.(*tc.Qdisc)
			if !ok || q.Kind != "htb" && q.Kind != "fq" || q.Parent == tc.HandleRoot || q.Parent.Major() != root.Handle.Major() {
				continue
			}
			live, err := k.conn.QdiscAt(d.Name, q.Parent)
			if err != nil || live == nil || live.Handle != q.Handle || live.Kind != q.Kind || !carriesTag(live, r2q) {
				return false
			}
			shards++
		}
		return shards > 0
	}
	return false
}

// fpDelta is how a tree's fingerprints change with the plan ReadTouched
// was given: Record applies it to the recorded ones rather than
// fingerprinting the whole plan again.
type fpDelta struct {
	set map[string]uint64
	del []string
}

// keyedFingerprints returns each object's key and fingerprint, computed
// on two goroutines: with 10,000 hosts this is most of what a
// one-subscriber change does on its own.
func keyedFingerprints(objs []tc.Object) ([]string, []uint64) {
	keys, fps := make([]string, len(objs)), make([]uint64, len(objs))
	fill := func(from, to int) {
		for i := from; i < to; i++ {
			keys[i], fps[i] = objs[i].Key(), fingerprintOf(objs[i])
		}
	}
	half := len(objs) / 2
	var wg sync.WaitGroup
	wg.Go(func() { fill(0, half) })
	fill(half, len(objs))
	wg.Wait()
	return keys, fps
}

// leafClass reads class h; ok is false when it has children (not a
// leaf: the fast path does not handle it).
func (k *Kernel) leafClass(dev string, h tc.Handle) (c *tc.Class, ok bool, err error) {
	c, err = k.conn.Class(dev, h)
	if err != nil {
		return nil, false, err
	}
	if c != nil && c.Level > 0 {
		return nil, false, nil
	}
	return c, true, nil
}

// leafQdisc reads the leaf qdisc sluice put under class parent, or nil
// if the class has only HTB's own pfifo (or is gone).
func (k *Kernel) leafQdisc(dev string, parent tc.Handle) (*tc.Qdisc, error) {
	q, err := k.conn.QdiscAt(dev, parent)
	if err != nil || q == nil || q.Handle == 0 || q.Handle.Major() >= 0x8000 {
		return nil, err
	}
	return q, nil
}
