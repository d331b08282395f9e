package e2e

import (
	"math/rand"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sluice/features"
	"sluice/migrate"
	"sluice/records"
	"sluice/testutil"
)

// fireqosOffice is an office's FireQOS configuration, as its users
// write them: services, ports and ranges, TOS and DSCP, a class group
// gated on the LAN with its own default, and a class without a rate.
const fireqosOffice = `# an office's uplink
LAN=10.2.0.0/16
interface veth0 world output rate 10Mbit qdisc {{leaf}}
   class voip commit 1Mbit
      match udp ports 5060,10000:10100
   class interactive commit 10%
      client ssh
      match tos lowdelay
      match dscp EF
   class group office commit 40%
      match dst $LAN
      class mail commit 5%
         match tcp dports 25,587
      class web
         match tcp dports 80,443
   class group end
   class bulk
      match tcp dport 6881:6889
      match proto gre
`

// runFireQOS runs the real FireQOS on conf in ns. FireQOS keeps its
// state under /run: a tmpfs there, in the mount namespace ip netns exec
// gives the command, keeps the host's /run untouched.
func runFireQOS(t *testing.T, ns, conf string) string {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/fireqos"); err != nil {
		t.Fatal("fireqos is not installed (scripts/install-deps.sh installs it)")
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "sh", "-c", `mount -t tmpfs tmpfs /run && exec /usr/sbin/fireqos "$0" start`, conf).CombinedOutput()
	if err != nil {
		t.Fatalf("fireqos: %v\n%s", err, out)
	}
	return string(out)
}

// FireQOS run for real against sluice's import of its configuration:
// every crafted packet lands in the same class (FireQOS's class ids
// carried as the import's origins), and UDP floods get the same
// shares.
func TestImportedFireQOSClassifiesAsTheOriginal(t *testing.T) {
	testutil.Slow(t)
	light(t)
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		t.Fatal(err)
	}
	leaf := "pfifo"
	if rep.Features().Qdiscs["fq_codel"] {
		leaf = "fq_codel" // FireQOS's default, where the kernel has it (the lane's)
	}
	conf := filepath.Join(t.TempDir(), "fireqos.conf")
	if err := os.WriteFile(conf, []byte(strings.ReplaceAll(fireqosOffice, "{{leaf}}", leaf)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	res := sluice(t, "import", "fireqos", conf, "-o", out, "--ipv4-only")
	if res.code != 0 {
		t.Fatalf("import: exit %d\n%s", res.code, res.stderr)
	}
	if !strings.Contains(res.stderr, "fireqos.conf:10: class group office") {
		t.Errorf("the report does not list the group:\n%s", res.stderr)
	}
	d, err := migrate.FireQOS(conf, migrate.Options{IPv4Only: true})
	if err != nil {
		t.Fatal(err)
	}
	old, imp := newImportBed(t, "old"), newImportBed(t, "imp")
	t.Logf("fireqos:\n%s", runFireQOS(t, old.ns, conf))
	if q := testutil.NS(t, old.ns, "tc", "qdisc", "show", "dev", "veth0"); !strings.Contains(q, "qdisc "+leaf) {
		t.Fatalf("FireQOS did not build its leaves:\n%s", q)
	}
	must(t, "--netns", imp.ns, "apply", "-q", filepath.Join(out, "policy.yaml"))

	r := rand.New(rand.NewSource(17))
	v4 := []string{"10.2.0.1", "10.2.7.7", "10.3.0.9", "8.8.8.8", "192.0.2.7"}
	v6 := []string{"2001:db8::1", "2001:db8::2"}
	ports := []uint16{22, 25, 80, 443, 587, 5060, 6885, 10050}
	var ps []*testutil.Packet
	for i := 0; i < 400; i++ {
		ps = append(ps, importPacket(r, v4, v6, ports))
	}
	// Where the group's gate and a sibling's rule would both match, the
	// first in file order wins in both: a mail port to the LAN.
	ps = append(ps, &testutil.Packet{Src: netip.MustParseAddr("8.8.8.8"), Dst: netip.MustParseAddr("10.2.0.1"), Proto: 6, Sport: 40000, Dport: 25, TCPFlags: 0x18, Payload: 100})
	seen := compareImport(t, old, imp, d, "veth0/egress", ps)
	for _, c := range []string{"voip", "interactive", "mail", "web", "office-default", "bulk", "default"} {
		if seen[c] == 0 {
			t.Errorf("no packet exercised class %s (seen %v)", c, seen)
		}
	}
	t.Logf("%d packets agree, per class %v", len(ps), seen)
	importRates(t, old, imp, d, filepath.Join(out, "policy.yaml"), "udp", map[string]uint16{"voip": 5060, "default": 9000})
}
