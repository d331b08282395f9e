//go:build ignore

// SPDX-License-Identifier: GPL-2.0
// sluice's classifier and policers, run by cls_bpf (direct action) on a
// device's clsact hook.
//
// A packet's class comes from an ordered list of rules with the same
// first-match meaning as sluice's u32 filters (rules.h), and from LPM
// tries of hosts for per-host classes. The class id goes to HTB through
// skb->priority (HTB classifies a packet directly when its priority
// names a leaf class); a host may also pin its transmit queue
// (queue_mapping), for trees sharded over mq. Per-class counters are
// per-CPU. A class may have a policer: RFC 2697 srTCM or RFC 2698 trTCM,
// tokens refilled from the elapsed time at each packet, under a spin
// lock (one rate shared by every CPU: per-CPU buckets would multiply it).
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "sluice.h"

char __license[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RULES);
	__type(key, __u32);
	__type(value, struct rule);
} rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BLOCKS);
	__type(key, __u32);
	__type(value, struct block);
} blocks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_TARGETS);
	__type(key, __u32);
	__type(value, struct target);
} targets SEC(".maps");

// Hosts: (table, address prefix) -> target. Sized at load time.
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_key);
	__type(value, struct target);
} hosts SEC(".maps");

// Packets and bytes per target (class), per CPU. Sized at load time.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct counter);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_POLICERS);
	__type(key, __u32);
	__type(value, struct policer);
} policers SEC(".maps");

// Packets and bytes per policer and colour (index policer*3 + colour).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_POLICERS * 3);
	__type(key, __u32);
	__type(value, struct counter);
} colours SEC(".maps");

// EDT aggregates' state, by counter index. Sized at load time.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct pace);
} paces SEC(".maps");

// EDT delay histograms, by target.hist, per CPU. Sized at load time.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct delay_hist);
} delays SEC(".maps");

// TCP flows' outstanding round trips, shared by the hooks of one
// interface (its own and its ifb's). Sized at load time.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct flow_key);
	__type(value, struct flow_state);
} flows SEC(".maps");

// Round-trip histograms, by target.rtt (0: traffic of no class), shared
// like flows: the hook that ends a sample counts it where the hook that
// started it says, so an interface's trees number their classes in one
// space.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RTT_HISTS);
	__type(key, __u32);
	__type(value, struct rtt_hist);
} rtts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rtt_stats);
} rtt_counts SEC(".maps");

// Round-trip histograms per host, by target.counter: this hook's own,
// as its counters are (struct flow_state's pending says how they are
// filled). Sized at load time.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct host_rtt);
} host_rtts SEC(".maps");

// What the parser found.
struct pkt {
	__u32 src[4], dst[4]; // network order
	__u32 l3off;
	__u32 l4off; // the transport header (when l4)
	__u32 iplen;  // IPv4 total length, IPv6 payload length
	__u32 hdrlen; // IP and transport header bytes (what each GSO segment repeats)
	__u32 mark;
	__u16 sport, dport; // host order
	__u8 family;        // 4, 6, or 0: not IP (or not parsable)
	__u8 proto;
	__u8 tos; // IPv4 TOS or IPv6 traffic class
	__u8 tcpflags;
	__u8 l4;    // the transport ports are visible
	__u8 flags; // the TCP flags are visible
};

#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define IPPROTO_TCP_ 6

// parse reads the headers the rules look at. It reads the packet the way
// sluice's u32 filters do: transport fields sit after the IPv4 header
// (options included) on first fragments only, and right after the fixed
// IPv6 header (extension headers are not followed: the protocol is the
// first next-header value). Anything it cannot read leaves family 0, and
// such a packet goes to the default class.
static __always_inline void parse(struct __sk_buff *skb, const struct config *cfg, struct pkt *p)
{
	__u32 off = 0;
	__u16 proto = skb->protocol; // network order
	if (cfg->l2len == 14) {
		off = 14;
		if (bpf_skb_load_bytes(skb, 12, &proto, 2) < 0)
			return;
		// Up to two in-band VLAN tags (offloaded tags are not in the data).
#pragma unroll
		for (int i = 0; i < 2; i++) {
			if (proto != bpf_htons(0x8100) && proto != bpf_htons(0x88a8))
				break;
			off += 4;
			if (bpf_skb_load_bytes(skb, off - 2, &proto, 2) < 0)
				return;
		}
	}
	p->l3off = off;
	if (proto == bpf_htons(ETH_P_IP_)) {
		__u8 h[20];
		if (bpf_skb_load_bytes(skb, off, h, 20) < 0)
			return;
		if ((h[0] >> 4) != 4 || (h[0] & 0xf) < 5)
			return;
		__u32 ihl = (h[0] & 0xf) * 4;
		if (skb->len < off + ihl)
			return; // options cut off: malformed
		p->tos = h[1];
		p->iplen = ((__u32)h[2] << 8) | h[3];
		p->proto = h[9];
		__builtin_memcpy(&p->src[0], &h[12], 4);
		__builtin_memcpy(&p->dst[0], &h[16], 4);
		p->family = 4;
		p->hdrlen = ihl;
		if (((((__u16)h[6] << 8) | h[7]) & 0x1fff) != 0)
			return; // a later fragment: no transport header
		off += ihl;
	} else if (proto == bpf_htons(ETH_P_IPV6_)) {
		__u8 h[40];
		if (bpf_skb_load_bytes(skb, off, h, 40) < 0)
			return;
		if ((h[0] >> 4) != 6)
			return;
		p->tos = ((h[0] & 0xf) << 4) | (h[1] >> 4);
		p->iplen = ((__u32)h[4] << 8) | h[5];
		p->proto = h[6];
		__builtin_memcpy(p->src, &h[8], 16);
		__builtin_memcpy(p->dst, &h[24], 16);
		p->family = 6;
		p->hdrlen = 40;
		off += 40;
	} else {
		return;
	}
	// A transport header that should be there but is cut short makes the
	// packet malformed (default class): later rules must not match a
	// packet whose ports or flags the earlier ones could not read.
	__u8 l4[4];
	int need = p->proto == IPPROTO_TCP_ || p->proto == 17 || p->proto == 33 || p->proto == 132 || p->proto == 136;
	if (bpf_skb_load_bytes(skb, off, l4, 4) < 0) {
		if (need)
			p->family = 0;
		return;
	}
	p->sport = ((__u16)l4[0] << 8) | l4[1];
	p->dport = ((__u16)l4[2] << 8) | l4[3];
	p->l4 = 1;
	p->l4off = off;
	__u8 tcp[2];
	if (bpf_skb_load_bytes(skb, off + 12, tcp, 2) == 0) {
		p->tcpflags = tcp[1];
		p->flags = 1;
		if (p->proto == IPPROTO_TCP_)
			p->hdrlen += (tcp[0] >> 4) * 4;
	} else if (p->proto == IPPROTO_TCP_) {
		p->family = 0;
	}
	if (p->proto == 17)
		p->hdrlen += 8;
}

static __always_inline int prefix_match(const __u32 *addr, const __u32 *want, const __u32 *mask, __u8 family)
{
	if ((addr[0] & mask[0]) != want[0])
		return 0;
	if (family == 6 && ((addr[1] & mask[1]) != want[1] || (addr[2] & mask[2]) != want[2] ||
			    (addr[3] & mask[3]) != want[3]))
		return 0;
	return 1;
}

static __always_inline int rule_match(const struct rule *r, const struct pkt *p)
{
	if ((r->flags & F_MARK) && (p->mark & r->mark_mask) != r->mark_val)
		return 0;
	if (!r->family)
		return 1; // mark only: any packet, IP or not
	if (r->family != p->family)
		return 0;
	if ((r->flags & F_SRC) && !prefix_match(p->src, r->src, r->src_mask, p->family))
		return 0;
	if ((r->flags & F_DST) && !prefix_match(p->dst, r->dst, r->dst_mask, p->family))
		return 0;
	if ((r->flags & F_PROTO) && p->proto != r->proto)
		return 0;
	if (r->dscp_set && !(r->dscp_set & (1ULL << (p->tos >> 2))))
		return 0;
	if ((r->flags & F_TOS) && (p->tos & r->tos_mask) != r->tos_val)
		return 0;
	if (r->flags & F_L4) {
		if (!p->l4 || p->sport < r->sport_lo || p->sport > r->sport_hi || p->dport < r->dport_lo ||
		    p->dport > r->dport_hi)
			return 0;
	}
	// A small pure ACK: ACK alone among URG ACK PSH RST SYN FIN, and an
	// IP length (IPv6: payload length) under 128.
	if ((r->flags & F_TCP_ACK) && (!p->flags || (p->tcpflags & 0x3f) != 0x10 || p->iplen >= 128))
		return 0;
	if ((r->flags & F_TCP_SYN) && (!p->flags || !(p->tcpflags & 0x02)))
		return 0;
	return 1;
}

struct scan {
	const struct pkt *p;
	__u32 first; // index of the first rule to test
	__u32 hit;   // index of the matching rule + 1; 0: none
};

static long scan_rule(__u32 i, void *data)
{
	struct scan *s = data;
	__u32 idx = s->first + i;
	struct rule *r = bpf_map_lookup_elem(&rules, &idx);
	if (!r)
		return 1;
	if (rule_match(r, s->p)) {
		s->hit = idx + 1;
		return 1;
	}
	return 0;
}

// A walk through the rule blocks: block 0 mirrors the u32 filter list
// sluice would attach to the HTB root, the others those of gating
// classes. Each step is one bpf_loop iteration, so that the verifier
// checks the step once instead of once per unrolled iteration.
struct walk {
	const struct pkt *p;
	__u32 b, from;
	int found; // 1: res is the packet's class
	struct target res;
};

static long walk_step(__u32 i, void *ctx)
{
	struct walk *w = ctx;
	__u32 b = w->b;
	struct block *blk = bpf_map_lookup_elem(&blocks, &b);
	if (!blk)
		return 1;
	struct scan s = { .p = w->p, .first = blk->first + w->from };
	if (w->from < blk->count)
		bpf_loop(blk->count - w->from, scan_rule, &s, 0);
	struct target *t = 0;
	if (!s.hit) {
		__u32 f = blk->fallback;
		if (blk->has_fallback)
			t = bpf_map_lookup_elem(&targets, &f);
		goto out;
	}
	__u32 ri = s.hit - 1;
	struct rule *r = bpf_map_lookup_elem(&rules, &ri);
	if (!r)
		return 1;
	__u32 tg = r->target;
	if (r->kind == K_CLASS) {
		t = bpf_map_lookup_elem(&targets, &tg);
		goto out;
	}
	if (r->kind == K_GATE) {
		w->b = tg;
		w->from = 0;
		return 0;
	}
	// K_HOSTS: the host's own class, by longest prefix.
	const struct pkt *p = w->p;
	struct lpm_key k = { .table = tg * 2 + (p->family == 6) };
	k.prefixlen = 32 + (p->family == 6 ? 128 : 32);
	__builtin_memcpy(k.addr, (r->aux & H_BY_SRC) ? p->src : p->dst, 16);
	t = bpf_map_lookup_elem(&hosts, &k);
	if (!t && (r->aux & H_FALLTHROUGH)) {
		w->from = ri - blk->first + 1;
		return 0;
	}
out:
	if (t) {
		w->res = *t;
		w->found = 1;
	}
	return 1;
}

// classify finds the class of a packet: it fills *out and returns 1, or
// returns 0 for the tree's default class.
static __always_inline int classify(const struct pkt *p, struct target *out)
{
	struct walk w = { .p = p };
	bpf_loop(MAX_STEPS, walk_step, &w, 0);
	if (w.found != 1)
		return 0;
	*out = w.res;
	return 1;
}

// meter colours a packet of len bytes with an RFC 2697 srTCM or RFC 2698
// trTCM. Tokens are refilled from the time elapsed since the last packet.
// Every CPU meters against the same buckets under the policer's spin
// lock: per-CPU buckets would let each CPU pass the whole rate.
//
// A GSO or GRO packet (seg < len) is a train of seg-sized packets that
// can only pass or fall whole: it takes the colour its first segment
// would get and is charged in full, so a bucket may go into debt, paid
// back before the next packet conforms. Long-run rates hold and a burst
// smaller than a super-packet does not starve TCP. With seg == len this
// is exactly the RFC meter.
static __always_inline __u32 meter(struct policer *pl, __u64 now, __u32 len, __u32 seg, __u32 pre)
{
	__s64 cost = (__s64)len * NS, need = (__s64)seg * NS;
	__u32 c;
	bpf_spin_lock(&pl->lock);
	__u64 dt = now > pl->last ? now - pl->last : 0;
	if (now > pl->last)
		pl->last = now;
	__s64 cmax = pl->cbs * NS, emax = pl->ebs * NS;
	__u64 roomc = cmax > pl->tc ? cmax - pl->tc : 0;
	__u64 roome = emax > pl->te ? emax - pl->te : 0;
	if (pl->mode == MODE_SRTCM) {
		// Tokens go to C at CIR; once C is full, to E.
		__u64 room = roomc + roome;
		__u64 add = pl->cir && dt <= room / pl->cir ? dt * pl->cir : room;
		if (!pl->cir)
			add = 0;
		if (add <= roomc) {
			pl->tc += add;
		} else {
			pl->tc = cmax;
			pl->te += add - roomc;
		}
		if (pre == GREEN && pl->tc >= need) {
			pl->tc -= cost;
			c = GREEN;
		} else if (pre != RED && pl->te >= need) {
			pl->te -= cost;
			c = YELLOW;
		} else {
			c = RED;
		}
	} else {
		// trTCM: C fills at CIR, P (kept in te) at PIR.
		__u64 addc = pl->cir && dt <= roomc / pl->cir ? dt * pl->cir : roomc;
		__u64 addp = pl->pir && dt <= roome / pl->pir ? dt * pl->pir : roome;
		if (!pl->cir)
			addc = 0;
		if (!pl->pir)
			addp = 0;
		pl->tc += addc;
		pl->te += addp;
		if (pre == RED || pl->te < need) {
			c = RED;
		} else if (pre == YELLOW || pl->tc < need) {
			pl->te -= cost;
			c = YELLOW;
		} else {
			pl->te -= cost;
			pl->tc -= cost;
			c = GREEN;
		}
	}
	bpf_spin_unlock(&pl->lock);
	return c;
}

// pre_colour reads a colour-aware policer's input colour from the DSCP
// (RFC 2597 drop precedence): AFx2 is yellow, AFx3 red, the rest green.
static __always_inline __u32 pre_colour(const struct pkt *p)
{
	__u8 d = p->tos >> 2, cls = d >> 3, drop = d & 7;
	if (p->family == 0 || cls < 1 || cls > 4)
		return GREEN;
	if (drop == 4)
		return YELLOW;
	if (drop == 6)
		return RED;
	return GREEN;
}

// remark rewrites the DSCP, keeping the ECN bits, and fixes the IPv4
// header checksum (IPv6 has none).
static __always_inline void remark(struct __sk_buff *skb, const struct pkt *p, __u8 dscp)
{
	__u8 b[2];
	if (p->family == 0 || bpf_skb_load_bytes(skb, p->l3off, b, 2) < 0)
		return;
	if (p->family == 4) {
		__u16 oldw = ((__u16)b[0] << 8) | b[1];
		b[1] = (dscp << 2) | (b[1] & 3);
		__u16 neww = ((__u16)b[0] << 8) | b[1];
		bpf_l3_csum_replace(skb, p->l3off + 10, bpf_htons(oldw), bpf_htons(neww), 2);
		bpf_skb_store_bytes(skb, p->l3off + 1, &b[1], 1, 0);
	} else {
		__u8 tc = (dscp << 2) | (p->tos & 3);
		b[0] = (b[0] & 0xf0) | (tc >> 4);
		b[1] = (b[1] & 0x0f) | (tc << 4);
		bpf_skb_store_bytes(skb, p->l3off, b, 2, 0);
	}
}

// ip_bytes is what a policer charges for a packet: the bytes of the IP
// packets it stands for, as RFC 2697 and 2698 count them, the same on
// every hook. On egress the stack's wire_len counts each GSO segment
// with its link-layer header, which is taken off. On an ingress hook
// (where wire_len counts no link layer and a GRO packet's headers only
// once) the packet's own IP bytes count, plus the IP and transport
// headers of every segment after the first.
static __always_inline __u32 ip_bytes(const struct __sk_buff *skb, const struct config *cfg, const struct pkt *p, __u32 segs)
{
	__u32 l3 = p->family ? p->l3off : cfg->l2len;
	if (cfg->flags & CFG_INGRESS) {
		__u32 len = skb->len > l3 ? skb->len - l3 : 0;
		return len + (segs - 1) * p->hdrlen;
	}
	__u32 wire = skb->wire_len ? skb->wire_len : skb->len;
	return wire > segs * l3 ? wire - segs * l3 : 0;
}

// clock is CLOCK_MONOTONIC, or in tests (CFG_TEST_CLOCK) the time in
// skb->cb[0..1], which BPF_PROG_TEST_RUN sets and no run changes.
static __always_inline __u64 clock(const struct __sk_buff *skb, const struct config *cfg)
{
	if (cfg->flags & CFG_TEST_CLOCK)
		return (__u64)skb->cb[1] << 32 | skb->cb[0];
	return bpf_ktime_get_ns();
}

static __always_inline void count(void *map, __u32 idx, __u32 len)
{
	struct counter *c = bpf_map_lookup_elem(map, &idx);
	if (c) {
		c->packets++;
		c->bytes += len;
	}
}

// exempt reports whether the EDT program must leave a packet's timestamp
// alone: NTP (UDP port 123 on either side: ntpd reads skb->tstamp, and
// seed 000 broke it by re-stamping) and the policy's exempt rules.
static __always_inline int exempt(const struct config *cfg, const struct pkt *p)
{
	if (p->family && p->proto == 17 && p->l4 && (p->sport == 123 || p->dport == 123))
		return 1;
	if (!cfg->exempt)
		return 0;
	__u32 b = cfg->exempt - 1;
	struct block *blk = bpf_map_lookup_elem(&blocks, &b);
	if (!blk)
		return 0;
	struct scan s = { .p = p, .first = blk->first };
	bpf_loop(blk->count, scan_rule, &s, 0);
	return s.hit != 0;
}

// bitlen is the number of significant bits of v (0 for 0).
static __always_inline __u32 bitlen(__u64 v)
{
	__u32 n = 0;
#pragma unroll
	for (int s = 32; s > 0; s >>= 1) {
		if (v >> s) {
			v >>= s;
			n += s;
		}
	}
	return n + (v != 0);
}

static __always_inline void record_delay(__u32 hist, __u64 d)
{
	struct delay_hist *h = bpf_map_lookup_elem(&delays, &hist);
	if (!h)
		return;
	__u32 k = 0;
	if (d) {
		k = 1 + bitlen(d >> 10);
		if (k >= DELAY_BUCKETS)
			k = DELAY_BUCKETS - 1;
	}
	h->b[k]++;
	h->sum += d;
}

// reserve takes the next slot of delay ns on an aggregate's clock,
// running at rate bytes/s, and returns when it starts: max(t_next,
// now - burst), t_next moving on by delay. The clock is shared by every
// CPU and moved with atomic instructions only (seed 001's way; a lock
// would be the root lock again): the idle catch-up is a compare-and-swap
// that may lose to another CPU, harmlessly, and the reservation a
// fetch-and-add, so that concurrent packets take disjoint slots and the
// rate holds.
//
// A raised rate (the sharing controller lifting a cap, rate: auto)
// rescales the clock's lead to it: the bytes it stands for would take
// that much less at the new rate. Kept, the lead a slow cap built (up to
// its horizon, seconds at a few kbit/s) would have every packet of the
// new cap, with its shorter horizon, dropped until the clock caught up:
// a TCP flow lost every packet for seconds and went silent for its
// retransmission timeout (measured: a 18.7 kbit/s default class the
// controller released, 6.1 lane). The packets already stamped leave at
// their times; fq sends the new, earlier ones first. A lowered rate
// keeps the lead: its packets leave at the faster pace they were
// stamped at. Two CPUs seeing the change at once may both rescale: a
// lead a little shorter, once.
static __always_inline __u64 reserve(struct pace *st, __u64 now, __u64 burst, __u64 delay, __u64 rate)
{
	__u64 floor = now > burst ? now - burst : 0;
	__u64 cur = st->t_next;
	__u64 was = st->rate;
	if (was != rate) {
		if (was && rate > was && cur > now) {
			// Rates are below 2^48 bytes/s, leads below 2^47 ns.
			__u64 r = (rate << 16) / was;
			__u64 lead = ((cur - now) << 16) / r;
			if (__sync_val_compare_and_swap(&st->t_next, cur, now + lead) == cur)
				cur = now + lead;
			else
				cur = st->t_next;
		}
		st->rate = rate;
	}
	if (cur < floor)
		__sync_val_compare_and_swap(&st->t_next, cur, floor);
	return __sync_fetch_and_add(&st->t_next, delay);
}

// link_seg is what one segment of n bytes costs on the link.
static __always_inline __u32 link_seg(const struct config *cfg, __u32 n)
{
	__s32 l = (__s32)n + cfg->overhead;
	if (l < (__s32)cfg->mpu)
		l = cfg->mpu;
	if (l < 1)
		l = 1;
	if (cfg->atm)
		l = (l + 47) / 48 * 53;
	return l;
}

// link_bytes is what len bytes in segs segments (a GSO packet's, all but
// the last of one size) cost on the link: the overhead, mpu and cells
// per segment, which a size table cannot count (it sizes a GSO packet
// as one).
static __always_inline __u32 link_bytes(const struct config *cfg, __u32 len, __u32 segs)
{
	if (!cfg->overhead && !cfg->mpu && !cfg->atm)
		return len;
	if (segs <= 1)
		return link_seg(cfg, len);
	__u32 seg = len / segs;
	return (segs - 1) * link_seg(cfg, seg) + link_seg(cfg, len - (segs - 1) * seg);
}

// pace stamps a packet of len bytes with its earliest departure time,
// for the fq qdisc on its transmit queue to hold it until then: the
// start of its slot on its aggregate's clock, on its group's when it is
// a host of one (the group's cap binds its hosts together) and, when
// the direction's rate is a shared cap (cfg->pool_rate), on the pool's.
// Prod aggregates take their pool slot without waiting for it: nonprod
// traffic yields the link to them but never delays them. A packet due
// beyond the horizon is dropped and its slots given back. *gcounter is
// set to the group's counter, for the caller to count a packet passed.
// Returns 0 to pass the packet, 1 to drop it.
static __always_inline int pace(struct __sk_buff *skb, const struct config *cfg, const struct target *t, __u32 len, __u32 *gcounter)
{
	__u32 i = t->counter;
	struct pace *st = bpf_map_lookup_elem(&paces, &i);
	if (!st || !t->rate)
		return 0;
	__u64 now = clock(skb, cfg);
	// On egress the stack's own departure time (TCP pacing) is kept when
	// later; an ingress packet's tstamp is its arrival, on another clock.
	__u64 depart = now;
	if (!(cfg->flags & (CFG_INGRESS | CFG_EDT_ARRIVAL)) && skb->tstamp > now)
		depart = skb->tstamp;
	__u64 delay = (__u64)len * NS / t->rate;
	__u64 start = reserve(st, now, t->burst, delay, t->rate);
	if (start > depart)
		depart = start;
	__u64 horizon = t->horizon ? t->horizon : cfg->horizon;
	struct pace *gst = 0;
	__u64 gdelay = 0;
	if (t->group) {
		__u32 gi = t->group - 1;
		const struct target *g = bpf_map_lookup_elem(&targets, &gi);
		if (g && g->rate) {
			__u32 gc = g->counter;
			gst = bpf_map_lookup_elem(&paces, &gc);
			if (gst) {
				gdelay = (__u64)len * NS / g->rate;
				__u64 gstart = reserve(gst, now, g->burst, gdelay, g->rate);
				if (gstart > depart)
					depart = gstart;
				// A group slower than its host queues longer: its own
				// horizon's floor (a GSO packet at its cap) counts.
				if (g->horizon > horizon)
					horizon = g->horizon;
				*gcounter = gc;
			}
		}
	}
	struct pace *pool = 0;
	__u64 pdelay = 0;
	if (cfg->pool_rate) {
		__u32 pi = cfg->pool;
		pool = bpf_map_lookup_elem(&paces, &pi);
	}
	if (pool) {
		pdelay = (__u64)len * NS / cfg->pool_rate;
		__u64 pstart = reserve(pool, now, cfg->pool_burst, pdelay, cfg->pool_rate);
		if (!t->prod && pstart > depart)
			depart = pstart;
	}
	if (depart > now + horizon) {
		__sync_fetch_and_add(&st->t_next, -delay);
		if (gst)
			__sync_fetch_and_add(&gst->t_next, -gdelay);
		if (pool)
			__sync_fetch_and_add(&pool->t_next, -pdelay);
		__sync_fetch_and_add(&st->drops, 1);
		return 1;
	}
	record_delay(t->hist, depart - now);
	if (depart > now && depart != skb->tstamp)
		// The helper marks the time as a monotonic delivery time, which
		// fq reads; a plain store at an ingress device's hook would not.
		bpf_skb_set_tstamp(skb, depart, BPF_SKB_TSTAMP_DELIVERY_MONO);
	return 0;
}

// tcp_ts finds a TCP packet's timestamps option (RFC 7323): 1 with
// *val and *ecr (host order), 0 where it has none.
static __always_inline int tcp_ts(struct __sk_buff *skb, const struct pkt *p, __u32 *val, __u32 *ecr)
{
	__u8 doff;
	if (bpf_skb_load_bytes(skb, p->l4off + 12, &doff, 1) < 0)
		return 0;
	__u32 optlen = (doff >> 4) * 4;
	if (optlen <= 20)
		return 0;
	optlen -= 20;
	if (optlen > 40)
		return 0;
	// Linux and most stacks put it first on data and ACKs, after two
	// NOPs: one load, no walk.
	if (optlen >= 12) {
		__u32 w[3];
		if (bpf_skb_load_bytes(skb, p->l4off + 20, w, 12) < 0)
			return 0;
		if (w[0] == bpf_htonl(0x0101080a)) {
			*val = bpf_ntohl(w[1]);
			*ecr = bpf_ntohl(w[2]);
			return 1;
		}
	}
	__u8 o[64] = {}; // 40 used: 64 lets an index be masked in bounds
	if (bpf_skb_load_bytes(skb, p->l4off + 20, o, optlen) < 0)
		return 0;
	// Each option is a kind, a length and its data; NOP and EOL are one
	// byte. At most 40 bytes: 20 steps cover any layout.
	__u32 i = 0;
	for (int k = 0; k < 20; k++) {
		if (i >= optlen || i >= 40)
			return 0;
		__u8 kind = o[i & 63];
		if (kind == 0)
			return 0;
		if (kind == 1) {
			i++;
			continue;
		}
		if (i + 1 >= optlen)
			return 0;
		__u8 len = o[(i + 1) & 63];
		if (kind == 8 && len == 10 && i + 10 <= optlen && i <= 30) {
			*val = (__u32)o[(i + 2) & 63] << 24 | (__u32)o[(i + 3) & 63] << 16 | (__u32)o[(i + 4) & 63] << 8 | o[(i + 5) & 63];
			*ecr = (__u32)o[(i + 6) & 63] << 24 | (__u32)o[(i + 7) & 63] << 16 | (__u32)o[(i + 8) & 63] << 8 | o[(i + 9) & 63];
			return 1;
		}
		if (len < 2)
			return 0;
		i += len;
	}
	return 0;
}

static __always_inline struct rtt_stats *rtt_stats(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&rtt_counts, &zero);
}

// rtt_bucket is the histogram bucket of a round trip of d ns.
static __always_inline __u32 rtt_bucket(__u64 d)
{
	__u64 u = d >> 10;
	if (u < 16)
		return u;
	__u32 n = bitlen(u); // 5 and up
	__u32 o = n - 4;
	if (o > 20)
		return RTT_BUCKETS - 1;
	return 16 * o + ((u >> (n - 5)) & 15);
}

static __always_inline void rtt_sample(__u32 hist, __u64 d)
{
	struct rtt_hist *h = bpf_map_lookup_elem(&rtts, &hist);
	if (!h)
		return;
	__u32 k = rtt_bucket(d);
	// clang knows k is in range and drops the check; the verifier does
	// not know it, so hide k from clang.
	asm volatile("" : "+r"(k));
	if (k >= RTT_BUCKETS)
		return;
	__sync_fetch_and_add(&h->b[k], 1);
	__sync_fetch_and_add(&h->sum, d);
	__sync_fetch_and_add(&h->count, 1);
}

// host_rtt_bucket is the bucket of a round trip of d ns in a host's
// histogram.
static __always_inline __u32 host_rtt_bucket(__u64 d)
{
	__u64 u = d >> 15;
	if (u < 4)
		return u;
	__u32 n = bitlen(u); // 3 and up
	__u32 o = n - 2;
	if (o > 15)
		return HOST_RTT_BUCKETS - 1;
	return 4 * o + ((u >> (n - 3)) & 3);
}

// host_rtt_sample is a global function: the verifier checks it once,
// on its own, rather than on every path into rtt_record (inlined, it
// took Linux 6.1's verifier past its million instructions).
__attribute__((noinline)) int host_rtt_sample(__u32 counter, __u64 d)
{
	struct host_rtt *h = bpf_map_lookup_elem(&host_rtts, &counter);
	if (!h)
		return 0;
	__u32 k = host_rtt_bucket(d);
	asm volatile("" : "+r"(k)); // as in rtt_sample
	if (k >= HOST_RTT_BUCKETS)
		return 0;
	__sync_fetch_and_add(&h->b[k], 1);
	__sync_fetch_and_add(&h->sum, d);
	__sync_fetch_and_add(&h->count, 1);
	return 0;
}

// rtt_record starts a sample on the first packet that carries a new
// TSval of its flow, unless one is outstanding (one per flow and way: a
// sample per round trip is plenty, and the map stays one entry a flow).
// A TSval older than the newest seen (reordered, or a duplicate) starts
// none. A SYN without timestamps is timed to its SYN-ACK.
//
// rtt_record and rtt_echo are global functions, each checked once by the
// verifier on its own: inlined, their walks of the TCP options on every
// path through the classifier took Linux 6.1's verifier past its million
// instructions.
__attribute__((noinline)) int rtt_record(struct __sk_buff *skb, const struct config *cfg, const struct pkt *p, const struct target *t)
{
	if (!cfg || !p || !t)
		return 0; // never: the verifier checks a global function's pointers
	// Only data (and SYNs) start samples: the receiver answers data at
	// once (or within its delayed-ACK time), while the echo of a pure
	// ACK waits for whenever its peer next has data to send.
	__u32 ipbytes = p->family == 4 ? p->iplen : p->iplen + 40;
	int syn = (p->tcpflags & 0x12) == 0x02;
	if (ipbytes <= p->hdrlen && !syn)
		return 0;
	struct rtt_stats *st;
	__u32 val = 0, ecr = 0;
	int ts = tcp_ts(skb, p, &val, &ecr);
	if (!ts) {
		if ((st = rtt_stats()))
			st->untimed++;
		if (!syn)
			return 0;
	}
	struct flow_key k = { .family = p->family, .sport = p->sport, .dport = p->dport };
	__builtin_memcpy(k.src, p->src, 16);
	__builtin_memcpy(k.dst, p->dst, 16);
	struct flow_state *f = bpf_map_lookup_elem(&flows, &k);
	// The clock only where a sample starts: most packets repeat a value.
	__u64 now;
	if (!f) {
		now = clock(skb, cfg);
		now |= !now; // 0 marks no sample outstanding
		struct flow_state n = { .t = now, .tsval = val, .last = val, .hist = t->rtt, .seen = ts, .syn = !ts };
		bpf_map_update_elem(&flows, &k, &n, BPF_NOEXIST);
		if ((st = rtt_stats()))
			st->recorded++;
		return 0;
	}
	if (f->pending) {
		host_rtt_sample(t->counter, f->pending);
		f->pending = 0;
	}
	if (ts) {
		if (f->seen && (__s32)(val - f->last) <= 0)
			return 0; // not a new value
		f->last = val;
		f->seen = 1;
	}
	st = rtt_stats();
	now = clock(skb, cfg);
	now |= !now;
	if (f->t) {
		if (now - f->t < RTT_EXPIRY)
			return 0;
		if (st)
			st->missed++;
	}
	f->tsval = val;
	f->syn = !ts;
	f->hist = t->rtt;
	f->t = now;
	if (st)
		st->recorded++;
	return 0;
}

// rtt_echo ends the sample of the flow a packet answers: the TSecr that
// echoes the outstanding TSval (or the SYN-ACK of a SYN without
// timestamps). An echo of a later value means the outstanding one will
// never be echoed: given up, never read as a round trip.
__attribute__((noinline)) int rtt_echo(struct __sk_buff *skb, const struct config *cfg, const struct pkt *p)
{
	if (!cfg || !p)
		return 0; // as in rtt_record
	__u32 val = 0, ecr = 0;
	int ts = tcp_ts(skb, p, &val, &ecr);
	int synack = (p->tcpflags & 0x12) == 0x12;
	if (!ts && !synack)
		return 0;
	struct flow_key k = { .family = p->family, .sport = p->dport, .dport = p->sport };
	__builtin_memcpy(k.src, p->dst, 16);
	__builtin_memcpy(k.dst, p->src, 16);
	struct flow_state *f = bpf_map_lookup_elem(&flows, &k);
	if (!f || !f->t)
		return 0;
	struct rtt_stats *st = rtt_stats();
	if (f->syn) {
		if (!synack)
			return 0;
	} else {
		if (!ts || ecr == 0 || (__s32)(ecr - f->tsval) < 0)
			return 0; // an older echo: ours is still to come
		if (ecr != f->tsval) {
			f->t = 0;
			if (st)
				st->missed++;
			return 0;
		}
	}
	__u64 t = f->t, now = clock(skb, cfg);
	f->t = 0;
	if (now <= t)
		return 0;
	__u64 d = now - t;
	rtt_sample(f->hist, d);
	f->pending = d < 0xffffffff ? d : 0xffffffff;
	if (st)
		st->matched++;
	return 0;
}

SEC("tc")
int sluice_classify(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&settings, &zero);
	if (!cfg)
		return TC_ACT_OK;
	struct pkt p = { .mark = skb->mark };
	parse(skb, cfg, &p);
	int tcp = p.family && p.proto == IPPROTO_TCP_ && p.flags;
	if (tcp && (cfg->flags & CFG_RTT_ECHO))
		rtt_echo(skb, cfg, &p);
	if ((cfg->flags & CFG_OBSERVE) && !(cfg->flags & CFG_RTT_RECORD))
		return TC_ACT_UNSPEC; // echoes only: no tree classifies here
	struct target found, *t = 0;
	if ((p.family || skb->mark) && classify(&p, &found))
		t = &found;
	if (!t) {
		__u32 d = cfg->default_target;
		t = bpf_map_lookup_elem(&targets, &d);
		if (!t)
			return (cfg->flags & CFG_OBSERVE) ? TC_ACT_UNSPEC : TC_ACT_OK;
	}
	if (tcp && (cfg->flags & CFG_RTT_RECORD))
		rtt_record(skb, cfg, &p, t);
	if (cfg->flags & CFG_OBSERVE)
		return TC_ACT_UNSPEC; // HTB's own filters classify
	__u32 len = skb->wire_len ? skb->wire_len : skb->len;
	__u32 classid = t->classid, queue = t->queue;
	// Sharded tree: a class without a queue of its own has a copy in
	// every shard (HTB major 0x100 + shard); pick one by flow hash so
	// that a flow stays in order on one queue.
	__u32 shards = cfg->shards;
	if (shards > 1 && !queue) {
		__u32 s = bpf_get_hash_recalc(skb) % shards;
		classid += s << 16;
		queue = s + 1;
	}
	if (cfg->flags & CFG_EDT) {
		// Prod and nonprod aggregates go to their own transmit queues (by
		// priority under mqprio, by queue_mapping under mq), each flow
		// always to the same queue: fq orders a flow within one queue
		// only, so a flow spread over queues would be reordered.
		__u32 c = t->prod ? 0 : 1;
		if (cfg->flags & CFG_EDT_PRIO)
			skb->priority = t->prod ? 6 : 0; // TC_PRIO_INTERACTIVE, TC_PRIO_BESTEFFORT
		__u16 qn = cfg->q_count[c & 1];
		if (qn)
			queue = cfg->q_first[c & 1] + bpf_get_hash_recalc(skb) % qn + 1;
		__u32 segs = skb->gso_segs > 1 ? skb->gso_segs : 1;
		__u32 gcounter = 0;
		if (!exempt(cfg, &p) && pace(skb, cfg, t, link_bytes(cfg, len, segs), &gcounter))
			return TC_ACT_SHOT;
		if (gcounter)
			count(&counters, gcounter, len);
	}
	if (cfg->flags & CFG_SET_PRIORITY)
		skb->priority = classid;
	skb->tc_classid = classid;
	// A recorded queue (tx queue + 1) that the stack's skb_tx_hash keeps
	// when it picks the transmit queue after this hook.
	if (queue)
		skb->queue_mapping = queue;
	count(&counters, t->counter, len);
	__u32 pol = t->policer;
	if (!pol)
		return TC_ACT_OK;
	struct policer *pl = bpf_map_lookup_elem(&policers, &pol);
	if (!pl)
		return TC_ACT_OK;
	__u32 pre = pl->aware ? pre_colour(&p) : GREEN;
	__u64 now = clock(skb, cfg);
	__u32 segs = skb->gso_segs > 1 ? skb->gso_segs : 1;
	__u32 bytes = ip_bytes(skb, cfg, &p, segs);
	__u32 c = meter(pl, now, bytes, bytes / segs, pre);
	count(&colours, pol * 3 + c, bytes);
	if (c > RED)
		return TC_ACT_OK;
	__u8 act = pl->act[c];
	if (act == ACT_DROP)
		return TC_ACT_SHOT;
	if (act == ACT_REMARK)
		remark(skb, &p, pl->dscp[c]);
	return TC_ACT_OK;
}
