package tc

// The codec encodes and decodes tc objects on top of vishvananda/netlink's
// message primitives (nl.NetlinkRequest, nl.RtAttr, nl.ParseRouteAttr).
// The library's own typed qdisc/class/filter API is not used for tc
// objects because it drops information sluice must compare exactly: fifo
// limits, u32 marks and hash-table attributes, HTB extended statistics,
// and the kernel's warnings. This file is the one place that knows the
// wire layout.

import (
	"sluice/units"
	"sync/atomic"

	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// native is the byte order of netlink's attributes: the host's (big on
// mips, little elsewhere).
var native = binary.NativeEndian

const (
	tcaKind    = nl.TCA_KIND
	tcaOptions = nl.TCA_OPTIONS
	tcaStats2  = nl.TCA_STATS2

	linkLayerEthernet = 1
	htbVersion        = 3
	tcaEgressRedir    = 1  // TCA_EGRESS_REDIR
	tcActStolen       = 4  // TC_ACT_STOLEN
	tcaFqPlimit       = 1  // TCA_FQ_PLIMIT
	tcaFqFlowPlimit   = 2  // TCA_FQ_FLOW_PLIMIT
	tcaFqOrphanMask   = 10 // TCA_FQ_ORPHAN_MASK
	tcaCakeRTT        = 7  // TCA_CAKE_RTT
	tcaCakeTarget     = 8  // TCA_CAKE_TARGET
	tcaCakeSplitGSO   = 17 // TCA_CAKE_SPLIT_GSO
	tcaTbfParms       = 1  // TCA_TBF_PARMS
	tcaTbfRate64      = 4  // TCA_TBF_RATE64
	tcaTbfBurst       = 6  // TCA_TBF_BURST
)

func tcmsg(ifindex int, handle, parent, info uint32) *nl.TcMsg {
	return &nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex), Handle: handle, Parent: parent, Info: info}
}

func u32attr(t int, v uint32) *nl.RtAttr {
	b := make([]byte, 4)
	native.PutUint32(b, v)
	return nl.NewRtAttr(t, b)
}

func u64attr(t int, v uint64) *nl.RtAttr {
	b := make([]byte, 8)
	native.PutUint64(b, v)
	return nl.NewRtAttr(t, b)
}

// --- qdiscs ---------------------------------------------------------------

func qdiscOptions(q *Qdisc) (*nl.RtAttr, error) {
	switch q.Kind {
	case "htb":
		o := nl.NewRtAttr(tcaOptions|unix.NLA_F_NESTED, nil)
		r2q, def := uint32(10), uint32(0) // tc's defaults
		if q.HTB != nil {
			if q.HTB.R2Q != 0 {
				r2q = q.HTB.R2Q
			}
			def = q.HTB.Default
		}
		b := make([]byte, 20)
		native.PutUint32(b[0:], htbVersion)
		native.PutUint32(b[4:], r2q)
		native.PutUint32(b[8:], def)
		o.AddRtAttr(nl.TCA_HTB_INIT, b)
		return o, nil
	case "pfifo", "bfifo":
		if q.Fifo == nil || q.Fifo.Limit == 0 {
			return nil, nil
		}
		b := make([]byte, 4)
		native.PutUint32(b, q.Fifo.Limit)
		return nl.NewRtAttr(tcaOptions, b), nil
	case "fq_codel":
		o := nl.NewRtAttr(tcaOptions|unix.NLA_F_NESTED, nil)
		if q.FqCodel != nil {
			if q.FqCodel.Limit != 0 {
				o.AddChild(u32attr(nl.TCA_FQ_CODEL_LIMIT, q.FqCodel.Limit))
			}
			if q.FqCodel.Flows != 0 {
				o.AddChild(u32attr(nl.TCA_FQ_CODEL_FLOWS, q.FqCodel.Flows))
			}
			if q.FqCodel.Target != 0 {
				o.AddChild(u32attr(nl.TCA_FQ_CODEL_TARGET, q.FqCodel.Target))
			}
			if q.FqCodel.Interval != 0 {
				o.AddChild(u32attr(nl.TCA_FQ_CODEL_INTERVAL, q.FqCodel.Interval))
			}
		}
		return o, nil
	case "sfq":
		// struct tc_sfq_qopt: quantum, perturb_period, limit, divisor, flows.
		b := make([]byte, 20)
		if q.Sfq != nil {
			native.PutUint32(b[4:], uint32(q.Sfq.Perturb))
			native.PutUint32(b[8:], q.Sfq.Limit)
		}
		return nl.NewRtAttr(tcaOptions, b), nil
	case "fq":
		o := nl.NewRtAttr(tcaOptions|unix.NLA_F_NESTED, nil)
		if q.Fq != nil && q.Fq.Limit != 0 {
			o.AddChild(u32attr(tcaFqPlimit, q.Fq.Limit))
		}
		if q.Fq != nil && q.Fq.FlowLimit != 0 {
			o.AddChild(u32attr(tcaFqFlowPlimit, q.Fq.FlowLimit))
		}
		if q.Fq != nil && q.Fq.OrphanMask != 0 {
			o.AddChild(u32attr(tcaFqOrphanMask, q.Fq.OrphanMask))
		}
		return o, nil
	case "mqprio":
		if q.MQPrio == nil {
			return nil, fmt.Errorf("qdisc mqprio: no queue mapping")
		}
		return nl.NewRtAttr(tcaOptions, encodeMQPrio(q.MQPrio)), nil
	case "cake":
		o := nl.NewRtAttr(tcaOptions|unix.NLA_F_NESTED, nil)
		if q.Cake != nil && q.Cake.SplitGSO {
			o.AddChild(u32attr(tcaCakeSplitGSO, 1))
		}
		if q.Cake != nil && q.Cake.RTT != 0 {
			o.AddChild(u32attr(tcaCakeRTT, q.Cake.RTT))
			t := q.Cake.Target
			if t == 0 {
				t = CakeTarget(q.Cake.RTT)
			}
			o.AddChild(u32attr(tcaCakeTarget, t))
		}
		return o, nil
	case "tbf":
		if q.Tbf == nil {
			return nil, fmt.Errorf("qdisc tbf: no rate")
		}
		// struct tc_tbf_qopt: rate(12) peakrate(12) limit buffer mtu;
		// the burst in bytes too (TCA_TBF_BURST), as tc sends it.
		o := nl.NewRtAttr(tcaOptions|unix.NLA_F_NESTED, nil)
		b := make([]byte, 36)
		rateSpec(b[0:12], q.Tbf.Rate)
		native.PutUint32(b[24:], q.Tbf.Limit)
		native.PutUint32(b[28:], XmitTicks(q.Tbf.Rate, q.Tbf.Burst))
		o.AddRtAttr(tcaTbfParms, b)
		if q.Tbf.Rate >= 1<<32 {
			o.AddChild(u64attr(tcaTbfRate64, uint64(q.Tbf.Rate)))
		}
		o.AddChild(u32attr(tcaTbfBurst, q.Tbf.Burst))
		return o, nil
	case "clsact", "ingress", "pfifo_fast", "noqueue", "mq", "prio", "netem", "codel", "hfsc", "drr":
		return nil, nil
	}
	return nil, fmt.Errorf("qdisc kind %q: sluice cannot encode it", q.Kind)
}

// struct tc_mqprio_qopt: num_tc, prio_tc_map[16], hw, count[16],
// offset[16] (u16, from byte 18).
const mqprioOptLen = 82

func encodeMQPrio(m *MQPrio) []byte {
	b := make([]byte, mqprioOptLen)
	b[0] = m.NumTC
	copy(b[1:17], m.Map[:])
	for i := 0; i < 16; i++ {
		native.PutUint16(b[18+2*i:], m.Count[i])
		native.PutUint16(b[50+2*i:], m.Offset[i])
	}
	return b
}

func decodeMQPrio(b []byte) *MQPrio {
	if len(b) < mqprioOptLen {
		return nil
	}
	m := &MQPrio{NumTC: b[0]}
	copy(m.Map[:], b[1:17])
	for i := 0; i < 16; i++ {
		m.Count[i] = native.Uint16(b[18+2*i:])
		m.Offset[i] = native.Uint16(b[50+2*i:])
	}
	return m
}

// QdiscAdd creates q; with replace it may displace whatever sits at q's
// parent (HTB's default pfifo leaf, or a root qdisc when forced).
func (c *Writer) QdiscAdd(q *Qdisc, replace bool) error {
	flags := unix.NLM_F_CREATE | unix.NLM_F_EXCL
	if replace {
		flags = unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	}
	return c.qdiscModify(unix.RTM_NEWQDISC, flags, q, "qdisc add")
}

// QdiscChange changes q's options in place.
func (c *Writer) QdiscChange(q *Qdisc) error {
	return c.qdiscModify(unix.RTM_NEWQDISC, 0, q.forChange(), "qdisc change")
}

// QdiscDel deletes the qdisc at q's parent.
func (c *Writer) QdiscDel(q *Qdisc) error {
	return c.qdiscModify(unix.RTM_DELQDISC, 0, q, "qdisc del")
}

func (c *Conn) qdiscModify(typ, flags int, q *Qdisc, what string) error {
	idx, err := c.IfIndex(q.Dev)
	if err != nil {
		return err
	}
	handle := uint32(q.Handle)
	if q.Parent == HandleIngress {
		handle = 0xFFFF0000
	}
	req := c.request(typ, flags|unix.NLM_F_ACK)
	req.AddData(tcmsg(idx, handle, uint32(q.Parent), 0))
	if typ != unix.RTM_DELQDISC {
		req.AddData(nl.NewRtAttr(tcaKind, nl.ZeroTerminated(q.Kind)))
		opts, err := qdiscOptions(q)
		if err != nil {
			return err
		}
		// HTB has no change operation: a change of a root HTB carries
		// its size table alone (the kernel takes a change without
		// options and replaces the table, or removes it when absent).
		if opts != nil && !(flags == 0 && q.Kind == "htb") {
			req.AddData(opts)
		}
		if q.Stab != nil {
			req.AddData(q.Stab.attr())
		}
	}
	return c.write(req, what+" "+q.Dev+" "+q.Parent.String())
}

func (c *Conn) write(req *nl.NetlinkRequest, what string) error {
	if err := c.countWrite(what); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if c.held != nil {
		c.hold(req, what)
		return nil
	}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// --- classes --------------------------------------------------------------

func rateSpec(b []byte, rate units.Rate) {
	// struct tc_ratespec: cell_log u8, linklayer u8, overhead u16,
	// cell_align s16, mpu u16, rate u32. tc sends cell_align -1.
	b[1] = linkLayerEthernet
	native.PutUint16(b[4:], 0xFFFF)
	r := rate
	if r >= 1<<32 {
		r = 0xFFFFFFFF
	}
	native.PutUint32(b[8:], uint32(r))
}

func htbClassOptions(cl *Class) *nl.RtAttr {
	o := nl.NewRtAttr(tcaOptions|unix.NLA_F_NESTED, nil)
	// struct tc_htb_opt: rate(12) ceil(12) buffer cbuffer quantum level prio.
	b := make([]byte, 44)
	rateSpec(b[0:12], cl.Rate)
	rateSpec(b[12:24], cl.Ceil)
	// Objects read back from the kernel carry their exact ticks; use
	// them so that a rollback restores the very same value.
	buf, cbuf := cl.BufferTicks, cl.CbufferTicks
	if buf == 0 {
		buf = XmitTicks(cl.Rate, cl.Burst)
	}
	if cbuf == 0 {
		cbuf = XmitTicks(cl.Ceil, cl.Cburst)
	}
	native.PutUint32(b[24:], buf)
	native.PutUint32(b[28:], cbuf)
	native.PutUint32(b[32:], cl.Quantum)
	native.PutUint32(b[40:], cl.Prio)
	o.AddRtAttr(nl.TCA_HTB_PARMS, b)
	if cl.Rate >= 1<<32 {
		o.AddChild(u64attr(nl.TCA_HTB_RATE64, uint64(cl.Rate)))
	}
	if cl.Ceil >= 1<<32 {
		o.AddChild(u64attr(nl.TCA_HTB_CEIL64, uint64(cl.Ceil)))
	}
	return o
}

// ClassAdd creates an HTB class.
func (c *Writer) ClassAdd(cl *Class) error {
	return c.classModify(unix.RTM_NEWTCLASS, unix.NLM_F_CREATE|unix.NLM_F_EXCL, cl, "class add")
}

// ClassChange changes an HTB class in place.
func (c *Writer) ClassChange(cl *Class) error {
	return c.classModify(unix.RTM_NEWTCLASS, 0, cl, "class change")
}

// ClassDel deletes a class (and its leaf qdisc).
func (c *Writer) ClassDel(cl *Class) error {
	return c.classModify(unix.RTM_DELTCLASS, 0, cl, "class del")
}

func (c *Conn) classModify(typ, flags int, cl *Class, what string) error {
	idx, err := c.IfIndex(cl.Dev)
	if err != nil {
		return err
	}
	req := c.request(typ, flags|unix.NLM_F_ACK)
	req.AddData(tcmsg(idx, uint32(cl.Handle), uint32(cl.Parent), 0))
	if typ != unix.RTM_DELTCLASS {
		req.AddData(nl.NewRtAttr(tcaKind, nl.ZeroTerminated("htb")))
		req.AddData(htbClassOptions(cl))
	}
	return c.write(req, what+" "+cl.Dev+" "+cl.Handle.String())
}

// --- filters --------------------------------------------------------------

func filterInfo(prio, proto uint16) uint32 {
	return uint32(prio)<<16 | uint32(proto>>8|proto<<8) // protocol in network order
}

// EncodeSel serialises a selector as struct tc_u32_sel.
func EncodeSel(s *Sel) []byte {
	b := make([]byte, 16+16*len(s.Keys))
	b[0] = s.Flags
	b[1] = s.Offshift
	b[2] = uint8(len(s.Keys))
	binary.BigEndian.PutUint16(b[4:], s.Offmask)
	native.PutUint16(b[6:], s.Off)
	native.PutUint16(b[8:], uint16(s.Offoff))
	native.PutUint16(b[10:], uint16(s.Hoff))
	binary.BigEndian.PutUint32(b[12:], s.Hmask)
	for i, k := range s.Keys {
		p := b[16+16*i:]
		binary.BigEndian.PutUint32(p[0:], k.Mask)
		binary.BigEndian.PutUint32(p[4:], k.Val&k.Mask)
		native.PutUint32(p[8:], uint32(k.Off))
		if k.NextHdr {
			native.PutUint32(p[12:], 0xFFFFFFFF)
		}
	}
	return b
}

// DecodeSel parses struct tc_u32_sel.
func DecodeSel(b []byte) (*Sel, error) {
	if len(b) < 16 {
		return nil, errors.New("short tc_u32_sel")
	}
	s := &Sel{
		Flags: b[0], Offshift: b[1],
		Offmask: binary.BigEndian.Uint16(b[4:]),
		Off:     native.Uint16(b[6:]),
		Offoff:  int16(native.Uint16(b[8:])),
		Hoff:    int16(native.Uint16(b[10:])),
		Hmask:   binary.BigEndian.Uint32(b[12:]),
	}
	n := int(b[2])
	if len(b) < 16+16*n {
		return nil, errors.New("short tc_u32_sel keys")
	}
	for i := 0; i < n; i++ {
		p := b[16+16*i:]
		s.Keys = append(s.Keys, Key{
			Mask:    binary.BigEndian.Uint32(p[0:]),
			Val:     binary.BigEndian.Uint32(p[4:]),
			Off:     int32(native.Uint32(p[8:])),
			NextHdr: native.Uint32(p[12:]) != 0,
		})
	}
	return s, nil
}

func (c *Conn) u32Options(f *Filter) (*nl.RtAttr, error) {
	u := f.U32
	o := nl.NewRtAttr(tcaOptions|unix.NLA_F_NESTED, nil)
	if u.Divisor > 0 {
		o.AddChild(u32attr(nl.TCA_U32_DIVISOR, u.Divisor))
		return o, nil
	}
	if u.Sel == nil {
		return nil, fmt.Errorf("u32 node %s has no selector", U32Handle(f.Handle))
	}
	sel := *u.Sel
	// u32 runs a node's classid and actions only when it is terminal.
	if u.ClassID != 0 || u.RedirectDev != "" {
		sel.Flags |= SelTerminal
	}
	o.AddRtAttr(nl.TCA_U32_SEL, EncodeSel(&sel))
	if t := U32HTID(f.Handle); t != 0 {
		o.AddChild(u32attr(nl.TCA_U32_HASH, f.Handle&0xFFFFF000))
	}
	if u.ClassID != 0 {
		o.AddChild(u32attr(nl.TCA_U32_CLASSID, uint32(u.ClassID)))
	}
	if u.Link != 0 {
		o.AddChild(u32attr(nl.TCA_U32_LINK, u.Link))
	}
	if u.Mark != nil {
		b := make([]byte, 12)
		native.PutUint32(b[0:], u.Mark.Val)
		native.PutUint32(b[4:], u.Mark.Mask)
		o.AddRtAttr(nl.TCA_U32_MARK, b)
	}
	if u.RedirectDev != "" {
		idx, err := c.IfIndex(u.RedirectDev)
		if err != nil {
			return nil, err
		}
		acts := o.AddRtAttr(nl.TCA_U32_ACT|unix.NLA_F_NESTED, nil)
		a := acts.AddRtAttr(1|unix.NLA_F_NESTED, nil)
		a.AddRtAttr(nl.TCA_ACT_KIND, nl.ZeroTerminated("mirred"))
		ao := a.AddRtAttr(nl.TCA_ACT_OPTIONS|unix.NLA_F_NESTED, nil)
		// struct tc_mirred: index capab action refcnt bindcnt eaction ifindex.
		b := make([]byte, 28)
		native.PutUint32(b[8:], tcActStolen)
		native.PutUint32(b[20:], tcaEgressRedir)
		native.PutUint32(b[24:], uint32(idx))
		ao.AddRtAttr(nl.TCA_MIRRED_PARMS, b)
	}
	return o, nil
}

// FilterAdd creates a u32 node or hash table (and its prio, if new).
func (c *Writer) FilterAdd(f *Filter) error {
	idx, err := c.IfIndex(f.Dev)
	if err != nil {
		return err
	}
	if f.Kind == "bpf" && f.BPF != nil {
		// cls_bpf, direct action: the program's verdict is the action.
		req := c.request(unix.RTM_NEWTFILTER, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
		req.AddData(tcmsg(idx, f.Handle, uint32(f.Parent), filterInfo(f.Prio, f.Proto)))
		req.AddData(nl.NewRtAttr(tcaKind, nl.ZeroTerminated(f.Kind)))
		opts := nl.NewRtAttr(tcaOptions, nil)
		opts.AddRtAttr(nl.TCA_BPF_FD, nl.Uint32Attr(uint32(f.BPF.FD)))
		opts.AddRtAttr(nl.TCA_BPF_NAME, nl.ZeroTerminated(f.BPF.Name))
		if f.BPF.DA {
			opts.AddRtAttr(nl.TCA_BPF_FLAGS, nl.Uint32Attr(nl.TCA_BPF_FLAG_ACT_DIRECT))
		}
		req.AddData(opts)
		return c.write(req, fmt.Sprintf("filter add %s %s prio %d bpf %s", f.Dev, f.Parent, f.Prio, f.BPF.Name))
	}
	if f.Kind != "u32" || f.U32 == nil {
		return fmt.Errorf("filter kind %q: sluice only creates u32 and bpf filters", f.Kind)
	}
	req := c.request(unix.RTM_NEWTFILTER, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(tcmsg(idx, f.Handle, uint32(f.Parent), filterInfo(f.Prio, f.Proto)))
	req.AddData(nl.NewRtAttr(tcaKind, nl.ZeroTerminated(f.Kind)))
	opts, err := c.u32Options(f)
	if err != nil {
		return err
	}
	req.AddData(opts)
	return c.write(req, fmt.Sprintf("filter add %s %s prio %d handle %s", f.Dev, f.Parent, f.Prio, U32Handle(f.Handle)))
}

// FilterDel deletes a node, a hash table (with its nodes) or, for handle
// 0, the whole prio.
func (c *Writer) FilterDel(f *Filter) error {
	idx, err := c.IfIndex(f.Dev)
	if err != nil {
		return err
	}
	if f.Prio == 0 {
		return errors.New("refusing to delete filters with prio 0 (that flushes the whole chain)")
	}
	h := f.Handle
	switch {
	case f.IsTP():
		h = 0 // handle 0 addresses the whole prio, not its root table
	case f.Raw != 0:
		h = f.Raw
	case !f.IsTP() && U32HTID(h) == 0:
		// A node of a root table created by this process: the kernel
		// chose the table id, so look it up.
		fs, err := c.Filters(f.Dev, f.Parent)
		if err != nil {
			return err
		}
		for _, g := range fs {
			if g.Prio == f.Prio && !g.IsTP() && g.Handle == f.Handle {
				h = g.Raw
			}
		}
	}
	what := fmt.Sprintf("filter del %s %s prio %d handle %s", f.Dev, f.Parent, f.Prio, U32Handle(h))
	if err := c.countWrite(what); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// A u32 hash table stays referenced until the kernel frees the nodes
	// that linked to it, after an RCU grace period: a table deleted right
	// after its last link node answers EBUSY for a few milliseconds.
	delay := 2 * time.Millisecond
	for deadline := time.Now().Add(3 * time.Second); ; delay *= 2 {
		req := c.request(unix.RTM_DELTFILTER, unix.NLM_F_ACK)
		req.AddData(tcmsg(idx, h, uint32(f.Parent), filterInfo(f.Prio, f.Proto)))
		if f.Kind != "" {
			req.AddData(nl.NewRtAttr(tcaKind, nl.ZeroTerminated(f.Kind)))
		}
		_, err := req.Execute(unix.NETLINK_ROUTE, 0)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			// Gone already: u32 removes a qdisc's last prio by itself
			// once its last node or table goes, and a prio whose first
			// element was never added does not exist.
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || U32Node(h) != 0 || time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", what, err)
		}
		time.Sleep(delay)
	}
}

// --- dumps ----------------------------------------------------------------

// dumpEach is dump for the hot path (the agent's counters): it reads
// the answers into the connection's buffer and calls fn with each one's
// payload in place, valid only during the call, instead of copying
// every message (10,000 classes a pass were 7 MB of garbage).
func (c *Conn) dumpEach(typ int, msg *nl.TcMsg, fn func(m []byte)) error {
	req := nl.NewNetlinkRequest(typ, unix.NLM_F_DUMP)
	req.AddData(msg)
	s := c.sock.Socket
	s.Lock()
	defer s.Unlock()
	req.Seq = atomic.AddUint32(&c.sock.Seq, 1)
	if err := s.Send(req); err != nil {
		return err
	}
	if c.rbuf == nil {
		c.rbuf = make([]byte, 1<<16)
	}
	want := uint16(typ - 2) // RTM_GETx -> RTM_NEWx
	intr := false
	for {
		n, err := recvWait(s.GetFd(), c.rbuf)
		if err != nil {
			return err
		}
		b := c.rbuf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(native.Uint32(b))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return errors.New("malformed netlink answer")
			}
			typ, flags, seq := native.Uint16(b[4:]), native.Uint16(b[6:]), native.Uint32(b[8:])
			body := b[unix.NLMSG_HDRLEN:l]
			b = b[min(nlmAlign(l), len(b)):]
			if seq != req.Seq {
				continue // an answer to an earlier request
			}
			intr = intr || flags&unix.NLM_F_DUMP_INTR != 0
			switch typ {
			case unix.NLMSG_DONE:
				if len(body) >= 4 {
					if e := int32(native.Uint32(body)); e < 0 {
						return syscall.Errno(-e)
					}
				}
				if intr {
					return nl.ErrDumpInterrupted
				}
				return nil
			case unix.NLMSG_ERROR:
				if len(body) >= 4 {
					if e := int32(native.Uint32(body)); e < 0 {
						return syscall.Errno(-e)
					}
				}
				return nil
			case want:
				fn(body)
			}
		}
	}
}

func (c *Conn) dump(typ int, msg *nl.TcMsg) ([][]byte, error) {
	req := c.request(typ, unix.NLM_F_DUMP)
	req.AddData(msg)
	res := typ - 2 // RTM_GETx -> RTM_NEWx
	msgs, err := req.Execute(unix.NETLINK_ROUTE, uint16(res))
	if err != nil && !errors.Is(err, nl.ErrDumpInterrupted) {
		return nil, err
	}
	return msgs, err
}

// eachAttr calls fn with each attribute of b (its type without the
// nested flag), stopping at the first that does not fit: the library's
// parser panics on a length that lies.
func eachAttr(b []byte, fn func(typ uint16, v []byte)) {
	for len(b) >= unix.SizeofRtAttr {
		l := int(native.Uint16(b))
		if l < unix.SizeofRtAttr || l > len(b) {
			return
		}
		fn(native.Uint16(b[2:])&^unix.NLA_F_NESTED, b[unix.SizeofRtAttr:l:l])
		next := (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if next >= len(b) {
			return
		}
		b = b[next:]
	}
}

// attrTable fills t with b's attributes by type (those of a type past
// t's end are skipped), without allocating: the counters of 10,000
// classes are decoded every pass.
func attrTable(b []byte, t [][]byte) {
	clear(t)
	eachAttr(b, func(typ uint16, v []byte) {
		if int(typ) < len(t) {
			t[typ] = v
		}
	})
}

func parseAttrs(b []byte) map[uint16][]byte {
	m := map[uint16][]byte{}
	eachAttr(b, func(typ uint16, v []byte) { m[typ] = v })
	return m
}

// kindName is cstring for a qdisc or class kind, without allocating
// for the common ones.
func kindName(b []byte) string {
	switch string(b) {
	case "htb\x00":
		return "htb"
	case "fq\x00":
		return "fq"
	}
	return cstring(b)
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// Qdiscs lists the qdiscs on dev.
func (c *Conn) Qdiscs(dev string) ([]*Qdisc, error) {
	idx, err := c.IfIndex(dev)
	if err != nil {
		return nil, err
	}
	msgs, err := c.dump(unix.RTM_GETQDISC, tcmsg(idx, 0, 0, 0))
	if err != nil {
		return nil, fmt.Errorf("dump qdiscs of %s: %w", dev, err)
	}
	var out []*Qdisc
	for _, m := range msgs {
		if q := decodeQdisc(dev, idx, m); q != nil {
			out = append(out, q)
		}
	}
	return out, nil
}

func decodeQdisc(dev string, idx int, m []byte) *Qdisc {
	tm := nl.DeserializeTcMsg(m)
	if int(tm.Ifindex) != idx {
		return nil
	}
	a := parseAttrs(m[tm.Len():])
	q := &Qdisc{Dev: dev, Parent: Handle(tm.Parent), Handle: Handle(tm.Handle), Kind: cstring(a[tcaKind])}
	if q.Parent == HandleIngress {
		q.Handle = MakeHandle(0xFFFF, 0)
	}
	decodeQdiscOptions(q, a[tcaOptions])
	q.Stab = decodeStab(a[tcaStab])
	q.Stats, _ = decodeStats(a[tcaStats2])
	return q
}

// get sends one RTM_GET request for a single object and returns the
// kernel's answer, or nil if there is no such object.
//
// The kernel answers a tc get only with NLM_F_ECHO (it "notifies" the
// requester), and not at all for the kernel's built-in qdiscs: hence the
// ACK as well, which ends the wait when no answer comes. An ACK left
// behind after an answer is skipped by the next request (another seq).
func (c *Conn) get(typ int, msg *nl.TcMsg) ([]byte, error) {
	req := c.request(typ, unix.NLM_F_ECHO|unix.NLM_F_ACK)
	req.AddData(msg)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, uint16(typ-2))
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL):
		return nil, nil
	case err != nil:
		return nil, err
	case len(msgs) == 0:
		return nil, nil
	case len(msgs) != 1:
		return nil, fmt.Errorf("%d answers to one get", len(msgs))
	}
	return msgs[0], nil
}

// QdiscAt reads the qdisc attached at parent on dev (the root, the
// ingress hook, or a class's leaf), or nil if none is there. A class's
// default pfifo comes back with handle 0.
func (c *Conn) QdiscAt(dev string, parent Handle) (*Qdisc, error) {
	idx, err := c.IfIndex(dev)
	if err != nil {
		return nil, err
	}
	m, err := c.get(unix.RTM_GETQDISC, tcmsg(idx, 0, uint32(parent), 0))
	if err != nil || m == nil {
		return nil, err
	}
	q := decodeQdisc(dev, idx, m)
	if q != nil && q.Parent == HandleRoot {
		q.Parent = parent // the kernel reports a leaf's parent as is, the root as root
	}
	return q, nil
}

func decodeQdiscOptions(q *Qdisc, opts []byte) {
	switch q.Kind {
	case "htb":
		a := parseAttrs(opts)
		if b := a[nl.TCA_HTB_INIT]; len(b) >= 20 {
			q.HTB = &HTBQdisc{R2Q: native.Uint32(b[4:]), Default: native.Uint32(b[8:])}
		}
	case "pfifo", "bfifo":
		if len(opts) >= 4 {
			q.Fifo = &Fifo{Limit: native.Uint32(opts)}
		}
	case "fq_codel":
		a := parseAttrs(opts)
		q.FqCodel = &FqCodel{}
		if b := a[nl.TCA_FQ_CODEL_LIMIT]; len(b) >= 4 {
			q.FqCodel.Limit = native.Uint32(b)
		}
		if b := a[nl.TCA_FQ_CODEL_FLOWS]; len(b) >= 4 {
			q.FqCodel.Flows = native.Uint32(b)
		}
		if b := a[nl.TCA_FQ_CODEL_TARGET]; len(b) >= 4 {
			q.FqCodel.Target = codelFromKernel(native.Uint32(b))
		}
		if b := a[nl.TCA_FQ_CODEL_INTERVAL]; len(b) >= 4 {
			q.FqCodel.Interval = codelFromKernel(native.Uint32(b))
		}
	case "sfq":
		if len(opts) >= 20 {
			q.Sfq = &Sfq{Perturb: int32(native.Uint32(opts[4:])), Limit: native.Uint32(opts[8:])}
		}
	case "fq":
		a := parseAttrs(opts)
		q.Fq = &Fq{}
		if b := a[tcaFqPlimit]; len(b) >= 4 {
			q.Fq.Limit = native.Uint32(b)
		}
		if b := a[tcaFqFlowPlimit]; len(b) >= 4 {
			q.Fq.FlowLimit = native.Uint32(b)
		}
		if b := a[tcaFqOrphanMask]; len(b) >= 4 {
			q.Fq.OrphanMask = native.Uint32(b)
		}
	case "mqprio":
		q.MQPrio = decodeMQPrio(opts)
	case "cake":
		a := parseAttrs(opts)
		q.Cake = &Cake{}
		if b := a[tcaCakeSplitGSO]; len(b) >= 4 {
			q.Cake.SplitGSO = native.Uint32(b) != 0
		}
		if b := a[tcaCakeRTT]; len(b) >= 4 {
			q.Cake.RTT = native.Uint32(b)
		}
		if b := a[tcaCakeTarget]; len(b) >= 4 {
			q.Cake.Target = native.Uint32(b)
		}
	}
}

func decodeStats(b []byte) (*Stats, []byte) {
	if b == nil {
		return nil, nil
	}
	s := &Stats{}
	return s, decodeStatsInto(b, s)
}

// decodeStatsInto is decodeStats into s; it returns the xstats.
func decodeStatsInto(b []byte, s *Stats) []byte {
	var a [16][]byte
	attrTable(b, a[:])
	if v := a[nl.TCA_STATS_BASIC]; len(v) >= 12 {
		s.Bytes = native.Uint64(v[0:])
		s.Packets = uint64(native.Uint32(v[8:]))
	}
	if v := a[nl.TCA_STATS_PKT64]; len(v) >= 8 {
		s.Packets = native.Uint64(v)
	}
	if v := a[nl.TCA_STATS_QUEUE]; len(v) >= 20 {
		s.Qlen = native.Uint32(v[0:])
		s.Backlog = native.Uint32(v[4:])
		s.Drops = native.Uint32(v[8:])
		s.Requeues = native.Uint32(v[12:])
		s.Overlimits = native.Uint32(v[16:])
	}
	return a[nl.TCA_STATS_APP]
}

// Classes lists the classes of the qdisc with handle qdisc on dev (0:
// of every qdisc, in one dump). A qdisc's own dump costs less than its
// share of the device's: the kernel finds the qdisc by its handle, where
// a device's dump walks the device's qdiscs, leaves included, up to the
// one it stopped in each time it resumes (every 32 KB of answer).
func (c *Conn) Classes(dev string, qdisc Handle) ([]*Class, error) {
	return c.ClassesOf(dev, []Handle{qdisc})
}

// ClassesOf dumps the classes of each of dev's qdiscs in turn (a
// sharded tree's roots), resolving dev once: a link lookup per shard
// was about 1 ms of an agent's 13 ms of dumps at 16 shards.
func (c *Conn) ClassesOf(dev string, qdiscs []Handle) ([]*Class, error) {
	idx, err := c.IfIndex(dev)
	if err != nil {
		return nil, err
	}
	var out []*Class
	for _, qdisc := range qdiscs {
		err = c.dumpEach(unix.RTM_GETTCLASS, tcmsg(idx, 0, uint32(qdisc), 0), func(m []byte) {
			if cl := decodeClass(dev, idx, qdisc, m); cl != nil {
				out = append(out, cl)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("dump classes of %s: %w", dev, err)
		}
	}
	return out, nil
}

// Class reads one class of dev, or returns nil if there is none.
func (c *Conn) Class(dev string, h Handle) (*Class, error) {
	idx, err := c.IfIndex(dev)
	if err != nil {
		return nil, err
	}
	qdisc := MakeHandle(h.Major(), 0)
	m, err := c.get(unix.RTM_GETTCLASS, tcmsg(idx, uint32(h), uint32(qdisc), 0))
	if err != nil || m == nil {
		return nil, err
	}
	return decodeClass(dev, idx, qdisc, m), nil
}

// classBox holds a class and its counters in one allocation: a steady
// agent pass decodes 10,000 classes.
type classBox struct {
	Class
	stats Stats
	htb   HTBStats
}

func decodeClass(dev string, idx int, qdisc Handle, m []byte) *Class {
	tm := nl.DeserializeTcMsg(m)
	if int(tm.Ifindex) != idx || qdisc != 0 && Handle(tm.Handle).Major() != qdisc.Major() {
		return nil
	}
	var a, o [16][]byte
	attrTable(m[tm.Len():], a[:])
	box := &classBox{Class: Class{Dev: dev, Handle: Handle(tm.Handle), Parent: Handle(tm.Parent), Kind: kindName(a[tcaKind])}}
	cl := &box.Class
	if cl.Parent == HandleRoot { // top-level classes report TC_H_ROOT
		cl.Parent = MakeHandle(cl.Handle.Major(), 0)
	}
	if cl.Kind != "htb" {
		return cl
	}
	attrTable(a[tcaOptions], o[:])
	if b := o[nl.TCA_HTB_PARMS]; len(b) >= 44 {
		cl.Rate = units.Rate(native.Uint32(b[8:]))
		cl.Ceil = units.Rate(native.Uint32(b[20:]))
		cl.BufferTicks = native.Uint32(b[24:])
		cl.CbufferTicks = native.Uint32(b[28:])
		cl.Quantum = native.Uint32(b[32:])
		cl.Level = native.Uint32(b[36:])
		cl.Prio = native.Uint32(b[40:])
	}
	if b := o[nl.TCA_HTB_RATE64]; len(b) >= 8 {
		cl.Rate = units.Rate(native.Uint64(b))
	}
	if b := o[nl.TCA_HTB_CEIL64]; len(b) >= 8 {
		cl.Ceil = units.Rate(native.Uint64(b))
	}
	cl.Burst = TicksToBytes(cl.Rate, cl.BufferTicks)
	cl.Cburst = TicksToBytes(cl.Ceil, cl.CbufferTicks)
	if b := a[tcaStats2]; b != nil {
		cl.Stats = &box.stats
		if app := decodeStatsInto(b, cl.Stats); len(app) >= 20 {
			box.htb = HTBStats{
				Lends: native.Uint32(app[0:]), Borrows: native.Uint32(app[4:]), Giants: native.Uint32(app[8:]),
				Tokens: int32(native.Uint32(app[12:])), Ctokens: int32(native.Uint32(app[16:])),
			}
			cl.HTB = &box.htb
		}
	}
	return cl
}

// Filters lists the filters attached at parent (a qdisc, a class, or an
// ingress hook) on dev. u32 root tables come back as tcf_proto entries
// (Handle 0), and nodes of root tables with table id 0; Raw keeps the
// kernel's handle.
func (c *Conn) Filters(dev string, parent Handle) ([]*Filter, error) {
	idx, err := c.IfIndex(dev)
	if err != nil {
		return nil, err
	}
	msgs, err := c.dump(unix.RTM_GETTFILTER, tcmsg(idx, 0, uint32(parent), 0))
	if err != nil {
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
			return nil, nil // no such block
		}
		return nil, fmt.Errorf("dump filters of %s %s: %w", dev, parent, err)
	}
	var out []*Filter
	for _, m := range msgs {
		tm := nl.DeserializeTcMsg(m)
		if int(tm.Ifindex) != idx {
			continue
		}
		a := parseAttrs(m[tm.Len():])
		proto := uint16(tm.Info & 0xFFFF)
		f := &Filter{
			Dev: dev, Parent: parent, Prio: uint16(tm.Info >> 16), Proto: proto>>8 | proto<<8,
			Kind: cstring(a[tcaKind]), Raw: tm.Handle, Handle: tm.Handle,
		}
		switch f.Kind {
		case "u32":
			if err := c.decodeU32(f, a[tcaOptions]); err != nil {
				return nil, err
			}
		case "fw":
			if tm.Handle == 0 {
				break // the prio itself
			}
			o := parseAttrs(a[tcaOptions])
			f.FW = &FW{Mask: 0xFFFFFFFF, Actions: o[nl.TCA_FW_ACT] != nil || o[nl.TCA_FW_POLICE] != nil || o[nl.TCA_FW_INDEV] != nil}
			if b := o[nl.TCA_FW_CLASSID]; len(b) >= 4 {
				f.FW.ClassID = Handle(native.Uint32(b))
			}
			if b := o[nl.TCA_FW_MASK]; len(b) >= 4 {
				f.FW.Mask = native.Uint32(b)
			}
		case "flower":
			if tm.Handle == 0 {
				break // the prio itself
			}
			f.Flower = decodeFlower(a[tcaOptions])
		case "matchall":
			if tm.Handle == 0 {
				break // the prio itself
			}
			o := parseAttrs(a[tcaOptions])
			f.Matchall = &Matchall{Actions: o[nl.TCA_MATCHALL_ACT] != nil}
			if b := o[nl.TCA_MATCHALL_CLASSID]; len(b) >= 4 {
				f.Matchall.ClassID = Handle(native.Uint32(b))
			}
		case "bpf":
			if tm.Handle == 0 {
				f.Handle = 0 // the prio itself
				break
			}
			o := parseAttrs(a[tcaOptions])
			f.BPF = &BPF{Name: cstring(o[nl.TCA_BPF_NAME])}
			if b := o[nl.TCA_BPF_ID]; len(b) >= 4 {
				f.BPF.ID = native.Uint32(b)
			}
			if b := o[nl.TCA_BPF_FLAGS]; len(b) >= 4 {
				f.BPF.DA = native.Uint32(b)&nl.TCA_BPF_FLAG_ACT_DIRECT != 0
			}
		}
		out = append(out, f)
	}
	return out, nil
}

func (c *Conn) decodeU32(f *Filter, opts []byte) error {
	a := parseAttrs(opts)
	u := &U32{}
	f.U32 = u
	rootTable := f.Raw&0x80000000 != 0
	if f.Raw != 0 && U32Node(f.Raw) == 0 {
		if rootTable {
			f.Handle, f.U32 = 0, nil // the tcf_proto itself
			return nil
		}
		if b := a[nl.TCA_U32_DIVISOR]; len(b) >= 4 {
			u.Divisor = native.Uint32(b)
		}
		return nil
	}
	if rootTable {
		f.Handle = f.Raw & 0x000FFFFF
	}
	if b := a[nl.TCA_U32_SEL]; b != nil {
		s, err := DecodeSel(b)
		if err != nil {
			return err
		}
		s.Flags &^= SelTerminal // implied by a classid; see u32Options
		u.Sel = s
	}
	if b := a[nl.TCA_U32_CLASSID]; len(b) >= 4 {
		u.ClassID = Handle(native.Uint32(b))
	}
	if b := a[nl.TCA_U32_LINK]; len(b) >= 4 {
		u.Link = native.Uint32(b)
	}
	if b := a[nl.TCA_U32_MARK]; len(b) >= 8 {
		u.Mark = &Mark{Val: native.Uint32(b[0:]), Mask: native.Uint32(b[4:])}
	}
	if a[nl.TCA_U32_POLICE] != nil {
		// tc's `police` keyword on a u32 filter (not an action).
		u.Actions = append(u.Actions, "police")
		u.RedirectDev = "?unsupported-action"
	}
	if b := a[nl.TCA_U32_ACT]; b != nil {
		for _, act := range parseAttrList(b) {
			aa := parseAttrs(act)
			u.Actions = append(u.Actions, cstring(aa[nl.TCA_ACT_KIND]))
			if cstring(aa[nl.TCA_ACT_KIND]) != "mirred" {
				u.RedirectDev = "?unsupported-action"
				continue
			}
			p := parseAttrs(aa[nl.TCA_ACT_OPTIONS])[nl.TCA_MIRRED_PARMS]
			if len(p) >= 28 && native.Uint32(p[20:]) == tcaEgressRedir {
				u.RedirectDev = c.IfName(int(native.Uint32(p[24:])))
			}
		}
	}
	return nil
}

func parseAttrList(b []byte) [][]byte {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return nil
	}
	out := make([][]byte, 0, len(attrs))
	for _, a := range attrs {
		out = append(out, a.Value)
	}
	return out
}

// ProbeFilter tries to create a classifier of kind with no options at
// parent, at a prio no other probe uses. The kernel answers ENOENT only when it has no such classifier;
// any other answer (most are EINVAL: options missing) means it has one.
func (c *Writer) ProbeFilter(dev string, parent Handle, prio uint16, kind string) (bool, error) {
	idx, err := c.IfIndex(dev)
	if err != nil {
		return false, err
	}
	req := c.request(unix.RTM_NEWTFILTER, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(tcmsg(idx, 0, uint32(parent), filterInfo(prio, ProtoAll)))
	req.AddData(nl.NewRtAttr(tcaKind, nl.ZeroTerminated(kind)))
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	// Whatever was created goes again: an fw instance without filters
	// cannot even be dumped ("Buffer too small for object" on Debian's
	// 6.1), and would spoil every later dump of the hook.
	del := c.request(unix.RTM_DELTFILTER, unix.NLM_F_ACK)
	del.AddData(tcmsg(idx, 0, uint32(parent), filterInfo(prio, ProtoAll)))
	del.Execute(unix.NETLINK_ROUTE, 0)
	return !errors.Is(err, syscall.ENOENT), nil
}

// ProbeAction asks the kernel to create an action of kind with no
// options: ENOENT means the action does not exist.
func (c *Writer) ProbeAction(kind string) bool {
	req := c.request(unix.RTM_NEWACTION, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(&nl.TcActionMsg{Family: nl.FAMILY_ALL})
	tab := nl.NewRtAttr(nl.TCA_ACT_TAB|unix.NLA_F_NESTED, nil)
	a := tab.AddRtAttr(1|unix.NLA_F_NESTED, nil)
	a.AddRtAttr(nl.TCA_ACT_KIND, nl.ZeroTerminated(kind))
	req.AddData(tab)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return !errors.Is(err, syscall.ENOENT)
}

// ProbeQdisc tries to attach a qdisc of kind (with default options) at
// parent and removes it again. It reports false only for ENOENT, the
// kernel's answer to a kind it does not have.
func (c *Writer) ProbeQdisc(dev string, parent Handle, kind string) (bool, error) {
	q := &Qdisc{Dev: dev, Parent: parent, Handle: MakeHandle(0x77, 0), Kind: kind}
	if parent == HandleIngress {
		q.Handle = MakeHandle(0xFFFF, 0)
	}
	idx, err := c.IfIndex(dev)
	if err != nil {
		return false, err
	}
	req := c.request(unix.RTM_NEWQDISC, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
	req.AddData(tcmsg(idx, uint32(q.Handle), uint32(parent), 0))
	req.AddData(nl.NewRtAttr(tcaKind, nl.ZeroTerminated(kind)))
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	if errors.Is(err, syscall.ENOENT) {
		return false, nil
	}
	if err == nil {
		del := c.request(unix.RTM_DELQDISC, unix.NLM_F_ACK)
		del.AddData(tcmsg(idx, uint32(q.Handle), uint32(parent), 0))
		del.Execute(unix.NETLINK_ROUTE, 0)
	}
	return true, nil
}
