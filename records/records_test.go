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
