package migrate

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"sluice/safefile"
)

// LibreQoS keeps its shaping in a directory: ShapedDevices.csv (one row
// per device; rows sharing a Circuit ID form one circuit with one min
// and max rate per direction, in Mbit/s), network.json (a tree of sites
// and access points, each with a download and upload maximum; {} or no
// file for a flat network), and its settings: /etc/lqos.conf (TOML,
// v1.4 on) or ispConfig.py (before). Download leaves through the
// interface toward the subscribers (lqos.conf's to_network, the old
// interfaceA), upload through the other.
//
// What LibreQoS builds from them, per direction: an HTB per CPU queue
// whose root class holds the upstream capacity, a default class of a
// quarter of it (prio 5) for unmapped traffic, a class per node (ceil:
// its maximum, capped by its parent's; rate: 95% of the ceil), and a
// class per circuit below its parent node (rate min, ceil max capped by
// the node's; prio 3) with the SQM qdisc (cake or fq_codel) as its
// leaf. An XDP/BPF program maps each device address to its circuit.

const (
	libreqosHostsDown = "libreqos-download.csv"
	libreqosHostsUp   = "libreqos-upload.csv"
	// maxShapedDevicesBytes bounds ShapedDevices.csv: big ISPs list
	// tens of thousands of devices.
	maxShapedDevicesBytes = 64 << 20
)

// lqosConfig is what the import needs of LibreQoS's settings.
type lqosConfig struct {
	at                At
	toNetwork         string  // download egresses here
	toInternet        string  // upload egresses here
	down, up          float64 // upstream capacity, Mbit/s
	genDown, genUp    float64 // each generated parent node's, Mbit/s
	sqm               string  // the default leaf ("cake diffserv4")
	onAStick          bool
	monitorOnly       bool
	onAStickInterface string
}

// LibreQoS imports a LibreQoS directory (ShapedDevices.csv and
// network.json); config names lqos.conf or ispConfig.py ("": the one in
// dir, else /etc/lqos.conf).
func LibreQoS(dir, config string) (*Draft, error) {
	cfg, err := readLqosConfig(dir, config)
	if err != nil {
		return nil, err
	}
	d := &Draft{Tool: "LibreQoS", Hosts: map[string][]Host{}}
	r := &d.Report
	cfg.check(r)
	devFile := lqFile(r, dir, "ShapedDevices.csv", "ShapedDevices.example.csv")
	b, err := safefile.ReadRegular(devFile, "ShapedDevices.csv", maxShapedDevicesBytes)
	if err != nil {
		return nil, err
	}
	circuits := readShapedDevices(r, devFile, b)
	netFile := lqFile(r, dir, "network.json", "network.example.json")
	var nodes []*lqNode
	nb, err := safefile.ReadRegular(netFile, "network.json", maxSourceBytes)
	manual, fromCSV, merr := lqManualNetwork(r, dir, err == nil)
	switch {
	case merr != nil:
		return nil, merr
	case err == nil:
		nodes = readNetworkJSON(r, netFile, nb)
	case fromCSV:
		nodes = manual
	case errors.Is(err, os.ErrNotExist):
		r.Exact(At{File: netFile}, "network.json", "none: a flat network, every circuit directly below the link")
	default:
		return nil, err
	}
	if r.Refusals() != nil {
		return d, nil
	}
	lq := &lqImport{r: r, cfg: cfg, circuits: circuits, nodes: nodes, byName: map[string]*lqNode{}}
	lq.index(nodes, nil)
	lq.attach()
	if r.Refusals() != nil {
		return d, nil
	}
	for _, dir := range []lqDir{
		{i: lqDown, name: "download", comment: "download: toward the subscribers", dev: cfg.toNetwork, cap: cfg.down, gen: cfg.genDown, by: "dst", hosts: libreqosHostsDown},
		{i: lqUp, name: "upload", comment: "upload: toward the Internet", dev: cfg.toInternet, cap: cfg.up, gen: cfg.genUp, by: "src", hosts: libreqosHostsUp},
	} {
		t, hosts := lq.tree(dir)
		d.Interfaces = append(d.Interfaces, &Interface{At: cfg.at, Name: dir.dev, Egress: t})
		if len(hosts) > 0 {
			d.Hosts[dir.hosts] = hosts
		}
	}
	return d.settle(At{File: dir}), nil
}

// lqFile is dir's file name, or its example as LibreQoS ships it in
// src/ where the directory holds that and not the file (said in the
// report: the import is of the example).
func lqFile(r *Report, dir, name, example string) string {
	f := filepath.Join(dir, name)
	if _, err := os.Lstat(f); err == nil {
		return f
	}
	ex := filepath.Join(dir, example)
	if _, err := os.Lstat(ex); err == nil {
		r.Exact(At{File: ex}, name, "no %s in %s: read LibreQoS's example %s in its place", name, dir, example)
		return ex
	}
	return f
}

func readLqosConfig(dir, config string) (*lqosConfig, error) {
	if config == "" {
		// The examples LibreQoS ships in src/ come last: a copy of
		// that directory imports as the tool's own example.
		for _, f := range []string{filepath.Join(dir, "lqos.conf"), filepath.Join(dir, "ispConfig.py"), "/etc/lqos.conf",
			filepath.Join(dir, "lqos.example"), filepath.Join(dir, "ispConfig.example.py")} {
			if _, err := os.Lstat(f); err == nil {
				config = f
				break
			}
		}
		if config == "" {
			return nil, fmt.Errorf("import libreqos: no lqos.conf or ispConfig.py in %s and no /etc/lqos.conf: give the settings with --config FILE (they name the interfaces and the upstream capacity)", dir)
		}
	}
	b, err := safefile.ReadRegular(config, "LibreQoS settings", maxSourceBytes)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(config, ".py") {
		return readIspConfig(config, b)
	}
	return readLqosConf(config, b)
}

// readLqosConf reads lqos.conf (TOML).
func readLqosConf(file string, b []byte) (*lqosConfig, error) {
	var c struct {
		Bridge *struct {
			ToInternet string `toml:"to_internet"`
			ToNetwork  string `toml:"to_network"`
		} `toml:"bridge"`
		SingleInterface *struct {
			Interface string `toml:"interface"`
		} `toml:"single_interface"`
		Queues struct {
			DefaultSQM  string  `toml:"default_sqm"`
			MonitorOnly bool    `toml:"monitor_only"`
			Up          float64 `toml:"uplink_bandwidth_mbps"`
			Down        float64 `toml:"downlink_bandwidth_mbps"`
			GenDown     float64 `toml:"generated_pn_download_mbps"`
			GenUp       float64 `toml:"generated_pn_upload_mbps"`
		} `toml:"queues"`
	}
	if _, err := toml.Decode(string(b), &c); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	cfg := &lqosConfig{at: At{File: file}, down: c.Queues.Down, up: c.Queues.Up, genDown: c.Queues.GenDown,
		genUp: c.Queues.GenUp, sqm: c.Queues.DefaultSQM, monitorOnly: c.Queues.MonitorOnly}
	if c.Bridge != nil {
		cfg.toNetwork, cfg.toInternet = c.Bridge.ToNetwork, c.Bridge.ToInternet
	}
	if c.SingleInterface != nil && c.SingleInterface.Interface != "" {
		cfg.onAStick, cfg.onAStickInterface = true, c.SingleInterface.Interface
	}
	return cfg, nil
}

var pyAssign = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*(?:#.*)?$`)

// readIspConfig reads the plain assignments of ispConfig.py (LibreQoS
// before v1.4): interfaceA faces the subscribers (download), interfaceB
// the Internet.
func readIspConfig(file string, b []byte) (*lqosConfig, error) {
	cfg := &lqosConfig{at: At{File: file}}
	for i, line := range strings.Split(string(b), "\n") {
		m := pyAssign.FindStringSubmatch(strings.TrimRight(line, "\r"))
		if m == nil {
			continue
		}
		at := At{file, i + 1}
		v := strings.Trim(m[2], `'"`)
		num := func() (float64, error) {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s = %s: not a number", at, m[1], m[2])
			}
			return f, nil
		}
		var err error
		switch m[1] {
		case "interfaceA":
			cfg.toNetwork = v
		case "interfaceB":
			cfg.toInternet = v
		case "upstreamBandwidthCapacityDownloadMbps":
			cfg.down, err = num()
		case "upstreamBandwidthCapacityUploadMbps":
			cfg.up, err = num()
		case "generatedPNDownloadMbps":
			cfg.genDown, err = num()
		case "generatedPNUploadMbps":
			cfg.genUp, err = num()
		case "sqm":
			cfg.sqm = v
		case "OnAStick":
			cfg.onAStick = v == "True"
		case "monitorOnlyMode":
			cfg.monitorOnly = v == "True"
		}
		if err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// check refuses what the import cannot carry over and fills defaults.
func (c *lqosConfig) check(r *Report) {
	switch {
	case c.onAStick:
		r.Refuse(c.at, "on a stick (single_interface)", "download and upload on one interface, told apart by VLAN: sluice shapes per device and direction; give the two VLAN devices as a bridge's to_network and to_internet")
	case c.toNetwork == "" || c.toInternet == "":
		r.Refuse(c.at, "interfaces", "the settings name no interface pair ([bridge] to_network and to_internet, or interfaceA and interfaceB)")
	case c.toNetwork == c.toInternet:
		r.Refuse(c.at, "interfaces", "to_network and to_internet are both %q", c.toNetwork)
	}
	for _, v := range []struct {
		what string
		mbps float64
	}{{"downlink bandwidth", c.down}, {"uplink bandwidth", c.up}} {
		if !(v.mbps > 0) || v.mbps > 1e6 {
			r.Refuse(c.at, v.what, "%v Mbit/s: want a capacity above 0", v.mbps)
		}
	}
	if c.monitorOnly {
		r.Refuse(c.at, "monitor_only", "LibreQoS shapes nothing in monitor mode: there is no policy to import")
	}
	if c.genDown <= 0 {
		c.genDown = c.down
	}
	if c.genUp <= 0 {
		c.genUp = c.up
	}
	if c.sqm == "" {
		c.sqm = "cake diffserv4"
	}
}

// lqCircuit is a circuit of ShapedDevices.csv: the rows sharing a
// Circuit ID.
type lqCircuit struct {
	at       At
	id, name string
	parent   string
	addrs    []string
	// min and max are the rates in Mbit/s, by direction (lqDown,
	// lqUp).
	min, max             [2]float64
	sqm                  string
	node                 *lqNode // resolved parent (nil: none)
	downName, upName     string
	skipped              bool
	firstDevice, devices int
}

// ShapedDevices.csv's columns, by their header names compared without
// case, spaces or underscores (LibreQoS's own files spell them both
// ways: "Circuit ID" and "circuit_id").
var lqColumns = map[string]string{
	"circuitid": "circuit", "circuitname": "circuitName", "deviceid": "device", "devicename": "deviceName",
	"parentnode": "parent", "mac": "mac", "ipv4": "ipv4", "ipv6": "ipv6",
	"downloadminmbps": "minDown", "uploadminmbps": "minUp", "downloadmaxmbps": "maxDown", "uploadmaxmbps": "maxUp",
	"downloadmin": "minDown", "uploadmin": "minUp", "downloadmax": "maxDown", "uploadmax": "maxUp",
	"comment": "comment", "sqm": "sqm", "parentnodeid": "parentID", "anchornodeid": "anchorID",
}

func lqColumnKey(h string) string {
	h = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))
	return strings.NewReplacer(" ", "", "_", "", "-", "").Replace(h)
}

// readShapedDevices reads the rows into circuits, in file order.
func readShapedDevices(r *Report, file string, b []byte) []*lqCircuit {
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
	cr := csv.NewReader(bytes.NewReader(b))
	cr.FieldsPerRecord = -1
	cr.LazyQuotes = true
	var header []string
	col := map[string]int{}
	var circuits []*lqCircuit
	byID := map[string]*lqCircuit{}
	seenAddr := map[netip.Prefix]At{}
	saidV20 := false
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		line, _ := cr.FieldPos(0)
		at := At{file, line}
		if err != nil {
			r.Refuse(at, "ShapedDevices.csv", "%v", err)
			return nil
		}
		if len(rec) == 0 || strings.HasPrefix(strings.TrimSpace(rec[0]), "#") || len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		if header == nil {
			header = rec
			for i, h := range rec {
				k, ok := lqColumns[lqColumnKey(h)]
				if !ok {
					r.Approx(at, fmt.Sprintf("column %q", h), "not a ShapedDevices.csv column sluice knows: ignored")
					continue
				}
				col[k] = i
			}
			for _, need := range []string{"circuit", "parent", "ipv4", "ipv6", "minDown", "minUp", "maxDown", "maxUp"} {
				if _, ok := col[need]; !ok {
					r.Refuse(at, "the header", "no %s column: is the first row the header? (want Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment)", need)
					return nil
				}
			}
			if _, ok := col["anchorID"]; ok {
				r.Approx(at, "Anchor Node ID", "read as data only: sluice places a circuit by its Parent Node")
			}
			continue
		}
		rec = lqFitRow(r, at, header, col, rec, &saidV20)
		if rec == nil {
			continue
		}
		field := func(k string) string {
			if i, ok := col[k]; ok && i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		c := &lqCircuit{at: at, id: field("circuit"), name: field("circuitName"), parent: field("parent"), sqm: strings.ToLower(field("sqm"))}
		if c.name == "" {
			c.name = field("deviceName")
		}
		bad := false
		for _, k := range []struct {
			key string
			v   *float64
		}{{"minDown", &c.min[lqDown]}, {"minUp", &c.min[lqUp]}, {"maxDown", &c.max[lqDown]}, {"maxUp", &c.max[lqUp]}} {
			s := field(k.key)
			f, err := strconv.ParseFloat(s, 64)
			if err != nil || !(f > 0) || f > 1e6 {
				r.Refuse(at, header[col[k.key]], "%q: want a rate in Mbit/s above 0", s)
				bad = true
			}
			*k.v = f
		}
		if !bad && (c.min[lqDown] > c.max[lqDown] || c.min[lqUp] > c.max[lqUp]) {
			r.Refuse(at, "rates", "a minimum above its maximum (download %v/%v, upload %v/%v Mbit/s)", c.min[lqDown], c.max[lqDown], c.min[lqUp], c.max[lqUp])
			bad = true
		}
		for _, k := range []string{"ipv4", "ipv6"} {
			for _, a := range strings.Split(strings.ReplaceAll(field(k), " ", ""), ",") {
				if a == "" {
					continue
				}
				pf, err := lqPrefix(a, k == "ipv6")
				if err != nil {
					r.Refuse(at, header[col[k]], "%v", err)
					bad = true
					continue
				}
				if prev, dup := seenAddr[pf]; dup {
					r.Approx(at, "address "+a, "also listed at %s: kept there, left out here (LibreQoS warns and maps it to one of them)", prev)
					continue
				}
				seenAddr[pf] = at
				if pf.IsSingleIP() {
					c.addrs = append(c.addrs, pf.Addr().String())
				} else {
					c.addrs = append(c.addrs, pf.String())
				}
			}
		}
		if bad {
			continue
		}
		if c.id == "" {
			c.id = field("device")
			circuits = append(circuits, c)
			c.devices = 1
			continue
		}
		if first, ok := byID[c.id]; ok {
			first.devices++
			first.addrs = append(first.addrs, c.addrs...)
			if first.parent != c.parent {
				r.Refuse(at, "circuit "+c.id, "its devices name different parent nodes (%q at %s, %q here): LibreQoS refuses this too", first.parent, first.at, c.parent)
			}
			if first.min != c.min || first.max != c.max {
				r.Approx(at, "circuit "+c.id, "this device's rates differ from the circuit's first device (%s): the circuit keeps the first's, as LibreQoS does", first.at)
			}
			continue
		}
		byID[c.id] = c
		c.devices = 1
		circuits = append(circuits, c)
	}
	if header == nil {
		r.Refuse(At{File: file}, "ShapedDevices.csv", "no header and no devices")
	}
	return circuits
}

// lqFitRow matches a row's fields to the header. A row with more
// fields than the header names has an unquoted comma in a free-text
// field (LibreQoS's own example puts "Down=cake, Up=fq_codel" in
// Comment): where the header has a Comment column the extra fields are
// read as part of it, and the report says so; other mismatches are
// refused at their line.
func lqFitRow(r *Report, at At, header []string, col map[string]int, rec []string, saidV20 *bool) []string {
	// The node id columns v2.2 added, where a row is written without
	// them (LibreQoS's own v2.2 example: its header has them, its rows
	// are v2.0's): the row is read in v2.0's layout.
	var ids []int
	for _, k := range []string{"parentID", "anchorID"} {
		if i, ok := col[k]; ok {
			ids = append(ids, i)
		}
	}
	switch {
	case len(rec) == len(header):
		return rec
	case len(ids) > 0 && len(rec) == len(header)-len(ids):
		out := make([]string, 0, len(header))
		for i := range header {
			if slices.Contains(ids, i) {
				out = append(out, "")
				continue
			}
			out = append(out, rec[len(out)-countBelow(ids, i)])
		}
		if !*saidV20 {
			*saidV20 = true
			r.Approx(at, "the rows", "%d fields where the header names %d: read without its node id columns (v2.0's layout, as the values show); the rows after this one that do the same are read alike", len(rec), len(header))
		}
		return out
	case len(rec) < len(header):
		// Trailing optional columns left off (sqm, node ids) are empty.
		last := 0
		for k, i := range col {
			if k != "sqm" && k != "comment" && k != "parentID" && k != "anchorID" && k != "mac" && k != "circuitName" && k != "deviceName" {
				last = max(last, i)
			}
		}
		if len(rec) > last {
			return append(rec, make([]string, len(header)-len(rec))...)
		}
		r.Refuse(at, "the row", "%d fields where the header (%s) names %d: the row does not match the header", len(rec), strings.Join(header, ","), len(header))
		return nil
	}
	ci, ok := col["comment"]
	if !ok {
		r.Refuse(at, "the row", "%d fields where the header names %d, and no Comment column to hold the extra: quote the field with the comma", len(rec), len(header))
		return nil
	}
	extra := len(rec) - len(header)
	out := append([]string{}, rec[:ci]...)
	out = append(out, strings.Join(rec[ci:ci+extra+1], ","))
	out = append(out, rec[ci+extra+1:]...)
	r.Approx(at, "the row", "%d fields where the header names %d: an unquoted comma; read %q as the Comment (LibreQoS reads columns by position and would not)", len(rec), len(header), out[ci])
	return out
}

// countBelow counts the indexes in ids below i.
func countBelow(ids []int, i int) int {
	n := 0
	for _, j := range ids {
		if j < i {
			n++
		}
	}
	return n
}

// lqPrefix reads an address or prefix of the IPv4 or IPv6 column.
func lqPrefix(s string, v6 bool) (netip.Prefix, error) {
	pf, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an address or prefix", s)
		}
		pf = netip.PrefixFrom(a, a.BitLen())
	}
	if pf.Addr().Is6() != v6 {
		fam := "IPv4"
		if v6 {
			fam = "IPv6"
		}
		return netip.Prefix{}, fmt.Errorf("%q in the %s column", s, fam)
	}
	if pf.Masked() != pf {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set (the network is %s)", s, pf.Masked())
	}
	return pf, nil
}

// lqNode is a node of network.json.
type lqNode struct {
	at         At
	name       string
	bw         [2]float64 // the maxima as written, by direction (0: missing)
	virtual    bool
	children   []*lqNode
	parent     *lqNode
	circuits   []*lqCircuit
	ceil       [2]float64 // by direction, capped by the parent's
	circuitCls string     // the class its circuits hang below
}

// readNetworkJSON reads the tree in file order (a map would lose it,
// and LibreQoS's class ids follow it).
func readNetworkJSON(r *Report, file string, b []byte) []*lqNode {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	// Offsets only grow: count the newlines since the last one asked
	// for, not from the start (a big network.json has thousands of nodes).
	line, upTo := 1, 0
	lineAt := func(off int64) At {
		if o := min(int(off), len(b)); o > upTo {
			line += bytes.Count(b[upTo:o], []byte("\n"))
			upTo = o
		}
		return At{file, line}
	}
	var nodes func(depth int) ([]*lqNode, error)
	var value func() (any, error)
	value = func() (any, error) {
		var v any
		err := dec.Decode(&v)
		return v, err
	}
	nodes = func(depth int) ([]*lqNode, error) {
		if depth > 64 {
			return nil, errors.New("nested deeper than 64 levels")
		}
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		if d, ok := t.(json.Delim); !ok || d != '{' {
			return nil, fmt.Errorf("want an object of nodes, found %v", t)
		}
		var out []*lqNode
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			n := &lqNode{name: kt.(string), at: lineAt(dec.InputOffset())}
			t, err := dec.Token()
			if err != nil {
				return nil, err
			}
			if d, ok := t.(json.Delim); !ok || d != '{' {
				return nil, fmt.Errorf("%s: node %q: want an object", n.at, n.name)
			}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				switch k := kt.(string); k {
				case "children":
					if n.children, err = nodes(depth + 1); err != nil {
						return nil, err
					}
				case "downloadBandwidthMbps", "uploadBandwidthMbps":
					v, err := value()
					if err != nil {
						return nil, err
					}
					f, ok := lqNumber(v)
					if !ok {
						return nil, fmt.Errorf("%s: node %q: %s %v: want a number of Mbit/s", n.at, n.name, k, v)
					}
					if k == "downloadBandwidthMbps" {
						n.bw[lqDown] = f
					} else {
						n.bw[lqUp] = f
					}
				case "virtual":
					v, err := value()
					if err != nil {
						return nil, err
					}
					n.virtual = v == true
				default:
					if _, err := value(); err != nil {
						return nil, err
					}
				}
			}
			if _, err := dec.Token(); err != nil { // }
				return nil, err
			}
			out = append(out, n)
		}
		_, err = dec.Token() // }
		return out, err
	}
	ns, err := nodes(0)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("more after the top-level object")
		}
	}
	if err != nil {
		r.Refuse(lineAt(dec.InputOffset()), "network.json", "%v", err)
		return nil
	}
	if len(ns) == 0 {
		r.Exact(At{File: file}, "network.json", "{}: a flat network, every circuit directly below the link")
	}
	return ns
}

func lqNumber(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		return f, err == nil && !math.IsInf(f, 0) && f >= 0
	case string: // some integrations write "100"
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil && f >= 0 && f < 1e9
	case nil:
		return 0, true
	}
	return 0, false
}

type lqImport struct {
	r        *Report
	cfg      *lqosConfig
	circuits []*lqCircuit
	nodes    []*lqNode
	byName   map[string]*lqNode
	flatOnes []*lqCircuit
}

// index names the nodes, refusing a name used twice (LibreQoS does too:
// a circuit names its parent node by name), and promotes the children
// of virtual nodes to their parent, as LibreQoS shapes them.
func (lq *lqImport) index(ns []*lqNode, parent *lqNode) {
	for _, n := range ns {
		if prev, dup := lq.byName[n.name]; dup {
			lq.r.Refuse(n.at, "node "+n.name, "its name is used at %s too: circuits name their parent node by name", prev.at)
			continue
		}
		lq.byName[n.name] = n
		n.parent = parent
		lq.index(n.children, n)
	}
}

// attach hangs each circuit below its parent node.
func (lq *lqImport) attach() {
	flat := len(lq.nodes) == 0
	for _, c := range lq.circuits {
		if c.parent == "" || flat {
			if c.parent != "" {
				lq.r.Exact(c.at, "circuit "+c.id, "parent node %q: a flat network, so below the link (as LibreQoS does)", c.parent)
			}
			lq.flatOnes = append(lq.flatOnes, c)
			continue
		}
		n := lq.byName[c.parent]
		for n != nil && n.virtual {
			n = n.parent
		}
		if n == nil {
			if lq.byName[c.parent] == nil {
				lq.r.Exact(c.at, "circuit "+c.id, "parent node %q is not in network.json: left out, as LibreQoS leaves it unshaped (its traffic goes to the default class)", c.parent)
				c.skipped = true
			} else {
				lq.flatOnes = append(lq.flatOnes, c) // below a virtual top-level node
			}
			continue
		}
		c.node = n
		n.circuits = append(n.circuits, c)
	}
}

// The directions, as indices of the per-direction arrays.
const (
	lqDown = iota
	lqUp
)

type lqDir struct {
	i         int // lqDown or lqUp
	name, dev string
	comment   string
	cap, gen  float64
	by        string
	hosts     string
}

func mbit(v float64) float64 { return v * 1e6 }

// tree builds one direction's tree and hosts file.
func (lq *lqImport) tree(d lqDir) (*Tree, []Host) {
	r, cfg := lq.r, lq.cfg
	down := d.i == lqDown
	t := &Tree{At: cfg.at, Comment: d.comment, Rate: bitRate(mbit(d.cap))}
	taken := map[string]bool{}
	switch leaf := strings.Fields(cfg.sqm); {
	case len(leaf) > 0 && leaf[0] == "cake":
		t.Leaf = "cake"
		if len(leaf) > 1 && down {
			r.Approx(cfg.at, "sqm "+cfg.sqm, "cake with sluice's settings for a class's leaf; %s is left out", strings.Join(leaf[1:], " "))
		}
	case len(leaf) > 0 && leaf[0] == "fq_codel":
		t.Leaf = "fq_codel"
	default:
		if down {
			r.Approx(cfg.at, "sqm "+cfg.sqm, "not cake or fq_codel: sluice picks the leaf (auto)")
		}
	}
	// Nodes: ceil capped by the parent's (0 or missing: the parent's),
	// rate 95% of the ceil, as LibreQoS sets them.
	var build func(ns []*lqNode, parentCeil float64) []*Class
	build = func(ns []*lqNode, parentCeil float64) []*Class {
		var out []*Class
		for _, n := range ns {
			max := n.bw[d.i]
			if max <= 0 {
				r.Approx(n.at, "node "+n.name, "no %s bandwidth: its parent's, %s (as LibreQoS does)", d.name, bitRate(mbit(parentCeil)))
				max = parentCeil
			}
			ceil := math.Min(max, parentCeil)
			if n.virtual {
				out = append(out, build(n.children, parentCeil)...)
				continue
			}
			c := &Class{At: n.at, Origin: "node " + n.name, Name: uniqueName(className(n.name, "node"), taken)}
			c.rateBits, c.ceilBits = mbit(math.Round(ceil*0.95*1000)/1000), mbit(ceil)
			c.Rate, c.Ceil = bitRate(c.rateBits), bitRate(c.ceilBits)
			n.ceil[d.i] = ceil
			c.Classes = build(n.children, ceil)
			n.circuitCls = c.Name
			if len(n.circuits) > 0 && len(c.Classes) > 0 {
				// sluice hangs hosts below a class without classes: the
				// circuits of a node with child nodes get a class of
				// their own beside them.
				sum := sumMins(n.circuits, d.i)
				g := &Class{At: n.at, Origin: "node " + n.name, Comment: "its circuits", Name: uniqueName(c.Name+"-circuits", taken)}
				g.rateBits, g.ceilBits = mbit(math.Min(sum, ceil)), c.ceilBits
				g.Rate, g.Ceil = bitRate(g.rateBits), c.Ceil
				c.Classes = append(c.Classes, g)
				n.circuitCls = g.Name
				if down {
					r.Approx(n.at, "node "+n.name, "it has child nodes and %d circuit(s): the circuits share a class %s (rate: the sum of their minimums) beside the child nodes, where LibreQoS hangs each beside them", len(n.circuits), g.Name)
				}
			}
			out = append(out, c)
		}
		return out
	}
	top := build(lq.nodes, d.cap)
	t.Classes = top
	// The per_host class: it owns the hosts file and holds the circuits
	// without a parent node.
	ph := &Class{At: At{File: d.hosts}, Name: uniqueName("circuits", taken), Prio: nil}
	if len(lq.flatOnes) > 0 {
		ph.Comment = "the circuits without a parent node (LibreQoS's generated parent nodes)"
		sum := sumMins(lq.flatOnes, d.i)
		ceil := math.Min(d.gen, d.cap)
		ph.rateBits, ph.ceilBits = mbit(math.Min(sum, ceil)), mbit(ceil)
		if down {
			r.Approx(cfg.at, "generated parent nodes", "LibreQoS spreads the %d circuit(s) without a parent node over one generated node per CPU queue, each up to %v Mbit/s; here they share class %s (rate: the sum of their minimums, ceil %v Mbit/s)", len(lq.flatOnes), d.gen, ph.Name, ceil)
		}
	} else {
		ph.Comment = "owns the hosts file; every circuit hangs below its node"
		ph.rateBits, ph.ceilBits = 8000, 8000
	}
	ph.Rate, ph.Ceil = bitRate(ph.rateBits), bitRate(ph.ceilBits)
	ph.PerHost = &PerHost{By: d.by, HostsFile: d.hosts, Prio: intp(3)}
	t.Classes = append(t.Classes, ph)
	// LibreQoS's default class (X:2): a quarter of the link, up to all
	// of it less 1 Mbit/s, prio 5.
	def := &Class{At: cfg.at, Origin: "X:2", Comment: "LibreQoS's default class: traffic of no listed device", Name: uniqueName("default", taken), Prio: intp(5)}
	def.rateBits = mbit(math.Round((d.cap - 1) / 4))
	def.ceilBits = mbit(d.cap - 1)
	if def.rateBits < 8000 || def.ceilBits < 8000 {
		def.rateBits, def.ceilBits = 8000, mbit(d.cap)
	}
	def.Rate, def.Ceil = bitRate(def.rateBits), bitRate(def.ceilBits)
	t.Classes = append(t.Classes, def)
	t.Default = def.Name
	if down {
		r.Approx(cfg.at, "CPU queues", "LibreQoS builds one HTB per CPU queue, each with the whole capacity (%v/%v Mbit/s), and spreads the top-level nodes over them; here one tree of that capacity holds them all (shards split it again, balanced by the agent)", cfg.down, cfg.up)
	}
	fitRates(r, cfg.at, t.rateBits(), t.Classes)

	// The hosts: a circuit's ceil is capped by its node's, its rate by
	// its ceil.
	var hosts []Host
	hostNames := map[string]bool{}
	for _, c := range lq.circuits {
		if c.skipped {
			continue
		}
		min, max := c.min[d.i], c.max[d.i]
		parent, nodeCeil := "", d.cap
		if c.node != nil {
			parent, nodeCeil = c.node.circuitCls, c.node.ceil[d.i]
		}
		if max > nodeCeil {
			r.Approx(c.at, "circuit "+c.id, "%s maximum %v Mbit/s is above its node's %v: capped to it, as LibreQoS does", d.name, max, nodeCeil)
			max = nodeCeil
		}
		min = math.Min(min, max)
		if len(c.addrs) == 0 {
			if down {
				r.Exact(c.at, "circuit "+c.id, "no addresses: nothing of it to shape, left out")
			}
			continue
		}
		name := c.downName
		if down {
			name = uniqueName(className(c.id, "circuit"), hostNames)
			c.downName = name
		}
		h := Host{Name: name, Addresses: c.addrs, Rate: lqRate(min), Ceil: lqRate(max), Parent: parent,
			Comment: fmt.Sprintf("%s: circuit %s", c.at, strings.ReplaceAll(c.name, "\n", " "))}
		if c.sqm != "" && down {
			r.Approx(c.at, "sqm "+c.sqm, "a circuit's own SQM is not carried over: its class takes the tree's leaf (%s)", t.Leaf)
		}
		hosts = append(hosts, h)
	}
	if len(hosts) == 0 {
		// sluice refuses a hosts file of no hosts: no per_host class,
		// every address goes to the default class, as under LibreQoS.
		t.Classes = slices.DeleteFunc(t.Classes, func(c *Class) bool { return c == ph })
		if down {
			r.Exact(At{File: d.hosts}, "circuits", "no circuit is shaped (none has a node of the network and an address): no hosts file, every address goes to the default class")
		}
		return t, nil
	}
	if down {
		r.Exact(At{File: d.hosts}, "circuits", "%d circuit(s) become hosts of %s and %s: rate the minimum, ceil the maximum, prio 3", len(hosts), libreqosHostsDown, libreqosHostsUp)
	}
	return t, hosts
}

// sumMins adds the circuits' minimums in direction i.
func sumMins(cs []*lqCircuit, i int) float64 {
	sum := 0.0
	for _, c := range cs {
		sum += c.min[i]
	}
	return sum
}

// lqRate writes Mbit/s as a sluice rate, exactly to the kbit.
func lqRate(mbps float64) string { return bitRate(math.Round(mbps*1000) * 1000) }
