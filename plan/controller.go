package plan

import (
	"fmt"
	"time"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
	"sluice/units"
)

// Controller is a sharing controller the agent runs over one parent's
// children (policy `sharing: controller`, package share).
type Controller struct {
	// Owner is the parent class ("" for the direction's top level).
	Owner      string        `json:"owner,omitempty"`
	Quantum    time.Duration `json:"quantum"`
	ApplyAbove float64       `json:"apply_above"`
	// Capacity is what the children share (the cap), bytes/s.
	Capacity units.Rate `json:"capacity"`
	// Horizon is an EDT tree's horizon (an aggregate's moves with its
	// cap: HorizonFor).
	Horizon time.Duration `json:"horizon,omitempty"`
	// Assure: the controller gives each child its share as the class's
	// rate, not its ceil (share.Controller.Assure): an HTB tree whose
	// parent guarantees the capacity (its rate) and has no cap below
	// it. Otherwise the shares are ceils (and an EDT tree's caps).
	Assure bool `json:"assure,omitempty"`
	// Bound: the capacity is a cap (sharing's) below what the parent
	// lets through, so a child given no limit is still held to its
	// open share (share.Controller.Bound).
	Bound bool `json:"bound,omitempty"`
	// Shards: the children are the shards of a sharded tree (their root
	// classes), balanced so that they lend to each other: each shard's
	// rate is its share of the direction's rate, weighed by the hosts
	// active in it (agent), the rates adding up to the direction's.
	Shards   bool         `json:"shards,omitempty"`
	Children []Controlled `json:"children"`
}

// ShardQuantum is how often the agent balances a sharded tree's shards.
const ShardQuantum = time.Second

// shardFloor is the least rate a balanced shard keeps, of the
// direction's rate over the shards: enough for a host that starts in
// an idle shard to queue (and so be seen) within a step.
const shardFloor = 32

// shardStandby is what an idle balanced shard keeps, of the direction's
// rate over the shards (share.Child.Standby): a host starting on it
// sends at that until the next step. The standbys are not taken from
// the busy shards' parts, so while idle shards wake the direction may
// carry up to a quarter over its rate for a step; taken from them,
// one host alone would lose a quarter of the link for good.
const shardStandby = 4

// Controlled is one child under a controller.
type Controlled struct {
	Name string `json:"name"`
	// ID names the class in stats (its HTB handle, or edt:COUNTER).
	ID     string    `json:"id"`
	Handle tc.Handle `json:"handle,omitempty"`
	// Target is an EDT aggregate's index in the program's targets.
	Target uint32 `json:"target,omitempty"`
	// Hosts are the host entries (one per address) of a host of an EDT
	// group, whose cap its group's controller sets (plan.HostLimit).
	Hosts  []bpf.HostKey `json:"hosts,omitempty"`
	Weight float64       `json:"weight"`
	Rate   units.Rate    `json:"rate"`
	Ceil   units.Rate    `json:"ceil"`
	// Prod children (prio 0 beside children of higher prios) are never
	// limited; their use comes off the capacity.
	Prod bool `json:"prod,omitempty"`
	// Capped: lighter than HTB's quanta can weigh (below 1/anchorRange
	// of the heaviest sibling of its prio), so an assuring controller
	// holds its share as its ceil too (share.Child.Capped).
	Capped bool `json:"capped,omitempty"`
	// Floor, when set, is the least rate a limit may give the class
	// (a shard's), instead of its planned rate.
	Floor units.Rate `json:"floor,omitempty"`
	// Standby, when set, is the least rate of an idle shard (one that
	// sent nothing since the last step): shardStandby.
	Standby units.Rate `json:"standby,omitempty"`
	// Scaled are a balanced shard's copies of the tree's non-host
	// classes: each gets its whole rate times the shard's part of the
	// direction's. HTB lets a class within its rate send whatever its
	// parent's state, so a shard cut below rate/N with its copies at
	// rate/N would not be cut at all.
	Scaled []Scaled `json:"scaled,omitempty"`
}

// Scaled is a class whose rate a shard balancer scales: its whole
// rate, before the shards divide it.
type Scaled struct {
	Handle tc.Handle  `json:"handle"`
	Rate   units.Rate `json:"rate"`
}

// controllers plans the tree's sharing controllers and marks the classes
// whose ceils they set.
func (b *builder) controllers() {
	t := b.tree
	byName := map[string]*tc.Class{}
	byHandle := map[tc.Handle]*tc.Class{}
	for _, o := range b.objs {
		if c, ok := o.(*tc.Class); ok {
			byName[c.Name] = c
			byHandle[c.Handle] = c
		}
	}
	add := func(owner string, sh *policy.Sharing, cs []*policy.Class) {
		ctl := Controller{Owner: owner, Quantum: sh.Quantum, ApplyAbove: sh.ApplyAbove, Capacity: sh.CapBps, Bound: sh.Cap != nil}
		// Rates are the shares only where the parent class guarantees
		// all of the capacity and no cap is meant to hold the children
		// below it: HTB lets a class below its rate send whatever its
		// parent's state, and lets one borrow up to its parent's ceil.
		if sh.Cap == nil && len(cs) > 0 {
			if first := byName[cs[0].Name]; first != nil {
				if p := byHandle[first.Parent]; p != nil && p.Rate >= sh.CapBps {
					ctl.Assure = true
				}
			}
		}
		heaviest := map[int]float64{}
		for _, c := range cs {
			heaviest[c.Prio] = max(heaviest[c.Prio], c.ShareWeight())
		}
		prods := prodOf(cs)
		for i, c := range cs {
			cl := byName[c.Name]
			if cl == nil {
				continue
			}
			prod := prods[i]
			cl.Controlled = !prod
			ctl.Children = append(ctl.Children, Controlled{Name: c.Name, ID: cl.Handle.String(), Handle: cl.Handle, Weight: c.ShareWeight(),
				Rate: cl.Rate, Ceil: cl.Ceil, Prod: prod, Capped: !prod && c.ShareWeight()*anchorRange < heaviest[c.Prio]})
		}
		b.dev.Controllers = append(b.dev.Controllers, ctl)
	}
	eachSharing(t, add)
}

// eachSharing calls f for every sharing block of t: the direction's
// (owner "") over the top-level classes, then each class's over its
// children.
func eachSharing(t *policy.Tree, f func(owner string, sh *policy.Sharing, cs []*policy.Class)) {
	if t.Sharing != nil {
		f("", t.Sharing, t.Classes)
	}
	var walk func(cs []*policy.Class)
	walk = func(cs []*policy.Class) {
		for _, c := range cs {
			if c.Sharing != nil {
				f(c.Name, c.Sharing, c.Classes)
			}
			walk(c.Classes)
		}
	}
	walk(t.Classes)
}

// hasSharing reports whether the tree has a sharing controller.
func hasSharing(t *policy.Tree) bool {
	found := false
	eachSharing(t, func(string, *policy.Sharing, []*policy.Class) { found = true })
	return found
}

// edtControllers plans an EDT tree's sharing controllers: each child is
// a leaf class, one aggregate, whose target's rate the controller sets.
func (b *builder) edtControllers(hook *bpf.Hook) {
	t := b.tree
	target := map[string]uint32{}
	counter := map[string]uint32{}
	for _, ci := range b.dev.Classes {
		counter[ci.Name] = ci.Counter
	}
	for i, tg := range hook.Content.Targets {
		for name, n := range counter {
			if n != 0 && tg.Counter == n {
				target[name] = uint32(i)
			}
		}
	}
	add := func(owner string, sh *policy.Sharing, cs []*policy.Class) {
		ctl := Controller{Owner: owner, Quantum: sh.Quantum, ApplyAbove: sh.ApplyAbove, Capacity: sh.CapBps, Horizon: t.Horizon, Bound: sh.Cap != nil}
		prios := map[bool]bool{}
		for _, c := range cs {
			prios[c.Prio == 0] = true
		}
		for _, c := range cs {
			i, ok := target[c.Name]
			if !ok {
				continue
			}
			prod := len(prios) > 1 && c.Prio == 0
			if !prod {
				hook.Controlled = append(hook.Controlled, i)
			}
			ctl.Children = append(ctl.Children, Controlled{Name: c.Name, ID: fmt.Sprintf("edt:%d", counter[c.Name]), Target: i,
				Weight: c.ShareWeight(), Rate: c.RateBps, Ceil: c.CeilBps, Prod: prod})
		}
		b.dev.Controllers = append(b.dev.Controllers, ctl)
	}
	eachSharing(t, add)
}

// shardBalancer plans the controller that balances a sharded tree's n
// shards (roots: their root classes, marked controlled).
func (b *builder) shardBalancer(roots []*tc.Class) {
	rate := b.tree.RateBps
	floor := max(rate/units.Rate(len(roots)*shardFloor), 1)
	ctl := Controller{Owner: "(shards)", Quantum: ShardQuantum, ApplyAbove: 0, Capacity: rate, Assure: true, Shards: true}
	b.dev.floors = map[tc.Handle]units.Rate{}
	for s, r := range roots {
		r.Controlled = true
		ch := Controlled{Name: fmt.Sprintf("shard %d", s), ID: r.Handle.String(), Handle: r.Handle,
			Weight: 1, Rate: floor, Ceil: rate, Floor: floor, Standby: max(rate/units.Rate(len(roots)*shardStandby), floor)}
		b.dev.floors[r.Handle] = floor
		if s < len(b.replicas) {
			ch.Scaled = b.replicas[s]
			for _, sc := range ch.Scaled {
				b.dev.floors[sc.Handle] = max(sc.Rate/units.Rate(len(roots)*shardFloor), 1)
			}
		}
		ctl.Children = append(ctl.Children, ch)
	}
	b.dev.Controllers = append(b.dev.Controllers, ctl)
}
