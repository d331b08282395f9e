package e2e

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sluice/conform"
	"sluice/features"
	"sluice/policy/gen"
	"sluice/records"
	"sluice/testutil"
)

// genRange is the generated policies a run covers: SLUICE_GEN_SEED
// (default 1) and SLUICE_GEN_N of them (default 4: a fixed seed in CI;
// `make fuzz-policies SEED=... N=...` runs more).
func genRange(t *testing.T) (uint64, int) {
	seed, n := uint64(1), 4
	if s := os.Getenv("SLUICE_GEN_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_GEN_SEED=%q: %v", s, err)
		}
		seed = v
	}
	if s := os.Getenv("SLUICE_GEN_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("SLUICE_GEN_N=%q: want a count", s)
		}
		n = v
	}
	return seed, n
}

// genOptions makes policies of what this kernel has: the leaves it
// builds.
func genOptions(t *testing.T) gen.Options {
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	// backend edt where the kernel has fq (the lane's kernels).
	o := gen.Options{Interfaces: []string{"eth0", "eth1"}, Leaves: []string{"auto", "none", "pfifo", "bfifo"}, NoU32Mark: !rep.U32Mark, EDT: rep.Qdiscs["fq"]}
	for _, q := range []string{"fq_codel", "sfq", "cake", "fq"} {
		if rep.Qdiscs[q] {
			o.Leaves = append(o.Leaves, q)
		}
	}
	return o
}

// Generated policies (policy/gen: every match key, leaf, per_host form,
// nesting, weights, default placement, direction, classifier and, where
// the kernel has fq, backend edt) on the real
// kernel: each applies; a second plan has no changes; its export, run
// by tc in a second namespace, builds the same qdiscs and classes (and
// filters, where no tree classifies in BPF, whose export is u32); and
// the first policy's trees pass conformance's "each alone" cells for up
// to three subjects per tree. A failing policy is printed shrunk.
func TestGeneratedPolicies(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	first, n := genRange(t)
	o := genOptions(t)
	for s := first; s < first+uint64(n); s++ {
		p := gen.New(rand.New(rand.NewPCG(s, 0)), o)
		if msg := applyExportCompare(t, p); msg != "" {
			small := gen.Shrink(p, func(q *gen.Policy) bool { return applyExportCompare(t, q) != "" })
			t.Fatalf("seed %d: %s\npolicy:\n%s\nshrunk to:\n%s\nwhich fails with: %s", s, msg, p.YAML(), small.YAML(), applyExportCompare(t, small))
		}
	}
	p := gen.New(rand.New(rand.NewPCG(first, 0)), o)
	conformAlone(t, p)
}

// applyExportCompare applies p in a fresh namespace and checks what the
// property test asserts; "" when it holds.
func applyExportCompare(t *testing.T, p *gen.Policy) string {
	t.Helper()
	file := writeGenerated(t, "gen.yaml", p)
	applied, exported := devNS(t, "eth0", "eth1"), devNS(t, "eth0", "eth1")
	if r := sluice(t, "--netns", applied, "apply", "-q", file); r.code != 0 {
		return "apply: " + r.stderr
	}
	if r := sluice(t, "--netns", applied, "plan", file); r.code != 0 || r.stdout != "no changes\n" {
		return "the plan after apply: " + r.stdout + r.stderr
	}
	// A backend edt tree, a policer and a hosts_file behind match rules
	// have no tc equivalent: export refuses them (exit 2, naming each),
	// and --partial writes the rest: the other trees compared alone, the
	// qdiscs and classes of a tree classified in BPF.
	edt := map[string]bool{}
	var refused []string
	for _, ifc := range p.Interfaces {
		for _, d := range []struct {
			dir, dev string
			t        *gen.Tree
		}{{"egress", ifc.Name, ifc.Egress}, {"ingress", "ifb-" + ifc.Name, ifc.Ingress}} {
			switch {
			case d.t == nil:
			case d.t.Backend == "edt":
				edt[d.dev] = true
				refused = append(refused, ifc.Name+" "+d.dir+" ")
			case d.t.NoU32Equivalent():
				refused = append(refused, ifc.Name+" "+d.dir+" ")
			}
		}
	}
	args := []string{"--netns", applied, "export", file, "--format", "sh"}
	if len(refused) > 0 {
		r := sluice(t, args...)
		if r.code != 2 {
			return "export of trees with no tc equivalent: exit " + strconv.Itoa(r.code) + ", want 2 naming them: " + r.stderr
		}
		for _, name := range refused {
			if !strings.Contains(r.stderr, name) {
				return "export's refusal does not name " + name + ": " + r.stderr
			}
		}
		args = append(args, "--partial")
	}
	ex := sluice(t, args...)
	if ex.code != 0 {
		return "export: " + ex.stderr
	}
	script := filepath.Join(t.TempDir(), "export.sh")
	os.WriteFile(script, []byte(ex.stdout), 0o755)
	if out, err := exec.Command("ip", "netns", "exec", exported, "sh", script).CombinedOutput(); err != nil || len(out) > 0 {
		return "running the export: " + string(out)
	}
	devs := []string{"eth0", "eth1"}
	for _, d := range []string{"ifb-eth0", "ifb-eth1"} {
		if exec.Command("ip", "netns", "exec", applied, "ip", "link", "show", d).Run() == nil {
			devs = append(devs, d)
		}
	}
	devs = slices.DeleteFunc(devs, func(d string) bool { return edt[d] })
	bpf := false
	for _, d := range devs {
		// A direction policed in place of a tree has its program on the
		// ingress hook.
		for _, hook := range []string{"egress", "ingress"} {
			if strings.Contains(tcShow(t, applied, "filter", "show", "dev", d, hook), " bpf ") {
				bpf = true
			}
		}
	}
	var a, b string
	if bpf {
		a, b = shapes(t, applied, devs), shapes(t, exported, devs)
	} else {
		a, b = dump(t, applied, devs), dump(t, exported, devs)
	}
	if a != b {
		return "the export builds another tree:\n--- apply\n" + a + "\n--- export\n" + b
	}
	return ""
}

// writeGenerated writes p as name in a directory of its own, with the
// hosts files it names beside it.
func writeGenerated(t *testing.T, name string, p *gen.Policy) string {
	t.Helper()
	file := writePolicy(t, name, p.YAML())
	for f, body := range p.Files() {
		if err := os.WriteFile(filepath.Join(filepath.Dir(file), f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return file
}

// shapes is dump without filters and hooks: what a BPF tree and its u32
// export have in common.
func shapes(t *testing.T, ns string, devs []string) string {
	var b strings.Builder
	for _, d := range devs {
		for _, l := range strings.SplitAfter(tcShow(t, ns, "-d", "qdisc", "show", "dev", d), "\n") {
			if !strings.HasPrefix(l, "qdisc clsact") {
				b.WriteString(l)
			}
		}
		for _, l := range strings.SplitAfter(tcShow(t, ns, "-d", "class", "show", "dev", d), "\n") {
			if !flowClasses.MatchString(l) {
				b.WriteString(l)
			}
		}
	}
	return statCounters.ReplaceAllString(b.String(), "")
}

// conformAlone runs conformance's "alone" cells of p on a bed: every
// subject driven lands where the reference says, or is reported as not
// driven with why; no verdict rests on a reference of 0.
func conformAlone(t *testing.T, p *gen.Policy) {
	file := writeGenerated(t, "gen-conform.yaml", p)
	pol, err := conform.LoadPolicy(file, "")
	if err != nil {
		t.Fatal(err)
	}
	settle, measure := matrixTiming()
	// A tree's demand is its rate; a policed direction's twice its
	// committed rate (past what the meter lets through green).
	kbit := func(t *gen.Tree) float64 {
		if t.Police != nil {
			return float64(2 * t.Police.CIR)
		}
		return float64(t.Kbit)
	}
	link := map[string]float64{}
	for _, ifc := range p.Interfaces {
		if ifc.Egress != nil {
			link[ifc.Name+"/egress"] = kbit(ifc.Egress) * 1000 * matrixScale()
		}
		if ifc.Ingress != nil {
			link[ifc.Name+"/ingress"] = kbit(ifc.Ingress) * 1000 * matrixScale()
		}
	}
	cells := func(tree string, ss []*conform.Subject) []conform.Cell {
		var out []conform.Cell
		for _, s := range ss {
			if len(out) == 3 {
				break
			}
			out = append(out, conform.Cell{Name: s.Name + " alone", Demands: []conform.Demand{conform.GreedyDemand(s, 1, link[tree])}})
		}
		return out
	}
	r, err := conform.Run(context.Background(), pol, conform.Options{
		Name: strings.TrimPrefix(testutil.Unique("gp"), testutil.Prefix), Scale: matrixScale(), Hosts: 2, RTT: conform.DefaultRTT,
		Settle: settle, Measure: measure, Cells: cells,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r.WriteText(&out, false)
	t.Logf("policy:\n%s\n%s", p.YAML(), out.String())
	for _, tr := range r.Trees {
		if tr.Skipped != "" {
			continue // said why (a bed that carries under half its rate)
		}
		for _, c := range tr.Cells {
			if !c.Verdict.Pass {
				t.Errorf("%s: cell %s failed", tr.Name(), c.Name)
			}
		}
		for _, s := range tr.Subjects {
			if s.NotDriven != "" && !strings.Contains(s.NotDriven, " ") {
				t.Errorf("%s: %s not driven without a reason: %q", tr.Name(), s.Name, s.NotDriven)
			}
		}
	}
}
