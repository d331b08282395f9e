package kernel

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sluice/bpf"
	"sluice/internal/writecap"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
)

// Kernel is sluice's view of one network namespace.
type Kernel struct {
	// conn is the namespace's netlink handle with its writes: private,
	// so that every write goes through the executor (Apply) and every
	// read through this package's methods.
	conn       *tc.Writer
	NS         string
	RecordsDir string
	// recs are the records as read: Records reads them; a session
	// lends a settled pass's to a bare handle (UseRecords).
	recs *records.File
	// Notes say what the records check set aside (stale records), for
	// the caller to print.
	Notes []string
	netns tc.NetnsID
	lock  *records.Lock
	// loads are classifiers Apply loads while the tree is written.
	loads map[*bpf.Hook]*preload
	// bare: opened without the records (OpenBare).
	bare bool
}

// Open connects to network namespace ns ("" for the current one) and
// loads sluice's records for it. A namespace that cannot be opened is a
// *NetnsError; records that cannot be read a *records.Error.
func Open(ns string) (*Kernel, error) {
	if ns != "" {
		if err := records.ValidNetnsName(ns); err != nil {
			return nil, &NetnsError{ns, err}
		}
	}
	c, err := tc.Open(ns)
	if err != nil {
		return nil, &NetnsError{ns, err}
	}
	k := &Kernel{conn: c.Writer(writecap.Token{}), NS: ns, RecordsDir: records.Dir(ns)}
	if k.netns, err = c.NetnsID(); err != nil {
		c.Close()
		return nil, err
	}
	if k.recs, err = records.Load(k.RecordsDir); err != nil {
		c.Close()
		return nil, err
	}
	k.checkRecords()
	installFaults(k)
	return k, nil
}

// OpenBare connects to ns without loading the records, for a patch
// (ApplyPatch) whose changes are checked against what the caller
// planned, not against the records, and that changes none: with
// 100,000 hosts, reading the records would cost more than the patch.
func OpenBare(ns string) (*Kernel, error) {
	if err := records.ValidNetnsName(ns); ns != "" && err != nil {
		return nil, &NetnsError{ns, err}
	}
	c, err := tc.Open(ns)
	if err != nil {
		return nil, &NetnsError{ns, err}
	}
	k := &Kernel{conn: c.Writer(writecap.Token{}), NS: ns, RecordsDir: records.Dir(ns), recs: records.New(), bare: true}
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
	l, err := records.AcquireLock(k.RecordsDir, timeout)
	if err != nil {
		return err
	}
	k.lock = l
	if k.bare || k.recs != nil && k.recs.Unchanged(k.RecordsDir) {
		return nil // read moments ago; with 10,000 hosts a read costs 50 ms
	}
	s, err := records.Load(k.RecordsDir)
	if err != nil {
		l.Release()
		k.lock = nil
		return err
	}
	k.recs = s
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
	s := k.recs
	if s.Netns != nil && !sameNetns(*s.Netns, k.netns) {
		k.Notes = append(k.Notes, fmt.Sprintf("records in %s were written for another network namespace of this name (deleted since): ignored", k.RecordsDir))
		k.recs = s.Emptied()
		return
	}
	for _, name := range s.Names() {
		d := s.Devices[name]
		dev := d.Device(name)
		if d.Ifindex != 0 {
			if l := k.conn.GetLink(dev); l != nil && l.Index != d.Ifindex {
				k.Notes = append(k.Notes, fmt.Sprintf("records of %s describe a device %s that was deleted since (index %d, now %d): ignored", name, dev, d.Ifindex, l.Index))
				delete(s.Devices, name)
				continue
			}
		}
		if d.IfaceIndex != 0 && d.Interface != dev {
			if l := k.conn.GetLink(d.Interface); l != nil && l.Index != d.IfaceIndex {
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

// Reads others need outside the executor's reads (stats, show, the
// engine's steady passes): each one a dump or a lookup, never a write.

// Classes dumps the classes of dev's qdisc (0: of every qdisc).
func (k *Kernel) Classes(dev string, qdisc tc.Handle) ([]*tc.Class, error) {
	return k.conn.Classes(dev, qdisc)
}

// ClassesOf dumps the classes of each of dev's qdiscs (tc.Conn.ClassesOf).
func (k *Kernel) ClassesOf(dev string, qdiscs []tc.Handle) ([]*tc.Class, error) {
	return k.conn.ClassesOf(dev, qdiscs)
}

// Qdiscs dumps dev's qdiscs.
func (k *Kernel) Qdiscs(dev string) ([]*tc.Qdisc, error) { return k.conn.Qdiscs(dev) }

// TxBytes is the bytes device dev has sent (its link counter): what a
// tree on it passed, all of it (rate: auto's load).
func (k *Kernel) TxBytes(dev string) (uint64, error) {
	tx, _, err := k.LinkBytes(dev)
	return tx, err
}

// LinkBytes is the device's transmitted and received byte counters.
func (k *Kernel) LinkBytes(dev string) (tx, rx uint64, err error) {
	l, err := k.conn.Links().LinkByName(dev)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", dev, err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return 0, 0, fmt.Errorf("%s: no link statistics", dev)
	}
	return st.TxBytes, st.RxBytes, nil
}

// LinkExists reports whether the namespace has a device of that name.
func (k *Kernel) LinkExists(name string) bool { return k.conn.LinkExists(name) }

// IfIndex is the index of the device of that name.
func (k *Kernel) IfIndex(name string) (int, error) { return k.conn.IfIndex(name) }

// Writes counts the executor's writes since Open: a pass that found
// nothing to change made none (tests and benchmarks read it).
func (k *Kernel) Writes() int { return k.conn.Writes() }

// InjectWriteFault makes fn run before each of the executor's writes
// (n counts them since Open); an error it returns fails that write, as
// the kernel would (tc.ErrInjected). nil removes it. For fault
// injection in tests only.
func (k *Kernel) InjectWriteFault(fn func(n int, what string) error) { k.conn.BeforeWrite = fn }

// Records are sluice's records as this handle read them (or as a
// session lent them, UseRecords): for reading. Only this package's
// apply, record and reset change them.
func (k *Kernel) Records() *records.File { return k.recs }

// UseRecords gives a bare handle (OpenBare) the records to read with:
// a session's settled pass lends its own, read and checked then, so that
// a steady pass does not load them again.
func (k *Kernel) UseRecords(f *records.File) { k.recs = f }

// Close releases the lock and the connection.
func (k *Kernel) Close() {
	k.lock.Release()
	k.conn.Close()
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

// CheckInterfaces reports every policy interface missing from the
// namespace, located in the policy file.
func (k *Kernel) CheckInterfaces(pol *policy.Policy) error {
	d := &policy.Diag{File: pol.File}
	var have []string
	for _, in := range pol.Interfaces {
		if !k.conn.LinkExists(in.Name) {
			where := "this network namespace"
			if k.NS != "" {
				where = "network namespace " + k.NS
			}
			if have == nil {
				have = k.conn.LinkNames()
			}
			d.Errorf(in.NamePos, "interface %s does not exist in %s (it has %s)", in.Name, where, strings.Join(have, ", "))
		}
	}
	return d.Err()
}

// Plan builds the plan for pol against this kernel's features and the
// ids recorded for its devices.
func (k *Kernel) Plan(pol *policy.Policy, feats plan.Features) (*plan.Plan, error) {
	prev := RecordedAllocs(k.recs)
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
		l := k.conn.GetLink(in.Name)
		if l == nil {
			continue
		}
		feats.RawIP[in.Name] = l.RawIP
		// Only queues the driver says it uses get shards.
		if n, ok := k.conn.TxQueuesInUse(in.Name); ok {
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

// RecordedAllocs returns the id allocations recorded in f, by tree
// device, for the planner to keep.
func RecordedAllocs(f *records.File) map[string]*plan.Alloc {
	prev := make(map[string]*plan.Alloc, len(f.Devices))
	for name, d := range f.Devices {
		prev[name] = planAlloc(d.Alloc)
	}
	return prev
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
