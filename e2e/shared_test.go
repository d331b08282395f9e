package e2e

import (
	"strings"
	"testing"

	"sluice/testutil"
)

// Another tool's clsact and filters on the devices sluice shapes: sluice
// uses the clsact, never touches the filters, and leaves both behind
// when it resets; a clsact sluice made goes when no tree needs it,
// whichever tree made it.
func TestSharedClsactAndForeignFilters(t *testing.T) {
	ingress := writePolicy(t, "in.yaml", "interfaces:\n  - name: eth0\n    ingress: {rate: 50mbit}\n")
	bpfEgress := writePolicy(t, "bpf.yaml", `interfaces:
  - name: eth0
    egress:
      rate: 50mbit
      classifier: bpf
      default: rest
      classes:
        - name: subs
          rate: 40mbit
          per_host: {by: dst, cidr: 10.5.0.0/29}
        - name: rest
          rate: 5mbit
`)
	both := writePolicy(t, "both.yaml", `interfaces:
  - name: eth0
    egress:
      rate: 50mbit
      classifier: bpf
      default: rest
      classes:
        - name: subs
          rate: 40mbit
          per_host: {by: dst, cidr: 10.5.0.0/29}
        - name: rest
          rate: 5mbit
    ingress: {rate: 50mbit}
`)
	theirFilters := func(ns string) string {
		t.Helper()
		var keep []string
		for _, dir := range []string{"ingress", "egress"} {
			for _, l := range strings.Split(tcShow(t, ns, "filter", "show", "dev", "eth0", dir), "\n") {
				if strings.Contains(l, "pref 49152") || strings.Contains(l, "01020304") || strings.Contains(l, "05060708") {
					keep = append(keep, dir+": "+strings.TrimSpace(l))
				}
			}
		}
		return strings.Join(keep, "\n")
	}
	t.Run("their clsact and filters", func(t *testing.T) {
		ns := devNS(t, "eth0")
		pristine := kernelState(t, ns)
		testutil.NS(t, ns, "tc", "qdisc", "add", "dev", "eth0", "clsact")
		// tc's default prio, as a hand-written script leaves it.
		testutil.NS(t, ns, "tc", "filter", "add", "dev", "eth0", "ingress", "protocol", "ip", "u32", "match", "ip", "dst", "1.2.3.4/32", "classid", "1:1")
		testutil.NS(t, ns, "tc", "filter", "add", "dev", "eth0", "egress", "protocol", "ip", "u32", "match", "ip", "dst", "5.6.7.8/32", "classid", "1:1")
		theirs := theirFilters(ns)
		if strings.Count(theirs, "\n") < 3 {
			t.Fatalf("their filters are not in place:\n%s", theirs)
		}
		theirState := kernelState(t, ns)
		for _, pol := range []string{ingress, bpfEgress, both, ingress} {
			must(t, "--netns", ns, "apply", "-q", pol)
			if got := theirFilters(ns); got != theirs {
				t.Fatalf("apply of %s touched their filters:\n%s\n--- want\n%s", pol, got, theirs)
			}
			if out := must(t, "--netns", ns, "plan", pol); strings.TrimSpace(out) != "no changes" {
				t.Fatalf("plan after apply of %s:\n%s", pol, out)
			}
		}
		must(t, "--netns", ns, "reset", "--all")
		sameState(t, "reset: their clsact and filters, nothing of sluice's", theirState, kernelState(t, ns))
		testutil.NS(t, ns, "tc", "qdisc", "del", "dev", "eth0", "clsact")
		sameState(t, "pristine", pristine, kernelState(t, ns))
	})
	t.Run("a clsact sluice made moves between trees", func(t *testing.T) {
		ns := devNS(t, "eth0")
		pristine := kernelState(t, ns)
		// The ingress tree makes the clsact; the BPF tree then uses it
		// alone; reset must still take it away.
		must(t, "--netns", ns, "apply", "-q", ingress)
		must(t, "--netns", ns, "apply", "-q", bpfEgress)
		must(t, "--netns", ns, "reset", "--all")
		sameState(t, "ingress, then BPF egress only, then reset", pristine, kernelState(t, ns))
		// Both trees, then one reset at a time.
		must(t, "--netns", ns, "apply", "-q", both)
		must(t, "--netns", ns, "reset", "ifb-eth0")
		if r := sluice(t, "--netns", ns, "plan", bpfEgress); strings.TrimSpace(r.stdout) != "no changes" {
			t.Fatalf("resetting the ingress tree disturbed the BPF tree's clsact:\n%s%s", r.stdout, r.stderr)
		}
		must(t, "--netns", ns, "reset", "eth0")
		sameState(t, "both, then one reset at a time", pristine, kernelState(t, ns))
	})
}
