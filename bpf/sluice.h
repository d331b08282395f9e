// SPDX-License-Identifier: GPL-2.0
// Data shared between sluice's BPF program and its Go side: bpf2go
// generates a Go type for every struct here, and sluice writes them into
// the maps. Keep field order and padding explicit: both sides read the
// same bytes.
#pragma once

#define MAX_RULES 4096
#define MAX_BLOCKS 256
#define MAX_TARGETS 65536
#define MAX_POLICERS 1024
#define MAX_STEPS 16 // blocks entered plus host-table misses that fall through
#define DELAY_BUCKETS 24 // EDT delay histogram: see struct delays
#define RTT_BUCKETS 336  // round-trip histogram: see struct rtt_hist
#define MAX_RTT_HISTS 256 // round-trip histograms an interface has (690 KB)
#define HOST_RTT_BUCKETS 64 // a host's round-trip histogram: see struct host_rtt
#define NS 1000000000ULL

// config.flags
#define CFG_SET_PRIORITY 1 // hand the class to HTB in skb->priority (clsact hook)
#define CFG_TEST_CLOCK 2   // the time comes from skb->cb[0..1] (tests only)
#define CFG_INGRESS 4      // on an ingress hook: the stack counts no link-layer bytes
#define CFG_EDT 8          // EDT backend: stamp departure times (skb->tstamp) for fq
#define CFG_EDT_PRIO 16    // EDT under mqprio: prod/nonprod in skb->priority
#define CFG_EDT_ARRIVAL 32 // EDT on an ifb: skb->tstamp is an arrival time, not a departure
#define CFG_RTT_RECORD 64  // round trips start here: TCP timestamps of the packets this hook classifies
#define CFG_RTT_ECHO 128   // round trips end here: echoes of what the interface's other hooks recorded
#define CFG_OBSERVE 256    // classify to attribute round trips only: change nothing, let later filters run

// rule.flags
#define F_SRC 1
#define F_DST 2
#define F_PROTO 4
#define F_L4 8       // ports must be visible and in range
#define F_TCP_ACK 16 // a small pure ACK
#define F_MARK 32
#define F_TOS 64
#define F_TCP_SYN 128 // SYN set

// rule.kind
#define K_CLASS 0 // target: index in targets
#define K_GATE 1  // target: a block holding the gating class's child rules
#define K_HOSTS 2 // target: a host table (see rule.aux)

// rule.aux for K_HOSTS
#define H_BY_SRC 1      // the source address names the host (else the destination)
#define H_FALLTHROUGH 2 // an unknown address goes on to the next rule (else the default)


// Colours, actions, meters.
#define GREEN 0
#define YELLOW 1
#define RED 2
#define ACT_PASS 0
#define ACT_DROP 1
#define ACT_REMARK 2
#define MODE_SRTCM 0
#define MODE_TRTCM 1

struct config {
	__u32 l2len;          // link-layer header bytes before IP: 14 (Ethernet) or 0
	__u32 flags;          // CFG_*
	__u32 default_target; // index in targets for unmatched and non-IP packets
	__u32 shards;         // transmit queues the tree is sharded over (0: none)
	__u32 nrules, nblocks, ntargets, npolicers; // entries in use (for readers)
	// EDT backend (CFG_EDT).
	__u64 horizon;     // ns: a packet due later than now + horizon is dropped
	__u32 exempt;      // block of exempt rules + 1 (never stamped); 0: none
	__u16 q_first[2];  // transmit queues of prod (0) and nonprod (1) aggregates:
	__u16 q_count[2];  // first + flow hash % count; count 0 leaves the queue alone
	__u32 pool;        // index in paces of the direction's shared clock
	__u64 pool_rate;   // the direction's rate (bytes per second); 0: no shared cap
	__u64 pool_burst;  // ns
	// Link layer (pacing only): each segment counts as its bytes plus
	// overhead, at least mpu, in 53-byte cells of 48 when atm is set.
	__s32 overhead;
	__u16 mpu;
	__u16 atm;
};

struct rule {
	__u32 src[4], src_mask[4]; // network order, already masked
	__u32 dst[4], dst_mask[4];
	__u64 dscp_set; // bit d set: DSCP d matches; 0: any DSCP
	__u32 mark_val, mark_mask;
	__u16 sport_lo, sport_hi, dport_lo, dport_hi;
	__u8 family; // 4 or 6; 0 matches every packet (mark-only rules)
	__u8 proto;
	__u8 tos_val, tos_mask;
	__u8 flags; // F_*
	__u8 kind;  // K_*
	__u16 aux;  // H_* for K_HOSTS
	__u32 target;
	__u32 pad;
};

struct block {
	__u32 first;    // index of its first rule
	__u32 count;    // number of rules
	__u32 fallback; // target when no rule matches (a gating class's default child)
	__u32 has_fallback;
};

struct target {
	__u32 classid; // HTB class (major:minor)
	__u32 counter; // index in counters (and in paces: the aggregate's EDT state)
	__u16 queue;   // 0 leaves the transmit queue alone; q+1 picks queue q
	__u16 policer; // index in policers; 0: none
	// EDT backend: the aggregate's pacing. Configuration lives here, in
	// what user space writes; the state (t_next) in paces, which only the
	// program writes, so that a rate change never resets it.
	__u32 burst; // ns of idle credit: how far t_next may lag behind now
	__u64 rate;  // bytes per second; 0: not paced
	__u16 hist;   // index in delays
	__u8 prod;    // a prio 0 class: prod queues and priority
	__u8 pad;
	__u32 weight; // the class's guaranteed rate (bytes/s, saturating): its share of spare capacity
	__u64 horizon; // ns: this aggregate's horizon (0: the tree's, config.horizon)
	// A host of a group (a groups_file line: a namespace's pods): the
	// group's target index + 1, whose clock it also takes a slot on; 0:
	// none.
	__u32 group;
	__u32 rtt; // index in rtts of the class's round-trip histogram (0: the hook's unattributed)
};

// An EDT aggregate's state, written by the program only.
struct pace {
	__u64 t_next; // CLOCK_MONOTONIC ns at which the aggregate's next byte may leave
	__u64 drops;  // packets dropped beyond the horizon
	__u64 rate;   // bytes/s the clock last ran at (a raise rescales its lead)
};

// How long the EDT program held packets back, per CPU: bucket 0 counts
// packets sent at once; bucket k > 0 delays under 2^(k-1) units of 1024
// ns (bucket 1: under 1.024 us); the last bucket is open-ended. sum
// adds the delays up (for a mean, and Prometheus histograms).
struct delay_hist {
	__u64 b[DELAY_BUCKETS];
	__u64 sum; // ns, of every delay counted
};

struct lpm_key {
	__u32 prefixlen; // 32 (the table) + the address prefix length
	__u32 table;     // host table * 2, + 1 for IPv6
	__u32 addr[4];   // network order; IPv4 in addr[0]
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

// A policer: RFC 2697 srTCM (cbs, ebs) or RFC 2698 trTCM (cbs, pbs in
// ebs). Token counts are bytes scaled by 1e9 so that refilling, elapsed
// ns times bytes per second, is exact integer arithmetic.
struct policer {
	struct bpf_spin_lock lock;
	__u8 mode, aware; // MODE_*; aware: pre-colour from DSCP
	__u8 act[3];      // ACT_* per colour
	__u8 dscp[3];     // DSCP for ACT_REMARK per colour
	__u8 pad[4];
	__u64 cir, pir;   // bytes per second
	__u64 cbs, ebs;   // bytes (trTCM: ebs holds PBS)
	__s64 tc, te;     // tokens (trTCM: te holds the P bucket); below zero: a GSO packet's debt
	__u64 last;       // ns of the last refill
};

// A TCP flow one way, as the packets that carry its data see it: the
// hook that records takes it from the packet, the hook that matches an
// echo from the reply with source and destination swapped.
struct flow_key {
	__u32 src[4], dst[4]; // network order; IPv4 in [0]
	__u16 sport, dport;   // host order
	__u8 family;
	__u8 pad[3];
};

// What the flow has outstanding: the first packet that carried a new
// TSval (a later one with the same value would be echoed as early, and
// read too short), until its echo comes back.
struct flow_state {
	__u64 t;      // ns the outstanding packet passed the recording hook; 0: none
	__u32 tsval;  // its TSval (a SYN without timestamps: 0, and syn set)
	__u32 last;   // the newest TSval seen this way, echoed or not
	__u32 hist;   // index in rtts of its class
	__u8 seen;    // last holds a value
	__u8 syn;     // the outstanding packet is a SYN without timestamps
	__u16 pad;
	// ns of the last sample the echo ended, not yet in its host's
	// histogram (0: none). The recording hook counts it there on the
	// flow's next packet: the host's histogram is that hook's, indexed
	// like its counters, which the hook that ends a sample cannot name.
	__u32 pending;
};

// Round trips of one class: bucket k < 16 counts samples under k+1
// units of 1024 ns; above, 16 buckets per doubling (bucket 16*o + s
// covers (16 + s) << (o - 1) units, each 1 << (o - 1) wide: 1/16 of an
// octave, under 6.25% apart), the last open-ended (8.6 s and over).
// Updated with atomic adds: samples come once per round trip per flow,
// not per packet, and one copy keeps a class at 2.7 KB whatever the CPUs.
struct rtt_hist {
	__u64 b[RTT_BUCKETS];
	__u64 sum;   // ns of every sample counted
	__u64 count;
};

// Round trips of one host (of anything a target counts), coarser than
// a class's so that 10,000 hosts fit in 2.7 MB: bucket k < 4 counts
// samples under k+1 units of 32768 ns; above, 4 buckets per doubling
// (bucket 4*o + s covers (4 + s) << (o - 1) units, each 1 << (o - 1)
// wide: a quarter of an octave), the last open-ended (3.76 s and over).
// Each of its buckets is four of struct rtt_hist's. Counts are 32 bits:
// a host's flows give about one sample a round trip each.
struct host_rtt {
	__u32 b[HOST_RTT_BUCKETS];
	__u32 count;
	__u32 pad;
	__u64 sum; // ns of every sample counted
};

// Per hook, per CPU: what the round-trip stage saw.
struct rtt_stats {
	__u64 recorded;  // packets that started a sample
	__u64 matched;   // echoes that ended one (samples taken)
	__u64 missed;    // samples given up: the echo moved past them, or none came within RTT_EXPIRY
	__u64 untimed;   // TCP packets without timestamps (only SYNs among them are timed)
};

#define RTT_EXPIRY (4 * NS) // an outstanding sample older than this is given up
