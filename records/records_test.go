package records

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// Unchanged tells records just read from records another sluice saved
// since, even of the same size.
func TestUnchanged(t *testing.T) {
	dir := t.TempDir()
	if s, _ := Load(dir); s.Unchanged(dir) {
		t.Error("no records file: reported unchanged, so a file written later would be missed")
	}
	first := &File{Version: 1, Devices: map[string]*Tree{"eth0": {Interface: "eth0", Root: "1:"}}}
	if err := first.Save(dir); err != nil {
		t.Fatal(err)
	}
	mine, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !mine.Unchanged(dir) {
		t.Fatal("records just read reported changed")
	}
	// Another sluice saves the same size of records: still a change.
	other := &File{Version: 1, Devices: map[string]*Tree{"eth1": {Interface: "eth1", Root: "1:"}}}
	if err := other.Save(dir); err != nil {
		t.Fatal(err)
	}
	if mine.Unchanged(dir) {
		t.Fatal("records rewritten by another apply reported unchanged")
	}
}

// A namespace without a records directory (a new one, or any after a
// reboot empties /run) reads as "nothing recorded" through every reader:
// no nil directory reaches a caller (AgentRunning once dereferenced one,
// and show, munin and munin autoconf panicked).
func TestNoRecordsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "netns", "new")
	if AgentRunning(dir) {
		t.Error("AgentRunning: true without a directory")
	}
	if _, err := ReadAgentFile(dir, "agent.json"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadAgentFile: %v, want not-exist", err)
	}
	if s, err := Load(dir); err != nil || len(s.Devices) != 0 {
		t.Errorf("Load: %v, %v", s, err)
	}
	if r, err := LoadLimits(dir); err != nil || r != nil {
		t.Errorf("LoadLimits: %v, %v", r, err)
	}
	if err := SaveLimits(dir, nil); err != nil {
		t.Errorf("SaveLimits(nil): %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a reader made the directory: %v", err)
	}
}

// A namespace's records live under the base's netns directory; the
// current namespace's at the base itself. Dir takes the base from
// SLUICE_STATE_DIR, else DefaultDir; DirIn is given it.
func TestDir(t *testing.T) {
	for _, c := range []struct{ base, ns, want string }{
		{"/s", "", "/s"},
		{"/s", "blue", "/s/netns/blue"},
		{DefaultDir, "blue", "/run/sluice/netns/blue"},
	} {
		if got := DirIn(c.base, c.ns); got != c.want {
			t.Errorf("DirIn(%q, %q) = %q, want %q", c.base, c.ns, got, c.want)
		}
	}
	t.Setenv("SLUICE_STATE_DIR", "")
	if got := Dir("blue"); got != "/run/sluice/netns/blue" {
		t.Errorf("Dir without SLUICE_STATE_DIR: %q", got)
	}
	t.Setenv("SLUICE_STATE_DIR", "/tmp/x")
	if got := Dir(""); got != "/tmp/x" {
		t.Errorf("Dir(\"\") with SLUICE_STATE_DIR=/tmp/x: %q", got)
	}
}

// A reader takes no lock: a Save that lands between its read of the
// state file and of the bulk file it names (Save then removes that
// bulk) makes it read again, and it gets the new records whole. A bulk
// file gone while the state file still names it is damage, reported.
func TestLoadWhileSaved(t *testing.T) {
	dir := t.TempDir()
	old := &File{Version: recordsVersion, Devices: map[string]*Tree{"eth0": {Interface: "eth0", Root: "1:"}}}
	if err := old.Save(dir); err != nil {
		t.Fatal(err)
	}
	saves := 0
	afterStateRead = func() {
		if saves < 2 { // twice: the second read is replaced under it too
			saves++
			next := &File{Version: recordsVersion, Devices: map[string]*Tree{"eth1": {Interface: "eth1", Root: "1:"}}}
			if err := next.Save(dir); err != nil {
				t.Error(err)
			}
		}
	}
	defer func() { afterStateRead = nil }()
	got, err := Load(dir)
	if err != nil {
		t.Fatalf("records saved while read: %v", err)
	}
	if saves != 2 || len(got.Devices) != 1 || got.Devices["eth1"] == nil {
		t.Errorf("after %d saves read %v, want the last records (eth1)", saves, got.Names())
	}

	// The bulk file removed, the state file unchanged: no retry helps.
	afterStateRead = nil
	names, _ := filepath.Glob(filepath.Join(dir, "state.*.bin"))
	if len(names) != 1 {
		t.Fatalf("bulk files %v, want one", names)
	}
	os.Remove(names[0])
	var re *Error
	if _, err := Load(dir); !errors.As(err, &re) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("records whose bulk file is gone: %v, want a records error saying so", err)
	}
}
