package plan

import (
	"math"
	"strings"
	"testing"
	"time"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
	"sluice/units"
)

func parseEDT(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, _, err := policy.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const edtPolicy = `interfaces:
  - name: eth0
    egress:
      backend: edt
      rate: 100mbit
      default: bulk
      exempt: [{proto: udp, dport: 5353}]
      classes:
        - name: web
          rate: 20mbit
          ceil: 40mbit
          match: [{proto: tcp, dport: 443}]
        - name: bulk
          rate: 10mbit
          ceil: 30mbit
          prio: 3
          burst: 30kb
        - name: subs
          rate: 50mbit
          prio: 2
          match: [{dst: 10.1.0.0/24}]
          per_host: {by: dst, cidr: 10.1.0.0/29, rate: 1mbit, ceil: 5mbit}
`

func edtOf(t *testing.T, d *Device) (*bpf.Hook, []*tc.Qdisc) {
	t.Helper()
	var hook *bpf.Hook
	var qs []*tc.Qdisc
	for _, o := range d.Objects {
		switch x := o.(type) {
		case *bpf.Hook:
			hook = x
		case *tc.Qdisc:
			qs = append(qs, x)
		case *tc.Class, *tc.Filter:
			if f, ok := x.(*tc.Filter); !ok || f.Dev == d.Name {
				t.Fatalf("an EDT tree has no HTB classes or filters: %s", o.Describe())
			}
		}
	}
	if hook == nil || hook.Content.EDT == nil {
		t.Fatal("no EDT program")
	}
	return hook, qs
}

// An EDT egress on an 8-queue device with prod and nonprod classes:
// mqprio 7:1 with an fq per queue, every leaf and host an aggregate
// capped at its ceil, prod flags from prio 0, the exempt rule in its
// own block, no shared cap while the caps fit the rate.
func TestEDTPlan(t *testing.T) {
	feats := Everything
	feats.Qdiscs = map[string]bool{"fq": true, "mqprio": true, "clsact": true}
	feats.TxQueues = map[string]int{"eth0": 8}
	p, err := Build(parseEDT(t, edtPolicy), feats, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := p.Devices[0]
	hook, qs := edtOf(t, d)
	if !d.EDT || qs[0].Kind != "mqprio" || qs[0].Parent != tc.HandleRoot {
		t.Fatalf("root %s, want mqprio", qs[0].Describe())
	}
	m := qs[0].MQPrio
	if m.NumTC != 2 || m.Count[0] != 7 || m.Count[1] != 1 || m.Offset[1] != 7 || m.Map[prodPriority] != 0 || m.Map[0] != 1 {
		t.Fatalf("mqprio mapping %+v, want prod 7@0 nonprod 1@7", m)
	}
	fqs := 0
	for _, q := range qs[1:] {
		if q.Kind == "fq" {
			fqs++
			if q.Fq.OrphanMask != FqTag(d.Alloc.R2Q()) || q.Fq.FlowLimit < 10000 {
				t.Fatalf("fq %s: no tag or fq's own flow limit", q.Describe())
			}
		}
	}
	if fqs != 8 {
		t.Fatalf("%d fq qdiscs, want one per queue (8)", fqs)
	}
	c := hook.Content
	e := c.EDT
	if e.Horizon != uint64(policy.DefaultHorizon) || !e.Prio || e.Queues[0] != (bpf.QueueRange{Count: 7}) || e.Queues[1] != (bpf.QueueRange{First: 7, Count: 1}) {
		t.Fatalf("EDT settings %+v", e)
	}
	// caps: web 40 + bulk 30 + 6 hosts x 5 = 100mbit: no shared cap.
	if e.PoolRate != 0 {
		t.Fatalf("a shared cap of %d bytes/s although the caps add up to the rate", e.PoolRate)
	}
	byName := map[string]bpf.Target{}
	for _, tg := range c.Targets {
		for _, ci := range d.Classes {
			if ci.Counter == tg.Counter {
				byName[ci.Name] = tg
			}
		}
	}
	web, bulk := byName["web"], byName["bulk"]
	if web.Rate != 5_000_000 || web.Prod != 1 || web.Burst != uint32(5*time.Millisecond) {
		t.Fatalf("web: %+v, want 40mbit cap, prod, 5 ms burst", web)
	}
	// burst 30kb (30,720 bytes) at 30mbit (3.75e6 bytes/s) is 8.192 ms.
	if bulk.Rate != 3_750_000 || bulk.Prod != 0 || bulk.Burst != 8_192_000 || bulk.Classid != 0 {
		t.Fatalf("bulk: %+v, want 30mbit cap, nonprod, 8.192 ms burst", bulk)
	}
	// A 5mbit host's horizon fits a 64 KB GSO packet and three frames
	// (112 ms); a 40mbit class keeps the tree's 100 ms.
	if web.Horizon != uint64(policy.DefaultHorizon) {
		t.Fatalf("web horizon %d", web.Horizon)
	}
	for _, h := range c.Hosts {
		if h.Horizon != uint64(float64(MinBfifoBytes)*1e9/625_000) {
			t.Fatalf("host horizon %d, want %d", h.Horizon, uint64(float64(MinBfifoBytes)*1e9/625_000))
		}
		break
	}
	if len(c.Hosts) != 6 {
		t.Fatalf("%d hosts, want 6", len(c.Hosts))
	}
	hist := uint16(0)
	for _, h := range c.Hosts {
		if h.Rate != 625_000 || h.Prod != 0 || h.Hist == 0 || hist != 0 && h.Hist != hist {
			t.Fatalf("host target %+v: want a 5mbit nonprod aggregate sharing its class's histogram", h)
		}
		hist = h.Hist
	}
	if hist == web.Hist || web.Hist == bulk.Hist {
		t.Fatal("classes share a delay histogram")
	}
	blk := c.Blocks[e.Exempt-1]
	r := c.Rules[blk.First]
	if blk.Count != 2 || r.Proto != 17 || r.DportLo != 5353 { // IPv4 and IPv6
		t.Fatalf("exempt block %+v rule %+v", blk, r)
	}
	if len(d.Classes) != 9 || d.Classes[8].Name != "subs" || d.Classes[8].Counter != 0 || d.Classes[8].Hist != hist {
		t.Fatalf("%d classes listed, want 8 aggregates (2 classes, 6 hosts) and subs summing its hosts: %+v", len(d.Classes), d.Classes)
	}

	// Re-planned with its allocation, nothing moves.
	again, err := Build(parseEDT(t, edtPolicy), feats, map[string]*Alloc{"eth0": d.Alloc})
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := edtOf(t, again.Devices[0])
	if !h2.Content.Equal(c) {
		t.Fatal("re-planning changed the program's content")
	}
}

// Oversubscribed caps make the direction's rate a shared cap; mq
// without mqprio spreads prod and nonprod by queue_mapping only; a
// single-queue device gets a root fq; ingress gets an 8-queue ifb.
func TestEDTPlanVariants(t *testing.T) {
	src := strings.Replace(edtPolicy, "rate: 100mbit", "rate: 60mbit", 1)
	src = strings.Replace(src, "rate: 50mbit", "rate: 30mbit", 1)
	feats := Everything
	feats.Qdiscs = map[string]bool{"fq": true, "clsact": true}
	feats.TxQueues = map[string]int{"eth0": 4}
	p, err := Build(parseEDT(t, src), feats, nil)
	if err != nil {
		t.Fatal(err)
	}
	hook, qs := edtOf(t, p.Devices[0])
	e := hook.Content.EDT
	if e.PoolRate != 7_500_000 || e.Pool == 0 || e.PoolBurst != uint32ns(5*time.Millisecond) {
		t.Fatalf("shared cap %+v, want 60mbit", e)
	}
	if qs[0].Kind != "mq" || e.Prio || e.Queues[0] != (bpf.QueueRange{Count: 3}) || e.Queues[1] != (bpf.QueueRange{First: 3, Count: 1}) {
		t.Fatalf("root %s, settings %+v: want mq, prod 3 queues, nonprod 1", qs[0].Describe(), e)
	}

	feats.TxQueues = map[string]int{"eth0": 1}
	p, err = Build(parseEDT(t, edtPolicy), feats, nil)
	if err != nil {
		t.Fatal(err)
	}
	hook, qs = edtOf(t, p.Devices[0])
	if len(qs) != 2 || qs[0].Kind != "fq" || qs[0].Parent != tc.HandleRoot || hook.Content.EDT.Queues[0].Count != 0 {
		t.Fatalf("single queue: %v", qs)
	}

	in := parseEDT(t, "interfaces:\n  - name: eth0\n    ingress:\n      backend: edt\n      rate: 20mbit\n      horizon: 50ms\n")
	p, err = Build(in, feats, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := p.Devices[0]
	hook, qs = edtOf(t, d)
	link := d.Objects[0].(*tc.Link)
	if !d.Ifb || link.TxQueues != policy.DefaultIfbQueues || qs[0].Kind != "mq" || len(qs) != 1+8+2 {
		t.Fatalf("ingress: link %+v, qdiscs %d", link, len(qs))
	}
	if e := hook.Content.EDT; !e.FromIngress || e.Horizon != uint64(50*time.Millisecond) || e.Queues[0].Count != 8 {
		t.Fatalf("ingress settings %+v", e)
	}
	last := d.Objects[len(d.Objects)-1].(*tc.Filter)
	if last.U32 == nil || last.U32.RedirectDev != d.Name {
		t.Fatalf("no redirect to %s: %s", d.Name, last.Describe())
	}

	// Without fq the plan fails, at the backend key.
	feats.Qdiscs = map[string]bool{"clsact": true}
	if _, err := Build(parseEDT(t, edtPolicy), feats, nil); err == nil || !strings.Contains(err.Error(), "p.yaml:4:16: eth0 egress: backend edt needs the fq qdisc") {
		t.Fatalf("without fq: %v", err)
	}
}

func uint32ns(d time.Duration) uint64 { return uint64(d) }

// An aggregate's horizon: the tree's, raised to hold a 64 KB GSO packet
// and three frames at its cap, but that floor waits at most a second,
// and the horizon holds at least four frames (a queue of seconds at a
// low cap is one TCP times out of).
func TestHorizonFor(t *testing.T) {
	ms := func(d float64) uint64 { return uint64(d * float64(time.Millisecond)) }
	for _, tt := range []struct {
		tree  time.Duration
		cap   float64 // bits/s
		want  uint64
		about bool // within 1%
	}{
		{100 * time.Millisecond, 20e6, ms(100), false},           // the tree's
		{100 * time.Millisecond, 2e6, ms(70078 * 8 / 2e3), true}, // 64 KB and three frames: 280 ms
		{100 * time.Millisecond, 100e3, ms(1000), false},         // that floor waits at most 1 s
		{100 * time.Millisecond, 18.7e3, ms(4 * 1514 * 8 / 18.7), true},
		{5 * time.Second, 100e3, ms(5000), false}, // a longer tree horizon stands
		{100 * time.Millisecond, 1e3, ms(10000), false},
		{100 * time.Millisecond, 0, ms(100), false},
	} {
		got := HorizonFor(tt.tree, units.FromBits(tt.cap))
		if tt.about && math.Abs(float64(got)-float64(tt.want)) > 0.01*float64(tt.want) || !tt.about && got != tt.want {
			t.Errorf("HorizonFor(%v, %.0f bit/s) = %v, want %v", tt.tree, tt.cap, time.Duration(got), time.Duration(tt.want))
		}
	}
}
