package kernel

import "testing"

// Lock skips re-reading records that nobody rewrote since Open read
// them, and re-reads records another sluice saved meanwhile.
func TestStateUnchanged(t *testing.T) {
	dir := t.TempDir()
	if s, _ := LoadState(dir); s.Unchanged(dir) {
		t.Error("no records file: reported unchanged, so a file written later would be missed")
	}
	first := &State{Version: 1, Devices: map[string]*DevState{"eth0": {Interface: "eth0", Root: "1:"}}}
	if err := first.Save(dir); err != nil {
		t.Fatal(err)
	}
	mine, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !mine.Unchanged(dir) {
		t.Fatal("records just read reported changed")
	}
	// Another sluice saves the same size of records: still a change.
	other := &State{Version: 1, Devices: map[string]*DevState{"eth1": {Interface: "eth1", Root: "1:"}}}
	if err := other.Save(dir); err != nil {
		t.Fatal(err)
	}
	if mine.Unchanged(dir) {
		t.Fatal("records rewritten by another apply reported unchanged")
	}
	k := &Kernel{StateDir: dir, State: mine}
	if err := k.Lock(0); err != nil {
		t.Fatal(err)
	}
	defer k.lock.Release()
	if k.State.Devices["eth1"] == nil || k.State.Devices["eth0"] != nil {
		t.Errorf("Lock kept the stale records: %v", k.State.Names())
	}
}
