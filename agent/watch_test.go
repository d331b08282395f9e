package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// A file written between a load and the read that follows it is not
// lost: the agent watches what the load read, without stamps, so the
// next polls read the file again (once it has settled) and find the
// edit.
func TestEditDuringLoadIsSeen(t *testing.T) {
	f := filepath.Join(t.TempDir(), "hosts.csv")
	os.WriteFile(f, []byte("v1"), 0o644)
	a := &Agent{}
	base := &watched{files: []string{f}, data: [][]byte{[]byte("v1")}}
	w, err := a.watchFiles([]string{f})
	if err != nil {
		t.Fatal(err)
	}
	a.watched = unseen(w, base)
	if changed, _ := a.filesChanged(); changed {
		t.Fatal("nothing was written, yet a change was found")
	}

	os.WriteFile(f, []byte("v2"), 0o644) // after the load read v1
	w, _ = a.watchFiles([]string{f})
	a.watched = unseen(w, base)
	// Seen once settled: its stamp unchanged from one poll to the next.
	if changed, _ := a.filesChanged(); changed {
		t.Fatal("a file was read on the poll that first saw it move")
	}
	changed, now := a.filesChanged()
	if !changed || string(now.data[0]) != "v2" {
		t.Fatalf("the edit made during the load was missed: changed %v, read %q", changed, now.data[0])
	}
	// Watching w as read (what the agent did before) misses it.
	a.watched = w
	if changed, _ := a.filesChanged(); changed {
		t.Fatal("watching what was read after the load shows a change; the test above proves nothing")
	}
}
