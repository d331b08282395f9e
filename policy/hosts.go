package policy

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"sluice/safefile"
)

// hostsFile reads a per_host hosts_file: a CSV whose header is
// name,addresses,rate,ceil with optional parent and prio columns. Addresses are
// separated by spaces: IPv4 and IPv6 addresses and CIDRs. Problems are
// reported at the CSV's own line and column.
func (p *parser) hostsFile(ph *PerHost, what string) []*HostEntry {
	file := ph.HostsFile
	if !filepath.IsAbs(file) {
		file = filepath.Join(p.dir, file)
	}
	data, err := safefile.ReadRegular(file, "hosts file", MaxHostsFileBytes)
	if ph.Pods != "" && errors.Is(err, fs.ErrNotExist) {
		// Not written yet: no pods (the agent writes it before it
		// applies, and watches it from then on).
		p.sources[file] = []byte{}
		return nil
	}
	if err != nil {
		p.d.Errorf(ph.HostsFilePos, "%s.hosts_file: %v", what, err)
		return nil
	}
	p.sources[file] = data
	return p.hostsCSV(file, data, ph.Pods != "")
}

// hostsCSV parses the content of hosts file file; mayBeEmpty lets it
// list no host (a pods class on a node without such pods).
func (p *parser) hostsCSV(file string, data []byte, mayBeEmpty bool) []*HostEntry {
	// Spreadsheets save CSV with a byte order mark; it is not part of
	// the header.
	data = bytes.TrimPrefix(data, []byte(bom))
	r := csv.NewReader(bytes.NewReader(data))
	r.ReuseRecord = true
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true
	r.Comment = '#'
	errAt := func(line, col int, format string, args ...any) {
		p.d.ErrorIn(file, Pos{line, col}, format, args...)
	}
	header, err := r.Read()
	if err != nil {
		line, col := csvPos(err)
		errAt(line, col, "hosts file: %v; expected the header %s", csvErr(err), hostsHeaderText)
		return nil
	}
	cols, herr := hostsHeader(header)
	if herr != "" {
		errAt(1, 1, "hosts file: %s", herr)
		return nil
	}
	// Sized for one host per line; a rate's text is parsed once per
	// file (10,000 hosts tend to share a few plans).
	lines := bytes.Count(data, []byte{'\n'}) + 1
	out := make([]*HostEntry, 0, lines)
	names := make(map[string]int, lines)
	addrs := make(map[netip.Prefix]int, lines)
	rates := map[string]*Rate{}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			line, col := csvPos(err)
			errAt(line, col, "hosts file: %v", csvErr(err))
			return out
		}
		line, _ := r.FieldPos(0)
		col := func(i int) int { _, c := r.FieldPos(i); return c }
		if len(rec) != len(header) {
			errAt(line, 1, "hosts file: %d fields, the header has %d", len(rec), len(header))
			continue
		}
		e := hostRecord(rec, cols, file, line, col, names, addrs, rates, errAt)
		if e == nil {
			continue
		}
		out = append(out, e)
	}
	if len(out) == 0 && len(p.d.Errs) == 0 && !mayBeEmpty {
		errAt(1, 1, "hosts file: lists no hosts")
	}
	return out
}

// bom is the UTF-8 byte order mark.
const bom = "\xef\xbb\xbf"

// hostsHeaderText is the header a hosts file may have.
const hostsHeaderText = "name,addresses,rate,ceil[,parent][,prio]"

// hostsColumns says where a hosts file's optional columns are (-1:
// absent).
type hostsColumns struct{ parent, prio int }

// hostsHeader reads a hosts file's header: the four columns every file
// has, then parent and prio, each at most once, in either order. It
// returns why not where it is not such a header.
func hostsHeader(header []string) (hostsColumns, string) {
	cols := hostsColumns{parent: -1, prio: -1}
	want := []string{"name", "addresses", "rate", "ceil"}
	if len(header) < len(want) {
		return cols, fmt.Sprintf("header %q: expected %s", strings.Join(header, ","), hostsHeaderText)
	}
	for i, h := range want {
		if strings.TrimSpace(header[i]) != h {
			return cols, fmt.Sprintf("column %d of the header is %q, expected %q (header: %s)", i+1, header[i], h, hostsHeaderText)
		}
	}
	for i := len(want); i < len(header); i++ {
		var at *int
		switch strings.TrimSpace(header[i]) {
		case "parent":
			at = &cols.parent
		case "prio":
			at = &cols.prio
		default:
			return cols, fmt.Sprintf("column %d of the header is %q: the optional columns are parent and prio (header: %s)", i+1, header[i], hostsHeaderText)
		}
		if *at >= 0 {
			return cols, fmt.Sprintf("column %d of the header repeats %q", i+1, header[i])
		}
		*at = i
	}
	return cols, ""
}

// hostRecord parses one record of hosts file file (at line; col gives
// each field's column; cols where the optional ones are) into an entry,
// or reports why not and returns nil. names and addrs, where given, hold the lines of the names and
// addresses seen so far, to refuse repeats; rates caches parsed rates.
func hostRecord(rec []string, cols hostsColumns, file string, line int, col func(int) int, names map[string]int, addrs map[netip.Prefix]int,
	rates map[string]*Rate, errAt func(line, col int, format string, args ...any)) *HostEntry {
	e := &HostEntry{Name: strings.TrimSpace(rec[0]), File: file, Line: line}
	switch {
	case e.Name == "":
		errAt(line, col(0), "hosts file: a host needs a name")
		return nil
	case !validName(e.Name):
		errAt(line, col(0), "hosts file: host name %q: use letters, digits, '_', '.', '-' (up to 64)", e.Name)
		return nil
	}
	if names != nil {
		if prev, dup := names[e.Name]; dup {
			errAt(line, col(0), "hosts file: host %q appears twice (first on line %d)", e.Name, prev)
			return nil
		}
		names[e.Name] = line
	}
	for _, a := range strings.Fields(rec[1]) {
		pf, err := parsePrefix(a)
		if err != nil {
			errAt(line, col(1), "hosts file: host %s: %v", e.Name, err)
			continue
		}
		if addrs != nil {
			if prev, dup := addrs[pf]; dup {
				errAt(line, col(1), "hosts file: host %s: %s is already listed on line %d", e.Name, pf, prev)
				continue
			}
			addrs[pf] = line
		}
		e.Addrs = append(e.Addrs, pf)
	}
	if len(e.Addrs) == 0 {
		errAt(line, col(1), "hosts file: host %s has no addresses", e.Name)
		return nil
	}
	// An empty rate or ceil takes the per_host default.
	rate := func(i int, what string) (*Rate, bool) {
		s := strings.TrimSpace(rec[i])
		if s == "" {
			return nil, true
		}
		if rt, ok := rates[s]; ok {
			return rt, true
		}
		rt, _, err := ParseRate(s)
		if err != nil {
			errAt(line, col(i), "hosts file: host %s: %s: %v", e.Name, what, err)
			return nil, false
		}
		rates[s] = &rt
		return &rt, true
	}
	var ok bool
	if e.Rate, ok = rate(2, "rate"); !ok {
		return nil
	}
	if e.Ceil, ok = rate(3, "ceil"); !ok {
		return nil
	}
	if cols.parent >= 0 {
		e.Parent = strings.TrimSpace(rec[cols.parent])
	}
	if i := cols.prio; i >= 0 {
		if s := strings.TrimSpace(rec[i]); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n > MaxPrio {
				errAt(line, col(i), "hosts file: host %s: prio %q: a number from 0 (served first) to %d", e.Name, s, MaxPrio)
				return nil
			}
			e.Prio = &n
		}
	}
	return e
}

// csvPos is where a CSV reader's error is (1:1 when it does not say).
func csvPos(err error) (line, col int) {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return pe.Line, max(pe.Column, 1)
	}
	return 1, 1
}

func csvErr(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
