package features

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"sluice/kernel"
	"sluice/plan"
	"sluice/records"
	"sluice/safefile"
)

// Kinds sluice probes for. Leaves come first: the planner needs them.
var (
	ProbeQdiscs = []string{"htb", "tbf", "fq_codel", "sfq", "fq", "cake", "codel", "pfifo", "bfifo",
		"pfifo_fast", "prio", "mq", "mqprio", "netem", "hfsc", "drr", "red", "etf", "ingress", "clsact"}
	ProbeClassifiers = []string{"u32", "bpf", "flower", "matchall", "fw", "basic", "flow", "route"}
	ProbeActions     = []string{"mirred", "police", "gact", "skbedit", "pedit", "bpf", "connmark", "csum", "vlan"}
)

// Report is what the kernel can do, as far as sluice cares.
type Report struct {
	Kernel      string          `json:"kernel"`
	BootID      string          `json:"boot_id"`
	Qdiscs      map[string]bool `json:"qdiscs"`
	Classifiers map[string]bool `json:"classifiers"`
	Actions     map[string]bool `json:"actions"`
	// U32Mark: u32 honours skb->mark matches (CONFIG_CLS_U32_MARK).
	U32Mark bool      `json:"u32_mark"`
	BPF     BPFReport `json:"bpf"`
	// CongestionControls available, and the namespace's current one.
	CongestionControls []string `json:"congestion_controls"`
	CongestionControl  string   `json:"congestion_control"`
	DefaultQdisc       string   `json:"default_qdisc"`
	// Modules is what the kernel had loaded, could load and had built
	// in before the probe (which loads modules on demand).
	Modules Modules `json:"modules"`
	// Plan lists what sluice will therefore do.
	Plan []string `json:"plan"`
	// Probed: the kinds and BPF were probed by creating them (root).
	// Without privileges Inventory reads what anyone may instead, and
	// Unread says what it could not find out, and why.
	Probed bool     `json:"probed"`
	Unread []string `json:"unread,omitempty"`
}

// BPFReport lists BPF capabilities (kernel.BPFReport: the probes that
// create objects are the executor's package's).
type BPFReport = kernel.BPFReport

// Features extracts what the planner needs.
func (r *Report) Features() plan.Features {
	f := plan.Features{Qdiscs: map[string]bool{}, U32Mark: r.U32Mark,
		BPF: r.BPF.SchedCLS && r.Classifiers["bpf"] && r.Qdiscs["clsact"]}
	for k, v := range r.Qdiscs {
		f.Qdiscs[k] = v
	}
	return f
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ProbeCached returns the probe report, reusing the one cached for this
// boot under the state directory (a kernel cannot change without a
// reboot; modules loaded since are picked up by `sluice doctor`).
func ProbeCached(stateDir string) (*Report, error) {
	const name = "features.json"
	boot := readTrim("/proc/sys/kernel/random/boot_id")
	d, derr := safefile.OpenDir(stateDir, true)
	if derr == nil {
		defer d.Close()
		if b, err := d.ReadFile(name, 1<<20); err == nil {
			var r Report
			if json.Unmarshal(b, &r) == nil && r.BootID == boot && boot != "" {
				return &r, nil
			}
		}
	}
	r, err := Probe()
	if err != nil {
		// A reader without root cannot probe (the scratch namespace
		// needs it): what the kernel has is the same from every
		// namespace, so the base directory's cache answers (an apply
		// from the root namespace wrote it), where it is this boot's.
		if base := records.Base(); filepath.Clean(base) != filepath.Clean(stateDir) {
			if bd, berr := safefile.OpenDir(base, false); berr == nil {
				defer bd.Close()
				if b, rerr := bd.ReadFile(name, 1<<20); rerr == nil {
					var c Report
					if json.Unmarshal(b, &c) == nil && c.BootID == boot && boot != "" {
						return &c, nil
					}
				}
			}
		}
		return nil, err
	}
	if derr == nil { // the cache is best effort
		if b, err := json.MarshalIndent(r, "", "  "); err == nil {
			d.WriteAtomic(name, b)
		}
	}
	return r, nil
}

// Probe asks the kernel, by creating each object on a veth pair in a
// throwaway network namespace (never by reading config files, which may
// not match the running kernel or its modules).
func Probe() (*Report, error) {
	r := readable()
	r.Probed = true
	k, err := kernel.ProbeScratch(ProbeQdiscs, ProbeClassifiers, ProbeActions)
	if err != nil {
		return nil, err
	}
	r.Qdiscs, r.Classifiers, r.Actions, r.U32Mark = k.Qdiscs, k.Classifiers, k.Actions, k.U32Mark
	jit, btf := r.BPF.JIT, r.BPF.BTF // what readable read, not probed
	r.BPF = k.BPF
	r.BPF.JIT, r.BPF.BTF = jit, btf
	r.explain()
	return r, nil
}

// Inventory is what an unprivileged process can learn without probing:
// the kernel's release, sysctls, BTF and its module inventory, from
// which each qdisc, classifier and action is taken to exist when its
// module is loaded, built in or loadable (or it is part of the core).
// Unread says what only a probe (root) would tell.
func Inventory() *Report { return inventory(readable()) }

// inventory completes r (read, not probed) from its module inventory.
func inventory(r *Report) *Report {
	r.Unread = append(r.Unread, "qdiscs, classifiers and actions: not probed (creating them in a scratch namespace needs root); taken from the kernel's modules")
	if r.Modules.NoModules {
		r.Unread[0] = "qdiscs, classifiers and actions: not probed (needs root), and this kernel has no module list to read them from: unknown"
	}
	has := func(kind, name string) bool {
		m := moduleOf(kind, name)
		if m == "" {
			return true
		}
		return slices.Contains(r.Modules.Loaded, m) || slices.Contains(r.Modules.Builtin, m) || slices.Contains(r.Modules.Loadable, m)
	}
	for _, set := range []struct {
		kind  string
		names []string
		into  map[string]bool
	}{{"qdisc", ProbeQdiscs, r.Qdiscs}, {"classifier", ProbeClassifiers, r.Classifiers}, {"action", ProbeActions, r.Actions}} {
		for _, n := range set.names {
			set.into[n] = !r.Modules.NoModules && has(set.kind, n)
		}
	}
	r.Unread = append(r.Unread,
		"u32 mark: not probed (needs root); taken as absent",
		"bpf: program and map types not probed (loading them needs CAP_BPF); taken as absent")
	r.explain()
	return r
}

// readable is the part of a report anyone may read.
func readable() *Report {
	r := &Report{
		Kernel:       readTrim("/proc/sys/kernel/osrelease"),
		BootID:       readTrim("/proc/sys/kernel/random/boot_id"),
		Qdiscs:       map[string]bool{},
		Classifiers:  map[string]bool{},
		Actions:      map[string]bool{},
		DefaultQdisc: readTrim("/proc/sys/net/core/default_qdisc"),
	}
	r.Modules = readModules(r.Kernel)
	r.CongestionControls = strings.Fields(readTrim("/proc/sys/net/ipv4/tcp_available_congestion_control"))
	r.CongestionControl = readTrim("/proc/sys/net/ipv4/tcp_congestion_control")
	// Read before entering the scratch namespace: net.core.bpf_jit_enable
	// exists in the initial namespace only.
	jit := readTrim("/proc/sys/net/core/bpf_jit_enable")
	r.BPF.JIT = jit != "" && jit != "0"
	_, err := os.Stat("/sys/kernel/btf/vmlinux")
	r.BPF.BTF = err == nil
	return r
}

// explain turns the findings into sluice's decisions.
// KindsKnown reports whether the qdiscs, classifiers and actions are
// known: probed, or read from a module list.
func (r *Report) KindsKnown() bool { return r.Probed || !r.Modules.NoModules }

func (r *Report) explain() {
	if !r.KindsKnown() {
		r.Plan = append(r.Plan, "unknown without a probe: run `sluice doctor` as root")
		sort.Strings(r.CongestionControls)
		return
	}
	f := r.Features()
	leaf := "bfifo of about 50 ms at each class's rate (no fq_codel or sfq: no AQM)"
	switch {
	case f.Qdiscs["fq_codel"]:
		leaf = "fq_codel"
	case f.Qdiscs["sfq"]:
		leaf = "sfq (no fq_codel)"
	}
	r.Plan = append(r.Plan, "leaf: auto picks "+leaf)
	var missing []string
	for _, q := range []string{"fq_codel", "sfq", "fq", "cake", "pfifo", "bfifo"} {
		if !r.Qdiscs[q] {
			missing = append(missing, q)
		}
	}
	if len(missing) > 0 {
		r.Plan = append(r.Plan, "leaf: "+strings.Join(missing, ", ")+" refused by plan and apply (not in this kernel)")
	}
	switch {
	case !r.Qdiscs["htb"] || !r.Classifiers["u32"]:
		r.Plan = append(r.Plan, "shaping: impossible, this kernel lacks htb or u32")
	default:
		r.Plan = append(r.Plan, "shaping: HTB trees classified by u32")
	}
	if r.Qdiscs["clsact"] || r.Qdiscs["ingress"] {
		if r.Actions["mirred"] {
			r.Plan = append(r.Plan, "ingress: redirect to an ifb device with u32 + mirred, shape there")
		} else {
			r.Plan = append(r.Plan, "ingress: impossible, no mirred action")
		}
	}
	if !r.Modules.NoModules {
		var load []string
		need := []string{"sch_htb", "cls_u32", "sch_ingress", "act_mirred", "ifb"}
		if f.BPF {
			need = append(need, "cls_bpf")
		}
		switch { // leaf auto's pick
		case f.Qdiscs["fq_codel"]:
			need = append(need, "sch_fq_codel")
		case f.Qdiscs["sfq"]:
			need = append(need, "sch_sfq")
		}
		loadable := map[string]bool{}
		for _, m := range r.Modules.Loadable {
			loadable[m] = true
		}
		for _, m := range need {
			if loadable[m] {
				load = append(load, m)
			}
		}
		if len(load) > 0 {
			r.Plan = append(r.Plan, "modules: apply has the kernel load "+strings.Join(load, " ")+" on demand (not loaded before this probe); an explicit leaf loads its sch_ module")
		}
	}
	switch {
	case r.U32Mark:
		r.Plan = append(r.Plan, "match mark: u32 mark")
	case f.BPF:
		r.Plan = append(r.Plan, "match mark: in the BPF classifier (u32 here ignores marks: CONFIG_CLS_U32_MARK is off); a tree with classifier u32 and mark rules is refused")
	default:
		r.Plan = append(r.Plan, "match mark: refused (u32 here ignores marks: CONFIG_CLS_U32_MARK is off, and there is no BPF classifier)")
	}
	if r.BPF.SchedCLS && r.Classifiers["bpf"] {
		r.Plan = append(r.Plan, "bpf: sched_cls programs load (BPF classifier, policers and EDT can run)")
	}
	if !r.Qdiscs["fq"] {
		r.Plan = append(r.Plan, "edt: no fq qdisc, so BPF earliest-departure-time shaping cannot be enforced")
	}
	sort.Strings(r.CongestionControls)
}
