package migrate

import (
	"bytes"
	"encoding/csv"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"sluice/safefile"
)

// lqManualNetwork is LibreQoS's other way to write the node tree:
// manualNetwork.csv, a row per site (its name, download and upload
// Mbit/s, and its parent's name, empty at the top), which LibreQoS's
// csvToNetworkJSON.py turns into network.json. Where the directory has
// network.json (or its example), that is what LibreQoS shapes by and
// the CSV is only said to be left; where it has neither, the CSV is read
// as the script would read it. nil, false: no such file.
func lqManualNetwork(r *Report, dir string, haveJSON bool) ([]*lqNode, bool, error) {
	file := filepath.Join(dir, "manualNetwork.csv")
	if _, err := os.Lstat(file); err != nil {
		return nil, false, nil
	}
	if haveJSON {
		r.Exact(At{File: file}, "manualNetwork.csv", "not read: LibreQoS shapes by network.json (csvToNetworkJSON.py writes it from this file); run that first where this file is newer")
		return nil, false, nil
	}
	b, err := safefile.ReadRegular(file, "manualNetwork.csv", maxSourceBytes)
	if err != nil {
		return nil, false, err
	}
	return readManualNetwork(r, file, b), true, nil
}

// readManualNetwork reads manualNetwork.csv into network.json's tree:
// parents may come after their children; a name twice, a parent no row
// names and a cycle are refused at their lines.
func readManualNetwork(r *Report, file string, b []byte) []*lqNode {
	cr := csv.NewReader(bytes.NewReader(b))
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err != nil {
		r.Refuse(At{File: file, Line: 1}, "manualNetwork.csv", "no header: %v", err)
		return nil
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))] = i
	}
	need := []string{"site name", "download mbps", "upload mbps", "parent site name"}
	for _, k := range need {
		if _, ok := col[k]; !ok {
			r.Refuse(At{File: file, Line: 1}, "manualNetwork.csv", "the header has no %q column (want Site Name, Download Mbps, Upload Mbps, Parent Site Name)", k)
			return nil
		}
	}
	var all []*lqNode
	parentOf := map[*lqNode]string{}
	byName := map[string]*lqNode{}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line, _ := cr.FieldPos(0)
		at := At{File: file, Line: line}
		if err != nil {
			r.Refuse(at, "manualNetwork.csv", "%v", err)
			return nil
		}
		field := func(k string) string {
			if i := col[k]; i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		name := field("site name")
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		n := &lqNode{at: at, name: name}
		if prev, dup := byName[name]; dup {
			r.Refuse(at, "site "+name, "named twice (first at line %d)", prev.at.Line)
			continue
		}
		for i, k := range []string{"download mbps", "upload mbps"} {
			v, err := strconv.ParseFloat(field(k), 64)
			if err != nil || v <= 0 || v > 1e7 {
				r.Refuse(at, "site "+name, "%s %q: want a number of Mbit/s above 0", header[col[k]], field(k))
				continue
			}
			n.bw[[]int{lqDown, lqUp}[i]] = v
		}
		byName[name] = n
		parentOf[n] = field("parent site name")
		all = append(all, n)
	}
	var top []*lqNode
	for _, n := range all {
		p := parentOf[n]
		if p == "" {
			top = append(top, n)
			continue
		}
		pn, ok := byName[p]
		if !ok {
			r.Refuse(n.at, "site "+n.name, "parent site %q: no row names it", p)
			continue
		}
		// A cycle comes back to n before it reaches a top site.
		for q, steps := p, 0; q != "" && byName[q] != nil; q, steps = parentOf[byName[q]], steps+1 {
			if byName[q] == n || steps > len(all) {
				r.Refuse(n.at, "site "+n.name, "its parents form a cycle (through %q)", p)
				return nil
			}
		}
		pn.children = append(pn.children, n)
	}
	if len(all) > 0 {
		r.Exact(At{File: file}, "manualNetwork.csv", "%d site(s) read as csvToNetworkJSON.py would write them into network.json", len(all))
	}
	return top
}
