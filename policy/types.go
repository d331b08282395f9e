// Package policy reads and checks sluice's declarative policy files:
// which interfaces to shape, in which direction, with which class tree
// and which rules sorting packets into classes.
//
// Parse returns a Policy whose every field remembers where it was
// written, so that each problem can be reported as FILE:LINE:COL. A
// Policy that Parse returns without error has been fully validated:
// names resolve, rates add up, rates in percent are resolved to bytes
// per second (RateBps, CeilBps) and ranges are in bounds.
package policy

import (
	"net/netip"
	"path/filepath"
	"time"

	"sluice/units"
)

// Policy is a whole policy file.
type Policy struct {
	File       string
	Interfaces []*Interface
	// PodVeths, when set, adds an interface for each pod veth its file
	// lists (Interface.Generated).
	PodVeths *PodVeths
	// sources are the contents the policy was read from, by file.
	sources map[string][]byte
}

// Source returns the contents file (the policy file or a hosts_file, as
// Files names them) had when the policy was read from it, or nil. A
// daemon compares them with the files now to work out an edit
// (EditHosts).
func (p *Policy) Source(file string) []byte { return p.sources[file] }

// Interface shapes one network device.
type Interface struct {
	Pos     Pos
	Name    string
	NamePos Pos
	Egress  *Tree // traffic leaving the device
	Ingress *Tree // traffic arriving, queued on an ifb device
	// RTT, when set, has sluice time the TCP round trips of the traffic
	// it shapes on this interface, from the packets themselves.
	RTT *RTT
	// Generated names the pod whose veth this is, for an interface that
	// pod_veths made (not written in the policy).
	Generated string
}

// RTT is an interface's passive round-trip measurement (`rtt: on`, or
// `rtt: {flows: N}`).
type RTT struct {
	Pos Pos
	// Flows bounds the TCP flows timed at once (0: sluice's default); the
	// least recently seen are forgotten first.
	Flows    uint32
	FlowsPos Pos
}

// RTT flow bounds.
const (
	MinRTTFlows = 1024
	MaxRTTFlows = 1 << 22
)

// Direction names.
const (
	Egress  = "egress"
	Ingress = "ingress"
)

// Tree is one direction's class tree: an HTB root limited to Rate.
type Tree struct {
	Pos        Pos
	Dir        string
	Rate       *Rate
	Default    string
	DefaultPos Pos
	// Leaf is the default leaf qdisc for every class (auto if empty).
	Leaf    string
	LeafPos Pos
	Classes []*Class
	// Ifb names the ifb device for ingress (default: derived from the
	// interface name).
	Ifb    string
	IfbPos Pos
	// Classifier is "u32", "bpf" or "auto" (the default); validation
	// resolves it into BPF.
	Classifier    string
	ClassifierPos Pos
	// Police, directly under a direction, polices all its traffic in
	// BPF on the interface itself: no rate, no classes, no ifb.
	Police *Police
	// Shards caps how many transmit queues a BPF tree with host classes
	// is sharded over (one HTB per queue under mq); 0 is auto (every
	// queue), 1 turns sharding off.
	Shards    int
	ShardsPos Pos

	// Backend is "htb" (the default) or "edt": seed 000's and 001's
	// earliest-departure-time shaper, an aggregate per leaf class and
	// host paced in BPF, fq on every transmit queue, no HTB.
	Backend    string
	BackendPos Pos
	// EDT settings (backend edt). Horizon 0 and Burst nil mean the
	// defaults (DefaultHorizon, DefaultEDTBurst); see docs/edt.md.
	Horizon    time.Duration
	HorizonPos Pos
	Burst      *Burst
	Exempt     []*Match
	// Queues is the number of transmit queues of the ifb an EDT ingress
	// creates (0: DefaultIfbQueues).
	Queues    int
	QueuesPos Pos

	// Link-layer accounting (docs/policy.md, Link layer): Overhead bytes
	// added to every packet, Linklayer "ethernet" (the default), "atm"
	// (48 bytes of every 53-byte cell) or "ptm" (64b/65b: rates count
	// 64/65 of the line's), MPU the least a packet counts as.
	Overhead     int
	OverheadPos  Pos
	Linklayer    string
	LinklayerPos Pos
	MPU          int
	MPUPos       Pos

	// Sharing runs the agent's sharing controller over the top-level
	// classes (nil: HTB's quanta share by weight alone).
	Sharing *Sharing
	// Auto is the settings of `rate: auto` (IsAuto): the agent moves
	// the rate between Auto's min and max; RateBps is its base.
	Auto *Auto

	// BPF says the tree classifies with sluice's BPF program (resolved
	// from Classifier).
	BPF bool

	// RateBps is Rate resolved.
	RateBps units.Rate
	// Scale is what ScaleRates multiplied the tree's rates by (0:
	// nothing): AtRate scales absolute rates with it.
	Scale float64
	// ClassCount is how many HTB classes the tree needs (the root class
	// not counted), Hosts how many of them are host classes (per_host
	// addresses and hosts_file entries).
	ClassCount, Hosts int
}

// MaxPrio is the highest (last served) prio of a class or host: HTB
// has eight.
const MaxPrio = 7

// Class is a node of the tree. It is a leaf unless it has Classes or
// PerHost children.
type Class struct {
	Pos     Pos
	Name    string
	NamePos Pos
	Rate    *Rate
	Ceil    *Rate
	Prio    int
	PrioPos Pos
	Burst   *Size
	Cburst  *Size
	Quantum *Size
	// Weight is the class's share of spare capacity among its siblings
	// of the same prio (0: unset, the class's rate counts).
	Weight    float64
	WeightPos Pos
	Leaf      string
	LeafPos   Pos
	Limit     *Limit
	Match     []*Match
	Classes   []*Class
	PerHost   *PerHost
	// ClassID pins the class's HTB minor id (classid: "1:20"; 0: sluice
	// numbers it), so that monitoring keyed on an old tool's ids keeps
	// working after an import.
	ClassID    uint16
	ClassIDPos Pos
	// Default, on a class with children and match rules, names the child
	// that takes the class's traffic no child rule matches.
	Default    string
	DefaultPos Pos
	// Police meters the class's traffic (leaf classes; BPF classifier).
	Police *Police
	// Sharing runs the agent's sharing controller over the class's
	// children.
	Sharing *Sharing
	// Group is set on a class read from a per_host groups_file: its name
	// there (the class's Name is the per_host class's, ":", Group), and
	// where (GroupFile, GroupLine).
	Group     string
	GroupFile string
	GroupLine int

	// Resolved by validation.
	Parent *Class
	// Hosts are the hosts_file entries whose parent column names this
	// class: their classes hang below it.
	Hosts            []*HostEntry
	RateBps, CeilBps units.Rate
}

// ShareWeight is the weight spare capacity is shared by: Weight, or
// the class's rate when Weight is unset.
func (c *Class) ShareWeight() float64 {
	if c.Weight > 0 {
		return c.Weight
	}
	return float64(c.RateBps)
}

// IsLeaf reports whether the class holds packets itself.
func (c *Class) IsLeaf() bool { return len(c.Classes) == 0 && c.PerHost == nil && len(c.Hosts) == 0 }

// EDT reports whether the tree uses the EDT backend.
func (t *Tree) EDT() bool { return t.Backend == "edt" }

// Sharing is `sharing: controller`: seed 000's weighted max-min
// controller, run by the agent every Quantum over one parent's children
// (docs/sharing.md). Where the children have more than one prio, the
// prio 0 ones are prod: never limited, and what they use comes off the
// capacity the others share; otherwise all of them share.
type Sharing struct {
	Pos Pos
	// Quantum is how often the controller measures and decides.
	Quantum    time.Duration
	QuantumPos Pos
	// Cap is what the children may use together, before what the prio 0
	// ones use is taken off: a rate or a share of the parent's rate
	// (nil: all of it).
	Cap *Rate
	// ApplyAbove: a computed limit is applied only while the child uses
	// at least this share of it (0 < ApplyAbove <= 1).
	ApplyAbove    float64
	ApplyAbovePos Pos

	// CapBps is Cap resolved (bytes/s).
	CapBps units.Rate
}

// Sharing defaults and bounds.
const (
	DefaultSharingQuantum = time.Second
	MinSharingQuantum     = 100 * time.Millisecond
	MaxSharingQuantum     = time.Minute
	DefaultApplyAbove     = 0.8
)

// Burst is an EDT burst: a time at the aggregate's rate, or bytes.
type Burst struct {
	Time  time.Duration
	Bytes uint64
	Pos   Pos
}

// NS is the burst in ns at rate (bytes per second), at most 4 s.
func (b *Burst) NS(rate units.Rate) uint32 {
	ns := uint64(b.Time)
	if b.Bytes > 0 && rate > 0 {
		ns = uint64(float64(b.Bytes) * 1e9 / float64(rate))
	}
	return uint32(min(ns, uint64(MaxEDTBurst)))
}

// EDT defaults and bounds (docs/edt.md says why).
const (
	DefaultHorizon   = 100 * time.Millisecond
	MaxHorizon       = 10 * time.Second // fq's own horizon: later packets it drops itself
	DefaultEDTBurst  = 5 * time.Millisecond
	MaxEDTBurst      = 4 * time.Second
	DefaultIfbQueues = 8
	MaxEDTHosts      = 1 << 20 // the BPF host table (bpf.MaxHosts)
	MaxIfbQueues     = 64
)

// Link-layer bounds: tc's own for overhead (a negative overhead takes
// off a header the link does not carry, like Ethernet's 14 bytes on a
// PPPoE-over-ATM modem), and an mpu no link needs more of.
const (
	MinOverhead = -64
	MaxOverhead = 256
	MaxMPU      = 256
)

// PTMScale is what a PTM link (VDSL2's 64b/65b encoding) carries of its
// line rate.
const PTMScale = 64.0 / 65

// Size is a byte count with its position.
type Size struct {
	Bytes uint64
	Pos   Pos
}

// Limit is a leaf queue's limit in packets or in bytes.
type Limit struct {
	Packets uint32
	Bytes   uint32
	Pos     Pos
}

// PerHost gives every address (or prefix) of CIDR its own child class.
type PerHost struct {
	Pos     Pos
	By      string       // "src" or "dst"
	CIDR    netip.Prefix // invalid when the hosts come from HostsFile only
	CIDRPos Pos
	// HostsFile names a CSV of hosts (name,addresses,rate,ceil[,parent]),
	// relative to the policy file; Entries holds what it lists.
	HostsFile    string
	HostsFilePos Pos
	// Pods is "egress" or "ingress" where the hosts are this node's
	// Kubernetes pods, each capped by its bandwidth annotation of that
	// direction: HostsFile is the file `sluice agent --kubernetes`
	// writes them to (PodsFile by default). Until it is written the
	// class has no hosts.
	Pods    string
	PodsPos Pos
	Entries []*HostEntry
	// GroupsFile names a CSV of groups (name,rate,ceil), relative to the
	// policy file: each is a class below the per_host class that the
	// hosts file's parent column may name, an aggregate of its hosts (a
	// Kubernetes namespace's pods, one customer's sites). A pods class
	// reads the agent's (PodsGroupsFile) unless it names one. Groups
	// holds them; validation makes them the class's Classes (HTB only:
	// an EDT tree's aggregates are one level).
	GroupsFile    string
	GroupsFilePos Pos
	Groups        []*Class
	// Prefix is the length that names one host: 32 (IPv4) or 128 (IPv6)
	// by default; 64 gives one class per IPv6 /64.
	Prefix    int
	PrefixPos Pos
	Rate      *Rate
	Ceil      *Rate
	Prio      *int
	Leaf      string
	LeafPos   Pos
	Limit     *Limit

	// Resolved by validation.
	RateBps, CeilBps units.Rate
	// Scale is what ScaleRates multiplied the rates by (0: nothing): a
	// hosts_file edit resolves its absolute rates with it, as a reload
	// would.
	Scale float64
}

// scaled is an absolute rate of a host as validation leaves it.
func (ph *PerHost) scaled(r units.Rate) units.Rate {
	if ph.Scale == 0 || r == 0 {
		return r
	}
	return max(units.Rate(float64(r)*ph.Scale), 1)
}

// HostEntry is one line of a hosts_file: a named host, its addresses,
// and its class's rate and ceil.
type HostEntry struct {
	Name      string
	Addrs     []netip.Prefix
	Rate      *Rate
	Ceil      *Rate
	Parent    string // a class of the tree to hang the host's class below
	Prio      *int   // the prio column: nil takes the per_host's
	File      string
	Line      int
	RateBps   units.Rate
	CeilBps   units.Rate
	ParentCls *Class // resolved: the per_host class or the parent column's
	Owner     *Class // the per_host class whose hosts_file lists it
	ClassName string // resolved: its class's name, Owner's name + "/" + Name
}

// Hosts lists the host prefixes PerHost covers, in address order. For
// IPv4 hosts (/32) in a prefix of /30 or shorter the network and
// broadcast addresses are left out.
func (ph *PerHost) Hosts() []netip.Prefix {
	if !ph.CIDR.IsValid() {
		return nil
	}
	n := ph.HostCount()
	out := make([]netip.Prefix, 0, n)
	a := ph.CIDR.Masked().Addr()
	step := ph.Prefix
	skipEnds := a.Is4() && step == 32 && ph.CIDR.Bits() <= 30
	total := 1 << (step - ph.CIDR.Bits())
	for i := 0; i < total; i++ {
		if !(skipEnds && (i == 0 || i == total-1)) {
			out = append(out, netip.PrefixFrom(a, step))
		}
		a = addAtBit(a, step)
	}
	return out
}

// HostCount is len(Hosts()).
func (ph *PerHost) HostCount() int {
	if !ph.CIDR.IsValid() || ph.Prefix < ph.CIDR.Bits() {
		return 0 // an invalid prefix (reported by validation)
	}
	bits := ph.Prefix - ph.CIDR.Bits()
	if bits > 20 {
		return 1 << 20 // larger than anything allowed; avoids overflow
	}
	n := 1 << bits
	if ph.CIDR.Addr().Is4() && ph.Prefix == 32 && ph.CIDR.Bits() <= 30 {
		n -= 2
	}
	return n
}

// addAtBit adds 1 at bit position (prefix length) bit of a.
func addAtBit(a netip.Addr, bit int) netip.Addr {
	b := a.AsSlice()
	i := (bit - 1) / 8
	inc := byte(1) << (7 - uint((bit-1)%8))
	for ; i >= 0; i-- {
		old := b[i]
		b[i] += inc
		if b[i] > old {
			break
		}
		inc = 1
	}
	r, _ := netip.AddrFromSlice(b)
	return r
}

// PortRange is an inclusive range of ports.
type PortRange struct{ Lo, Hi uint16 }

// Masked8 is a byte value compared under a mask.
type Masked8 struct{ Val, Mask uint8 }

// Masked32 is a 32-bit value compared under a mask.
type Masked32 struct{ Val, Mask uint32 }

// Match is one entry of a class's match list: every field given must
// match. Lists inside a field are alternatives.
type Match struct {
	Pos    Pos
	Src    []netip.Prefix
	Dst    []netip.Prefix
	NotSrc []netip.Prefix
	NotDst []netip.Prefix
	Sport  []PortRange
	Dport  []PortRange
	Proto  []uint8
	DSCP   []uint8
	TOS    *Masked8
	TCPAck bool
	TCPSyn bool // SYN set (a connection's first packet, or its SYN-ACK)
	Mark   *Masked32
	// Fields records where each field was written.
	Fields map[string]Pos
}

// Files lists the files the policy was read from: the policy file, its
// pod_veths file, then every hosts_file and groups_file (resolved against the policy file's
// directory), each once. A daemon watches them to reload.
func (p *Policy) Files() []string {
	out := []string{p.File}
	seen := map[string]bool{p.File: true}
	if p.PodVeths != nil {
		out = append(out, p.PodVeths.File)
		seen[p.PodVeths.File] = true
	}
	p.eachClass(func(c *Class) {
		if c.PerHost == nil {
			return
		}
		for _, f := range []string{c.PerHost.HostsFile, c.PerHost.GroupsFile} {
			if f == "" {
				continue
			}
			if !filepath.IsAbs(f) {
				f = filepath.Join(filepath.Dir(p.File), f)
			}
			if !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
	})
	return out
}

// eachClass calls fn for every class of every tree, parents first.
func (p *Policy) eachClass(fn func(*Class)) {
	var walk func(cs []*Class)
	walk = func(cs []*Class) {
		for _, c := range cs {
			fn(c)
			walk(c.Classes)
		}
	}
	for _, in := range p.Interfaces {
		for _, t := range []*Tree{in.Egress, in.Ingress} {
			if t != nil {
				walk(t.Classes)
			}
		}
	}
}
