package kernel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"sluice/bpf"
	"sluice/plan"
	"sluice/policy"
	"sluice/tc"
)

// Kernel is sluice's view of one network namespace.
type Kernel struct {
	Conn     *tc.Conn
	NS       string
	StateDir string
	State    *State
	lock     *Lock
	// deltas hold, per tree, how deltaPlan's fingerprints differ from
	// the recorded ones, when ReadTouched worked them out; Record uses
	// them for that plan only.
	deltas    map[string]*fpDelta
	deltaPlan *plan.Plan
	// loads are classifiers Apply loads while the tree is written.
	loads map[*bpf.Hook]*preload
}

// Open connects to network namespace ns ("" for the current one) and
// loads sluice's records for it.
func Open(ns string) (*Kernel, error) {
	c, err := tc.Open(ns)
	if err != nil {
		return nil, err
	}
	k := &Kernel{Conn: c, NS: ns, StateDir: StateDir(ns)}
	if k.State, err = LoadState(k.StateDir); err != nil {
		c.Close()
		return nil, err
	}
	return k, nil
}

// Lock takes the namespace's lock (waiting up to timeout) and reloads
// the records, which another sluice may have changed meanwhile.
func (k *Kernel) Lock(timeout time.Duration) error {
	l, err := AcquireLock(k.StateDir, timeout)
	if err != nil {
		return err
	}
	k.lock = l
	if k.State != nil && k.State.Unchanged(k.StateDir) {
		return nil // read moments ago; with 10,000 hosts a read costs 50 ms
	}
	s, err := LoadState(k.StateDir)
	if err != nil {
		l.Release()
		return err
	}
	k.State = s
	return nil
}

// Close releases the lock and the connection.
func (k *Kernel) Close() {
	k.lock.Release()
	k.Conn.Close()
}

// ForeignRootError reports a root qdisc sluice did not create.
type ForeignRootError struct {
	Dev  string
	Kind string
	At   tc.Handle
}

func (e *ForeignRootError) Error() string {
	return fmt.Sprintf("%s has a root qdisc %s %s that sluice did not create; sluice will not replace it without --force", e.Dev, e.Kind, e.At)
}

// treeRef is a device whose tree sluice plans or remembers.
type treeRef struct {
	dev, iface string
	ifb        bool
	police     bool // a policer without a tree, on iface's hook in dir
	dir        string
	planned    bool
	rec        *DevState
}

func (k *Kernel) refs(p *plan.Plan, only map[string]bool) []treeRef {
	var out []treeRef
	seen := map[string]bool{}
	if p != nil {
		for _, d := range p.Devices {
			seen[d.Record()] = true
			out = append(out, treeRef{dev: d.Name, iface: d.Interface, ifb: d.Ifb, police: d.PoliceOnly, dir: d.Dir,
				planned: true, rec: k.State.Devices[d.Record()]})
		}
	}
	for _, name := range k.State.Names() {
		if seen[name] || only != nil && !only[name] {
			continue
		}
		r := k.State.Devices[name]
		dev := name
		if r.PoliceOnly {
			dev = r.Interface
		}
		out = append(out, treeRef{dev: dev, iface: r.Interface, ifb: r.IsIfb(), police: r.PoliceOnly, dir: r.Dir, rec: r})
	}
	return out
}

// Live is the part of the kernel sluice manages, as read now.
type Live struct {
	Objects []tc.Object
	Opt     Options
	// Adopted names ifb devices that existed before sluice used them.
	Adopted map[string]bool
	// HookShared names interfaces whose ingress qdisc sluice did not create.
	HookShared map[string]bool
}

// ReadLive reads the objects of every tree p plans or the records name
// (restricted to only, when non-nil). force allows taking over foreign
// root qdiscs on planned devices.
func (k *Kernel) ReadLive(p *plan.Plan, only map[string]bool, force bool) (*Live, error) {
	defer k.Conn.Pin()()
	l := &Live{Opt: Options{Replace: map[string]bool{}, Shared: map[string]bool{}},
		Adopted: map[string]bool{}, HookShared: map[string]bool{}}
	for _, r := range k.refs(p, only) {
		if r.police {
			if !k.Conn.LinkExists(r.dev) {
				continue
			}
			qs, err := k.Conn.Qdiscs(r.dev)
			if err != nil {
				return nil, err
			}
			if err := k.readBPF(l, r.dev, qs, r.dir == policy.Ingress, r.rec); err != nil {
				return nil, err
			}
			continue
		}
		qs, err := k.readTree(l, r, force)
		if err != nil {
			return nil, err
		}
		if err := k.readBPF(l, r.dev, qs, false, r.rec); err != nil {
			return nil, err
		}
		if r.ifb {
			if err := k.readHook(l, r); err != nil {
				return nil, err
			}
		}
	}
	return l, nil
}

// readTree reads the tree on r's device and returns the device's qdiscs
// (nil when the device is missing), which readBPF reads on.
func (k *Kernel) readTree(l *Live, r treeRef, force bool) ([]*tc.Qdisc, error) {
	if r.ifb {
		link := k.Conn.GetLink(r.dev)
		if link == nil {
			return nil, nil
		}
		if link.Kind != "ifb" {
			return nil, fmt.Errorf("device %s exists and is a %s, not an ifb; set ingress.ifb to another name", r.dev, link.Kind)
		}
		link.Kind = "ifb"
		l.Objects = append(l.Objects, link)
		if r.rec == nil || !r.rec.IfbCreated {
			l.Opt.Shared[link.Key()] = true
			l.Adopted[r.dev] = true
		}
	} else if !k.Conn.LinkExists(r.dev) {
		return nil, nil
	}
	qs, err := k.Conn.Qdiscs(r.dev)
	if err != nil {
		return nil, err
	}
	var root *tc.Qdisc
	for _, q := range qs {
		if q.Parent == tc.HandleRoot && q.Handle != 0 {
			root = q
		}
	}
	if root == nil {
		return qs, nil // the kernel's default qdisc: nothing of ours
	}
	owned := r.rec != nil && r.rec.Root == root.Handle.String() && (root.Kind == "htb" || root.Kind == "mq")
	if !owned {
		switch {
		case !r.planned:
			return qs, nil // a stale record: the tree is gone, someone else's now
		case !force:
			return nil, &ForeignRootError{Dev: r.dev, Kind: root.Kind, At: root.Handle}
		}
		l.Objects = append(l.Objects, root)
		l.Opt.Replace[root.Key()] = true
		return qs, nil
	}
	l.Objects = append(l.Objects, root)
	var blocks []tc.Handle
	isClass := map[tc.Handle]bool{}
	for _, h := range TreeQdiscs(qs) {
		if h != root {
			l.Objects = append(l.Objects, h) // a shard
		}
		classes, err := k.Conn.Classes(r.dev, h.Handle)
		if err != nil {
			return nil, err
		}
		blocks = append(blocks, h.Handle)
		for _, c := range classes {
			l.Objects = append(l.Objects, c)
			isClass[c.Handle] = true
			if c.Level > 0 {
				blocks = append(blocks, c.Handle)
			}
		}
	}
	for _, q := range qs {
		// Leaves sluice made; HTB's own default pfifos have automatic
		// handles (majors from 0x8000) and count as "no leaf".
		if isClass[q.Parent] && q.Handle.Major() < 0x8000 {
			l.Objects = append(l.Objects, q)
		}
	}
	for _, b := range blocks {
		fs, err := k.Conn.Filters(r.dev, b)
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			l.Objects = append(l.Objects, f)
		}
	}
	return qs, nil
}

// TreeQdiscs returns the HTB qdiscs of the tree in a device's qdiscs
// qs: the root, or, for a tree sharded under mq, the HTB on each of
// mq's queues.
func TreeQdiscs(qs []*tc.Qdisc) []*tc.Qdisc {
	var root *tc.Qdisc
	for _, q := range qs {
		if q.Parent == tc.HandleRoot && q.Handle != 0 {
			root = q
		}
	}
	switch {
	case root == nil:
		return nil
	case root.Kind != "mq":
		return []*tc.Qdisc{root}
	}
	var out []*tc.Qdisc
	for _, q := range qs {
		if q.Kind == "htb" && q.Parent != tc.HandleRoot && q.Parent.Major() == root.Handle.Major() {
			out = append(out, q)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Parent < out[j].Parent })
	return out
}

func (k *Kernel) readHook(l *Live, r treeRef) error {
	if !k.Conn.LinkExists(r.iface) {
		return nil
	}
	qs, err := k.Conn.Qdiscs(r.iface)
	if err != nil {
		return err
	}
	var hook *tc.Qdisc
	for _, q := range qs {
		if q.Parent == tc.HandleIngress {
			hook = q
		}
	}
	if hook == nil {
		return nil
	}
	l.Objects = append(l.Objects, hook)
	if r.rec == nil || !r.rec.HookCreated {
		l.Opt.Shared[hook.Key()] = true
		l.HookShared[r.iface] = true
	}
	fs, err := k.Conn.Filters(r.iface, tc.HandleIngressHook)
	if err != nil {
		return err
	}
	for _, f := range fs {
		if f.Prio == plan.HookPrio {
			l.Objects = append(l.Objects, f)
		}
	}
	return nil
}

// readBPF reads sluice's classifier on a hook of dev (and the clsact
// qdisc carrying it, shared unless the record says sluice created it).
func (k *Kernel) readBPF(l *Live, dev string, qs []*tc.Qdisc, ingress bool, rec *DevState) error {
	var hook *tc.Qdisc
	for _, q := range qs {
		if q.Parent == tc.HandleIngress && q.Kind == "clsact" {
			hook = q
		}
	}
	if hook == nil {
		return nil
	}
	parent := tc.HandleEgressHook
	if ingress {
		parent = tc.HandleIngressHook
	}
	fs, err := k.Conn.Filters(dev, parent)
	if err != nil {
		return err
	}
	found := ourFilter(fs)
	if found == nil && (rec == nil || !rec.ClsactCreated) {
		return nil // nothing of ours on this hook
	}
	l.Objects = append(l.Objects, hook)
	if rec == nil || !rec.ClsactCreated {
		l.Opt.Shared[hook.Key()] = true
	}
	if found == nil {
		return nil
	}
	h, err := readHookProgram(dev, ingress, found)
	if err != nil {
		return err
	}
	l.Objects = append(l.Objects, h)
	return nil
}

func readHookProgram(dev string, ingress bool, f *tc.Filter) (*bpf.Hook, error) {
	h := &bpf.Hook{Dev: dev, Ingress: ingress, Prio: f.Prio, ProgID: f.BPF.ID,
		Version: strings.TrimPrefix(f.BPF.Name, bpf.NamePrefix)}
	prog, err := bpf.Open(f.BPF.ID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dev, err)
	}
	defer prog.Close()
	h.Capacity = prog.CounterCap
	if h.Content, err = prog.Read(); err != nil {
		return nil, fmt.Errorf("%s: %w", dev, err)
	}
	return h, nil
}

// Result reports what an apply did.
type Result struct {
	Changes int
	Writes  int
}

// ApplyError is a failed apply; RolledBack says whether the starting
// state was restored.
type ApplyError struct {
	Err         error
	Step        int
	Op          string
	RolledBack  bool
	RollbackErr error
}

func (e *ApplyError) Error() string {
	s := fmt.Sprintf("step %d (%s) failed: %v", e.Step, e.Op, e.Err)
	if e.RolledBack {
		return s + "; rolled back, nothing changed"
	}
	return s + fmt.Sprintf("; ROLLBACK FAILED, the kernel is in between: %v (run `sluice apply` again or `sluice reset`)", e.RollbackErr)
}

func (e *ApplyError) Unwrap() error { return e.Err }

// Apply carries out d. When a step fails it undoes the steps before it,
// in reverse, and returns an *ApplyError.
//
// Runs of qdisc, class and filter changes go to the kernel many to a
// send (tc.Conn.Hold). The kernel carries on after a failed message, so
// a failure can leave later changes of its send applied: every change
// the kernel accepted is undone, before and after the failed one.
func (k *Kernel) Apply(d *Diff) (*Result, error) {
	defer k.Conn.Pin()()
	start := k.Conn.Writes()
	var (
		undo [][]tc.Op
		// Changes whose writes are held, with their undo and how many
		// writes each made (0: nothing to send, done).
		pending []pendingChange
	)
	k.preloadHooks(d)
	defer k.dropPreloads()
	k.Conn.Hold()
	defer k.Conn.Release()
	fail := func(step int, err error) error {
		c := d.Changes[step]
		ae := &ApplyError{Err: err, Step: step + 1, Op: c.Verb.String() + " " + c.Obj.Describe()}
		k.Conn.Release()
		ae.RollbackErr = k.rollback(undo)
		ae.RolledBack = ae.RollbackErr == nil
		return ae
	}
	// flush sends what is held and files each change's undo, or fails
	// at the first change the kernel refused.
	flush := func() error {
		errs := k.Conn.Flush()
		first, firstErr := -1, error(nil)
		for _, p := range pending {
			var err error
			if p.writes > 0 {
				err, errs = errs[0], errs[1:]
			}
			if err != nil {
				if first < 0 {
					first, firstErr = p.step, err
				}
				continue
			}
			undo = append(undo, p.undo)
		}
		pending = pending[:0]
		if first >= 0 {
			return fail(first, firstErr)
		}
		return nil
	}
	for i, c := range d.Changes {
		if !holdable(c) {
			if err := flush(); err != nil {
				return nil, err
			}
			k.Conn.Release()
			u, err := k.exec(c)
			if err != nil {
				return nil, fail(i, err)
			}
			undo = append(undo, u)
			k.Conn.Hold()
			continue
		}
		before := k.Conn.Held()
		u, err := k.exec(c)
		if err != nil {
			// Refused before reaching the kernel (encoding, an
			// injected fault): what is held goes first, so that it
			// is undone too.
			if ferr := flush(); ferr != nil {
				return nil, ferr
			}
			return nil, fail(i, err)
		}
		pending = append(pending, pendingChange{step: i, undo: u, writes: k.Conn.Held() - before})
		if k.Conn.Held() >= tc.MaxSend {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return &Result{Changes: len(d.Changes), Writes: k.Conn.Writes() - start}, nil
}

type pendingChange struct {
	step   int
	undo   []tc.Op
	writes int
}

// holdable reports whether c is one netlink write (or none) that may
// wait in a send: links and BPF programs go at once.
func holdable(c Change) bool {
	switch c.Obj.(type) {
	case *tc.Qdisc, *tc.Class, *tc.Filter:
		return true
	}
	return false
}

func (k *Kernel) rollback(undo [][]tc.Op) error {
	hook := k.Conn.BeforeWrite
	k.Conn.BeforeWrite = nil
	defer func() { k.Conn.BeforeWrite = hook }()
	var errs []error
	for i := len(undo) - 1; i >= 0; i-- {
		for _, op := range undo[i] {
			if err := k.do(op); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// exec performs one change and returns the operations that undo it.
func (k *Kernel) exec(c Change) ([]tc.Op, error) {
	if h, ok := c.Obj.(*bpf.Hook); ok && c.Verb == tc.Change {
		// Write only what differs; undo writes the old content back.
		old := c.Old.(*bpf.Hook)
		if err := k.syncHook(old.ProgID, h.Content, old.Content); err != nil {
			return nil, err
		}
		back := *old
		back.Base = h.Content
		return []tc.Op{{Verb: tc.Change, Obj: &back}}, nil
	}
	if err := k.do(c.Op); err != nil {
		return nil, err
	}
	switch c.Verb {
	case tc.Add:
		return []tc.Op{{Verb: tc.Delete, Obj: c.Obj}}, nil
	case tc.Change:
		return []tc.Op{{Verb: tc.Change, Obj: c.Old}}, nil
	}
	// Delete: re-create the object and what the kernel took with it.
	u := []tc.Op{{Verb: tc.Add, Obj: c.Old}}
	for _, o := range c.Implied {
		u = append(u, tc.Op{Verb: tc.Add, Obj: o})
	}
	return u, nil
}

// do performs one operation.
func (k *Kernel) do(op tc.Op) error {
	c := k.Conn
	switch o := op.Obj.(type) {
	case *tc.Link:
		switch op.Verb {
		case tc.Add:
			return c.LinkAdd(o)
		case tc.Change:
			return c.LinkUp(o.Name)
		}
		return c.LinkDel(o.Name)
	case *tc.Qdisc:
		switch op.Verb {
		case tc.Add:
			return c.QdiscAdd(o, o.Parent != tc.HandleRoot && o.Parent != tc.HandleIngress || op.Force)
		case tc.Change:
			return c.QdiscChange(o)
		}
		return c.QdiscDel(o)
	case *tc.Class:
		switch op.Verb {
		case tc.Add:
			return c.ClassAdd(o)
		case tc.Change:
			return c.ClassChange(o)
		}
		return c.ClassDel(o)
	case *tc.Filter:
		if op.Verb == tc.Add {
			if o.IsTP() {
				return nil // created with its first table or node
			}
			return c.FilterAdd(o)
		}
		return c.FilterDel(o)
	case *bpf.Hook:
		switch op.Verb {
		case tc.Add:
			return k.attachHook(o)
		case tc.Change:
			return k.syncHook(o.ProgID, o.Content, o.Base)
		}
		return c.FilterDel(hookFilter(o))
	}
	return fmt.Errorf("cannot %s %s", op.Verb, op.Obj.Describe())
}

func hookFilter(h *bpf.Hook) *tc.Filter {
	parent := tc.HandleEgressHook
	if h.Ingress {
		parent = tc.HandleIngressHook
	}
	return &tc.Filter{Dev: h.Dev, Parent: parent, Prio: h.Prio, Proto: tc.ProtoAll, Kind: "bpf"}
}

// attachHook loads the classifier, fills its maps, and only then
// attaches it, so that no packet sees it half-filled.
func (k *Kernel) attachHook(h *bpf.Hook) error {
	if err := k.Conn.CountWrite("load bpf classifier for " + h.Dev); err != nil {
		return err
	}
	var prog *bpf.Program
	var err error
	if p := k.loads[h]; p != nil {
		delete(k.loads, h)
		<-p.done
		prog, err = p.prog, p.err
	} else {
		prog, err = bpf.Load(h.Content)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", h.Dev, err)
	}
	defer prog.Close() // the filter keeps its own reference
	f := hookFilter(h)
	f.Handle = 1
	f.BPF = &tc.BPF{FD: prog.FD(), Name: bpf.FilterName(), DA: true}
	return k.Conn.FilterAdd(f)
}

// A preload is a classifier loaded and filled in the background.
type preload struct {
	done chan struct{}
	prog *bpf.Program
	err  error
}

// preloadHooks starts loading the classifiers d attaches: verifying
// the program and filling the maps of 10,000 hosts takes as long as
// writing a few thousand classes, and needs no lock the writes take.
func (k *Kernel) preloadHooks(d *Diff) {
	for _, c := range d.Changes {
		h, ok := c.Obj.(*bpf.Hook)
		if !ok || c.Verb != tc.Add {
			continue
		}
		p := &preload{done: make(chan struct{})}
		if k.loads == nil {
			k.loads = map[*bpf.Hook]*preload{}
		}
		k.loads[h] = p
		go func() {
			defer close(p.done)
			p.prog, p.err = bpf.Load(h.Content)
		}()
	}
}

// dropPreloads closes the classifiers an apply loaded but did not
// attach (it failed before).
func (k *Kernel) dropPreloads() {
	for h, p := range k.loads {
		<-p.done
		if p.prog != nil {
			p.prog.Close()
		}
		delete(k.loads, h)
	}
}

// syncHook makes the live classifier with program id (from the
// readback) hold want, writing only what differs from base (nil:
// everything).
func (k *Kernel) syncHook(id uint32, want, base *bpf.Content) error {
	if err := k.Conn.CountWrite("update bpf classifier maps"); err != nil {
		return err
	}
	prog, err := bpf.Open(id)
	if err != nil {
		return err
	}
	defer prog.Close()
	return prog.Write(want, base)
}

// CheckInterfaces reports every policy interface missing from the
// namespace, located in the policy file.
func (k *Kernel) CheckInterfaces(pol *policy.Policy) error {
	d := &policy.Diag{File: pol.File}
	for _, in := range pol.Interfaces {
		if !k.Conn.LinkExists(in.Name) {
			where := "this network namespace"
			if k.NS != "" {
				where = "network namespace " + k.NS
			}
			d.Errorf(in.NamePos, "interface %s does not exist in %s", in.Name, where)
		}
	}
	return d.Err()
}

// Plan builds the plan for pol against this kernel's features and the
// ids recorded for its devices.
func (k *Kernel) Plan(pol *policy.Policy, feats plan.Features) (*plan.Plan, error) {
	prev := map[string]*plan.Alloc{}
	for name, d := range k.State.Devices {
		prev[name] = d.Alloc
	}
	feats.RawIP, feats.TxQueues, feats.XPS = map[string]bool{}, map[string]int{}, map[string]bool{}
	for _, in := range pol.Interfaces {
		l := k.Conn.GetLink(in.Name)
		if l == nil {
			continue
		}
		feats.RawIP[in.Name] = l.RawIP
		// Only queues the driver says it uses get shards.
		if n, ok := k.Conn.TxQueuesInUse(in.Name); ok {
			feats.TxQueues[in.Name] = min(n, l.TxQueues)
		}
		if k.NS == "" { // sysfs shows this namespace's devices only
			if _, xps, ok := sysQueues(in.Name); ok {
				feats.XPS[in.Name] = xps
			}
		}
	}
	return plan.Build(pol, feats, prev)
}

// sysQueues reads from sysfs how many transmit queues dev uses and
// whether any of them has XPS configured.
func sysQueues(dev string) (n int, xps, ok bool) {
	qs, err := filepath.Glob(filepath.Join("/sys/class/net", dev, "queues", "tx-*"))
	if err != nil || len(qs) == 0 {
		return 0, false, false
	}
	for _, q := range qs {
		b, err := os.ReadFile(filepath.Join(q, "xps_cpus"))
		if err == nil && strings.Trim(strings.TrimSpace(string(b)), "0,") != "" {
			xps = true
		}
	}
	return len(qs), xps, true
}

// Record updates the ownership records after p was applied with d.
func (k *Kernel) Record(p *plan.Plan, d *Diff, l *Live, policyFile string) error {
	added := map[string]bool{}
	for _, c := range d.Changes {
		if c.Verb == tc.Add {
			added[c.Obj.Key()] = true
		}
	}
	now := time.Now().UTC()
	keep := map[string]bool{}
	for _, dev := range p.Devices {
		keep[dev.Record()] = true
		old := k.State.Devices[dev.Record()]
		rec := &DevState{Interface: dev.Interface, Dir: dev.Dir, Root: plan.RootHandle.String(),
			Policy: policyFile, AppliedAt: now, Alloc: dev.Alloc, Classes: dev.Classes, PoliceOnly: dev.PoliceOnly}
		if dev.PoliceOnly {
			rec.Root = ""
		}
		if delta := k.deltas[dev.Record()]; k.deltaPlan == p && delta != nil && old != nil {
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
				ck := qdiscKey(h.Dev, tc.HandleIngress)
				rec.ClsactCreated = added[ck] || old != nil && old.ClsactCreated && !l.Opt.Shared[ck]
			}
		}
		if dev.Ifb {
			rec.IfbCreated = added[(&tc.Link{Name: dev.Name}).Key()] || old != nil && old.IfbCreated && !l.Adopted[dev.Name]
			rec.HookCreated = added[qdiscKey(dev.Interface, tc.HandleIngress)] || old != nil && old.HookCreated && !l.HookShared[dev.Interface]
		}
		k.State.Devices[dev.Record()] = rec
	}
	k.deltas, k.deltaPlan = nil, nil
	for name := range k.State.Devices {
		if !keep[name] {
			delete(k.State.Devices, name)
		}
	}
	return k.State.Save(k.StateDir)
}

// ResetPlan computes the diff that removes sluice's trees on the named
// devices (an interface name covers its egress tree and its ifb's
// ingress tree). It returns the tree devices concerned.
func (k *Kernel) ResetPlan(devs []string, all bool) (*Diff, []string, error) {
	only := map[string]bool{}
	var names []string
	for _, name := range k.State.Names() {
		r := k.State.Devices[name]
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
	return Compute(l.Objects, nil, l.Opt), names, nil
}

// Forget drops the records of the named tree devices.
func (k *Kernel) Forget(names []string) error {
	for _, n := range names {
		delete(k.State.Devices, n)
	}
	return k.State.Save(k.StateDir)
}

// OpenHook opens sluice's classifier on dev's hook, or returns nil if
// there is none.
func (k *Kernel) OpenHook(dev string, ingress bool) (*bpf.Program, error) {
	f := hookFilter(&bpf.Hook{Dev: dev, Ingress: ingress, Prio: plan.HookPrio})
	fs, err := k.Conn.Filters(f.Dev, f.Parent)
	if err != nil {
		return nil, err
	}
	if g := ourFilter(fs); g != nil {
		return bpf.Open(g.BPF.ID)
	}
	return nil, nil
}

// ourFilter finds sluice's classifier among a hook's filters.
func ourFilter(fs []*tc.Filter) *tc.Filter {
	for _, f := range fs {
		if f.Prio == plan.HookPrio && f.Kind == "bpf" && f.BPF != nil && bpf.IsOurs(f.BPF.Name) {
			return f
		}
	}
	return nil
}
