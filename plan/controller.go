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
	Assure   bool         `json:"assure,omitempty"`
	Children []Controlled `json:"children"`
}

// Controlled is one child under a controller.
type Controlled struct {
	Name string `json:"name"`
	// ID names the class in stats (its HTB handle, or edt:COUNTER).
	ID     string    `json:"id"`
	Handle tc.Handle `json:"handle,omitempty"`
	// Target is an EDT aggregate's index in the program's targets.
	Target uint32     `json:"target,omitempty"`
	Weight float64    `json:"weight"`
	Rate   units.Rate `json:"rate"`
	Ceil   units.Rate `json:"ceil"`
	// Prod children (prio 0 beside children of higher prios) are never
	// limited; their use comes off the capacity.
	Prod bool `json:"prod,omitempty"`
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
		ctl := Controller{Owner: owner, Quantum: sh.Quantum, ApplyAbove: sh.ApplyAbove, Capacity: sh.CapBps}
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
		prios := map[int]bool{}
		for _, c := range cs {
			prios[c.Prio] = true
		}
		for _, c := range cs {
			cl := byName[c.Name]
			if cl == nil {
				continue
			}
			prod := len(prios) > 1 && c.Prio == 0
			cl.Controlled = !prod
			ctl.Children = append(ctl.Children, Controlled{Name: c.Name, ID: cl.Handle.String(), Handle: cl.Handle, Weight: c.ShareWeight(),
				Rate: cl.Rate, Ceil: cl.Ceil, Prod: prod})
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
		ctl := Controller{Owner: owner, Quantum: sh.Quantum, ApplyAbove: sh.ApplyAbove, Capacity: sh.CapBps, Horizon: t.Horizon}
		prios := map[bool]bool{}
		for _, c := range cs {
			prios[isProd(c, nil)] = true
		}
		for _, c := range cs {
			i, ok := target[c.Name]
			if !ok {
				continue
			}
			prod := len(prios) > 1 && isProd(c, nil)
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
