package kernel

import (
	"fmt"
	"time"

	"sluice/bpf"
	"sluice/internal/writecap"
	"sluice/plan"
	"sluice/tc"
)

// The BPF hook: sluice's classifier and policers on clsact, loaded
// beside the tree's writes and attached after them.

func hookFilter(h *bpf.Hook) *tc.Filter {
	parent := tc.HandleEgressHook
	if h.Ingress {
		parent = tc.HandleIngressHook
	}
	return &tc.Filter{Dev: h.Dev, Parent: parent, Prio: h.Prio, Proto: tc.ProtoAll, Kind: "bpf"}
}

// attachHook loads the classifier, fills its maps, and only then
// attaches it, so that no packet sees it half-filled.
func (k *Kernel) attachHook(h *bpf.Hook) error {
	if err := k.conn.CountWrite("load bpf classifier for " + h.Dev); err != nil {
		return err
	}
	var prog *bpf.Program
	var err error
	if p := k.loads[h]; p != nil {
		delete(k.loads, h)
		<-p.done
		prog, err = p.prog, p.err
	} else if h.Content.RTT != nil {
		sib := k.rttSibling(h)
		prog, err = bpf.LoadShared(h.Content, sib)
		if sib != nil {
			sib.Close()
		}
	} else {
		prog, err = bpf.Load(h.Content)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", h.Dev, err)
	}
	defer prog.Close() // the filter keeps its own reference
	f := hookFilter(h)
	f.Handle = 1
	f.BPF = &tc.BPF{FD: prog.Writer(writecap.Token{}).FD(), Name: bpf.FilterName(), DA: true}
	return k.conn.FilterAdd(f)
}

// A preload is a classifier loaded and filled in the background.
type preload struct {
	done chan struct{}
	prog *bpf.Program
	err  error
}

// preloadHooks starts loading the classifiers d attaches: verifying
// the program and filling the maps of 10,000 hosts takes as long as
// writing a few thousand classes, and needs no lock the writes take.
func (k *Kernel) preloadHooks(d *Diff) {
	for _, c := range d.Changes {
		h, ok := c.Obj.(*bpf.Hook)
		if !ok || c.Verb != tc.Add || h.Content.RTT != nil {
			continue // one timing round trips loads when attached, beside its siblings
		}
		p := &preload{done: make(chan struct{})}
		if k.loads == nil {
			k.loads = map[*bpf.Hook]*preload{}
		}
		k.loads[h] = p
		go func() {
			defer close(p.done)
			p.prog, p.err = bpf.Load(h.Content)
		}()
	}
}

// rttSibling opens a live hook of h's interface whose round-trip maps
// h's program is to share (one of this version: the layout of the maps
// is the program's), or returns nil.
func (k *Kernel) rttSibling(h *bpf.Hook) *bpf.Program {
	for _, s := range h.Siblings {
		f, err := k.hookFilterOf(&bpf.Hook{Dev: s.Dev, Ingress: s.Ingress, Prio: plan.HookPrio})
		if err != nil || f == nil || f.BPF.Name != bpf.FilterName() {
			continue
		}
		p, err := bpf.Open(f.BPF.ID)
		if err != nil {
			continue
		}
		if p.FlowCap > 0 && p.FlowCap == h.Content.RTT.FlowsOrDefault() {
			return p // a sibling of another size is being replaced too
		}
		p.Close()
	}
	return nil
}

// dropPreloads closes the classifiers an apply loaded but did not
// attach (it failed before).
func (k *Kernel) dropPreloads() {
	for h, p := range k.loads {
		<-p.done
		if p.prog != nil {
			p.prog.Close()
		}
		delete(k.loads, h)
	}
}

// syncHook makes the live classifier with program id (from the
// readback) hold want, writing only what differs from base (nil:
// everything).
func (k *Kernel) syncHook(id uint32, want, base *bpf.Content) error {
	if err := k.conn.CountWrite("update bpf classifier maps"); err != nil {
		return err
	}
	prog, err := bpf.Open(id)
	if err != nil {
		return err
	}
	defer prog.Close()
	return prog.Writer(writecap.Token{}).Write(want, base)
}

// openHook opens sluice's classifier on dev's hook, or returns nil if
// there is none.
func (k *Kernel) openHook(dev string, ingress bool) (*bpf.Program, error) {
	g, err := k.hookFilterOf(&bpf.Hook{Dev: dev, Ingress: ingress, Prio: plan.HookPrio})
	if err != nil || g == nil {
		return nil, err
	}
	return bpf.Open(g.BPF.ID)
}

// hookFilterOf reads h's hook and returns sluice's classifier filter on
// it, or nil if there is none.
func (k *Kernel) hookFilterOf(h *bpf.Hook) (*tc.Filter, error) {
	f := hookFilter(h)
	fs, err := k.conn.Filters(f.Dev, f.Parent)
	if err != nil {
		return nil, err
	}
	return ourFilter(fs), nil
}

// ourFilter finds sluice's classifier among a hook's filters.
func ourFilter(fs []*tc.Filter) *tc.Filter {
	for _, f := range fs {
		if (f.Prio == plan.HookPrio || f.Prio == plan.LegacyHookPrio) && f.Kind == "bpf" && f.BPF != nil && bpf.IsOurs(f.BPF.Name) {
			return f
		}
	}
	return nil
}

// HostSwap is host entries of sluice's classifier on a device changed
// in place (plan.HostWrite, an agent's hosts_file edit): each entry
// must hold its value in Old, and gets the one in New. It is a change
// the executor carries out like any other (Kernel.ApplyPatch), one
// write per entry; its undo is the swap back.
type HostSwap struct {
	Hook     *bpf.Hook
	Old, New map[bpf.HostKey]bpf.Target
}

func (s *HostSwap) Key() string    { return s.Hook.Key() + "/hosts" }
func (s *HostSwap) Device() string { return s.Hook.Dev }
func (s *HostSwap) Describe() string {
	return fmt.Sprintf("host entries of the bpf classifier on %s %s: %d", s.Hook.Dev, s.Hook.Direction(), len(s.New))
}

// writeHosts is WriteHosts. A patch killed at any write is completed by
// the next apply or agent start (Executor says why).
func writeHosts(ns string, timeout time.Duration, writes []plan.HostWrite) (*Result, error) {
	if len(writes) == 0 {
		return &Result{}, nil
	}
	k, err := OpenBare(ns)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	if err := k.Lock(timeout); err != nil {
		return nil, err
	}
	return k.applyPatch(hostsDiff(writes))
}

// hostsDiff is the change that writes writes.
func hostsDiff(writes []plan.HostWrite) *Diff {
	d := &Diff{}
	for _, w := range writes {
		s := &HostSwap{Hook: w.Hook, Old: w.Old, New: w.New}
		d.Changes = append(d.Changes, Change{Op: tc.Op{Verb: tc.Change, Obj: s}, Old: &HostSwap{Hook: w.Hook, Old: w.New, New: w.Old}})
	}
	return d
}

// swapHosts writes s in the program on its hook.
func (k *Kernel) swapHosts(s *HostSwap) error {
	g, err := k.hookFilterOf(s.Hook)
	if err != nil {
		return err
	}
	if g == nil {
		return fmt.Errorf("%s: sluice's program is not there", s.Hook.Dev)
	}
	prog, err := bpf.Open(g.BPF.ID)
	if err != nil {
		return err
	}
	defer prog.Close()
	count := func() error { return k.conn.CountWrite("write a host entry on " + s.Hook.Dev) }
	if err := prog.Writer(writecap.Token{}).SwapHosts(s.Old, s.New, count); err != nil {
		return fmt.Errorf("%s: %w", s.Hook.Dev, err)
	}
	return nil
}
