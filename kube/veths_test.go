package kube

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/kube/corev1"
	"sluice/kube/kubetest"
	"sluice/policy"
)

// fakeRoutes is a node's routes for pod_veths: an address's device,
// "bridge:NAME" for a bridge's, or none yet.
type fakeRoutes struct {
	mu  sync.Mutex
	dev map[string]string
}

func (f *fakeRoutes) set(addr, dev string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dev[addr] = dev
}

func (f *fakeRoutes) device(addrs []netip.Addr) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.dev[addrs[0].String()]
	switch {
	case !ok:
		return "", fmt.Errorf("no route to %s yet", addrs[0])
	case strings.HasPrefix(d, "bridge:"):
		return "", fmt.Errorf("%s is routed through %s, a bridge device: %w", addrs[0], d[7:], ErrNotOwn)
	}
	return d, nil
}

// The pod_veths file: each pod with a cap in either direction on the
// device its address is routed through; a pod whose device is not up
// yet is listed once it is (looked for again, no pod changing), a pod
// behind a bridge or on a device another pod has is not, with an Event
// on it; an edit and a deletion follow.
func TestWatcherKeepsTheVeths(t *testing.T) {
	client := kubetest.Client(
		kubetest.Pod("shop", "web", "node-a", map[string]string{IngressBandwidth: "10M", EgressBandwidth: "2M"}, "10.1.0.2"),
		kubetest.Pod("shop", "db", "node-a", map[string]string{OVNIngress: "5"}, "10.1.0.3"),
		kubetest.Pod("shop", "late", "node-a", map[string]string{EgressBandwidth: "1M"}, "10.1.0.4"),
		kubetest.Pod("shop", "bridged", "node-a", map[string]string{EgressBandwidth: "1M"}, "10.1.0.5"),
		kubetest.Pod("shop", "plain", "node-a", map[string]string{Weight: "3"}, "10.1.0.6"), // no cap: nothing to shape
		kubetest.Pod("bad", "ten", "node-a", map[string]string{IngressBandwidth: "ten", Weight: "x"}, "10.1.0.7"),
		kubetest.Pod("n1", "a", "node-a", map[string]string{EgressBandwidth: "1M"}, "10.1.1.2"),
		kubetest.Pod("n2", "b", "node-a", map[string]string{EgressBandwidth: "1M"}, "10.1.1.3"),
	)
	routes := &fakeRoutes{dev: map[string]string{
		"10.1.0.2": "cali0web", "10.1.0.3": "cali0db", "10.1.0.5": "bridge:cni0", "10.1.0.6": "cali0plain",
		"10.1.1.2": "vxshared", "10.1.1.3": "vxshared",
	}}
	changed := make(chan struct{}, 16)
	w := New(Config{Client: client, Node: "node-a", Device: routes.device, Retry: 20 * time.Millisecond,
		Changed: func() { changed <- struct{}{} }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "pods", "veths.csv")
	if err := w.SetTargets([]Target{{File: file, Veths: true}}); err != nil {
		t.Fatal(err)
	}
	read := reader(t, file)
	const header = policy.PodVethsHeader + "\n"
	if got := read(); got != header+"cali0db,shop.db,5mbit,\ncali0web,shop.web,10mbit,2mbit\n" {
		t.Fatalf("first list:\n%s", got)
	}
	wait := func(want string) { t.Helper(); waitFiles(t, changed, read, want) }
	routes.set("10.1.0.4", "cali0late")
	wait(header + "cali0db,shop.db,5mbit,\ncali0late,shop.late,,1mbit\ncali0web,shop.web,10mbit,2mbit\n")

	pods := client.Pods("shop")
	web, _ := pods.Get(ctx, "web", metav1.GetOptions{})
	web.Annotations[IngressBandwidth] = "20M"
	delete(web.Annotations, EgressBandwidth)
	if _, err := pods.Update(ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(header + "cali0db,shop.db,5mbit,\ncali0late,shop.late,,1mbit\ncali0web,shop.web,20mbit,\n")
	if err := pods.Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(header + "cali0late,shop.late,,1mbit\ncali0web,shop.web,20mbit,\n")

	// The bridged pod's Event says why; the two on one device get one each.
	if e := oneEvent(t, client, "shop"); e.InvolvedObject.Name != "bridged" || e.Reason != NotOnVeth || !strings.Contains(e.Message, "cni0, a bridge") {
		t.Errorf("event %+v", e)
	}
	// The cap that cannot be read: an Event, as for a pods class (the
	// weight is no concern of a veth's).
	if e := oneEvent(t, client, "bad"); e.Reason != "BadBandwidthAnnotation" || !strings.Contains(e.Message, IngressBandwidth) {
		t.Errorf("event %+v", e)
	}
	for _, ns := range []string{"n1", "n2"} {
		if e := oneEvent(t, client, ns); e.Reason != NotOnVeth || !strings.Contains(e.Message, "device vxshared carries pods n1.a, n2.b") {
			t.Errorf("event %+v", e)
		}
	}
}

// VethsOf on pods that are no hosts: finished, on the host's network,
// without an address.
func TestVethsOfSkips(t *testing.T) {
	ann := map[string]string{EgressBandwidth: "1M"}
	done := kubetest.Pod("shop", "done", "node-a", ann, "10.1.0.2")
	done.Status.Phase = corev1.PodSucceeded
	host := kubetest.Pod("shop", "host", "node-a", ann, "10.1.0.3")
	host.Spec.HostNetwork = true
	none := kubetest.Pod("shop", "none", "node-a", ann)
	asked := 0
	veths, pending, refused := VethsOf([]*corev1.Pod{done, host, none}, func([]netip.Addr) (string, error) { asked++; return "x", nil })
	if len(veths)+len(pending)+len(refused) != 0 || asked != 0 {
		t.Errorf("veths %v, pending %v, refused %v, %d lookups", veths, pending, refused, asked)
	}
}
