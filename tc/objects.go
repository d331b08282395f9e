package tc

import (
	"fmt"
	"strconv"
	"strings"

	"sluice/units"
)

// Object is one kernel object sluice manages: a *Link, *Qdisc, *Class or
// *Filter. Key names it uniquely on a host (two objects with one key are
// the same kernel object, possibly configured differently).
type Object interface {
	Key() string
	Device() string
	// Describe is a one-line summary for plans and logs.
	Describe() string
}

// Stats are the counters the kernel keeps for a qdisc or class.
type Stats struct {
	Bytes      uint64 `json:"bytes"`
	Packets    uint64 `json:"packets"`
	Drops      uint32 `json:"drops"`
	Overlimits uint32 `json:"overlimits"`
	Requeues   uint32 `json:"requeues"`
	Qlen       uint32 `json:"qlen"`
	Backlog    uint32 `json:"backlog"`
}

// HTBStats are HTB's per-class extended statistics (struct tc_htb_xstats).
type HTBStats struct {
	Lends   uint32 `json:"lends"`
	Borrows uint32 `json:"borrows"`
	Giants  uint32 `json:"giants"`
	Tokens  int32  `json:"tokens"`
	Ctokens int32  `json:"ctokens"`
}

// Link is a network device sluice creates (an ifb for ingress shaping).
type Link struct {
	Name string
	Kind string // "ifb"
	MTU  int    // set at creation; 0 leaves the kernel's default
	Up   bool
	// Index is filled in on readback.
	Index int
	// RawIP: the device carries bare IP packets, no link-layer header
	// (readback only; tun, wireguard).
	RawIP bool
	// TxQueues is the device's number of transmit queues: set at
	// creation (0: the kernel's default, 1), filled in on readback.
	TxQueues int
}

func (l *Link) Key() string      { return "link/" + l.Name }
func (l *Link) Device() string   { return l.Name }
func (l *Link) Describe() string { return fmt.Sprintf("link %s type %s", l.Name, l.Kind) }

// Qdisc is a queueing discipline attached at Parent of Dev.
type Qdisc struct {
	Dev    string
	Parent Handle
	Handle Handle
	Kind   string

	// Options by kind; a nil pointer or zero field means "the kernel's
	// default" and is neither sent nor compared.
	HTB     *HTBQdisc
	Fifo    *Fifo // pfifo (packets) and bfifo (bytes)
	FqCodel *FqCodel
	Sfq     *Sfq
	Fq      *Fq
	Cake    *Cake
	MQPrio  *MQPrio
	Tbf     *Tbf // what the lab's modem is (sluice's trees use none)

	// Stab is the qdisc's size table (nil: none): what its scheduler
	// counts a packet as on a link that adds bytes or cells.
	Stab *Stab

	// Owner names the sluice class a leaf qdisc belongs to (display only).
	Owner string
	// Stats are filled in on readback.
	Stats *Stats
}

// HTBQdisc holds HTB's qdisc-wide options (struct tc_htb_glob).
type HTBQdisc struct {
	Default uint32 // minor id of the default class
	R2Q     uint32
}

// Tbf is a token bucket: Rate in bytes/s, Burst bytes at once, Limit
// bytes queued.
type Tbf struct {
	Rate         units.Rate
	Burst, Limit uint32
}

// Fifo is pfifo's or bfifo's single option.
type Fifo struct{ Limit uint32 }

// FqCodel options sluice sets.
type FqCodel struct {
	Limit uint32 // packets
	Flows uint32
	// Target and Interval (µs; 0: fq_codel's 5 ms and 100 ms) are its
	// AQM's: packets that waited beyond Target for an Interval start
	// its drops.
	Target, Interval uint32
}

// Sfq options sluice sets.
type Sfq struct {
	Limit   uint32 // packets
	Perturb int32  // seconds
}

// Fq options sluice sets.
type Fq struct {
	Limit     uint32 // packets
	FlowLimit uint32 // packets per flow
	// OrphanMask is fq's mask on the flow hash of packets without a
	// socket (forwarded ones); sluice's EDT trees keep their tag in its
	// bits above fq's default 1023.
	OrphanMask uint32
}

// MQPrio is mqprio's software mapping (hw 0): skb->priority to traffic
// class, and each class's range of transmit queues.
type MQPrio struct {
	NumTC  uint8
	Map    [16]uint8 // traffic class of each priority
	Count  [16]uint16
	Offset [16]uint16
}

// Cake options sluice sets. Inside an HTB class cake runs unlimited; the
// class does the shaping.
type Cake struct {
	// SplitGSO: cake splits GSO super-packets into segments as it queues
	// them, so that the HTB class above sees (and takes turns in) frames
	// of the wire's size, not packets of up to 64 KB.
	SplitGSO bool
	// RTT (µs, 0: cake's 100 ms) sets cake's interval, and Target (µs)
	// its AQM's target: tc's `rtt` sets both, the target to a twentieth
	// of the interval, and so does sluice (Target 0: RTT/20). The
	// kernel sets neither from the other: sent alone, an rtt leaves
	// cake's target at its 5 ms.
	RTT    uint32
	Target uint32
}

// forChange is q as a change sends it: fq_codel refuses a change that
// names its flows (EINVAL), which only its creation sets. Where the flows
// differ the diff replaces the qdisc instead.
func (q *Qdisc) forChange() *Qdisc {
	if q.FqCodel == nil || q.FqCodel.Flows == 0 {
		return q
	}
	c, f := *q, *q.FqCodel
	f.Flows = 0
	c.FqCodel = &f
	return &c
}

// codelUnits is a codel time of us µs as the kernel keeps it: ns >> 10,
// units of 1.024 µs.
func codelUnits(us uint32) uint64 { return uint64(us) * 1000 >> 10 }

// SameCodelTime says whether two codel times (µs) are one to the kernel.
func SameCodelTime(a, b uint32) bool { return codelUnits(a) == codelUnits(b) }

// codelFromKernel turns the µs the kernel says a codel time is (its units
// truncated to µs) into the µs that set those very units: a 5 ms target
// reads 4999 µs, which sent back would set 4.998 ms, and a rollback that
// restored what it read would move the target a µs at a time.
func codelFromKernel(r uint32) uint32 {
	units := (uint64(r)*1000 + 1023) / 1024
	return uint32((units*1024 + 999) / 1000)
}

// CodelReadBack is what a dump decodes a codel time of us µs as, once the
// kernel holds it: us itself for whole milliseconds.
func CodelReadBack(us uint32) uint32 {
	return codelFromKernel(uint32(codelUnits(us) << 10 / 1000))
}

// usText writes µs as tc reads a time: whole milliseconds as ms.
func usText(us uint32) string {
	if us%1000 == 0 {
		return fmt.Sprintf("%dms", us/1000)
	}
	return fmt.Sprintf("%dus", us)
}

// CakeTarget is the target tc's `rtt` sets with interval rtt (µs).
func CakeTarget(rtt uint32) uint32 { return max(rtt/20, 1) }

// Key: one qdisc per attachment point.
func (q *Qdisc) Key() string    { return "qdisc/" + q.Dev + "/" + q.Parent.String() }
func (q *Qdisc) Device() string { return q.Dev }
func (q *Qdisc) Describe() string {
	s := fmt.Sprintf("qdisc %s %s handle %s %s%s", q.Dev, parentWord(q.Parent), q.Handle, q.stabWords(), q.Kind)
	if o := q.optionString(); o != "" {
		s += " " + o
	}
	if q.Owner != "" {
		s += "  # leaf of " + q.Owner
	}
	return s
}

func parentWord(p Handle) string {
	switch p {
	case HandleRoot:
		return "root"
	case HandleIngress:
		return "ingress"
	}
	return "parent " + p.String()
}

// stabWords renders the size table as tc's words before the kind.
func (q *Qdisc) stabWords() string {
	if q.Stab == nil {
		return ""
	}
	return q.Stab.String() + " "
}

// optionString renders the options as tc arguments.
func (q *Qdisc) optionString() string {
	var a []string
	switch {
	case q.HTB != nil:
		if q.HTB.Default != 0 {
			a = append(a, fmt.Sprintf("default %x", q.HTB.Default))
		}
		if q.HTB.R2Q != 0 {
			a = append(a, fmt.Sprintf("r2q %d", q.HTB.R2Q))
		}
	case q.Fifo != nil && q.Fifo.Limit != 0:
		a = append(a, fmt.Sprintf("limit %d", q.Fifo.Limit))
	case q.FqCodel != nil:
		if q.FqCodel.Limit != 0 {
			a = append(a, fmt.Sprintf("limit %d", q.FqCodel.Limit))
		}
		if q.FqCodel.Flows != 0 {
			a = append(a, fmt.Sprintf("flows %d", q.FqCodel.Flows))
		}
		if q.FqCodel.Target != 0 {
			a = append(a, "target "+usText(q.FqCodel.Target))
		}
		if q.FqCodel.Interval != 0 {
			a = append(a, "interval "+usText(q.FqCodel.Interval))
		}
	case q.Sfq != nil:
		if q.Sfq.Limit != 0 {
			a = append(a, fmt.Sprintf("limit %d", q.Sfq.Limit))
		}
		if q.Sfq.Perturb != 0 {
			a = append(a, fmt.Sprintf("perturb %d", q.Sfq.Perturb))
		}
	case q.Fq != nil:
		if q.Fq.Limit != 0 {
			a = append(a, fmt.Sprintf("limit %d", q.Fq.Limit))
		}
		if q.Fq.FlowLimit != 0 {
			a = append(a, fmt.Sprintf("flow_limit %d", q.Fq.FlowLimit))
		}
		if q.Fq.OrphanMask != 0 {
			a = append(a, fmt.Sprintf("orphan_mask %d", q.Fq.OrphanMask))
		}
	case q.Cake != nil:
		if q.Cake.SplitGSO {
			a = append(a, "split-gso")
		}
		if q.Cake.RTT != 0 {
			a = append(a, fmt.Sprintf("rtt %dus", q.Cake.RTT))
		}
		if t := q.Cake.Target; t != 0 && (q.Cake.RTT == 0 || t != CakeTarget(q.Cake.RTT)) {
			// Only a live cake set by other means: tc cannot say it.
			a = append(a, fmt.Sprintf("(target %dus)", t))
		}
	case q.MQPrio != nil:
		m := q.MQPrio
		a = append(a, fmt.Sprintf("num_tc %d map", m.NumTC))
		for _, t := range m.Map {
			a = append(a, fmt.Sprint(t))
		}
		a = append(a, "queues")
		for i := 0; i < int(m.NumTC) && i < len(m.Count); i++ {
			a = append(a, fmt.Sprintf("%d@%d", m.Count[i], m.Offset[i]))
		}
		a = append(a, "hw 0")
	}
	return strings.Join(a, " ")
}

// Class is an HTB class.
type Class struct {
	Dev    string
	Parent Handle // the qdisc handle for top-level classes
	Handle Handle
	Kind   string // "htb"

	Rate, Ceil    units.Rate
	Burst, Cburst uint32 // bytes
	Prio, Quantum uint32

	// Name is sluice's name for the class (display only).
	Name string
	// Controlled: a sharing controller sets the class's rate and ceil at
	// run time, within Rate and Ceil (plan.Limits, laid over the plan by
	// the engine).
	Controlled bool

	// Filled in on readback: the kernel keeps bursts as transmission
	// times (ticks), and Level is 0 for leaves.
	BufferTicks, CbufferTicks uint32
	Level                     uint32
	Stats                     *Stats
	HTB                       *HTBStats
}

func (c *Class) Key() string    { return "class/" + c.Dev + "/" + c.Handle.String() }
func (c *Class) Device() string { return c.Dev }
func (c *Class) Describe() string {
	s := fmt.Sprintf("class %s parent %s classid %s htb %s", c.Dev, c.Parent, c.Handle, c.optionString())
	if c.Name != "" {
		s += "  # " + c.Name
	}
	return s
}

func (c *Class) optionString() string {
	return fmt.Sprintf("rate %s ceil %s burst %db cburst %db prio %d quantum %d",
		c.Rate.TC(), c.Ceil.TC(), c.Burst, c.Cburst, c.Prio, c.Quantum)
}

// Filter is a classifier instance or one of its elements. For u32 the
// kernel keeps one tcf_proto per (parent, prio) holding hash tables of key
// nodes; sluice addresses each piece:
//   - Handle 0: the tcf_proto itself (deleting it removes the prio);
//   - Handle with node 0 and U32.Divisor > 0: a hash table;
//   - otherwise a key node. Nodes in the tcf_proto's own root table have
//     table id 0 here; the kernel's auto-assigned root id is kept in Raw.
type Filter struct {
	Dev    string
	Parent Handle
	Prio   uint16
	Proto  uint16 // EtherType in host order, ETH_P_ALL = 3
	Kind   string
	Handle uint32
	U32    *U32
	BPF    *BPF
	// FW, Matchall and Flower are read back only (sluice imports the trees
	// hand-written scripts built with them; it never makes them).
	FW       *FW
	Matchall *Matchall
	Flower   *Flower

	// Raw is the handle the kernel reported (only on readback).
	Raw uint32
	// Note says what the filter is for (plan output, export comments).
	Note string
}

// BPF is a cls_bpf filter in direct-action mode: the program decides.
type BPF struct {
	FD   int    // the program to attach (on create)
	ID   uint32 // the attached program (on readback)
	Name string // what tc shows; sluice puts its program version here
	DA   bool   // direct action
}

// FW is an fw filter: packets whose mark, under Mask, equals the
// filter's handle go to ClassID.
type FW struct {
	Mask    uint32
	ClassID Handle
	// Actions: the filter has actions or a policer (not imported).
	Actions bool
}

// Matchall is a matchall filter: every packet reaching it goes to
// ClassID.
type Matchall struct {
	ClassID Handle
	Actions bool
}

// ClassID is where the filter sends the packets it matches (0: none,
// or a kind sluice does not read).
func (f *Filter) ClassID() Handle {
	switch {
	case f.U32 != nil:
		return f.U32.ClassID
	case f.FW != nil:
		return f.FW.ClassID
	case f.Matchall != nil:
		return f.Matchall.ClassID
	case f.Flower != nil:
		return f.Flower.ClassID
	}
	return 0
}

// ProtoAll is ETH_P_ALL.
const ProtoAll uint16 = 0x0003

// U32 holds a u32 node or hash table.
type U32 struct {
	Divisor uint32 // a hash table when non-zero
	Sel     *Sel
	ClassID Handle
	Link    uint32 // table id << 20 of the table this node descends into
	Mark    *Mark
	// RedirectDev is a "mirred egress redirect" action target.
	RedirectDev string
	// Actions lists the kinds of the node's actions (mirred, police,
	// gact, ...), read back only: what another tool's filter does.
	Actions []string
}

// Mark is u32's skb->mark match (needs CONFIG_CLS_U32_MARK).
type Mark struct{ Val, Mask uint32 }

// Selector flags (TC_U32_*).
const (
	SelTerminal  = 1
	SelOffset    = 2
	SelVarOffset = 4
	SelEat       = 8
)

// Sel is struct tc_u32_sel in host byte order.
type Sel struct {
	Flags    uint8
	Offshift uint8
	Offmask  uint16
	Off      uint16
	Offoff   int16
	Hoff     int16
	Hmask    uint32
	Keys     []Key
}

// Key is one 32-bit match: (word at Off [+ next-header offset]) & Mask == Val.
type Key struct {
	Mask, Val uint32
	Off       int32
	// NextHdr adds the offset computed by the parent node (u32's
	// "nexthdr+" keys; offmask -1 in struct tc_u32_key).
	NextHdr bool
}

// IsTP reports whether f addresses a whole tcf_proto (a prio).
func (f *Filter) IsTP() bool { return f.Handle == 0 }

// IsTable reports whether f is a u32 hash table.
func (f *Filter) IsTable() bool {
	return f.Handle != 0 && U32Node(f.Handle) == 0 && f.U32 != nil && f.U32.Divisor > 0
}

func (f *Filter) Key() string {
	if f.IsTP() {
		return "tp/" + f.Dev + "/" + f.Parent.String() + "/" + strconv.Itoa(int(f.Prio))
	}
	return "filter/" + f.Dev + "/" + f.Parent.String() + "/" + strconv.Itoa(int(f.Prio)) + "/" + U32Handle(f.Handle)
}
func (f *Filter) Device() string { return f.Dev }
func (f *Filter) Describe() string {
	var s string
	switch {
	case f.IsTP():
		s = fmt.Sprintf("filter %s %s prio %d %s", f.Dev, parentWordFilter(f.Parent), f.Prio, f.Kind)
	default:
		s = fmt.Sprintf("filter %s %s prio %d handle %s %s %s", f.Dev, parentWordFilter(f.Parent), f.Prio,
			U32Handle(f.Handle), f.Kind, f.u32Args(false))
	}
	if f.Note != "" {
		s += "  # " + f.Note
	}
	return s
}

func parentWordFilter(p Handle) string {
	if p == HandleIngressHook {
		return "ingress"
	}
	return "parent " + p.String()
}
