package plan

import (
	"math"

	"sluice/policy"
	"sluice/units"
)

// Defaults for what a policy leaves unsaid. They are functions of a
// class's own rates only, so that adding or removing a class never
// changes its siblings.

const (
	// MTU-sized frames as HTB counts them (Ethernet header included).
	frameBytes = 1514

	// burstTime is how long a class may send at full speed after an idle
	// moment. HTB refills tokens when its timer fires; a wakeup late by
	// more than burst/rate loses the tokens beyond the burst, which is
	// why tc's default (about one MTU) undershoots at high rates. One
	// millisecond of the rate absorbs timer and softirq latency while
	// adding at most 1 ms of queue behind a bulk class; from 1gbit,
	// where a late timer costs most, two (burstTimeFast). Measured over
	// 20 runs each (docs/benchmarks.md): with 1 ms the worst run at
	// 2.5gbit reached 0.941 of the rate, with 2 ms at least 0.954 at 1,
	// 2.5 and 5gbit.
	burstTime     = 0.001
	burstTimeFast = 0.002
	fastRate      = 125_000_000 // 1gbit, bytes/s
	// burstTimeIngress is an ingress tree's (a download's, on an ifb):
	// four milliseconds at every rate. An ifb's HTB runs from the
	// softirq that the redirect and its own watchdog raise, later more
	// often than an egress qdisc's, and it shapes behind the link's
	// bottleneck: what it sends at once goes to the LAN, where it waits
	// for nothing, so the bigger bucket costs no queue at the link.
	// Measured with the burst study on an ifb (docs/benchmarks.md), 4 TCP
	// flows, goodput over the rate: in Debian 6.1's emulated guest at
	// 20mbit 1 ms gave a median of 0.940 (six runs, 0.913 to 0.944), 4
	// ms 0.953 (0.920 to 0.955), the headers' ceiling 0.956; on the
	// development kernel the worst of eight runs rose from 0.920 to
	// 0.951 at 20mbit and from 0.936 to 0.949 at 100mbit. A download
	// whose shaper passed 0.87 to 0.91 of its rate for a whole run held
	// rate: auto's controller, which grows only while 90% passes, at
	// half the line (docs/autorate.md).
	burstTimeIngress = 0.004
	// minBurst keeps slow classes able to send a frame and its ACK clock.
	minBurst = 2 * frameBytes

	// quantumTime sizes a class's DRR quantum (bytes it sends per turn
	// when borrowing) at about 1 ms of its rate. Never below the tree's
	// floor (quantumFloor): HTB lets a class send a packet whenever its
	// turn comes, even with a negative deficit, so a quantum smaller than
	// the packets HTB sees turns its DRR into packet round robin.
	quantumTime = 0.001
	maxQuantum  = 200000
	// The floor is floorTime of what the group shares (the parent's
	// rate), at least three frames and at most one 64 KB GSO packet. A
	// flow crossing a WAN builds packets of about a millisecond of its
	// pacing rate (TCP's TSO autosizing; GRO on a router's NIC merges them
	// back), at most two of its rate, so at the floor a class's turn holds
	// at least one of them; a round of n busy classes then takes about
	// 4n ms at low rates. Flows of sub-millisecond RTT (a LAN, a
	// datacenter) build packets of up to 64 KB: where the floor is
	// smaller, a turn carries one such packet and shares follow packet
	// sizes (Jain 0.93 with 4.5 KB quanta at 40mbit in the lab without
	// delay, 1.00 with 64 KB; from 131mbit the floor is 64 KB).
	//
	// A leaf with an AQM (fq_codel, cake) drops what waits beyond its
	// target (5 ms), and a class's packets wait for its next turn, a
	// round of the busy classes' quanta: aqmFloorTime keeps rounds of n
	// classes near n ms. A fixed 64 KB floor made rounds of half a
	// second at 8mbit (eight hosts), in which fq_codel dropped at every
	// turn and hosts got 0.78 to 0.95 of their mean share, against 0.94
	// to 0.95 with 4.5 KB (Debian 6.1); cake's per-host queues behind
	// 19.5 KB quanta at 40mbit dropped a single flow's packets until
	// its queue was empty at its turns (Jain 0.62).
	floorTime    = 0.004
	aqmFloorTime = 0.001
	minQuantum   = 3 * frameBytes
	gsoQuantum   = 65536 + frameBytes

	// bfifoTime is the queue a bfifo leaf holds, at the class's rate,
	// when the kernel has no AQM: about 50 ms. But never less than one
	// maximal GSO/GRO packet (64 KB) plus three frames: a byte-limited
	// FIFO smaller than the packets TCP hands it drops every one of them
	// (measured: 4 TCP flows at 5mbit got 5% of the rate with 31 KB, 95%
	// with 70 KB).
	bfifoTime     = 0.050
	MinBfifoBytes = 65536 + 3*frameBytes // exported: importers keep old limits above it

	// ingressBfifoTime is bfifoTime on an ingress tree (its ifb), where
	// the shaper sits behind the bottleneck: a download's slow start
	// sends twice what the shaper lets through, the modem's queue grows
	// by the difference, and only the shaper's drops stop it. Its queue
	// fills at the line's rate less the shaper's, so its size is how
	// long the modem's queue grows before the first drop, a queue every
	// class waits in, ping included. In the demo (100 Mbit/s line, 500
	// ms modem buffer, 85mbit shaper, 4 CUBIC flows), ping's p95 over
	// the download phase read 2.7 to 74 ms with 50 ms queues and 142 to
	// 186 ms with HyStart off; with 10 ms, 0.2 to 1.7 ms, and 1.2 to 25
	// ms with HyStart off, the goodput the same (81 Mbit/s). fq_codel
	// and cake keep about 5 ms for the same reason: a long-RTT single
	// flow may leave the shaper idle after a loss, the price of a
	// queue that cannot hide the upstream one.
	ingressBfifoTime = 0.010

	// cakeRTT (µs) is a cake leaf's rtt: its AQM's interval, and its
	// target a twentieth of it (20 ms), both sent as tc's `rtt` sends
	// them. A class's packets wait for its turn, and cake, unlike
	// fq_codel, drops a flow's packets that wait beyond its target even
	// when the flow holds only one or two: with cake's 100 ms (target 5
	// ms) the per-host cakes of eight hosts at 40mbit dropped the lone
	// flows' packets until their queues were empty at their turns, and
	// the host with eight flows took 12 of the 40 Mbit/s (Jain 0.69);
	// with an interval of 400 ms, 4.4 to 4.7 each (Jain 1.00), a tenth
	// of the retransmits (Debian 6.1). Until this release the target was
	// not sent, and stayed at cake's 5 ms while tc's script said 20.
	cakeRTT = 400_000

	// codelTarget (µs) is fq_codel's own target, the least a leaf gets;
	// codelTargetMax the most, a cake leaf's (cakeRTT/20);
	// codelInterval fq_codel's own interval, the least a leaf gets.
	codelTarget    = 5000
	codelTargetMax = cakeRTT / 20
	codelInterval  = 100000

	// perHostFlows: per-host fq_codel leaves need far fewer flow slots
	// than a whole link's (one host, not thousands).
	perHostFlows = 64
)

// BurstFor is the default burst (and cburst) for rate in bytes/s, in a
// tree that shapes in dir (policy.Egress or policy.Ingress).
func BurstFor(rate units.Rate, dir string) uint32 {
	t := burstTime
	switch {
	case dir == policy.Ingress:
		t = burstTimeIngress
	case rate >= fastRate:
		t = burstTimeFast
	}
	b := uint64(float64(rate) * t)
	if b < minBurst {
		b = minBurst
	}
	if b > 1<<30 {
		b = 1 << 30
	}
	return uint32(b)
}

// CodelTimes is the target and interval (µs) of an fq_codel leaf under
// a class of rate (bytes/s): a frame and a half at the rate, at least
// fq_codel's 5 ms and at most a cake leaf's 20 ms, whole milliseconds.
// A class's packets wait for its turn and, when it is held to its rate,
// a frame's time at it: at 5 ms a slow class's lone flow sees every
// packet late, and its leaf drops until the queue is empty at its turns,
// which the others then take (the measurement is in docs/sharing.md).
// cake computes its target so from its own rate; a leaf under HTB has
// none, so sluice does. The interval is ten targets, at least 100 ms:
// a lone flow waits past any target at its turns, and the interval sets
// how often it is dropped for that; at twenty targets a busy slow class
// queued too long (a host's eight flows, 190 ms of RTT).
func CodelTimes(rate units.Rate) (target, interval uint32) {
	target = codelTarget
	if rate > 0 {
		t := 1.5 * frameBytes / float64(rate) * 1e6
		t = math.Ceil(t/1000) * 1000
		if t > codelTargetMax {
			t = codelTargetMax
		}
		if t > float64(target) {
			target = uint32(t)
		}
	}
	return target, max(codelInterval, 10*target)
}

// Leaf is what a class's leaf hands HTB, as its quantum's floor sees it.
type Leaf uint8

const (
	// LeafFIFO: packets as TCP built them (GSO, up to 64 KB), no AQM.
	LeafFIFO Leaf = iota
	// LeafAQM: the same packets, from a leaf that drops what waits
	// beyond its target (fq_codel, fq): rounds kept short.
	LeafAQM
	// LeafFrames: an AQM leaf that splits GSO packets into frames as it
	// queues them (cake's split-gso): HTB sees frames, so one frame is
	// a turn that counts bytes, and rounds are kept shortest. cake,
	// unlike fq_codel, drops a flow's packets that waited beyond its
	// target even when the flow holds one or two: a host whose turn
	// comes later than that loses its packets for waiting its turn
	// (measured on 6.1: 8 hosts at 10mbit with three-frame quanta, a
	// round of 30 ms against cake's 20 ms target, gave the host with
	// eight flows 14.5% of the link for its 12.5%).
	LeafFrames
)

// quantumFloor is the least quantum of a class whose siblings share link
// (bytes/s), whose leaf is leaf.
func quantumFloor(link units.Rate, leaf Leaf) uint64 {
	t, least := floorTime, uint64(minQuantum)
	switch leaf {
	case LeafAQM:
		t = aqmFloorTime
	case LeafFrames:
		t, least = aqmFloorTime, frameBytes
	}
	return min(max(uint64(float64(link)*t), least), gsoQuantum)
}

// QuantumFor is the default quantum of a class with rate whose siblings
// share link (bytes/s), whose leaf is leaf.
func QuantumFor(rate, link units.Rate, leaf Leaf) uint32 {
	q := uint64(float64(rate) * quantumTime)
	return uint32(min(max(q, quantumFloor(link, leaf)), maxQuantum))
}

// BfifoLimit is the default bfifo limit (bytes) of a class with rate,
// ceil and quantum: bfifoTime at its rate, which HTB guarantees, so that
// the queue delays a packet at most that long whenever the class gets its
// share, however far above its rate it may borrow. Sized at the ceil, a
// per-host class with a share of 5 of 40 Mbit/s queued 400 ms (measured
// in the fair-share scenario: 340 ms of TCP RTT, against 109 ms through
// a plain FIFO). Never more than bfifoTime at the ceil, never less than
// MinBfifoBytes, and never less than two quanta and three frames: a
// class takes its turns from its queue, and a queue that cannot hold a
// turn's quantum after a TCP flow has halved its window empties before
// the turn ends, so the class's share follows its queue, not its weight
// (weights 1:2:4 gave 0.24:0.34:0.42 with 70 KB queues and quanta up to
// 1 MiB; one host with eight flows got 33% more than hosts with one
// behind queues of one quantum, 4.5% more behind two).
func BfifoLimit(rate, ceil units.Rate, quantum uint32) uint32 {
	return bfifoLimit(bfifoTime, rate, ceil, quantum)
}

// IngressBfifoLimit is BfifoLimit on an ingress tree: ingressBfifoTime
// at the class's rate, with the same floors.
func IngressBfifoLimit(rate, ceil units.Rate, quantum uint32) uint32 {
	return bfifoLimit(ingressBfifoTime, rate, ceil, quantum)
}

func bfifoLimit(t float64, rate, ceil units.Rate, quantum uint32) uint32 {
	b := uint64(float64(max(rate, 1)) * t)
	b = min(b, uint64(float64(ceil)*t))
	b = max(b, MinBfifoBytes, 2*uint64(quantum)+3*frameBytes)
	return uint32(min(b, 1<<30))
}
