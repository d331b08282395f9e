package kernel

import (
	"fmt"

	"sluice/bpf"
	"sluice/tc"
)

// ReadLimited reads back the live counterparts of objs, the classes,
// qdiscs and classifiers a limits change writes (in that order; nil
// where one is gone).
func (k *Kernel) ReadLimited(objs []tc.Object) ([]tc.Object, error) {
	defer k.conn.Pin()()
	out := make([]tc.Object, len(objs))
	for i, o := range objs {
		switch x := o.(type) {
		case *tc.Class:
			c, err := k.conn.Class(x.Dev, x.Handle)
			if err != nil {
				return nil, err
			}
			if c != nil {
				out[i] = c
			}
		case *tc.Qdisc:
			q, err := k.conn.QdiscAt(x.Dev, x.Parent)
			if err != nil {
				return nil, err
			}
			if q != nil {
				out[i] = q
			}
		case *bpf.Hook:
			g, err := k.hookFilterOf(x)
			if err != nil {
				return nil, err
			}
			if g == nil {
				continue
			}
			h, err := readHookProgram(x.Dev, x.Ingress, g)
			if err != nil {
				return nil, err
			}
			out[i] = h
		default:
			return nil, fmt.Errorf("%s: not something a limit applies to", o.Describe())
		}
	}
	return out, nil
}

// applyPatch is Executor.ApplyPatch.
func (k *Kernel) applyPatch(d *Diff) (*Result, error) {
	for _, c := range d.Changes {
		if c.Verb != tc.Change {
			return nil, fmt.Errorf("a patch cannot %s %s", c.Verb, c.Obj.Describe())
		}
	}
	defer patchFaults(k)()
	return k.apply(d)
}

// PlannedDiffer reports whether two planned versions of one object
// differ in anything the kernel holds (their fingerprints differ).
func PlannedDiffer(a, b tc.Object) bool { return a != b && fingerprintOf(a) != fingerprintOf(b) }
