package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sluice/conform"
	"sluice/testutil"
)

// exampleRuns says, for every policy in examples/, how CI measures what
// its comments promise (one way or more, comma-separated): "conformance" (TestExamplesConform, every cell
// against the weighted max-min reference), "caps" (the same on a kernel
// with fq: each class and host alone gets its ceil, the EDT backend's
// promise, which shares by caps, not weights), or the test that runs
// it in the lab.
var exampleRuns = map[string]string{
	"office.yaml":   "TestOfficeExample",
	"per-user.yaml": "conformance",
	"sharing.yaml":  "conformance",
	"police.yaml":   "conformance",
	"ipv6.yaml":     "TestIPv6ExampleClassifies",
	// Its promise is latency on a slow line: the lab's wondershaper
	// scenario. Conformance at its 220 kbit/s passes every cell (0.0 to
	// 0.5%) but takes seven minutes: its shares need 89 s windows to hold
	// enough packets (docs/sharing.md).
	"wondershaper.yaml": "TestWondershaperExample",
	"isp.yaml":          "conformance",
	"edt.yaml":          "caps",
	// The variable-rate scenario's auto variant is this policy on the
	// lab's link (its device wan, its reflector, a 5 ms threshold).
	"lte.yaml":     "TestVariableRateScenario",
	"isp-edt.yaml": "caps",
	// Pods on a routed CNI's node, each capped on its veth.
	"k8s-veths.yaml": "TestKubernetesPodVeths",
}

// A new example without a run that checks it fails here.
func TestEveryExampleIsMeasured(t *testing.T) {
	files, err := filepath.Glob("../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		if _, ok := exampleRuns[filepath.Base(f)]; !ok {
			t.Errorf("%s: no lab or conformance run checks it (exampleRuns)", f)
		}
	}
	for name := range exampleRuns {
		if !slices.Contains(files, "../examples/"+name) {
			t.Errorf("exampleRuns names %s, which examples/ does not have", name)
		}
	}
}

// Every HTB example shares as the reference says, in every cell
// conformance draws for it, on the host's kernel.
//
// Two at a time (the test beds are each their own namespaces): two runs
// keep the host suite's time (155 s; alone, 270). Four at once took 80
// s, but the machine was then too busy for a policer: isp.yaml's
// guests (one TCP flow through a 2 Mbit/s policer, at a tenth) read
// 11.5% off the reference, 0.7% alone (2026-11-28).
func TestExamplesConform(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	order := []string{"sharing.yaml", "police.yaml", "per-user.yaml", "isp.yaml"}
	if got := examplesMeasuredBy("conformance"); !slices.Equal(slices.Sorted(slices.Values(order)), got) {
		t.Fatalf("order %v lists other examples than exampleRuns %v", order, got)
	}
	const parallel = 2
	slots := make(chan struct{}, parallel)
	for _, name := range order {
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			t.Parallel()
			slots <- struct{}{}
			defer func() { <-slots }()
			conformExample(t, name, parallel, nil)
		})
	}
}

// The EDT examples, on a kernel with fq (the lane), give each class and
// host alone its ceil: the EDT backend shares by caps, not by weights
// (plan says so), and its examples promise the caps.
func TestEDTExamplesHoldTheirCaps(t *testing.T) {
	testutil.RequireRoot(t)
	needFq(t)
	alone := func(_ string, ss []*conform.Subject) []conform.Cell {
		var cells []conform.Cell
		for _, s := range ss {
			cells = append(cells, conform.Cell{Name: s.Name + " alone", Demands: []conform.Demand{{Subject: s.Name, Proto: "tcp", Flows: 1}}})
		}
		return cells
	}
	for _, name := range examplesMeasuredBy("caps") {
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) { conformExample(t, name, 1, alone) })
	}
}

func examplesMeasuredBy(how string) []string {
	var names []string
	for name, h := range exampleRuns {
		if slices.Contains(strings.Split(h, ", "), how) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// conformExample runs conformance on examples/NAME (cells: the default
// demand patterns when nil) and fails the test unless every cell passed.
func conformExample(t *testing.T, name string, parallel int, cells func(string, []*conform.Subject) []conform.Cell) {
	t.Helper()
	testutil.Quiet(t)
	pol, err := conform.LoadPolicy("../examples/"+name, "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := conform.Run(context.Background(), pol, conform.Options{
		Name: strings.TrimPrefix(testutil.Unique("ex"), testutil.Prefix), RTT: conform.DefaultRTT, Hosts: 4, Cells: cells,
		Parallel: parallel,
		// Shorter than the command's 2 s and 3 s, for nine examples;
		// a share whose window would hold too few packets is measured
		// longer (conform.Window).
		Settle: time.Second, Measure: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r.WriteText(&out, true)
	ran := 0
	for _, tr := range r.Trees {
		ran += len(tr.Cells)
	}
	if !r.Pass || ran == 0 {
		// Every subject of every cell, and a cell measured twice, so
		// that a failure shows what each got (the brief table hides it).
		out.Reset()
		r.WriteText(&out, false)
		t.Fatalf("examples/%s: %d cells, not every one within the reference:\n%s", name, ran, out.String())
	}
	t.Logf("\n%s", out.String())
}

// examples/ipv6.yaml promises classes by IPv6 prefix and port, both
// families where a rule names no address: random IPv4 and IPv6 packets
// (its prefixes, others, its ports) land where its rules say, with the
// u32 and the BPF classifier. (Conformance drives IPv4 flows only.)
func TestIPv6ExampleClassifies(t *testing.T) {
	light(t)
	b, err := os.ReadFile("../examples/ipv6.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pol := strings.Replace(string(b), "name: eth0", "name: veth0", 1)
	for _, c := range []string{"u32", "bpf"} {
		t.Run(c, func(t *testing.T) { craftedPackets(t, c, pol, []string{"voip", "ssh", "web", "other"}) })
	}
}
