// Package migrate turns the configurations of the tools people shape
// with today (htb.init directories, wondershaper, LibreQoS, sqm-scripts,
// a live tc tree) into a sluice policy, and reports how faithfully each
// construct carried over.
//
// Every importer builds a Draft: the policy's YAML keys as plain
// strings, each class remembering the file and line it came from and
// the id the old tool gave it. Render writes the Draft as policy YAML
// with those places as comments; the Report says, construct by
// construct, whether it was mapped exactly, approximated (and how), or
// refused (and why). A refused construct fails the import: a policy
// that silently dropped a rule would shape differently from what it
// replaces.
package migrate

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// At is where a construct was read: a file and a line (0: the file as
// a whole).
type At struct {
	File string
	Line int
}

func (a At) String() string {
	if a.Line == 0 {
		return a.File
	}
	return fmt.Sprintf("%s:%d", a.File, a.Line)
}

// Draft is an imported policy before it is written.
type Draft struct {
	// Tool names the format ("htb.init", "wondershaper 1.1a (Debian)").
	Tool       string
	Interfaces []*Interface
	// Hosts are hosts files to write beside the policy, by file name.
	Hosts  map[string][]Host
	Report Report
}

// Interface is one device's directions.
type Interface struct {
	At      At
	Name    string
	Egress  *Tree
	Ingress *Tree
}

// Tree is one direction. Fields left empty are not written.
type Tree struct {
	At        At
	Comment   string
	Rate      string
	Default   string
	Leaf      string
	Linklayer string
	Overhead  int
	Police    *Police
	Classes   []*Class
}

// Class is a class of the tree.
type Class struct {
	At At
	// Origin is the old tool's id for the class ("1:10"): the comment
	// on the class, and how tests match the old tree's classes to the
	// new one's.
	Origin  string
	Comment string
	Name    string
	Rate    string
	Ceil    string
	Prio    *int
	Burst   string
	Cburst  string
	Quantum string
	// ClassID is the old tool's id kept ("1:20"; empty: sluice numbers
	// the class): settle sets it from Origin where the tree allows.
	ClassID string
	Leaf    string
	Limit   string
	Match   []*Match
	Classes []*Class
	Default string
	PerHost *PerHost

	// rateBits and ceilBits are Rate and Ceil in bits/s while an
	// importer works (fitRates scales them).
	rateBits, ceilBits float64
}

// PerHost is a per_host block over a hosts file.
type PerHost struct {
	By        string
	HostsFile string
	Rate      string
	Ceil      string
	Prio      *int
	Leaf      string
	Limit     string
}

// Host is a line of a hosts file.
type Host struct {
	Name      string
	Addresses []string
	Rate      string
	Ceil      string
	Parent    string
	// Comment goes on a line of its own above the host's.
	Comment string
	// Origin is the old tool's id for the class the host was (not
	// written: tests match the old tree's classes by it).
	Origin string
}

// Match is one entry of a class's match list. Lists hold one value or
// more; empty fields are not written.
type Match struct {
	At     At
	Src    []string
	Dst    []string
	NotSrc []string
	NotDst []string
	Sport  []string
	Dport  []string
	Proto  string
	DSCP   string
	TOS    string
	TCPAck bool
	TCPSyn bool
	Mark   string
}

// Police is a police block.
type Police struct {
	CIR string
	CBS string
	Red string
}

// Kind says how a construct carried over.
type Kind int

// Kinds of Finding.
const (
	// Exact: the policy does what the old configuration did.
	Exact Kind = iota
	// Approximated: close, and the finding says how it differs.
	Approximated
	// Refused: sluice cannot express it; the import fails.
	Refused
)

func (k Kind) String() string {
	return [...]string{"exact", "approximated", "refused"}[k]
}

// Finding is one line of the report.
type Finding struct {
	At   At
	Kind Kind
	// What is the construct in the old tool's terms; How what became of
	// it (for Refused: why it cannot be imported).
	What, How string
}

// Report lists the findings in the order they were made.
type Report struct {
	Findings []Finding
}

func (r *Report) add(at At, k Kind, what, how string, args ...any) {
	f := Finding{At: at, Kind: k, What: printable(what), How: printable(fmt.Sprintf(how, args...))}
	if k == Refused && slices.Contains(r.Findings, f) {
		return // a line read twice (a function called twice) is refused once
	}
	r.Findings = append(r.Findings, f)
}

// Exact records a construct carried over unchanged.
func (r *Report) Exact(at At, what, how string, args ...any) { r.add(at, Exact, what, how, args...) }

// Approx records a construct carried over with a difference.
func (r *Report) Approx(at At, what, how string, args ...any) {
	r.add(at, Approximated, what, how, args...)
}

// Refuse records a construct that cannot be imported.
func (r *Report) Refuse(at At, what, why string, args ...any) { r.add(at, Refused, what, why, args...) }

// Count returns how many findings are of kind k.
func (r *Report) Count(k Kind) int {
	n := 0
	for _, f := range r.Findings {
		if f.Kind == k {
			n++
		}
	}
	return n
}

// Refusals returns the refused findings as an error (nil if none), one
// FILE:LINE: line each.
func (r *Report) Refusals() error {
	var lines []string
	for _, f := range r.Findings {
		if f.Kind == Refused {
			lines = append(lines, fmt.Sprintf("%s: %s: %s", f.At, f.What, f.How))
		}
	}
	if len(lines) == 0 {
		return nil
	}
	return &RefusedError{Lines: lines}
}

// RefusedError lists what an import could not carry over.
type RefusedError struct{ Lines []string }

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%d construct(s) cannot be imported:\n  %s", len(e.Lines), strings.Join(e.Lines, "\n  "))
}

// String writes the report as text: a summary line, then each finding
// that is not exact, then the exact ones.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d exact, %d approximated, %d refused\n", r.Count(Exact), r.Count(Approximated), r.Count(Refused))
	for _, k := range []Kind{Refused, Approximated, Exact} {
		for _, f := range r.Findings {
			if f.Kind == k {
				fmt.Fprintf(&b, "%-12s %s: %s: %s\n", k, f.At, f.What, f.How)
			}
		}
	}
	return b.String()
}

// Classes returns every class of the draft with its path (DEV/DIR/NAME),
// in tree order.
func (d *Draft) Classes() map[string]*Class {
	out := map[string]*Class{}
	var walk func(prefix string, cs []*Class)
	walk = func(prefix string, cs []*Class) {
		for _, c := range cs {
			out[prefix+c.Name] = c
			walk(prefix, c.Classes)
		}
	}
	for _, ifc := range d.Interfaces {
		for dir, t := range map[string]*Tree{"egress": ifc.Egress, "ingress": ifc.Ingress} {
			if t != nil {
				walk(ifc.Name+"/"+dir+"/", t.Classes)
			}
		}
	}
	return out
}

// Origins maps each class's old id to its name, per device and
// direction: "eth0/egress" -> "1:10" -> "interactive".
func (d *Draft) Origins() map[string]map[string]string {
	out := map[string]map[string]string{}
	for path, c := range d.Classes() {
		if c.Origin == "" {
			continue
		}
		i := strings.LastIndex(path, "/")
		k := path[:i]
		if out[k] == nil {
			out[k] = map[string]string{}
		}
		out[k][c.Origin] = c.Name
	}
	// Hosts of a hosts file that were classes: sluice names them
	// CLASS/HOST.
	for path, c := range d.Classes() {
		if c.PerHost == nil {
			continue
		}
		k := path[:strings.LastIndex(path, "/")]
		for _, h := range d.Hosts[c.PerHost.HostsFile] {
			if h.Origin != "" {
				if out[k] == nil {
					out[k] = map[string]string{}
				}
				out[k][h.Origin] = c.Name + "/" + h.Name
			}
		}
	}
	return out
}

// uniqueName returns name, or name-2, name-3... if taken.
func uniqueName(name string, taken map[string]bool) string {
	n := name
	for i := 2; taken[n]; i++ {
		n = fmt.Sprintf("%s-%d", name, i)
	}
	taken[n] = true
	return n
}

// className makes a sluice class name from free text: letters, digits,
// '_', '.', '-'; other runs become '-'.
func className(s, fallback string) string {
	var b strings.Builder
	dash := false
	for _, r := range s {
		ok := r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-')
		if ok {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	n := strings.Trim(b.String(), "-.")
	if n == "" {
		return fallback
	}
	if len(n) > 48 {
		n = n[:48]
	}
	return n
}

func intp(v int) *int { return &v }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// printable quotes what a terminal would act on in text taken from the
// source (an OSC title, a clear-screen, a carriage return, bytes that
// are not UTF-8) as Go escapes: a report shows the file, it never
// drives the terminal that reads it.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == utf8.RuneError {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
