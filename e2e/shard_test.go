package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sluice/stats"
	"sluice/testutil"
)

// shardedPair builds two namespaces joined by a veth with queues
// transmit queues on each end; B answers for 10.9.0.2 and the hosts
// 10.9.0.10 .. 10.9.0.10+hosts-1.
func shardedPair(t *testing.T, queues, hosts int) (a, b string) {
	t.Helper()
	testutil.RequireRoot(t)
	a, b = testutil.NewNetns(t, "a"), testutil.NewNetns(t, "b")
	tmp := testutil.Unique("v")
	q := fmt.Sprint(queues)
	testutil.Run(t, "ip", "link", "add", tmp, "numtxqueues", q, "numrxqueues", q, "type", "veth",
		"peer", "name", tmp+"p", "numtxqueues", q, "numrxqueues", q)
	testutil.Run(t, "ip", "link", "set", tmp, "netns", a, "name", "veth0")
	testutil.Run(t, "ip", "link", "set", tmp+"p", "netns", b, "name", "veth1")
	testutil.NS(t, a, "ip", "addr", "add", "10.9.0.1/24", "dev", "veth0")
	testutil.NS(t, b, "ip", "addr", "add", "10.9.0.2/24", "dev", "veth1")
	for i := 0; i < hosts; i++ {
		testutil.NS(t, b, "ip", "addr", "add", fmt.Sprintf("10.9.0.%d/24", 10+i), "dev", "veth1")
	}
	testutil.NS(t, a, "ip", "link", "set", "veth0", "up")
	testutil.NS(t, b, "ip", "link", "set", "veth1", "up")
	return a, b
}

func showJSON(t *testing.T, ns string) *stats.Sample {
	t.Helper()
	var s stats.Sample
	if err := json.Unmarshal([]byte(must(t, "--netns", ns, "show", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// TestShardedTree: on a 4-queue veth a BPF tree with host classes is
// split into one HTB per queue under mq; every host's packets reach its
// own class in its own shard (so the program's queue choice held: in
// another shard HTB would not find the class and use its default), the
// rest spreads over the copies of the other classes, and changing one
// host is one class change that leaves every other queue alone.
func TestShardedTree(t *testing.T) {
	const hosts = 12
	a, _ := shardedPair(t, 4, hosts)
	var csv strings.Builder
	csv.WriteString("name,addresses,rate,ceil\n")
	for i := 0; i < hosts; i++ {
		fmt.Fprintf(&csv, "h%d,10.9.0.%d,1mbit,50mbit\n", i, 10+i)
	}
	file, hostsFile := subsPolicyShards(t, csv.String(), "", "4")
	must(t, "--netns", a, "apply", "-q", file)
	qd := tcShow(t, a, "qdisc", "show", "dev", "veth0")
	if !strings.Contains(qd, "qdisc mq 1: root") || strings.Count(qd, "qdisc htb 1") != 4 {
		t.Fatalf("want mq with 4 HTB shards:\n%s", qd)
	}
	if out := must(t, "--netns", a, "plan", file); !strings.Contains(out, "no changes") {
		t.Fatalf("re-plan of a sharded tree:\n%s", out)
	}

	for i := 0; i < hosts; i++ {
		testutil.NS(t, a, "ping", "-c", "3", "-i", "0.01", "-q", fmt.Sprintf("10.9.0.%d", 10+i))
	}
	testutil.NS(t, a, "ping", "-c", "20", "-i", "0.01", "-q", "10.9.0.2")
	s := showJSON(t, a)
	if len(s.Trees) != 1 {
		t.Fatalf("want one tree, got %d", len(s.Trees))
	}
	perShard := map[string]int{}
	var rest uint64
	leaves := map[string]string{}
	for _, c := range s.Trees[0].Classes {
		major := strings.Split(c.ID, ":")[0]
		switch {
		case strings.HasPrefix(c.Name, "subs/h"):
			perShard[major]++
			if c.Packets < 3 || c.Classified == nil || c.Classified.Packets < 3 {
				t.Errorf("host class %s (%s): %d packets in HTB, classified %+v; its packets went to another queue",
					c.Name, c.ID, c.Packets, c.Classified)
			}
			leaves[c.Name] = c.ID
		case c.Name == "rest":
			rest += c.Packets
		}
	}
	if len(perShard) != 4 {
		t.Errorf("hosts should spread over 4 shards: %v", perShard)
	}
	for m, n := range perShard {
		if n != hosts/4 {
			t.Errorf("shard %s holds %d hosts, want %d", m, n, hosts/4)
		}
	}
	if rest < 20 {
		t.Errorf("rest copies got %d packets, want >= 20 (pings to a non-host)", rest)
	}

	// One host's rate: its class changes in place, and, in a shard of
	// three hosts whose parent's turn is more than their floors, its
	// siblings' quanta with it (plan/share.go: they add up to the turn);
	// bfifo leaves' limits may follow (two quanta). Nothing is added,
	// replaced or deleted, nothing outside its shard changes, and the
	// other leaves keep their counters.
	before := tcShow(t, a, "-s", "qdisc", "show", "dev", "veth0")
	os.WriteFile(hostsFile, []byte(strings.Replace(csv.String(), "h5,10.9.0.15,1mbit", "h5,10.9.0.15,2mbit", 1)), 0o644)
	out := must(t, "--netns", a, "plan", "--tc", file)
	shard := strings.Split(leaves["subs/h5"], ":")[0] + ":"
	changes := 0
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "~ ") && !strings.HasPrefix(l, "+ ") && !strings.HasPrefix(l, "- ") && !strings.HasPrefix(l, "! ") {
			continue
		}
		changes++
		if !strings.HasPrefix(l, "~ class veth0 parent "+shard) && !(strings.HasPrefix(l, "~ qdisc veth0 parent "+shard) && strings.Contains(l, "bfifo limit")) {
			t.Errorf("plan for one host's rate changes %q, beyond its shard's classes", l)
		}
	}
	if changes == 0 || !regexp.MustCompile(`~ class [^\n]*# subs/h5 [^\n]*rate 1mbit -> 2mbit`).MatchString(out) ||
		!strings.Contains(out, fmt.Sprintf("plan: 0 to add, %d to change, 0 to replace, 0 to delete", changes)) {
		t.Fatalf("plan for one host's rate in a sharded tree:\n%s", out)
	}
	must(t, "--netns", a, "apply", "-q", file)
	after := tcShow(t, a, "-s", "qdisc", "show", "dev", "veth0")
	// The subscribers' queues: the rest's may see stray ARP or ND.
	hostIDs := map[string]bool{}
	for _, id := range leaves {
		hostIDs[id] = true
	}
	if n := strings.Count(leafLines(before, hostIDs), "\n") + 1; n != hosts {
		t.Fatalf("found %d subscriber leaves, want %d:\n%s", n, hosts, before)
	}
	if leafLines(before, hostIDs) != leafLines(after, hostIDs) {
		t.Errorf("a one-host change touched the queues:\nbefore\n%s\nafter\n%s", before, after)
	}
}

// leafLines keeps the handle, parent and packet count of each bfifo
// whose parent is one of classes.
func leafLines(show string, classes map[string]bool) string {
	var out []string
	lines := strings.Split(show, "\n")
	for i, l := range lines {
		if f := strings.Fields(l); strings.HasPrefix(l, "qdisc bfifo") && i+1 < len(lines) && classes[f[4]] {
			out = append(out, f[2]+" "+f[4]+" "+strings.Join(strings.Fields(lines[i+1])[:5], " "))
		}
	}
	return strings.Join(out, "\n")
}

// TestHostsFileU32 runs a hosts_file through the u32 classifier (what
// export writes for a BPF tree): full addresses through a hash table,
// prefixes longest first, IPv6 too, unlisted addresses to the default.
func TestHostsFileU32(t *testing.T) {
	a, b := shardedPair(t, 1, 4)
	testutil.NS(t, b, "ip", "addr", "add", "10.9.0.130/24", "dev", "veth1")
	testutil.NS(t, b, "ip", "addr", "add", "10.9.0.200/24", "dev", "veth1")
	for _, a6 := range []string{"fd00:9::10", "fd00:9::1:1", "fd00:9::2:1", "fd00:9::3:1"} {
		testutil.NS(t, b, "ip", "-6", "addr", "add", a6+"/64", "dev", "veth1", "nodad")
	}
	testutil.NS(t, a, "ip", "-6", "addr", "add", "fd00:9::1/64", "dev", "veth0", "nodad")
	// The IPv6 hosts all end in 1 but one: they hash on the byte
	// before (mask 0x00ff0000 of the address's last word).
	file, _ := subsPolicy(t, `name,addresses,rate,ceil
h0,10.9.0.10,1mbit,50mbit
h1,10.9.0.11 fd00:9::10,1mbit,50mbit
h2,10.9.0.12,1mbit,50mbit
h3,10.9.0.13,1mbit,50mbit
h4,fd00:9::1:1,1mbit,50mbit
h5,fd00:9::2:1,1mbit,50mbit
h6,fd00:9::3:1,1mbit,50mbit
net,10.9.0.128/28,1mbit,50mbit
wide,10.9.0.128/25,1mbit,50mbit
`, "u32")
	must(t, "--netns", a, "apply", "-q", file)
	if f := tcShow(t, a, "filter", "show", "dev", "veth0"); !strings.Contains(f, "divisor 256") || !strings.Contains(f, "hash mask 00ff0000 at 36") {
		t.Fatalf("want u32 hash tables, IPv6 hashed on byte 14:\n%s", f)
	}
	want := map[string]uint64{}
	ping := func(addr, class string, n int) {
		testutil.NS(t, a, "ping", "-c", fmt.Sprint(n), "-i", "0.01", "-q", addr)
		want[class] += uint64(n)
	}
	ping("10.9.0.10", "subs/h0", 3)
	ping("10.9.0.11", "subs/h1", 4)
	ping("fd00:9::10", "subs/h1", 2)
	ping("10.9.0.13", "subs/h3", 5)
	ping("fd00:9::1:1", "subs/h4", 3)
	ping("fd00:9::2:1", "subs/h5", 4)
	ping("fd00:9::3:1", "subs/h6", 5)
	ping("10.9.0.130", "subs/net", 6)  // in both prefixes: the longer wins
	ping("10.9.0.200", "subs/wide", 7) // only in the /25
	ping("10.9.0.2", "rest", 8)        // listed nowhere
	for _, c := range showJSON(t, a).Trees[0].Classes {
		if w, ok := want[c.Name]; ok && (c.Packets < w || c.Packets > w+24) { // + ARP/ND
			t.Errorf("class %s: %d packets, want %d", c.Name, c.Packets, w)
		}
		if c.Name == "subs/h2" && c.Packets != 0 {
			t.Errorf("class subs/h2: %d packets, want none", c.Packets)
		}
	}
}

// subsPolicy writes a hosts file with csv and a policy for veth0 whose
// "subs" class takes its hosts from it (classifier "" for the default),
// and returns both paths.
func subsPolicy(t *testing.T, csv, classifier string) (file, hostsFile string) {
	t.Helper()
	return subsPolicyShards(t, csv, classifier, "")
}

// subsPolicyShards is subsPolicy with a shards key ("" for auto).
func subsPolicyShards(t *testing.T, csv, classifier, shards string) (file, hostsFile string) {
	t.Helper()
	dir := t.TempDir()
	hostsFile = filepath.Join(dir, "hosts.csv")
	os.WriteFile(hostsFile, []byte(csv), 0o644)
	if classifier != "" {
		classifier = "\n      classifier: " + classifier
	}
	if shards != "" {
		classifier += "\n      shards: " + shards
	}
	file = filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(`interfaces:
  - name: veth0
    egress:
      rate: 200mbit`+classifier+`
      default: rest
      classes:
        - name: subs
          rate: 100mbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 50mbit
`), 0o644)
	return file, hostsFile
}

// A tree sharded four ways carries at most rate/4 per shard: one host
// alone, with a ceil of the whole rate, gets a quarter of it (a shard's
// root is an HTB root class and cannot borrow), and apply says so.
// shards: auto does not shard such a tree (and says why): the same host
// gets the whole rate, as with shards: 1.
func TestShardedHostGetsRateOverN(t *testing.T) {
	testutil.Slow(t)
	light(t)
	a, b := shardedPair(t, 4, 0)
	file := filepath.Join(t.TempDir(), "p.yaml")
	write := func(shards string) { writeOneHostPolicy(t, file, shards) }
	testutil.IperfServer(t, b, "10.9.0.2", 5201)
	for _, c := range []struct {
		shards string
		rate   float64
		note   string
	}{
		{"\n      shards: 4", 10e6, "note: veth0 egress: sharded into 4 HTBs"},
		{"", 40e6, "note: veth0 egress: shards: auto made one tree for 4 transmit queues: a host's ceil of 40mbit"},
		{"\n      shards: 1", 40e6, ""},
	} {
		write(c.shards)
		r0 := sluice(t, "--netns", a, "apply", file)
		if r0.code != 0 {
			t.Fatalf("apply: exit %d\n%s%s", r0.code, r0.stdout, r0.stderr)
		}
		if has := strings.Contains(r0.stderr, "note:"); c.note == "" && has || c.note != "" && !strings.Contains(r0.stderr, c.note) {
			t.Errorf("shards %q: want note %q:\n%s", c.shards, c.note, r0.stderr)
		}
		r, err := testutil.Iperf(a, "10.9.0.2", 5201, 4, 4)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("shards %q: one host got %.2f Mbit/s (%.3f of %.0f)", c.shards, r.Goodput/1e6, r.Goodput/c.rate, c.rate/1e6)
		if ratio := r.Goodput / c.rate; ratio < 0.85 || ratio > 1.0 {
			t.Errorf("shards %q: one host got %.2f Mbit/s, want about %.0f", c.shards, r.Goodput/1e6, c.rate/1e6)
		}
		must(t, "--netns", a, "reset", "veth0")
	}
}

// Under the agent a sharded tree's shards lend to each other: the
// agent balances the shards' rates by the hosts active in each, so one
// host alone with a ceil of the whole rate gets it, where without the
// agent it gets rate/4 (above).
func TestShardsBalancedByTheAgent(t *testing.T) {
	testutil.Slow(t)
	light(t)
	a, b := shardedPair(t, 4, 0)
	file := filepath.Join(t.TempDir(), "p.yaml")
	writeOneHostPolicy(t, file, "\n      shards: 4")
	testutil.IperfServer(t, b, "10.9.0.2", 5201)
	ag := startAgent(t, a, file, "--interval", "1s")
	if _, err := testutil.Iperf(a, "10.9.0.2", 5201, 4, 3); err != nil { // the agent sees the host active
		t.Fatal(err)
	}
	r, err := testutil.Iperf(a, "10.9.0.2", 5201, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one host alone on a balanced 4-shard tree got %.2f Mbit/s of 40", r.Goodput/1e6)
	if ratio := r.Goodput / 40e6; ratio < 0.85 || ratio > 1.0 {
		t.Errorf("one host alone got %.2f Mbit/s, want about 40 (the shards balanced)\n%s", r.Goodput/1e6, ag.Log())
	}
	// The balance is the agent's runtime state: plan finds nothing to
	// change while it runs, and says what the agent does.
	if pr := sluice(t, "--netns", a, "plan", file); pr.code != 0 || !strings.Contains(pr.stdout, "no changes") || !strings.Contains(pr.stderr, "balances the 4 shards") {
		t.Errorf("plan while the agent balances (want no changes and the note): exit %d\n%s%s", pr.code, pr.stdout, pr.stderr)
	}
}

// writeOneHostPolicy writes file: a 40mbit BPF tree on veth0 (shards
// the extra key given) whose host peer (10.9.0.2) may use the whole
// rate, with its hosts_file beside it.
func writeOneHostPolicy(t *testing.T, file, shards string) {
	t.Helper()
	hosts := "name,addresses,rate,ceil\npeer,10.9.0.2,1mbit,40mbit\nother,10.9.0.77,1mbit,5mbit\n"
	if err := os.WriteFile(filepath.Join(filepath.Dir(file), "hosts.csv"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(policyFor("veth0", `    egress:
      rate: 40mbit
      classifier: bpf`+shards+`
      default: rest
      classes:
        - {name: subs, rate: 20mbit, per_host: {by: dst, hosts_file: hosts.csv}}
        - {name: rest, rate: 10mbit, ceil: 10mbit}
`)), 0o644); err != nil {
		t.Fatal(err)
	}
}
