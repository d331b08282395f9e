package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/kube"
	"sluice/kube/kubetest"
	"sluice/testutil"
)

// podNode is a Kubernetes node as a routed CNI (Calico) builds it: each
// pod a namespace with eth0 and a /32, its host side a veth of the
// node's namespace with a route to the pod's address, the pod's
// default route through the node.
type podNode struct {
	ns   string
	pods map[string]podNet // by pod name
}

type podNet struct{ ns, veth, addr string }

func newPodNode(t *testing.T) *podNode {
	t.Helper()
	n := &podNode{ns: testutil.NewNetns(t, "n"), pods: map[string]podNet{}}
	testutil.NS(t, n.ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return n
}

// add makes pod name at addr behind the node's veth dev.
func (n *podNode) add(t *testing.T, name, veth, addr string) podNet {
	t.Helper()
	p := podNet{ns: testutil.NewNetns(t, "p"), veth: veth, addr: addr}
	tmp := testutil.Unique("v")
	testutil.Run(t, "ip", "link", "add", tmp, "type", "veth", "peer", "name", tmp+"p")
	testutil.Run(t, "ip", "link", "set", tmp, "netns", n.ns, "name", veth)
	testutil.Run(t, "ip", "link", "set", tmp+"p", "netns", p.ns, "name", "eth0")
	// Calico's: the node answers for a link-local gateway on each veth.
	testutil.NS(t, n.ns, "ip", "addr", "add", "169.254.1.1/32", "dev", veth)
	testutil.NS(t, n.ns, "ip", "link", "set", veth, "up")
	testutil.NS(t, n.ns, "ip", "route", "add", addr+"/32", "dev", veth)
	testutil.NS(t, p.ns, "ip", "addr", "add", addr+"/32", "dev", "eth0")
	testutil.NS(t, p.ns, "ip", "link", "set", "eth0", "up")
	testutil.NS(t, p.ns, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
	testutil.NS(t, p.ns, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
	n.pods[name] = p
	return p
}

// goodput sends two TCP flows from pod from to pod to for 5 s and
// returns the goodput in Mbit/s. (A pod's packets reach its veth as
// GSO packets of up to 64 KB, and a bfifo leaf of 70 KB, the host's
// auto without fq_codel, drops whole ones: at 3 Mbit/s two flows
// retransmit a fifth of what they send, and one timeout in a 3 s
// window cost a third of it, once in 15 runs.)
func (n *podNode) goodput(t *testing.T, from, to string, port int) float64 {
	t.Helper()
	dst := n.pods[to]
	sink, err := testutil.TCPSink(dst.ns, dst.addr, port)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	const d = 5 * time.Second
	flows, err := testutil.TCPSend(n.pods[from].ns, dst.addr, port, 2, d)
	if err != nil {
		t.Fatal(err)
	}
	var b uint64
	for _, f := range flows {
		b += f.BytesAcked
	}
	t.Logf("%s to %s: %+v", from, to, flows)
	return float64(b) * 8 / d.Seconds() / 1e6
}

// TestKubernetesPodVeths: pod_veths shapes each pod on its own host
// veth, as the CNI bandwidth plugin does, on a node whose CNI routes
// to each pod (Calico's layout): what a pod receives at its
// ingress-bandwidth on the veth's egress, what it sends at its
// egress-bandwidth on an ifb of the veth's ingress, traffic between two
// pods of the node included; a pod behind a bridge is not (an Event
// says why). An annotation edited applies live; a pod whose sandbox
// (its veth) goes before the API says so costs no error and leaves no
// ifb; a pod deleted leaves nothing on its veth.
func TestKubernetesPodVeths(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	n := newPodNode(t)
	web := n.add(t, "web", "caliweb", "10.66.0.2")
	db := n.add(t, "db", "calidb", "10.66.0.3")
	n.add(t, "client", "caliclient", "10.66.0.4")
	// And one behind a bridge, as a bridge CNI's pods are: not its own.
	testutil.NS(t, n.ns, "ip", "link", "add", "cni0", "type", "bridge")
	testutil.NS(t, n.ns, "ip", "addr", "add", "10.66.1.1/24", "dev", "cni0")
	testutil.NS(t, n.ns, "ip", "link", "set", "cni0", "up")
	client := kubetest.Client(
		kubetest.Pod("old", "bridged", "node-a", map[string]string{kube.EgressBandwidth: "1M"}, "10.66.1.2"),
		kubetest.Pod("shop", "web", "node-a", map[string]string{kube.IngressBandwidth: "5M"}, web.addr),
		kubetest.Pod("shop", "db", "node-a", map[string]string{kube.EgressBandwidth: "3M"}, db.addr),
		kubetest.Pod("shop", "client", "node-a", nil, "10.66.0.4"), // no cap: not shaped
	)
	state := stateDir(t)
	t.Setenv("SLUICE_STATE_DIR", state)
	pol, err := filepath.Abs("../examples/k8s-veths.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a := runPodsAgent(t, pol, n.ns, client)
	ctx := context.Background()

	trees := func() map[string]float64 { return vethTrees(t, n.ns) }
	waitTrees := func(what string, d time.Duration, ok func(map[string]float64) bool) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			m := trees()
			if ok(m) {
				return time.Since(start)
			}
			if time.Since(start) > d {
				t.Fatalf("%s: not within %s; the node's trees: %v", what, d, m)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitTrees("the pods' veths shaped", 10*time.Second, func(m map[string]float64) bool {
		return len(m) == 2 && m["caliweb egress"] == 5 && m["calidb ingress"] == 3
	})
	b, err := os.ReadFile(filepath.Join(state, "pods", "veths.csv"))
	if err != nil || string(b) != "device,pod,ingress,egress\ncalidb,shop.db,,3mbit\ncaliweb,shop.web,5mbit,\n" {
		t.Fatalf("veths file %q, %v", b, err)
	}

	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		evs, err := client.Events("old").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) == 1 && evs.Items[0].Reason == kube.NotOnVeth && strings.Contains(evs.Items[0].Message, "cni0, a bridge device") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bridged pod's events: %+v", evs.Items)
		}
	}

	// Between pods of the node: shaped both ways.
	if g := n.goodput(t, "client", "web", 5501); g < 3.75 || g > 5.25 {
		t.Errorf("client to web (receives at most 5M): %.2f Mbit/s", g)
	} else {
		t.Logf("client to web (receives at most 5M): %.2f Mbit/s", g)
	}
	if g := n.goodput(t, "db", "client", 5502); g < 2.25 || g > 3.15 {
		t.Errorf("db to client (sends at most 3M): %.2f Mbit/s", g)
	} else {
		t.Logf("db to client (sends at most 3M): %.2f Mbit/s", g)
	}

	// An edit, live.
	annotate(t, client, "shop", "web", kube.IngressBandwidth, "10M")
	took := waitTrees("an annotation edit", 3*time.Second, func(m map[string]float64) bool { return m["caliweb egress"] == 10 })
	t.Logf("annotation edit in the kernel after %v", took)
	if took > time.Second {
		t.Errorf("an annotation edit reached the kernel after %v, want under a second", took)
	}
	if g := n.goodput(t, "client", "web", 5504); g < 7.5 || g > 10.5 {
		t.Errorf("after the edit: %.2f Mbit/s to web, want its new 10M", g)
	}

	// A pod whose sandbox (and veth) went before the API said so: the
	// passes meanwhile shape what is there, without an error, and its
	// ifb goes with the veth.
	noIfb := func(what string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for testutil.NS(t, n.ns, "ip", "-o", "link", "show", "type", "ifb") != "" {
			if time.Now().After(deadline) {
				t.Fatalf("%s: an ifb is still there: %s", what, testutil.NS(t, n.ns, "ip", "-o", "link", "show", "type", "ifb"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if testutil.NS(t, n.ns, "ip", "-o", "link", "show", "type", "ifb") == "" {
		t.Fatal("no ifb for db's egress cap")
	}
	testutil.Run(t, "ip", "netns", "del", db.ns)
	noIfb("db's veth gone")
	time.Sleep(time.Second) // passes with the veth gone and still listed
	if h := a.Status(false).Health; h.LastResult == "error" || h.ReloadError != "" {
		t.Errorf("health with a listed veth gone: %+v", h)
	}
	pods := client.Pods("shop")
	if err := pods.Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A pod deleted: its tree goes from its veth, which stays.
	if err := pods.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTrees("the last pod gone", 3*time.Second, func(m map[string]float64) bool { return len(m) == 0 })
	if q := testutil.NS(t, n.ns, "tc", "qdisc", "show", "dev", web.veth, "root"); strings.Contains(q, "htb") {
		t.Errorf("web's veth still has sluice's tree: %s", q)
	}
	if h := a.Status(false).Health; h.LastResult == "error" || h.ReloadError != "" {
		t.Errorf("health once the pods are gone: %+v", h)
	}
	noIfb("every pod gone")
	b, err = os.ReadFile(filepath.Join(state, "pods", "veths.csv"))
	if err != nil || string(b) != "device,pod,ingress,egress\n" {
		t.Errorf("veths file %q, %v; want the header alone", b, err)
	}
}

// vethTrees reads the trees sluice shapes in namespace ns, as show
// reads them from the kernel: "DEVICE DIRECTION" (the interface's, an
// ingress tree on its ifb) to the root class's ceil in Mbit/s. A tree
// the records name but the kernel no longer has is left out.
func vethTrees(t *testing.T, ns string) map[string]float64 {
	t.Helper()
	var sample struct {
		Trees []struct {
			Interface string `json:"interface"`
			Direction string `json:"direction"`
			Missing   bool   `json:"missing"`
			Classes   []struct {
				Depth int     `json:"depth"`
				Ceil  float64 `json:"ceil_bytes_per_second"`
			} `json:"classes"`
		} `json:"trees"`
	}
	out := must(t, "--netns", ns, "show", "--json", "--local", "--interval", "0")
	if err := json.Unmarshal([]byte(out), &sample); err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for _, tr := range sample.Trees {
		if tr.Missing || len(tr.Classes) == 0 || tr.Classes[0].Depth != 0 {
			continue
		}
		m[fmt.Sprintf("%s %s", tr.Interface, tr.Direction)] = tr.Classes[0].Ceil * 8 / 1e6
	}
	return m
}
