package plan

import (
	"strings"
	"testing"

	"sluice/bpf"
	"sluice/tc"
	"sluice/units"
)

const limitsPolicy = `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: b
      sharing: controller
      classes:
        - {name: a, rate: 1mbit, ceil: 20mbit, prio: 1, match: [{dport: 1}]}
        - {name: b, rate: 2mbit, prio: 1}
        - {name: p, rate: 1mbit, prio: 0, match: [{dport: 2}]}
`

// A limit lands on the controlled class, held within its planned rate
// and ceil; the plan it was laid over is unchanged; a prod class and
// an unknown object take no limit.
func TestWithLimitsClasses(t *testing.T) {
	pl, err := Build(parseEDT(t, limitsPolicy), Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	classes := map[string]*tc.Class{}
	for _, o := range pl.Devices[0].Objects {
		if c, ok := o.(*tc.Class); ok {
			classes[c.Name] = c
		}
	}
	a, b, p := classes["a"], classes["b"], classes["p"]
	if !a.Controlled || !b.Controlled || p.Controlled {
		t.Fatalf("controlled: a %v b %v p %v", a.Controlled, b.Controlled, p.Controlled)
	}
	mbit := func(n float64) units.Rate { return units.FromBits(n * 1e6) }
	for _, tt := range []struct {
		name               string
		lim                Limit
		wantRate, wantCeil units.Rate
	}{
		{"within", Limit{Rate: mbit(5), Ceil: mbit(10)}, mbit(5), mbit(10)},
		{"ceil above the policy's", Limit{Rate: mbit(5), Ceil: mbit(25)}, mbit(5), mbit(20)},
		{"rate under the policy's", Limit{Rate: mbit(0.5), Ceil: mbit(10)}, mbit(1), mbit(10)},
		{"rate above the ceil", Limit{Rate: mbit(12), Ceil: mbit(10)}, mbit(10), mbit(10)},
		{"ceil under the rate", Limit{Rate: 0, Ceil: mbit(0.1)}, mbit(1), mbit(1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := Limits{ClassLimit(a): tt.lim, ClassLimit(p): {Rate: mbit(9), Ceil: mbit(9)},
				{Object: "class/eth9/1:5"}: {Rate: mbit(9), Ceil: mbit(9)}}
			over := pl.WithLimits(l)
			var got *tc.Class
			for _, o := range over.Devices[0].Objects {
				if c, ok := o.(*tc.Class); ok && c.Name == "a" {
					got = c
				}
				if c, ok := o.(*tc.Class); ok && c.Name == "p" && c != p {
					t.Errorf("prod class p took a limit: %s", c.Describe())
				}
			}
			if got.Rate != tt.wantRate || got.Ceil != tt.wantCeil {
				t.Errorf("a: rate %v ceil %v, want %v %v", got.Rate, got.Ceil, tt.wantRate, tt.wantCeil)
			}
			if a.Rate != mbit(1) || a.Ceil != mbit(20) {
				t.Errorf("the plan itself changed: a rate %v ceil %v", a.Rate, a.Ceil)
			}
		})
	}
	if pl.WithLimits(nil) != pl {
		t.Error("no limits: not the plan itself")
	}
	if over := pl.WithLimits(Limits{ClassLimit(a): {Rate: a.Rate, Ceil: a.Ceil}}); over.Devices[0] != pl.Devices[0] {
		t.Error("a limit equal to the plan copied the device")
	}
}

// An aggregate's cap is held at most at its planned one, with the
// horizon that goes with it.
func TestWithLimitsTargets(t *testing.T) {
	pl, err := Build(parseEDT(t, `interfaces:
  - name: eth0
    egress:
      backend: edt
      rate: 30mbit
      default: b
      sharing: controller
      classes:
        - {name: a, rate: 1mbit, ceil: 20mbit, match: [{dport: 1}]}
        - {name: b, rate: 1mbit}
`), Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	var hook *bpf.Hook
	for _, o := range pl.Devices[0].Objects {
		if h, ok := o.(*bpf.Hook); ok {
			hook = h
		}
	}
	if hook == nil || len(hook.Controlled) != 2 {
		t.Fatalf("hook %v", hook)
	}
	ta := hook.Controlled[0]
	planned := hook.Content.Targets[ta]
	for _, tt := range []struct {
		name string
		cap  units.Rate
		want units.Rate
	}{
		{"under", units.FromBits(4e6), units.FromBits(4e6)},
		{"above the planned", planned.Rate * 2, planned.Rate},
		{"zero", 0, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			over := pl.WithLimits(Limits{TargetLimit(hook, ta): {Ceil: tt.cap}})
			var got *bpf.Hook
			for _, o := range over.Devices[0].Objects {
				if h, ok := o.(*bpf.Hook); ok {
					got = h
				}
			}
			tg := got.Content.Targets[ta]
			if tg.Rate != tt.want || tg.Horizon != HorizonFor(pl.Devices[0].Controllers[0].Horizon, tt.want) {
				t.Errorf("target rate %d horizon %d, want %d", tg.Rate, tg.Horizon, tt.want)
			}
			if hook.Content.Targets[ta] != planned {
				t.Error("the plan's own targets changed")
			}
		})
	}
}

// A sharded tree's balancer may cut a shard below rate/N, its root and
// its copies of the other classes alike (down to their floors), and
// give it up to the direction's rate.
func TestWithLimitsShards(t *testing.T) {
	pol := parseEDT(t, `interfaces:
  - name: eth0
    egress:
      rate: 40mbit
      classifier: bpf
      shards: 4
      default: rest
      classes:
        - {name: subs, rate: 20mbit, per_host: {by: dst, cidr: 10.0.0.0/28, ceil: 40mbit}}
        - {name: rest, rate: 10mbit}
`)
	feats := Everything
	feats.TxQueues = map[string]int{"eth0": 4}
	pl, err := Build(pol, feats, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := pl.Devices[0]
	if len(d.Controllers) != 1 || !d.Controllers[0].Shards || len(d.Controllers[0].Children) != 4 {
		t.Fatalf("controllers %+v, want one balancing 4 shards", d.Controllers)
	}
	ch := d.Controllers[0].Children[0]
	if len(ch.Scaled) != 2 {
		t.Fatalf("shard 0 scales %v, want its copies of subs and rest", ch.Scaled)
	}
	byHandle := map[tc.Handle]*tc.Class{}
	for _, o := range d.Objects {
		if c, ok := o.(*tc.Class); ok {
			byHandle[c.Handle] = c
		}
	}
	root, subs := byHandle[ch.Handle], byHandle[ch.Scaled[0].Handle]
	mbit := func(n float64) units.Rate { return units.FromBits(n * 1e6) }
	for _, tt := range []struct {
		name         string
		root, subs   units.Rate
		wantR, wantS units.Rate
	}{
		{"cut below rate/4", mbit(2), mbit(1), mbit(2), mbit(1)},
		{"the whole rate", mbit(40), mbit(20), mbit(40), mbit(20)},
		{"under the floors", 1, 1, ch.Floor, max(ch.Scaled[0].Rate/128, 1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			over := pl.WithLimits(Limits{ClassLimit(root): {Rate: tt.root, Ceil: root.Ceil}, ClassLimit(subs): {Rate: tt.subs, Ceil: subs.Ceil}})
			got := map[tc.Handle]*tc.Class{}
			for _, o := range over.Devices[0].Objects {
				if c, ok := o.(*tc.Class); ok {
					got[c.Handle] = c
				}
			}
			if r := got[root.Handle].Rate; r != tt.wantR {
				t.Errorf("shard root rate %v, want %v (planned %v)", r, tt.wantR, root.Rate)
			}
			if r := got[subs.Handle].Rate; r != tt.wantS {
				t.Errorf("shard's subs rate %v, want %v (planned %v)", r, tt.wantS, subs.Rate)
			}
		})
	}
}

const autoPolicy = `interfaces:
  - name: eth0
    egress:
      rate: auto
      auto: {min: 5mbit, base: 20mbit, max: 80mbit}
      default: bulk
      classes:
        - {name: voip, rate: 1mbit, ceil: 50%, match: [{dport: 5060}]}
        - {name: bulk, rate: 80%, leaf: bfifo}
`

// A rate limit plans an auto tree again at the rate: the root class
// and the percentages follow it, absolute rates stay, the objects are
// the same ones (keys and order), and the rate is held between auto's
// min and max. The plan laid over is unchanged.
func TestWithLimitsRate(t *testing.T) {
	mbit := func(n float64) units.Rate { return units.FromBits(n * 1e6) }
	for _, src := range []string{autoPolicy, strings.Replace(autoPolicy, "rate: auto\n", "rate: auto\n      classifier: bpf\n", 1)} {
		pl, err := Build(parseEDT(t, src), Everything, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := pl.Devices[0]
		if d.Auto == nil || d.Rate() != mbit(20) {
			t.Fatalf("auto %v, planned at %d", d.Auto, d.Rate())
		}
		if len(d.Notes) == 0 || !strings.Contains(d.Notes[len(d.Notes)-1], "rate: auto: planned at its base, 20mbit; the agent (sluice agent) moves it between 5mbit and 80mbit") {
			t.Errorf("plan's notes %q do not say the agent moves the rate", d.Notes)
		}
		classes := func(p *Plan) map[string]*tc.Class {
			out := map[string]*tc.Class{}
			for _, o := range p.Devices[0].Objects {
				if c, ok := o.(*tc.Class); ok {
					out[c.Name] = c
				}
			}
			return out
		}
		base := classes(pl)
		for _, tt := range []struct {
			name string
			rate units.Rate
			want units.Rate // the tree's rate
		}{
			{"down", mbit(10), mbit(10)},
			{"up", mbit(40), mbit(40)},
			{"below min", mbit(1), mbit(5)},
			{"above max", mbit(200), mbit(80)},
		} {
			over := pl.WithLimits(Limits{RateLimit(d): {Rate: tt.rate}})
			nd := over.Devices[0]
			if nd.Rate() != tt.want {
				t.Errorf("%s: tree at %d, want %d", tt.name, nd.Rate(), tt.want)
			}
			if len(nd.Objects) != len(d.Objects) {
				t.Fatalf("%s: %d objects, planned %d", tt.name, len(nd.Objects), len(d.Objects))
			}
			for i, o := range nd.Objects {
				if o.Key() != d.Objects[i].Key() {
					t.Errorf("%s: object %d is %s, planned %s", tt.name, i, o.Key(), d.Objects[i].Key())
				}
			}
			c := classes(over)
			f := float64(tt.want) / float64(mbit(20))
			near := func(a units.Rate, b float64) bool { return float64(a) > b*0.999 && float64(a) < b*1.001 }
			if root := c[RootClassName]; root.Rate != tt.want || root.Ceil != tt.want {
				t.Errorf("%s: root %d/%d", tt.name, root.Rate, root.Ceil)
			}
			if !near(c["voip"].Rate, float64(base["voip"].Rate)) || !near(c["voip"].Ceil, float64(base["voip"].Ceil)*f) {
				t.Errorf("%s: voip %d/%d, planned %d/%d, factor %.2f", tt.name, c["voip"].Rate, c["voip"].Ceil, base["voip"].Rate, base["voip"].Ceil, f)
			}
			if !near(c["bulk"].Rate, float64(base["bulk"].Rate)*f) || !near(c["bulk"].Ceil, float64(base["bulk"].Ceil)*f) {
				t.Errorf("%s: bulk %d/%d, planned %d/%d, factor %.2f", tt.name, c["bulk"].Rate, c["bulk"].Ceil, base["bulk"].Rate, base["bulk"].Ceil, f)
			}
			if classes(pl)["bulk"] != base["bulk"] || pl.Devices[0] != d {
				t.Errorf("%s: the plan laid over changed", tt.name)
			}
		}
		// At the planned rate nothing is planned again.
		if over := pl.WithLimits(Limits{RateLimit(d): {Rate: mbit(20)}}); over.Devices[0] != d {
			t.Error("a rate limit at the planned rate planned the tree again")
		}
	}
	// A fixed-rate tree takes no rate limit.
	pl, err := Build(parseEDT(t, strings.Replace(strings.Replace(autoPolicy, "rate: auto", "rate: 20mbit", 1), "      auto: {min: 5mbit, base: 20mbit, max: 80mbit}\n", "", 1)), Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	if over := pl.WithLimits(Limits{RateLimit(pl.Devices[0]): {Rate: mbit(5)}}); over.Devices[0] != pl.Devices[0] {
		t.Error("a fixed-rate tree was planned again")
	}
}

// rate: auto's probes skip the tree: a u32 filter at prio 1 (the
// tree's rules after it) and a BPF rule first, both to HTB's direct
// queue 1:0; a fixed-rate tree has neither.
func TestAutoProbesSkipTheTree(t *testing.T) {
	src := strings.Replace(autoPolicy, "max: 80mbit}", "max: 80mbit, reflectors: [192.0.2.7, 192.0.2.8]}", 1)
	for _, bpfTree := range []bool{false, true} {
		s := src
		if bpfTree {
			s = strings.Replace(s, "rate: auto\n", "rate: auto\n      classifier: bpf\n", 1)
		}
		pl, err := Build(parseEDT(t, s), Everything, nil)
		if err != nil {
			t.Fatal(err)
		}
		var probes, rules int
		minPrio := uint16(0xFFFF)
		for _, o := range pl.Devices[0].Objects {
			switch x := o.(type) {
			case *tc.Filter:
				if x.U32 != nil && x.U32.ClassID == RootHandle {
					probes++
					if x.Prio != 1 {
						t.Errorf("the probes' filter at prio %d, want 1", x.Prio)
					}
				} else if x.U32 != nil && x.U32.ClassID != 0 {
					rules++
					minPrio = min(minPrio, x.Prio)
				}
			case *bpf.Hook:
				c := x.Content
				if len(c.Rules) < 2 || c.Targets[c.Rules[0].Target].Classid != uint32(RootHandle) || c.Rules[0].Proto != 1 {
					t.Fatalf("bpf: the first rule %+v does not send ICMP to 1:0", c.Rules[0])
				}
				probes++
			}
		}
		if probes == 0 {
			t.Errorf("bpf %v: no rule sends the probes past the tree", bpfTree)
		}
		if !bpfTree && (rules == 0 || minPrio < 2) {
			t.Errorf("the tree's rules start at prio %d (%d of them); want after the probes'", minPrio, rules)
		}
	}
	fixed := strings.Replace(strings.Replace(autoPolicy, "rate: auto", "rate: 20mbit", 1), "      auto: {min: 5mbit, base: 20mbit, max: 80mbit}\n", "", 1)
	pl, err := Build(parseEDT(t, fixed), Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range pl.Devices[0].Objects {
		if f, ok := o.(*tc.Filter); ok && f.U32 != nil && f.U32.ClassID == RootHandle {
			t.Error("a fixed-rate tree sends ICMP to 1:0")
		}
	}
}
