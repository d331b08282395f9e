package kernel

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	// Notes say what the records check set aside (stale records), for
	// the caller to print.
	Notes []string
	netns tc.NetnsID
	lock  *Lock
	// deltas hold, per tree, how deltaPlan's fingerprints differ from
	// the recorded ones, when ReadTouched worked them out; Record uses
	// them for that plan only.
	deltas    map[string]*fpDelta
	deltaPlan *plan.Plan
	// loads are classifiers Apply loads while the tree is written.
	loads map[*bpf.Hook]*preload
}

// Open connects to network namespace ns ("" for the current one) and
// loads sluice's records for it. A namespace that cannot be opened is a
// *NetnsError; records that cannot be read a *RecordsError.
func Open(ns string) (*Kernel, error) {
	if ns != "" {
		if err := ValidNetnsName(ns); err != nil {
			return nil, &NetnsError{ns, err}
		}
	}
	c, err := tc.Open(ns)
	if err != nil {
		return nil, &NetnsError{ns, err}
	}
	k := &Kernel{Conn: c, NS: ns, StateDir: StateDir(ns)}
	if k.netns, err = c.NetnsID(); err != nil {
		c.Close()
		return nil, err
	}
	if k.State, err = LoadState(k.StateDir); err != nil {
		c.Close()
		return nil, err
	}
	k.checkRecords()
	installFaults(k)
	return k, nil
}

// NetnsError is a network namespace that cannot be used (bad input).
type NetnsError struct {
	Name string
	Err  error
}

func (e *NetnsError) Error() string {
	if strings.Contains(e.Err.Error(), e.Name) || e.Name == "" {
		return e.Err.Error()
	}
	return fmt.Sprintf("network namespace %q: %v", e.Name, e.Err)
}

func (e *NetnsError) Unwrap() error { return e.Err }

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
		k.lock = nil
		return err
	}
	k.State = s
	k.Notes = nil
	k.checkRecords()
	return nil
}

// checkRecords sets aside records that do not describe what is there
// now: all of them when they were written for another network namespace
// (the named one was deleted and made again), a tree's when a device of
// its name has another index (deleted and made again). Such records
// would claim objects sluice never created. They are dropped here and
// from the file at the next write.
func (k *Kernel) checkRecords() {
	s := k.State
	if s.Netns != nil && !sameNetns(*s.Netns, k.netns) {
		k.Notes = append(k.Notes, fmt.Sprintf("records in %s were written for another network namespace of this name (deleted since): ignored", k.StateDir))
		fresh := emptyState()
		fresh.stamp, fresh.raw = s.stamp, s.raw
		k.State = fresh
		return
	}
	for _, name := range s.Names() {
		d := s.Devices[name]
		dev := d.device(name)
		if d.Ifindex != 0 {
			if l := k.Conn.GetLink(dev); l != nil && l.Index != d.Ifindex {
				k.Notes = append(k.Notes, fmt.Sprintf("records of %s describe a device %s that was deleted since (index %d, now %d): ignored", name, dev, d.Ifindex, l.Index))
				delete(s.Devices, name)
				continue
			}
		}
		if d.IfaceIndex != 0 && d.Interface != dev {
			if l := k.Conn.GetLink(d.Interface); l != nil && l.Index != d.IfaceIndex {
				k.Notes = append(k.Notes, fmt.Sprintf("records of %s: interface %s was deleted and made again since: its hook is not sluice's", name, d.Interface))
				d.HookCreated = false
			}
		}
	}
}

func sameNetns(a, b tc.NetnsID) bool {
	if a.Cookie != 0 && b.Cookie != 0 {
		return a.Cookie == b.Cookie
	}
	return a.Inode == b.Inode
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
			if err := k.readBPF(l, r.dev, qs, r.dir == policy.Ingress); err != nil {
				return nil, err
			}
			continue
		}
		qs, err := k.readTree(l, r, force)
		if err != nil {
			return nil, err
		}
		if err := k.readBPF(l, r.dev, qs, false); err != nil {
			return nil, err
		}
		if r.ifb {
			if err := k.readHook(l, r); err != nil {
				return nil, err
			}
		}
	}
	// A clsact two trees use (an ingress redirect and a BPF
	// classifier on one interface) was read twice.
	seen := make(map[string]bool, len(l.Objects))
	out := l.Objects[:0]
	for _, o := range l.Objects {
		if q, ok := o.(*tc.Qdisc); ok {
			key := q.Key()
			if seen[key] {
				continue
			}
			seen[key] = true
		}
		out = append(out, o)
	}
	l.Objects = out
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
	owned := r.rec != nil && r.rec.Root == root.Handle.String() && tagged(qs, root, r.rec.R2Q())
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

// tagged reports whether root (of a device whose qdiscs are qs) is the
// root of a tree that carries r2q: an HTB with it, or an mq whose HTB
// shards all carry it. Anything else, whatever its handle, was made by
// someone else.
func tagged(qs []*tc.Qdisc, root *tc.Qdisc, r2q uint32) bool {
	switch root.Kind {
	case "htb":
		return root.HTB != nil && root.HTB.R2Q == r2q
	case "mq":
		shards := TreeQdiscs(qs)
		for _, q := range shards {
			if q.HTB == nil || q.HTB.R2Q != r2q {
				return false
			}
		}
		return len(shards) > 0
	}
	return false
}

// clsactOwned reports whether a record says sluice created the clsact
// qdisc on dev: as the ingress hook of an ifb tree, for a BPF
// classifier, or for a policer. Ownership belongs to the qdisc, not to
// one record: two trees may use one clsact.
func (k *Kernel) clsactOwned(dev string) bool {
	for name, r := range k.State.Devices {
		if r.HookCreated && r.Interface == dev || r.ClsactCreated && r.device(name) == dev {
			return true
		}
	}
	return false
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
	if !k.clsactOwned(r.iface) {
		l.Opt.Shared[hook.Key()] = true
		l.HookShared[r.iface] = true
	}
	fs, err := k.Conn.Filters(r.iface, tc.HandleIngressHook)
	if err != nil {
		return err
	}
	// sluice's redirect is node 1 of the u32 instance at HookPrio (or,
	// left by an earlier sluice, at LegacyHookPrio), pointing at this
	// tree's ifb. Another tool's filter at the same prio shares the
	// instance: it is left alone, and so is the instance, which
	// deleting would take the other filter with it.
	for _, prio := range []uint16{plan.HookPrio, plan.LegacyHookPrio} {
		var mine []*tc.Filter
		var tp *tc.Filter
		foreign := false
		for _, f := range fs {
			switch {
			case f.Prio != prio:
			case f.IsTP():
				tp = f
			case f.Kind == "u32" && f.U32 != nil && f.Handle == 1 && f.U32.RedirectDev == r.dev:
				mine = append(mine, f)
			default:
				foreign = true
			}
		}
		if tp == nil || len(mine) == 0 && prio == plan.LegacyHookPrio {
			continue // nothing, or someone else's at tc's default prio
		}
		if len(mine) == 0 && foreign && (tp.Kind != "u32" || tp.Proto != tc.ProtoAll) {
			return fmt.Errorf("%s: the ingress hook's prio %d holds another tool's %s filter; sluice puts its redirect to %s there (move that filter to another prio)", r.iface, prio, tp.Kind, r.dev)
		}
		l.Objects = append(l.Objects, tp)
		if foreign {
			l.Opt.Shared[tp.Key()] = true
		}
		for _, f := range mine {
			l.Objects = append(l.Objects, f)
		}
	}
	return nil
}

// readBPF reads sluice's classifier on a hook of dev (and the clsact
// qdisc carrying it, shared unless the record says sluice created it).
func (k *Kernel) readBPF(l *Live, dev string, qs []*tc.Qdisc, ingress bool) error {
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
	// An existing clsact serves the plan whoever made it; only one
	// sluice made may go when no tree needs it.
	l.Objects = append(l.Objects, hook)
	if !k.clsactOwned(dev) {
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
	// Vanished names devices that disappeared during the apply: what
	// sluice had on them went with them, so there was nothing to undo.
	Vanished []string
}

func (e *ApplyError) Error() string {
	s := fmt.Sprintf("step %d (%s) failed: %v", e.Step, e.Op, e.Err)
	if len(e.Vanished) > 0 {
		s += fmt.Sprintf("; device %s disappeared meanwhile, and with it everything on it", strings.Join(e.Vanished, ", "))
	}
	if e.RolledBack {
		return s + "; rolled back, nothing changed"
	}
	return s + fmt.Sprintf("; ROLLBACK FAILED, the kernel is in between: %v (run `sluice apply` again or `sluice reset`)", e.RollbackErr)
}

// RollbackError summarizes the undo steps that failed.
type RollbackError struct {
	Failed int
	First  []error // up to three
}

func (e *RollbackError) Error() string {
	var parts []string
	for _, err := range e.First {
		parts = append(parts, err.Error())
	}
	s := strings.Join(parts, "; ")
	if e.Failed > len(e.First) {
		s += fmt.Sprintf(" (and %d more)", e.Failed-len(e.First))
	}
	return fmt.Sprintf("%d undo step(s) failed: %s", e.Failed, s)
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
		ae.Vanished, ae.RollbackErr = k.rollback(undo)
		ae.RolledBack = ae.RollbackErr == nil
		if dev := c.Obj.Device(); !slices.Contains(ae.Vanished, dev) && !k.Conn.LinkExists(dev) {
			if l, isLink := c.Obj.(*tc.Link); !isLink || c.Verb != tc.Add || l.Name != dev {
				ae.Vanished = append(ae.Vanished, dev)
			}
		}
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

// rollback undoes, in reverse, what an apply did. Undo steps on a
// device that has disappeared are moot (its objects went with it) and
// are skipped; it returns the devices that did.
func (k *Kernel) rollback(undo [][]tc.Op) ([]string, error) {
	hook := k.Conn.BeforeWrite
	k.Conn.BeforeWrite = nil
	defer func() { k.Conn.BeforeWrite = hook }()
	gone := map[string]bool{}
	var vanished []string
	rb := &RollbackError{}
	for i := len(undo) - 1; i >= 0; i-- {
		for _, op := range undo[i] {
			dev := op.Obj.Device()
			if gone[dev] {
				continue
			}
			err := k.do(op)
			if err == nil {
				continue
			}
			if !k.Conn.LinkExists(dev) {
				if _, isLink := op.Obj.(*tc.Link); !isLink || op.Verb != tc.Delete {
					vanished = append(vanished, dev)
				}
				gone[dev] = true
				continue
			}
			rb.Failed++
			if len(rb.First) < 3 {
				rb.First = append(rb.First, err)
			}
		}
	}
	sort.Strings(vanished)
	if rb.Failed > 0 {
		return vanished, rb
	}
	return vanished, nil
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
	// A tree sluice has no record of gets a new tag: its HTB qdiscs are
	// then told apart from anyone else's (plan.Alloc.Tag).
	for _, in := range pol.Interfaces {
		for _, name := range []string{in.Name, policy.IfbName(in)} {
			if _, ok := prev[name]; !ok {
				prev[name] = &plan.Alloc{Tag: NewTag()}
			}
		}
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

// NewTag returns a random tree tag: far above any r2q a person would
// choose, and never tc's default.
func NewTag() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return 0x10000 + binary.LittleEndian.Uint32(b[:])%(0x7fffffff-0x10000)
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

// newRecords computes the records of p's devices once d has been
// applied to the kernel as l read it.
func (k *Kernel) newRecords(p *plan.Plan, d *Diff, l *Live, policyFile string) map[string]*DevState {
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
		if lk := k.Conn.GetLink(dev); lk != nil {
			return lk.Index
		}
		return 0
	}
	now := time.Now().UTC()
	out := make(map[string]*DevState, len(p.Devices))
	for _, dev := range p.Devices {
		old := k.State.Devices[dev.Record()]
		rec := &DevState{Interface: dev.Interface, Dir: dev.Dir, Root: plan.RootHandle.String(),
			Policy: policyFile, AppliedAt: now, Alloc: dev.Alloc, Classes: dev.Classes, PoliceOnly: dev.PoliceOnly,
			Ifindex: index(dev.Name), IfaceIndex: index(dev.Interface)}
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
				rec.ClsactCreated = ownsClsact(h.Dev)
			}
		}
		if dev.Ifb {
			rec.IfbCreated = added[(&tc.Link{Name: dev.Name}).Key()] || old != nil && old.IfbCreated && !l.Adopted[dev.Name]
			rec.HookCreated = ownsClsact(dev.Interface)
		}
		out[dev.Record()] = rec
	}
	k.deltas, k.deltaPlan = nil, nil
	return out
}

// Record updates the ownership records after p was applied with d (or
// found in place: d empty), without a journal.
func (k *Kernel) Record(p *plan.Plan, d *Diff, l *Live, policyFile string) error {
	k.State.Devices = k.newRecords(p, d, l, policyFile)
	k.State.Netns = &k.netns
	return k.State.Save(k.StateDir)
}

// Begin journals the apply of d (planned as p, read as l) before it
// touches the kernel: the records in force become a superset of what
// the apply may leave, whenever it stops, and the records it ends with
// (Commit) or started from (Abort) are written, ready to be put in
// place. An error means the records cannot be written (a full disk, a
// planted file): the kernel must not be touched.
func (k *Kernel) Begin(p *plan.Plan, d *Diff, l *Live, policyFile string) (*Txn, error) {
	final := k.newRecords(p, d, l, policyFile)
	union := &State{Version: recordsVersion, Netns: &k.netns, Devices: make(map[string]*DevState, len(final))}
	var names []string
	for name, rec := range final {
		union.Devices[name] = rec
		names = append(names, name)
	}
	for name, rec := range k.State.Devices {
		if final[name] == nil {
			union.Devices[name] = rec // removed by this apply: ours until it is gone
		}
	}
	tx, err := k.State.Begin(k.StateDir, union, names, &Journal{PID: os.Getpid(), Started: time.Now().UTC(), Policy: policyFile})
	if err != nil {
		return nil, err
	}
	k.State.Journal = &Journal{}
	faultPoint("after-journal")
	return &Txn{k: k, tx: tx, final: final}, nil
}

// Txn is a journaled apply (Kernel.Begin).
type Txn struct {
	k     *Kernel
	tx    *Tx
	final map[string]*DevState
}

// Commit makes the records say what the finished apply left. It is a
// rename of a file Begin wrote; should it fail, the journal stays in
// force, and it too claims everything the apply made.
func (t *Txn) Commit() error {
	faultPoint("before-commit")
	k := t.k
	if err := t.tx.Commit(k.State, t.final); err != nil {
		return err
	}
	// Devices the apply created have their indexes only now; writing
	// them is best effort (0 reads as "not known").
	learned := false
	for name, rec := range t.final {
		if l := k.Conn.GetLink(rec.device(name)); l != nil && rec.Ifindex == 0 {
			rec.Ifindex, learned = l.Index, true
		}
		if l := k.Conn.GetLink(rec.Interface); l != nil && rec.IfaceIndex == 0 {
			rec.IfaceIndex, learned = l.Index, true
		}
	}
	if learned {
		k.State.Save(k.StateDir)
	}
	return nil
}

// Abort puts back the records the apply started from, after a rollback
// that restored the kernel.
func (t *Txn) Abort() error {
	if err := t.tx.Abort(); err != nil {
		return err
	}
	s, err := LoadState(t.k.StateDir)
	if err != nil {
		return err
	}
	t.k.State = s
	t.k.checkRecords()
	return nil
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
	// A clsact a tree that stays uses stays too.
	for name, r := range k.State.Devices {
		if only[name] {
			continue
		}
		for _, dev := range []string{r.device(name), r.Interface} {
			if r.usesClsact(name, dev) {
				l.Opt.Shared[qdiscKey(dev, tc.HandleIngress)] = true
			}
		}
	}
	return Compute(l.Objects, nil, l.Opt), names, nil
}

// Forget drops the records of the named tree devices. A clsact they
// say sluice made and a remaining tree still uses stays sluice's: the
// remaining tree's record takes the claim over.
func (k *Kernel) Forget(names []string) error {
	gone := map[string]bool{}
	for _, n := range names {
		gone[n] = true
	}
	owned := map[string]bool{}
	for _, n := range names {
		r := k.State.Devices[n]
		if r.HookCreated {
			owned[r.Interface] = true
		}
		if r.ClsactCreated {
			owned[r.device(n)] = true
		}
	}
	for name, r := range k.State.Devices {
		if gone[name] {
			continue
		}
		for dev := range owned {
			if r.usesClsact(name, dev) {
				if r.IsIfb() && r.Interface == dev {
					r.HookCreated = true
				} else {
					r.ClsactCreated = true
				}
			}
		}
	}
	for _, n := range names {
		delete(k.State.Devices, n)
	}
	k.State.Netns = &k.netns
	return k.State.Save(k.StateDir)
}

// usesClsact reports whether the tree recorded as name has an object
// on dev's clsact (its BPF classifier, a policer, its ingress redirect).
func (d *DevState) usesClsact(name, dev string) bool {
	if d.IsIfb() && d.Interface == dev {
		return true
	}
	if d.device(name) != dev {
		return false
	}
	_, ok := d.Objects[qdiscKey(dev, tc.HandleIngress)]
	return ok || d.PoliceOnly
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
		if (f.Prio == plan.HookPrio || f.Prio == plan.LegacyHookPrio) && f.Kind == "bpf" && f.BPF != nil && bpf.IsOurs(f.BPF.Name) {
			return f
		}
	}
	return nil
}
