package kube

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"sluice/kube/corev1"
)

// Client speaks core/v1 as the API server serves it: a list of pods
// with a field selector, a watch's events, namespaces, an Event created
// in its namespace, and a server's error status. (TestKubernetesAgainstAPIServer
// runs the agent against a real server.)
func TestClientSpeaksCoreV1(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
		body []byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/api/v1/pods" && r.URL.Query().Get("watch") == "true":
			for _, name := range []string{"web", "db"} {
				ev := map[string]any{"type": "ADDED", "object": map[string]any{"kind": "Pod", "apiVersion": "v1",
					"metadata": map[string]any{"name": name, "namespace": "shop", "resourceVersion": "8"}}}
				json.NewEncoder(w).Encode(ev)
				w.(http.Flusher).Flush()
			}
		case r.URL.Path == "/api/v1/pods":
			io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[
				{"metadata":{"name":"web","namespace":"shop","annotations":{"kubernetes.io/egress-bandwidth":"10M"}},
				 "spec":{"nodeName":"node-a"},"status":{"phase":"Running","podIP":"10.1.0.2"}}]}`)
		case r.URL.Path == "/api/v1/namespaces":
			io.WriteString(w, `{"kind":"NamespaceList","apiVersion":"v1","items":[{"metadata":{"name":"shop"}}]}`)
		case r.URL.Path == "/api/v1/namespaces/shop/events" && r.Method == http.MethodPost:
			body, _ = io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			w.Write(body)
		default:
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"events is forbidden","reason":"Forbidden","code":403}`)
		}
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: "+srv.URL+"}\n"+
		"contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n"), 0o600)
	api, err := Client(kc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pods, err := api.ListPods(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].Name != "web" || pods.Items[0].Status.PodIP != "10.1.0.2" ||
		pods.Items[0].Annotations[EgressBandwidth] != "10M" || pods.ResourceVersion != "7" {
		t.Fatalf("ListPods: %v %+v", err, pods)
	}
	w, err := api.WatchPods(ctx, metav1.ListOptions{ResourceVersion: "7"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
			got = append(got, p.Namespace+"/"+p.Name)
		}
	}
	if strings.Join(got, " ") != "shop/web shop/db" {
		t.Errorf("WatchPods: %v, want shop/web shop/db", got)
	}
	nss, err := api.ListNamespaces(ctx, metav1.ListOptions{})
	if err != nil || len(nss.Items) != 1 || nss.Items[0].Name != "shop" {
		t.Errorf("ListNamespaces: %v %+v", err, nss)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "web.sluice.", Namespace: "shop"}, Reason: "BadCap", Message: "sluice: 10X"}
	if err := api.CreateEvent(ctx, ev); err != nil || !strings.Contains(string(body), `"reason":"BadCap"`) {
		t.Errorf("CreateEvent: %v, the server read %s", err, body)
	}
	ev.Namespace = "kube-system"
	if err := api.CreateEvent(ctx, ev); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("CreateEvent refused: %v, want the server's forbidden", err)
	}
	want := []string{
		"GET /api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a",
		"GET /api/v1/pods?resourceVersion=7&watch=true",
		"GET /api/v1/namespaces?",
		"POST /api/v1/namespaces/shop/events?",
		"POST /api/v1/namespaces/kube-system/events?",
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}
