package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/conform"
	"sluice/features"
	"sluice/records"
	"sluice/testutil"
)

// The conformance matrix (docs/sharing.md, Conformance): data planes x
// leaves x shapes, every cell measured against the weighted max-min
// reference. A cell passes within conform.Tolerance, or fails where the
// kernel cannot do what the policy asks and plan said so beforehand (a
// limit: the note that must be in the tree's plan notes).
//
// The shapes, each on a device of its own in one policy:
//   - w0: weights 1:2:4 (by rate) beside a default class 40x lighter than
//     the lightest, four flows each; then the default class busy too.
//   - h0: 8 hosts of a per_host class, one with 8 flows; one host alone.
//   - p0: a class of prio 0 under load beside a bulk class.
//   - g0: hosts of a hosts_file, three of them in a group (a groups_file:
//     a Kubernetes namespace's aggregate) with a guarantee and a cap,
//     one in another group, two on their own; all busy, then the
//     capped group's hosts alone, one with 8 flows.
//   - s0 (sharded plane only): hosts of a /24 with ceils of rate/4 on a
//     4-queue device; one active host against ten on other shards.
type matrixShape struct {
	dev, policy string
	files       map[string]string // written beside the policy
	cells       func(ss []*conform.Subject) []conform.Cell
	limits      map[string]string // cell -> the plan note that explains its deviation
}

func tcpDemands(ss []*conform.Subject, flows int, names ...string) []conform.Demand {
	var out []conform.Demand
	for _, n := range names {
		for _, s := range ss {
			if s.Name == n {
				out = append(out, conform.Demand{Subject: n, Proto: "tcp", Flows: flows})
			}
		}
	}
	return out
}

func hostNames(ss []*conform.Subject, prefix string) []string {
	var out []string
	for _, s := range ss {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s.Name)
		}
	}
	return out
}

var matrixShapes = map[string]matrixShape{
	"weights": {dev: "w0", policy: `
  - name: w0
    egress:
      rate: 21mbit
      default: d{{opts}}
      classes:
        - {name: a, rate: 1mbit, ceil: 21mbit, match: [{proto: tcp, dport: 5001}]}
        - {name: b, rate: 2mbit, ceil: 21mbit, match: [{proto: tcp, dport: 5002}]}
        - {name: c, rate: 4mbit, ceil: 21mbit, match: [{proto: tcp, dport: 5003}]}
        - {name: d, rate: 25kbit, ceil: 21mbit}
`, cells: func(ss []*conform.Subject) []conform.Cell {
		return []conform.Cell{
			{Name: "weights 1:2:4, 4 flows each, default idle", Demands: tcpDemands(ss, 4, "a", "b", "c")},
			{Name: "weights 1:2:4 and the default, 1 flow each", Demands: tcpDemands(ss, 1, "a", "b", "c", "d")},
		}
	}, limits: map[string]string{"weights 1:2:4 and the default, 1 flow each": "less than 1/15 of the heaviest sibling's"}},
	"hosts": {dev: "h0", policy: `
  - name: h0
    egress:
      rate: 20mbit
      default: other{{opts}}
      classes:
        - name: users
          rate: 19mbit
          per_host: {by: dst, cidr: 10.20.0.0/24, ceil: 20mbit}
        - name: other
          rate: 1mbit
`, cells: func(ss []*conform.Subject) []conform.Cell {
		hs := hostNames(ss, "users/")
		if len(hs) > 8 {
			hs = hs[:8]
		}
		heavy := tcpDemands(ss, 1, hs...)
		heavy[0].Flows = 8
		return []conform.Cell{
			{Name: "8 hosts, one with 8 flows", Demands: heavy},
			{Name: "one host alone", Demands: tcpDemands(ss, 1, hs[0])},
		}
	}},
	"prio": {dev: "p0", policy: `
  - name: p0
    egress:
      rate: 20mbit
      default: bulk{{opts}}
      classes:
        - {name: rt, rate: 2mbit, prio: 0, match: [{proto: tcp, dport: 22}]}
        - {name: bulk, rate: 8mbit, prio: 1}
`, cells: func(ss []*conform.Subject) []conform.Cell {
		return []conform.Cell{{Name: "prio 0 under load", Demands: tcpDemands(ss, 2, "rt", "bulk")}}
	}},
	"groups": {dev: "g0", policy: `
  - name: g0
    egress:
      rate: 20mbit
      default: other{{opts}}
      classes:
        - name: users
          rate: 19mbit
          per_host: {by: dst, hosts_file: g0-hosts.csv, groups_file: g0-groups.csv, rate: 1mbit}
        - name: other
          rate: 1mbit
`, files: map[string]string{
		"g0-hosts.csv": "name,addresses,rate,ceil,parent\na1,10.22.0.2,,,acme\na2,10.22.0.3,,,acme\na3,10.22.0.4,,,acme\nb1,10.22.0.5,,,beta\nc1,10.22.0.6,,,\nc2,10.22.0.7,,,\n",
		// acme: a namespace guaranteed 4 Mbit/s, capped at 6; beta
		// guaranteed 4, uncapped.
		"g0-groups.csv": "name,rate,ceil\nacme,4mbit,6mbit\nbeta,4mbit,\n",
	}, cells: func(ss []*conform.Subject) []conform.Cell {
		acme := tcpDemands(ss, 1, "users/a1", "users/a2", "users/a3")
		acme[0].Flows = 8
		return []conform.Cell{
			{Name: "groups and hosts, 1 flow each", Demands: tcpDemands(ss, 1, hostNames(ss, "users/")...)},
			{Name: "a capped group alone, one host with 8 flows", Demands: acme},
		}
	}},
	"shards": {dev: "s0", policy: `
  - name: s0
    egress:
      rate: 20mbit
      classifier: bpf
      shards: 4
      default: other{{opts}}
      classes:
        - name: users
          rate: 19mbit
          per_host: {by: dst, cidr: 10.21.0.0/24, ceil: 20mbit}
        - name: other
          rate: 1mbit
`, cells: func(ss []*conform.Subject) []conform.Cell {
		// One host alone on its shard, ten on the others.
		var one *conform.Subject
		var ten []string
		for _, s := range ss {
			switch {
			case s.Shard == 0:
			case one == nil:
				one = s
			case s.Shard != one.Shard && len(ten) < 10:
				ten = append(ten, s.Name)
			}
		}
		if one == nil || len(ten) < 10 {
			return nil
		}
		return []conform.Cell{
			{Name: "one host against ten on other shards", Demands: tcpDemands(ss, 1, append([]string{one.Name}, ten...)...)},
			{Name: "one host alone", Demands: tcpDemands(ss, 1, one.Name)},
		}
	}},
}

// matrixRow is one cell of the matrix, for docs/sharing.md.
type matrixRow struct {
	Kernel, Plane, Leaf, Shape, Cell string
	Worst                            float64
	Pass, Limit                      bool
	Why                              string
}

func TestConformanceMatrix(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	testutil.Quiet(t)
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	feats := rep.Features()
	type plane struct {
		name, backend string
		leaves        []string
		shapes        []string
		queues        int
	}
	planes := []plane{
		{"htb", "htb", []string{"auto", "bfifo", "fq_codel", "cake"}, []string{"weights", "hosts", "prio", "groups"}, 1},
		{"htb sharded", "htb", []string{"auto", "bfifo", "fq_codel", "cake"}, []string{"shards"}, 4},
		{"htb controller", "htb", []string{"auto"}, []string{"weights"}, 1},
		{"edt", "edt", []string{""}, []string{"weights", "hosts", "prio"}, 4},
		{"edt controller", "edt", []string{""}, []string{"weights"}, 4},
	}
	// What EDT does not do, and says (docs/edt.md): share the direction
	// by weight or host without the controller, guarantee nonprod rates
	// beside greedy prod.
	edtPool := "the aggregates' caps add up to more than the direction's"
	limitFor := func(plane string, sh matrixShape, cell string) string {
		switch {
		case plane == "edt" && sh.dev == "p0":
			return "prod aggregates (prio 0) never wait for the others"
		case plane == "edt" && cell != "one host alone":
			return edtPool
		case strings.HasSuffix(plane, "controller"):
			return "" // what quanta and EDT cannot do, the controller does
		}
		return sh.limits[cell]
	}
	auto := "bfifo"
	for _, l := range []string{"fq_codel", "sfq"} {
		if feats.Qdiscs[l] {
			auto = l
			break
		}
	}
	// The whole matrix runs with SLUICE_MATRIX_FULL=1. Otherwise a leaf
	// that is not this kernel's auto runs where it is (bfifo runs on the
	// host, cake in the lane), and a sharded tree's shards are shown on
	// one leaf: the lane keeps to its time budget.
	full := os.Getenv("SLUICE_MATRIX_FULL") == "1"
	var (
		rowsMu sync.Mutex
		rows   []matrixRow
	)
	// The planes' beds are each their own namespaces, at 20 Mbit/s: on
	// a real machine they run at once (a few % of a CPU each; the
	// shares read as they do alone), under emulation one at a time.
	// The table is written when the last has ended.
	t.Cleanup(func() {
		if out := os.Getenv("SLUICE_MATRIX_OUT"); out != "" && len(rows) > 0 {
			sort.SliceStable(rows, func(i, j int) bool { return rows[i].Plane < rows[j].Plane })
			b, _ := json.MarshalIndent(rows, "", "  ")
			if err := os.WriteFile(filepath.Join(out, fmt.Sprintf("matrix-%s.json", rep.Kernel)), b, 0o644); err != nil {
				t.Error(err)
			}
		}
	})
	for _, pl := range planes {
		for _, leaf := range pl.leaves {
			if leaf == auto {
				continue // auto is this leaf here: the same cells
			}
			if !full && (leaf == "bfifo" || pl.name == "htb sharded" && leaf != "auto") {
				continue
			}
			name := pl.name
			if leaf != "" {
				name += "/" + leaf
			}
			pl, leaf := pl, leaf
			t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
				switch {
				case leaf != "" && leaf != "auto":
					testutil.NeedFeature(t, leaf, feats.Qdiscs[leaf])
				case pl.backend == "edt":
					testutil.NeedFeature(t, "fq", feats.Qdiscs["fq"])
				}
				if os.Getenv("SLUICE_EMULATED") != "1" {
					t.Parallel()
				}
				var src strings.Builder
				src.WriteString("interfaces:")
				opts := ""
				if leaf != "" {
					opts = "\n      leaf: " + leaf
				}
				if pl.backend == "edt" {
					opts = "\n      backend: edt"
				}
				if strings.HasSuffix(pl.name, "controller") {
					opts += "\n      sharing: controller"
				}
				byTree := map[string]matrixShape{}
				for _, sh := range pl.shapes {
					s := matrixShapes[sh]
					p := strings.ReplaceAll(s.policy, "{{opts}}", opts)
					if pl.backend == "edt" {
						p = strings.ReplaceAll(p, "      classifier: bpf\n      shards: 4\n", "")
					}
					src.WriteString(p)
					byTree[s.dev+"/egress"] = s
				}
				file := writePolicy(t, "matrix.yaml", src.String())
				for _, sh := range pl.shapes {
					for name, data := range matrixShapes[sh].files {
						if err := os.WriteFile(filepath.Join(filepath.Dir(file), name), []byte(data), 0o644); err != nil {
							t.Fatal(err)
						}
					}
				}
				pol, err := conform.LoadPolicy(file, "")
				if err != nil {
					t.Fatalf("%v\n%s", err, src.String())
				}
				settle, measure := matrixTiming()
				r, err := conform.Run(context.Background(), pol, conform.Options{
					Name: strings.TrimPrefix(testutil.Unique("cm"), testutil.Prefix), Queues: pl.queues, Scale: matrixScale(), Hosts: 16, RTT: conform.DefaultRTT,
					Settle: settle, Measure: measure,
					Cells: func(tree string, ss []*conform.Subject) []conform.Cell { return byTree[tree].cells(ss) },
					Limit: func(tree, cell string) string { return limitFor(pl.name, byTree[tree], cell) },
				})
				if err != nil {
					t.Fatal(err)
				}
				var out strings.Builder
				r.WriteText(&out, false)
				t.Logf("\n%s", out.String())
				for _, tr := range r.Trees {
					if tr.Efficiency > 0 {
						t.Logf("%s: headroom: a plain limit at the tree's rate carried %.1f%% of it on this bed", tr.Name(), 100*tr.Efficiency)
					}
				}
				for _, tr := range r.Trees {
					shape := ""
					for k, s := range matrixShapes {
						if s.dev == tr.Interface {
							shape = k
						}
					}
					if tr.Skipped != "" {
						t.Errorf("%s: skipped: %s", tr.Name(), tr.Skipped)
						continue
					}
					if len(tr.Cells) == 0 {
						t.Errorf("%s: no cells ran", tr.Name())
					}
					checkCellRTTs(t, tr)
					for _, c := range tr.Cells {
						row := matrixRow{Kernel: r.Kernel, Plane: pl.name, Leaf: strings.Join(tr.Leaves, ","), Shape: shape, Cell: c.Name,
							Worst: c.Verdict.Worst, Pass: c.Verdict.Pass, Why: c.Verdict.Why}
						if pl.backend == "edt" {
							row.Leaf = "fq"
						}
						if !c.Verdict.Pass {
							if c.Limit != "" {
								row.Limit = true
							} else {
								t.Errorf("%s: %s: %s (worst %.1f%%)", tr.Name(), c.Name, c.Verdict.Why, 100*c.Verdict.Worst)
							}
						}
						rowsMu.Lock()
						rows = append(rows, row)
						rowsMu.Unlock()
					}
				}
			})
		}
	}
}

// checkCellRTTs holds a tree's cells' round trips to the bed: on a tree
// sluice's BPF program classifies, a class whose TCP flows carried
// something timed their round trips, at least the bed's propagation (its
// delay line each way: conform.DefaultRTT) at the median; UDP is never
// timed, nor a tree u32 classifies (the run adds no work to its
// packets). (A per_host class's hosts have their figures per host,
// which a cell does not read: "-".)
func checkCellRTTs(t *testing.T, tr *conform.TreeReport) {
	t.Helper()
	if tr.Classifier != "bpf" {
		for _, c := range tr.Cells {
			for _, s := range c.Verdict.Subjects {
				if s.RTT != nil {
					t.Errorf("%s (%s classifier): %s: %s timed round trips: %+v", tr.Name(), tr.Classifier, c.Name, s.Name, s.RTT)
				}
			}
		}
		return
	}
	timed := 0
	for _, c := range tr.Cells {
		protos := map[string]string{}
		for _, d := range c.Demands {
			protos[d.Subject] = d.Proto
		}
		for _, s := range c.Verdict.Subjects {
			switch {
			case s.RTT == nil:
			case protos[s.Name] != "tcp":
				t.Errorf("%s: %s: %s (%s) timed round trips: %+v", tr.Name(), c.Name, s.Name, protos[s.Name], s.RTT)
			case s.RTT.P50 > 0 && (s.RTT.P50 < 0.8*conform.DefaultRTT.Seconds() || s.RTT.P95 < s.RTT.P50):
				t.Errorf("%s: %s: %s: round trips p50 %.2f / p95 %.2f ms, below the bed's %v", tr.Name(), c.Name, s.Name,
					1000*s.RTT.P50, 1000*s.RTT.P95, conform.DefaultRTT)
			default:
				timed++
			}
		}
	}
	tcp := false
	for _, c := range tr.Cells {
		for _, d := range c.Demands {
			tcp = tcp || d.Proto == "tcp" && !strings.Contains(d.Subject, "/")
		}
	}
	if tcp && timed == 0 {
		t.Errorf("%s: no class's TCP flows had their round trips timed", tr.Name())
	}
}

// matrixTiming is how long each matrix cell settles and is measured:
// the command's own 2 s and 3 s on a real machine; 3 s and 5 s under
// emulation, whose late timers make short windows noisy.
func matrixTiming() (settle, measure time.Duration) {
	if os.Getenv("SLUICE_EMULATED") == "1" {
		return 3 * time.Second, 5 * time.Second
	}
	return 2 * time.Second, 3 * time.Second
}

// matrixScale is what the matrix multiplies the shapes' rates by: 1 on
// a real machine; under emulation (the stock-kernel lane on TCG, whose
// timers fire late) a quarter, so that the guest carries every cell with
// room to spare on a slow CI machine too. At full rates a plain limit's
// own run there carried 88 to 98% from one run to the next; at half, on
// a machine whose guest hashed 16 MB in 0.9 to 1.1 s (the lane's speed
// line), 88 to 96%, first windows read up to 22% from the reference and
// cells failed at 6 to 38% after a second look twice as long, in two runs
// of two; at a quarter, on the same machine, 96 to 100%, and every cell
// passed (2026-12-02). The headroom is logged per tree.
func matrixScale() float64 {
	if os.Getenv("SLUICE_EMULATED") == "1" {
		return 0.25
	}
	return 1
}

// A bed that cannot be built (a policy for lo) says why and leaves no
// namespace behind (its teardown once ran on the nil bed and panicked).
func TestConformanceBedFailureLeavesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	file := writePolicy(t, "lo.yaml", "interfaces:\n  - name: lo\n    egress: {rate: 10mbit}\n")
	pol, err := conform.LoadPolicy(file, "")
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(testutil.Unique("cf"), testutil.Prefix)
	_, err = conform.Run(context.Background(), pol, conform.Options{Name: name, Settle: time.Second, Measure: time.Second})
	if err == nil || !strings.Contains(err.Error(), "lo cannot be shaped") {
		t.Errorf("a bed for lo: %v", err)
	}
	if left := labNamespaces(t, "sllab-"+name+"-"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
