package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	sigsyaml "sigs.k8s.io/yaml"

	"sluice/kube/chart"
	"sluice/testutil"
)

// The Helm chart, rendered by Helm's engine with a user's values, is
// accepted by a real API server object by object (its validation of
// DaemonSets, RBAC and the rest), and reads back as rendered.
func TestHelmChartAcceptedByAPIServer(t *testing.T) {
	api := testutil.StartKubeAPI(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		release, ns string
		values      map[string]any
	}{
		{"sluice", "sluice", nil},
		{"edge", "net", map[string]any{
			"image":        map[string]any{"digest": "sha256:" + strings.Repeat("0f", 32)},
			"nodeSelector": map[string]any{"kubernetes.io/os": "linux"},
			"tolerations":  []any{map[string]any{"key": "gateway", "operator": "Exists", "effect": "NoSchedule"}},
			"resources":    map[string]any{"requests": map[string]any{"cpu": "100m"}, "limits": map[string]any{"memory": "256Mi"}},
			"policy":       "pod_veths: {}\n",
			"extraArgs":    []any{"--interval", "2s"},
		}},
	} {
		objs, err := chart.Render("../deploy/helm/sluice", tc.release, tc.ns, tc.values)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			j, err := sigsyaml.YAMLToJSON(o.YAML)
			if err != nil {
				t.Fatal(err)
			}
			var u unstructured.Unstructured
			if err := u.UnmarshalJSON(j); err != nil {
				t.Fatalf("%s %s: %v", o.Kind, o.Name, err)
			}
			gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
			if err != nil {
				t.Fatal(err)
			}
			res := gv.WithResource(strings.ToLower(u.GetKind()) + "s")
			var ri dynamic.ResourceInterface = dyn.Resource(res)
			if ns := u.GetNamespace(); ns != "" {
				ri = dyn.Resource(res).Namespace(ns)
			}
			if _, err := ri.Create(ctx, &u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
				t.Errorf("%s: the API server refused %s %s: %v\n%s", tc.release, o.Kind, o.Name, err, o.YAML)
				continue
			}
			back, err := ri.Get(ctx, u.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if o.Kind == "DaemonSet" {
				img, _, _ := unstructured.NestedSlice(back.Object, "spec", "template", "spec", "containers")
				want := "registry.example/sluice:v0.1.0"
				if d, ok := tc.values["image"]; ok {
					want = "registry.example/sluice@" + d.(map[string]any)["digest"].(string)
				}
				if len(img) != 1 || img[0].(map[string]any)["image"] != want {
					t.Errorf("%s: the DaemonSet's image reads back as %v, want %s", tc.release, img, want)
				}
			}
		}
	}
}
