package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/agent"
	"sluice/kube"
	"sluice/testutil"
)

// TestAgentKubeSoak is make soak's annotation churn (issue 58): for
// SLUICE_KUBE_SOAK the agent follows a real API server while a tenant
// edits a pod's cap ten times a second, rewrites another pod's
// annotation to a new 64 KiB bad value every second, and pods come and
// go; nothing may grow: RSS within 20% (and 10 MB) of its first
// minute's, file descriptors, threads, the Events a bad annotation
// makes, the log's pace. Not part of make test.
func TestAgentKubeSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("SLUICE_KUBE_SOAK"))
	if err != nil {
		t.Skip("set SLUICE_KUBE_SOAK to a duration (make soak)")
	}
	testutil.RequireRoot(t)
	api := testutil.StartKubeAPI(t)
	client := kubeClient(t, api)
	ctx := context.Background()
	client.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	client.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
	p := testutil.NewPair(t)
	pol := writePolicy(t, "p.yaml", podsPolicy(p.DevA))
	pods := client.Pods("shop")
	for name, ann := range map[string]string{"web": "5M", "bad": "ten"} {
		if err := runPod(ctx, pods, name, "node-a", map[string]string{kube.IngressBandwidth: ann}, map[string]string{"web": testutil.AddrB, "bad": "10.9.0.5"}[name]); err != nil {
			t.Fatal(err)
		}
	}
	// It serves /metrics so that the Go runtime's own figures (heap,
	// stacks, goroutines) say what a growing RSS is made of.
	agent, log, exited := startKubeAgent(t, api, p.A, pol, "--listen", "127.0.0.1:0")
	goStats := agentGoStats(t, p.A, agent.Process.Pid)
	waitPods(t, p.A, "the node's pods shaped", 20*time.Second, func(m map[string]float64) bool { return m["pods/shop.web"] == 5 })

	edit := func(name, bw string) {
		t.Helper()
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Annotations[kube.IngressBandwidth] = bw
		if _, err := pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type reading struct {
		rss      float64
		fds      int
		threads  int
		log      int64
		at       time.Time
		editsBad int
	}
	threads := func() int {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", agent.Process.Pid))
		return len(ents)
	}
	read := func(bad int) reading {
		return reading{procRSSMB(agent.Process.Pid), procFDs(agent.Process.Pid), threads(), fileSize(log), time.Now(), bad}
	}
	begin := time.Now()
	var first, mid *reading
	// RSS every tenth of the soak: a plateau and a slow leak differ in
	// the curve's last tenths, not in its ends.
	var curve, anon, goCurve []string
	var firstGo, lastGo map[string]float64
	nextSample := time.Duration(0)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	bad, churn := 0, 0
	for i := 0; time.Since(begin) < d; i++ {
		<-tick.C
		edit("web", fmt.Sprintf("%dM", 5+i%2))
		if i%10 == 0 {
			bad++
			edit("bad", fmt.Sprintf("%d%s", bad, strings.Repeat("x", 64<<10)))
			name := fmt.Sprintf("churn-%d", churn)
			if err := runPod(ctx, pods, name, "node-a", map[string]string{kube.IngressBandwidth: "1M"}, fmt.Sprintf("10.10.%d.%d", churn/250%250, churn%250+1)); err != nil {
				t.Fatal(err)
			}
			if churn > 0 {
				// At once, as the node's kubelet finishes a deletion: no
				// kubelet runs here, and a pod deleted gracefully stays
				// Terminating, in the API and so in the agent's cache
				// (900 pods a quarter of an hour: the agent's heap grew
				// by them, as it should).
				if err := pods.Delete(ctx, fmt.Sprintf("churn-%d", churn-1), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
					t.Fatal(err)
				}
			}
			churn++
		}
		select {
		case <-exited:
			t.Fatalf("the agent exited: %v", agent.ProcessState)
		default:
		}
		if el := time.Since(begin); el >= nextSample {
			curve = append(curve, fmt.Sprintf("%.0f", procRSSMB(agent.Process.Pid)))
			anon = append(anon, fmt.Sprintf("%.1f", procStatusMB(agent.Process.Pid, "RssAnon:")))
			if g := goStats(); g != nil {
				if firstGo == nil && el >= min(time.Minute, d/4) {
					firstGo = g
				}
				lastGo = g
				goCurve = append(goCurve, fmt.Sprintf("%.0f/%.1f/%.1f/%.1f/%.1f", g["go_goroutines"], g["go_memstats_heap_alloc_bytes"]/1e6,
					(g["go_memstats_heap_idle_bytes"]-g["go_memstats_heap_released_bytes"])/1e6, g["go_memstats_stack_inuse_bytes"]/1e6, g["go_memstats_sys_bytes"]/1e6))
			}
			nextSample += d / 10
		}
		switch el := time.Since(begin); {
		case first == nil && el >= min(time.Minute, d/4):
			r := read(bad)
			first = &r
		case mid == nil && el >= d/2+min(time.Minute, d/4)/2:
			r := read(bad)
			mid = &r
		}
	}
	time.Sleep(2 * time.Second)
	last := read(bad)
	if first == nil || mid == nil {
		t.Fatal("too short a soak to read it three times")
	}
	if l, err := pods.List(ctx, metav1.ListOptions{}); err != nil {
		t.Error(err)
	} else if len(l.Items) > 5 {
		t.Errorf("the namespace holds %d pods after the churn; want the 3 or 4 running", len(l.Items))
	}
	evs, err := client.Events("shop").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bad"})
	if err != nil {
		t.Fatal(err)
	}
	pace := func(a, b reading) float64 { return float64(b.log-a.log) / b.at.Sub(a.at).Minutes() }
	t.Logf("kube soak %v: %d cap edits, %d bad 64 KiB edits, %d pods churned; RSS %.0f -> %.0f -> %.0f MB, fds %d -> %d, threads %d -> %d, log %.0f then %.0f bytes a minute, %d Events for the bad pod",
		d, int(time.Since(begin)/(100*time.Millisecond)), bad, churn, first.rss, mid.rss, last.rss, first.fds, last.fds, first.threads, last.threads,
		pace(*first, *mid), pace(*mid, last), len(evs.Items))
	t.Logf("RSS every %v (MB): %s", d/10, strings.Join(curve, " "))
	t.Logf("of which anonymous (MB): %s (the rest is the binary's pages)", strings.Join(anon, " "))
	t.Logf("Go runtime, goroutines/heap allocated/heap idle not yet returned/stacks/obtained from the OS (MB): %s", strings.Join(goCurve, " "))
	if firstGo == nil || lastGo == nil {
		t.Error("the agent's /metrics never answered")
	} else if g0, g1 := firstGo["go_goroutines"], lastGo["go_goroutines"]; g1 > g0+20 {
		t.Errorf("goroutines grew from %.0f to %.0f", g0, g1)
	}
	if last.rss > first.rss*1.2 && last.rss > first.rss+10 {
		t.Errorf("RSS grew from %.0f to %.0f MB", first.rss, last.rss)
	}
	if last.fds > first.fds+10 || last.threads > first.threads+8 {
		t.Errorf("file descriptors %d -> %d, threads %d -> %d", first.fds, last.fds, first.threads, last.threads)
	}
	if len(evs.Items) > kube.MaxTells+1 {
		t.Errorf("%d Events for one pod's %d bad edits; want at most %d", len(evs.Items), bad, kube.MaxTells+1)
	}
	if p1, p2 := pace(*first, *mid), pace(*mid, last); p2 > p1*1.5+4096 {
		t.Errorf("the log's pace grew from %.0f to %.0f bytes a minute", p1, p2)
	}
	if m := podCeils(t, p.A); m["pods/shop.web"] != 5 && m["pods/shop.web"] != 6 {
		t.Errorf("after the soak the kernel holds %v", m)
	}
}

// agentGoStats returns a reader of the go_* samples on the /metrics of
// the agent pid, its address from the agent file of namespace ns in the
// test's state directory; the reader returns nil when it cannot.
func agentGoStats(t *testing.T, ns string, pid int) func() map[string]float64 {
	info := filepath.Join(stateDir(t), "netns", ns, agent.AgentFile)
	c := http.Client{Timeout: 5 * time.Second}
	return func() map[string]float64 {
		var i agent.Info
		if b, err := os.ReadFile(info); err != nil || json.Unmarshal(b, &i) != nil || i.PID != pid {
			return nil
		}
		resp, err := c.Get("http://" + i.Listen + "/metrics")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		m := map[string]float64{}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			name, v, ok := strings.Cut(sc.Text(), " ")
			if !ok || !strings.HasPrefix(name, "go_") {
				continue
			}
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				m[name] = f
			}
		}
		return m
	}
}
