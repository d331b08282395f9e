package kube

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"sluice/kube/corev1"
	"sluice/kube/kubetest"
	"sluice/policy"
	"sluice/units"
)

// Each form of cap reads as the bit/s it means; where a pod carries
// several, the smallest holds; what cannot be read is a problem that
// names the annotation, and the pod stays a host.
func TestRead(t *testing.T) {
	mbit := func(x float64) units.Rate { return units.FromBits(x * 1e6) }
	cases := []struct {
		name     string
		ann      map[string]string
		dir      string
		want     Wants
		ok       bool
		problems []string
	}{
		{name: "none", ann: map[string]string{"other": "1"}, dir: policy.Egress},
		{name: "kubernetes, decimal", ann: map[string]string{EgressBandwidth: "10M"}, dir: policy.Egress, want: Wants{Cap: mbit(10)}, ok: true},
		{name: "kubernetes, binary", ann: map[string]string{IngressBandwidth: "1Gi"}, dir: policy.Ingress, want: Wants{Cap: units.FromBits(1 << 30)}, ok: true},
		{name: "the other direction only", ann: map[string]string{IngressBandwidth: "10M"}, dir: policy.Egress},
		{name: "calico", ann: map[string]string{CalicoEgress: "2.5M"}, dir: policy.Egress, want: Wants{Cap: mbit(2.5)}, ok: true},
		{name: "kube-ovn, Mbit/s", ann: map[string]string{OVNIngress: "20"}, dir: policy.Ingress, want: Wants{Cap: mbit(20)}, ok: true},
		{name: "several: the smallest", ann: map[string]string{EgressBandwidth: "50M", CalicoEgress: "30M", OVNEgress: "40"}, dir: policy.Egress, want: Wants{Cap: mbit(30)}, ok: true},
		{name: "a class alone", ann: map[string]string{Class: " gold "}, dir: policy.Ingress, want: Wants{Class: "gold"}, ok: true},
		{name: "not a quantity", ann: map[string]string{EgressBandwidth: "ten"}, dir: policy.Egress, want: Wants{CapUnread: true}, ok: true, problems: []string{EgressBandwidth + `: "ten": not a quantity`}},
		{name: "below 1k", ann: map[string]string{EgressBandwidth: "999"}, dir: policy.Egress, want: Wants{CapUnread: true}, ok: true, problems: []string{"outside 1k to 1P"}},
		{name: "negative Mbit/s", ann: map[string]string{OVNEgress: "-5"}, dir: policy.Egress, want: Wants{CapUnread: true}, ok: true, problems: []string{"outside 1k to 1P"}},
		{name: "not a number of Mbit/s", ann: map[string]string{OVNEgress: "5M"}, dir: policy.Egress, want: Wants{CapUnread: true}, ok: true, problems: []string{"not a number of Mbit/s"}},
		{name: "a weight", ann: map[string]string{Weight: "2.5"}, dir: policy.Ingress, want: Wants{Weight: 2.5}, ok: true},
		{name: "a weight of 0", ann: map[string]string{Weight: "0", EgressBandwidth: "1M"}, dir: policy.Egress, want: Wants{Cap: mbit(1)}, ok: true, problems: []string{"a weight is from 0.001"}},
		{name: "a weight that is not a number", ann: map[string]string{Weight: "high"}, dir: policy.Egress, ok: true, problems: []string{"not a decimal number"}},
		// Issue 58: what ParseFloat takes that is no weight.
		{name: "a subnormal weight", ann: map[string]string{Weight: "1e-320"}, dir: policy.Egress, ok: true, problems: []string{"not a decimal number"}},
		{name: "a hex float weight", ann: map[string]string{Weight: "0x1p-2"}, dir: policy.Egress, ok: true, problems: []string{"not a decimal number"}},
		{name: "an underscored weight", ann: map[string]string{Weight: "1_0"}, dir: policy.Egress, ok: true, problems: []string{"not a decimal number"}},
		{name: "a tiny weight", ann: map[string]string{Weight: "0.0001"}, dir: policy.Egress, ok: true, problems: []string{"a weight is from 0.001"}},
		{name: "a priority", ann: map[string]string{Priority: " 0 "}, dir: policy.Egress, want: Wants{Prio: ptr(0)}, ok: true},
		{name: "a priority of 8", ann: map[string]string{Priority: "8", EgressBandwidth: "1M"}, dir: policy.Egress, want: Wants{Cap: mbit(1)}, ok: true, problems: []string{Priority + `: "8": a prio is a number from 0 (served first) to 7`}},
		{name: "a priority by name", ann: map[string]string{Priority: "high"}, dir: policy.Egress, ok: true, problems: []string{"a prio is a number"}},
		{name: "a bad form beside a good", ann: map[string]string{EgressBandwidth: "x", CalicoEgress: "8M"}, dir: policy.Egress, want: Wants{Cap: mbit(8), CapUnread: true}, ok: true, problems: []string{"not a quantity"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, ok, problems := Read(c.ann, c.dir)
			if !reflect.DeepEqual(w, c.want) || ok != c.ok || len(problems) != len(c.problems) {
				t.Fatalf("Read = %+v %v %v, want %+v %v %v", w, ok, problems, c.want, c.ok, c.problems)
			}
			for i, p := range problems {
				if !strings.Contains("annotation "+p.String(), c.problems[i]) && !strings.Contains(p.String(), c.problems[i]) {
					t.Errorf("problem %q, want it to say %q", p, c.problems[i])
				}
			}
		})
	}
}

func ptr(n int) *int { return &n }

// Which pods are hosts: those with an annotation for the direction and
// an address, not on the host's network, not finished or going.
func TestHostOf(t *testing.T) {
	cap10 := map[string]string{EgressBandwidth: "10M"}
	done := kubetest.Pod("a", "done", "n", cap10, "10.0.0.5")
	done.Status.Phase = corev1.PodSucceeded
	hostNet := kubetest.Pod("a", "hn", "n", cap10, "192.168.1.1")
	hostNet.Spec.HostNetwork = true
	going := kubetest.Pod("a", "going", "n", cap10, "10.0.0.6")
	going.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	legacy := kubetest.Pod("a", "legacy", "n", cap10)
	legacy.Status.PodIP = "10.0.0.7"
	long := kubetest.Pod("a-namespace-with-a-long-name", strings.Repeat("web-", 20)+"x", "n", cap10, "10.0.0.8")
	for _, c := range []struct {
		p     *corev1.Pod
		ok    bool
		name  string
		addrs int
	}{
		{kubetest.Pod("a", "web", "n", cap10, "10.0.0.2", "fd00::2"), true, "a.web", 2},
		{kubetest.Pod("a", "pending", "n", cap10), false, "", 0},
		{kubetest.Pod("a", "plain", "n", nil, "10.0.0.3"), false, "", 0},
		{kubetest.Pod("a", "mapped", "n", cap10, "::ffff:10.0.0.4"), true, "a.mapped", 1},
		{done, false, "", 0}, {hostNet, false, "", 0}, {going, false, "", 0},
		{legacy, true, "a.legacy", 1},
		{long, true, "", 1},
	} {
		h, ok := HostOf(c.p, policy.Egress)
		if ok != c.ok || ok && (c.name != "" && h.Name != c.name || len(h.Addrs) != c.addrs || len(h.Name) > 64) {
			t.Errorf("%s/%s: %+v %v, want ok %v name %q with %d addresses", c.p.Namespace, c.p.Name, h, ok, c.ok, c.name, c.addrs)
		}
		if ok && h.Addrs[0] != h.Addrs[0].Unmap() {
			t.Errorf("%s: address %v kept mapped", h.Name, h.Addrs[0])
		}
	}
	a, _ := HostOf(long, policy.Egress)
	b, _ := HostOf(kubetest.Pod(long.Namespace, long.Name+"y", "n", cap10, "10.0.0.9"), policy.Egress)
	if a.Name == b.Name || !strings.HasPrefix(a.Name, "a-namespace-with-a-long-name.web-") {
		t.Errorf("long names %q and %q", a.Name, b.Name)
	}
}

// The file is the hosts_file the policy reads: sorted by name, a pod's
// address listed once, an unknown class left out, caps exact.
func TestRender(t *testing.T) {
	addr := netip.MustParseAddr
	hosts := []Host{
		{Name: "b.web", Addrs: []netip.Addr{addr("10.0.0.3")}, Wants: Wants{Cap: units.FromBits(2.5e6), Class: "gold"}},
		{Name: "a.db", Addrs: []netip.Addr{addr("10.0.0.2"), addr("fd00::2")}, Wants: Wants{Cap: units.FromBits(1e9)}},
		{Name: "c.stale", Addrs: []netip.Addr{addr("10.0.0.2")}, Wants: Wants{Cap: units.FromBits(1e6)}},
		{Name: "d.odd", Addrs: []netip.Addr{addr("10.0.0.4")}, Wants: Wants{Cap: units.FromBits(1234568), Class: "silver"}},
		{Name: "e.free", Addrs: []netip.Addr{addr("10.0.0.5")}},
	}
	got, dropped := Render(hosts, []string{"pods", "gold"})
	want := "name,addresses,rate,ceil,parent\n" +
		"a.db,10.0.0.2 fd00::2,,1gbit,\n" +
		"b.web,10.0.0.3,,2500kbit,gold\n" +
		"d.odd,10.0.0.4,,1234568bit,\n" +
		"e.free,10.0.0.5,,,\n"
	if string(got) != want {
		t.Errorf("file:\n%s\nwant:\n%s", got, want)
	}
	if len(dropped) != 2 || !strings.Contains(dropped["c.stale"][0], "10.0.0.2 is pod a.db's") || !strings.Contains(dropped["d.odd"][0], `"silver" names no class`) {
		t.Errorf("dropped %v", dropped)
	}
	// The file loads as the policy's hosts.
	pol, dir := loadWithPods(t, got, `interfaces:
  - name: eth0
    egress:
      rate: 10gbit
      default: rest
      classes:
        - {name: pods, rate: 5gbit, per_host: {pods: egress, hosts_file: pods.csv}}
        - {name: gold, rate: 1gbit}
        - {name: rest, rate: 1gbit}
`)
	ts := Targets(pol)
	if len(ts) != 1 || ts[0].File != filepath.Join(dir, "pods.csv") || ts[0].Dir != policy.Egress || strings.Join(ts[0].Classes, ",") != "pods,gold,rest" {
		t.Errorf("targets %+v", ts)
	}
	if n := len(pol.Interfaces[0].Egress.Classes[0].PerHost.Entries); n != 4 {
		t.Errorf("%d pods loaded, want 4", n)
	}
}

// The watcher keeps the pods file as the API says this node's pods
// are: an annotation edited, a pod deleted, a pod added show in the
// file and tell the agent; a bad annotation is an Event on its pod.
func TestWatcherKeepsTheFile(t *testing.T) {
	client := kubetest.Client(
		kubetest.Pod("shop", "web", "node-a", map[string]string{EgressBandwidth: "10M"}, "10.1.0.2"),
		kubetest.Pod("shop", "db", "node-a", map[string]string{EgressBandwidth: "ten", Class: "gold"}, "10.1.0.3"),
		kubetest.Pod("shop", "cache", "node-a", nil, "10.1.0.4"),
		kubetest.Pod("shop", "elsewhere", "node-b", map[string]string{EgressBandwidth: "1M"}, "10.1.9.9"),
	)
	changed := make(chan struct{}, 16)
	w := New(Config{Client: client, Node: "node-a", Changed: func() { changed <- struct{}{} }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "pods", "egress.csv")
	if err := w.SetTargets([]Target{{File: file, Dir: policy.Egress, Classes: []string{"pods", "gold"}}}); err != nil {
		t.Fatal(err)
	}
	read := reader(t, file)
	const header = "name,addresses,rate,ceil,parent\n"
	if got := read(); got != header+"shop.db,10.1.0.3,,,gold\nshop.web,10.1.0.2,,10mbit,\n" {
		t.Fatalf("first list:\n%s", got)
	}
	wait := func(want string) { t.Helper(); waitFiles(t, changed, read, want) }
	pods := client.Pods("shop")
	web, _ := pods.Get(ctx, "web", metav1.GetOptions{})
	web.Annotations[EgressBandwidth] = "20M"
	if _, err := pods.Update(ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(header + "shop.db,10.1.0.3,,,gold\nshop.web,10.1.0.2,,20mbit,\n")
	if err := pods.Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(header + "shop.web,10.1.0.2,,20mbit,\n")
	if _, err := pods.Create(ctx, kubetest.Pod("shop", "api", "node-a", map[string]string{OVNEgress: "5"}, "10.1.0.5"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(header + "shop.api,10.1.0.5,,5mbit,\nshop.web,10.1.0.2,,20mbit,\n")

	// The bad annotation: one Event on its pod, whatever the writes.
	if e := oneEvent(t, client, "shop"); e.InvolvedObject.Name != "db" || e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, EgressBandwidth) {
		t.Errorf("event %+v", e)
	}
	if s := w.Status(); s.Node != "node-a" || s.Pods != 3 || len(s.Files) != 1 || s.Writes < 4 {
		t.Errorf("status %+v", s)
	}
}

// A pods file that cannot be written (here its directory is a file;
// a full disk alike) is written once it can be, with no pod changing.
func TestWatcherRetriesAFailedWrite(t *testing.T) {
	client := kubetest.Client(kubetest.Pod("shop", "web", "node-a", map[string]string{EgressBandwidth: "10M"}, "10.1.0.2"))
	changed := make(chan struct{}, 16)
	w := New(Config{Client: client, Node: "node-a", Retry: 20 * time.Millisecond, Changed: func() { changed <- struct{}{} }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "pods")
	if err := os.WriteFile(dir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "egress.csv")
	if err := w.SetTargets([]Target{{File: file, Dir: policy.Egress, Classes: []string{"pods"}}}); err == nil {
		t.Fatal("SetTargets wrote below a file")
	}
	if s := w.Status(); s.Error == "" || s.Writes != 0 {
		t.Errorf("status %+v, want the error and no write", s)
	}
	time.Sleep(100 * time.Millisecond) // a few failed retries
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("the file was not written once it could be")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "name,addresses,rate,ceil,parent\nshop.web,10.1.0.2,,10mbit,\n" {
		t.Errorf("file %q, %v", b, err)
	}
	if s := w.Status(); s.Error != "" || s.Writes != 1 {
		t.Errorf("status %+v, want one write and no error", s)
	}
}

// No API server within the wait: Start says so, and nothing is written.
func TestWatcherWithoutAPI(t *testing.T) {
	f := &clienttesting.Fake{}
	f.AddReactor("list", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, context.DeadlineExceeded
	})
	w := New(Config{Client: kubetest.Fake{Fake: f}, Node: "n"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx, 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "could not be listed") {
		t.Fatalf("Start: %v", err)
	}
}

// Where a pod has a weight, every pod's rate is its weight's part of
// the pods class (1 where unset), and the policy resolves it so: the
// class's rate shared 3:1:1, each held at its cap.
func TestRenderWeights(t *testing.T) {
	addr := netip.MustParseAddr
	got, _ := Render([]Host{
		{Name: "a.heavy", Addrs: []netip.Addr{addr("10.0.0.2")}, Wants: Wants{Weight: 3}},
		{Name: "b.plain", Addrs: []netip.Addr{addr("10.0.0.3")}},
		{Name: "c.capped", Addrs: []netip.Addr{addr("10.0.0.4")}, Wants: Wants{Weight: 1, Cap: units.FromBits(50e6)}},
	}, []string{"pods"})
	entries := fileLoads(t, got, "name,addresses,rate,ceil,parent\n"+
		"a.heavy,10.0.0.2,60%,,\n"+
		"b.plain,10.0.0.3,20%,,\n"+
		"c.capped,10.0.0.4,20%,50mbit,\n", "")
	var rates []float64
	for _, e := range entries {
		rates = append(rates, e.RateBps.BitsFloat()/1e6)
	}
	if len(rates) != 3 || rates[0] != 300 || rates[1] != 100 || rates[2] != 50 {
		t.Errorf("rates %v Mbit/s, want 300, 100 and 50 (100 held at its 50 cap)", rates)
	}
}

// fileLoads fails the test unless got is want, then loads it as the
// hosts of a pods class (with extra keys, e.g. "prio: 2, ") of a 1gbit
// tree and returns them.
func fileLoads(t *testing.T, got []byte, want, extra string) []*policy.HostEntry {
	t.Helper()
	if string(got) != want {
		t.Fatalf("file:\n%s\nwant:\n%s", got, want)
	}
	pol, _ := loadWithPods(t, got, `interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      default: rest
      classes:
        - {name: pods, rate: 500mbit, `+extra+`per_host: {pods: egress, hosts_file: pods.csv}}
        - {name: rest, rate: 100mbit}
`)
	return pol.Interfaces[0].Egress.Classes[0].PerHost.Entries
}

// loadWithPods loads policyYAML with pods as its pods.csv, both in a
// new directory, which it returns with the policy.
func loadWithPods(t *testing.T, pods []byte, policyYAML string) (*policy.Policy, string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	for name, data := range map[string][]byte{"pods.csv": pods, "p.yaml": []byte(policyYAML)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pol, _, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	return pol, dir
}

// A pod's priority is the file's prio column, written only where a pod
// has one (other files keep their header), and loads as its host's.
func TestRenderPrio(t *testing.T) {
	addr := netip.MustParseAddr
	plain, _ := Render([]Host{{Name: "a.x", Addrs: []netip.Addr{addr("10.0.0.2")}}}, []string{"pods"})
	if string(plain) != "name,addresses,rate,ceil,parent\na.x,10.0.0.2,,,\n" {
		t.Errorf("without priorities:\n%s", plain)
	}
	got, _ := Render([]Host{
		{Name: "a.voice", Addrs: []netip.Addr{addr("10.0.0.2")}, Wants: Wants{Prio: ptr(0)}},
		{Name: "b.batch", Addrs: []netip.Addr{addr("10.0.0.3")}, Wants: Wants{Prio: ptr(6), Cap: units.FromBits(1e6)}},
		{Name: "c.plain", Addrs: []netip.Addr{addr("10.0.0.4")}},
	}, []string{"pods"})
	entries := fileLoads(t, got, "name,addresses,rate,ceil,parent,prio\n"+
		"a.voice,10.0.0.2,,,,0\n"+
		"b.batch,10.0.0.3,,1mbit,,6\n"+
		"c.plain,10.0.0.4,,,,\n", "prio: 2, ")
	var prios []string
	for _, e := range entries {
		if e.Prio == nil {
			prios = append(prios, "-")
		} else {
			prios = append(prios, strconv.Itoa(*e.Prio))
		}
	}
	if strings.Join(prios, " ") != "0 6 -" {
		t.Errorf("prios %v, want 0 6 -", prios)
	}
}

// reader reads file, failing the test where it cannot.
func reader(t *testing.T, file string) func() string {
	return func() string {
		t.Helper()
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
}

// waitFiles waits (5 s at most) until read gives want after a change the
// watcher told of.
func waitFiles(t *testing.T, changed <-chan struct{}, read func() string, want string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-changed:
			if read() == want {
				return
			}
		case <-deadline:
			t.Fatalf("file:\n%s\nwant:\n%s", read(), want)
		}
	}
}

// oneEvent waits (5 s at most) for the Event the watcher sends in
// namespace ns, and fails if there are more.
func oneEvent(t *testing.T, client kubetest.Fake, ns string) corev1.Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		evs, err := client.Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) == 1 {
			return evs.Items[0]
		}
		if len(evs.Items) > 1 || time.Now().After(deadline) {
			t.Fatalf("%d events, want 1: %+v", len(evs.Items), evs.Items)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The pods' hosts file may live in a directory sluice did not make
// (hosts_file: /var/lib/pods.csv): writing it changes nothing of the
// directory (issue 58: it was made 0700), and the file is private.
func TestWriteFileLeavesItsDirectoryAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lib")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	if err := writeFile(filepath.Join(dir, "pods.csv"), []byte("a,10.0.0.1\n")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the directory is now %v (%v), was 0755", fi.Mode().Perm(), err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "pods.csv")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("pods.csv: %v %v, want 0600", fi.Mode(), err)
	}
}

// An unreadable cap fails closed (issue 58): a pod whose annotation a
// typo breaks keeps its last good cap, a new pod with one gets its
// class's per-pod rate, never the class's ceil; the status counts them.
func TestWatcherFailsClosedOnAnUnreadableCap(t *testing.T) {
	client := kubetest.Client(
		kubetest.Pod("shop", "web", "node-a", map[string]string{EgressBandwidth: "10M"}, "10.1.0.2"),
		kubetest.Pod("shop", "db", "node-a", map[string]string{EgressBandwidth: "10 M"}, "10.1.0.3"),
	)
	changed := make(chan struct{}, 16)
	file := filepath.Join(t.TempDir(), "pods", "egress.csv")
	w := startWatcher(t, Config{Client: client, Node: "node-a", Changed: func() { changed <- struct{}{} }},
		Target{File: file, Dir: policy.Egress, Classes: []string{"pods"}, PodRate: units.FromBits(2e6)})
	ctx := context.Background()
	read := reader(t, file)
	const header = "name,addresses,rate,ceil,parent\n"
	if got := read(); got != header+"shop.db,10.1.0.3,,2mbit,\nshop.web,10.1.0.2,,10mbit,\n" {
		t.Fatalf("first list:\n%s", got)
	}
	wait := func(want string) { t.Helper(); waitFiles(t, changed, read, want) }
	pods := client.Pods("shop")
	set := func(v string) {
		t.Helper()
		web, _ := pods.Get(ctx, "web", metav1.GetOptions{})
		web.Annotations[EgressBandwidth] = v
		if _, err := pods.Update(ctx, web, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set("10Mbit") // a typo: web keeps 10mbit
	deadline := time.Now().Add(5 * time.Second)
	for w.Status().CapsUnreadable != 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s := w.Status(); s.CapsUnreadable != 2 {
		t.Fatalf("status %+v: want 2 caps unreadable", s)
	}
	if got := read(); got != header+"shop.db,10.1.0.3,,2mbit,\nshop.web,10.1.0.2,,10mbit,\n" {
		t.Fatalf("after a typo:\n%s", got)
	}
	set("30M")
	wait(header + "shop.db,10.1.0.3,,2mbit,\nshop.web,10.1.0.2,,30mbit,\n")
	set("30") // kubelet's would be 30 bit/s: refused, 30mbit kept
	set("40M")
	wait(header + "shop.db,10.1.0.3,,2mbit,\nshop.web,10.1.0.2,,40mbit,\n")
	if s := w.Status(); s.CapsUnreadable != 1 {
		t.Errorf("status %+v: want 1 cap unreadable", s)
	}
}

// A tenant editing a bad annotation in a loop with large values gets a
// bounded number of warnings and Events, each quoting the value's start
// only, and the watcher remembers hashes, not values (issue 58: 150 edits
// of up to 256 KiB left 149 Events and grew the agent by 32 MB). The
// fake API names no Event (GenerateName), so the log counts them: one
// line per Event.
func TestWatcherBoundsWhatABadAnnotationCosts(t *testing.T) {
	client := kubetest.Client(kubetest.Pod("shop", "web", "node-a", map[string]string{EgressBandwidth: "10M"}, "10.1.0.2"))
	var logs syncBuffer
	w := startWatcher(t, Config{Client: client, Node: "node-a", Log: slog.New(slog.NewTextHandler(&logs, nil))},
		Target{File: filepath.Join(t.TempDir(), "pods", "egress.csv"), Dir: policy.Egress, Classes: []string{"pods"}})
	ctx := context.Background()
	pods := client.Pods("shop")
	const edits = 20
	for i := 0; i < edits; i++ {
		web, _ := pods.Get(ctx, "web", metav1.GetOptions{})
		web.Annotations[EgressBandwidth] = fmt.Sprintf("%d%s", i, strings.Repeat("x", 100_000))
		if _, err := pods.Update(ctx, web, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	var told []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "annotation not used") {
			told = append(told, l)
		}
	}
	if len(told) != MaxTells+1 || !strings.Contains(told[len(told)-1], "the next are not told") {
		t.Errorf("%d warnings for %d bad values; want %d, the last saying the rest are not told:\n%s", len(told), edits, MaxTells+1, strings.Join(told, "\n"))
	}
	for _, l := range told {
		if len(l) > 600 {
			t.Errorf("a warning of %d bytes: %.200s", len(l), l)
		}
	}
	w.mu.Lock()
	for k := range w.told {
		if len(k) > 100 {
			t.Errorf("the watcher remembers %d bytes for one problem", len(k))
		}
	}
	w.mu.Unlock()
}

// syncBuffer is a bytes.Buffer for a logger that writes from several
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startWatcher starts a watcher with cfg keeping targets ts, stopped
// when the test ends.
func startWatcher(t *testing.T, cfg Config, ts ...Target) *Watcher {
	t.Helper()
	w := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := w.Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.SetTargets(ts); err != nil {
		t.Fatal(err)
	}
	return w
}
