package records

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sluice/safefile"
	"sluice/tc"
	"sluice/units"
)

// DefaultDir holds sluice's ownership records. It lives on tmpfs on
// purpose: the kernel objects it describes do not survive a reboot either.
const DefaultDir = "/run/sluice"

// Dir is where the records for network namespace ns live; the
// SLUICE_STATE_DIR environment variable moves the base (tests use it).
// ns must be a valid namespace name (ValidNetnsName).
//
// ns "" is the namespace the process is in: the root namespace's
// records, or, where `ip netns exec NAME` put the process in a named
// namespace, NAME's. Records follow the namespace entered, not the name
// given (issue 58: `ip netns exec B sluice apply` wrote over the records
// of the root namespace an agent kept, which then failed every pass).
func Dir(ns string) string {
	if ns == "" {
		ns = EnteredNetns()
	}
	return DirIn(Base(), ns)
}

// Base is the records' base directory: the root namespace's records,
// and the kernel-wide feature cache (DefaultDir, or SLUICE_STATE_DIR).
func Base() string {
	if base := os.Getenv("SLUICE_STATE_DIR"); base != "" {
		return base
	}
	return DefaultDir
}

var entered struct {
	once sync.Once
	name string
}

// EnteredNetns is the name (under /run/netns) of the network namespace
// this process was started in, "" for one without a name (the root's,
// as a rule). Process 1's namespace is not what tells the root's: it
// cannot always be read, even by root.
func EnteredNetns() string {
	entered.once.Do(func() {
		var self syscall.Stat_t
		if syscall.Stat("/proc/self/ns/net", &self) != nil {
			return
		}
		ents, _ := os.ReadDir("/run/netns")
		for _, e := range ents {
			var st syscall.Stat_t
			if ValidNetnsName(e.Name()) == nil && syscall.Stat(filepath.Join("/run/netns", e.Name()), &st) == nil &&
				st.Ino == self.Ino && st.Dev == self.Dev {
				entered.name = e.Name()
				return
			}
		}
	})
	return entered.name
}

// DirIn is Dir with the base given: where a process that holds several
// bases (tests running at once) finds ns's records.
func DirIn(base, ns string) string {
	if ns == "" {
		return base
	}
	return filepath.Join(base, "netns", ns)
}

// ValidNetnsName checks a network namespace name as `ip netns` does:
// not empty, at most 255 bytes, no '/', not "." or "..". A name is a
// file under /run/netns, and names the records directory too.
func ValidNetnsName(ns string) error {
	switch {
	case ns == "":
		return errors.New("network namespace name is empty")
	case len(ns) > 255:
		return fmt.Errorf("network namespace name %.20q...: longer than 255 bytes", ns)
	case strings.ContainsRune(ns, '/') || ns == "." || ns == "..":
		return fmt.Errorf("network namespace name %q: must not contain '/' or be . or .. (a name as `ip netns add` takes it)", ns)
	case strings.ContainsAny(ns, "\x00"):
		return fmt.Errorf("network namespace name %q: contains a NUL byte", ns)
	}
	return nil
}

// openDir opens the records directory of a namespace, creating it
// (and the directories leading to it, 0700) when create is set. A
// missing one without create is an error (fs.ErrNotExist): a caller for
// whom that means "nothing recorded" says so, and one that forgets gets
// an error, never a nil directory (show and munin once panicked on a
// namespace without records).
func openDir(dir string, create bool) (*safefile.Dir, error) {
	return safefile.OpenDir(dir, create)
}

// recordsVersion is the records' format. Version 1 (no identities, no
// journal, no checksum) is still read; any other is refused.
const recordsVersion = 2

// Limits on what Load reads: far above what 100,000 hosts need.
const (
	maxRecordsJSON = 64 << 20
	maxRecordsBulk = 1 << 30
)

// File is the records of one network namespace: what sluice created,
// per device carrying a tree (or a policer).
type File struct {
	Version int `json:"version"`
	// Netns is the namespace the records describe. Records that name
	// another (the namespace was deleted and one made under the same
	// name) are stale and ignored.
	Netns *tc.NetnsID `json:"netns,omitempty"`
	// Journal is set while an apply changes the kernel: it was written
	// before the first change, and Devices then hold both what the
	// apply started from and what it makes, so that an apply killed at
	// any instant leaves records that claim everything it may have
	// created. The next apply reads every tree back in full.
	Journal *Journal `json:"journal,omitempty"`
	// Bulk names the binary file holding each device's packed bulk
	// (pack.go), BulkSum its SHA-256, BulkSize its length.
	Bulk     string           `json:"bulk,omitempty"`
	BulkSum  string           `json:"bulk_sum,omitempty"`
	BulkSize int              `json:"bulk_size,omitempty"`
	Devices  map[string]*Tree `json:"devices"`

	stamp fileStamp // of the file it was read from
	raw   []byte    // the file as read (what Update.Abort puts back)
}

// Journal describes an apply in progress (or one that was killed).
type Journal struct {
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	Policy  string    `json:"policy,omitempty"`
}

// fileStamp tells whether a records file changed since it was read
// (every write renames a new file into place: a new inode).
type fileStamp struct {
	ino, size uint64
	mtime     int64
}

func stampOf(d *safefile.Dir) fileStamp {
	if d == nil {
		return fileStamp{}
	}
	st, err := d.Stat(stateFile)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim.Nano()}
}

// Unchanged reports whether the records file in dir is still the one s
// was read from.
func (s *File) Unchanged(dir string) bool {
	d, err := openDir(dir, false)
	if err != nil {
		return false
	}
	defer d.Close()
	return s.stamp != fileStamp{} && s.stamp == stampOf(d)
}

// Emptied returns records holding nothing that still know the file s
// was read from: what a caller keeps after setting stale records aside,
// so that the next write replaces the file and an aborted update puts
// it back.
func (s *File) Emptied() *File {
	f := New()
	f.stamp, f.raw = s.stamp, s.raw
	return f
}

// Interrupted reports whether an apply started and did not finish.
func (s *File) Interrupted() bool { return s.Journal != nil }

// Tree records one tree.
type Tree struct {
	Interface string `json:"interface"`
	Dir       string `json:"direction"`
	// Root is the handle of the root qdisc sluice created.
	Root string `json:"root"`
	// Ifindex is the tree device's index when recorded, IfaceIndex the
	// interface's (0: not known yet, in a journal written before the
	// device was created). A device of the same name with another
	// index is another device: the record does not describe it.
	Ifindex    int `json:"ifindex,omitempty"`
	IfaceIndex int `json:"iface_index,omitempty"`
	// IfbCreated: the ifb device itself is sluice's (else it was adopted).
	IfbCreated bool `json:"ifb_created,omitempty"`
	// HookCreated: sluice created the interface's clsact qdisc.
	HookCreated bool `json:"hook_created,omitempty"`
	// ClsactCreated: sluice created the clsact qdisc on the tree device
	// (for its BPF classifier) or, for a policer, on the interface.
	ClsactCreated bool `json:"clsact_created,omitempty"`
	// PoliceOnly: a BPF policer on the interface's hook, no tree.
	PoliceOnly bool `json:"police_only,omitempty"`
	// EDT: the tree is the EDT backend's (Classes are its aggregates).
	EDT       bool      `json:"edt,omitempty"`
	Policy    string    `json:"policy,omitempty"`
	AppliedAt time.Time `json:"applied_at"`
	// Alloc, Classes and Objects (the fingerprints of the objects the
	// last apply left, by key) are saved packed (pack.go) in the bulk
	// file, Packed bytes from Offset. Alloc.Tag is the tree's tag, which
	// its HTB qdiscs carry as r2q.
	Alloc   *Alloc            `json:"-"`
	Classes []Class           `json:"-"`
	Objects map[string]uint64 `json:"-"`
	Offset  int               `json:"offset,omitempty"`
	Packed  int               `json:"packed,omitempty"`
	// Bulk is version 1's per-device bulk file name (read only).
	Bulk string `json:"bulk,omitempty"`
}

// Alloc is a tree's id allocation as recorded: which minor, filter
// prio, hash table, shard, leaf major, BPF counter and delay histogram
// each name was given, so that the next plan keeps them. It is the
// records' own type: the planner's (plan.Alloc) may change; this, and
// the packed layout (pack.go), change only with packVersion.
type Alloc struct {
	Classes  map[string]uint16
	Prios    map[string]uint16
	Tables   map[string]uint16
	Shards   map[string]uint16
	Leaves   map[string]uint16
	Counters map[string]uint32
	Hists    map[string]uint16
	// Tag is the tree's tag, which its HTB qdiscs carry as r2q.
	Tag uint32
}

// Class is a class of a tree as recorded: what stats, show and the
// agent name a kernel class by, without the policy at hand.
type Class struct {
	Name    string
	Handle  tc.Handle
	Parent  tc.Handle
	Rate    units.Rate
	Ceil    units.Rate
	Prio    uint32
	Leaf    string
	Default bool
	// Counter is the class's BPF counter when it is not its minor
	// (sharded trees); Replica marks a non-host class's copy in shards
	// other than the first; Hist is an EDT aggregate's histogram.
	Counter uint32
	Replica bool
	Hist    uint16
	// RTT is the class's round-trip histogram + 1 where its interface
	// times round trips (0: none).
	RTT uint32
}

// IsIfb reports whether the tree sits on an ifb for an interface's ingress.
func (d *Tree) IsIfb() bool { return d.Dir == "ingress" && !d.PoliceOnly }

// Device is the device the tree recorded as name (or its policer) is on.
func (d *Tree) Device(name string) string {
	if d.PoliceOnly {
		return d.Interface
	}
	return name
}

// R2Q is the r2q the tree's HTB qdiscs carry: its tag, or, for records
// of version 1, tc's default.
func (d *Tree) R2Q() uint32 {
	if d.Alloc != nil && d.Alloc.Tag != 0 {
		return d.Alloc.Tag
	}
	return defaultR2Q
}

// defaultR2Q is tc's r2q, which trees recorded by version 1 (before
// tags) carry.
const defaultR2Q = 10

const stateFile = "state.json"

// Error is records that cannot be used: unreadable, corrupt or
// of an unknown version. It is a failure, not bad input.
type Error struct {
	Dir string
	Err error
}

func (e *Error) Error() string {
	if errors.Is(e.Err, fs.ErrPermission) {
		return fmt.Sprintf("records in %s: %v: sluice's records are readable by root and by the members of the group %s, where it exists (the packages create it; records made from then on are the group's): run as root, or join the group", e.Dir, e.Err, safefile.ReadersName())
	}
	return fmt.Sprintf("records in %s: %v (sluice will not guess what it owns; to start over, remove %s and run apply --force)", e.Dir, e.Err, e.Dir)
}

func (e *Error) Unwrap() error { return e.Err }

func New() *File {
	return &File{Version: recordsVersion, Devices: map[string]*Tree{}}
}

// Load reads the records (empty if none).
func Load(dir string) (*File, error) {
	d, err := openDir(dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return New(), nil
	}
	if err != nil {
		return nil, &Error{dir, err}
	}
	defer d.Close()
	return load(d)
}

// loadTries bounds load's reads of records that a writer keeps
// replacing.
const loadTries = 5

// afterStateRead, when set (tests), runs between load's read of the
// state file and of the bulk file it names: where a writer's Save lands
// in a reader's way.
var afterStateRead func()

// load reads the records in d. Readers take no lock (show, the
// dashboard's reads, a plan beside a running agent), so a Save may
// replace them while one reads: it puts the new state file in place
// and then removes the bulk file the old one named. A bulk file gone
// from under a state file that has changed since is that, and the
// records are read again; one gone while its state file still names it
// is damage.
func load(d *safefile.Dir) (*File, error) {
	for try := 1; ; try++ {
		var raw []byte
		s, err := parseRecords(d, &raw)
		if err == nil || try == loadTries || !errors.Is(err, fs.ErrNotExist) {
			return s, err
		}
		now, rerr := d.ReadFile(stateFile, maxRecordsJSON)
		if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) || bytes.Equal(now, raw) {
			return s, err
		}
	}
}

// parseRecords reads the records in d once, the state file's bytes
// into raw (left nil where there is none).
func parseRecords(d *safefile.Dir, raw *[]byte) (*File, error) {
	s := New()
	s.stamp = stampOf(d)
	b, err := d.ReadFile(stateFile, maxRecordsJSON)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	*raw = b
	if afterStateRead != nil {
		afterStateRead()
	}
	bad := func(err error) (*File, error) { return nil, &Error{d.Path(), err} }
	if err != nil {
		return bad(err)
	}
	s.raw = b
	if err := json.Unmarshal(b, s); err != nil {
		return bad(fmt.Errorf("%s: %w", stateFile, err))
	}
	switch s.Version {
	case 1, recordsVersion:
	default:
		return bad(fmt.Errorf("%s: version %d, this sluice reads versions 1 and %d (written by another release of sluice?)", stateFile, s.Version, recordsVersion))
	}
	if s.Devices == nil {
		s.Devices = map[string]*Tree{}
	}
	bulks := map[string][]byte{}
	readBulk := func(name string) ([]byte, error) {
		if b, ok := bulks[name]; ok {
			return b, nil
		}
		if strings.ContainsRune(name, '/') || !strings.HasPrefix(name, "state.") || !strings.HasSuffix(name, ".bin") {
			return nil, fmt.Errorf("bad bulk file name %q", name)
		}
		b, err := d.ReadFile(name, maxRecordsBulk)
		if err != nil {
			return nil, err
		}
		bulks[name] = b
		return b, nil
	}
	if s.Version >= 2 && s.Bulk != "" {
		b, err := readBulk(s.Bulk)
		if err != nil {
			return bad(err)
		}
		if len(b) != s.BulkSize || bulkSum(b) != s.BulkSum {
			return bad(fmt.Errorf("%s does not match its checksum in %s (changed or truncated)", s.Bulk, stateFile))
		}
	}
	for name, dev := range s.Devices {
		bulk := s.Bulk
		if s.Version == 1 {
			bulk = dev.Bulk
		}
		if bulk == "" {
			continue
		}
		b, err := readBulk(bulk)
		if err != nil {
			return bad(fmt.Errorf("%s: %w", name, err))
		}
		if dev.Offset < 0 || dev.Packed <= 0 || dev.Offset+dev.Packed > len(b) {
			return bad(fmt.Errorf("%s: %w", name, errPacked))
		}
		if dev.Alloc, dev.Classes, dev.Objects, err = unpack(b[dev.Offset : dev.Offset+dev.Packed]); err != nil {
			return bad(fmt.Errorf("%s: %w", name, err))
		}
		dev.Bulk = ""
	}
	return s, nil
}

func bulkSum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Save writes the records atomically.
func (s *File) Save(dir string) error {
	d, err := openDir(dir, true)
	if err != nil {
		return err
	}
	defer d.Close()
	s.Journal = nil
	bulk, enc, err := s.writeBulk(d)
	if err != nil {
		return err
	}
	b, err := json.Marshal(enc)
	if err != nil {
		d.Remove(bulk)
		return err
	}
	if err := d.WriteAtomic(stateFile, append(b, '\n')); err != nil {
		d.Remove(bulk)
		return err
	}
	s.Bulk, s.BulkSum, s.BulkSize = bulk, enc.BulkSum, enc.BulkSize
	s.raw, s.stamp = append(b, '\n'), stampOf(d)
	cleanDir(d, bulk)
	return nil
}

// writeBulk writes every device's bulk to a new bulk file and returns
// its name and the records to encode as JSON (referring to it).
func (s *File) writeBulk(d *safefile.Dir) (string, *File, error) {
	name := "state." + strconv.FormatInt(time.Now().UnixNano(), 36) + ".bin"
	out := &File{Version: recordsVersion, Netns: s.Netns, Journal: s.Journal, Bulk: name,
		Devices: make(map[string]*Tree, len(s.Devices))}
	t, err := d.CreateTemp(name + ".")
	if err != nil {
		return "", nil, err
	}
	h := sha256.New()
	w := &teeWriter{f: t, h: h}
	off := 0
	for _, dn := range s.Names() {
		dev := s.Devices[dn]
		c := *dev
		n, err := pack(w, dev.Alloc, dev.Classes, dev.Objects)
		if err != nil {
			t.Discard()
			return "", nil, err
		}
		c.Bulk, c.Offset, c.Packed = "", off, n
		off += n
		out.Devices[dn] = &c
	}
	out.BulkSize, out.BulkSum = off, hex.EncodeToString(h.Sum(nil))
	if err := t.Finish(); err != nil {
		d.Remove(t.Name())
		return "", nil, err
	}
	if err := d.Rename(t.Name(), name); err != nil {
		d.Remove(t.Name())
		return "", nil, err
	}
	return name, out, nil
}

type teeWriter struct {
	f interface{ Write([]byte) (int, error) }
	h interface{ Write([]byte) (int, error) }
}

func (w *teeWriter) Write(b []byte) (int, error) {
	w.h.Write(b)
	return w.f.Write(b)
}

// cleanDir removes what killed or finished writes left: temporary
// files and bulk files other than keep.
func cleanDir(d *safefile.Dir, keep ...string) {
	names, err := d.Names()
	if err != nil {
		return
	}
	kept := map[string]bool{}
	for _, k := range keep {
		kept[k] = true
	}
	for _, n := range names {
		if kept[n] {
			continue
		}
		if strings.HasSuffix(n, ".tmp") || strings.HasPrefix(n, "state.") && strings.HasSuffix(n, ".bin") {
			d.Remove(n)
		}
	}
}

// Update is a change to the records around an apply. Begin wrote the
// journal; Commit puts the records of the finished apply in place, Abort
// the records the apply started from. Both are a single rename of a
// file written before the kernel was touched, so neither needs space
// on a full disk.
type Update struct {
	dir                   string
	commitName, abortName string
	bulk, oldBulk         string
	// commit is the final records as written (fin their content).
	commit []byte
	fin    *File
	done   bool
}

// Begin writes the journal: union (the records of the finished apply
// and those of what it removes) with j set, in force at once, and
// prepares the records once it finishes (union's devices named in
// final) and the current ones (s). On error nothing is in force and the
// kernel must not be touched.
func (s *File) Begin(dir string, union *File, final []string, j *Journal) (*Update, error) {
	d, err := openDir(dir, true)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	union.Journal = j
	bulk, enc, err := union.writeBulk(d)
	union.Journal = nil
	if err != nil {
		return nil, fmt.Errorf("writing the journal: %w", err)
	}
	tx := &Update{dir: dir, bulk: bulk, oldBulk: s.Bulk}
	fail := func(err error) (*Update, error) {
		for _, n := range []string{tx.commitName, tx.abortName, bulk} {
			if n != "" {
				d.Remove(n)
			}
		}
		return nil, fmt.Errorf("writing the journal: %w", err)
	}
	// The final records are union's but for what the apply removes:
	// the same bulk holds them.
	fin := &File{Version: recordsVersion, Netns: enc.Netns, Bulk: enc.Bulk, BulkSum: enc.BulkSum, BulkSize: enc.BulkSize,
		Devices: map[string]*Tree{}}
	for _, name := range final {
		fin.Devices[name] = enc.Devices[name]
	}
	jb, err := json.Marshal(enc)
	if err != nil {
		return fail(err)
	}
	fb, err := json.Marshal(fin)
	if err != nil {
		return fail(err)
	}
	old := s.raw
	if old == nil {
		old, _ = json.Marshal(New())
	}
	tx.commit, tx.fin = append(fb, '\n'), fin
	if tx.commitName, err = d.WriteTemp("commit.", tx.commit); err != nil {
		return fail(err)
	}
	if tx.abortName, err = d.WriteTemp("abort.", old); err != nil {
		return fail(err)
	}
	if err := d.WriteAtomic(stateFile, append(jb, '\n')); err != nil {
		return fail(err)
	}
	return tx, nil
}

// Commit puts the records of the finished apply in place, and makes s
// (the records Begin was called on) hold them, with devs as their
// devices.
func (tx *Update) Commit(s *File, devs map[string]*Tree) error {
	if err := tx.finish(tx.commitName, tx.bulk); err != nil {
		return err
	}
	s.Journal, s.Netns, s.Devices = nil, tx.fin.Netns, devs
	s.Bulk, s.BulkSum, s.BulkSize = tx.fin.Bulk, tx.fin.BulkSum, tx.fin.BulkSize
	s.raw = tx.commit
	if d, err := openDir(tx.dir, false); err == nil {
		s.stamp = stampOf(d)
		d.Close()
	}
	return nil
}

// Abort puts back the records the apply started from (after a rollback
// that restored the kernel).
func (tx *Update) Abort() error { return tx.finish(tx.abortName, tx.oldBulk) }

func (tx *Update) finish(name, keep string) error {
	if tx == nil || tx.done {
		return nil
	}
	d, err := openDir(tx.dir, false)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Rename(name, stateFile); err != nil {
		return err
	}
	tx.done = true
	cleanDir(d, keep)
	return nil
}

// Names returns the recorded devices in order.
func (s *File) Names() []string {
	var out []string
	for k := range s.Devices {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Lock is an exclusive lock on a state directory: two sluice processes
// never change the same namespace at once.
type Lock struct{ f *os.File }

// ErrLocked means another sluice holds the lock.
var ErrLocked = errors.New("another sluice is changing this network namespace")

// AcquireLock takes the lock, waiting up to timeout.
func AcquireLock(dir string, timeout time.Duration) (*Lock, error) {
	return acquire(dir, "lock", ErrLocked, timeout)
}

// ErrAgentRunning means another sluice agent keeps this namespace.
var ErrAgentRunning = errors.New("another sluice agent runs in this network namespace")

// ErrLabBusy means another run holds a lab test bed.
var ErrLabBusy = errors.New("the test bed is in use by another run")

// AcquireLabLock claims lab test bed name for one run, without waiting.
// The lock is dir/lab/NAME.lock, dir the state directory: it is taken
// before the bed exists, so that of two runs only one builds it.
func AcquireLabLock(dir, name string) (*Lock, error) {
	return acquire(filepath.Join(dir, "lab"), name+".lock", ErrLabBusy, 0)
}

// AcquireAgentLock takes the agent's lock on the namespace's state
// directory, held for the agent's life: a second agent is refused at
// once. It is apart from the apply lock, which the agent takes for each
// pass, so that the command line still works beside it.
func AcquireAgentLock(dir string) (*Lock, error) {
	return acquire(dir, "agent.lock", ErrAgentRunning, 0)
}

// AgentRunning reports whether an agent holds dir's agent lock.
func AgentRunning(dir string) bool {
	d, err := openDir(dir, false)
	if err != nil {
		return false
	}
	defer d.Close()
	if _, err := d.Stat("agent.lock"); err != nil {
		return false
	}
	f, err := d.OpenLock("agent.lock")
	if err != nil {
		return false
	}
	defer f.Close()
	// A shared lock is refused only while the agent holds its exclusive one.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// WriteAgentFile writes a small file about the running agent (where it
// listens) into the state directory, privately and atomically.
func WriteAgentFile(dir, name string, b []byte) error {
	d, err := openDir(dir, true)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.WriteAtomic(name, b)
}

// ReadAgentFile reads what WriteAgentFile wrote (at most 64 KB).
func ReadAgentFile(dir, name string) ([]byte, error) {
	d, err := openDir(dir, false)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.ReadFile(name, 64<<10)
}

func acquire(dir, name string, locked error, timeout time.Duration) (*Lock, error) {
	d, err := openDir(dir, true)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	f, err := d.OpenLock(name)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		if time.Now().After(deadline) {
			holder := make([]byte, 16)
			n, _ := f.ReadAt(holder, 0)
			f.Close()
			if pid := strings.TrimSpace(string(holder[:n])); pid != "" {
				return nil, fmt.Errorf("%w (pid %s holds %s)", locked, pid, f.Name())
			}
			return nil, locked
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f}, nil
}

// Release drops the lock.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	l.f.Truncate(0)
	syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	l.f.Close()
	l.f = nil
}
