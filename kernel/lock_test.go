package kernel

import (
	"testing"

	"sluice/records"
)

// Lock skips re-reading records that nobody rewrote since Open read
// them, and re-reads records another sluice saved meanwhile.
func TestLockRereadsChangedRecords(t *testing.T) {
	dir := t.TempDir()
	first := &records.File{Version: 1, Devices: map[string]*records.Tree{"eth0": {Interface: "eth0", Root: "1:"}}}
	if err := first.Save(dir); err != nil {
		t.Fatal(err)
	}
	mine, err := records.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := &Kernel{RecordsDir: dir, recs: mine}
	if err := k.Lock(0); err != nil {
		t.Fatal(err)
	}
	if k.recs != mine {
		t.Error("Lock read records nobody rewrote")
	}
	k.lock.Release()
	other := &records.File{Version: 1, Devices: map[string]*records.Tree{"eth1": {Interface: "eth1", Root: "1:"}}}
	if err := other.Save(dir); err != nil {
		t.Fatal(err)
	}
	if err := k.Lock(0); err != nil {
		t.Fatal(err)
	}
	defer k.lock.Release()
	if k.recs.Devices["eth1"] == nil || k.recs.Devices["eth0"] != nil {
		t.Errorf("Lock kept the stale records: %v", k.recs.Names())
	}
}
