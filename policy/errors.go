package policy

import (
	"fmt"
	"sort"
	"strings"
)

// Pos is a position in the policy file (1-based; 0 means unknown).
type Pos struct{ Line, Col int }

// Error is one problem in a policy, located in its file.
type Error struct {
	File    string
	Pos     Pos
	Msg     string
	Warning bool
}

func (e *Error) Error() string {
	kind := ""
	if e.Warning {
		kind = "warning: "
	}
	if e.Pos.Line == 0 {
		return fmt.Sprintf("%s: %s%s", e.File, kind, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s%s", e.File, e.Pos.Line, e.Pos.Col, kind, e.Msg)
}

// Errors is every problem found, in file order.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

func (es Errors) sort() {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i].Pos, es[j].Pos
		return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
	})
}

// Diag collects errors and warnings while a policy is read.
type Diag struct {
	File     string
	Errs     Errors
	Warnings Errors
	seen     map[Error]bool
}

// Errorf records an error at pos.
// The same message at the same place is recorded once.
func (d *Diag) Errorf(pos Pos, format string, args ...any) {
	e := &Error{File: d.File, Pos: pos, Msg: fmt.Sprintf(format, args...)}
	if d.seen == nil {
		d.seen = map[Error]bool{}
	}
	if d.seen[*e] {
		return
	}
	d.seen[*e] = true
	d.Errs = append(d.Errs, e)
}

// Warnf records a warning at pos.
func (d *Diag) Warnf(pos Pos, format string, args ...any) {
	d.Warnings = append(d.Warnings, &Error{File: d.File, Pos: pos, Msg: fmt.Sprintf(format, args...), Warning: true})
}

// Err returns the errors as one error, or nil.
func (d *Diag) Err() error {
	if len(d.Errs) == 0 {
		return nil
	}
	d.Errs.sort()
	return d.Errs
}

// ErrorIn records an error located in another file than the policy (a
// hosts_file).
func (d *Diag) ErrorIn(file string, pos Pos, format string, args ...any) {
	d.Errs = append(d.Errs, &Error{File: file, Pos: pos, Msg: fmt.Sprintf(format, args...)})
}

// WarnIn records a warning located in another file than the policy (a
// groups_file).
func (d *Diag) WarnIn(file string, pos Pos, format string, args ...any) {
	d.Warnings = append(d.Warnings, &Error{File: file, Pos: pos, Msg: fmt.Sprintf(format, args...), Warning: true})
}
