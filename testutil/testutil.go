// Package testutil builds throwaway network test beds for integration
// tests: named network namespaces joined by veth pairs, torn down when the
// test ends (also when it fails).
package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Prefix starts every namespace and device name tests create, so that
// leftovers of a crashed run can be found (`ip netns | grep sltest`).
const Prefix = "sltest"

// RequireRoot skips a test that needs root and a real kernel, except under
// CI (CI=true), where a skip would hide a failure and fails instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root and a real kernel: skipped with -short")
	}
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root (CI=true forbids skipping)")
	}
	t.Skip("needs root: creates network namespaces")
}

// Unique returns a short random name with the test prefix.
func Unique(tag string) string {
	b := make([]byte, 3)
	rand.Read(b)
	return fmt.Sprintf("%s%s%s", Prefix, tag, hex.EncodeToString(b))
}

// Run runs a command and fails the test if it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// NS runs a command inside namespace ns and fails the test if it fails.
func NS(t testing.TB, ns string, name string, args ...string) string {
	t.Helper()
	return Run(t, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// NewNetns creates a named network namespace with loopback up and
// removes it when the test ends.
func NewNetns(t testing.TB, tag string) string {
	t.Helper()
	RequireRoot(t)
	name := Unique(tag)
	Run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	NS(t, name, "ip", "link", "set", "lo", "up")
	return name
}

// Pair is two namespaces joined by a veth pair with IPv4 and IPv6
// addresses: A is 10.9.0.1 / fd00:9::1 on device DevA, B is 10.9.0.2 /
// fd00:9::2 on device DevB.
type Pair struct {
	A, B       string // namespaces
	DevA, DevB string
	behind     string // Behind's namespace, once made
}

// Addresses of a Pair.
const (
	AddrA  = "10.9.0.1"
	AddrB  = "10.9.0.2"
	Addr6A = "fd00:9::1"
	Addr6B = "fd00:9::2"
)

// NewPair builds a Pair. Extra IPv4 addresses for B (10.9.0.x) can be
// added with AddAddr.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	p := &Pair{A: NewNetns(t, "a"), B: NewNetns(t, "b"), DevA: "veth0", DevB: "veth1"}
	tmp := Unique("v")
	Run(t, "ip", "link", "add", tmp, "type", "veth", "peer", "name", tmp+"p")
	Run(t, "ip", "link", "set", tmp, "netns", p.A, "name", p.DevA)
	Run(t, "ip", "link", "set", tmp+"p", "netns", p.B, "name", p.DevB)
	for _, s := range []struct{ ns, dev, a4, a6 string }{{p.A, p.DevA, AddrA, Addr6A}, {p.B, p.DevB, AddrB, Addr6B}} {
		NS(t, s.ns, "ip", "addr", "add", s.a4+"/24", "dev", s.dev)
		NS(t, s.ns, "ip", "-6", "addr", "add", s.a6+"/64", "dev", s.dev, "nodad")
		NS(t, s.ns, "ip", "link", "set", s.dev, "up")
	}
	return p
}

// Behind returns a namespace behind A, made at the first call: a veth
// from it (10.8.0.2) to A (10.8.0.1), A forwarding, its default route
// through A and B's route back through AddrA. What it sends to B's
// addresses leaves A through DevA forwarded, as a gateway's traffic to
// its users or a Kubernetes node's to its pods does. A socket of A's
// own is not the same: TCP small queues hold its packets in DevA's
// qdisc to about two, which HTB's turns can find empty (two classes
// weighted 3:1, two flows each: 0.69 to 0.84 of the traffic to the
// heavier, where forwarded flows gave 0.75).
func (p *Pair) Behind(t testing.TB) string {
	t.Helper()
	if p.behind != "" {
		return p.behind
	}
	c := NewNetns(t, "c")
	tmp := Unique("v")
	Run(t, "ip", "link", "add", tmp, "type", "veth", "peer", "name", tmp+"p")
	Run(t, "ip", "link", "set", tmp, "netns", p.A, "name", "vbehind")
	Run(t, "ip", "link", "set", tmp+"p", "netns", c, "name", "vfront")
	NS(t, p.A, "ip", "addr", "add", "10.8.0.1/24", "dev", "vbehind")
	NS(t, p.A, "ip", "link", "set", "vbehind", "up")
	NS(t, p.A, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	NS(t, c, "ip", "addr", "add", "10.8.0.2/24", "dev", "vfront")
	NS(t, c, "ip", "link", "set", "vfront", "up")
	NS(t, c, "ip", "route", "add", "default", "via", "10.8.0.1")
	NS(t, p.B, "ip", "route", "add", "10.8.0.0/24", "via", AddrA)
	p.behind = c
	return c
}

// AddAddr adds an IPv4 address (with /24) to dev in ns.
func AddAddr(t testing.TB, ns, dev, addr string) {
	t.Helper()
	NS(t, ns, "ip", "addr", "add", addr+"/24", "dev", dev)
}

// NeedFeature skips a test that needs a kernel feature this kernel
// lacks: name is one of fq, fq_codel, sfq, cake, netem, prio, mqprio, fw,
// police, u32mark, bbr; have is what the test's probe found. The
// stock-kernel lane (scripts/vmtest.sh) lists in SLUICE_EXPECT_FEATURES
// what its kernel has according to the kernel's own config: there a
// test that would skip for one of those fails instead, because a probe
// or a test is wrong, and the feature went untested.
func NeedFeature(t testing.TB, name string, have bool) {
	t.Helper()
	if have {
		return
	}
	for _, f := range strings.Split(os.Getenv("SLUICE_EXPECT_FEATURES"), ",") {
		if f == name {
			t.Fatalf("this kernel has %s (its config says so), but the test found it missing: it must run here", name)
		}
	}
	t.Skipf("kernel lacks %s", name)
}

// Slow marks a test that takes more than a few seconds: a lab scenario,
// a measurement held to a reference, a VM, a browser, a build. `make
// check` (SLUICE_TIER=check) skips it to stay under five minutes;
// `make test` and CI run it.
func Slow(t testing.TB) {
	t.Helper()
	if os.Getenv("SLUICE_TIER") == "check" {
		t.Skip("slow: make check skips it, make test runs it")
	}
}
