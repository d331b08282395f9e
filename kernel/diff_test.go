package kernel

import (
	"strings"
	"testing"

	"sluice/plan"
	"sluice/policy"
	"sluice/tc"
)

// asLive turns planned objects into what a kernel dump would return.
func asLive(objs []tc.Object) []tc.Object { return tc.AsDumped(objs) }

// build plans src, keeping the ids of the previous build in the test (as
// the kernel layer does with its records).
func build(t *testing.T, src string) []tc.Object {
	t.Helper()
	pol, _, err := policy.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.Build(pol, plan.Everything, prevAlloc[t.Name()])
	if err != nil {
		t.Fatal(err)
	}
	prevAlloc[t.Name()] = map[string]*plan.Alloc{}
	for _, d := range p.Devices {
		prevAlloc[t.Name()][d.Name] = d.Alloc
	}
	return p.Objects()
}

var prevAlloc = map[string]map[string]*plan.Alloc{}

const base = `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      default: bulk
      classes:
        - name: ssh
          rate: 2mbit
          prio: 0
          match: [{dport: 22}]
        - name: web
          rate: 8mbit
          match: [{proto: tcp, dport: [80, 443]}]
        - name: bulk
          rate: 5mbit
`

func TestDiffIdempotent(t *testing.T) {
	objs := build(t, base)
	if d := Compute(asLive(objs), objs, Options{}); !d.Empty() {
		t.Fatalf("diff of a plan against itself: %v", describe(d))
	}
}

// An fq_codel leaf's target and interval are compared as the kernel
// keeps them (a dump says 5 ms as 4999 µs): set and read back, they are
// the same; another target is a change in place.
func TestDiffCodelTargets(t *testing.T) {
	objs := build(t, base)
	var ssh *tc.Qdisc
	for _, o := range objs {
		if q, ok := o.(*tc.Qdisc); ok && q.FqCodel != nil {
			q.FqCodel.Target, q.FqCodel.Interval = 5000, 100000
			if q.Owner == "ssh" {
				ssh = q
			}
		}
	}
	if ssh == nil {
		t.Fatal("no fq_codel leaf for ssh")
	}
	if d := Compute(asLive(objs), objs, Options{}); !d.Empty() {
		t.Fatalf("targets read back: %v", describe(d))
	}
	live := asLive(objs)
	ssh.FqCodel.Target, ssh.FqCodel.Interval = 10000, 200000
	d := Compute(live, objs, Options{})
	if len(d.Changes) != 1 || d.Changes[0].Verb != tc.Change || d.Changes[0].Obj.(*tc.Qdisc).Owner != "ssh" || !strings.Contains(d.Changes[0].Obj.Describe(), "target 10ms interval 200ms") {
		t.Fatalf("changes:\n%s", describe(d))
	}
}

// A per-host leaf whose fq_codel has other flows is replaced: a change
// cannot set them.
func TestDiffCodelFlowsReplace(t *testing.T) {
	objs := build(t, `interfaces:
  - name: eth0
    egress:
      rate: 20mbit
      default: rest
      classes:
        - {name: subs, rate: 19mbit, per_host: {by: dst, cidr: 10.0.0.0/31, rate: 1mbit}}
        - {name: rest, rate: 1mbit}
`)
	live := asLive(objs)
	var leaf string
	for _, o := range live {
		if q, ok := o.(*tc.Qdisc); ok && q.FqCodel != nil && q.FqCodel.Flows == 64 && leaf == "" {
			q.FqCodel.Flows, leaf = 1024, q.Owner
		}
	}
	d := Compute(live, objs, Options{})
	var got []string
	for _, c := range d.Changes {
		if q, ok := c.Obj.(*tc.Qdisc); ok && q.Owner == leaf {
			got = append(got, c.Verb.String())
		}
	}
	// A replace is a delete and an add.
	if leaf == "" || strings.Join(got, " ") != "delete add" {
		t.Fatalf("leaf %q: %v\n%s", leaf, got, describe(d))
	}
}

func describe(d *Diff) string {
	var s []string
	for _, c := range d.Changes {
		s = append(s, c.Verb.String()+" "+c.Obj.Describe())
	}
	return strings.Join(s, "\n")
}

func TestDiffRateChangeIsOneClassChange(t *testing.T) {
	live := asLive(build(t, base))
	want := build(t, strings.Replace(base, "rate: 8mbit", "rate: 9mbit", 1))
	d := Compute(live, want, Options{})
	if len(d.Changes) != 1 || d.Changes[0].Verb != tc.Change {
		t.Fatalf("changes:\n%s", describe(d))
	}
	if c := d.Changes[0].Obj.(*tc.Class); c.Name != "web" || c.Rate != 1125000 {
		t.Fatalf("changed %s", c.Describe())
	}
}

func TestDiffAddClassTouchesOnlyIt(t *testing.T) {
	live := asLive(build(t, base))
	want := build(t, strings.Replace(base, "        - name: bulk", "        - name: dns\n          rate: 2mbit\n          match: [{proto: udp, dport: 53}]\n        - name: bulk", 1))
	d := Compute(live, want, Options{})
	var dnsPrio uint16
	for _, c := range d.Changes {
		if f, ok := c.Obj.(*tc.Filter); ok && f.IsTP() {
			dnsPrio = f.Prio
		}
	}
	for _, c := range d.Changes {
		if c.Verb != tc.Add {
			t.Errorf("unexpected %s %s", c.Verb, c.Obj.Describe())
		}
		switch o := c.Obj.(type) {
		case *tc.Class:
			if o.Name != "dns" {
				t.Errorf("touches class %s", o.Name)
			}
		case *tc.Qdisc:
			if o.Owner != "dns" {
				t.Errorf("touches qdisc %s", o.Describe())
			}
		case *tc.Filter:
			if o.Prio != dnsPrio {
				t.Errorf("touches filter %s", o.Describe())
			}
		}
	}
	// class + leaf + tp + table + table node + ipv4 link node + ipv6 node
	if len(d.Changes) != 7 {
		t.Errorf("%d changes:\n%s", len(d.Changes), describe(d))
	}
}

func TestDiffRemoveClassDeletesFiltersFirst(t *testing.T) {
	// bulk as light as ssh: removing ssh, the lightest of its siblings,
	// would otherwise rescale their quanta (plan/share.go).
	base := strings.Replace(base, "          rate: 5mbit\n", "          rate: 2mbit\n", 1)
	live := asLive(build(t, base))
	// Remove ssh: its filters must go before the class (a class bound by a
	// filter cannot be deleted), and its leaf goes with the class.
	want := build(t, strings.Replace(base, "        - name: ssh\n          rate: 2mbit\n          prio: 0\n          match: [{dport: 22}]\n", "", 1))
	d := Compute(live, want, Options{})
	classAt, lastFilter := -1, -1
	for i, c := range d.Changes {
		if c.Verb != tc.Delete {
			t.Errorf("unexpected %s %s", c.Verb, c.Obj.Describe())
		}
		switch o := c.Obj.(type) {
		case *tc.Class:
			classAt = i
			if len(c.Implied) != 1 {
				t.Errorf("class delete should carry its leaf qdisc, carries %d", len(c.Implied))
			}
		case *tc.Filter:
			lastFilter = i
			// dport 22 without proto: one table for tcp, one for udp,
			// each holding its port node.
			if o.IsTable() && len(c.Implied) != 1 {
				t.Errorf("table delete should carry its port node, carries %d", len(c.Implied))
			}
		case *tc.Qdisc:
			t.Errorf("leaf deleted explicitly: %s", o.Describe())
		}
	}
	if classAt < 0 || lastFilter > classAt {
		t.Fatalf("order:\n%s", describe(d))
	}
}

func TestDiffDefaultChangeReplacesRoot(t *testing.T) {
	live := asLive(build(t, base))
	want := build(t, strings.Replace(base, "default: bulk", "default: web", 1))
	d := Compute(live, want, Options{})
	if d.Changes[0].Verb != tc.Delete || d.Changes[0].Obj.(*tc.Qdisc).Parent != tc.HandleRoot {
		t.Fatalf("first change: %s %s", d.Changes[0].Verb, d.Changes[0].Obj.Describe())
	}
	if len(d.Changes[0].Implied) != len(live)-1 {
		t.Errorf("root delete carries %d of %d objects", len(d.Changes[0].Implied), len(live)-1)
	}
	if !strings.Contains(d.Changes[1].Reason, "HTB cannot change its default") {
		t.Errorf("reason %q", d.Changes[1].Reason)
	}
}

func TestDiffResetDeletesRootOnly(t *testing.T) {
	live := asLive(build(t, base))
	d := Compute(live, nil, Options{})
	if len(d.Changes) != 1 {
		t.Fatalf("reset:\n%s", describe(d))
	}
}

func TestDiffSharedHookSurvives(t *testing.T) {
	objs := build(t, "interfaces:\n  - name: eth0\n    ingress:\n      rate: 10mbit\n")
	live := asLive(objs)
	opt := Options{Shared: map[string]bool{}}
	for _, o := range live {
		if q, ok := o.(*tc.Qdisc); ok && q.Parent == tc.HandleIngress {
			opt.Shared[q.Key()] = true
		}
		if l, ok := o.(*tc.Link); ok {
			opt.Shared[l.Key()] = true // an adopted ifb
		}
	}
	d := Compute(live, nil, opt)
	for _, c := range d.Changes {
		switch o := c.Obj.(type) {
		case *tc.Link:
			t.Errorf("deletes adopted ifb %s", o.Name)
		case *tc.Qdisc:
			if o.Parent == tc.HandleIngress {
				t.Errorf("deletes shared clsact")
			}
		}
	}
	if len(d.Changes) != 3 { // redirect node, its prio, the ifb's root qdisc
		t.Errorf("changes:\n%s", describe(d))
	}
}
