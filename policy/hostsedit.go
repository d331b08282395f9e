package policy

import (
	"bytes"
	"encoding/csv"
	"slices"
	"sort"

	"sluice/units"
)

// MaxHostEdits is the most changed lines EditHosts works out; a larger
// edit is loaded in full (planning it all costs no more).
const MaxHostEdits = 1000

// HostEdit is a new rate and ceil for a host of a hosts_file (see
// EditHosts).
type HostEdit struct {
	Entry            *HostEntry
	Rate, Ceil       *Rate
	RateBps, CeilBps units.Rate
}

// Apply puts the edit into the policy.
func (e HostEdit) Apply() {
	e.Entry.Rate, e.Entry.Ceil, e.Entry.RateBps, e.Entry.CeilBps = e.Rate, e.Ceil, e.RateBps, e.CeilBps
}

// EditHosts works out what an edit of hosts file file (old: the content
// p was loaded from; data: the new one) changes, when all it changes is
// the rate or ceil of hosts it lists: one edit per host and per class
// listing the file, as Load would resolve it. It is what lets a daemon
// take a subscriber's new plan in microseconds where loading 100,000
// hosts again takes tens of milliseconds.
//
// ok is false for anything else (lines added, removed or moved; a name,
// address, parent or prio column changed; a comment, blank line or quote in
// the edit; more than MaxHostEdits lines), which needs a full Load. A
// changed line that Load would refuse is an error, reported as Load
// reports it. p is not changed: Apply each edit.
func (p *Policy) EditHosts(file string, old, data []byte) (edits []HostEdit, ok bool, err error) {
	owners := p.hostsFileOwners(file)
	if len(owners) == 0 || bytes.IndexByte(data, '"') >= 0 || bytes.IndexByte(old, '"') >= 0 {
		return nil, false, nil // quotes may make a record of several lines
	}
	oldLines, newLines, first := changedLines(old, data)
	if oldLines == nil && newLines == nil {
		return nil, true, nil
	}
	if len(oldLines) != len(newLines) || first < 2 {
		return nil, false, nil
	}
	hr := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(firstLine(data), []byte(bom))))
	hr.TrimLeadingSpace = true
	hrec, herr := hr.Read()
	if herr != nil {
		return nil, false, nil
	}
	cols, bad := hostsHeader(hrec)
	if bad != "" {
		return nil, false, nil // Load says what is wrong
	}
	header := len(hrec)
	d := &Diag{File: file}
	errAt := func(line, col int, format string, args ...any) { d.ErrorIn(file, Pos{line, col}, format, args...) }
	rates := map[string]*Rate{}
	changed := 0
	for i, text := range newLines {
		if bytes.Equal(text, oldLines[i]) {
			continue // between two changed lines
		}
		if changed++; changed > MaxHostEdits {
			return nil, false, nil
		}
		line := first + i
		r := csv.NewReader(bytes.NewReader(text))
		r.FieldsPerRecord, r.TrimLeadingSpace, r.Comment = -1, true, '#'
		rec, rerr := r.Read()
		if rerr != nil {
			return nil, false, nil // a blank or comment line: Load decides
		}
		if len(rec) != header {
			errAt(line, 1, "hosts file: %d fields, the header has %d", len(rec), header)
			continue
		}
		col := func(i int) int { _, c := r.FieldPos(i); return c }
		e := hostRecord(rec, cols, file, line, col, nil, nil, rates, errAt)
		if e == nil {
			continue
		}
		for _, ph := range owners {
			// A percentage follows the class's (scaled) rate; an
			// absolute rate is scaled as validation scaled it.
			abs := func(r *Rate, parent units.Rate) units.Rate {
				if r.Percent > 0 {
					return r.Resolve(parent)
				}
				return ph.scaled(r.Bps)
			}
			was := ph.entryAt(line)
			if was == nil || was.Name != e.Name || was.Parent != e.Parent || !slices.Equal(was.Addrs, e.Addrs) || !same(was.Prio, e.Prio) {
				return nil, false, nil
			}
			if was.ParentCls != was.Owner {
				return nil, false, nil // a host hung below another class
			}
			ed := HostEdit{Entry: was, Rate: e.Rate, Ceil: e.Ceil, RateBps: ph.RateBps, CeilBps: ph.CeilBps}
			c := was.Owner
			if e.Rate != nil {
				if ed.RateBps = abs(e.Rate, c.RateBps); ed.RateBps == 0 && ph.Pods == "" {
					errAt(line, 1, "hosts file: host %s: rate %s comes to less than 1 byte/s", e.Name, e.Rate.Text)
					continue
				}
			}
			if e.Ceil != nil {
				ed.CeilBps = abs(e.Ceil, c.CeilBps)
			}
			ed.RateBps = max(ed.RateBps, 1)
			if ph.Pods != "" {
				ed.RateBps = min(ed.RateBps, ed.CeilBps) // as hostRates holds it
			}
			if ed.CeilBps < ed.RateBps {
				errAt(line, 1, "hosts file: host %s: ceil %s is below rate %s", e.Name, ed.CeilBps.String(), ed.RateBps.String())
				continue
			}
			if ed.RateBps != was.RateBps || ed.CeilBps != was.CeilBps || !same(ed.Rate, was.Rate) || !same(ed.Ceil, was.Ceil) {
				edits = append(edits, ed)
			}
		}
	}
	if err := d.Err(); err != nil {
		return nil, false, err
	}
	return edits, true, nil
}

// same reports whether two optional values are equal (both unset, or
// set to the same).
func same[T comparable](a, b *T) bool { return a == b || a != nil && b != nil && *a == *b }

// hostsFileOwners lists the per_host classes whose hosts come from
// file (a path as Files gives it).
func (p *Policy) hostsFileOwners(file string) []*PerHost {
	var out []*PerHost
	p.eachClass(func(c *Class) {
		if ph := c.PerHost; ph != nil && len(ph.Entries) > 0 && ph.Entries[0].File == file {
			out = append(out, ph)
		}
	})
	return out
}

// entryAt finds the entry read from line (entries are in file order).
func (ph *PerHost) entryAt(line int) *HostEntry {
	i := sort.Search(len(ph.Entries), func(i int) bool { return ph.Entries[i].Line >= line })
	if i < len(ph.Entries) && ph.Entries[i].Line == line {
		return ph.Entries[i]
	}
	return nil
}

// changedLines finds the whole lines that differ between a and b, after
// their common first and last lines: the lines of each (without their
// line ends) and the number of the first. Both nil: nothing differs.
func changedLines(a, b []byte) (al, bl [][]byte, first int) {
	n := min(len(a), len(b))
	pre := 0
	for pre < n && a[pre] == b[pre] {
		pre++
	}
	if pre == len(a) && pre == len(b) {
		return nil, nil, 0
	}
	pre = bytes.LastIndexByte(a[:pre], '\n') + 1 // back to a line's start
	suf := 0
	for suf < n-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	// Forward to a line's start: the common tail begins after a line end.
	ae, be := len(a)-suf, len(b)-suf
	if ae > pre && a[ae-1] != '\n' || be > pre && b[be-1] != '\n' {
		k := bytes.IndexByte(a[ae:], '\n')
		if k < 0 {
			ae, be = len(a), len(b)
		} else {
			ae, be = ae+k+1, be+k+1
		}
	}
	split := func(s []byte) [][]byte {
		s = bytes.TrimSuffix(s, []byte{'\n'})
		if len(s) == 0 {
			return [][]byte{}
		}
		lines := bytes.Split(s, []byte{'\n'})
		for i, l := range lines {
			lines[i] = bytes.TrimSuffix(l, []byte{'\r'})
		}
		return lines
	}
	return split(a[pre:ae]), split(b[pre:be]), 1 + bytes.Count(a[:pre], []byte{'\n'})
}

func firstLine(b []byte) []byte {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i]
	}
	return b
}
