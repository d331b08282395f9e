package engine

import (
	"fmt"
	"sort"
	"strings"

	"sluice/bpf"
	"sluice/kernel"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/tc"
)

// Summary is a diff in the policy's terms: what happens to each tree,
// class and group of hosts, rather than to each kernel object.
type Summary struct {
	Lines []SummaryLine `json:"changes"`
	// Counts by subject ("tree", "class", "hosts") and op ("add",
	// "change", "delete").
	Counts map[string]map[string]int `json:"counts"`
}

// SummaryLine is one change to one subject.
type SummaryLine struct {
	// Op is + (add), ~ (change), - (delete) or -/+ (replace).
	Op string `json:"op"`
	// Subject is "tree", "class" or "hosts".
	Subject   string `json:"subject"`
	Interface string `json:"interface"`
	Dir       string `json:"direction"`
	// Name is the class's name, or for hosts the class they hang below.
	Name   string `json:"name,omitempty"`
	Detail string `json:"detail,omitempty"`
}

func (l SummaryLine) String() string {
	s := fmt.Sprintf("%s %s %s/%s", l.Op, l.Subject, l.Interface, l.Dir)
	if l.Name != "" {
		s += "/" + l.Name
	}
	if l.Detail != "" {
		s += ": " + l.Detail
	}
	return s
}

// Summary describes the prepared diff in the policy's terms.
func (p *Prepared) Summary() *Summary {
	return summarize(p.Diff, p.Desired, p.k.Records())
}

// treeOf says which interface and direction a device's objects shape.
type treeOf struct{ iface, dir string }

func summarize(d *kernel.Diff, desired *plan.Plan, st *records.File) *Summary {
	trees := map[string]treeOf{}
	names := map[string]map[tc.Handle]string{} // device -> class handle -> name
	note := func(dev string, h tc.Handle, name string) {
		if names[dev] == nil {
			names[dev] = map[tc.Handle]string{}
		}
		names[dev][h] = name
	}
	if st != nil {
		for dev, ds := range st.Devices {
			if !ds.PoliceOnly {
				trees[dev] = treeOf{ds.Interface, ds.Dir}
			}
			for _, c := range ds.Classes {
				note(dev, c.Handle, c.Name)
			}
		}
	}
	if desired != nil {
		for _, dv := range desired.Devices {
			if !dv.PoliceOnly {
				trees[dv.Name] = treeOf{dv.Interface, dv.Dir}
			}
			for _, c := range dv.Classes {
				note(dv.Name, c.Handle, c.Name)
			}
		}
	}
	where := func(dev string) treeOf {
		if t, ok := trees[dev]; ok {
			return t
		}
		if strings.HasPrefix(dev, "ifb-") {
			return treeOf{strings.TrimPrefix(dev, "ifb-"), policy.Ingress}
		}
		return treeOf{dev, policy.Egress}
	}

	type key struct {
		subject string
		t       treeOf
		name    string
	}
	type entry struct {
		op      string
		details []string
		adds    int // hosts
		changes int
		dels    int
	}
	var order []key
	entries := map[key]*entry{}
	get := func(k key, op string) *entry {
		e := entries[k]
		if e == nil {
			e = &entry{op: op}
			entries[k] = e
			order = append(order, k)
		}
		return e
	}
	detail := func(e *entry, s string) {
		if e.op == "+" || e.op == "-" {
			return // an added or removed class is described by itself
		}
		for _, x := range e.details {
			if x == s {
				return
			}
		}
		e.details = append(e.details, s)
	}
	// A class or qdisc deleted and added again under one key is a
	// replacement.
	deleted := map[string]bool{}
	added := map[string]bool{}
	deletedQdisc := map[string]*tc.Qdisc{}
	deletedClass := map[string]*tc.Class{}
	for _, c := range d.Changes {
		switch c.Verb {
		case tc.Delete:
			deleted[c.Obj.Key()] = true
			switch o := c.Obj.(type) {
			case *tc.Qdisc:
				deletedQdisc[o.Key()] = o
			case *tc.Class:
				deletedClass[o.Key()] = o
			}
		case tc.Add:
			added[c.Obj.Key()] = true
		}
	}
	opOf := func(c kernel.Change) string {
		switch {
		case c.Verb == tc.Delete && added[c.Obj.Key()], c.Verb == tc.Add && deleted[c.Obj.Key()]:
			return "-/+"
		case c.Verb == tc.Delete:
			return "-"
		case c.Verb == tc.Change:
			return "~"
		}
		return "+"
	}
	treeRoot := map[treeOf]string{} // a tree whose root is added or deleted: its op
	treeRate := map[treeOf]string{}
	treeWhy := map[treeOf]string{} // a replaced tree: why its root cannot change in place
	liveRoot := map[string]*tc.Qdisc{}
	for _, c := range d.Changes {
		if q, ok := c.Obj.(*tc.Qdisc); ok && q.Parent == tc.HandleRoot && c.Verb == tc.Delete {
			liveRoot[q.Dev] = q
		}
	}
	for _, c := range d.Changes {
		if q, ok := c.Obj.(*tc.Qdisc); ok && q.Parent == tc.HandleRoot && (q.Kind == "htb" || q.Kind == "mq") {
			if op := opOf(c); op != "~" {
				t := where(q.Dev)
				treeRoot[t] = op
				if c.Reason != "" && c.Verb == tc.Add {
					treeWhy[t] = rootReason(c.Reason, liveRoot[q.Dev], q, names[q.Dev])
				}
			}
		}
	}
	className := func(dev string, h tc.Handle) string { return names[dev][h] }
	// Whatever no subject claims still shows, on its tree's line: the
	// summary never hides a change.
	others := map[treeOf]int{}
	var foreign []SummaryLine
	other := func(t treeOf) {
		if others[t] == 0 {
			get(key{"tree", t, ""}, "~")
		}
		others[t]++
	}
	for _, c := range d.Changes {
		op := opOf(c)
		if op == "-/+" && c.Verb == tc.Delete {
			continue // shown with its re-creation
		}
		switch o := c.Obj.(type) {
		case *tc.Class:
			t := where(o.Dev)
			name := o.Name
			if name == "" {
				name = className(o.Dev, o.Handle)
			}
			if name == "" {
				other(t)
				continue
			}
			if i := strings.LastIndex(name, "/"); i >= 0 {
				// A host's class: counted under the class it hangs below.
				e := get(key{"hosts", t, name[:i]}, "~")
				switch op {
				case "+":
					e.adds++
				case "-":
					e.dels++
				default:
					e.changes++
				}
				continue
			}
			if treeRoot[t] == "-" {
				continue // goes with its tree
			}
			if name == plan.RootClassName {
				// The tree's own class: its rate is the tree's.
				if op == "+" || op == "-/+" {
					treeRate[t] = o.Rate.String()
				} else if op == "~" {
					e := get(key{"tree", t, ""}, "~")
					for _, s := range classChanges(c.Old.(*tc.Class), o) {
						if !strings.HasPrefix(s, "ceil ") { // the root's ceil is its rate
							detail(e, s)
						}
					}
				}
				continue
			}
			e := get(key{"class", t, name}, op)
			if e.op == "~" && op != "~" {
				// Its rules or leaf came first: the class itself is new
				// (or gone), which says it all.
				e.op, e.details = op, nil
			}
			switch op {
			case "+":
				e.details = []string{fmt.Sprintf("rate %s, ceil %s, prio %d", o.Rate.String(), o.Ceil.String(), o.Prio)}
			case "-/+":
				if old := deletedClass[o.Key()]; old != nil && old.Parent != o.Parent {
					from, to := className(o.Dev, old.Parent), className(o.Dev, o.Parent)
					detail(e, fmt.Sprintf("replaced: moves from %s to %s (HTB cannot move a class)", under(from, old.Parent), under(to, o.Parent)))
				} else if c.Reason != "" {
					detail(e, "replaced: "+c.Reason)
				}
			case "~":
				for _, s := range classChanges(c.Old.(*tc.Class), o) {
					detail(e, s)
				}
			}
		case *tc.Qdisc:
			t := where(o.Dev)
			if treeRoot[t] != "" {
				continue // a new or removed tree's qdiscs come with it
			}
			owner := o.Owner
			if owner == "" {
				owner = className(o.Dev, o.Parent)
			}
			old, _ := c.Old.(*tc.Qdisc)
			switch {
			case o.Parent == tc.HandleRoot && op == "~" && old != nil && len(rootChanges(old, o)) > 0:
				e := get(key{"tree", t, ""}, "~")
				for _, s := range rootChanges(old, o) {
					detail(e, s)
				}
			case owner == "":
				other(t)
			case strings.Contains(owner, "/"):
				i := strings.LastIndex(owner, "/")
				if e := get(key{"hosts", t, owner[:i]}, "~"); e.adds+e.changes+e.dels == 0 {
					e.changes++ // only the host's leaf changed
				}
			default:
				e := get(key{"class", t, owner}, "~")
				if old == nil {
					old = deletedQdisc[o.Key()]
				}
				switch {
				case e.op == "-/+":
					// A replaced class's leaf is made again with it.
				case old != nil && old.Kind != o.Kind:
					detail(e, fmt.Sprintf("leaf %s -> %s", old.Kind, o.Kind))
				case c.Verb == tc.Delete:
					detail(e, "leaf "+o.Kind+" removed")
				case old == nil:
					detail(e, "leaf "+o.Kind)
				default:
					detail(e, "leaf "+o.Kind+" "+leafChanges(old, o))
				}
			}
		case *tc.Filter:
			if (o.Parent == tc.HandleIngressHook || o.Parent == tc.MakeHandle(0xffff, 0)) && strings.HasPrefix(o.Note, kernel.ForeignNote) {
				// Another tool's redirect, ahead of sluice's: --force
				// takes the ingress over.
				if o.IsTP() { // its nodes go with it
					foreign = append(foreign, SummaryLine{Op: "-", Subject: "filter", Interface: o.Dev, Dir: policy.Ingress,
						Detail: o.Note + ", which ran before sluice's (--force)"})
				}
				continue
			}
			t := where(o.Dev)
			if treeRoot[t] != "" {
				continue
			}
			n := o.Note
			switch {
			case strings.HasPrefix(n, "class "):
				name := strings.TrimPrefix(n, "class ")
				if i := strings.Index(name, ","); i >= 0 {
					name = name[:i]
				}
				detail(get(key{"class", t, name}, "~"), "rules")
			default:
				detail(get(key{"tree", t, ""}, "~"), "classification rules")
			}
		case *tc.Link:
			if t := (treeOf{strings.TrimPrefix(o.Name, "ifb-"), policy.Ingress}); treeRoot[where(o.Name)] == "" && treeRoot[t] == "" {
				other(where(o.Name))
			}
		default:
			if dv, ok := c.Obj.(interface{ Device() string }); ok {
				if t := where(dv.Device()); treeRoot[t] == "" {
					other(t)
				}
			}
		case *bpf.Hook:
			t := where(o.Dev)
			if o.Ingress {
				t = treeOf{o.Dev, policy.Ingress}
			}
			if treeRoot[t] != "" {
				continue
			}
			e := get(key{"tree", t, ""}, "~")
			if old, ok := c.Old.(*bpf.Hook); ok && c.Verb == tc.Change {
				for _, part := range strings.Split(o.Content.Delta(old.Content), ", ") {
					// Hosts are counted by their classes.
					if part != "" && !strings.HasPrefix(part, "hosts ") {
						detail(e, "BPF "+part)
					}
				}
			} else {
				detail(e, "BPF classifier")
			}
		}
	}
	s := &Summary{Counts: map[string]map[string]int{}}
	count := func(subject, op string, n int) {
		if n == 0 {
			return
		}
		if s.Counts[subject] == nil {
			s.Counts[subject] = map[string]int{}
		}
		s.Counts[subject][op] += n
	}
	ops := map[string]string{"+": "add", "~": "change", "-": "delete", "-/+": "change"}
	// Trees first, in the order their roots come.
	var treeKeys []treeOf
	for t := range treeRoot {
		treeKeys = append(treeKeys, t)
	}
	sort.Slice(treeKeys, func(i, j int) bool {
		return treeKeys[i].iface+treeKeys[i].dir < treeKeys[j].iface+treeKeys[j].dir
	})
	for _, t := range treeKeys {
		op := treeRoot[t]
		l := SummaryLine{Op: op, Subject: "tree", Interface: t.iface, Dir: t.dir}
		if op == "+" || op == "-/+" {
			n := 0
			for _, k := range order {
				if k.t == t && k.subject == "class" {
					n++
				}
			}
			classes := fmt.Sprintf("%d classes", n)
			if n == 1 {
				classes = "1 class"
			}
			l.Detail = classes
			if r := treeRate[t]; r != "" {
				l.Detail = "rate " + r + ", " + classes
			}
			if why := treeWhy[t]; op == "-/+" && why != "" {
				l.Detail += "; replaced: " + why
			}
		}
		s.Lines = append(s.Lines, l)
		count("tree", ops[op], 1)
	}
	for _, k := range order {
		e := entries[k]
		if k.subject == "tree" && treeRoot[k.t] != "" {
			continue
		}
		if n := others[k.t]; k.subject == "tree" && n > 0 {
			detail(e, fmt.Sprintf("%d other kernel object(s) (--tc lists them)", n))
		}
		l := SummaryLine{Op: e.op, Subject: k.subject, Interface: k.t.iface, Dir: k.t.dir, Name: k.name, Detail: strings.Join(e.details, ", ")}
		if k.subject == "hosts" {
			var parts []string
			op := "~"
			switch {
			case e.adds > 0 && e.changes == 0 && e.dels == 0:
				op = "+"
			case e.dels > 0 && e.adds == 0 && e.changes == 0:
				op = "-"
			}
			for _, p := range []struct {
				n    int
				verb string
			}{{e.adds, "added"}, {e.changes, "changed"}, {e.dels, "removed"}} {
				if p.n > 0 {
					parts = append(parts, fmt.Sprintf("%d %s", p.n, p.verb))
				}
			}
			l.Op, l.Detail = op, strings.Join(parts, ", ")
			count("hosts", "add", e.adds)
			count("hosts", "change", e.changes)
			count("hosts", "delete", e.dels)
		} else {
			count(k.subject, ops[e.op], 1)
		}
		s.Lines = append(s.Lines, l)
	}
	// By tree, the tree's own line first, then its classes, then hosts.
	rank := map[string]int{"tree": 0, "class": 1, "hosts": 2}
	sort.SliceStable(s.Lines, func(i, j int) bool {
		a, b := s.Lines[i], s.Lines[j]
		if a.Interface+"/"+a.Dir != b.Interface+"/"+b.Dir {
			return a.Interface+"/"+a.Dir < b.Interface+"/"+b.Dir
		}
		return rank[a.Subject] < rank[b.Subject]
	})
	// Other tools' filters sluice takes out, after the trees.
	for _, l := range foreign {
		s.Lines = append(s.Lines, l)
		count("filter", "delete", 1)
	}
	return s
}

// rootReason says in the policy's terms why a tree's root qdisc is
// replaced (the kernel layer's reason, with what it means for the tree).
func rootReason(why string, old, n *tc.Qdisc, names map[tc.Handle]string) string {
	name := func(q *tc.Qdisc, minor uint32) string {
		h := tc.MakeHandle(q.Handle.Major(), uint16(minor))
		if s := names[h]; s != "" {
			return s
		}
		return h.String()
	}
	switch {
	case old != nil && old.HTB != nil && n.HTB != nil && old.HTB.Default != n.HTB.Default:
		return fmt.Sprintf("its default class %s -> %s (%s)", name(old, old.HTB.Default), name(n, n.HTB.Default), why)
	case old != nil && old.Kind != n.Kind && n.Kind == "mq":
		return fmt.Sprintf("it becomes one HTB per transmit queue under mq (shards), from %s (%s)", old.Kind, why)
	case old != nil && old.Kind != n.Kind && old.Kind == "mq":
		return fmt.Sprintf("its shards become one %s (%s)", n.Kind, why)
	case strings.HasPrefix(why, "not created by sluice"):
		return "its root qdisc (" + describeKind(old) + ") was not created by sluice, and --force replaces it"
	}
	return why
}

func describeKind(q *tc.Qdisc) string {
	if q == nil {
		return "another tool's"
	}
	return q.Kind + " " + q.Handle.String()
}

// under names where a class hangs: below a class, or at the top.
func under(name string, h tc.Handle) string {
	switch {
	case name == plan.RootClassName || h.Minor() <= 1:
		return "the top level"
	case name == "":
		return "below " + h.String()
	}
	return "below " + name
}

// leafChanges lists what changed on a leaf qdisc of one kind.
func leafChanges(o, n *tc.Qdisc) string {
	var out []string
	switch {
	case o.Fifo != nil && n.Fifo != nil && o.Fifo.Limit != n.Fifo.Limit:
		out = append(out, fmt.Sprintf("limit %d -> %d", o.Fifo.Limit, n.Fifo.Limit))
	case o.FqCodel != nil && n.FqCodel != nil:
		ms := func(us uint32) string { return fmt.Sprintf("%gms", float64(us)/1000) }
		if n.FqCodel.Limit != 0 && o.FqCodel.Limit != n.FqCodel.Limit {
			out = append(out, fmt.Sprintf("limit %d -> %d", o.FqCodel.Limit, n.FqCodel.Limit))
		}
		if n.FqCodel.Target != 0 && !tc.SameCodelTime(o.FqCodel.Target, n.FqCodel.Target) {
			out = append(out, fmt.Sprintf("target %s -> %s", ms(o.FqCodel.Target), ms(n.FqCodel.Target)))
		}
		if n.FqCodel.Interval != 0 && !tc.SameCodelTime(o.FqCodel.Interval, n.FqCodel.Interval) {
			out = append(out, fmt.Sprintf("interval %s -> %s", ms(o.FqCodel.Interval), ms(n.FqCodel.Interval)))
		}
	}
	if len(out) == 0 {
		return "settings"
	}
	return strings.Join(out, ", ")
}

// rootChanges lists what changed on a tree's root qdisc in place, in
// the policy's keys: its size table (overhead, linklayer, mpu) and the
// default class's minor id.
func rootChanges(o, n *tc.Qdisc) []string {
	var out []string
	stab := func(s *tc.Stab) tc.Stab {
		if s == nil {
			return tc.Stab{Linklayer: tc.LinkEthernet}
		}
		return *s
	}
	was, now := stab(o.Stab), stab(n.Stab)
	if was.Overhead != now.Overhead {
		out = append(out, fmt.Sprintf("overhead %d -> %d", was.Overhead, now.Overhead))
	}
	if was.Linklayer != now.Linklayer {
		ll := map[uint32]string{tc.LinkEthernet: "ethernet", tc.LinkATM: "atm", 0: "ethernet"}
		out = append(out, fmt.Sprintf("linklayer %s -> %s", ll[was.Linklayer], ll[now.Linklayer]))
	}
	if was.MPU != now.MPU {
		out = append(out, fmt.Sprintf("mpu %d -> %d", was.MPU, now.MPU))
	}
	return out
}

// classChanges lists what changed on a class, in the policy's units.
func classChanges(o, n *tc.Class) []string {
	var out []string
	if o.Rate != n.Rate {
		out = append(out, fmt.Sprintf("rate %s -> %s", o.Rate.String(), n.Rate.String()))
	}
	if o.Ceil != n.Ceil {
		out = append(out, fmt.Sprintf("ceil %s -> %s", o.Ceil.String(), n.Ceil.String()))
	}
	if o.Prio != n.Prio {
		out = append(out, fmt.Sprintf("prio %d -> %d", o.Prio, n.Prio))
	}
	b, cb := tc.BurstChanged(o, n)
	if b {
		out = append(out, fmt.Sprintf("burst %db -> %db", o.Burst, n.Burst))
	}
	if cb {
		out = append(out, fmt.Sprintf("cburst %db -> %db", o.Cburst, n.Cburst))
	}
	if o.Quantum != n.Quantum {
		out = append(out, fmt.Sprintf("quantum %d -> %d", o.Quantum, n.Quantum))
	}
	return out
}

// String writes the summary as plan prints it: a line per change and a
// count line.
func (s *Summary) String() string {
	if len(s.Lines) == 0 {
		return "no changes\n"
	}
	var b strings.Builder
	for _, l := range s.Lines {
		b.WriteString(l.String() + "\n")
	}
	var parts []string
	for _, subj := range []struct{ key, one, many string }{{"tree", "tree", "trees"}, {"class", "class", "classes"}, {"hosts", "host", "hosts"}, {"filter", "filter of another tool", "filters of other tools"}} {
		c := s.Counts[subj.key]
		if len(c) == 0 {
			continue
		}
		var ps []string
		for _, op := range []string{"add", "change", "delete"} {
			if c[op] > 0 {
				ps = append(ps, fmt.Sprintf("%d to %s", c[op], op))
			}
		}
		total := c["add"] + c["change"] + c["delete"]
		word := subj.many
		if total == 1 {
			word = subj.one
		}
		parts = append(parts, word+" "+strings.Join(ps, ", "))
	}
	if len(parts) == 0 {
		parts = []string{"kernel objects only (see --tc)"}
	}
	b.WriteString("plan: " + strings.Join(parts, "; ") + "\n")
	return b.String()
}
