package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sluice/testutil"
)

// crashPolicy shards 254 subscribers over a 4-queue device (mq, four
// HTBs, the BPF classifier) and shapes its ingress on an ifb with u32
// rules: every kind of object apply makes.
func crashPolicy(t *testing.T, hostRate string) string {
	return writePolicy(t, "crash-"+hostRate+".yaml", `interfaces:
  - name: eth0
    egress:
      rate: 100mbit
      classifier: bpf
      shards: 4
      default: rest
      classes:
        - name: subs
          rate: 80mbit
          per_host: {by: dst, cidr: 10.7.0.0/24, rate: `+hostRate+`, ceil: 50mbit}
        - name: rest
          rate: 10mbit
    ingress:
      rate: 50mbit
      default: bulk
      classes:
        - name: ssh
          rate: 10mbit
          prio: 0
          match:
            - dport: 22
            - sport: 22
        - name: bulk
          rate: 30mbit
`)
}

// multiQueueNS is a namespace with eth0, a veth of four transmit queues.
func multiQueueNS(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	ns := testutil.NewNetns(t, "k")
	testutil.NS(t, ns, "ip", "link", "add", "eth0", "numtxqueues", "4", "numrxqueues", "4", "type", "veth",
		"peer", "name", "eth0p", "numtxqueues", "4", "numrxqueues", "4")
	testutil.NS(t, ns, "ip", "link", "set", "eth0", "up")
	testutil.NS(t, ns, "ip", "link", "set", "eth0p", "up")
	return ns
}

var stateNoise = []struct {
	re  *regexp.Regexp
	out string
}{
	{regexp.MustCompile(`r2q \d+`), "r2q TAG"},                  // each tree's random tag
	{regexp.MustCompile(`orphan_mask \d+`), "orphan_mask TAG"},  // an EDT tree's, in its fq
	{regexp.MustCompile(`direct_packets_stat \d+`), ""},         // counters
	{regexp.MustCompile(` id \d+`), " id N"},                    // BPF program ids
	{regexp.MustCompile(`\b8[0-9a-f]{2}:`), "8xx:"},             // u32 tables the kernel numbers
	{regexp.MustCompile(`\bht 8[0-9a-f]{2}\b`), "ht 8xx"},       //
	{regexp.MustCompile(`\bsluice_[0-9a-f]+\b`), "sluice_PROG"}, // program names
}

// flowClasses are the classes fq_codel, sfq and cake show for the flows
// they hold at the moment: traffic, not configuration.
var flowClasses = regexp.MustCompile(`^class (fq_codel|sfq|cake|fq) `)

// kernelState is everything ip and tc show of the namespace's devices,
// without counters, kernel-chosen ids and tree tags: two namespaces
// built the same way read the same.
func kernelState(t *testing.T, ns string) string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(testutil.NS(t, ns, "ip", "-o", "link", "show")), "\n") {
		f := strings.Fields(l)
		dev := strings.TrimSuffix(strings.Split(f[1], "@")[0], ":")
		out = append(out, "link "+dev)
		for _, what := range [][]string{{"qdisc", "show", "dev", dev}, {"class", "show", "dev", dev},
			{"filter", "show", "dev", dev}, {"filter", "show", "dev", dev, "ingress"}, {"filter", "show", "dev", dev, "egress"}} {
			for _, line := range strings.Split(testutil.NS(t, ns, "tc", what...), "\n") {
				line = strings.TrimSpace(line)
				for _, n := range stateNoise {
					line = n.re.ReplaceAllString(line, n.out)
				}
				if line != "" && !flowClasses.MatchString(line) {
					out = append(out, dev+": "+line)
				}
			}
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// killed runs the fault-injecting sluice, which must die by SIGKILL at
// fault (or, for a point past its last write, finish).
func killed(t *testing.T, fault string, args ...string) result {
	t.Helper()
	return runSluice(t, faultBin, []string{"SLUICE_STATE_DIR=" + stateDir(t), "SLUICE_FAULTS=" + fault}, args...)
}

func sameState(t *testing.T, what, want, got string) {
	t.Helper()
	if want == got {
		return
	}
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	ws, gs := map[string]bool{}, map[string]bool{}
	for _, l := range w {
		ws[l] = true
	}
	for _, l := range g {
		gs[l] = true
	}
	var diff []string
	for _, l := range w {
		if !gs[l] {
			diff = append(diff, "- "+l)
		}
	}
	for _, l := range g {
		if !ws[l] {
			diff = append(diff, "+ "+l)
		}
	}
	if len(diff) > 30 {
		diff = append(diff[:30], fmt.Sprintf("... %d more", len(diff)-30))
	}
	t.Fatalf("%s: the kernel is not as it should be (%d vs %d lines):\n%s", what, len(w), len(g), strings.Join(diff, "\n"))
}

var writesRE = regexp.MustCompile(`applied: \d+ change\(s\), (\d+) netlink write\(s\)`)

// TestKilledApplyIsRecovered kills apply at many points of a first
// apply, of an incremental one and of a reset, and checks that the next
// plain apply (of the new policy, or of the old one) or reset makes the
// kernel exactly what an undisturbed run makes, without --force.
func TestKilledApplyIsRecovered(t *testing.T) {
	testutil.Slow(t)
	light(t)
	rate1 := crashPolicy(t, "200kbit")
	// References, from undisturbed runs.
	ref := multiQueueNS(t)
	pristine := kernelState(t, ref)
	out := must(t, "--netns", ref, "apply", "-q", rate1)
	m := writesRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("apply: %s", out)
	}
	var total int
	fmt.Sscan(m[1], &total)
	if total < 500 {
		t.Fatalf("the policy takes %d writes; the test wants several sends of %d", total, 256)
	}
	want1 := kernelState(t, ref)
	if !strings.Contains(want1, "qdisc mq 1: root") || !strings.Contains(want1, "ifb-eth0") {
		t.Fatalf("reference tree lacks mq or the ifb:\n%.2000s", want1)
	}
	must(t, "--netns", ref, "reset", "--all")
	sameState(t, "reference reset", pristine, kernelState(t, ref))

	first := []string{"kill-at=after-journal", "kill-at-write=1", "kill-at-write=2", "kill-at-write=7",
		"kill-at-write=256", "kill-at-write=257", "kill-at-write=300", fmt.Sprintf("kill-at-write=%d", total/2),
		fmt.Sprintf("kill-at-write=%d", total-1), fmt.Sprintf("kill-at-write=%d", total), "kill-at=before-commit"}
	for i, fault := range first {
		t.Run("first/"+fault, func(t *testing.T) {
			ns := multiQueueNS(t)
			if r := killed(t, fault, "--netns", ns, "apply", "-q", rate1); r.code != -1 {
				t.Fatalf("the apply was not killed (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
			}
			if i%3 == 2 { // recover by reset
				r := sluice(t, "--netns", ns, "reset", "--all")
				if r.code != 0 {
					t.Fatalf("reset after the kill: exit %d\n%s%s", r.code, r.stdout, r.stderr)
				}
				sameState(t, "reset after the kill", pristine, kernelState(t, ns))
				return
			}
			r := sluice(t, "--netns", ns, "apply", "-q", rate1)
			if r.code != 0 || !strings.Contains(r.stderr, "did not finish") {
				t.Fatalf("apply after the kill: exit %d, want 0 and a note on the interrupted apply\n%s%s", r.code, r.stdout, r.stderr)
			}
			sameState(t, "apply after the kill", want1, kernelState(t, ns))
			if out := must(t, "--netns", ns, "plan", rate1); strings.TrimSpace(out) != "no changes" {
				t.Fatalf("plan after recovery:\n%.1000s", out)
			}
			must(t, "--netns", ns, "reset", "--all")
			sameState(t, "reset after recovery", pristine, kernelState(t, ns))
		})
	}

	// An incremental apply changes 510 host classes on the fast path
	// (egress only: an ifb tree always takes the full read), sent 256 to
	// a send; killed in its middle, the next apply of either policy
	// converges.
	egress := func(rate string) string {
		return writePolicy(t, "inc-"+rate+".yaml", `interfaces:
  - name: eth0
    egress:
      rate: 100mbit
      classifier: bpf
      default: rest
      classes:
        - name: subs
          rate: 80mbit
          per_host: {by: dst, cidr: 10.6.0.0/23, rate: `+rate+`, ceil: 50mbit}
        - name: rest
          rate: 10mbit
`)
	}
	inc1, inc2 := egress("100kbit"), egress("150kbit")
	must(t, "--netns", ref, "apply", "-q", inc1)
	wantInc1 := kernelState(t, ref)
	out = must(t, "--netns", ref, "apply", "--timings", inc2)
	if !strings.Contains(out, "applied: 510 change(s)") {
		t.Fatalf("the edit should change 510 classes:\n%.500s", out)
	}
	wantInc2 := kernelState(t, ref)
	must(t, "--netns", ref, "reset", "--all")
	for _, c := range []struct {
		fault string
		then  string
	}{{"kill-at-write=1", inc1}, {"kill-at-write=257", inc1}, {"kill-at-write=300", inc2},
		{"kill-at-write=510", inc1}, {"kill-at=before-commit", inc1}} {
		t.Run("incremental/"+c.fault+"/then-"+filepath.Base(c.then), func(t *testing.T) {
			ns := multiQueueNS(t)
			must(t, "--netns", ns, "apply", "-q", inc1)
			if r := killed(t, c.fault, "--netns", ns, "apply", "-q", "--timings", inc2); r.code != -1 {
				t.Fatalf("the apply was not killed (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
			}
			r := sluice(t, "--netns", ns, "apply", "-q", c.then)
			if r.code != 0 {
				t.Fatalf("apply after the kill: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
			want := wantInc1
			if c.then == inc2 {
				want = wantInc2
			}
			sameState(t, "apply after the kill", want, kernelState(t, ns))
			if out := must(t, "--netns", ns, "plan", c.then); strings.TrimSpace(out) != "no changes" {
				t.Fatalf("plan after recovery:\n%.1000s", out)
			}
		})
	}

	t.Run("reset", func(t *testing.T) {
		ns := multiQueueNS(t)
		must(t, "--netns", ns, "apply", "-q", rate1)
		if r := killed(t, "kill-at-write=2", "--netns", ns, "reset", "--all"); r.code != -1 {
			t.Fatalf("the reset was not killed (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
		}
		must(t, "--netns", ns, "reset", "--all")
		sameState(t, "reset after a killed reset", pristine, kernelState(t, ns))
	})
}

// TestFullDiskChangesNothing: records on a full filesystem. apply must
// find out before its first kernel write, say so, and change nothing;
// once there is space, the same apply goes through.
func TestFullDiskChangesNothing(t *testing.T) {
	ns := multiQueueNS(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	env := []string{"SLUICE_STATE_DIR=" + dir}
	// The probe's cache first, so that filling leaves no room for it.
	if r := runSluice(t, bin, env, "--netns", ns, "plan", crashPolicy(t, "200kbit")); r.code != 0 {
		t.Fatalf("plan: %d %s", r.code, r.stderr)
	}
	filler := filepath.Join(dir, "filler")
	exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=4k").Run() // until the disk is full
	before := kernelState(t, ns)
	pol := crashPolicy(t, "200kbit")
	r := runSluice(t, bin, env, "--netns", ns, "apply", "-q", pol)
	if r.code != 1 || !strings.Contains(r.stderr, "cannot write sluice's records, so nothing was changed") || !strings.Contains(r.stderr, "no space left") {
		t.Fatalf("apply on a full disk: exit %d, want 1 and why\n%s%s", r.code, r.stdout, r.stderr)
	}
	sameState(t, "after the refused apply", before, kernelState(t, ns))
	os.Remove(filler)
	if r := runSluice(t, bin, env, "--netns", ns, "apply", "-q", pol); r.code != 0 {
		t.Fatalf("apply with space: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	applied := kernelState(t, ns)
	// Full again: an edit is refused as a whole; the records still
	// describe the tree, which reset removes.
	exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=4k").Run()
	r = runSluice(t, bin, env, "--netns", ns, "apply", "-q", crashPolicy(t, "300kbit"))
	if r.code != 1 || !strings.Contains(r.stderr, "nothing was changed") {
		t.Fatalf("edit on a full disk: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	sameState(t, "after the refused edit", applied, kernelState(t, ns))
	os.Remove(filler)
	if r := runSluice(t, bin, env, "--netns", ns, "reset", "--all"); r.code != 0 {
		t.Fatalf("reset: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	sameState(t, "after reset", before, kernelState(t, ns))
}
