package safefile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ReadRegular reads only a plain file, however the user's path reaches
// it, and never more than the limit; what it refuses it names.
func TestReadRegularRefusesWhatIsNotAPlainFile(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(plain, []byte("devices: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(plain, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, 101), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		want       string // "" reads the plain file's content
	}{
		{"a plain file", plain, ""},
		{"a link the user named is followed", link, ""},
		{"a FIFO is refused without waiting for a writer", fifo, "not a regular file (a FIFO)"},
		{"a directory", dir, "not a regular file (a directory)"},
		{"a character device", "/dev/zero", "not a regular file (a character device)"},
		{"a file over the limit", big, "101 bytes; a policy may have at most 100"},
		{"a missing file", filepath.Join(dir, "none"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			var b []byte
			var err error
			go func() {
				b, err = ReadRegular(tc.path, "policy", 100)
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("ReadRegular blocked")
			}
			if tc.want == "" {
				if err != nil || string(b) != "devices: {}\n" {
					t.Fatalf("got %q, %v; want the file's content", b, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want one saying %q", err, tc.want)
			}
		})
	}
}

// OpenDir uses a records directory only when nobody else can have put
// anything in it: never through a link, never one others may write or
// own; one that others may only read is kept as it is (it may be
// /var/lib, where a hosts_file lives): sluice changes no directory's mode.
func TestOpenDirRefusesWhatOthersControl(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
		want  string // "" opens; otherwise an ErrUnsafe saying this
		mode  os.FileMode
	}{
		{name: "missing, created private", setup: func(t *testing.T, path string) {}, mode: 0o700},
		{name: "readable by others is left so", setup: func(t *testing.T, path string) {
			mkdir(t, path, 0o755)
		}, mode: 0o755},
		{name: "a link to a directory", setup: func(t *testing.T, path string) {
			target := path + ".real"
			mkdir(t, target, 0o700)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, want: "is a symbolic link, not a directory"},
		{name: "a plain file", setup: func(t *testing.T, path string) {
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, want: "not a plain file, not a directory"},
		{name: "writable by others", setup: func(t *testing.T, path string) {
			mkdir(t, path, 0o777)
		}, want: "writable by other users (mode 0777)"},
		{name: "writable by its group", setup: func(t *testing.T, path string) {
			mkdir(t, path, 0o770)
		}, want: "writable by other users (mode 0770)"},
		{name: "owned by another user", setup: func(t *testing.T, path string) {
			mkdir(t, path, 0o700)
			if os.Geteuid() != 0 {
				t.Skip("needs root to give a directory away")
			}
			if err := os.Chown(path, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, want: "belongs to uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "records")
			tc.setup(t, path)
			d, err := OpenDir(path, true)
			if tc.want != "" {
				if err == nil {
					d.Close()
					t.Fatal("opened; want it refused")
				}
				if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v; want ErrUnsafe saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			fi, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if !fi.IsDir() || fi.Mode().Perm() != tc.mode {
				t.Fatalf("%s is %v; want a directory of mode %v", path, fi.Mode(), tc.mode)
			}
		})
	}
	t.Run("missing without create", func(t *testing.T) {
		_, err := OpenDir(filepath.Join(t.TempDir(), "none"), false)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("error %v; want fs.ErrNotExist", err)
		}
	})
}

func mkdir(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(path, mode); err != nil {
		t.Fatal(err)
	}
	// The umask may have cleared bits the case needs.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// Inside a records directory nothing planted redirects a read or a
// write: links are refused or replaced, never followed, and names are
// single components.
func TestDirNeverFollowsWhatIsPlanted(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "victim")
	const victim = "do not touch\n"
	if err := os.WriteFile(outside, []byte(victim), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir string) // in the records directory
		do    func(d *Dir) error
		want  string // "" succeeds
	}{
		{"reading a link is refused",
			func(t *testing.T, dir string) { symlink(t, outside, filepath.Join(dir, "state.json")) },
			func(d *Dir) error { _, err := d.ReadFile("state.json", 1<<20); return err },
			"is a symbolic link; sluice does not follow links"},
		{"reading a FIFO is refused without blocking",
			func(t *testing.T, dir string) {
				if err := syscall.Mkfifo(filepath.Join(dir, "state.json"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			func(d *Dir) error { _, err := d.ReadFile("state.json", 1<<20); return err },
			"is a FIFO, not a plain file"},
		{"a lock file that is a link is refused",
			func(t *testing.T, dir string) { symlink(t, outside, filepath.Join(dir, "lock")) },
			func(d *Dir) error { f, err := d.OpenLock("lock"); f.Close(); return err },
			"is a symbolic link"},
		{"an atomic write replaces a planted link",
			func(t *testing.T, dir string) { symlink(t, outside, filepath.Join(dir, "state.json")) },
			func(d *Dir) error { return d.WriteAtomic("state.json", []byte("{}\n")) },
			""},
		{"removing a link removes the link",
			func(t *testing.T, dir string) { symlink(t, outside, filepath.Join(dir, "state.bin")) },
			func(d *Dir) error { return d.Remove("state.bin") },
			""},
		{"a subdirectory that is a link is refused",
			func(t *testing.T, dir string) { symlink(t, filepath.Dir(outside), filepath.Join(dir, "netns")) },
			func(d *Dir) error { s, err := d.Sub("netns", true); s.Close(); return err },
			"is a link or not a directory"},
		{"a path is not a name", func(t *testing.T, dir string) {},
			func(d *Dir) error { _, err := d.ReadFile("../victim", 1<<20); return err },
			`"../victim" is not a file name`},
		{"dot-dot is not a name", func(t *testing.T, dir string) {},
			func(d *Dir) error { return d.WriteAtomic("..", nil) },
			`".." is not a file name`},
		{"a file over the limit", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "state.json"), make([]byte, 11), 0o600); err != nil {
				t.Fatal(err)
			}
		},
			func(d *Dir) error { _, err := d.ReadFile("state.json", 10); return err },
			"11 bytes; a records file may have at most 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "records")
			d, err := OpenDir(dir, true)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			tc.plant(t, dir)
			errc := make(chan error, 1)
			go func() { errc <- tc.do(d) }()
			select {
			case err = <-errc:
			case <-time.After(5 * time.Second):
				t.Fatal("blocked")
			}
			if tc.want == "" && err != nil {
				t.Fatal(err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("error %v; want one saying %q", err, tc.want)
			}
			if b, err := os.ReadFile(outside); err != nil || string(b) != victim {
				t.Fatalf("the file outside is now %q (%v)", b, err)
			}
			names, err := d.Names()
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range names {
				if strings.HasSuffix(n, ".tmp") {
					t.Errorf("temporary file %s left behind", n)
				}
			}
		})
	}
}

// WriteAtomic leaves the new content in a private plain file; readers
// never see a mix.
func TestWriteAtomicReplacesWhole(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "records")
	d, err := OpenDir(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, content := range []string{"first, and longer than the second\n", "second\n"} {
		if err := d.WriteAtomic("state.json", []byte(content)); err != nil {
			t.Fatal(err)
		}
		b, err := d.ReadFile("state.json", 1<<20)
		if err != nil || string(b) != content {
			t.Fatalf("read %q, %v; want %q", b, err, content)
		}
	}
	fi, err := os.Lstat(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state.json is %v; want a plain file of mode 0600", fi.Mode())
	}
	names, _ := d.Names()
	if len(names) != 1 {
		t.Fatalf("directory holds %v; want state.json alone", names)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// WriteOut, for a file a user names: never through a link planted at
// the name, never into a FIFO (which would block) or other special
// file, whole or not at all, with its own mode whatever the old file's.
func TestWriteOutWritesOnlyARegularFile(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "plan.json")
	symlink(t, secret, link)
	if err := WriteOut(link, []byte("plan"), 0o600); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "a symbolic link") {
		t.Errorf("over a link: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "root's" {
		t.Errorf("the link's target was written: %q", b)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- WriteOut(fifo, []byte("plan"), 0o600) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "a FIFO") {
			t.Errorf("into a FIFO: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WriteOut blocked on a FIFO")
	}
	// Over a world-readable file: the new one is private.
	old := filepath.Join(dir, "old.json")
	if err := os.WriteFile(old, []byte("a much longer old content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteOut(old, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(old)
	if b, _ := os.ReadFile(old); err != nil || string(b) != "new" || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %q, %v, %v", old, b, fi.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("a temporary file was left: %s", e.Name())
		}
	}
}

// OutDir takes a directory the caller owns or creates, never a link to
// one nor another user's (root writing reports into it could be led by
// links planted inside).
func TestOutDirRefusesAnotherUsersDirectory(t *testing.T) {
	base := t.TempDir()
	fresh := filepath.Join(base, "a", "b")
	if err := OutDir(fresh); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(fresh); err != nil || !fi.IsDir() {
		t.Fatalf("not created: %v", err)
	}
	if err := OutDir(fresh); err != nil {
		t.Errorf("its own directory again: %v", err)
	}
	link := filepath.Join(base, "link")
	symlink(t, fresh, link)
	if err := OutDir(link); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "a symbolic link") {
		t.Errorf("a link: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory away")
	}
	theirs := filepath.Join(base, "theirs")
	mkdir(t, theirs, 0o755)
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := OutDir(theirs); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Errorf("another user's: %v", err)
	}
}
