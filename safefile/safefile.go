// Package safefile reads and writes sluice's files so that nothing
// planted beside them can redirect it: a symbolic link named like one
// of its records, a FIFO or a device given as a policy, a directory
// another user can write to.
//
// Input files the user names (a policy, a hosts file) are read with
// ReadRegular: links in their path are followed, as the user chose
// them, but only a regular file is read, and only up to a limit. The
// records directory is a Dir: opened without following a link in its
// last component, owned by the caller (or root, for a reader without
// root) and writable by nobody else, and every file in it is opened
// relative to it with O_NOFOLLOW, created 0600 (0640 where the readers'
// group exists: readers.go) under a random name and renamed into place.
package safefile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ReadRegular reads the regular file at path, refusing anything else
// (a FIFO would block forever, /dev/zero never ends) and any file
// larger than limit bytes. what names the file in errors ("policy",
// "hosts file").
func ReadRegular(path, what string, limit int64) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO must not wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, path, what, limit)
}

// ReadIn reads file name inside directory dir as ReadRegular reads a
// path, but only what lies inside dir: a link in name that leads out of
// it (sub/root -> /) is refused, as is "..".
func ReadIn(dir, name, what string, limit int64) ([]byte, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	path := filepath.Join(dir, name)
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
			return nil, unsafeErr("%s: leads outside %s (through a link or ..); the %s must be a file in it", path, dir, what)
		}
		return nil, err
	}
	defer f.Close()
	return readBounded(f, path, what, limit)
}

func readBounded(f *os.File, path, what string, limit int64) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s); the %s must be a plain file", path, kindOf(fi.Mode()), what)
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s: %d bytes; a %s may have at most %d", path, fi.Size(), what, limit)
	}
	// The size can change while reading: read one byte past the limit
	// to notice.
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than %d bytes; a %s may have at most that", path, limit, what)
	}
	return b, nil
}

func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "not a plain file"
}

// Dir is an open directory whose files are reached without following
// links. Its zero value is not usable; see OpenDir.
type Dir struct {
	fd   int
	path string
}

// ErrUnsafe marks a directory or file sluice refuses to use: a link, a
// file of the wrong kind, or a directory others can write to.
var ErrUnsafe = errors.New("unsafe")

func unsafeErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsafe, fmt.Sprintf(format, args...))
}

// OpenDir opens directory path, creating it and its missing parents
// when create is set. The directories above path are trusted as the
// system has them (/run, or what SLUICE_STATE_DIR names); path itself
// must not be a link, must belong to the caller's effective user or to
// root (a reader without root reads root's records), and must not be
// writable by group or others. sluice never changes the mode of a
// directory it did not create: one it creates is 0700, and every file
// it writes 0600 (records name subscribers), or 0750 and 0640 with the
// readers' group (ReadersGroup) where that group exists.
func OpenDir(path string, create bool) (*Dir, error) {
	path = filepath.Clean(path)
	made := false
	if create {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		err := unix.Mkdir(path, dirMode())
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, &os.PathError{Op: "mkdir", Path: path, Err: err}
		}
		made = err == nil
	}
	fd, err := unix.Open(path, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, openDirErr(path, err)
	}
	d := &Dir{fd: fd, path: path}
	if err := d.check(); err != nil {
		d.Close()
		return nil, err
	}
	if made {
		shareFd(fd)
	}
	return d, nil
}

func openDirErr(path string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		if fi, lerr := os.Lstat(path); lerr == nil {
			return unsafeErr("%s is %s, not a directory; sluice will not use it (remove it)", path, kindOf(fi.Mode()))
		}
	}
	return &os.PathError{Op: "open", Path: path, Err: err}
}

// check enforces ownership and permissions on the open directory.
func (d *Dir) check() error {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: d.path, Err: err}
	}
	if int(st.Uid) != os.Geteuid() && st.Uid != 0 {
		return unsafeErr("%s belongs to uid %d, not to this user (uid %d) nor to root; sluice will not keep its records there (chown it or remove it)", d.path, st.Uid, os.Geteuid())
	}
	if st.Mode&0o022 != 0 {
		return unsafeErr("%s is writable by other users (mode %#o); sluice will not keep its records there (chmod 700 it)", d.path, st.Mode&0o777)
	}
	// A directory others may read is left as it is (it may be /var/lib,
	// which a hosts_file names): what sluice writes in it is 0600 (0640 for the readers' group).
	return nil
}

// Path is the directory's path, for messages.
func (d *Dir) Path() string { return d.path }

// Close releases the directory.
func (d *Dir) Close() {
	if d != nil && d.fd >= 0 {
		unix.Close(d.fd)
		d.fd = -1
	}
}

// Sub opens the subdirectory name (one path component), creating it
// when create is set, with the same checks as OpenDir.
func (d *Dir) Sub(name string, create bool) (*Dir, error) {
	if err := component(name); err != nil {
		return nil, err
	}
	path := filepath.Join(d.path, name)
	made := false
	if create {
		err := unix.Mkdirat(d.fd, name, dirMode())
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, &os.PathError{Op: "mkdir", Path: path, Err: err}
		}
		made = err == nil
	}
	fd, err := unix.Openat(d.fd, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, unsafeErr("%s is a link or not a directory; sluice will not use it (remove it)", path)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	s := &Dir{fd: fd, path: path}
	if err := s.check(); err != nil {
		s.Close()
		return nil, err
	}
	if made {
		shareFd(fd)
	}
	return s, nil
}

func component(name string) error {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
		return fmt.Errorf("%q is not a file name", name)
	}
	return nil
}

// open opens name in d without following a link, and checks that it
// is a regular file.
func (d *Dir) open(name string, flags int, perm uint32) (*os.File, error) {
	if err := component(name); err != nil {
		return nil, err
	}
	path := filepath.Join(d.path, name)
	fd, err := unix.Openat(d.fd, name, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, perm)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, unsafeErr("%s is a symbolic link; sluice does not follow links among its records (remove it)", path)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, unsafeErr("%s is %s, not a plain file; sluice will not use it (remove it)", path, kindOf(fi.Mode()))
	}
	return f, nil
}

// ReadFile reads file name of at most limit bytes. A missing file
// gives an error satisfying errors.Is(err, fs.ErrNotExist).
func (d *Dir) ReadFile(name string, limit int64) ([]byte, error) {
	f, err := d.open(name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, f.Name(), "records file", limit)
}

// OpenLock opens (creating it, 0600) a file to take a lock on.
func (d *Dir) OpenLock(name string) (*os.File, error) {
	return d.open(name, unix.O_RDWR|unix.O_CREAT, 0o600)
}

// Temp is a new file in a Dir under a random name, not yet in place.
type Temp struct {
	*os.File
	dir  *Dir
	name string
}

// CreateTemp creates a new private file named prefix plus a random
// suffix plus ".tmp"; nothing that exists, link or not, is opened.
func (d *Dir) CreateTemp(prefix string) (*Temp, error) {
	b := make([]byte, 8)
	rand.Read(b)
	name := prefix + hex.EncodeToString(b) + ".tmp"
	f, err := d.open(name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, fileMode())
	if err != nil {
		return nil, err
	}
	shareFd(int(f.Fd()))
	return &Temp{File: f, dir: d, name: name}, nil
}

// Name is the temporary file's name in its directory.
func (t *Temp) Name() string { return t.name }

// Finish flushes the file to stable storage and closes it; it stays
// under its temporary name until Rename.
func (t *Temp) Finish() error {
	err := t.File.Sync()
	if cerr := t.File.Close(); err == nil {
		err = cerr
	}
	return err
}

// Discard closes and removes the temporary file.
func (t *Temp) Discard() {
	t.File.Close()
	t.dir.Remove(t.name)
}

// WriteTemp writes b to a new temporary file and returns its name.
func (d *Dir) WriteTemp(prefix string, b []byte) (string, error) {
	t, err := d.CreateTemp(prefix)
	if err != nil {
		return "", err
	}
	if _, err := t.Write(b); err != nil {
		t.Discard()
		return "", err
	}
	if err := t.Finish(); err != nil {
		t.dir.Remove(t.name)
		return "", err
	}
	return t.name, nil
}

// Rename moves from to to within d, replacing to atomically.
func (d *Dir) Rename(from, to string) error {
	if err := component(from); err != nil {
		return err
	}
	if err := component(to); err != nil {
		return err
	}
	if err := unix.Renameat(d.fd, from, d.fd, to); err != nil {
		return &os.LinkError{Op: "rename", Old: filepath.Join(d.path, from), New: filepath.Join(d.path, to), Err: err}
	}
	return nil
}

// WriteAtomic replaces file name with b: readers see the old content
// or the new, never a mix, and a link planted as name is replaced, not
// followed.
func (d *Dir) WriteAtomic(name string, b []byte) error {
	tmp, err := d.WriteTemp(name+".", b)
	if err != nil {
		return err
	}
	if err := d.Rename(tmp, name); err != nil {
		d.Remove(tmp)
		return err
	}
	return nil
}

// Remove removes file name (a link itself, never its target); a
// missing file is not an error.
func (d *Dir) Remove(name string) error {
	if err := component(name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: filepath.Join(d.path, name), Err: err}
	}
	return nil
}

// Names lists the directory's entries.
func (d *Dir) Names() ([]string, error) {
	fd, err := unix.Openat(d.fd, ".", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	return f.Readdirnames(-1)
}

// Stat describes file name without following a link.
func (d *Dir) Stat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := component(name); err != nil {
		return st, err
	}
	err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		err = &os.PathError{Op: "stat", Path: filepath.Join(d.path, name), Err: err}
	}
	return st, err
}

// WriteOut writes b as the file at path, which a user named (plan
// --out, a report): whole or not at all (a new file beside it, renamed
// over it), never through a symbolic link and never over anything but a
// regular file (a FIFO would block the write, a device take it), with
// mode perm whatever an older file's was.
func WriteOut(path string, b []byte, perm os.FileMode) error {
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return unsafeErr("%s is %s; sluice writes only over a regular file (remove it or choose another name)", path, kindOf(fi.Mode()))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp") // O_EXCL, 0600
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// rename(2) replaces a link planted since, never what it names.
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// OutDir readies path, a directory a user named for a command's output
// (a lab run's report), to be written into with WriteOut: created (0755,
// with its parents) where missing; else it must be a directory, not a
// link to one, and belong to the caller. Root writing into a directory
// another user made (in /tmp, say) could be led by links planted in it.
func OutDir(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return os.MkdirAll(path, 0o755)
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return unsafeErr("%s is %s, not a directory (remove it or choose another)", path, kindOf(fi.Mode()))
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return unsafeErr("%s belongs to uid %d, not to this user (uid %d); sluice writes only into a directory of its own user (remove it or choose another)", path, st.Uid, os.Geteuid())
	}
	return nil
}
