package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/agent"
	"sluice/kube"
	"sluice/kube/kubetest"
	"sluice/testutil"
)

// The agent with --kubernetes shapes pods from their annotations, on
// the kernel: each pod with an ingress-bandwidth annotation becomes a
// class capped at it (traffic to the pod measured at the cap), an edit
// of the annotation reaches the kernel within a second, and a deleted
// pod's class goes. The API is client-go's fake (kube/kubetest); the
// real API server's test is TestKubernetesAgainstAPIServer. The pods are
// addresses of namespace B, behind veth0 of A, which the policy shapes
// (as a node shapes cni0 toward its pods).
func TestKubernetesPodsShaped(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	client := kubetest.Client(
		kubetest.Pod("shop", "web", "node-a", map[string]string{kube.IngressBandwidth: "5M"}, testutil.AddrB),
		kubetest.Pod("shop", "db", "node-a", map[string]string{kube.IngressBandwidth: "2M"}, "10.9.0.3"),
		kubetest.Pod("shop", "other-node", "node-b", map[string]string{kube.IngressBandwidth: "1M"}, "10.9.0.4"),
	)
	p, a := podsAgent(t, client)
	ctx := context.Background()

	waitFor := func(what string, d time.Duration, ok func(map[string]float64) bool) time.Duration {
		t.Helper()
		return waitPods(t, p.A, what, d, ok)
	}
	waitFor("the node's pods shaped", 10*time.Second, func(m map[string]float64) bool {
		return len(m) == 2 && m["pods/shop.web"] == 5 && m["pods/shop.db"] == 2
	})
	waitClassifier(t, p.A, p.DevA)

	// Traffic to the pods, each at its cap.
	goodput := func(addr string, port int) float64 { return goodputTo(t, p, addr, port) }
	for _, c := range []struct {
		addr string
		port int
		cap  float64
	}{{testutil.AddrB, 5401, 5}, {"10.9.0.3", 5402, 2}} {
		g := goodput(c.addr, c.port)
		t.Logf("to %s (cap %.0f Mbit/s): %.2f Mbit/s", c.addr, c.cap, g)
		if g < 0.8*c.cap || g > 1.05*c.cap {
			t.Errorf("to %s: %.2f Mbit/s of goodput through a %.0f Mbit/s cap", c.addr, g, c.cap)
		}
	}

	// An annotation edited: live, within a second.
	annotate(t, client, "shop", "web", kube.IngressBandwidth, "10M")
	took := waitFor("an annotation edit", 3*time.Second, func(m map[string]float64) bool { return m["pods/shop.web"] == 10 })
	t.Logf("annotation edit in the kernel after %v", took)
	if took > time.Second {
		t.Errorf("an annotation edit reached the kernel after %v, want under a second", took)
	}
	if g := goodput(testutil.AddrB, 5403); g < 8 || g > 10.5 {
		t.Errorf("after the edit: %.2f Mbit/s through a 10 Mbit/s cap", g)
	}

	// A pod deleted: its class goes.
	pods := client.Pods("shop")
	if err := pods.Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took = waitFor("a deleted pod", 3*time.Second, func(m map[string]float64) bool {
		_, has := m["pods/shop.db"]
		return !has && len(m) == 1
	})
	t.Logf("deleted pod gone from the kernel after %v", took)
	if st := a.Status(false); st.Kubernetes == nil || st.Kubernetes.Node != "node-a" || st.Kubernetes.Pods != 1 {
		t.Errorf("status: %+v", st.Kubernetes)
	}

	// A priority: the pod's HTB class takes it, as tc reads it back.
	if got := classPrio(t, p.A, p.DevA, "pods/shop.web"); got != "0" {
		t.Fatalf("before sluice.io/priority: prio %s, want the class's 0", got)
	}
	annotate(t, client, "shop", "web", kube.Priority, "5")
	deadline := time.Now().Add(5 * time.Second)
	for classPrio(t, p.A, p.DevA, "pods/shop.web") != "5" {
		if time.Now().After(deadline) {
			t.Fatalf("sluice.io/priority 5 not in the kernel within 5 s: prio %s", classPrio(t, p.A, p.DevA, "pods/shop.web"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m := podCeils(t, p.A); m["pods/shop.web"] != 10 {
		t.Errorf("after the priority: %v, want the 10 Mbit/s cap kept", m)
	}
}

// A namespace's aggregate (its sluice.io/ingress-cap) caps what its pods
// receive together, on the kernel, each pod still below its own cap and
// the two sharing the aggregate evenly; removed, the pods hang below the
// pods class again, each at its own cap.
func TestKubernetesNamespaceAggregate(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	client := kubetest.Client(
		kubetest.Namespace("shop", map[string]string{kube.IngressGuarantee: "2M", kube.IngressCap: "6M"}),
		kubetest.Pod("shop", "web", "node-a", map[string]string{kube.IngressBandwidth: "10M"}, testutil.AddrB),
		kubetest.Pod("shop", "db", "node-a", nil, "10.9.0.3"), // no cap of its own: in the aggregate
	)
	p, _ := podsAgent(t, client)
	waitPods(t, p.A, "the namespace's aggregate", 10*time.Second, func(m map[string]float64) bool {
		return len(m) == 3 && m["pods:shop"] == 6 && m["pods/shop.web"] == 10 && m["pods/shop.db"] >= 80
	})
	waitClassifier(t, p.A, p.DevA)
	if got := classParent(t, p.A, p.DevA, "pods/shop.db"); got != classID(t, p.A, p.DevA, "pods:shop") {
		t.Fatalf("pods/shop.db's parent is %s, want pods/shop's class", got)
	}

	// Both pods at once: 6 Mbit/s between them, evenly.
	for addr, mbit := range bothPods(t, p, 6) {
		if mbit < 2.2 || mbit > 3.8 {
			t.Errorf("to %s: %.2f Mbit/s, want about half the aggregate's 6", addr, mbit)
		}
	}
	weighedPods(t, client, p, 6)
	unannotate(t, client, "shop")
	waitPods(t, p.A, "the aggregate removed", 5*time.Second, func(m map[string]float64) bool {
		return len(m) == 1 && m["pods/shop.web"] == 10
	})
	if got := classParent(t, p.A, p.DevA, "pods/shop.web"); got != classID(t, p.A, p.DevA, "pods") {
		t.Errorf("pods/shop.web's parent is %s, want the pods class's", got)
	}
}

// On an EDT tree (Debian's kernels: the lane) a namespace's aggregate
// is an aggregate of its own, a clock its pods take slots on too: a pod
// capped at 10M and one without a cap, in a namespace capped at 6M, get
// 6 Mbit/s together, and show counts what passed it. The annotations
// removed, it goes.
func TestEDTNamespaceAggregate(t *testing.T) {
	needFq(t)
	client := kubetest.Client(
		kubetest.Namespace("shop", map[string]string{kube.IngressGuarantee: "2M", kube.IngressCap: "6M"}),
		kubetest.Pod("shop", "web", "node-a", map[string]string{kube.IngressBandwidth: "10M"}, testutil.AddrB),
		kubetest.Pod("shop", "db", "node-a", nil, "10.9.0.3"),
	)
	p, _ := podsAgentOn(t, client, func(dev string) string {
		return strings.Replace(podsPolicy(dev), "classifier: bpf", "backend: edt", 1)
	})
	waitPods(t, p.A, "the namespace's aggregate", 10*time.Second, func(m map[string]float64) bool {
		return len(m) == 3 && m["pods:shop"] == 6 && m["pods/shop.web"] == 10 && m["pods/shop.db"] >= 80
	})
	waitClassifier(t, p.A, p.DevA)
	// Per flow within the aggregate, as fq shares (two flows each).
	for addr, mbit := range bothPods(t, p, 6) {
		if mbit < 1.5 || mbit > 4.5 {
			t.Errorf("to %s: %.2f Mbit/s, want a fair part of the aggregate's 6", addr, mbit)
		}
	}
	if b := classBytes(t, p.A, "pods:shop"); b < 6e6/8*4*0.8 {
		t.Errorf("show: the aggregate counted %d bytes, want what its pods received", b)
	}
	// By weight within it: the agent's sharing controller caps each pod
	// at its part.
	weighedPods(t, client, p, 6)
	unannotate(t, client, "shop")
	waitPods(t, p.A, "the aggregate removed", 5*time.Second, func(m map[string]float64) bool {
		return len(m) == 1 && m["pods/shop.web"] == 10
	})
}

// bothPods sends two TCP flows from behind p.A (forwarded, as a node
// forwards its pods' traffic) to each of the pods' addresses (AddrB,
// 10.9.0.3) at once for 4 s and returns each one's goodput in Mbit/s,
// failing the test unless together they hold cap (Mbit/s).
func bothPods(t *testing.T, p *testutil.Pair, cap float64) map[string]float64 {
	t.Helper()
	from := p.Behind(t)
	type result struct {
		addr string
		mbit float64
	}
	res := make(chan result, 2)
	for i, addr := range []string{testutil.AddrB, "10.9.0.3"} {
		sink, err := testutil.TCPSink(p.B, addr, 5411+i)
		if err != nil {
			t.Fatal(err)
		}
		defer sink.Close()
		go func() {
			const d = 4 * time.Second
			flows, err := testutil.TCPSend(from, addr, 5411+i, 2, d)
			var n uint64
			for _, f := range flows {
				n += f.BytesAcked
			}
			if err != nil {
				n = 0
			}
			res <- result{addr, float64(n) * 8 / d.Seconds() / 1e6}
		}()
	}
	out := map[string]float64{}
	var total float64
	for range 2 {
		r := <-res
		t.Logf("to %s: %.2f Mbit/s", r.addr, r.mbit)
		out[r.addr] = r.mbit
		total += r.mbit
	}
	if total < 0.85*cap || total > 1.05*cap {
		t.Errorf("the namespace's pods got %.2f Mbit/s together through its %g Mbit/s cap", total, cap)
	}
	return out
}

// weighedPods gives pod web of namespace shop three times db's weight
// (sluice.io/weight 3 and 1), waits for their classes' rates to say so,
// and sends two TCP flows to each for 10 s from behind p.A (forwarded:
// testutil.Pair.Behind says why it matters): over the last 5 (once the
// shares have settled) web must get 3/4 of what the two get, and the
// two together the namespace's cap (Mbit/s).
func weighedPods(t *testing.T, client kubetest.Fake, p *testutil.Pair, cap float64) {
	t.Helper()
	weigh := func(weights map[string]string) {
		t.Helper()
		for name, w := range weights {
			annotate(t, client, "shop", name, kube.Weight, w)
		}
	}
	weigh(map[string]string{"web": "3", "db": "1"})
	defer weigh(map[string]string{"web": "", "db": ""}) // a weight alone makes db a host
	deadline := time.Now().Add(5 * time.Second)
	for {
		web, db := podClasses(t, p)
		if db.Rate > 0 && web.Rate/db.Rate > 2.9 && web.Rate/db.Rate < 3.1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pods' rates are %.0f and %.0f bytes/s 5 s after their weights, want 3:1", web.Rate, db.Rate)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Held to 5% of the reference: the work beside the suite waits, and
	// a window that misses is measured once more (the second must pass).
	// One clean-clone CI run read 0.689 (4.15 and 1.88 Mbit/s) beside
	// that work; alone here and beside nice-19 CPU load, 0.749 to 0.751.
	testutil.Quiet(t)
	for try := 1; ; try++ {
		web, db := weighedWindow(t, p, 5421+2*(try-1))
		share := web / (web + db)
		t.Logf("by weight 3:1: web %.2f Mbit/s, db %.2f (web's share %.3f, the reference 0.750)", web, db, share)
		var miss []string
		if share < 0.70 || share > 0.80 { // within 5% of the traffic
			miss = append(miss, fmt.Sprintf("web got %.3f of the namespace's traffic (%.2f and %.2f Mbit/s), want 0.75 by its weight", share, web, db))
		}
		// The classes count what the shaper sent, headers included: the
		// cap holds those bytes.
		if total := web + db; total < 0.85*cap || total > 1.05*cap {
			miss = append(miss, fmt.Sprintf("the pods got %.2f Mbit/s together through the namespace's %g", total, cap))
		}
		if len(miss) == 0 {
			return
		}
		if try == 2 {
			for _, m := range miss {
				t.Error(m)
			}
			return
		}
		t.Logf("measured again: %s", strings.Join(miss, "; "))
	}
}

// weighedWindow sends two TCP flows to each pod (ports port and port+1)
// for 10 s and returns what each pod's class sent in Mbit/s over the 5 s
// after the first 4, from the classes' counters as show reads them.
func weighedWindow(t *testing.T, p *testutil.Pair, port int) (web, db float64) {
	t.Helper()
	const d = 10 * time.Second
	from := p.Behind(t)
	done := make(chan error, 2)
	for i, addr := range []string{testutil.AddrB, "10.9.0.3"} {
		sink, err := testutil.TCPSink(p.B, addr, port+i)
		if err != nil {
			t.Fatal(err)
		}
		defer sink.Close()
		go func() {
			_, err := testutil.TCPSend(from, addr, port+i, 2, d)
			done <- err
		}()
	}
	time.Sleep(4 * time.Second)
	web0, db0 := podClasses(t, p)
	start := time.Now()
	time.Sleep(5 * time.Second)
	web1, db1 := podClasses(t, p)
	secs := time.Since(start).Seconds()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	return float64(web1.Bytes-web0.Bytes) * 8 / secs / 1e6, float64(db1.Bytes-db0.Bytes) * 8 / secs / 1e6
}

// podClasses are the two pods' classes as show reads them.
func podClasses(t *testing.T, p *testutil.Pair) (web, db shownClass) {
	t.Helper()
	for _, c := range shownClasses(t, p.A) {
		switch c.Name {
		case "pods/shop.web":
			web = c
		case "pods/shop.db":
			db = c
		}
	}
	return web, db
}

// unannotate removes namespace ns's annotations: its pods are the pods
// class's again, a pod without an annotation of its own no host at all.
func unannotate(t *testing.T, client kubetest.Fake, name string) {
	t.Helper()
	ctx := context.Background()
	nss := client.Namespaces()
	ns, err := nss.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Annotations = nil
	if _, err := nss.Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// annotate sets (or, value "", removes) annotation key of pod ns/name
// through the API, as kubectl annotate does.
func annotate(t *testing.T, client kubetest.Fake, ns, name, key, value string) {
	t.Helper()
	ctx := context.Background()
	pods := client.Pods(ns)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	if value == "" {
		delete(pod.Annotations, key)
	} else {
		pod.Annotations[key] = value
	}
	if _, err := pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// podsAgent runs the agent with --kubernetes against client, as node-a,
// on veth0 of a new pair's A (podsPolicy), whose B has the pods'
// addresses AddrB and 10.9.0.3; it stops when the test ends.
func podsAgent(t *testing.T, client kubetest.Fake) (*testutil.Pair, *agent.Agent) {
	t.Helper()
	return podsAgentOn(t, client, podsPolicy)
}

// podsAgentOn is podsAgent with the node's policy policy(veth0).
func podsAgentOn(t *testing.T, client kubetest.Fake, policy func(dev string) string) (*testutil.Pair, *agent.Agent) {
	t.Helper()
	p := testutil.NewPair(t)
	testutil.AddAddr(t, p.B, p.DevB, "10.9.0.3")
	t.Setenv("SLUICE_STATE_DIR", stateDir(t))
	return p, runPodsAgent(t, writePolicy(t, "p.yaml", policy(p.DevA)), p.A, client)
}

// runPodsAgent runs the agent with --kubernetes against client, as
// node-a, with policy file pol in namespace netns, until the test ends.
func runPodsAgent(t *testing.T, pol, netns string, client kubetest.Fake) *agent.Agent {
	t.Helper()
	a, err := agent.New(agent.Config{Policy: pol, Netns: netns, Interval: 500 * time.Millisecond,
		Log:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Kubernetes: &kube.Config{Client: client, Node: "node-a"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return a
}

// classPrio is the prio tc reads back of sluice's class name on dev of
// namespace ns.
func classPrio(t *testing.T, ns, dev, name string) string {
	_, prio := tcClassWord(t, ns, dev, name, "prio")
	return prio
}

// classParent is the id of the parent tc reads back of sluice's class
// name on dev of namespace ns.
func classParent(t *testing.T, ns, dev, name string) string {
	_, parent := tcClassWord(t, ns, dev, name, "parent")
	return parent
}

// classID is the id of sluice's class name on dev of namespace ns.
func classID(t *testing.T, ns, dev, name string) string {
	id, _ := tcClassWord(t, ns, dev, name, "class")
	return id
}

// tcClassWord reads sluice's class name on dev of namespace ns back from
// tc: its id (from show, which names it) and the word after field.
func tcClassWord(t *testing.T, ns, dev, name, field string) (id, value string) {
	t.Helper()
	var sample struct {
		Trees []struct {
			Classes []struct{ Name, ID string } `json:"classes"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(must(t, "--netns", ns, "show", "--json", "--local", "--interval", "0")), &sample); err != nil {
		t.Fatal(err)
	}
	for _, tr := range sample.Trees {
		for _, c := range tr.Classes {
			if c.Name != name {
				continue
			}
			f := strings.Fields(testutil.NS(t, ns, "tc", "class", "show", "dev", dev, "classid", c.ID))
			for i := 0; i+1 < len(f); i++ {
				if f[i] == field {
					return c.ID, f[i+1]
				}
			}
			t.Fatalf("tc shows no %s for class %s (%s): %v", field, name, c.ID, f)
		}
	}
	t.Fatalf("no class %s", name)
	return "", ""
}

// podCeils reads the pods' classes and the namespaces' aggregates of
// namespace ns from the kernel (show reads the records for the names and
// tc for the rates), in Mbit/s.
func podCeils(t *testing.T, ns string) map[string]float64 {
	t.Helper()
	m := map[string]float64{}
	for _, c := range shownClasses(t, ns) {
		if strings.HasPrefix(c.Name, "pods/") || strings.HasPrefix(c.Name, "pods:") { // a pod, a namespace's aggregate
			m[c.Name] = c.Ceil * 8 / 1e6
		}
	}
	return m
}

// shownClass is a class as show --json lists it.
type shownClass struct {
	Name  string  `json:"name"`
	Rate  float64 `json:"rate_bytes_per_second"`
	Ceil  float64 `json:"ceil_bytes_per_second"`
	Bytes uint64  `json:"bytes"`
}

// shownClasses lists the classes of every tree in namespace ns, read by
// show from the kernel.
func shownClasses(t *testing.T, ns string) []shownClass {
	t.Helper()
	var sample struct {
		Trees []struct {
			Classes []shownClass `json:"classes"`
		} `json:"trees"`
	}
	out := must(t, "--netns", ns, "show", "--json", "--local", "--interval", "0")
	if err := json.Unmarshal([]byte(out), &sample); err != nil {
		t.Fatal(err)
	}
	var cs []shownClass
	for _, tr := range sample.Trees {
		cs = append(cs, tr.Classes...)
	}
	return cs
}

// classBytes is the bytes show counts for sluice's class name in
// namespace ns.
func classBytes(t *testing.T, ns, name string) uint64 {
	t.Helper()
	cs := shownClasses(t, ns)
	for _, c := range cs {
		if c.Name == name {
			return c.Bytes
		}
	}
	t.Fatalf("show lists no class %s: %+v", name, cs)
	return 0
}

// goodputTo is the TCP goodput in Mbit/s of two flows from p.A to addr
// (an address of p.B) over 3 s. A cap holds a local socket's flows as
// it does forwarded ones; the local ones, held back by TCP small queues
// rather than by drops, measure it more steadily (2.02 to 2.07 Mbit/s
// through 2M, where forwarded flows gave 1.70 to 1.96).
func goodputTo(t *testing.T, p *testutil.Pair, addr string, port int) float64 {
	t.Helper()
	sink, err := testutil.TCPSink(p.B, addr, port)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	const d = 3 * time.Second
	flows, err := testutil.TCPSend(p.A, addr, port, 2, d)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range flows {
		n += f.BytesAcked
	}
	return float64(n) * 8 / d.Seconds() / 1e6
}

// waitPods waits until the pods' classes of ns satisfy ok, for at most
// d, and says how long it took.
func waitPods(t *testing.T, ns, what string, d time.Duration, ok func(map[string]float64) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		m := podCeils(t, ns)
		if ok(m) {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: not within %s; the kernel has %d pods: %v", what, d, len(m), trimMap(m, 10))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// trimMap is at most n entries of m, for a message.
func trimMap(m map[string]float64, n int) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if len(out) == n {
			break
		}
		out[k] = v
	}
	return out
}

// podsPolicy shapes what leaves dev toward the pods (as a node shapes
// cni0): each pod a host, capped at its ingress-bandwidth annotation.
func podsPolicy(dev string) string {
	return fmt.Sprintf(`interfaces:
  - name: %s
    egress:
      rate: 100mbit
      classifier: bpf
      default: other
      classes:
        - {name: pods, rate: 80mbit, per_host: {pods: ingress, hosts_file: pods.csv}}
        - {name: other, rate: 20mbit}
`, dev)
}

// waitClassifier waits until sluice's classifier is on dev's egress:
// show finds the classes of an apply in progress before it attaches the
// program (packets sent meanwhile go to the tree's default class).
func waitClassifier(t *testing.T, ns, dev string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(testutil.NS(t, ns, "tc", "filter", "show", "dev", dev, "egress"), "bpf") {
		if time.Now().After(deadline) {
			t.Fatalf("no classifier on %s after 10 s", dev)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
