package kernel

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	ebpffeatures "github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"sluice/internal/writecap"
	"sluice/tc"
)

// Kinds is what creating each kind in a throwaway network namespace
// found (ProbeScratch).
type Kinds struct {
	Qdiscs, Classifiers, Actions map[string]bool
	// U32Mark: u32 honours skb->mark matches (CONFIG_CLS_U32_MARK).
	U32Mark bool
	// BPF is what loading, test-running and attaching a program found
	// (JIT and BTF are read, not probed: package features).
	BPF BPFReport
}

// BPFReport lists BPF capabilities.
type BPFReport struct {
	Syscall  bool     `json:"syscall"`
	JIT      bool     `json:"jit"`
	BTF      bool     `json:"btf"`
	SchedCLS bool     `json:"sched_cls"`
	TCX      bool     `json:"tcx"`
	Maps     []string `json:"maps"`
	SpinLock bool     `json:"spin_lock"`
	TestRun  bool     `json:"prog_test_run"`
	Problems []string `json:"problems,omitempty"`
}

// ProbeScratch learns which of the qdiscs, classifiers and actions the
// kernel has by creating each on a veth pair in a throwaway network
// namespace (never by reading config files, which may not match the
// running kernel or its modules), and what sluice's BPF needs by loading,
// test-running and attaching a program there. Its writes are in this
// package, the executor's, though no policy's objects are touched:
// the namespace is its own and goes with it (package features keeps
// the report).
func ProbeScratch(qdiscs, classifiers, actions []string) (*Kinds, error) {
	k := &Kinds{Qdiscs: map[string]bool{}, Classifiers: map[string]bool{}, Actions: map[string]bool{}}
	errc := make(chan error, 1)
	go func() {
		// The namespace switch is per thread: keep this goroutine on one
		// and never give the thread back to the scheduler.
		runtime.LockOSThread()
		errc <- probeInScratch(k, qdiscs, classifiers, actions)
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return k, nil
}

func probeInScratch(k *Kinds, qdiscs, classifiers, actions []string) error {
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	scratch, err := netns.New() // also moves this thread into it
	if err != nil {
		return fmt.Errorf("creating a scratch network namespace: %w", err)
	}
	defer func() {
		netns.Set(orig)
		scratch.Close()
	}()
	dup, err := netns.Get() // a second handle, for the Conn to own
	if err != nil {
		return err
	}
	rc, err := tc.OpenNS(dup)
	if err != nil {
		return err
	}
	defer rc.Close()
	c := rc.Writer(writecap.Token{}) // a scratch namespace's probe objects
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.NumTxQueues, attrs.NumRxQueues = "probe0", 2, 2
	if err := c.Links().LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "probe1"}); err != nil {
		return fmt.Errorf("creating a probe veth: %w", err)
	}
	for _, q := range qdiscs {
		parent := tc.HandleRoot
		if q == "ingress" || q == "clsact" {
			parent = tc.HandleIngress
		}
		ok, err := c.ProbeQdisc("probe0", parent, q)
		if err != nil {
			return err
		}
		k.Qdiscs[q] = ok
	}
	hook := &tc.Qdisc{Dev: "probe0", Parent: tc.HandleIngress, Handle: tc.MakeHandle(0xFFFF, 0), Kind: "ingress"}
	if k.Qdiscs["clsact"] {
		hook.Kind = "clsact"
	}
	if err := c.QdiscAdd(hook, false); err == nil {
		for i, kind := range classifiers {
			ok, err := c.ProbeFilter("probe0", tc.HandleIngressHook, uint16(100+i), kind)
			if err != nil {
				return err
			}
			k.Classifiers[kind] = ok
		}
		k.U32Mark = probeU32Mark(c)
	}
	for _, a := range actions {
		k.Actions[a] = c.ProbeAction(a)
	}
	probeBPF(&k.BPF, c)
	return nil
}

// probeU32Mark adds a u32 node with a mark and reads it back: kernels
// without CONFIG_CLS_U32_MARK accept the attribute and silently ignore it.
func probeU32Mark(c *tc.Writer) bool {
	f := &tc.Filter{Dev: "probe0", Parent: tc.HandleIngressHook, Prio: 7, Proto: tc.ProtoAll, Kind: "u32",
		Handle: 1, U32: &tc.U32{Sel: &tc.Sel{Keys: []tc.Key{{}}}, Mark: &tc.Mark{Val: 0x5, Mask: 0xff}}}
	if c.FilterAdd(f) != nil {
		return false
	}
	fs, err := c.Filters("probe0", tc.HandleIngressHook)
	if err != nil {
		return false
	}
	for _, g := range fs {
		if g.Prio == 7 && !g.IsTP() && g.U32 != nil && g.U32.Mark != nil && g.U32.Mark.Val == 5 {
			return true
		}
	}
	return false
}

func probeBPF(b *BPFReport, c *tc.Writer) {
	note := func(what string, err error) bool {
		if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			b.Problems = append(b.Problems, fmt.Sprintf("%s: %v", what, err))
		}
		return err == nil
	}
	b.SchedCLS = note("sched_cls programs", ebpffeatures.HaveProgramType(ebpf.SchedCLS))
	b.Syscall = b.SchedCLS || note("bpf syscall", ebpffeatures.HaveMapType(ebpf.Array))
	for _, m := range []ebpf.MapType{ebpf.Hash, ebpf.Array, ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LPMTrie} {
		if note(m.String(), ebpffeatures.HaveMapType(m)) {
			b.Maps = append(b.Maps, m.String())
		}
	}
	b.SpinLock = note("bpf_spin_lock", ebpffeatures.HaveProgramHelper(ebpf.SchedCLS, asm.FnSpinLock))
	if !b.SchedCLS {
		return
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
		License:      "GPL",
	})
	if !note("loading a sched_cls program", err) {
		return
	}
	defer prog.Close()
	ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
	b.TestRun = err == nil && ret == 0xFFFFFFFF
	if idx, err := c.IfIndex("probe0"); err == nil {
		l, err := link.AttachTCX(link.TCXOptions{Interface: idx, Program: prog, Attach: ebpf.AttachTCXIngress})
		if err == nil {
			b.TCX = true
			l.Close()
		}
	}
}
