package gen_test

import (
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/plan"
	"sluice/policy"
	"sluice/policy/gen"
)

var (
	seed = flag.Uint64("seed", 1, "the first policy's seed")
	n    = flag.Int("policies", 300, "how many policies")
)

// parsePlan is what every generated policy must pass without root:
// validation (no errors) and a plan for a kernel with everything. The
// files it names are written beside it in dir.
func parsePlan(dir string, p *gen.Policy) error {
	for name, body := range p.Files() {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	pol, _, err := policy.Parse(filepath.Join(dir, "gen.yaml"), []byte(p.YAML()))
	if err != nil {
		return err
	}
	_, err = plan.Build(pol, plan.Everything, nil)
	return err
}

// Every generated policy validates and plans; a failure is shrunk to the
// smallest policy that still fails.
func TestGeneratedPoliciesValidateAndPlan(t *testing.T) {
	o := gen.Options{Interfaces: []string{"eth0", "eth1"}, Leaves: []string{"auto", "none", "pfifo", "bfifo", "fq_codel", "sfq", "cake", "fq"}, EDT: true}
	for s := *seed; s < *seed+uint64(*n); s++ {
		p := gen.New(rand.New(rand.NewPCG(s, 0)), o)
		check := func(q *gen.Policy) error { return parsePlan(t.TempDir(), q) }
		if err := check(p); err != nil {
			small := gen.Shrink(p, func(q *gen.Policy) bool { return check(q) != nil })
			t.Fatalf("seed %d: %v\nshrunk to:\n%s\nfiles: %v\nerror: %v", s, err, small.YAML(), small.Files(), check(small))
		}
	}
}

// The generator reaches what the grammar has: each key, leaf and form
// appears in a run's policies.
func TestGeneratorCoversTheGrammar(t *testing.T) {
	o := gen.Options{Interfaces: []string{"eth0"}, Leaves: []string{"auto", "none", "pfifo", "bfifo", "fq_codel", "sfq", "cake", "fq"}, EDT: true}
	var all strings.Builder
	for s := uint64(0); s < 200; s++ {
		p := gen.New(rand.New(rand.NewPCG(s, 0)), o)
		all.WriteString(p.YAML())
		for _, f := range p.Files() {
			all.WriteString(f)
		}
	}
	for _, want := range []string{"src: ", "dst: ", "not_src: ", "not_dst: ", "sport: ", "dport: ", "proto: tcp", "proto: udp", "proto: icmp",
		"proto: icmpv6", "dscp: ", "tos: ", "tcp_ack: true", "tcp_syn: true", "weight: ", "mark: ", "leaf: fq_codel", "leaf: none", "leaf: bfifo", "per_host:", "prefix: 60",
		"by: src", "ingress:", "classifier: bpf", "hosts_file: ", ",2001:db8:", "kbit,\n", "groups_file: ", ",parent\n", "name,rate,ceil\n",
		"police: {", "pir: ", "ebs: ", "mode: aware", "red: remark:", "yellow: drop", "      police: {", "classifier: u32", "backend: edt", "ceil: ", "prio: 7", "          classes:\n"} {
		if !strings.Contains(all.String(), want) {
			t.Errorf("no policy of 200 has %q", want)
		}
	}
}

// Shrink finds a small policy that keeps a property failing.
func TestShrink(t *testing.T) {
	o := gen.Options{Interfaces: []string{"eth0", "eth1"}}
	for s := uint64(0); s < 50; s++ {
		p := gen.New(rand.New(rand.NewPCG(s, 0)), o)
		if !strings.Contains(p.YAML(), "dport: 443") {
			continue
		}
		small := gen.Shrink(p, func(q *gen.Policy) bool { return strings.Contains(q.YAML(), "dport: 443") })
		y := small.YAML()
		if !strings.Contains(y, "dport: 443") || strings.Count(y, "- name: c") > 3 || strings.Count(y, "  - name: eth") != 1 {
			t.Fatalf("seed %d shrunk to:\n%s", s, y)
		}
		return
	}
	t.Fatal("no policy with dport: 443 in 50 seeds")
}
