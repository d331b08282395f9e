package migrate

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"sluice/plan"
	"sluice/safefile"
)

// Options tune an import.
type Options struct {
	// IPv4Only keeps the old tools' behaviour of classifying IPv4 alone:
	// rules without addresses get `src: 0.0.0.0/0`, so that IPv6
	// packets go to the default class as they did.
	IPv4Only bool
	// Interface is the device a configuration that names none applies
	// to (sqm's default.conf, which sqm@DEV applies to DEV).
	Interface string
}

// maxSourceBytes bounds each file an importer reads.
const maxSourceBytes = 4 << 20

// htb.init deletes every character outside this set from a line before
// it reads it. The set is the shell's [a-zA-Z0-9.,;:=/*-_], where "*-_"
// is a range: '*' to '_' (which takes in + < > ? @ [ \ ] ^ too).
func htbInitKeeps(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '*' && r <= '_' || r == '.' || r == ',' || r == ';' || r == ':' || r == '='
}

var htbInitLine = regexp.MustCompile(`^([A-Za-z0-9_]+)=(.+)$`)

// htbInitClassFile is DEVICE-ID[:ID...][.description], ids in hex.
var htbInitClassFile = regexp.MustCompile(`^(.+?)-([0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4})*)(?:\.(.*))?$`)

type htbKV struct {
	key, value string
	line       int
}

// readHTBInitFile returns the KEY=VALUE lines of an htb.init file as
// htb.init reads them: comments cut at '#', characters outside its set
// deleted, lines of any other shape ignored.
func readHTBInitFile(path string) ([]htbKV, error) {
	b, err := safefile.ReadRegular(path, "htb.init file", maxSourceBytes)
	if err != nil {
		return nil, err
	}
	var out []htbKV
	for i, line := range strings.Split(string(b), "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		line = strings.Map(func(r rune) rune {
			if htbInitKeeps(r) {
				return r
			}
			return -1
		}, line)
		if m := htbInitLine.FindStringSubmatch(line); m != nil {
			out = append(out, htbKV{m[1], m[2], i + 1})
		}
	}
	return out, nil
}

type htbClass struct {
	at       At
	file     string
	dev      string
	id       uint16
	parent   uint16 // 0: the root
	desc     string
	kv       []htbKV
	children []*htbClass
	draft    *Class
	rate     float64 // bits/s
	ceil     float64
}

func (c *htbClass) origin() string { return fmt.Sprintf("1:%x", c.id) }

// HTBInit imports an htb.init configuration directory (seed 000's
// /etc/sysconfig/htb): a file per device with DEFAULT and R2Q, a file
// per class named DEVICE-PARENT:CLASS.description.
func HTBInit(dir string, opt Options) (*Draft, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	d := &Draft{Tool: "htb.init (" + dir + ")"}
	r := &d.Report
	// htb.init takes the files in LC_ALL=C sort order: bytes.
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	devs := map[string][]htbKV{}
	var devOrder []string
	var classFiles []string
	for _, n := range names {
		at := At{File: filepath.Join(dir, n)}
		switch {
		case strings.HasPrefix(n, ".") || strings.HasSuffix(n, "~"):
			r.Exact(at, "file "+n, "skipped, as htb.init skips hidden and backup files")
		case !strings.Contains(n, "-"):
			kv, err := readHTBInitFile(at.File)
			if err != nil {
				return nil, err
			}
			devs[n] = kv
			devOrder = append(devOrder, n)
		default:
			classFiles = append(classFiles, n)
		}
	}
	byDev := map[string]map[uint16]*htbClass{}
	var classes []*htbClass
	for _, n := range classFiles {
		at := At{File: filepath.Join(dir, n)}
		dev, ids, desc, ok := splitHTBInitName(n, devs)
		if !ok {
			r.Exact(at, "file "+n, "not an htb.init class file name (DEVICE-ID[:ID].name, ids in hex): skipped, as htb.init would")
			continue
		}
		kv, err := readHTBInitFile(at.File)
		if err != nil {
			return nil, err
		}
		c := &htbClass{at: at, file: n, dev: dev, desc: desc, kv: kv, id: ids[len(ids)-1]}
		if len(ids) > 1 {
			c.parent = ids[len(ids)-2]
		}
		if c.id < 2 {
			r.Refuse(at, "class id "+fmt.Sprintf("%x", c.id), "htb.init's class ids run from 2 to ffff (1 is the qdisc's)")
			continue
		}
		if byDev[dev] == nil {
			byDev[dev] = map[uint16]*htbClass{}
			if _, ok := devs[dev]; !ok {
				devOrder = append(devOrder, dev)
			}
		}
		if prev := byDev[dev][c.id]; prev != nil {
			r.Refuse(at, "class "+c.origin(), "the same id as %s: htb.init would fail to create it", prev.file)
			continue
		}
		byDev[dev][c.id] = c
		classes = append(classes, c)
	}
	for _, c := range classes {
		if c.parent == 0 {
			continue
		}
		p := byDev[c.dev][c.parent]
		if p == nil {
			r.Refuse(c.at, "class "+c.origin(), "its parent 1:%x has no file", c.parent)
			continue
		}
		p.children = append(p.children, c)
	}
	if len(classes) == 0 && len(devs) == 0 {
		return nil, fmt.Errorf("%s: no htb.init files (DEVICE and DEVICE-ID.name)", dir)
	}
	sort.Strings(devOrder)
	defer d.settle(At{File: dir})
	for _, dev := range devOrder {
		var roots []*htbClass
		for _, c := range classes {
			if c.dev == dev && c.parent == 0 {
				roots = append(roots, c)
			}
		}
		ifc, err := htbInitDevice(d, dir, dev, devs[dev], roots, opt)
		if err != nil {
			return nil, err
		}
		if ifc != nil {
			d.Interfaces = append(d.Interfaces, ifc)
		}
	}
	return d, nil
}

// splitHTBInitName splits DEVICE-ID[:ID...][.desc], preferring the
// longest device name that has a device file.
func splitHTBInitName(n string, devs map[string][]htbKV) (dev string, ids []uint16, desc string, ok bool) {
	rest := ""
	for name := range devs {
		if strings.HasPrefix(n, name+"-") && len(name) > len(dev) {
			dev, rest = name, n[len(name)+1:]
		}
	}
	if dev == "" {
		m := htbInitClassFile.FindStringSubmatch(n)
		if m == nil {
			return "", nil, "", false
		}
		dev, rest = m[1], n[len(m[1])+1:]
	}
	idPart := rest
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		idPart, desc = rest[:i], rest[i+1:]
	}
	for _, s := range strings.Split(idPart, ":") {
		v, err := strconv.ParseUint(s, 16, 16)
		if err != nil || s == "" || len(s) > 4 {
			return "", nil, "", false
		}
		ids = append(ids, uint16(v))
	}
	return dev, ids, desc, true
}

func htbInitDevice(d *Draft, dir, dev string, qkv []htbKV, roots []*htbClass, opt Options) (*Interface, error) {
	r := &d.Report
	devAt := At{File: filepath.Join(dir, dev)}
	defcls, r2q := uint16(0), 10.0
	defAt := devAt
	for _, kv := range qkv {
		at := At{devAt.File, kv.line}
		switch kv.key {
		case "DEFAULT":
			v, err := strconv.ParseUint(kv.value, 16, 16)
			if err != nil {
				r.Refuse(at, "DEFAULT="+kv.value, "not a class id in hex")
				continue
			}
			defcls, defAt = uint16(v), at
		case "R2Q":
			v, err := strconv.ParseFloat(kv.value, 64)
			if err != nil || v <= 0 {
				r.Refuse(at, "R2Q="+kv.value, "not a positive number")
				continue
			}
			r2q = v
		case "DCACHE":
			r.Exact(at, "DCACHE", "HTB's dequeue cache is gone from the kernel: nothing to carry over")
		default:
			r.Exact(at, kv.key, "ignored, as htb.init ignores it in a device file")
		}
	}
	if len(roots) == 0 {
		r.Exact(devAt, "device "+dev, "no classes: htb.init sets nothing up on it")
		return nil, nil
	}
	taken := map[string]bool{}
	byID := map[uint16]*htbClass{}
	var build func(c *htbClass, parentRate, parentCeil float64) *Class
	build = func(c *htbClass, parentRate, parentCeil float64) *Class {
		byID[c.id] = c
		cl := &Class{At: c.at, Origin: c.origin(), Comment: c.desc}
		c.draft = cl
		cl.Name = uniqueName(className(c.desc, fmt.Sprintf("class-%x", c.id)), taken)
		htbInitClass(r, c, cl, parentRate, parentCeil, r2q)
		for _, ch := range c.children {
			cl.Classes = append(cl.Classes, build(ch, c.rate, c.ceil))
		}
		if len(cl.Classes) > 0 {
			cl.Leaf, cl.Limit = "", ""
			if cl.Prio != nil && *cl.Prio != 0 {
				r.Exact(c.at, fmt.Sprintf("PRIO=%d on class %s", *cl.Prio, c.origin()), "left out: HTB never reads the prio of a class with children (its leaves' prios decide who borrows first)")
			}
			cl.Prio = nil
		}
		return cl
	}
	tree := &Tree{At: devAt}
	var top []*Class
	for _, c := range roots {
		top = append(top, build(c, 0, 0))
	}
	rootsToTree(r, tree, devAt, top, fmt.Sprintf("%s, class %s", roots[0].at, roots[0].origin()))
	def := byID[defcls]
	switch {
	case def != nil && len(def.children) == 0 && !(len(roots) == 1 && def == roots[0]):
		tree.Default = def.draft.Name
		r.Exact(defAt, fmt.Sprintf("DEFAULT=%x", defcls), "default: %s", def.draft.Name)
	default:
		why := "DEFAULT=0"
		if defcls != 0 {
			why = fmt.Sprintf("DEFAULT=%x names no leaf class", defcls)
		}
		addUnclassified(r, tree, defAt, taken, why, "traffic no rule matches")
	}
	fitRates(r, tree.At, tree.rateBits(), tree.Classes)
	for _, c := range allClasses(tree.Classes) {
		if len(c.Classes) > 0 && len(c.Match) > 0 {
			r.Refuse(c.At, "RULE on class "+c.Origin, "the class has children: HTB sends what it matches to the default class, which sluice's rules cannot say")
		}
	}
	htbInitOrderNotes(r, tree.Classes)
	finishMatches(r, devAt, tree.Classes, opt, "to the default class")
	return &Interface{At: devAt, Name: dev, Egress: tree}, nil
}

func (t *Tree) rateBits() float64 {
	v, _ := tcRate(t.Rate)
	return v
}

func htbInitClass(r *Report, c *htbClass, cl *Class, parentRate, parentCeil, r2q float64) {
	var rateS, ceilS string
	var rateAt At
	leaf, perturb := "none", ""
	var perturbAt At
	for _, kv := range c.kv {
		at := At{c.at.File, kv.line}
		switch kv.key {
		case "RATE":
			rateS, rateAt = kv.value, at
		case "CEIL":
			ceilS = kv.value
		case "BURST", "CBURST":
			n, err := tcSize(kv.value)
			if err != nil {
				r.Refuse(at, kv.key+"="+kv.value, "%v", err)
				continue
			}
			if kv.key == "BURST" {
				cl.Burst = byteSize(n)
			} else {
				cl.Cburst = byteSize(n)
			}
		case "PRIO":
			p, err := strconv.Atoi(kv.value)
			if err != nil || p < 0 {
				r.Refuse(at, "PRIO="+kv.value, "not a number from 0")
				continue
			}
			if p > 7 {
				r.Approx(at, "PRIO="+kv.value, "HTB has prios 0 to 7 (tc clamps to 7): prio 7")
				p = 7
			}
			cl.Prio = intp(p)
		case "LEAF":
			leaf = strings.ToLower(kv.value)
		case "LIMIT":
			if n, err := tcSize(kv.value); err != nil || n == 0 {
				r.Refuse(at, "LIMIT="+kv.value, "want a positive number (packets for pfifo, bytes for bfifo)")
				continue
			}
			cl.Limit = kv.value
		case "PERTURB":
			perturb, perturbAt = kv.value, at
		case "QUANTUM":
			r.Approx(at, "QUANTUM="+kv.value, "sluice sets quanta itself, in proportion to the classes' rates (docs/policy.md)")
		case "MTU":
			r.Exact(at, "MTU", "the kernel computes rates without tc's rate tables: nothing to carry over")
		case "RULE":
			m, err := htbInitRule(kv.value)
			if err != nil {
				r.Refuse(at, "RULE="+kv.value, "%v", err)
				continue
			}
			m.At = at
			cl.Match = append(cl.Match, m)
		case "MARK":
			v, err := strconv.ParseUint(kv.value, 0, 32)
			if err != nil {
				r.Refuse(at, "MARK="+kv.value, "not a 32-bit number")
				continue
			}
			cl.Match = append(cl.Match, &Match{At: at, Mark: strconv.FormatUint(v, 10)})
		case "REALM":
			r.Refuse(at, "REALM="+kv.value, "routing realms (tc's route classifier) have no sluice match; mark the traffic with nftables and use MARK")
		case "TIME":
			r.Refuse(at, "TIME="+kv.value, "sluice has no time-of-day rates; apply a policy per period from a timer instead")
		default:
			r.Exact(at, kv.key, "ignored, as htb.init ignores it")
		}
	}
	rate, err := htbInitRate(rateS, parentRate, parentCeil)
	switch {
	case rateS == "":
		r.Refuse(c.at, "class "+c.origin(), "no RATE: htb.init requires one")
		rate = 8000
	case err != nil:
		r.Refuse(rateAt, "RATE="+rateS, "%v", err)
		rate = 8000
	}
	ceil := rate // htb.init's CEIL defaults to the class's own RATE
	if ceilS != "" {
		if v, err := htbInitRate(ceilS, parentRate, parentCeil); err != nil {
			r.Refuse(c.at, "CEIL="+ceilS, "%v", err)
		} else {
			ceil = v
		}
	}
	if ceil < rate {
		r.Approx(c.at, "CEIL="+ceilS, "below RATE: HTB raises a ceil to the rate; ceil %s", bitRate(rate))
		ceil = rate
	}
	c.rate, c.ceil = rate, ceil
	cl.rateBits, cl.ceilBits = rate, ceil
	cl.Rate, cl.Ceil = bitRate(rate), bitRate(ceil)
	if q := rate / 8 / r2q; len(c.children) == 0 && (q < 1000 || q > 200000) {
		clamped := 1000.0
		if q > 200000 {
			clamped = 200000
		}
		r.Approx(c.at, "quantum of class "+c.origin(), "rate/R2Q is %.0f bytes, which the kernel clamps to %.0f; sluice's quanta follow the rates without that clamp", q, clamped)
	}
	switch leaf {
	case "none", "":
		cl.Leaf = "pfifo" // HTB's own leaf when none is added
	case "sfq":
		cl.Leaf = "sfq"
		if perturb != "" && perturb != "10" {
			r.Approx(perturbAt, "PERTURB="+perturb, "sluice's sfq rehashes every 10 s")
		}
	case "pfifo", "bfifo":
		cl.Leaf = leaf
	default:
		r.Refuse(c.at, "LEAF="+leaf, "htb.init knows none, sfq, pfifo and bfifo")
	}
	if cl.Limit != "" && cl.Leaf == "bfifo" {
		if n, err := tcSize(cl.Limit); err == nil {
			cl.Limit = byteSize(n)
			if n < plan.MinBfifoBytes {
				// Written for MTU-sized packets; TCP now hands the
				// queue 64 KB GSO packets, which it drops whole.
				r.Approx(c.at, "LIMIT="+cl.Limit, "a bfifo smaller than one 64 KB GSO packet and three frames drops every such packet, and TCP through it stalls (docs/policy.md, Leaf qdiscs); sluice sizes this one itself")
				cl.Limit = ""
			}
		}
	}
}

// htbInitRate reads RATE or CEIL: a tc rate, or prate/pceil (the
// parent's rate or ceil).
func htbInitRate(s string, parentRate, parentCeil float64) (float64, error) {
	switch strings.ToLower(s) {
	case "prate", "pceil":
		if parentRate == 0 {
			return 0, fmt.Errorf("%s names the parent's rate, and a root class has no parent", s)
		}
		if strings.ToLower(s) == "prate" {
			return parentRate, nil
		}
		return parentCeil, nil
	}
	return tcRate(s)
}

// htbInitRule reads RULE=[[saddr[/prefix]][:port[/mask]],][daddr[/prefix]][:port[/mask]].
func htbInitRule(s string) (*Match, error) {
	m := &Match{}
	src, dst := "", s
	if i := strings.IndexByte(s, ','); i >= 0 {
		src, dst = s[:i], s[i+1:]
	}
	for _, part := range []struct {
		text  string
		addrs *[]string
		ports *[]string
	}{{src, &m.Src, &m.Sport}, {dst, &m.Dst, &m.Dport}} {
		addr, port := part.text, ""
		if i := strings.IndexByte(part.text, ':'); i >= 0 {
			addr, port = part.text[:i], part.text[i+1:]
		}
		if addr != "" && addr != "*" {
			p, err := parsePrefix4(addr)
			if err != nil {
				return nil, err
			}
			if p.Bits() > 0 {
				*part.addrs = []string{prefixText(p)}
			} else {
				*part.addrs = []string{"0.0.0.0/0"}
			}
		}
		if port != "" && port != "*" {
			ps, err := portMask(port)
			if err != nil {
				return nil, err
			}
			*part.ports = ps
		}
	}
	if len(m.Src)+len(m.Dst)+len(m.Sport)+len(m.Dport) == 0 {
		// "*" or "," alone: every IPv4 packet.
		m.Src = []string{"0.0.0.0/0"}
	}
	return m, nil
}

// parsePrefix4 reads an IPv4 address or prefix (tc's u32 takes nothing
// else after `match ip src`).
func parsePrefix4(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			return netip.Prefix{}, fmt.Errorf("%q is not an IPv4 address or prefix", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Prefix{}, fmt.Errorf("%q is not an IPv4 address", s)
	}
	return netip.PrefixFrom(a, 32), nil
}

// prefixText writes a whole address without its /32 or /128.
func prefixText(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// portMask reads port[/mask] (numbers in C notation) into sluice's port
// syntax: a mask of leading ones is a range.
func portMask(s string) ([]string, error) {
	p, mask := s, "0xffff"
	if i := strings.IndexByte(s, '/'); i >= 0 {
		p, mask = s[:i], s[i+1:]
	}
	v, err := strconv.ParseUint(p, 0, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q is not a number from 0 to 65535", p)
	}
	mv, err := strconv.ParseUint(mask, 0, 16)
	if err != nil {
		return nil, fmt.Errorf("port mask %q is not a 16-bit number", mask)
	}
	return portField(uint32(v), uint32(mv))
}

// htbInitOrderNotes: htb.init tries every RULE (u32 at prio 100) before
// any MARK (fw at prio 200); sluice tries classes in order.
func htbInitOrderNotes(r *Report, cs []*Class) {
	all := allClasses(cs)
	for i, c := range all {
		for _, m := range c.Match {
			if m.Mark == "" {
				continue
			}
			for _, later := range all[i+1:] {
				if hasRule(later) {
					r.Approx(m.At, "MARK="+m.Mark, "tried in class order here: a packet with this mark that also matches a RULE of %s (a later class) went there under htb.init, which tries every RULE before any MARK", later.Name)
					break
				}
			}
		}
	}
}

func hasRule(c *Class) bool {
	for _, m := range c.Match {
		if m.Mark == "" {
			return true
		}
	}
	return false
}

func allClasses(cs []*Class) []*Class {
	var out []*Class
	for _, c := range cs {
		out = append(out, c)
		out = append(out, allClasses(c.Classes)...)
	}
	return out
}
