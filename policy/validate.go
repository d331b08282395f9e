package policy

import (
	"sluice/units"

	"fmt"
	"math"
	"net/netip"
	"strings"
)

// LeafKinds are the leaf qdiscs a class may ask for.
// "none" leaves a class with HTB's built-in pfifo (txqueuelen packets)
// and costs no qdisc handle: trees of more than 32,000 hosts need it.
var LeafKinds = []string{"auto", "fq_codel", "sfq", "fq", "cake", "pfifo", "bfifo", "none"}

// MaxShards caps the transmit queues one tree is sharded over.
const MaxShards = 256

// MaxClasses is how many classes fit one HTB tree: class minors 2..0x7fff,
// because each leaf qdisc takes its class's minor as its own major, and
// majors from 0x8000 up belong to the kernel's automatic handles.
const MaxClasses = 0x7fff - 1

// MaxDepth is HTB's limit on levels of classes (TC_HTB_MAXDEPTH), the
// root class included.
const MaxDepth = 8

// ifNameProblem says why s cannot be a Linux device name (as the kernel
// checks it: 1 to 15 bytes, no '/', ':' or whitespace, not . or ..), or
// that it holds a control character, which no tool displays right: "".
func ifNameProblem(s string) string {
	switch {
	case s == "" || len(s) > 15:
		return "must be 1 to 15 bytes"
	case s == "." || s == "..":
		return "cannot be . or .."
	}
	for _, c := range []byte(s) {
		switch {
		case c == '/' || c == ':':
			return "must not contain '/' or ':'"
		case c == ' ' || c >= '\t' && c <= '\r':
			return "must not contain spaces"
		case c < 0x20 || c == 0x7f:
			return "must not contain control characters"
		}
	}
	return ""
}

// validName reports whether s is a class or host name: a letter, digit
// or '_', then up to 63 of those or '.' and '-'. (By hand, not a regexp:
// a hosts file has one per line.)
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// portProtos carry ports at the start of their header.
var portProtos = map[uint8]bool{6: true, 17: true, 33: true, 132: true, 136: true}

func validate(p *Policy, d *Diag) {
	names := map[string]Pos{}
	for _, in := range p.Interfaces {
		switch {
		case in.Name == "":
			d.Errorf(in.Pos, "interface: name is required")
			continue
		case ifNameProblem(in.Name) != "":
			d.Errorf(in.NamePos, "interface name %q: %s (a Linux device name)", in.Name, ifNameProblem(in.Name))
		}
		if prev, dup := names[in.Name]; dup {
			d.Errorf(in.NamePos, "interface %q appears twice (first at line %d)", in.Name, prev.Line)
		}
		names[in.Name] = in.NamePos
		if in.Egress == nil && in.Ingress == nil {
			d.Errorf(in.Pos, "interface %s: nothing to do; give it egress:, ingress: or both", in.Name)
		}
		for _, t := range []*Tree{in.Egress, in.Ingress} {
			if t != nil {
				validateTree(in, t, d)
			}
		}
		if t := in.Ingress; t != nil && t.Ifb != "" {
			if why := ifNameProblem(t.Ifb); why != "" {
				d.Errorf(t.IfbPos, "ifb name %q: %s (a Linux device name)", t.Ifb, why)
			}
		}
	}
	for _, in := range p.Interfaces {
		if in.Ingress != nil {
			ifb := IfbName(in)
			if prev, clash := names[ifb]; clash {
				d.Errorf(in.Ingress.Pos, "interface %s: its ifb device %s is also shaped as an interface (line %d); set ingress.ifb to another name", in.Name, ifb, prev.Line)
			}
		}
	}
}

// IfbName is the ifb device that carries an interface's ingress tree:
// ingress.ifb if set, else "ifb-" + name, shortened to fit IFNAMSIZ.
func IfbName(in *Interface) string {
	if in.Ingress != nil && in.Ingress.Ifb != "" {
		return in.Ingress.Ifb
	}
	n := "ifb-" + in.Name
	if len(n) <= 15 {
		return n
	}
	var h uint32 = 2166136261
	for i := 0; i < len(in.Name); i++ {
		h = (h ^ uint32(in.Name[i])) * 16777619
	}
	return fmt.Sprintf("ifb-%s%04x", in.Name[:7], h&0xffff)
}

func validLeaf(kind string) bool {
	for _, k := range LeafKinds {
		if k == kind {
			return true
		}
	}
	return false
}

func checkLeaf(d *Diag, kind string, at Pos, what string) {
	if kind != "" && !validLeaf(kind) {
		hint := ""
		if s := suggest(kind, LeafKinds); s != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", s)
		}
		d.Errorf(at, "%s: unknown leaf %q%s; expected one of %s", what, kind, hint, strings.Join(LeafKinds, ", "))
	}
}

// AutoBPFHosts is the number of host classes above which classifier
// auto picks BPF: beyond it a u32 tree costs more to build and change
// than a map update (docs/benchmarks.md).
const AutoBPFHosts = 1024

// scan walks a tree before validation: what it needs from the classifier
// and every class by name.
func scan(cs []*Class, byName map[string]*Class) (hosts int, police, hostsFile bool) {
	for _, c := range cs {
		if c.Name != "" && byName[c.Name] == nil {
			byName[c.Name] = c
		}
		if c.Police != nil {
			police = true
		}
		if ph := c.PerHost; ph != nil {
			if ph.Prefix == 0 && ph.CIDR.IsValid() {
				ph.Prefix = ph.CIDR.Addr().BitLen() // validatePerHost's default
			}
			hosts += ph.HostCount() + len(ph.Entries)
			hostsFile = hostsFile || ph.HostsFile != ""
		}
		h, p, f := scan(c.Classes, byName)
		hosts, police, hostsFile = hosts+h, police || p, hostsFile || f
	}
	return
}

// resolveClassifier decides between u32 and BPF.
func resolveClassifier(where string, t *Tree, hosts int, police, hostsFile bool, d *Diag) {
	switch t.Classifier {
	case "bpf":
		t.BPF = true
	case "u32":
		if police {
			d.Errorf(t.ClassifierPos, "%s: police needs classifier bpf (this classifier: u32); sluice polices in BPF", where)
		}
		if c := hostsFileWithMatch(t.Classes); c != nil {
			d.Errorf(t.ClassifierPos, "%s: class %s combines a hosts_file with match rules, which u32 cannot (a host lookup after other tests); use classifier bpf", where, c.Name)
		}

	default:
		t.BPF = t.EDT() || police || hostsFile || hosts > AutoBPFHosts
	}
}

func hostsFileWithMatch(cs []*Class) *Class {
	for _, c := range cs {
		if c.PerHost != nil && c.PerHost.HostsFile != "" && len(c.Match) > 0 {
			return c
		}
		if x := hostsFileWithMatch(c.Classes); x != nil {
			return x
		}
	}
	return nil
}

// validateLink checks a direction's link-layer keys: they size a
// shaped tree's packets (HTB's size table, the EDT program's count), so
// they need a tree.
func validateLink(where string, t *Tree, d *Diag) {
	at, key := t.OverheadPos, "overhead"
	switch {
	case t.Linklayer != "":
		at, key = t.LinklayerPos, "linklayer"
	case t.MPU != 0:
		at, key = t.MPUPos, "mpu"
	case t.Overhead == 0:
		return
	}
	if t.Police != nil {
		d.Errorf(at, "%s: %s sizes a shaped tree's packets; police directly under %s has no tree", where, key, t.Dir)
	}
}

// resolveParents hangs hosts_file entries below the class their parent
// column names: a group of their per_host class's groups_file, else a
// plain class of the tree.
func resolveParents(where string, t *Tree, cs []*Class, byName map[string]*Class, d *Diag) {
	for _, c := range cs {
		if ph := c.PerHost; ph != nil {
			groups := groupsOf(c, d)
			for _, e := range ph.Entries {
				e.ParentCls, e.Owner, e.ClassName = c, c, c.Name+"/"+e.Name
				if e.Parent == "" || e.Parent == c.Name {
					continue
				}
				if g := groups[e.Parent]; g != nil {
					e.ParentCls = g
					g.Hosts = append(g.Hosts, e)
					continue
				}
				pc := byName[e.Parent]
				switch {
				case pc == nil && ph.Pods != "":
					// The agent writes the groups and the pods in two
					// files: a reload between the writes may find a
					// pod's namespace not yet listed. It is a pod
					// below the pods class until the next.
					d.WarnIn(e.File, Pos{e.Line, 1}, "hosts file: host %s: parent %q is no group or class of %s: the host hangs below %s", e.Name, e.Parent, where, c.Name)
					continue
				case pc == nil:
					d.ErrorIn(e.File, Pos{e.Line, 1}, "hosts file: host %s: parent class %q does not exist in %s%s", e.Name, e.Parent, where, suggestClass(e.Parent, byName))
					continue
				case len(pc.Match) > 0 || pc.PerHost != nil || len(pc.Classes) > 0:
					d.ErrorIn(e.File, Pos{e.Line, 1}, "hosts file: host %s: parent class %q must be a plain class (no match, per_host or classes): it becomes the hosts' parent", e.Name, e.Parent)
					continue
				}
				e.ParentCls = pc
				pc.Hosts = append(pc.Hosts, e)
			}
		}
		resolveParents(where, t, c.Classes, byName, d)
	}
}

func validateTree(in *Interface, t *Tree, d *Diag) {
	where := in.Name + " " + t.Dir
	validateBackend(where, t, d)
	validateLink(where, t, d)
	validateClassIDs(where, t, d)
	if t.Police != nil {
		if t.Rate != nil || t.Auto != nil || len(t.Classes) > 0 || t.Default != "" {
			d.Errorf(t.Police.Pos, "%s: police directly under %s polices without a tree; for policing inside a tree put police on a class", where, t.Dir)
			return
		}
		if t.Classifier == "u32" {
			d.Errorf(t.ClassifierPos, "%s: police needs classifier bpf", where)
		}
		t.BPF = true
		validatePolice(where, t.Police, 0, d)
		return
	}
	if t.Shards > 0 && t.Classifier == "u32" {
		d.Errorf(t.ShardsPos, "%s: shards needs classifier bpf: only the BPF classifier can keep a host on its queue", where)
	}
	if t.Rate == nil {
		d.Errorf(t.Pos, "%s: rate is required (the whole link, like 19mbit)", where)
		return
	}
	if t.Rate.Percent > 0 {
		d.Errorf(t.Rate.Pos, "%s: rate must be absolute (like 19mbit) or auto; percentages are for classes", where)
		return
	}
	if !validateAuto(where, t, d) {
		return
	}
	t.RateBps = t.Rate.Bps
	if t.IsAuto() {
		t.RateBps = t.Auto.BaseBps
	}
	checkLeaf(d, t.Leaf, t.LeafPos, where)
	if t.Leaf == "pfifo" && inheritsWithoutLimit(t.Classes, "pfifo") {
		d.Warnf(t.LeafPos, "%s: %s", where, pfifoWarning)
	}
	if len(t.Classes) == 0 {
		// A bare rate limit: one class takes everything.
		t.Classes = []*Class{{Pos: t.Pos, Name: "default", Rate: &Rate{Percent: 100, Text: "100%", Pos: t.Rate.Pos}}}
		if t.Default == "" {
			t.Default = "default"
		}
	}
	pre := map[string]*Class{}
	hosts, police, hostsFile := scan(t.Classes, pre)
	resolveClassifier(where, t, hosts, police, hostsFile, d)
	resolveParents(where, t, t.Classes, pre, d)
	byName := map[string]*Class{}
	count := 0
	var walk func(cs []*Class, parent *Class, parentRate, parentCeil units.Rate, depth int)
	walk = func(cs []*Class, parent *Class, parentRate, parentCeil units.Rate, depth int) {
		var sum units.Rate
		for _, c := range cs {
			c.Parent = parent
			count++
			if !validateClass(where, t, c, parentRate, parentCeil, byName, d) {
				continue
			}
			sum += c.RateBps
			level := depth + 1
			if c.PerHost != nil {
				level++
				if len(c.PerHost.Groups) > 0 {
					level++ // the groups, then their hosts
				}
			}
			if level+1 > MaxDepth && !t.EDT() { // +1: the root class
				d.Errorf(c.Pos, "%s: class %s is nested too deep; HTB allows %d levels including the root", where, c.Name, MaxDepth)
			}
			if c.PerHost != nil {
				n := c.PerHost.HostCount() + len(c.PerHost.Entries)
				count += n + len(c.PerHost.Groups)
				t.Hosts += n
			}
			walk(c.Classes, c, c.RateBps, c.CeilBps, depth+1)
			if c.PerHost != nil && len(c.PerHost.Groups) > 0 {
				// Validated as the file's lines (groupRates): from
				// here on they are the class's children.
				c.Classes = c.PerHost.Groups
			}
		}
		checkWeights(where, cs, parent, d)
		if sum > parentRate && len(cs) > 0 {
			owner, at := "the "+t.Dir+" rate", t.Rate.Pos
			if parent != nil {
				owner, at = "the rate of class "+parent.Name, parent.Rate.Pos
			}
			d.Errorf(at, "%s: children's rates add up to %s, above %s (%s): %s", where,
				sum.String(), owner, parentRate.String(), rateList(cs))
		}
	}
	errsBefore := len(d.Errs)
	walk(t.Classes, nil, t.RateBps, t.RateBps, 0)
	classErrs := len(d.Errs) > errsBefore
	if t.IsAuto() && d.Err() == nil {
		checkAutoFloor(where, t, d)
	}
	if t.Linklayer == "ptm" && d.Err() == nil {
		// Every rate, not the link's alone: the classes' guarantees
		// and ceils are line rates too, and their proportions hold.
		t.ScaleRates(PTMScale)
	}
	var sharing func(cs []*Class)
	sharing = func(cs []*Class) {
		for _, c := range cs {
			if c.Sharing != nil {
				checkSharing(where+": class "+c.Name, c.Sharing, c.CeilBps, c, t, d)
			}
			sharing(c.Classes)
		}
	}
	if t.Sharing != nil {
		checkSharing(where, t.Sharing, t.RateBps, nil, t, d)
	}
	sharing(t.Classes)
	// A BPF tree may be sharded over several HTBs, one per transmit
	// queue: the planner, which knows the device's queues, checks that
	// there are enough.
	t.ClassCount = count
	if t.EDT() && t.Hosts > MaxEDTHosts {
		d.Errorf(t.Pos, "%s: %d hosts; the EDT backend's host table holds at most %d per tree", where, t.Hosts, MaxEDTHosts)
	}
	switch shards := (count + MaxClasses - 1) / MaxClasses; {
	case count <= MaxClasses || t.EDT():
	case classErrs:
		// A class already refused (a cidr with more hosts than HTB's
		// ids): how to shard what cannot be planned would say the
		// opposite of its error.
	case !t.BPF:
		d.Errorf(t.Pos, "%s: %d classes (%d of them hosts) do not fit one HTB, which holds at most %d; with classifier bpf on a device of several transmit queues the tree is sharded, one HTB per queue", where, count, t.Hosts, MaxClasses)
	case shards > MaxShards:
		d.Errorf(t.Pos, "%s: %d classes (%d of them hosts): even sharded over %d transmit queues, HTB trees hold at most %d", where, count, t.Hosts, MaxShards, MaxShards*MaxClasses)
	case t.Shards == 1:
		d.Errorf(t.ShardsPos, "%s: %d classes (%d of them hosts) do not fit one HTB (at most %d); shards: 1 forbids sharding, and at least %d shards are needed", where, count, t.Hosts, MaxClasses, shards)
	default:
		d.Warnf(t.Pos, "%s: %d classes (%d of them hosts) do not fit one HTB (at most %d): the tree must be sharded over at least %d transmit queues of the device (plan checks it has them)", where, count, t.Hosts, MaxClasses, shards)
	}
	if !classErrs {
		deadRules(where, t, d)
	}
	switch def := byName[t.Default]; {
	case t.Default == "":
		d.Errorf(t.Pos, "%s: default is required: the class for traffic no rule matches", where)
	case def == nil:
		d.Errorf(t.DefaultPos, "%s: default class %q does not exist%s", where, t.Default, suggestClass(t.Default, byName))
	case def.PerHost != nil:
		d.Errorf(t.DefaultPos, "%s: default class %q is a per_host class (a class for each host); the default must be a leaf class that takes what no rule matches: add one without per_host", where, t.Default)
	case !def.IsLeaf():
		d.Errorf(t.DefaultPos, "%s: default class %q has children; the default must be a leaf class", where, t.Default)
	}
}

// validateBackend checks the backend and the keys that belong to one.
func validateBackend(where string, t *Tree, d *Diag) {
	if t.Backend == "" {
		t.Backend = "htb"
	}
	if !t.EDT() {
		for _, k := range []struct {
			set bool
			at  Pos
			key string
		}{{t.Horizon != 0, t.HorizonPos, "horizon"}, {t.Burst != nil, burstPos(t.Burst), "burst"},
			{len(t.Exempt) > 0, matchPos(t.Exempt), "exempt"}, {t.Queues != 0, t.QueuesPos, "queues"}} {
			if k.set {
				d.Errorf(k.at, "%s: %s is for backend edt (this direction's backend is htb)", where, k.key)
			}
		}
		return
	}
	switch {
	case t.Police != nil:
		d.Errorf(t.BackendPos, "%s: backend edt shapes a class tree; police directly under %s has none (leave backend out)", where, t.Dir)
	case t.Classifier == "u32":
		d.Errorf(t.ClassifierPos, "%s: backend edt classifies in its own BPF program; classifier u32 cannot feed it", where)
	case t.Shards > 0:
		d.Errorf(t.ShardsPos, "%s: shards splits HTB trees; backend edt has none (every transmit queue gets fq)", where)
	}
	t.BPF = true
	if t.Horizon == 0 {
		t.Horizon = DefaultHorizon
	}
	if t.Burst == nil {
		t.Burst = &Burst{Time: DefaultEDTBurst, Pos: t.Pos}
	}
	for _, m := range t.Exempt {
		validateMatch(where+" exempt", m, d)
	}
	var walk func(cs []*Class, shared bool)
	walk = func(cs []*Class, shared bool) {
		for _, c := range cs {
			what := where + ": class " + c.Name
			for _, k := range []struct {
				set bool
				at  Pos
				key string
			}{{c.Cburst != nil, sizePos(c.Cburst), "cburst"}, {c.Quantum != nil, sizePos(c.Quantum), "quantum"},
				{c.Leaf != "", c.LeafPos, "leaf"}, {c.Limit != nil, limitPos(c.Limit), "limit"}} {
				if k.set {
					d.Errorf(k.at, "%s: %s is for HTB classes; backend edt paces each class in BPF and queues in fq", what, k.key)
				}
			}
			if c.Weight > 0 && !shared {
				d.Errorf(c.WeightPos, "%s: weight shares spare capacity between HTB classes; an edt aggregate is paced at its own ceil and borrows nothing, unless its parent has sharing: controller", what)
			}
			if ph := c.PerHost; ph != nil && (ph.Leaf != "" || ph.Limit != nil) {
				d.Errorf(ph.Pos, "%s: per_host leaf and limit are for HTB classes; backend edt queues in fq", what)
			}
			walk(c.Classes, c.Sharing != nil)
		}
	}
	walk(t.Classes, t.Sharing != nil)
	if t.Leaf != "" {
		d.Errorf(t.LeafPos, "%s: leaf is for HTB classes; backend edt queues in fq on every transmit queue", where)
	}
}

func burstPos(b *Burst) Pos {
	if b == nil {
		return Pos{}
	}
	return b.Pos
}

func sizePos(s *Size) Pos {
	if s == nil {
		return Pos{}
	}
	return s.Pos
}

func limitPos(l *Limit) Pos {
	if l == nil {
		return Pos{}
	}
	return l.Pos
}

func matchPos(ms []*Match) Pos {
	if len(ms) == 0 {
		return Pos{}
	}
	return ms[0].Pos
}

// checkSharing checks a sharing block over owner's children (nil owner:
// the direction's top-level classes) and resolves its cap against base,
// the most the children can get together (the owner's ceil).
func checkSharing(what string, sh *Sharing, base units.Rate, owner *Class, t *Tree, d *Diag) {
	what += " sharing"
	children := t.Classes
	if owner != nil {
		children = owner.Classes
		if len(children) == 0 {
			d.Errorf(sh.Pos, "%s: the controller shares between child classes, and this class has none (per_host hosts share by HTB's quanta)", what)
			return
		}
	}
	if t.EDT() {
		for _, c := range children {
			if !c.IsLeaf() {
				d.Errorf(sh.Pos, "%s: with backend edt the controller shares between leaf classes (each one aggregate with its own clock), and %s has children or hosts", what, c.Name)
				return
			}
		}
	}
	sh.CapBps = base
	if sh.Cap != nil {
		sh.CapBps = sh.Cap.Resolve(base)
		if sh.CapBps > base {
			d.Errorf(sh.Cap.Pos, "%s: cap %s is above the %s the children can get together", what, sh.CapBps.String(), base.String())
		}
	}
}

// checkWeights refuses a weight set on some siblings of one prio but not
// on others: weights are relative numbers and a rate is not one of them.
func checkWeights(where string, cs []*Class, parent *Class, d *Diag) {
	byPrio := make([][]*Class, 8)
	for _, c := range cs {
		if c.Prio >= 0 && c.Prio < len(byPrio) {
			byPrio[c.Prio] = append(byPrio[c.Prio], c)
		}
	}
	for prio, group := range byPrio {
		var with, without []string
		var at Pos
		for _, c := range group {
			if c.Weight > 0 {
				with = append(with, c.Name)
				if at.Line == 0 {
					at = c.WeightPos
				}
			} else {
				without = append(without, c.Name)
			}
		}
		if len(with) > 0 && len(without) > 0 {
			under := "at the top of the tree"
			if parent != nil {
				under = "under class " + parent.Name
			}
			d.Errorf(at, "%s: weight is set on %s but not on %s (prio %d, %s): weights are relative, so set weight on every sibling of one prio or on none (then their rates count)",
				where, strings.Join(with, ", "), strings.Join(without, ", "), prio, under)
		}
	}
}

func rateList(cs []*Class) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s %s", c.Name, c.RateBps.String()))
	}
	return strings.Join(parts, ", ")
}

func suggestClass(name string, byName map[string]*Class) string {
	if s := suggest(name, keys(byName)); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

func validateClass(where string, t *Tree, c *Class, parentRate, parentCeil units.Rate, byName map[string]*Class, d *Diag) bool {
	switch {
	case c.Name == "":
		d.Errorf(c.Pos, "%s: class without a name", where)
		return false
	case !validName(c.Name):
		d.Errorf(c.NamePos, "%s: class name %q: use letters, digits, '_', '.', '-' (up to 64)", where, c.Name)
	}
	if prev, dup := byName[c.Name]; dup {
		d.Errorf(c.NamePos, "%s: duplicate class name %q (first at line %d)", where, c.Name, prev.Pos.Line)
		return false
	}
	byName[c.Name] = c
	what := where + ": class " + c.Name
	if c.Rate == nil {
		d.Errorf(c.Pos, "%s: rate is required", what)
		return false
	}
	c.RateBps = c.Rate.Resolve(parentRate)
	c.CeilBps = parentCeil
	if c.Ceil != nil {
		c.CeilBps = c.Ceil.Resolve(parentCeil)
	}
	if c.RateBps == 0 {
		d.Errorf(c.Rate.Pos, "%s: rate %s comes to less than 1 byte/s", what, c.Rate.Text)
		return false
	}
	if c.CeilBps < c.RateBps {
		at := c.Rate.Pos
		if c.Ceil != nil {
			at = c.Ceil.Pos
		}
		d.Errorf(at, "%s: ceil %s is below rate %s; ceil is the most a class may use, so it cannot be less than its rate",
			what, c.CeilBps.String(), c.RateBps.String())
	}
	if c.Ceil != nil && c.CeilBps > parentCeil {
		d.Warnf(c.Ceil.Pos, "%s: ceil %s is above its parent's %s and cannot be reached", what, c.CeilBps.String(), parentCeil.String())
	}
	if t.Backend == "edt" {
		checkEDTBurst(d, c.Burst, c.CeilBps, what)
	} else {
		checkBurst(d, c.Burst, c.RateBps, what, "burst", "rate")
		checkBurst(d, c.Cburst, c.CeilBps, what, "cburst", "ceil")
	}
	if q := c.Quantum; q != nil && q.Bytes > math.MaxInt32 {
		d.Errorf(q.Pos, "%s: quantum %d bytes: HTB holds at most %d (a signed 32-bit count)", what, q.Bytes, math.MaxInt32)
	}
	checkLeaf(d, c.Leaf, c.LeafPos, what)
	checkLimit(d, c.Leaf, c.Limit, what, c.LeafPos)
	if len(c.Classes) > 0 && c.Prio != 0 && t.Backend != "edt" && !controlled(t, c) {
		// HTB orders borrowing by the prio of the leaf that borrows, at
		// every level: an inner class's own prio is never read
		// (docs/sharing.md, Prio on a class with children).
		d.Warnf(c.PrioPos, "%s: prio %d on a class with children does nothing in HTB: its leaves' prios decide who borrows first, at every level; give the prio to its leaf classes", what, c.Prio)
	}
	if !c.IsLeaf() {
		if c.Leaf != "" {
			d.Errorf(c.LeafPos, "%s: leaf is for classes without children", what)
		}
		if c.Limit != nil {
			d.Errorf(c.Limit.Pos, "%s: limit is for classes without children", what)
		}
	}
	if c.PerHost != nil && len(c.Classes) > 0 {
		d.Errorf(c.PerHost.Pos, "%s: a class has either classes or per_host, not both", what)
	}
	if c.Default != "" {
		var found *Class
		for _, ch := range c.Classes {
			if ch.Name == c.Default {
				found = ch
			}
		}
		switch {
		case len(c.Classes) == 0:
			d.Errorf(c.DefaultPos, "%s: default names a child, but the class has no classes", what)
		case len(c.Match) == 0:
			d.Errorf(c.DefaultPos, "%s: default needs match rules on the class: without them its children's rules join its parent's and the parent's default applies", what)
		case found == nil:
			d.Errorf(c.DefaultPos, "%s: default %q is not a child of this class", what, c.Default)
		case !found.IsLeaf():
			d.Errorf(c.DefaultPos, "%s: default %q has children; it must be a leaf", what, c.Default)
		}
	}
	for _, m := range c.Match {
		validateMatch(what, m, d)
	}
	if ph := c.PerHost; ph != nil {
		validatePerHost(what, t, c, ph, d)
	}
	if c.Police != nil {
		if !c.IsLeaf() {
			d.Errorf(c.Police.Pos, "%s: police is for leaf classes (this class has children)", what)
		}
		validatePolice(what, c.Police, c.CeilBps, d)
	}
	return true
}

// HTB keeps a class's burst as the time to send it at its rate: whole
// microseconds, then 64 ns ticks in 32 bits (as tc computes it). A
// burst shorter than a microsecond is kept as nothing, one longer than
// maxBurstTime wraps around.
const (
	ticksPerMicrosecond = 15.625
	maxBurstTime        = math.MaxUint32 / ticksPerMicrosecond / 1e6 // about 274 s
)

func checkBurst(d *Diag, b *Size, rate units.Rate, what, name, rateName string) {
	if b == nil || rate == 0 {
		return
	}
	secs := float64(b.Bytes) / float64(rate)
	switch {
	case secs*1e6 < 1:
		d.Errorf(b.Pos, "%s: %s %d bytes lasts less than a microsecond at %s %s, and HTB would keep it as 0; give at least %d bytes",
			what, name, b.Bytes, rateName, rate.String(), uint64(math.Ceil(float64(rate)/1e6)))
	case secs > maxBurstTime:
		d.Errorf(b.Pos, "%s: %s %d bytes takes %.0f s at %s %s; HTB holds a burst of at most %.0f s at its rate (%d bytes)",
			what, name, b.Bytes, secs, rateName, rate.String(), maxBurstTime, uint64(maxBurstTime*float64(rate)))
	case b.Bytes < 1514:
		d.Warnf(b.Pos, "%s: %s %d bytes is less than one full-size frame (1514 bytes): the class waits for tokens before every large packet", what, name, b.Bytes)
	}
}

// checkEDTBurst checks an EDT class's burst, in EDT's terms: the
// aggregate may send it at once after an idle spell, at its cap (its
// ceil), for at most MaxEDTBurst.
func checkEDTBurst(d *Diag, b *Size, cap units.Rate, what string) {
	if b == nil || cap == 0 {
		return
	}
	secs := float64(b.Bytes) / float64(cap)
	switch {
	case secs > MaxEDTBurst.Seconds():
		d.Errorf(b.Pos, "%s: burst %d bytes is %.0f s of the aggregate's cap %s; an EDT aggregate's burst is at most %s of its cap (%d bytes)",
			what, b.Bytes, secs, cap.String(), MaxEDTBurst, uint64(MaxEDTBurst.Seconds()*float64(cap)))
	case b.Bytes < 1514:
		d.Warnf(b.Pos, "%s: burst %d bytes is less than one full-size frame (1514 bytes): after an idle spell the aggregate still paces its first large packet", what, b.Bytes)
	}
}

// pfifoWarning is said of a pfifo leaf without a limit.
const pfifoWarning = "leaf pfifo without limit holds the kernel's default, the device's txqueuelen in packets (1000 on most), and a packet may be a 64 KB GSO packet: behind one reno flow at 10mbit the lab measured 2.2 s of queue (cc-matrix); set limit, or use bfifo or auto (50 ms at the class's rate)"

// checkLimit checks a leaf's limit against its kind; at is the leaf's
// position, where a pfifo without a limit is warned of.
func checkLimit(d *Diag, leaf string, l *Limit, what string, at Pos) {
	if l == nil {
		if leaf == "pfifo" {
			d.Warnf(at, "%s: %s", what, pfifoWarning)
		}
		return
	}
	switch {
	case leaf == "bfifo" && l.Packets > 0:
		d.Errorf(l.Pos, "%s: bfifo counts bytes; write the limit as a size, like %dkb", what, l.Packets*3/2)
	case l.Bytes > 0 && leaf != "bfifo" && leaf != "auto" && leaf != "":
		d.Errorf(l.Pos, "%s: %s counts packets; write the limit as a number of packets", what, leaf)
	case leaf == "cake":
		d.Errorf(l.Pos, "%s: cake sizes its own queue; remove limit", what)
	}
}

func validatePerHost(what string, t *Tree, c *Class, ph *PerHost, d *Diag) {
	what += ": per_host"
	if !ph.CIDR.IsValid() {
		// max: a pods class may have no pods yet (its share is then
		// that of one).
		hostRates(what, c, ph, max(uint64(len(ph.Entries)), 1), d)
		return
	}
	if len(c.Match) > 0 {
		// A rule of the other family than the hosts' selects packets
		// no host's address can be in.
		dead := 0
		for _, m := range c.Match {
			if fam := m.family(); fam != 0 && fam != ph.CIDR.Addr().BitLen() {
				dead++
			}
		}
		if dead == len(c.Match) {
			d.Warnf(ph.CIDRPos, "%s: its hosts (cidr %s) are IPv%d and every rule of the class matches IPv%d alone: no packet reaches a host",
				what, ph.CIDR, map[int]int{32: 4, 128: 6}[ph.CIDR.Addr().BitLen()], map[int]int{32: 6, 128: 4}[ph.CIDR.Addr().BitLen()])
		}
	}
	bits := ph.CIDR.Addr().BitLen()
	if ph.Prefix == 0 {
		ph.Prefix = bits
	}
	if ph.Prefix > bits || ph.Prefix < ph.CIDR.Bits() {
		d.Errorf(ph.PrefixPos, "%s: prefix /%d must be between the cidr's /%d and /%d", what, ph.Prefix, ph.CIDR.Bits(), bits)
		return
	}
	hostBits := ph.Prefix - ph.CIDR.Bits()
	if t.EDT() {
		if hostBits > 20 || ph.HostCount() > MaxEDTHosts {
			d.Errorf(ph.CIDRPos, "%s: %s with one aggregate per /%d needs %d; the EDT backend's host table holds at most %d per tree (use a longer prefix)",
				what, ph.CIDR, ph.Prefix, 1<<min(hostBits, 30), MaxEDTHosts)
			return
		}
	} else if hostBits > 16 || ph.HostCount() > MaxClasses {
		d.Errorf(ph.CIDRPos, "%s: %s with one class per /%d needs %d classes; one per_host class holds at most %d, even in a sharded tree (use a longer prefix, or split the cidr over several per_host classes)",
			what, ph.CIDR, ph.Prefix, ph.HostCount(), MaxClasses)
		return
	}
	// u32 hashes at most 8 bits per table and reads 32-bit words: each
	// 8-bit group of host bits must sit inside one word.
	for hi := ph.Prefix; hi > ph.CIDR.Bits() && !t.BPF; hi -= 8 {
		lo := max(hi-8, ph.CIDR.Bits())
		if lo/32 != (hi-1)/32 {
			d.Errorf(ph.PrefixPos, "%s: host bits %d-%d cross a 32-bit boundary, which u32 cannot hash; choose a prefix so that each 8 bits stay within one word", what, lo, hi)
			return
		}
	}
	n := uint64(ph.HostCount())
	if n == 0 {
		d.Errorf(ph.CIDRPos, "%s: %s holds no hosts", what, ph.CIDR)
		return
	}
	hostRates(what, c, ph, n+uint64(len(ph.Entries)), d)
}

// hostRates resolves the per-host rate and ceil, and each hosts_file
// entry's own.
func hostRates(what string, c *Class, ph *PerHost, n uint64, d *Diag) {
	ph.RateBps = c.RateBps / units.Rate(n)
	if ph.Rate != nil {
		// A rate given that comes to nothing is refused, as a class's is;
		// only the default share of many hosts is held at 1 byte/s.
		if ph.RateBps = ph.Rate.Resolve(c.RateBps); ph.RateBps == 0 {
			d.Errorf(ph.Rate.Pos, "%s: rate %s comes to less than 1 byte/s", what, ph.Rate.Text)
		}
	}
	if ph.RateBps == 0 {
		ph.RateBps = 1
	}
	ph.CeilBps = c.CeilBps
	if ph.Ceil != nil {
		ph.CeilBps = ph.Ceil.Resolve(c.CeilBps)
	}
	if ph.CeilBps < ph.RateBps {
		d.Errorf(ph.Pos, "%s: ceil %s is below rate %s", what, ph.CeilBps.String(), ph.RateBps.String())
	}
	checkLeaf(d, ph.Leaf, ph.LeafPos, what)
	checkLimit(d, ph.Leaf, ph.Limit, what, ph.LeafPos)
	for _, e := range ph.Entries {
		e.RateBps, e.CeilBps = ph.RateBps, ph.CeilBps
		if e.Rate != nil {
			// A pod's weight is its part of the class: held at 1 byte/s
			// where it comes to less, as a default share is.
			if e.RateBps = e.Rate.Resolve(c.RateBps); e.RateBps == 0 && ph.Pods == "" {
				d.ErrorIn(e.File, Pos{e.Line, 1}, "hosts file: host %s: rate %s comes to less than 1 byte/s", e.Name, e.Rate.Text)
			}
		}
		if e.Ceil != nil {
			e.CeilBps = e.Ceil.Resolve(c.CeilBps)
		}
		if e.RateBps == 0 {
			e.RateBps = 1
		}
		if ph.Pods != "" {
			// A pod's annotation is a cap: what it is guaranteed cannot
			// be more (and one bad pod must not refuse the node's policy).
			e.RateBps = min(e.RateBps, e.CeilBps)
		}
		if e.CeilBps < e.RateBps {
			d.ErrorIn(e.File, Pos{e.Line, 1}, "hosts file: host %s: ceil %s is below rate %s", e.Name, e.CeilBps.String(), e.RateBps.String())
		}
	}
	groupRates(what, c, ph, d)
}

func families(ps []netip.Prefix) (v4, v6 bool) {
	for _, p := range ps {
		if p.Addr().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	return
}

func validateMatch(what string, m *Match, d *Diag) {
	what += ": match"
	v4, v6 := true, true
	restrict := func(ps []netip.Prefix) {
		if len(ps) > 0 {
			a, b := families(ps)
			v4, v6 = v4 && a, v6 && b
		}
	}
	restrict(m.Src)
	restrict(m.Dst)
	for _, pr := range m.Proto {
		if pr == 1 {
			v6 = false
		}
		if pr == 58 {
			v4 = false
		}
	}
	if len(m.Proto) > 0 && !v4 && !v6 {
		// icmp and icmpv6 in one entry is fine: they pick a family each.
		has1, has58 := false, false
		for _, pr := range m.Proto {
			has1, has58 = has1 || pr == 1, has58 || pr == 58
		}
		if has1 && has58 && len(m.Src) == 0 && len(m.Dst) == 0 {
			v4, v6 = true, true
		}
	}
	if !v4 && !v6 {
		d.Errorf(m.Pos, "%s: no packet can match: the addresses and protocols given are of different IP versions", what)
	}
	hasPorts := len(m.Sport) > 0 || len(m.Dport) > 0
	for _, pr := range m.Proto {
		if hasPorts && !portProtos[pr] {
			d.Errorf(m.Fields["proto"], "%s: ports need proto tcp, udp, sctp, dccp or udplite (or no proto for tcp and udp), not %d", what, pr)
			break
		}
		if m.TCPAck && pr != 6 {
			d.Errorf(m.Fields["tcp_ack"], "%s: tcp_ack matches TCP packets, but proto says %d", what, pr)
			break
		}
		if m.TCPSyn && pr != 6 {
			d.Errorf(m.Fields["tcp_syn"], "%s: tcp_syn matches TCP packets, but proto says %d", what, pr)
			break
		}
	}
	if m.TCPAck && m.TCPSyn {
		d.Errorf(m.Fields["tcp_syn"], "%s: no packet can match: tcp_ack takes packets with SYN clear, tcp_syn those with SYN set; put them in two rules", what)
	}
	if m.TOS != nil && len(m.DSCP) > 0 {
		d.Errorf(m.Fields["tos"], "%s: dscp and tos read the same bits; use one of them", what)
	}
	for _, s := range m.Src {
		for _, n := range m.NotSrc {
			if n.Bits() <= s.Bits() && n.Contains(s.Addr()) {
				d.Errorf(m.Fields["not_src"], "%s: not_src %s excludes all of src %s", what, n, s)
			}
		}
	}
	for _, s := range m.Dst {
		for _, n := range m.NotDst {
			if n.Bits() <= s.Bits() && n.Contains(s.Addr()) {
				d.Errorf(m.Fields["not_dst"], "%s: not_dst %s excludes all of dst %s", what, n, s)
			}
		}
	}
}

// controlled reports whether a sharing controller shares c with its
// siblings (the controller reads their prios: prio 0 is prod).
func controlled(t *Tree, c *Class) bool {
	if c.Parent != nil {
		return c.Parent.Sharing != nil
	}
	return t.Sharing != nil
}

// family is the address length a rule's src or dst confines it to (32,
// 128), or 0 where it takes both.
func (m *Match) family() int {
	for _, ps := range [][]netip.Prefix{m.Src, m.Dst} {
		if len(ps) == 0 {
			continue
		}
		fam := ps[0].Addr().BitLen()
		for _, p := range ps[1:] {
			if p.Addr().BitLen() != fam {
				return 0
			}
		}
		return fam
	}
	return 0
}

// validateClassIDs checks the classid keys of t: each once, and only on
// a tree of one HTB sluice numbers (an EDT tree has no classes).
func validateClassIDs(where string, t *Tree, d *Diag) {
	seen := map[uint16]*Class{}
	var walk func(cs []*Class)
	walk = func(cs []*Class) {
		for _, c := range cs {
			if c.ClassID != 0 {
				switch prev := seen[c.ClassID]; {
				case t.EDT():
					d.Errorf(c.ClassIDPos, "%s: class %s: classid: an EDT tree has no HTB classes to number", where, c.Name)
				case prev != nil:
					d.Errorf(c.ClassIDPos, "%s: class %s: classid 1:%x is class %s's already (line %d)", where, c.Name, c.ClassID, prev.Name, prev.ClassIDPos.Line)
				default:
					seen[c.ClassID] = c
				}
			}
			walk(c.Classes)
		}
	}
	walk(t.Classes)
}

// inheritsWithoutLimit reports whether a leaf class among cs (or a tree
// without classes) takes the tree's leaf kind with no limit of its own.
func inheritsWithoutLimit(cs []*Class, kind string) bool {
	if len(cs) == 0 {
		return true
	}
	for _, c := range cs {
		if len(c.Classes) > 0 {
			if inheritsWithoutLimit(c.Classes, kind) {
				return true
			}
			continue
		}
		if (c.Leaf == "" || c.Leaf == kind) && c.Limit == nil {
			return true
		}
	}
	return false
}
