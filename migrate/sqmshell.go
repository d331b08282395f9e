package migrate

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"sluice/safefile"
)

// sqm-scripts outside OpenWrt (Debian's and Arch's packages, a plain
// `make install`) reads shell files instead of UCI: /etc/sqm/default.conf
// for every interface, then /etc/sqm/DEV.iface.conf for DEV, each a list
// of NAME=VALUE lines that sqm sources. With ifupdown an interface is
// shaped only where its DEV.iface.conf exists; `systemctl start sqm@DEV`
// shapes DEV with default.conf alone. The names map to the UCI options
// the queue reader knows (sqmShellNames); what sluice does not carry
// over is reported.

// sqmShellNames maps the shell form's settings to UCI's options.
var sqmShellNames = map[string]string{
	"ENABLED":             "enabled",
	"UPLINK":              "upload",
	"DOWNLINK":            "download",
	"SCRIPT":              "script",
	"QDISC":               "qdisc",
	"LINKLAYER":           "linklayer",
	"OVERHEAD":            "overhead",
	"LLAM":                "linklayer_adaptation_mechanism",
	"IGNORE_DSCP_INGRESS": "squash_ingress",
	"ZERO_DSCP_INGRESS":   "squash_dscp",
	"IQDISC_OPTS":         "iqdisc_opts",
	"EQDISC_OPTS":         "eqdisc_opts",
}

// sqmShellTuning are sqm's settings for its leaves' and shaper's
// internals: sluice sets its own, so a value given is reported, not
// carried over.
var sqmShellTuning = map[string]bool{
	"STAB_MTU": true, "STAB_TSIZE": true, "STAB_MPU": true,
	"ILIMIT": true, "ELIMIT": true, "ITARGET": true, "ETARGET": true, "TARGET": true,
	"IECN": true, "EECN": true,
	"SHAPER_BURST_DUR_US": true, "SHAPER_QUANTUM_DUR_US": true,
	"ISHAPER_BURST_DUR_US": true, "ESHAPER_BURST_DUR_US": true,
	"ISHAPER_QUANTUM_DUR_US": true, "ESHAPER_QUANTUM_DUR_US": true,
	"INGRESS_CAKE_OPTS": true, "EGRESS_CAKE_OPTS": true,
}

var (
	sqmShellLine = regexp.MustCompile(`^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)
	// A recipe defines shell functions (egress(), ingress()) and calls
	// tc through $TC: a program, not settings.
	sqmRecipe = regexp.MustCompile(`(?m)^\s*(egress|ingress|sqm_prepare_script|sqm_start|cake_egress)\s*\(\)`)
)

// sqmShellForm says whether text is the shell form: assignments, one of
// them a setting sqm reads, and no UCI `config` line.
func sqmShellForm(text string) bool {
	shell := false
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(shellComment(line))
		switch {
		case line == "":
		case strings.HasPrefix(line, "config ") || strings.HasPrefix(line, "option "):
			return false
		default:
			if m := sqmShellLine.FindStringSubmatch(line); m != nil && (sqmShellNames[m[1]] != "" || sqmShellTuning[m[1]]) {
				shell = true
			}
		}
	}
	return shell
}

// sqmShellDir imports /etc/sqm: default.conf with each DEV.iface.conf,
// or with opt.Interface alone where it is set.
func sqmShellDir(dir string, opt Options) (*Draft, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var devs []string
	for _, e := range ents {
		if dev, ok := strings.CutSuffix(e.Name(), ".iface.conf"); ok && dev != "" && e.Type().IsRegular() {
			devs = append(devs, dev)
		}
	}
	sort.Strings(devs)
	if opt.Interface != "" {
		devs = []string{opt.Interface}
	}
	d := &Draft{Tool: "sqm-scripts"}
	if len(devs) == 0 {
		d.Report.Refuse(At{File: dir}, "sqm config", "no DEV.iface.conf here: with ifupdown sqm shapes only the interfaces that have one; for `systemctl start sqm@DEV` (default.conf alone) give --interface DEV")
		return d, nil
	}
	return sqmShell(d, dir, devs, opt)
}

// sqmShellFile imports one file of the shell form: DEV.iface.conf (with
// default.conf beside it, as sqm reads them), or default.conf for
// opt.Interface.
func sqmShellFile(file string, opt Options) (*Draft, error) {
	d := &Draft{Tool: "sqm-scripts"}
	dir, base := filepath.Dir(file), filepath.Base(file)
	if dev, ok := strings.CutSuffix(base, ".iface.conf"); ok && dev != "" {
		if opt.Interface != "" && opt.Interface != dev {
			return nil, fmt.Errorf("%s is %s's configuration, not --interface %s's", file, dev, opt.Interface)
		}
		return sqmShell(d, dir, []string{dev}, opt)
	}
	if opt.Interface == "" {
		d.Report.Refuse(At{File: file}, "sqm config", "names no interface: sqm applies %s to the interface it is started on (sqm@DEV, or each DEV.iface.conf beside it with ifupdown); give --interface DEV, or import the directory", base)
		return d, nil
	}
	if base == "default.conf" {
		return sqmShell(d, dir, []string{opt.Interface}, opt)
	}
	q := &sqmQueue{at: At{File: file}, name: opt.Interface, opt: map[string]string{"enabled": "1", "interface": opt.Interface}, optAt: map[string]At{}}
	if err := q.readShell(&d.Report, file); err != nil {
		return nil, err
	}
	return sqmShellDraft(d, []*sqmQueue{q}, At{File: file}, opt), nil
}

// sqmShell reads default.conf (where dir has one) and then each
// device's DEV.iface.conf (where it exists) over it, as sqm does.
func sqmShell(d *Draft, dir string, devs []string, opt Options) (*Draft, error) {
	def := filepath.Join(dir, "default.conf")
	_, defErr := os.Lstat(def)
	var qs []*sqmQueue
	for _, dev := range devs {
		q := &sqmQueue{at: At{File: def}, name: dev, opt: map[string]string{"enabled": "1", "interface": dev}, optAt: map[string]At{}}
		if defErr == nil {
			if err := q.readShell(&d.Report, def); err != nil {
				return nil, err
			}
		}
		iface := filepath.Join(dir, dev+".iface.conf")
		if _, err := os.Lstat(iface); err == nil {
			q.at = At{File: iface}
			if err := q.readShell(&d.Report, iface); err != nil {
				return nil, err
			}
		} else if defErr != nil {
			return nil, fmt.Errorf("%s: neither default.conf nor %s.iface.conf is there", dir, dev)
		}
		qs = append(qs, q)
	}
	return sqmShellDraft(d, qs, At{File: dir}, opt), nil
}

func sqmShellDraft(d *Draft, qs []*sqmQueue, at At, opt Options) *Draft {
	r := &d.Report
	if r.Refusals() != nil {
		return d
	}
	for _, q := range qs {
		if ifc := q.draft(r, opt); ifc != nil {
			d.Interfaces = append(d.Interfaces, ifc)
		}
	}
	if len(d.Interfaces) == 0 && r.Refusals() == nil {
		var off []string
		for _, q := range qs {
			off = append(off, fmt.Sprintf("%s (%s: ENABLED=%s)", q.name, q.place("enabled"), q.get("enabled", "0")))
		}
		r.Refuse(at, "sqm config", "no interface is enabled, so sqm shapes nothing with this configuration: %s; set ENABLED=1 to import", strings.Join(off, ", "))
	}
	if r.Refusals() != nil {
		return d
	}
	return d.settle(at)
}

// readShell reads one file of NAME=VALUE lines into q, later files
// overriding earlier ones as sqm's sourcing does.
func (q *sqmQueue) readShell(r *Report, file string) error {
	b, err := safefile.ReadRegular(file, "sqm config", maxSourceBytes)
	if err != nil {
		return err
	}
	for i, line := range strings.Split(string(b), "\n") {
		at := At{file, i + 1}
		line = strings.TrimSpace(strings.TrimRight(shellComment(line), "\r"))
		if line == "" {
			continue
		}
		m := sqmShellLine.FindStringSubmatch(line)
		if m == nil {
			word, _, _ := strings.Cut(line, " ")
			r.Refuse(at, word, "not an sqm setting: its configuration is NAME=VALUE lines (a program's statements are not read)")
			continue
		}
		name, raw := m[1], strings.TrimSpace(m[2])
		if strings.ContainsAny(raw, "$`") {
			r.Refuse(at, name, "%s: a value the shell computes; sluice reads literal values", raw)
			continue
		}
		val := strings.Join(shellWords(raw), " ")
		switch {
		case name == "IFACE":
			if val != q.name {
				r.Refuse(at, name, "%q: the file is %s's, and sqm shapes the interface it is started on", val, q.name)
			}
		case sqmShellNames[name] != "":
			k := sqmShellNames[name]
			q.opt[k], q.optAt[k] = val, at
			if (k == "iqdisc_opts" || k == "eqdisc_opts") && val != "" {
				q.opt["qdisc_advanced"], q.optAt["qdisc_advanced"] = "1", at
			}
		case sqmShellTuning[name]:
			if val != "" {
				r.Approx(at, name+"="+val, "sqm's tuning of its leaves and shaper: not carried over, sluice sets its own")
			}
		default:
			r.Approx(at, name, "not one of sqm's settings: sqm ignores it, and so does the import")
		}
	}
	return nil
}
