package bpf_test

import (
	"reflect"
	"testing"

	"sluice/bpf"
)

// Target stands for bpf2go's ClassifierTarget in the maps, so its
// layout must be the generated one's, field for field: a field added to
// struct target in sluice.h fails here until Target has it too.
func TestTargetLayout(t *testing.T) {
	ours, gen := reflect.TypeFor[bpf.Target](), reflect.TypeFor[bpf.ClassifierTarget]()
	if ours.Size() != gen.Size() || ours.NumField() != gen.NumField() {
		t.Fatalf("Target: %d bytes in %d fields; ClassifierTarget: %d in %d", ours.Size(), ours.NumField(), gen.Size(), gen.NumField())
	}
	for i := range gen.NumField() {
		a, b := ours.Field(i), gen.Field(i)
		if a.Name != b.Name || a.Offset != b.Offset || a.Type.Size() != b.Type.Size() || a.Type.Kind() != b.Type.Kind() {
			t.Errorf("field %d: %s %s at %d; generated %s %s at %d", i, a.Name, a.Type, a.Offset, b.Name, b.Type, b.Offset)
		}
	}
}
