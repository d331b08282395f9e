// Command kube measures `sluice agent --kubernetes` on a node with N
// pods against a real API server (kube-apiserver and etcd built by
// scripts/kubeapi.sh, SLUICE_KUBEAPI_BIN): the time from the agent's
// start to every pod shaped, from an annotation edit to the kernel, and
// from an API server restart (the watch relists every pod) to an edit
// made then being in the kernel. Writes bench/results/kube.json.
//
//	SLUICE_KUBEAPI_BIN=$(scripts/kubeapi.sh) go run ./bench/kube [-pods 1000]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"sluice/bench/internal/benchrun"
	"sluice/kube"
	"sluice/testutil"
)

type output struct {
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Date   string `json:"date"`
	Pods   int    `json:"pods"`
	// StartS: from the agent's start to every pod's class in the kernel.
	StartS float64 `json:"start_s"`
	// EditMs: an annotation edited, until the kernel has the new cap.
	EditMs []float64 `json:"edit_ms"`
	// RelistS: from the API server back (after a restart) until an edit
	// made at once is in the kernel: the watch's relist of every pod,
	// then the edit.
	RelistS []float64 `json:"relist_s"`
	// Veths: the second stage, pod_veths on a routed node of that many
	// pods, each with both caps (a tree on its veth and one on an ifb).
	Veths int `json:"veths,omitempty"`
	// VethsStartS: from the agent's start to every pod's two trees.
	VethsStartS float64 `json:"veths_start_s,omitempty"`
	// VethsEditMs: an annotation edited, until the veth's tree has it.
	VethsEditMs []float64 `json:"veths_edit_ms,omitempty"`
	// VethsDeleteMs: a pod deleted, until its ifb is gone.
	VethsDeleteMs []float64 `json:"veths_delete_ms,omitempty"`
}

func main() {
	pods := flag.Int("pods", 1000, "pods on the node")
	veths := flag.Int("veths", 110, "pods on a routed node for pod_veths (Kubernetes' default limit per node; 0: skip)")
	out := flag.String("out", "bench/results/kube.json", "results file")
	sluiceBin := flag.String("sluice", "", "sluice binary (default: build ./cmd/sluice)")
	flag.Parse()
	bin := os.Getenv("SLUICE_KUBEAPI_BIN")
	if bin == "" {
		benchrun.Fail(fmt.Errorf("SLUICE_KUBEAPI_BIN is not set: SLUICE_KUBEAPI_BIN=$(scripts/kubeapi.sh) go run ./bench/kube"))
	}
	*sluiceBin = benchrun.Sluice(*sluiceBin, "sluice-bench-kube")
	dir, err := os.MkdirTemp("", "sluice-bench-kube")
	if err != nil {
		benchrun.Fail(err)
	}
	defer os.RemoveAll(dir)
	api, err := testutil.NewKubeAPI(bin, dir)
	if err != nil {
		benchrun.Fail(err)
	}
	defer api.Close()
	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		benchrun.Fail(err)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	client, err := corev1client.NewForConfig(cfg)
	if err != nil {
		benchrun.Fail(err)
	}
	ctx := context.Background()
	if _, err := client.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		benchrun.Fail(err)
	}
	pi := client.Pods("shop")
	makePods(ctx, pi, "p", *pods, map[string]string{kube.IngressBandwidth: "10M"})

	// The node: the pods behind veth0 (no traffic: what is timed is the
	// way from the API to the kernel).
	ns := fmt.Sprintf("sluice-bench-kube-%d", os.Getpid())
	benchrun.Must("ip", "netns", "add", ns)
	defer exec.Command("ip", "netns", "del", ns).Run()
	benchrun.Must("ip", "-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1")
	benchrun.Must("ip", "-n", ns, "link", "set", "veth0", "up")
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(`interfaces:
  - name: veth0
    egress:
      rate: 10gbit
      classifier: bpf
      default: other
      classes:
        - {name: pods, rate: 9gbit, per_host: {pods: ingress, hosts_file: pods.csv}}
        - {name: other, rate: 1gbit}
`), 0o644)
	state := filepath.Join(dir, "state")
	t0 := time.Now()
	agent := startAgent(*sluiceBin, ns, pol, api.Kubeconfig, state, filepath.Join(dir, "agent.log"))
	defer stopAgent(agent)
	o := output{CPUs: runtime.NumCPU(), Kernel: strings.TrimSpace(benchrun.Output("uname", "-r")), Date: time.Now().UTC().Format(time.DateOnly), Pods: *pods}
	// Every class, then the classifier (an apply attaches it last).
	waitFor("every pod shaped", 2*time.Minute, func() bool { return count(ns, "ceil 10Mbit") == *pods })
	waitFor("the classifier", time.Minute, func() bool {
		return strings.Contains(benchrun.Output("tc", "-n", ns, "filter", "show", "dev", "veth0", "egress"), "bpf")
	})
	o.StartS = time.Since(t0).Seconds()

	edit := func(name, bw string) { annotate(ctx, pi, name, kube.IngressBandwidth, bw) }
	for k := range 9 {
		bw := fmt.Sprintf("%dM", 11+k)
		t := time.Now()
		edit(fmt.Sprintf("p%d", (k*97)%*pods), bw)
		waitFor("an edit", 30*time.Second, func() bool { return count(ns, "ceil "+strings.TrimSuffix(bw, "M")+"Mbit") == 1 })
		o.EditMs = append(o.EditMs, float64(time.Since(t).Microseconds())/1000)
	}
	for k := range 3 {
		api.Stop()
		time.Sleep(time.Second)
		if err := api.Start(); err != nil {
			benchrun.Fail(err)
		}
		t := time.Now()
		edit(fmt.Sprintf("p%d", *pods/2+k), "3M")
		waitFor("an edit after a relist", time.Minute, func() bool { return count(ns, "ceil 3Mbit") == k+1 })
		o.RelistS = append(o.RelistS, time.Since(t).Seconds())
	}
	fmt.Printf("%d pods: all shaped %.2f s after the agent's start; an annotation edit in the kernel after %.0f ms (median of %d); after an API server restart, relist and edit %.2f s (median of %d)\n",
		*pods, o.StartS, median(o.EditMs), len(o.EditMs), median(o.RelistS), len(o.RelistS))
	stopAgent(agent)
	if *veths > 0 {
		o.Veths = *veths
		vethsStage(ctx, client, api.Kubeconfig, *sluiceBin, dir, &o)
		fmt.Printf("%d pods on their veths: all shaped %.2f s after the agent's start; an annotation edit in the kernel after %.0f ms (median of %d); a pod deleted, its ifb gone after %.0f ms (median of %d)\n",
			o.Veths, o.VethsStartS, median(o.VethsEditMs), len(o.VethsEditMs), median(o.VethsDeleteMs), len(o.VethsDeleteMs))
	}
	b, _ := json.MarshalIndent(o, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		benchrun.Fail(err)
	}
}

// count is how many classes of veth0 in ns tc shows with s.
func count(ns, s string) int {
	return strings.Count(benchrun.Output("tc", "-n", ns, "class", "show", "dev", "veth0"), s+" ")
}

func waitFor(what string, d time.Duration, ok func() bool) {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			benchrun.Fail(fmt.Errorf("%s: not within %s", what, d))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// vethsStage times pod_veths: the first stage's pods gone, o.Veths pods
// of namespace veths, each routed (as Calico routes) through a veth of
// its own in a new node namespace, with an ingress and an egress cap;
// an agent with examples/k8s-veths.yaml's policy shapes them.
func vethsStage(ctx context.Context, client corev1client.CoreV1Interface, kubeconfig, sluiceBin, dir string, o *output) {
	if err := client.Pods("shop").DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
		benchrun.Fail(err)
	}
	if _, err := client.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "veths"}}, metav1.CreateOptions{}); err != nil {
		benchrun.Fail(err)
	}
	ns := fmt.Sprintf("sluice-bench-veths-%d", os.Getpid())
	benchrun.Must("ip", "netns", "add", ns)
	defer exec.Command("ip", "netns", "del", ns).Run()
	var batch strings.Builder
	for i := range o.Veths {
		fmt.Fprintf(&batch, "link add pv%d type veth peer name pv%dp\nlink set pv%d up\nlink set pv%dp up\nroute add %s/32 dev pv%d\n",
			i, i, i, i, benchrun.HostAddr(i), i)
	}
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		benchrun.Fail(fmt.Errorf("ip -batch: %v: %s", err, out))
	}
	pi := client.Pods("veths")
	makePods(ctx, pi, "v", o.Veths, map[string]string{kube.IngressBandwidth: "10M", kube.EgressBandwidth: "5M"})
	pol, err := filepath.Abs("examples/k8s-veths.yaml")
	if err != nil {
		benchrun.Fail(err)
	}
	t0 := time.Now()
	agent := startAgent(sluiceBin, ns, pol, kubeconfig, filepath.Join(dir, "veths-state"), filepath.Join(dir, "agent-veths.log"))
	defer stopAgent(agent)
	roots := func() int { return strings.Count(benchrun.Output("tc", "-n", ns, "qdisc", "show"), "qdisc htb 1: ") }
	waitFor("every pod's two trees", 2*time.Minute, func() bool { return roots() == 2*o.Veths })
	o.VethsStartS = time.Since(t0).Seconds()
	for k := range 9 {
		i := (k * 37) % o.Veths
		bw := fmt.Sprintf("%dM", 11+k)
		t := time.Now()
		annotate(ctx, pi, fmt.Sprintf("v%d", i), kube.IngressBandwidth, bw)
		waitFor("an edit", 30*time.Second, func() bool {
			return strings.Contains(benchrun.Output("tc", "-n", ns, "class", "show", "dev", fmt.Sprintf("pv%d", i)), "ceil "+strings.TrimSuffix(bw, "M")+"Mbit ")
		})
		o.VethsEditMs = append(o.VethsEditMs, float64(time.Since(t).Microseconds())/1000)
	}
	for k := range 5 {
		i := o.Veths - 1 - k
		t := time.Now()
		if err := pi.Delete(ctx, fmt.Sprintf("v%d", i), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			benchrun.Fail(err)
		}
		waitFor("a deleted pod's ifb gone", 30*time.Second, func() bool { return roots() == 2*(o.Veths-k-1) })
		o.VethsDeleteMs = append(o.VethsDeleteMs, float64(time.Since(t).Microseconds())/1000)
	}
}

// makePods creates n running pods on node-a named prefix0.., with
// annotations ann and addresses benchrun.HostAddr(0..).
func makePods(ctx context.Context, pi corev1client.PodInterface, prefix string, n int, ann map[string]string) {
	for i := range n {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", prefix, i), Annotations: maps.Clone(ann)},
			Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}
		p, err := pi.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			benchrun.Fail(err)
		}
		p.Status.Phase, p.Status.PodIP = corev1.PodRunning, benchrun.HostAddr(i)
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
		if _, err := pi.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			benchrun.Fail(err)
		}
	}
}

// annotate sets annotation key of pod name to value.
func annotate(ctx context.Context, pi corev1client.PodInterface, name, key, value string) {
	p, err := pi.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		benchrun.Fail(err)
	}
	p.Annotations[key] = value
	if _, err := pi.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		benchrun.Fail(err)
	}
}

// startAgent starts `sluice agent --kubernetes` as node-a in namespace
// ns with policy pol, its state in state and its log in logFile.
func startAgent(bin, ns, pol, kubeconfig, state, logFile string) *exec.Cmd {
	agent := exec.Command(bin, "--netns", ns, "agent", pol, "--kubernetes", "--kubeconfig", kubeconfig, "--node", "node-a", "--listen", "")
	agent.Env = append(os.Environ(), "SLUICE_STATE_DIR="+state)
	logf, _ := os.Create(logFile)
	agent.Stdout, agent.Stderr = logf, logf
	if err := agent.Start(); err != nil {
		benchrun.Fail(err)
	}
	return agent
}

// stopAgent stops it (again: a no-op).
func stopAgent(agent *exec.Cmd) {
	if agent.ProcessState == nil {
		agent.Process.Signal(os.Interrupt)
		agent.Wait()
	}
}
