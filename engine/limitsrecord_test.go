package engine

import (
	"encoding/json"
	"testing"
	"time"

	"sluice/plan"
	"sluice/records"
	"sluice/units"
)

// The limits record carries every kind of limit key: a class's, an EDT
// aggregate's (target index) and an EDT group's host's (class name),
// through the file's own JSON and back.
func TestLimitsRecordKeepsEveryKey(t *testing.T) {
	l := plan.Limits{
		{Object: "class/eth0/1:10"}:                   {Rate: units.FromBits(5e6), Ceil: units.FromBits(10e6)},
		{Object: "bpf/eth0/egress", Target: 3}:        {Ceil: units.FromBits(20e6)},
		{Object: "bpf/eth0/egress", Host: "pods/a.b"}: {Ceil: units.FromBits(3e6)},
		{Object: "bpf/eth0/egress", Host: "pods/a.c"}: {Ceil: units.FromBits(4e6)},
	}
	now := time.Now()
	rec := limitsRecord(l, now.Add(time.Minute), nil)
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var file records.Limits
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Limits) != len(l) {
		t.Fatalf("the file holds %d limits, want %d: %s", len(file.Limits), len(l), b)
	}
	hosts := 0
	for _, e := range file.Limits {
		if e.Host != "" {
			hosts++
		}
	}
	if hosts != 2 {
		t.Errorf("the file holds %d host limits, want 2: %s", hosts, b)
	}
	if got := limitsInForce(rec, now); !got.Equal(l) {
		t.Errorf("limits back from the record %v, want %v", got, l)
	}
	if got := limitsInForce(rec, now.Add(2*time.Minute)); got != nil {
		t.Errorf("limits %v after the lease ended, want none", got)
	}
}
