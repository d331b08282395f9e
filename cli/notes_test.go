package cli

import (
	"fmt"
	"strings"
	"testing"

	"sluice/plan"
	"sluice/units"
)

// A group's controller may have thousands of hosts: its note names the
// first few and counts the rest, prod children alike.
func TestControllerNoteListsSome(t *testing.T) {
	ctl := plan.Controller{Owner: "subs:acme", Quantum: 1e9, Capacity: units.FromBits(50e6)}
	for i := range 20 {
		ctl.Children = append(ctl.Children, plan.Controlled{Name: fmt.Sprintf("subs/h%d", i), Weight: 1, Prod: i >= 10})
	}
	notes := controllerNotes(&plan.Plan{Devices: []*plan.Device{{Interface: "eth0", Dir: "egress", Controllers: []plan.Controller{ctl}}}})
	if len(notes) != 1 {
		t.Fatalf("notes %q, want one", notes)
	}
	n := notes[0]
	for _, want := range []string{"the children of subs:acme", "subs/h0 1, ", "subs/h7 1 and 2 more", "subs/h10, ", "subs/h17 and 2 more (prio 0)"} {
		if !strings.Contains(n, want) {
			t.Errorf("note %q lacks %q", n, want)
		}
	}
	if strings.Contains(n, "subs/h8") || strings.Contains(n, "subs/h18") {
		t.Errorf("note %q lists more than 8 of each", n)
	}
}
