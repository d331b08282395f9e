package policy

import (
	"bytes"
	"encoding/csv"
	"errors"
	"io"
	"io/fs"
	"path/filepath"
	"strings"

	"sluice/safefile"
	"sluice/units"
)

// groupsHeaderText is the header a groups file has.
const groupsHeaderText = "name,rate,ceil"

// groupsFile reads a per_host groups_file: a CSV of name,rate,ceil,
// each line a class below the per_host class (see PerHost.GroupsFile).
// A pods class's file may be missing: the agent has not written it, or
// no namespace has an aggregate.
func (p *parser) groupsFile(ph *PerHost, what string) []*Class {
	file := ph.GroupsFile
	if !filepath.IsAbs(file) {
		file = filepath.Join(p.dir, file)
	}
	data, err := safefile.ReadRegular(file, "groups file", MaxHostsFileBytes)
	if ph.Pods != "" && errors.Is(err, fs.ErrNotExist) {
		p.sources[file] = []byte{}
		return nil
	}
	if err != nil {
		p.d.Errorf(ph.GroupsFilePos, "%s.groups_file: %v", what, err)
		return nil
	}
	p.sources[file] = data
	return p.groupsCSV(file, data, ph.GroupsFilePos)
}

// groupsCSV parses the content of groups file file; at is where the
// policy names it (the groups' classes report plan errors there).
func (p *parser) groupsCSV(file string, data []byte, at Pos) []*Class {
	r := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(data, []byte(bom))))
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true
	r.Comment = '#'
	errAt := func(line, col int, format string, args ...any) {
		p.d.ErrorIn(file, Pos{line, col}, format, args...)
	}
	readErr := func(err error, format string, args ...any) {
		line, col := csvPos(err)
		errAt(line, col, format, args...)
	}
	header, err := r.Read()
	if errors.Is(err, io.EOF) {
		return nil // an empty file: no groups
	}
	if err != nil {
		readErr(err, "groups file: %v; expected the header %s", csvErr(err), groupsHeaderText)
		return nil
	}
	want := strings.Split(groupsHeaderText, ",")
	if len(header) != len(want) || strings.TrimSpace(header[0]) != want[0] || strings.TrimSpace(header[1]) != want[1] || strings.TrimSpace(header[2]) != want[2] {
		errAt(1, 1, "groups file: header %q: expected %s", strings.Join(header, ","), groupsHeaderText)
		return nil
	}
	var out []*Class
	names := map[string]int{}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr(err, "groups file: %v", csvErr(err))
			return out
		}
		line, _ := r.FieldPos(0)
		col := func(i int) int { _, c := r.FieldPos(i); return c }
		if len(rec) != len(want) {
			errAt(line, 1, "groups file: %d fields, the header has %d", len(rec), len(want))
			continue
		}
		g := &Class{Group: strings.TrimSpace(rec[0]), GroupFile: file, GroupLine: line, Pos: at, NamePos: at}
		switch prev, dup := names[g.Group]; {
		case g.Group == "":
			errAt(line, col(0), "groups file: a group needs a name")
			continue
		case !validName(g.Group):
			errAt(line, col(0), "groups file: group name %q: use letters, digits, '_', '.', '-' (up to 64)", g.Group)
			continue
		case dup:
			errAt(line, col(0), "groups file: group %q appears twice (first on line %d)", g.Group, prev)
			continue
		}
		names[g.Group] = line
		// An empty rate or ceil takes the per_host class's defaults.
		ok := true
		for i, dst := range []**Rate{&g.Rate, &g.Ceil} {
			s := strings.TrimSpace(rec[i+1])
			if s == "" {
				continue
			}
			rt, _, err := ParseRate(s)
			if err != nil {
				errAt(line, col(i+1), "groups file: group %s: %s: %v", g.Group, want[i+1], err)
				ok = false
				continue
			}
			rt.Pos = at
			*dst = &rt
		}
		if ok {
			out = append(out, g)
		}
	}
	return out
}

// groupRates resolves the rate and ceil of per_host class c's groups:
// an empty rate is a host's default, an empty ceil the class's own;
// percentages are of the class's. A pods class's groups come from
// namespaces' annotations: a guarantee above the cap is held at the cap
// there, as a pod's is, so that one namespace cannot refuse the node's
// policy. Like hosts, groups may add up to more than the class's rate.
func groupRates(what string, c *Class, ph *PerHost, d *Diag) {
	for _, g := range ph.Groups {
		g.Parent = c
		g.RateBps, g.CeilBps = ph.RateBps, c.CeilBps
		if g.Rate != nil {
			if g.RateBps = g.Rate.Resolve(c.RateBps); g.RateBps == 0 && ph.Pods == "" {
				d.ErrorIn(g.GroupFile, Pos{g.GroupLine, 1}, "groups file: group %s: rate %s comes to less than 1 byte/s", g.Group, g.Rate.Text)
			}
		}
		if g.Ceil != nil {
			g.CeilBps = g.Ceil.Resolve(c.CeilBps)
		}
		g.RateBps = max(g.RateBps, 1)
		if ph.Pods != "" {
			g.RateBps = min(g.RateBps, g.CeilBps)
		}
		if g.CeilBps < g.RateBps {
			d.ErrorIn(g.GroupFile, Pos{g.GroupLine, 1}, "groups file: group %s: ceil %s is below rate %s", g.Group, g.CeilBps.String(), g.RateBps.String())
		}
		if g.CeilBps > c.CeilBps {
			d.WarnIn(g.GroupFile, Pos{g.GroupLine, 1}, "groups file: group %s: ceil %s is above class %s's %s and cannot be reached", g.Group, g.CeilBps.String(), c.Name, c.CeilBps.String())
		}
		fitGroup(g, ph.Pods != "")
	}
}

// fitGroup sets the rates of group g's hosts from the group's: a host
// without a rate of its own gets an even part of it (at most its ceil),
// and where their rates add up to more, each is cut in proportion. HTB lets a class
// within its rate send whatever its parent's state, so hosts whose
// rates added up to more than the group's would send past its ceil
// (measured: a pod at its 40mbit default share under a namespace capped
// at 6mbit carried 38). A pods class's hosts always divide the group's
// rate in proportion to theirs (their weights' parts, or even), and
// only then is each held at its cap: held first, a capped pod's weight
// would be its cap (web, weight 3 and capped at 10M, beside db, weight
// 1 and uncapped, got a third of their namespace, not three quarters).
func fitGroup(g *Class, pods bool) {
	if len(g.Hosts) == 0 {
		return
	}
	even := max(g.RateBps/units.Rate(len(g.Hosts)), 1)
	var sum units.Rate
	for _, e := range g.Hosts {
		switch {
		case e.Rate == nil && pods:
			e.RateBps = even
		case e.Rate == nil:
			e.RateBps = max(min(even, e.CeilBps), 1)
		case pods && e.Owner != nil:
			// Its part before its cap held it (validate).
			e.RateBps = max(e.Rate.Resolve(e.Owner.RateBps), 1)
		}
		sum += e.RateBps
	}
	if sum > g.RateBps || pods && sum != g.RateBps {
		for _, e := range g.Hosts {
			e.RateBps = max(units.Rate(float64(e.RateBps)*float64(g.RateBps)/float64(sum)), 1)
		}
	}
	if pods {
		for _, e := range g.Hosts {
			e.RateBps = max(min(e.RateBps, e.CeilBps), 1)
		}
	}
}

// groupsOf names per_host class c's groups (CLASS:GROUP: a name no
// class of the policy has, nor a host, whose names have a "/") and
// indexes them by their name in the groups file, which the parent
// column uses.
func groupsOf(c *Class, d *Diag) map[string]*Class {
	ph := c.PerHost
	if len(ph.Groups) == 0 {
		return nil
	}
	byName := make(map[string]*Class, len(ph.Groups))
	for _, g := range ph.Groups {
		g.Name = c.Name + ":" + g.Group
		byName[g.Group] = g
	}
	for _, e := range ph.Entries {
		if g := byName[e.Name]; g != nil {
			d.ErrorIn(g.GroupFile, Pos{g.GroupLine, 1}, "groups file: group %s has the name of host %s (%s:%d): both would be class %s", g.Group, e.Name, e.File, e.Line, g.Name)
		}
	}
	return byName
}
