package tc

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Verb is what an Op does to its object.
type Verb int

const (
	// Add creates the object. For leaf qdiscs it replaces the default
	// pfifo HTB attaches to every new class.
	Add Verb = iota
	// Change modifies the object in place.
	Change
	// Delete removes the object (and whatever the kernel removes with it).
	Delete
)

func (v Verb) String() string {
	return [...]string{"add", "change", "delete"}[v]
}

// Op is one change to the kernel.
type Op struct {
	Verb Verb
	Obj  Object
	// Force allows an Add of a root qdisc to replace a qdisc sluice did
	// not create.
	Force bool
}

// BatchLine renders op as a line for `tc -batch`. Operations tc cannot do
// (creating an ifb link) come back as a comment naming the ip(8) command.
func (op Op) BatchLine() string {
	switch o := op.Obj.(type) {
	case *Link:
		switch op.Verb {
		case Add:
			return fmt.Sprintf("# requires: ip link add %s type %s && ip link set %s up", ShellWord(o.Name), o.Kind, ShellWord(o.Name))
		case Delete:
			return fmt.Sprintf("# then: ip link del %s", ShellWord(o.Name))
		}
		return fmt.Sprintf("# requires: ip link set %s up", ShellWord(o.Name))
	case *Qdisc:
		verb := op.Verb.String()
		if op.Verb == Change {
			o = o.forChange()
		}
		switch {
		case op.Verb == Delete:
			verb = "del"
		case op.Verb == Add && (o.Parent != HandleRoot && o.Parent != HandleIngress || op.Force):
			verb = "replace"
		}
		s := fmt.Sprintf("qdisc %s dev %s %s", verb, batchWord(o.Dev), parentWord(o.Parent))
		if o.Parent == HandleIngress {
			s = fmt.Sprintf("qdisc %s dev %s %s", verb, batchWord(o.Dev), o.Kind)
			return s
		}
		if op.Verb == Delete {
			return s + fmt.Sprintf(" handle %s %s", o.Handle, o.Kind)
		}
		s += fmt.Sprintf(" handle %s %s%s", o.Handle, o.stabWords(), o.Kind)
		{
			if a := o.optionString(); a != "" {
				s += " " + a
			}
		}
		return s
	case *Class:
		verb := op.Verb.String()
		if op.Verb == Delete {
			return fmt.Sprintf("class del dev %s parent %s classid %s", batchWord(o.Dev), o.Parent, o.Handle)
		}
		return fmt.Sprintf("class %s dev %s parent %s classid %s htb %s", verb, batchWord(o.Dev), o.Parent, o.Handle, o.optionString())
	case *Filter:
		head := fmt.Sprintf("dev %s %s protocol %s prio %d", batchWord(o.Dev), parentWordFilter(o.Parent), protoWord(o.Proto), o.Prio)
		if op.Verb == Delete {
			if o.IsTP() {
				return "filter del " + head
			}
			h := o.Raw
			if h == 0 {
				h = o.Handle
			}
			return fmt.Sprintf("filter del %s handle %s %s", head, U32Handle(h), o.Kind)
		}
		return fmt.Sprintf("filter add %s handle %s %s %s", head, U32Handle(o.Handle), o.Kind, o.u32Args(true))
	}
	return "# unknown object " + op.Obj.Key()
}

func protoWord(p uint16) string {
	switch p {
	case ProtoAll:
		return "all"
	case 0x0800:
		return "ip"
	case 0x86DD:
		return "ipv6"
	}
	return fmt.Sprintf("0x%04x", p)
}

// u32Args renders a u32 node or table in tc's syntax. Keys are written as
// raw "match u32" words so that tc packs them exactly as sluice does.
func (f *Filter) u32Args(batch bool) string {
	u := f.U32
	if u == nil {
		return ""
	}
	if u.Divisor > 0 {
		return fmt.Sprintf("divisor %d", u.Divisor)
	}
	var a []string
	if t := U32HTID(f.Handle); t != 0 {
		a = append(a, "ht "+U32Handle(f.Handle&0xFFFFF000))
	}
	if u.Sel != nil {
		for _, k := range u.Sel.Keys {
			at := fmt.Sprintf("%d", k.Off)
			if k.NextHdr {
				at = "nexthdr+" + at
			}
			a = append(a, fmt.Sprintf("match u32 0x%08x 0x%08x at %s", k.Val, k.Mask, at))
		}
	}
	if u.Mark != nil {
		a = append(a, fmt.Sprintf("match mark 0x%x 0x%x", u.Mark.Val, u.Mark.Mask))
	}
	if u.Link != 0 {
		a = append(a, "link "+U32Handle(u.Link))
		s := u.Sel
		if s != nil && s.Hmask != 0 {
			a = append(a, fmt.Sprintf("hashkey mask 0x%08x at %d", s.Hmask, s.Hoff))
		}
		if s != nil && s.Flags&(SelVarOffset|SelOffset|SelEat) != 0 {
			o := []string{"offset"}
			if s.Flags&SelOffset != 0 || s.Off != 0 {
				o = append(o, fmt.Sprintf("plus %d", s.Off))
			}
			if s.Flags&SelVarOffset != 0 {
				o = append(o, fmt.Sprintf("at %d mask %04x shift %d", s.Offoff, s.Offmask, s.Offshift))
			}
			if s.Flags&SelEat != 0 {
				o = append(o, "eat")
			}
			a = append(a, strings.Join(o, " "))
		}
	}
	if u.ClassID != 0 {
		a = append(a, "flowid "+u.ClassID.String())
	}
	if u.RedirectDev != "" {
		dev := u.RedirectDev
		if batch {
			dev = batchWord(dev)
		}
		a = append(a, "action mirred egress redirect dev "+dev)
	}
	return strings.Join(a, " ")
}

// Batch renders ops as a tc batch script.
func Batch(ops []Op) string {
	var b strings.Builder
	for _, op := range ops {
		if f, ok := op.Obj.(*Filter); ok && f.IsTP() && op.Verb == Add {
			continue // created by its first element
		}
		if f, ok := op.Obj.(*Filter); ok && f.Note != "" && op.Verb == Add {
			fmt.Fprintf(&b, "# %s\n", CommentSafe(f.Note))
		}
		b.WriteString(op.BatchLine())
		b.WriteByte('\n')
	}
	return b.String()
}

// Names in scripts. A device may be called almost anything: Linux
// refuses only '/', ':', whitespace and names of 16 bytes or more, so
// "$(id)", "a'b" and "x#y" are devices too. tc -batch splits a line at
// whitespace, honours one level of '...' or "..." quoting, and cuts the
// line at the first '#' wherever it stands, so a name with '#' (or with
// both kinds of quote) cannot be written in a batch line at all:
// BatchName says so, and exports refuse such a name up front.

// BatchName reports whether name can be written in a tc -batch line.
func BatchName(name string) error {
	switch {
	case strings.ContainsAny(name, "#\n\r\x00"):
		return fmt.Errorf("device name %q cannot be written in a tc -batch script: tc reads '#' as the start of a comment", name)
	case strings.ContainsRune(name, '\'') && strings.ContainsRune(name, '"'):
		return fmt.Errorf("device name %q cannot be written in a tc -batch script: tc has no way to quote both ' and \"", name)
	}
	return nil
}

func plainWord(s string) bool {
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("_.-+@=,%", c)) {
			return false
		}
	}
	return s != ""
}

// batchWord quotes s for a tc -batch line (s passed BatchName).
func batchWord(s string) string {
	switch {
	case plainWord(s):
		return s
	case !strings.ContainsRune(s, '\''):
		return "'" + s + "'"
	}
	return `"` + s + `"`
}

// ShellWord quotes s for a POSIX shell: nothing in it is expanded.
func ShellWord(s string) string {
	if plainWord(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// CommentSafe makes s safe to put after '#' on one line of a script:
// control characters (a newline would end the comment and start a
// command) are written as Go escapes.
func CommentSafe(s string) string {
	for _, c := range s {
		if c < 0x20 || c == 0x7f || c == utf8.RuneError {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}
