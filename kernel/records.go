package kernel

import (
	"os"
	"time"

	"sluice/bpf"
	"sluice/plan"
	"sluice/records"
	"sluice/tc"
)

// Records: what sluice made, written under a journal around each apply
// and dropped by reset.

// newRecords computes the records of p's devices once d has been
// applied to the kernel as l read it.
func (k *Kernel) newRecords(p *plan.Plan, d *Diff, l *Live, policyFile string) map[string]*records.Tree {
	added := map[string]bool{}
	for _, c := range d.Changes {
		if c.Verb == tc.Add {
			added[c.Obj.Key()] = true
		}
	}
	// A clsact is sluice's if this apply adds it, or a record says
	// sluice made it (whichever tree used it then) and the read did
	// not find it to be someone else's.
	ownsClsact := func(dev string) bool {
		ck := qdiscKey(dev, tc.HandleIngress)
		return added[ck] || k.clsactOwned(dev) && !l.Opt.Shared[ck]
	}
	index := func(dev string) int {
		if lk := k.conn.GetLink(dev); lk != nil {
			return lk.Index
		}
		return 0
	}
	now := time.Now().UTC()
	out := make(map[string]*records.Tree, len(p.Devices))
	for _, dev := range p.Devices {
		old := k.recs.Devices[dev.Record()]
		rec := &records.Tree{Interface: dev.Interface, Dir: dev.Dir, Root: plan.RootHandle.String(),
			Policy: policyFile, AppliedAt: now, Alloc: recordAlloc(dev.Alloc), Classes: recordClasses(dev.Classes), PoliceOnly: dev.PoliceOnly, EDT: dev.EDT,
			Ifindex: index(dev.Name), IfaceIndex: index(dev.Interface)}
		if dev.PoliceOnly {
			rec.Root = ""
		}
		if delta := l.deltas[dev.Record()]; l.deltaPlan == p && delta != nil && old != nil {
			rec.Objects = old.Objects // replaced here, so changed in place
			for key, fp := range delta.set {
				rec.Objects[key] = fp
			}
			for _, key := range delta.del {
				delete(rec.Objects, key)
			}
		}
		if rec.Objects == nil {
			rec.Objects = fingerprints(dev.Objects)
		}
		for _, o := range dev.Objects {
			if h, ok := o.(*bpf.Hook); ok {
				rec.ClsactCreated = ownsClsact(h.Dev)
			}
		}
		if dev.Ifb {
			rec.IfbCreated = added[(&tc.Link{Name: dev.Name}).Key()] || old != nil && old.IfbCreated && !l.Adopted[dev.Name]
			rec.HookCreated = ownsClsact(dev.Interface)
		}
		out[dev.Record()] = rec
	}
	return out
}

// record updates the ownership records after p was applied with d (or
// found in place: d empty), without a journal.
func (k *Kernel) record(p *plan.Plan, d *Diff, l *Live, policyFile string) error {
	k.recs.Devices = k.newRecords(p, d, l, policyFile)
	k.recs.Netns = &k.netns
	return k.recs.Save(k.RecordsDir)
}

// begin journals the apply of d (planned as p, read as l) before it
// touches the kernel: the records in force become a superset of what
// the apply may leave, whenever it stops, and the records it ends with
// (Commit) or started from (Abort) are written, ready to be put in
// place. An error means the records cannot be written (a full disk, a
// planted file): the kernel must not be touched.
func (k *Kernel) begin(p *plan.Plan, d *Diff, l *Live, policyFile string) (*txn, error) {
	final := k.newRecords(p, d, l, policyFile)
	union := records.New()
	union.Netns = &k.netns
	var names []string
	for name, rec := range final {
		union.Devices[name] = rec
		names = append(names, name)
	}
	for name, rec := range k.recs.Devices {
		if final[name] == nil {
			union.Devices[name] = rec // removed by this apply: ours until it is gone
		}
	}
	tx, err := k.recs.Begin(k.RecordsDir, union, names, &records.Journal{PID: os.Getpid(), Started: time.Now().UTC(), Policy: policyFile})
	if err != nil {
		return nil, err
	}
	k.recs.Journal = &records.Journal{}
	faultPoint("after-journal")
	return &txn{k: k, tx: tx, final: final}, nil
}

// txn is a journaled apply (begin): the records' Update, and
// what the kernel learns once the apply is done.
type txn struct {
	k     *Kernel
	tx    *records.Update
	final map[string]*records.Tree
}

// Commit makes the records say what the finished apply left. It is a
// rename of a file Begin wrote; should it fail, the journal stays in
// force, and it too claims everything the apply made.
func (t *txn) Commit() error {
	faultPoint("before-commit")
	k := t.k
	if err := t.tx.Commit(k.recs, t.final); err != nil {
		return err
	}
	// Devices the apply created have their indexes only now; writing
	// them is best effort (0 reads as "not known").
	learned := false
	for name, rec := range t.final {
		if l := k.conn.GetLink(rec.Device(name)); l != nil && rec.Ifindex == 0 {
			rec.Ifindex, learned = l.Index, true
		}
		if l := k.conn.GetLink(rec.Interface); l != nil && rec.IfaceIndex == 0 {
			rec.IfaceIndex, learned = l.Index, true
		}
	}
	if learned {
		k.recs.Save(k.RecordsDir)
	}
	return nil
}

// Abort puts back the records the apply started from, after a rollback
// that restored the kernel.
func (t *txn) Abort() error {
	if err := t.tx.Abort(); err != nil {
		return err
	}
	s, err := records.Load(t.k.RecordsDir)
	if err != nil {
		return err
	}
	t.k.recs = s
	t.k.checkRecords()
	return nil
}

// ResetPlan computes the diff that removes sluice's trees on the named
// devices (an interface name covers its egress tree and its ifb's
// ingress tree). It returns the tree devices concerned.
func (k *Kernel) ResetPlan(devs []string, all bool) (*Diff, []string, error) {
	only := map[string]bool{}
	var names []string
	for _, name := range k.recs.Names() {
		r := k.recs.Devices[name]
		match := all
		for _, d := range devs {
			match = match || name == d || r.Interface == d
		}
		if match {
			only[name] = true
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return &Diff{}, nil, nil
	}
	l, err := k.ReadLive(nil, only, false)
	if err != nil {
		return nil, nil, err
	}
	// A clsact a tree that stays uses stays too.
	for name, r := range k.recs.Devices {
		if only[name] {
			continue
		}
		for _, dev := range []string{r.Device(name), r.Interface} {
			if usesClsact(r, name, dev) {
				l.Opt.Shared[qdiscKey(dev, tc.HandleIngress)] = true
			}
		}
	}
	return Compute(l.Objects, nil, l.Opt), names, nil
}

// forget is Executor.Forget.
func (k *Kernel) forget(names []string) error {
	gone := map[string]bool{}
	for _, n := range names {
		gone[n] = true
	}
	owned := map[string]bool{}
	for _, n := range names {
		r := k.recs.Devices[n]
		if r.HookCreated {
			owned[r.Interface] = true
		}
		if r.ClsactCreated {
			owned[r.Device(n)] = true
		}
	}
	for name, r := range k.recs.Devices {
		if gone[name] {
			continue
		}
		for dev := range owned {
			if usesClsact(r, name, dev) {
				if r.IsIfb() && r.Interface == dev {
					r.HookCreated = true
				} else {
					r.ClsactCreated = true
				}
			}
		}
	}
	for _, n := range names {
		delete(k.recs.Devices, n)
	}
	k.recs.Netns = &k.netns
	return k.recs.Save(k.RecordsDir)
}

// usesClsact reports whether the tree recorded as name has an object
// on dev's clsact (its BPF classifier, a policer, its ingress redirect).
func usesClsact(d *records.Tree, name, dev string) bool {
	if d.IsIfb() && d.Interface == dev {
		return true
	}
	if d.Device(name) != dev {
		return false
	}
	_, ok := d.Objects[qdiscKey(dev, tc.HandleIngress)]
	return ok || d.PoliceOnly
}

// The records keep their own types (records.Alloc, records.Class), so
// that the planner's may change without changing the file. While the
// fields are the same, a conversion is free; when they part, these are
// where the mapping goes.

func recordAlloc(a *plan.Alloc) *records.Alloc {
	if a == nil {
		return nil
	}
	r := records.Alloc(*a)
	return &r
}

func planAlloc(a *records.Alloc) *plan.Alloc {
	if a == nil {
		return nil
	}
	p := plan.Alloc(*a)
	return &p
}

func recordClasses(cs []plan.ClassInfo) []records.Class {
	if cs == nil {
		return nil
	}
	out := make([]records.Class, len(cs))
	for i, c := range cs {
		out[i] = records.Class(c)
	}
	return out
}
