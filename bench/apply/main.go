// Command apply times building an ISP-style tree of n subscribers from
// scratch and changing one subscriber, sluice against `tc -batch` of
// sluice's own export of the same policy, in the same run on the same
// kind of device: a veth with -queues transmit queues in a throwaway
// namespace. sluice applies the policy as it would on such a device (BPF
// classifier, the tree sharded over the queues); the export is its u32
// equivalent (one HTB, a hash table of hosts), what a tc user writes.
// Results go to bench/results/apply.json; docs/benchmarks.md shows them.
// Needs root.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"sluice/bench/internal/benchrun"
)

type result struct {
	Backend string `json:"backend"`
	Hosts   int    `json:"hosts"`
	Queues  int    `json:"queues"`
	Leaf    string `json:"leaf"`
	// Seconds from scratch; one-subscriber change in milliseconds
	// (median of several).
	SluiceApplyS  float64 `json:"sluice_apply_s"`
	SluiceWrites  int     `json:"sluice_netlink_writes"`
	SluiceChangeM float64 `json:"sluice_change_ms"`
	// Every one-subscriber change, in the order taken.
	SluiceChanges []float64 `json:"sluice_changes_ms"`
	// EDT only: the same change as the agent takes a hosts_file edit,
	// in place (median, and each).
	SluiceEditM float64   `json:"sluice_edit_in_place_ms,omitempty"`
	SluiceEdits []float64 `json:"sluice_edits_in_place_ms,omitempty"`
	TCBatchS    float64   `json:"tc_batch_s,omitempty"`
	TCLines     int       `json:"tc_batch_lines,omitempty"`
	TCChangeMs  float64   `json:"tc_change_ms,omitempty"`
	TCNote      string    `json:"tc_note,omitempty"`
	Speedup     float64   `json:"speedup,omitempty"`
}

var (
	sluiceBin = flag.String("sluice", "", "sluice binary (default: build it)")
	queues    = flag.Int("queues", 16, "transmit queues of the veth")
	sizes     = flag.String("hosts", "1000,10000,100000", "subscriber counts")
	tcLimit   = flag.Duration("tc-limit", 3*time.Minute, "give up on tc -batch after this long")
	leafAt    = flag.Int("leaf-none-above", 10000, "subscriber count above which subscribers get HTB's own pfifo (leaf: none)")
	out       = flag.String("out", "bench/results/apply.json", "results file")
	htbMax    = flag.Int("htb-max", 0, "host counts above this measure only EDT (0: no limit)")
	backends  = flag.String("backend", "htb", "comma-separated: htb, edt (needs fq), edt-maps (EDT's program and maps alone, where fq is missing); tc -batch is timed for htb only")
)

func main() {
	flag.Parse()
	*sluiceBin = benchrun.Sluice(*sluiceBin, "sluice-bench-apply")
	var results []result
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			benchrun.Fail(err)
		}
		for _, be := range strings.Split(*backends, ",") {
			if *htbMax > 0 && n > *htbMax && be == "htb" {
				continue
			}
			if be == "edt-maps" {
				r := measureEDTMaps(n)
				results = append(results, r)
				fmt.Printf("edt-maps %7d hosts: plan, load and fill %.3f s, one host's cap %.2f ms, in place %.2f ms\n", n, r.SluiceApplyS, r.SluiceChangeM, r.SluiceEditM)
				continue
			}
			r := measure(n, be)
			results = append(results, r)
			fmt.Printf("%s ", be)
			if be == "edt" {
				fmt.Printf("%7d hosts: sluice %.2f s (%d writes), change %.1f ms\n", n, r.SluiceApplyS, r.SluiceWrites, r.SluiceChangeM)
				continue
			}
			fmt.Printf("%7d hosts: sluice %.2f s (%d writes), change %.1f ms | tc -batch %s, change %.1f ms | %.1fx\n",
				n, r.SluiceApplyS, r.SluiceWrites, r.SluiceChangeM, tcText(r), r.TCChangeMs, r.Speedup)
		}
	}
	doc := map[string]any{
		"taken":   time.Now().UTC().Format(time.RFC3339),
		"cpus":    runtime.NumCPU(),
		"kernel":  strings.TrimSpace(benchrun.Output("uname", "-r")),
		"results": results,
	}
	b, _ := json.MarshalIndent(doc, "", "  ")
	os.MkdirAll(filepath.Dir(*out), 0o755)
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		benchrun.Fail(err)
	}
	fmt.Println("wrote", *out)
}

func tcText(r result) string {
	if r.TCNote != "" {
		return r.TCNote
	}
	return fmt.Sprintf("%.2f s (%d lines)", r.TCBatchS, r.TCLines)
}

func measure(n int, backend string) result {
	dir, err := os.MkdirTemp("", "sluice-apply")
	if err != nil {
		benchrun.Fail(err)
	}
	defer os.RemoveAll(dir)
	// One explicit leaf qdisc per subscriber up to 10,000; beyond,
	// HTB's own pfifo (a device has 32k qdisc handles).
	leaf := "auto"
	if n > *leafAt {
		leaf = "none"
	}
	r := result{Backend: backend, Hosts: n, Queues: *queues, Leaf: leaf}
	pol := filepath.Join(dir, "p.yaml")
	hosts := filepath.Join(dir, "hosts.csv")
	// The same subscribers for EDT: no leaves (fq on every queue).
	extra, leafKey := "", ", leaf: "+leaf
	if backend == "edt" {
		extra, leafKey, r.Leaf = "\n      backend: edt", "", "fq"
	}
	os.WriteFile(pol, []byte(fmt.Sprintf(`interfaces:
  - name: veth0
    egress:
      rate: 10gbit%s
      default: rest
      classes:
        - name: voice
          rate: 100mbit
          prio: 0
          match: [{dscp: EF}]
        - name: subs
          rate: 9gbit
          per_host: {by: dst, hosts_file: hosts.csv%s}
        - name: rest
          rate: 500mbit
`, extra, leafKey)), 0o644)
	os.WriteFile(hosts, []byte(benchrun.HostsCSV(n, -1)), 0o644)

	ns := fmt.Sprintf("sluice-bench-%d", os.Getpid())
	mkdev := func() {
		q := strconv.Itoa(*queues)
		benchrun.Must("ip", "netns", "add", ns)
		benchrun.Must("ip", "-n", ns, "link", "add", "veth0", "numtxqueues", q, "numrxqueues", q, "type", "veth",
			"peer", "name", "veth1", "numtxqueues", q, "numrxqueues", q)
		benchrun.Must("ip", "-n", ns, "link", "set", "veth0", "up")
	}
	// The device goes first, synchronously: a namespace is torn down in
	// the background, and its 10,000 classes' teardown would run into the
	// next measurement (every class's filter block sits on one list the
	// kernel walks per class created, machine-wide).
	rmdev := func() {
		exec.Command("ip", "-n", ns, "link", "del", "veth0").Run()
		exec.Command("ip", "netns", "del", ns).Run()
		time.Sleep(time.Second)
	}
	state, _ := os.MkdirTemp("", "sluice-apply-state")
	defer os.RemoveAll(state)
	sluice := func(args ...string) string {
		cmd := exec.Command(*sluiceBin, append([]string{"--netns", ns}, args...)...)
		cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+state)
		var o bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &o
		if err := cmd.Run(); err != nil {
			benchrun.Fail(fmt.Errorf("sluice %v: %v\n%s", args, err, o.String()))
		}
		return o.String()
	}

	// sluice from scratch, then one subscriber's rate at a time.
	mkdev()
	t0 := time.Now()
	o := sluice("apply", "-q", pol)
	r.SluiceApplyS = time.Since(t0).Seconds()
	fmt.Sscanf(o[strings.Index(o, "change(s), ")+len("change(s), "):], "%d", &r.SluiceWrites)
	// Changes are made on a tree in service: a second after the build,
	// not in its immediate wake.
	time.Sleep(time.Second)
	var changes []float64
	csv := benchrun.HostsCSV
	if backend == "edt" {
		csv = benchrun.HostsCSVCap // an aggregate's cap is its ceil
	}
	for k := 0; k < 9; k++ {
		os.WriteFile(hosts, []byte(csv(n, (k*7919)%n)), 0o644)
		t0 := time.Now()
		o := sluice("apply", "-q", pol)
		changes = append(changes, float64(time.Since(t0).Microseconds())/1000)
		// The subscriber bumped before goes back, this one goes up: each
		// a class change, and its leaf's limit, which follows the
		// quantum (plan.BfifoLimit). Nothing else may change.
		var made int
		if i := strings.Index(o, "applied: "); i >= 0 {
			fmt.Sscanf(o[i+len("applied: "):], "%d", &made)
		}
		if made < 1 || made > 4 {
			benchrun.Fail(fmt.Errorf("a one-subscriber change took more than its class and leaf (and the last one's back): %s", o))
		}
	}
	r.SluiceChanges = append([]float64(nil), changes...)
	r.SluiceChangeM = median(changes)
	os.WriteFile(hosts, []byte(benchrun.HostsCSV(n, -1)), 0o644)
	rmdev()
	if backend == "edt" {
		r.TCNote = "EDT has no tc equivalent"
		return r
	}

	// tc -batch of the export, on a fresh device.
	cmd := exec.Command(*sluiceBin, "export", "--fresh", pol)
	var script, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &script, &errb
	if err := cmd.Run(); err != nil {
		r.TCNote = "no u32 equivalent: " + benchrun.FirstLine(errb.String())
		return r
	}
	file := filepath.Join(dir, "export.tc")
	os.WriteFile(file, script.Bytes(), 0o644)
	r.TCLines = strings.Count(script.String(), "\n") - strings.Count(script.String(), "\n#")
	mkdev()
	defer rmdev()
	t0 = time.Now()
	tcCmd := exec.Command("timeout", fmt.Sprint(int(tcLimit.Seconds())), "ip", "netns", "exec", ns, "tc", "-batch", file)
	if o, err := tcCmd.CombinedOutput(); err != nil {
		r.TCNote = fmt.Sprintf("did not finish in %s (%v %s)", *tcLimit, err, benchrun.FirstLine(string(o)))
		return r
	}
	r.TCBatchS = time.Since(t0).Seconds()
	r.Speedup = r.TCBatchS / r.SluiceApplyS
	// One subscriber's rate with tc: one class change.
	var tcChanges []float64
	classes := benchrun.Output("ip", "netns", "exec", ns, "tc", "class", "show", "dev", "veth0")
	var leafClass string
	for _, l := range strings.Split(classes, "\n") {
		if strings.Contains(l, "rate 2Mbit") {
			leafClass = strings.Fields(l)[2]
			break
		}
	}
	for k := 0; k < 5 && leafClass != ""; k++ {
		t0 := time.Now()
		benchrun.Must("ip", "netns", "exec", ns, "tc", "class", "change", "dev", "veth0", "classid", leafClass,
			"htb", "rate", fmt.Sprintf("%dmbit", 3+k), "ceil", "20mbit")
		tcChanges = append(tcChanges, float64(time.Since(t0).Microseconds())/1000)
	}
	r.TCChangeMs = median(tcChanges)
	return r
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[len(xs)/2]
}
