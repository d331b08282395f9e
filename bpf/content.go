package bpf

import (
	"fmt"
	"net/netip"
	"strings"
	"structs"
	"time"

	"sluice/units"
)

// Limits of the fixed-size maps (sluice.h).
const (
	MaxRules    = 4096
	MaxBlocks   = 256
	MaxTargets  = 65536
	MaxPolicers = 1024
	MaxHosts    = 1 << 20
	MaxHists    = 1 << 15
	// MaxSteps bounds the blocks one packet walks through (gating
	// classes nested, plus host tables an address falls through).
	MaxSteps = 16
)

// Flags and kinds of a Rule (sluice.h).
const (
	RuleSrc    = 1
	RuleDst    = 2
	RuleProto  = 4
	RuleL4     = 8
	RuleTCPAck = 16
	RuleMark   = 32
	RuleTOS    = 64
	RuleTCPSyn = 128

	KindClass = 0
	KindGate  = 1
	KindHosts = 2

	HostsBySrc       = 1
	HostsFallThrough = 2

	cfgSetPriority = 1
	cfgTestClock   = 2
	cfgIngress     = 4
	cfgEDT         = 8
	cfgEDTPrio     = 16
	cfgEDTArrival  = 32
	cfgRTTRecord   = 64
	cfgRTTEcho     = 128
	cfgObserve     = 256

	// DelayBuckets is the number of buckets of an EDT delay histogram.
	DelayBuckets = 24
)

// Colours and policer actions.
const (
	Green  = 0
	Yellow = 1
	Red    = 2

	ActPass   = 0
	ActDrop   = 1
	ActRemark = 2

	SrTCM = 0 // RFC 2697
	TrTCM = 1 // RFC 2698
)

// Aliases for the types bpf2go generated from sluice.h.
type (
	Rule    = ClassifierRule
	Block   = ClassifierBlock
	HostKey = ClassifierLpmKey
	Counter = ClassifierCounter
	Pace    = ClassifierPace
)

// Target is what a class or a host resolves to (struct target in
// sluice.h): bpf2go's ClassifierTarget with its rate a units.Rate. The
// maps hold it as they would the generated type, whose layout it
// repeats field for field (TestTargetLayout).
type Target struct {
	_       structs.HostLayout
	Classid uint32 // HTB class (major:minor)
	Counter uint32 // index in the counters (and paces: an EDT aggregate's state)
	Queue   uint16 // 0 leaves the transmit queue alone; q+1 picks queue q
	Policer uint16 // index in the policers; 0: none
	// EDT: the aggregate's pacing.
	Burst   uint32     // ns of idle credit: how far its clock may lag behind now
	Rate    units.Rate // 0: not paced
	Hist    uint16     // index in the delay histograms
	Prod    uint8      // a prio 0 class: prod queues and priority
	Pad     uint8
	Weight  uint32 // the class's guaranteed rate in bytes/s, saturating: its share of spare capacity
	Horizon uint64 // ns: the aggregate's horizon (0: the tree's)
	// EDT: a host of a group takes a slot on the group's clock too: the
	// group's index in Targets + 1 (0: none).
	Group uint32
	// Rtt is the index of the class's round-trip histogram (0: the
	// hook's traffic of no class).
	Rtt uint32
}

// Policer is one meter's configuration: RFC 2697 srTCM (CIR, CBS, EBS)
// or RFC 2698 trTCM (CIR, CBS, PIR, PBS in EBS). Rates are bytes per
// second, bursts bytes.
type Policer struct {
	Mode  uint8
	Aware bool     // colour-aware: the pre-colour comes from the DSCP
	Act   [3]uint8 // ActPass, ActDrop or ActRemark per colour
	DSCP  [3]uint8 // the new DSCP of ActRemark, per colour
	CIR   uint64
	PIR   uint64
	CBS   uint64
	EBS   uint64 // EBS (srTCM) or PBS (trTCM)
}

// Content is everything the classifier's maps hold on one hook: the rule
// blocks that mirror sluice's u32 filter lists, the class targets, the
// host tables and the policers. It is what plan computes and what the
// kernel layer reads back and syncs.
type Content struct {
	// L2Len is the link-layer header length in front of IP: 14 for
	// Ethernet-like devices, 0 for raw IP devices.
	L2Len uint32
	// SetPriority hands the class to HTB in skb->priority (an HTB tree
	// sits on the device); off for policing without a tree.
	SetPriority bool
	// TestClock makes policers read the time from skb->tstamp (tests).
	TestClock bool
	// Ingress: the program runs on an ingress hook (a policer on an
	// interface's ingress), where the stack counts a packet's bytes
	// differently; policers charge IP bytes on every hook.
	Ingress bool
	// Shards is the number of transmit queues the tree is sharded over
	// (0: not sharded). A target without a queue of its own then goes to
	// a shard by flow hash: queue_mapping and its class id's major follow.
	Shards   uint32
	Default  uint32 // index in Targets of the tree's default class
	Rules    []Rule
	Blocks   []Block
	Targets  []Target
	Hosts    map[HostKey]Target
	Policers []Policer // Policers[i] is policer number i+1
	// EDT, when set, makes the program the EDT backend's pacer: each
	// target with a Rate is an aggregate whose packets get departure
	// times (see edt.go).
	EDT *EDT
	// RTT, when set, has the program time TCP round trips (rtt.go).
	RTT *RTT
}

// EDT holds the EDT backend's settings for one hook.
type EDT struct {
	// Horizon (ns): a packet due later than now + Horizon is dropped.
	Horizon uint64
	// Exempt is the index + 1 of the block of rules whose packets are
	// never stamped (NTP always is); 0: none.
	Exempt uint32
	// Prio puts prod and nonprod aggregates in skb->priority 6 and 0, for
	// an mqprio root that maps them to traffic classes.
	Prio bool
	// Queues are the transmit queues of prod ([0]) and nonprod ([1])
	// aggregates; a flow goes to one of them by its hash.
	Queues [2]QueueRange
	// FromIngress: packets come from an interface's ingress (the hook
	// is an ifb's), so their tstamp is an arrival time on another clock,
	// not a departure time to respect.
	FromIngress bool
	// Pool is the counter index of the direction's shared clock, which
	// caps all aggregates together at PoolRate (bytes per second; 0:
	// no shared cap) with a burst of PoolBurst ns.
	Pool      uint32
	PoolRate  units.Rate
	PoolBurst uint64
	// Link is what a packet costs on the link, for pacing (the counters
	// keep its bytes).
	Link Link
}

// Link is a link layer's cost per segment: its bytes plus Overhead, at
// least MPU, in ATM cells (53 bytes for every 48, the last padded) when
// ATM is set. The zero Link counts bytes as they are.
type Link struct {
	Overhead int32
	MPU      uint16
	ATM      bool
}

// Bytes is what a packet of n bytes in segs segments (a GSO packet's,
// all but the last of one size) costs on the link, as the program
// counts it (link_bytes in classifier.c).
func (l Link) Bytes(n, segs uint32) uint32 {
	if l == (Link{}) {
		return n
	}
	seg := func(n uint32) uint32 {
		x := max(int64(n)+int64(l.Overhead), int64(l.MPU), 1)
		if l.ATM {
			x = (x + 47) / 48 * 53
		}
		return uint32(x)
	}
	if segs <= 1 {
		return seg(n)
	}
	each := n / segs
	return (segs-1)*seg(each) + seg(n-(segs-1)*each)
}

// QueueRange is Count transmit queues from First; Count 0 leaves the
// stack's choice alone.
type QueueRange struct{ First, Count uint16 }

// HostKeyOf is the LPM key of prefix p in host table t.
func HostKeyOf(t uint32, p netip.Prefix) HostKey {
	k := HostKey{Prefixlen: 32 + uint32(p.Bits()), Table: t * 2}
	if p.Addr().Is6() {
		k.Table++
	}
	b := p.Masked().Addr().AsSlice()
	for i := 0; i < len(b)/4; i++ {
		k.Addr[i] = ne32(b[4*i:])
	}
	return k
}

// Prefix turns a host key back into its table and prefix.
func (k HostKey) Prefix() (uint32, netip.Prefix) {
	var b [16]byte
	for i := 0; i < 4; i++ {
		putNe32(b[4*i:], k.Addr[i])
	}
	bits := int(k.Prefixlen) - 32
	if k.Table%2 == 0 {
		return k.Table / 2, netip.PrefixFrom(netip.AddrFrom4([4]byte(b[:4])), bits)
	}
	return k.Table / 2, netip.PrefixFrom(netip.AddrFrom16(b), bits)
}

// ne32 reads 4 bytes in network order as the uint32 the program loads
// from packet memory on a little-endian machine.
func ne32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func putNe32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// SetPrefix stores prefix p as a rule's src (dst false) or dst match.
func (r *Rule) SetPrefix(dst bool, p netip.Prefix) {
	b := p.Masked().Addr().AsSlice()
	var addr, mask [4]uint32
	m := make([]byte, 16)
	for i := 0; i < p.Bits(); i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	for i := 0; i < len(b)/4; i++ {
		addr[i], mask[i] = ne32(b[4*i:]), ne32(m[4*i:])
	}
	if dst {
		r.Dst, r.DstMask = addr, mask
		r.Flags |= RuleDst
	} else {
		r.Src, r.SrcMask = addr, mask
		r.Flags |= RuleSrc
	}
}

// Validate checks that c fits the maps and that every index points at
// something, so that a bad content fails before it reaches the kernel.
func (c *Content) Validate() error {
	switch {
	case len(c.Rules) > MaxRules:
		return fmt.Errorf("bpf classifier: %d rules, at most %d fit", len(c.Rules), MaxRules)
	case len(c.Blocks) == 0 || len(c.Blocks) > MaxBlocks:
		return fmt.Errorf("bpf classifier: %d rule blocks, between 1 and %d fit", len(c.Blocks), MaxBlocks)
	case len(c.Targets) == 0 || len(c.Targets) > MaxTargets:
		return fmt.Errorf("bpf classifier: %d class targets, between 1 and %d fit", len(c.Targets), MaxTargets)
	case len(c.Policers) > MaxPolicers-1:
		return fmt.Errorf("bpf classifier: %d policers, at most %d fit", len(c.Policers), MaxPolicers-1)
	case len(c.Hosts) > MaxHosts:
		return fmt.Errorf("bpf classifier: %d hosts, at most %d fit", len(c.Hosts), MaxHosts)
	case int(c.Default) >= len(c.Targets):
		return fmt.Errorf("bpf classifier: default target %d out of range", c.Default)
	case c.EDT != nil && int(c.EDT.Exempt) > len(c.Blocks):
		return fmt.Errorf("bpf classifier: exempt block %d of %d", c.EDT.Exempt, len(c.Blocks))
	}
	// The description is built only on failure: with 100,000 hosts a
	// Sprintf per host cost more than the check.
	checkTarget := func(t Target, what func() string) error {
		if int(t.Policer) > len(c.Policers) {
			return fmt.Errorf("bpf classifier: %s names policer %d of %d", what(), t.Policer, len(c.Policers))
		}
		if int(t.Hist) >= MaxHists {
			return fmt.Errorf("bpf classifier: %s names delay histogram %d; at most %d fit", what(), t.Hist, MaxHists)
		}
		if t.Rtt >= MaxRTTHists {
			return fmt.Errorf("bpf classifier: %s names round-trip histogram %d; at most %d fit", what(), t.Rtt, MaxRTTHists)
		}
		return nil
	}
	for i, t := range c.Targets {
		if err := checkTarget(t, func() string { return fmt.Sprintf("target %d", i) }); err != nil {
			return err
		}
	}
	for k, t := range c.Hosts {
		if err := checkTarget(t, func() string { return fmt.Sprintf("host %v", k) }); err != nil {
			return err
		}
	}
	for i, b := range c.Blocks {
		if int(b.First)+int(b.Count) > len(c.Rules) || b.HasFallback != 0 && int(b.Fallback) >= len(c.Targets) {
			return fmt.Errorf("bpf classifier: block %d out of range", i)
		}
	}
	for i, r := range c.Rules {
		switch r.Kind {
		case KindClass:
			if int(r.Target) >= len(c.Targets) {
				return fmt.Errorf("bpf classifier: rule %d names target %d of %d", i, r.Target, len(c.Targets))
			}
		case KindGate:
			if r.Target == 0 || int(r.Target) >= len(c.Blocks) {
				return fmt.Errorf("bpf classifier: rule %d names block %d of %d", i, r.Target, len(c.Blocks))
			}
		}
	}
	return nil
}

// Counters is the capacity of the per-class counter map a program for c
// needs: room for the highest counter index, with headroom so that new
// classes rarely need a new program.
func (c *Content) Counters() uint32 {
	hi := c.maxCounter()
	n := uint32(1024)
	for n < 2*(hi+1) && n < 1<<24 {
		n *= 2
	}
	return n
}

// Hists is the capacity of the delay histogram map a program for c
// needs (EDT), with headroom as for counters.
func (c *Content) Hists() uint32 {
	hi := c.maxHist()
	n := uint32(64)
	for n < 2*(hi+1) && n < MaxHists {
		n *= 2
	}
	return n
}

func (c *Content) maxHist() uint32 {
	hi := uint32(0)
	for _, t := range c.Targets {
		hi = max(hi, uint32(t.Hist))
	}
	for _, t := range c.Hosts {
		hi = max(hi, uint32(t.Hist))
	}
	return hi
}

func (c *Content) maxCounter() uint32 {
	hi := uint32(0)
	for _, t := range c.Targets {
		hi = max(hi, t.Counter)
	}
	for _, t := range c.Hosts {
		hi = max(hi, t.Counter)
	}
	if c.EDT != nil {
		hi = max(hi, c.EDT.Pool)
	}
	return hi
}

// Equal reports whether a and b put the same bytes in the maps.
func (c *Content) Equal(o *Content) bool {
	return c.L2Len == o.L2Len && c.SetPriority == o.SetPriority && c.TestClock == o.TestClock && c.Ingress == o.Ingress && c.Shards == o.Shards && eqEDT(c.EDT, o.EDT) &&
		eqRTT(c.RTT, o.RTT) && c.Default == o.Default && eqSlice(c.Rules, o.Rules) && eqSlice(c.Blocks, o.Blocks) &&
		eqSlice(c.Targets, o.Targets) && eqSlice(c.Policers, o.Policers) && eqHosts(c.Hosts, o.Hosts)
}

func eqEDT(a, b *EDT) bool { return a == b || a != nil && b != nil && *a == *b }

// eqRTT compares what the settings hold: the flow map's size is the
// program's (Hook.Replaceable), not the content's.
func eqRTT(a, b *RTT) bool {
	return a == b || a != nil && b != nil && a.Record == b.Record && a.Echo == b.Echo && a.Observe == b.Observe
}

func eqSlice[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func eqHosts(a, b map[HostKey]Target) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Delta summarises how c differs from old, for plans: "hosts +2 -1 ~3,
// rules, policers".
func (c *Content) Delta(old *Content) string {
	var parts []string
	var add, del, chg int
	for k, v := range c.Hosts {
		if w, ok := old.Hosts[k]; !ok {
			add++
		} else if w != v {
			chg++
		}
	}
	for k := range old.Hosts {
		if _, ok := c.Hosts[k]; !ok {
			del++
		}
	}
	if add+del+chg > 0 {
		parts = append(parts, fmt.Sprintf("hosts +%d -%d ~%d", add, del, chg))
	}
	if !eqSlice(c.Rules, old.Rules) || !eqSlice(c.Blocks, old.Blocks) {
		parts = append(parts, fmt.Sprintf("rules %d -> %d", len(old.Rules), len(c.Rules)))
	}
	if !eqSlice(c.Targets, old.Targets) || c.Default != old.Default {
		parts = append(parts, "class targets")
	}
	if !eqSlice(c.Policers, old.Policers) {
		parts = append(parts, "policers")
	}
	if c.L2Len != old.L2Len || c.SetPriority != old.SetPriority || c.TestClock != old.TestClock || c.Ingress != old.Ingress || c.Shards != old.Shards || !eqEDT(c.EDT, old.EDT) {
		parts = append(parts, "settings")
	}
	return strings.Join(parts, ", ")
}

// Summary is a one-line description of c.
func (c *Content) Summary() string {
	s := fmt.Sprintf("%d rules in %d blocks, %d classes, %d hosts", len(c.Rules), len(c.Blocks), len(c.Targets), len(c.Hosts))
	if len(c.Policers) > 0 {
		s += fmt.Sprintf(", %d policers", len(c.Policers))
	}
	if c.Shards > 1 {
		s += fmt.Sprintf(", %d shards", c.Shards)
	}
	if c.EDT != nil {
		s += fmt.Sprintf(", EDT horizon %s", time.Duration(c.EDT.Horizon))
		if c.EDT.PoolRate > 0 {
			s += fmt.Sprintf(", shared cap %d bytes/s", c.EDT.PoolRate)
		}
		if l := c.EDT.Link; l != (Link{}) {
			s += fmt.Sprintf(", link overhead %d", l.Overhead)
			if l.MPU > 0 {
				s += fmt.Sprintf(" mpu %d", l.MPU)
			}
			if l.ATM {
				s += " atm"
			}
		}
	}
	if r := c.RTT; r != nil {
		var what []string
		if r.Record {
			what = append(what, "starts")
		}
		if r.Echo {
			what = append(what, "ends")
		}
		s += ", " + strings.Join(what, " and ") + " TCP round trips"
		if r.Observe {
			s += " (observes only)"
		}
	}
	return s
}
