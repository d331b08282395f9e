package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sluice/plan"
)

// DefaultStateDir holds sluice's ownership records. It lives on tmpfs on
// purpose: the kernel objects it describes do not survive a reboot either.
const DefaultStateDir = "/run/sluice"

// StateDir is where the records for network namespace ns live; the
// SLUICE_STATE_DIR environment variable moves the base (tests use it).
func StateDir(ns string) string {
	base := os.Getenv("SLUICE_STATE_DIR")
	if base == "" {
		base = DefaultStateDir
	}
	if ns == "" {
		return base
	}
	return filepath.Join(base, "netns", ns)
}

// State is what sluice created, per device carrying a tree.
type State struct {
	Version int                  `json:"version"`
	Devices map[string]*DevState `json:"devices"`

	stamp fileStamp // of the file it was read from
}

// fileStamp tells whether a records file changed since it was read
// (Save renames a new file into place: a new inode).
type fileStamp struct {
	ino, size uint64
	mtime     time.Time
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	st := fileStamp{size: uint64(fi.Size()), mtime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}

// Unchanged reports whether the records file in dir is still the one s
// was read from.
func (s *State) Unchanged(dir string) bool {
	return s.stamp != fileStamp{} && s.stamp == stampOf(statePath(dir))
}

// DevState records one tree.
type DevState struct {
	Interface string `json:"interface"`
	Dir       string `json:"direction"`
	// Root is the handle of the root qdisc sluice created.
	Root string `json:"root"`
	// IfbCreated: the ifb device itself is sluice's (else it was adopted).
	IfbCreated bool `json:"ifb_created,omitempty"`
	// HookCreated: sluice created the interface's clsact qdisc.
	HookCreated bool `json:"hook_created,omitempty"`
	// ClsactCreated: sluice created the clsact qdisc on the tree device
	// (for its BPF classifier) or, for a policer, on the interface.
	ClsactCreated bool `json:"clsact_created,omitempty"`
	// PoliceOnly: a BPF policer on the interface's hook, no tree.
	PoliceOnly bool      `json:"police_only,omitempty"`
	Policy     string    `json:"policy,omitempty"`
	AppliedAt  time.Time `json:"applied_at"`
	// Alloc, Classes and Objects (the fingerprints of the objects the
	// last apply left, by key) are saved packed (pack.go) in a binary
	// file beside the records, Packed bytes from Offset; the JSON fields
	// are read from records of earlier versions only.
	Alloc   *plan.Alloc       `json:"alloc,omitempty"`
	Classes []plan.ClassInfo  `json:"classes,omitempty"`
	Objects map[string]uint64 `json:"-"`
	Bulk    string            `json:"bulk,omitempty"`
	Offset  int               `json:"offset,omitempty"`
	Packed  int               `json:"packed,omitempty"`
}

// IsIfb reports whether the tree sits on an ifb for an interface's ingress.
func (d *DevState) IsIfb() bool { return d.Dir == "ingress" && !d.PoliceOnly }

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

// LoadState reads the records (empty if none).
func LoadState(dir string) (*State, error) {
	s := &State{Version: 1, Devices: map[string]*DevState{}, stamp: stampOf(statePath(dir))}
	b, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("%s: %w (remove it to start over; sluice will then treat its trees as foreign)", statePath(dir), err)
	}
	if s.Devices == nil {
		s.Devices = map[string]*DevState{}
	}
	bulk := map[string][]byte{}
	for name, d := range s.Devices {
		if d.Bulk == "" {
			continue
		}
		bad := func(err error) (*State, error) {
			return nil, fmt.Errorf("%s: %s: %w (remove %s to start over; sluice will then treat its trees as foreign)", statePath(dir), name, err, dir)
		}
		if filepath.Base(d.Bulk) != d.Bulk {
			return bad(errors.New("bad bulk file name"))
		}
		b, ok := bulk[d.Bulk]
		if !ok {
			if b, err = os.ReadFile(filepath.Join(dir, d.Bulk)); err != nil {
				return bad(err)
			}
			bulk[d.Bulk] = b
		}
		if d.Offset < 0 || d.Packed <= 0 || d.Offset+d.Packed > len(b) {
			return bad(errPacked)
		}
		if d.Alloc, d.Classes, d.Objects, err = unpack(b[d.Offset : d.Offset+d.Packed]); err != nil {
			return bad(err)
		}
	}
	return s, nil
}

// Save writes the records atomically.
func (s *State) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The bulk goes first, under a new name, then the records naming
	// it replace the old ones: a crash in between leaves the old
	// records with the old bulk.
	bulkName := "state." + strconv.FormatInt(time.Now().UnixNano(), 36) + ".bin"
	out := &State{Version: s.Version, Devices: make(map[string]*DevState, len(s.Devices))}
	bulkTmp := filepath.Join(dir, bulkName+".tmp")
	f, err := os.Create(bulkTmp)
	if err != nil {
		return err
	}
	off := 0
	for _, name := range s.Names() {
		d := s.Devices[name]
		c := *d
		n, err := pack(f, d.Alloc, d.Classes, d.Objects)
		if err != nil {
			f.Close()
			os.Remove(bulkTmp)
			return err
		}
		c.Bulk, c.Offset, c.Packed = bulkName, off, n
		off += n
		c.Alloc, c.Classes = nil, nil
		out.Devices[name] = &c
	}
	if err := f.Close(); err != nil {
		os.Remove(bulkTmp)
		return err
	}
	if err := os.Rename(bulkTmp, filepath.Join(dir, bulkName)); err != nil {
		os.Remove(bulkTmp)
		return err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	if err := writeAtomic(statePath(dir), append(b, '\n')); err != nil {
		os.Remove(filepath.Join(dir, bulkName))
		return err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "state.*.bin"))
	for _, f := range old {
		if filepath.Base(f) != bulkName {
			os.Remove(f)
		}
	}
	return nil
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Names returns the recorded devices in order.
func (s *State) Names() []string {
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
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
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
			holder, _ := os.ReadFile(f.Name())
			f.Close()
			if pid := strings.TrimSpace(string(holder)); pid != "" {
				return nil, fmt.Errorf("%w (pid %s holds %s)", ErrLocked, pid, f.Name())
			}
			return nil, ErrLocked
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
