package kernel

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"sluice/bpf"
	"sluice/tc"
)

// Executing a diff: writes in an order the kernel accepts, held and
// sent together, undone in reverse when one fails.

// Result reports what an apply did.
type Result struct {
	Changes int
	Writes  int
}

// ApplyError is a failed apply; RolledBack says whether the starting
// state was restored.
type ApplyError struct {
	Err         error
	Step        int
	Op          string
	RolledBack  bool
	RollbackErr error
	// Vanished names devices that disappeared during the apply: what
	// sluice had on them went with them, so there was nothing to undo.
	Vanished []string
}

func (e *ApplyError) Error() string {
	s := fmt.Sprintf("step %d (%s) failed: %v", e.Step, e.Op, e.Err)
	if len(e.Vanished) > 0 {
		s += fmt.Sprintf("; device %s disappeared meanwhile, and with it everything on it", strings.Join(e.Vanished, ", "))
	}
	if e.RolledBack {
		return s + "; rolled back, nothing changed"
	}
	return s + fmt.Sprintf("; ROLLBACK FAILED, the kernel is in between: %v (run `sluice apply` again or `sluice reset`)", e.RollbackErr)
}

// RollbackError summarizes the undo steps that failed.
type RollbackError struct {
	Failed int
	First  []error // up to three
}

func (e *RollbackError) Error() string {
	var parts []string
	for _, err := range e.First {
		parts = append(parts, err.Error())
	}
	s := strings.Join(parts, "; ")
	if e.Failed > len(e.First) {
		s += fmt.Sprintf(" (and %d more)", e.Failed-len(e.First))
	}
	return fmt.Sprintf("%d undo step(s) failed: %s", e.Failed, s)
}

func (e *ApplyError) Unwrap() error { return e.Err }

// apply carries out d. When a step fails it undoes the steps before it,
// in reverse, and returns an *ApplyError.
//
// Runs of qdisc, class and filter changes go to the kernel many to a
// send (tc.Writer.Hold). The kernel carries on after a failed message, so
// a failure can leave later changes of its send applied: every change
// the kernel accepted is undone, before and after the failed one.
func (k *Kernel) apply(d *Diff) (*Result, error) {
	defer k.conn.Pin()()
	start := k.conn.Writes()
	var (
		undo [][]tc.Op
		// Changes whose writes are held, with their undo and how many
		// writes each made (0: nothing to send, done).
		pending []pendingChange
	)
	k.preloadHooks(d)
	defer k.dropPreloads()
	k.conn.Hold()
	defer k.conn.Release()
	fail := func(step int, err error) error {
		c := d.Changes[step]
		ae := &ApplyError{Err: err, Step: step + 1, Op: c.Verb.String() + " " + c.Obj.Describe()}
		k.conn.Release()
		ae.Vanished, ae.RollbackErr = k.rollback(undo)
		ae.RolledBack = ae.RollbackErr == nil
		if dev := c.Obj.Device(); !slices.Contains(ae.Vanished, dev) && !k.conn.LinkExists(dev) {
			if l, isLink := c.Obj.(*tc.Link); !isLink || c.Verb != tc.Add || l.Name != dev {
				ae.Vanished = append(ae.Vanished, dev)
			}
		}
		return ae
	}
	// flush sends what is held and files each change's undo, or fails
	// at the first change the kernel refused.
	flush := func() error {
		errs := k.conn.Flush()
		first, firstErr := -1, error(nil)
		for _, p := range pending {
			var err error
			if p.writes > 0 {
				err, errs = errs[0], errs[1:]
			}
			if err != nil {
				if first < 0 {
					first, firstErr = p.step, err
				}
				continue
			}
			undo = append(undo, p.undo)
		}
		pending = pending[:0]
		if first >= 0 {
			return fail(first, firstErr)
		}
		return nil
	}
	for i, c := range d.Changes {
		if !holdable(c) {
			if err := flush(); err != nil {
				return nil, err
			}
			k.conn.Release()
			u, err := k.exec(c)
			if err != nil {
				return nil, fail(i, err)
			}
			undo = append(undo, u)
			k.conn.Hold()
			continue
		}
		before := k.conn.Held()
		u, err := k.exec(c)
		if err != nil {
			// Refused before reaching the kernel (encoding, an
			// injected fault): what is held goes first, so that it
			// is undone too.
			if ferr := flush(); ferr != nil {
				return nil, ferr
			}
			return nil, fail(i, err)
		}
		pending = append(pending, pendingChange{step: i, undo: u, writes: k.conn.Held() - before})
		if k.conn.Held() >= tc.MaxSend {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return &Result{Changes: len(d.Changes), Writes: k.conn.Writes() - start}, nil
}

type pendingChange struct {
	step   int
	undo   []tc.Op
	writes int
}

// holdable reports whether c is one netlink write (or none) that may
// wait in a send: links and BPF programs go at once.
func holdable(c Change) bool {
	k := kindOf(c.Obj)
	return k != nil && k.holdable()
}

// rollback undoes, in reverse, what an apply did. Undo steps on a
// device that has disappeared are moot (its objects went with it) and
// are skipped; it returns the devices that did.
func (k *Kernel) rollback(undo [][]tc.Op) ([]string, error) {
	hook := k.conn.BeforeWrite
	k.conn.BeforeWrite = nil
	defer func() { k.conn.BeforeWrite = hook }()
	gone := map[string]bool{}
	var vanished []string
	rb := &RollbackError{}
	for i := len(undo) - 1; i >= 0; i-- {
		for _, op := range undo[i] {
			dev := op.Obj.Device()
			if gone[dev] {
				continue
			}
			err := k.do(op)
			if err == nil {
				continue
			}
			if !k.conn.LinkExists(dev) {
				if _, isLink := op.Obj.(*tc.Link); !isLink || op.Verb != tc.Delete {
					vanished = append(vanished, dev)
				}
				gone[dev] = true
				continue
			}
			rb.Failed++
			if len(rb.First) < 3 {
				rb.First = append(rb.First, err)
			}
		}
	}
	sort.Strings(vanished)
	if rb.Failed > 0 {
		return vanished, rb
	}
	return vanished, nil
}

// exec performs one change and returns the operations that undo it.
func (k *Kernel) exec(c Change) ([]tc.Op, error) {
	if h, ok := c.Obj.(*bpf.Hook); ok && c.Verb == tc.Change {
		// Write only what differs; undo writes the old content back.
		old := c.Old.(*bpf.Hook)
		if err := k.syncHook(old.ProgID, h.Content, old.Content); err != nil {
			return nil, err
		}
		back := *old
		back.Base = h.Content
		return []tc.Op{{Verb: tc.Change, Obj: &back}}, nil
	}
	if err := k.do(c.Op); err != nil {
		return nil, err
	}
	switch c.Verb {
	case tc.Add:
		return []tc.Op{{Verb: tc.Delete, Obj: c.Obj}}, nil
	case tc.Change:
		return []tc.Op{{Verb: tc.Change, Obj: c.Old}}, nil
	}
	// Delete: re-create the object and what the kernel took with it.
	u := []tc.Op{{Verb: tc.Add, Obj: c.Old}}
	for _, o := range c.Implied {
		u = append(u, tc.Op{Verb: tc.Add, Obj: o})
	}
	return u, nil
}

// do performs one operation.
func (k *Kernel) do(op tc.Op) error {
	if kd := kindOf(op.Obj); kd != nil {
		return kd.do(k, op)
	}
	return fmt.Errorf("cannot %s %s", op.Verb, op.Obj.Describe())
}
