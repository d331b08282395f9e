package policy

import (
	"bytes"
	"encoding/csv"
	"errors"
	"io"
	"io/fs"
	"net/netip"
	"path/filepath"
	"strings"

	"sluice/safefile"
)

// hostsFile reads a per_host hosts_file: a CSV whose header is
// name,addresses,rate,ceil with an optional parent column. Addresses are
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
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
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
		line, col := 1, 1
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			line, col = pe.Line, max(pe.Column, 1)
		}
		errAt(line, col, "hosts file: %v; expected the header name,addresses,rate,ceil[,parent]", csvErr(err))
		return nil
	}
	want := []string{"name", "addresses", "rate", "ceil"}
	if len(header) < 4 || len(header) > 5 || (len(header) == 5 && strings.TrimSpace(header[4]) != "parent") {
		errAt(1, 1, "hosts file: header %q: expected name,addresses,rate,ceil and optionally parent", strings.Join(header, ","))
		return nil
	}
	for i, h := range want {
		if strings.TrimSpace(header[i]) != h {
			errAt(1, 1, "hosts file: column %d of the header is %q, expected %q (header: name,addresses,rate,ceil[,parent])", i+1, header[i], h)
			return nil
		}
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
			line, col := 1, 1
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				line, col = pe.Line, max(pe.Column, 1)
			}
			errAt(line, col, "hosts file: %v", csvErr(err))
			return out
		}
		line, _ := r.FieldPos(0)
		col := func(i int) int { _, c := r.FieldPos(i); return c }
		if len(rec) != len(header) {
			errAt(line, 1, "hosts file: %d fields, the header has %d", len(rec), len(header))
			continue
		}
		e := hostRecord(rec, file, line, col, names, addrs, rates, errAt)
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

// hostRecord parses one record of hosts file file (at line; col gives
// each field's column) into an entry, or reports why not and returns
// nil. names and addrs, where given, hold the lines of the names and
// addresses seen so far, to refuse repeats; rates caches parsed rates.
func hostRecord(rec []string, file string, line int, col func(int) int, names map[string]int, addrs map[netip.Prefix]int,
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
	if len(rec) == 5 {
		e.Parent = strings.TrimSpace(rec[4])
	}
	return e
}

func csvErr(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
