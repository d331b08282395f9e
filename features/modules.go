package features

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Modules is the state of the kernel modules behind the features sluice
// probes, read before the probe (which loads some on demand): loaded,
// loadable on demand (present for the running kernel in modules.dep),
// built in (modules.builtin), or absent. A kernel built without module
// support has none of the files: everything it has is built in.
type Modules struct {
	Loaded   []string `json:"loaded"`
	Loadable []string `json:"loadable"`
	Builtin  []string `json:"builtin"`
	Absent   []string `json:"absent"`
	// NoModules: the kernel loads no modules (no modules.dep for it).
	NoModules bool `json:"no_modules,omitempty"`
}

// moduleOf names the module providing a probed qdisc, classifier or
// action ("" for those that are always part of the core).
func moduleOf(kind, name string) string {
	switch kind {
	case "qdisc":
		switch name {
		case "pfifo", "bfifo", "pfifo_fast", "mq":
			return "" // net/sched/sch_fifo.c, sch_generic.c, sch_mq.c: core
		case "clsact":
			return "sch_ingress"
		}
		return "sch_" + name
	case "classifier":
		return "cls_" + name
	case "action":
		return "act_" + name
	}
	return name
}

// sluiceModules lists the modules behind every feature sluice probes,
// plus the ifb device, tun (the lab's delay line) and TCP BBR.
func sluiceModules() []string {
	set := map[string]bool{"ifb": true, "tun": true, "tcp_bbr": true, "veth": true}
	for _, q := range ProbeQdiscs {
		if m := moduleOf("qdisc", q); m != "" {
			set[m] = true
		}
	}
	for _, c := range ProbeClassifiers {
		set[moduleOf("classifier", c)] = true
	}
	for _, a := range ProbeActions {
		set[moduleOf("action", a)] = true
	}
	var out []string
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// readModules takes the inventory for the running kernel release.
func readModules(release string) Modules {
	var m Modules
	loaded := map[string]bool{}
	if f, err := os.Open("/proc/modules"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if name, _, ok := strings.Cut(s.Text(), " "); ok {
				loaded[name] = true
			}
		}
		f.Close()
	}
	dir := filepath.Join("/lib/modules", release)
	names := func(file string) map[string]bool {
		out := map[string]bool{}
		f, err := os.Open(filepath.Join(dir, file))
		if err != nil {
			return nil
		}
		defer f.Close()
		s := bufio.NewScanner(f)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			path, _, _ := strings.Cut(s.Text(), ":")
			base := filepath.Base(strings.TrimSpace(path))
			base, _, _ = strings.Cut(base, ".ko")
			out[strings.ReplaceAll(base, "-", "_")] = true
		}
		return out
	}
	available, builtin := names("modules.dep"), names("modules.builtin")
	m.NoModules = available == nil
	for _, mod := range sluiceModules() {
		switch {
		case loaded[mod]:
			m.Loaded = append(m.Loaded, mod)
		case builtin[mod]:
			m.Builtin = append(m.Builtin, mod)
		case available[mod]:
			m.Loadable = append(m.Loadable, mod)
		default:
			m.Absent = append(m.Absent, mod)
		}
	}
	return m
}
