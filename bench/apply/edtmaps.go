package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sluice/bench/internal/benchrun"
	"sluice/bpf"
	"sluice/bpf/bpftest"
	"sluice/engine"
	"sluice/plan"
	"sluice/policy"
)

// measureEDTMaps times what an EDT apply does beyond its handful of
// qdiscs (a root and an fq per queue, the same for 10 hosts or
// 100,000): planning the aggregates, loading the program and filling its
// maps, then one host's cap changed: planning again with the recorded
// ids and writing the one entry that differs. It runs where fq is
// missing (this project's host kernel), so the qdiscs are left out.
func measureEDTMaps(n int) result {
	dir, err := os.MkdirTemp("", "sluice-edt")
	if err != nil {
		benchrun.Fail(err)
	}
	defer os.RemoveAll(dir)
	pol := filepath.Join(dir, "p.yaml")
	hosts := filepath.Join(dir, "hosts.csv")
	os.WriteFile(pol, []byte(`interfaces:
  - name: veth0
    egress:
      rate: 10gbit
      backend: edt
      default: rest
      classes:
        - {name: voice, rate: 100mbit, prio: 0, match: [{dscp: EF}]}
        - {name: subs, rate: 9gbit, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 500mbit}
`), 0o644)
	feats := plan.Everything
	feats.TxQueues = map[string]int{"veth0": *queues}
	build := func(prev map[string]*plan.Alloc) (*plan.Plan, *bpf.Content) {
		p, _, err := policy.Load(pol)
		if err != nil {
			benchrun.Fail(err)
		}
		pl, err := plan.Build(p, feats, prev)
		if err != nil {
			benchrun.Fail(err)
		}
		h := pl.Devices[0].Hook()
		if h == nil {
			benchrun.Fail(fmt.Errorf("no program planned"))
		}
		return pl, h.Content
	}
	r := result{Backend: "edt-maps", Hosts: n, Queues: *queues, Leaf: "fq", TCNote: "program and maps only: this kernel has no fq"}
	os.WriteFile(hosts, []byte(benchrun.HostsCSVCap(n, -1)), 0o644)
	t0 := time.Now()
	pl, c := build(nil)
	prog, err := bpftest.Writable(bpf.Load(c))
	if err != nil {
		benchrun.Fail(err)
	}
	defer prog.Close()
	r.SluiceApplyS = time.Since(t0).Seconds()
	prev := map[string]*plan.Alloc{"veth0": pl.Devices[0].Alloc}
	var changes []float64
	for k := 0; k < 9; k++ {
		os.WriteFile(hosts, []byte(benchrun.HostsCSVCap(n, (k*7919)%n)), 0o644)
		t0 := time.Now()
		_, nc := build(prev)
		if err := prog.Write(nc, c); err != nil {
			benchrun.Fail(err)
		}
		changes = append(changes, float64(time.Since(t0).Microseconds())/1000)
		c = nc
	}
	r.SluiceChanges = append([]float64(nil), changes...)
	r.SluiceChangeM = median(changes)

	// The agent's path (engine.PlanHostsEdit, what Session.EditHosts
	// works out): the policy and plan in force kept, the new file read
	// and compared line by line, the one changed host's entry written in
	// place. The write goes to the program directly, where the agent's
	// goes through the executor (kernel.WriteHosts): without fq there
	// is no EDT tree for it to find the program on.
	p, _, err := policy.Load(pol)
	if err != nil {
		benchrun.Fail(err)
	}
	inForce, err := plan.Build(p, feats, prev)
	if err != nil {
		benchrun.Fail(err)
	}
	if err := prog.Write(inForce.Devices[0].Hook().Content, c); err != nil {
		benchrun.Fail(err)
	}
	old, _ := os.ReadFile(hosts)
	var edits []float64
	for k := 0; k < 9; k++ {
		os.WriteFile(hosts, []byte(benchrun.HostsCSVCap(n, (k*104729+1)%n)), 0o644)
		t0 := time.Now()
		data, err := os.ReadFile(hosts)
		if err != nil {
			benchrun.Fail(err)
		}
		ed, ok, err := engine.PlanHostsEdit(p, inForce, []engine.HostsChange{{File: hosts, Old: old, New: data}})
		if err != nil || !ok || ed.Hosts() == 0 {
			benchrun.Fail(fmt.Errorf("hosts edit not taken in place: ok %v, %v", ok, err))
		}
		for _, w := range ed.Writes() {
			if err := prog.SwapHosts(w.Old, w.New, nil); err != nil {
				benchrun.Fail(err)
			}
		}
		ed.Commit()
		edits = append(edits, float64(time.Since(t0).Microseconds())/1000)
		old = data
	}
	r.SluiceEdits = edits
	r.SluiceEditM = median(edits)
	return r
}
