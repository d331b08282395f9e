package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/kube/corev1"
	"sluice/kube/kubetest"
	"sluice/policy"
	"sluice/units"
)

// A namespace's aggregate in a direction: its guarantee and cap, either
// making it one; a bad value is a problem, the aggregate stays.
func TestGroupOf(t *testing.T) {
	mbit := func(n float64) units.Rate { return units.FromBits(n * 1e6) }
	cases := []struct {
		name      string
		ann       map[string]string
		dir       string
		ok        bool
		guar, cap units.Rate
		problem   string
	}{
		{"none", nil, policy.Egress, false, 0, 0, ""},
		{"both", map[string]string{EgressGuarantee: "20M", EgressCap: "50M"}, policy.Egress, true, mbit(20), mbit(50), ""},
		{"the cap alone", map[string]string{EgressCap: "1G"}, policy.Egress, true, 0, mbit(1000), ""},
		{"the other direction's", map[string]string{IngressCap: "1G"}, policy.Egress, false, 0, 0, ""},
		{"ingress", map[string]string{IngressGuarantee: "5M", IngressCap: "1G"}, policy.Ingress, true, mbit(5), mbit(1000), ""},
		{"a bad cap", map[string]string{EgressGuarantee: "20M", EgressCap: "fifty"}, policy.Egress, true, mbit(20), 0, EgressCap + `: "fifty": not a quantity`},
	}
	for _, c := range cases {
		g, ok := GroupOf(kubetest.Namespace("shop", c.ann), c.dir)
		var problems []string
		for _, p := range g.Problems {
			problems = append(problems, p.String())
		}
		if ok != c.ok || ok && (g.Name != "shop" || g.Guarantee != c.guar || g.Cap != c.cap) || !strings.Contains(strings.Join(problems, ";"), c.problem) || c.problem == "" && len(problems) > 0 {
			t.Errorf("%s: %+v %v, want ok %v guarantee %s cap %s problem %q", c.name, g, ok, c.ok, c.guar, c.cap, c.problem)
		}
	}
	if _, ok := GroupOf(nil, policy.Egress); ok {
		t.Error("a namespace not listed has an aggregate")
	}
}

// A pod of an aggregated namespace is a host without annotations of its
// own, below its namespace, and cannot leave it by naming a class; the
// groups file lists the groups the pods file names, and both load: the
// namespace a class below the pods class, its pods below it.
func TestRenderGroups(t *testing.T) {
	ann := map[string]string{EgressBandwidth: "5M", Class: "gold"}
	var hosts []Host
	for i, p := range []*corev1.Pod{
		kubetest.Pod("shop", "web", "n", ann, "10.0.0.2"),
		kubetest.Pod("shop", "cache", "n", nil, "10.0.0.3"),
		kubetest.Pod("lab", "x", "n", map[string]string{EgressBandwidth: "1M", Class: "shop"}, "10.0.0.4"),
		kubetest.Pod("lab", "y", "n", nil, "10.0.0.5"),
	} {
		h, ok := HostIn(p, policy.Egress, p.Namespace == "shop")
		if !ok != (i == 3) {
			t.Fatalf("%s: host %v", p.Name, ok)
		}
		if ok {
			hosts = append(hosts, h)
		}
	}
	if web := hosts[0]; web.Group != "shop" || web.Class != "" || len(web.Problems) != 1 || !strings.Contains(web.Problems[0].String(), "namespace shop is an aggregate") {
		t.Errorf("web: %+v", web)
	}
	groups := map[string]Group{"shop": {Name: "shop", Guarantee: units.FromBits(20e6), Cap: units.FromBits(50e6)}}
	gfile := RenderGroups(hosts, groups)
	if string(gfile) != "name,rate,ceil\nshop,20mbit,50mbit\n" {
		t.Errorf("groups file:\n%s", gfile)
	}
	pods, dropped := Render(hosts, []string{"pods", "gold", "shop"})
	want := "name,addresses,rate,ceil,parent\nlab.x,10.0.0.4,,1mbit,\nshop.cache,10.0.0.3,,,shop\nshop.web,10.0.0.2,,5mbit,shop\n"
	if string(pods) != want {
		t.Errorf("pods file:\n%s\nwant:\n%s", pods, want)
	}
	// lab.x names a class "shop" that the namespace's group shadows.
	if why := fmt.Sprint(dropped["lab.x"]); !strings.Contains(why, "namespace shop is an aggregate on this node") {
		t.Errorf("dropped %v", dropped)
	}

	pol, dir := loadWithPods(t, pods, `interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      default: rest
      classes:
        - {name: pods, rate: 500mbit, per_host: {pods: egress, hosts_file: pods.csv}}
        - {name: shop, rate: 100mbit}
        - {name: rest, rate: 100mbit}
`)
	if len(pol.Interfaces[0].Egress.Classes[0].Classes) != 0 {
		t.Fatal("groups before the groups file was written")
	}
	if err := os.WriteFile(policy.PodsGroupsFile(filepath.Join(dir, "pods.csv")), gfile, 0o644); err != nil {
		t.Fatal(err)
	}
	pol, _, err := policy.Load(pol.File)
	if err != nil {
		t.Fatal(err)
	}
	podsCls := pol.Interfaces[0].Egress.Classes[0]
	if len(podsCls.Classes) != 1 {
		t.Fatalf("%d groups", len(podsCls.Classes))
	}
	shop := podsCls.Classes[0]
	if shop.Name != "pods:shop" || shop.RateBps != units.FromBits(20e6) || shop.CeilBps != units.FromBits(50e6) || len(shop.Hosts) != 2 {
		t.Errorf("group %s: rate %s ceil %s, %d pods", shop.Name, shop.RateBps, shop.CeilBps, len(shop.Hosts))
	}
	if x := podsCls.PerHost.Entries[0]; x.Name != "lab.x" || x.ParentCls != podsCls {
		t.Errorf("%s below %s", x.Name, x.ParentCls.Name)
	}
	// Targets: the groups file, on an HTB tree as on an EDT tree.
	if ts := Targets(pol); len(ts) != 1 || ts[0].Groups != policy.PodsGroupsFile(filepath.Join(dir, "pods.csv")) {
		t.Errorf("targets %+v", ts)
	}
	edt, edtDir := loadWithPods(t, pods, `interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      backend: edt
      default: rest
      classes:
        - {name: pods, rate: 500mbit, per_host: {pods: egress, hosts_file: pods.csv}}
        - {name: rest, rate: 100mbit}
`)
	if ts := Targets(edt); len(ts) != 1 || ts[0].Groups != policy.PodsGroupsFile(filepath.Join(edtDir, "pods.csv")) {
		t.Errorf("EDT targets %+v", ts)
	}
}

// The watcher keeps the groups file beside the pods file as the API says
// the namespaces are: an aggregate added, edited and removed shows in
// both files; a bad annotation is an Event on the namespace.
func TestWatcherKeepsTheGroups(t *testing.T) {
	client := kubetest.Client(
		kubetest.Namespace("shop", map[string]string{EgressGuarantee: "20M", EgressCap: "50M"}),
		kubetest.Namespace("lab", nil),
		kubetest.Pod("shop", "web", "node-a", map[string]string{EgressBandwidth: "10M"}, "10.1.0.2"),
		kubetest.Pod("shop", "cache", "node-a", nil, "10.1.0.3"),
		kubetest.Pod("lab", "x", "node-a", map[string]string{EgressBandwidth: "1M"}, "10.1.0.4"),
		kubetest.Pod("lab", "y", "node-a", nil, "10.1.0.5"),
	)
	changed := make(chan struct{}, 16)
	w := New(Config{Client: client, Node: "node-a", Changed: func() { changed <- struct{}{} }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file, gfile := filepath.Join(dir, "egress.csv"), filepath.Join(dir, "egress.namespaces.csv")
	if err := w.SetTargets([]Target{{File: file, Dir: policy.Egress, Classes: []string{"pods"}, Groups: gfile}}); err != nil {
		t.Fatal(err)
	}
	read := func() string {
		a, err := os.ReadFile(gfile)
		b, err2 := os.ReadFile(file)
		if err != nil || err2 != nil {
			t.Fatal(err, err2)
		}
		return string(a) + "--\n" + string(b)
	}
	const gh, ph = "name,rate,ceil\n", "name,addresses,rate,ceil,parent\n"
	if got, want := read(), gh+"shop,20mbit,50mbit\n--\n"+ph+"lab.x,10.1.0.4,,1mbit,\nshop.cache,10.1.0.3,,,shop\nshop.web,10.1.0.2,,10mbit,shop\n"; got != want {
		t.Fatalf("first list:\n%s\nwant:\n%s", got, want)
	}
	wait := func(want string) { t.Helper(); waitFiles(t, changed, read, want) }
	nss := client.Namespaces()
	edit := func(name string, ann map[string]string) {
		t.Helper()
		ns, err := nss.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ns.Annotations = ann
		if _, err := nss.Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	edit("shop", map[string]string{EgressCap: "80M"})
	wait(gh + "shop,,80mbit\n--\n" + ph + "lab.x,10.1.0.4,,1mbit,\nshop.cache,10.1.0.3,,,shop\nshop.web,10.1.0.2,,10mbit,shop\n")
	edit("lab", map[string]string{EgressGuarantee: "lots"})
	wait(gh + "lab,,\nshop,,80mbit\n--\n" + ph + "lab.x,10.1.0.4,,1mbit,lab\nlab.y,10.1.0.5,,,lab\nshop.cache,10.1.0.3,,,shop\nshop.web,10.1.0.2,,10mbit,shop\n")
	edit("shop", nil)
	wait(gh + "lab,,\n--\n" + ph + "lab.x,10.1.0.4,,1mbit,lab\nlab.y,10.1.0.5,,,lab\nshop.web,10.1.0.2,,10mbit,\n")

	// The bad guarantee: an Event on the namespace (in default: a
	// namespace is cluster-scoped).
	if e := oneEvent(t, client, metav1.NamespaceDefault); e.InvolvedObject.Kind != "Namespace" || e.InvolvedObject.Name != "lab" || e.InvolvedObject.Namespace != "" || !strings.Contains(e.Message, EgressGuarantee) {
		t.Errorf("event %+v", e)
	}
}
