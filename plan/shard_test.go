package plan

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/bpf"
	"sluice/policy"
	"sluice/tc"
)

func shardPolicy(t testing.TB, hosts []int, extra string) *policy.Policy {
	t.Helper()
	dir := t.TempDir()
	var csv strings.Builder
	csv.WriteString("name,addresses,rate,ceil\n")
	for _, h := range hosts {
		fmt.Fprintf(&csv, "h%d,10.0.%d.%d,1mbit,10mbit\n", h, h/200, h%200+1)
	}
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(csv.String()), 0o644)
	src := "interfaces:\n  - name: eth0\n    egress:\n      rate: 800mbit\n      default: rest\n" + extra +
		"      classes:\n        - name: subs\n          rate: 400mbit\n          per_host: {by: dst, hosts_file: hosts.csv}\n" +
		"        - name: rest\n          rate: 80mbit\n"
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(src), 0o644)
	p, _, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func withQueues(n int, xps bool) Features {
	f := Everything
	f.TxQueues = map[string]int{"eth0": n}
	f.XPS = map[string]bool{"eth0": xps}
	return f
}

func TestShardedPlan(t *testing.T) {
	var hosts []int
	for i := 0; i < 50; i++ {
		hosts = append(hosts, i)
	}
	p, err := Build(shardPolicy(t, hosts, "      shards: 8\n"), withQueues(8, false), nil)
	if err != nil {
		t.Fatal(err)
	}
	d := p.Devices[0]
	if q := d.Objects[0].(*tc.Qdisc); q.Kind != "mq" || q.Parent != tc.HandleRoot {
		t.Fatalf("first object %s, want the mq root", q.Describe())
	}
	shards, load := 0, map[uint16]int{}
	var hook *bpf.Hook
	for _, o := range d.Objects {
		switch x := o.(type) {
		case *tc.Qdisc:
			if x.Kind == "htb" {
				if x.Handle.Major() != shardMajor(shards) || x.Parent != tc.MakeHandle(1, uint16(shards+1)) {
					t.Errorf("shard %s on %s, want shard %d on its own queue", x.Handle, x.Parent, shards)
				}
				shards++
			}
		case *tc.Class:
			if strings.HasPrefix(x.Name, "subs/") {
				load[x.Handle.Major()]++
			}
			if x.Name == "rest" && x.Rate != 80_000_000/8/8 {
				t.Errorf("copy of rest: rate %d B/s, want an eighth of 80mbit", x.Rate)
			}
		case *bpf.Hook:
			hook = x
		}
	}
	if shards != 8 || len(load) != 8 {
		t.Fatalf("%d shards, hosts in %d of them", shards, len(load))
	}
	for m, n := range load {
		if n < 6 || n > 7 {
			t.Errorf("shard %x holds %d of 50 hosts", m, n)
		}
	}
	if hook == nil || hook.Content.Shards != 8 {
		t.Fatalf("hook %+v", hook)
	}
	counters := map[uint32]bool{}
	for _, tg := range hook.Content.Hosts {
		if tg.Queue == 0 || tc.Handle(tg.Classid).Major() != shardMajor(int(tg.Queue)-1) {
			t.Errorf("host target %+v: queue and shard disagree", tg)
		}
		if counters[tg.Counter] {
			t.Errorf("counter %d used twice", tg.Counter)
		}
		counters[tg.Counter] = true
	}

	// A new host in the middle: every other host keeps shard and id.
	more := append([]int{999}, hosts...)
	p2, err := Build(shardPolicy(t, more, "      shards: 8\n"), withQueues(8, false), map[string]*Alloc{"eth0": d.Alloc})
	if err != nil {
		t.Fatal(err)
	}
	a1, a2 := d.Alloc, p2.Devices[0].Alloc
	for name, s := range a1.Shards {
		if a2.Shards[name] != s || a2.Classes[name] != a1.Classes[name] || a2.Counters[name] != a1.Counters[name] {
			t.Errorf("%s moved: shard %d->%d id %x->%x", name, s, a2.Shards[name], a1.Classes[name], a2.Classes[name])
		}
	}
	if _, ok := a2.Shards["subs/h999"]; !ok {
		t.Errorf("new host has no shard")
	}
}

func TestShardingOffAndXPS(t *testing.T) {
	hosts := []int{1, 2, 3}
	for _, c := range []struct {
		extra string
		feats Features
		mq    bool
		err   string
	}{
		{"", withQueues(1, false), false, ""},
		{"      shards: 1\n", withQueues(4, false), false, ""},
		{"      shards: 2\n", withQueues(4, false), true, ""},
		{"", withQueues(4, true), false, ""},
		{"      shards: 4\n", withQueues(4, true), false, "XPS"},
	} {
		p, err := Build(shardPolicy(t, hosts, c.extra), c.feats, nil)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want %s", c.extra, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if mq := p.Devices[0].Objects[0].(*tc.Qdisc).Kind == "mq"; mq != c.mq {
			t.Errorf("%q queues %d: sharded %v, want %v", c.extra, c.feats.TxQueues["eth0"], mq, c.mq)
		}
	}
}

// The shards' majors share one qdisc hash bucket that no leaf enters,
// so the kernel finds a shard without walking past leaves.
func TestShardMajorsOwnABucket(t *testing.T) {
	seen := map[uint16]bool{}
	for s := range policy.MaxShards {
		m := shardMajor(s)
		if seen[m] || m < 0x100 || m >= 0x8000 || qdiscBucket(m) != shardBucket || leafMajorOK(m) {
			t.Fatalf("shard %d: major %#x (bucket %d, seen %v)", s, m, qdiscBucket(m), seen[m])
		}
		seen[m] = true
	}
	// hash_32(0x00010000, 4) as the kernel computes it: 0x10000 *
	// 0x61C88647 mod 2^32 = 0x86470000, top four bits 8.
	if qdiscBucket(1) != 8 {
		t.Fatalf("bucket of 1: is %d, want 8", qdiscBucket(1))
	}
	pool := newPool(map[string]uint16{"kept": shardMajor(0)}, leafLo, leafHi)
	pool.allowed = leafMajorOK
	if id, ok := pool.get("kept"); !ok || id == shardMajor(0) {
		t.Fatalf("recorded leaf major in the shards' bucket: got %#x", id)
	}
	n := 1
	for ; ; n++ {
		id, ok := pool.get(fmt.Sprint(n))
		if !ok {
			break
		}
		if !leafMajorOK(id) {
			t.Fatalf("leaf major %#x in the shards' bucket", id)
		}
	}
	if n != leafCapacity || n < 28000 {
		t.Fatalf("%d leaf majors, want leafCapacity %d (> 28000)", n, leafCapacity)
	}
}

// Re-planning with fewer queues and a changed host list: hosts whose
// shard survives keep shard and minor, the others move, and no two
// classes or leaf qdiscs ever share a handle.
func TestShardedReplanKeepsIDsWithoutClashes(t *testing.T) {
	var first, second []int
	for i := range 200 {
		first = append(first, i)
		second = append(second, i+60)
	}
	p1, err := Build(shardPolicy(t, first, "      shards: 8\n"), withQueues(8, false), nil)
	if err != nil {
		t.Fatal(err)
	}
	a1 := p1.Devices[0].Alloc
	p2, err := Build(shardPolicy(t, second, "      shards: 8\n"), withQueues(4, false), map[string]*Alloc{"eth0": a1})
	if err != nil {
		t.Fatal(err)
	}
	a2 := p2.Devices[0].Alloc
	kept := 0
	for _, h := range second {
		name := fmt.Sprintf("subs/h%d", h)
		s1, had := a1.Shards[name]
		if !had || s1 >= 4 {
			continue
		}
		kept++
		if a2.Shards[name] != s1 || a2.Classes[name] != a1.Classes[name] {
			t.Errorf("%s: shard %d minor %x became shard %d minor %x", name, s1, a1.Classes[name], a2.Shards[name], a2.Classes[name])
		}
	}
	if kept < 50 {
		t.Fatalf("only %d hosts could keep their ids", kept)
	}
	seen := map[string]string{}
	for _, o := range p2.Devices[0].Objects {
		var key, name string
		switch x := o.(type) {
		case *tc.Class:
			key, name = "class "+x.Handle.String(), x.Name
		case *tc.Qdisc:
			key, name = "qdisc "+x.Handle.String(), x.Owner
		default:
			continue
		}
		if other, dup := seen[key]; dup {
			t.Fatalf("%s is both %s and %s", key, other, name)
		}
		seen[key] = name
	}
}

// A sharded tree says which ceils it cannot reach: each shard's root is
// an HTB root class, capped at rate/N (measured in e2e
// TestShardedHostGetsRateOverN); one tree says nothing.
func TestShardedTreeNotesUnreachableCeils(t *testing.T) {
	p, err := Build(shardPolicy(t, []int{1, 2, 3}, "      shards: 8\n"), withQueues(8, false), nil)
	if err != nil {
		t.Fatal(err)
	}
	notes := strings.Join(p.Devices[0].Notes, "\n")
	for _, want := range []string{"sharded into 8 HTBs", "at most 100mbit (rate/8)", "out of reach: rest 800mbit.", "shards: 1"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes %q lack %q", notes, want)
		}
	}
	if strings.Contains(notes, "h1") {
		t.Errorf("a host of 10mbit is reachable: %q", notes)
	}
	p, err = Build(shardPolicy(t, []int{1, 2, 3}, "      shards: 1\n"), withQueues(8, false), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := p.Devices[0].Notes; len(n) != 0 {
		t.Errorf("one tree: notes %q", n)
	}
}

// shards: auto takes no more shards than keep every host's ceil within
// a shard's part and give each shard 32 hosts, and says why.
func TestShardsAuto(t *testing.T) {
	many := func(n int) []int {
		var hs []int
		for i := 0; i < n; i++ {
			hs = append(hs, i)
		}
		return hs
	}
	shards := func(p *Plan) int {
		n := 0
		for _, c := range p.Devices[0].Classes {
			if c.Name == "(root)" {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		name  string
		hosts int
		ceil  string // the hosts' ceil, for policies of 800mbit
		want  int
		note  string
	}{
		{"enough hosts, small ceils", 400, "", 8, ""},
		{"few hosts", 3, "", 1, "3 hosts fill 1 shards of 32 or more"},
		{"100 hosts", 100, "", 3, "100 hosts fill 3 shards"},
		{"a host may take the link", 400, "800mbit", 1, "a host's ceil of 800mbit needs shards of at least that (at most 1 of 800mbit)"},
		{"a host may take a quarter", 400, "200mbit", 4, "at most 4 of 800mbit"},
	} {
		p := shardPolicy(t, many(c.hosts), "")
		if c.ceil != "" {
			for _, cl := range p.Interfaces[0].Egress.Classes {
				if cl.PerHost != nil {
					for _, e := range cl.PerHost.Entries {
						r, _, _ := policy.ParseRate(c.ceil)
						e.CeilBps = r.Bps
					}
				}
			}
		}
		pl, err := Build(p, withQueues(8, false), nil)
		if err != nil {
			t.Fatal(err)
		}
		notes := strings.Join(pl.Devices[0].Notes, "\n")
		if got := max(shards(pl), 1); got != c.want || c.note != "" && !strings.Contains(notes, c.note) || c.note == "" && strings.Contains(notes, "shards: auto") {
			t.Errorf("%s: %d shards (want %d), notes %q (want %q)", c.name, got, c.want, notes, c.note)
		}
	}
}
