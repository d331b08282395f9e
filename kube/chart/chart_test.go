package chart

import (
	"bytes"
	"errors"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"gopkg.in/yaml.v3"

	"sluice/policy"
)

const dir = "../../deploy/helm/sluice"

func daemonSet(t *testing.T, b []byte) *appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("the DaemonSet: %v", err)
	}
	return &ds
}

// The chart at its defaults makes what deploy/kubernetes/sluice.yaml
// holds (the agent's pod, RBAC, the policy), named for the release and
// in its namespace: the two cannot drift apart.
func TestDefaultsMatchTheManifest(t *testing.T) {
	objs, err := Render(dir, "sluice", "sluice", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Object{}
	for _, o := range objs {
		got[o.Kind] = o
		if md := o.Doc["metadata"].(map[string]any); o.Kind != "ClusterRole" && o.Kind != "ClusterRoleBinding" && md["namespace"] != "sluice" {
			t.Errorf("%s %s is not in the release's namespace: %v", o.Kind, o.Name, md["namespace"])
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if _, ok := got[k]; !ok {
			t.Errorf("no %s rendered", k)
		}
	}
	static := map[string][]byte{}
	b, err := os.ReadFile("../../deploy/kubernetes/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var doc struct{ Kind string }
		n.Decode(&doc)
		out, _ := yaml.Marshal(&n)
		static[doc.Kind] = out
	}
	want, have := daemonSet(t, static["DaemonSet"]).Spec.Template.Spec, daemonSet(t, got["DaemonSet"].YAML).Spec.Template.Spec
	wc, hc := want.Containers[0], have.Containers[0]
	if !reflect.DeepEqual(wc.SecurityContext, hc.SecurityContext) || !reflect.DeepEqual(wc.Resources, hc.Resources) ||
		!reflect.DeepEqual(wc.Env, hc.Env) || !reflect.DeepEqual(wc.VolumeMounts, hc.VolumeMounts) ||
		!reflect.DeepEqual(wc.ReadinessProbe.HTTPGet, hc.ReadinessProbe.HTTPGet) ||
		want.HostNetwork != have.HostNetwork || want.PriorityClassName != have.PriorityClassName ||
		!reflect.DeepEqual(want.Tolerations, have.Tolerations) || have.ServiceAccountName != "sluice-agent" {
		t.Errorf("the chart's pod differs from deploy/kubernetes/sluice.yaml's:\n%+v\n%+v", have, want)
	}
	args := slices.DeleteFunc(slices.Clone(hc.Args), func(a string) bool { return a == "--log-level" || a == "info" })
	if !slices.Equal(args, wc.Args) {
		t.Errorf("args %v, want %v (and --log-level info)", hc.Args, wc.Args)
	}
	if hc.Image != "registry.example/sluice:v0.1.0" {
		t.Errorf("image %q, want the chart's appVersion as the tag", hc.Image)
	}
	var cmStatic, cmChart struct{ Data map[string]string }
	sigsyaml.Unmarshal(static["ConfigMap"], &cmStatic)
	sigsyaml.Unmarshal(got["ConfigMap"].YAML, &cmChart)
	if cmChart.Data["policy.yaml"] != cmStatic.Data["policy.yaml"][strings.Index(cmStatic.Data["policy.yaml"], "interfaces:"):] {
		t.Errorf("the chart's policy differs from the manifest's:\n%s\n%s", cmChart.Data["policy.yaml"], cmStatic.Data["policy.yaml"])
	}
	if _, _, err := policy.Parse("policy.yaml", []byte(cmChart.Data["policy.yaml"])); err != nil {
		t.Errorf("the chart's policy: %v", err)
	}
	if want, have := string(static["ClusterRole"]), string(got["ClusterRole"].YAML); !strings.Contains(have, "resources: [pods, namespaces]") || !strings.Contains(want, "resources: [pods, namespaces]") {
		t.Errorf("the ClusterRole's rules:\n%s", have)
	}
}

// Values as a user sets them: an image by digest, nodes, tolerations,
// resources, another policy, more arguments; a policy left empty is
// refused with the key's name.
func TestValues(t *testing.T) {
	objs, err := Render(dir, "edge", "net", map[string]any{
		"image":        map[string]any{"repository": "r.example/sluice", "digest": "sha256:" + strings.Repeat("ab", 32), "tag": "ignored"},
		"nodeSelector": map[string]any{"node-role.kubernetes.io/gateway": "true"},
		"tolerations":  []any{map[string]any{"key": "gw", "operator": "Exists", "effect": "NoSchedule"}},
		"resources":    map[string]any{"limits": map[string]any{"memory": "1Gi"}},
		"policy":       "pod_veths: {}\n",
		"listen":       "127.0.0.1:9999",
		"extraArgs":    []any{"--interval", "2s"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	var cm corev1.ConfigMap
	for _, o := range objs {
		switch o.Kind {
		case "DaemonSet":
			ds = daemonSet(t, o.YAML)
		case "ConfigMap":
			sigsyaml.Unmarshal(o.YAML, &cm)
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet")
	}
	s := ds.Spec.Template.Spec
	c := s.Containers[0]
	if ds.Name != "edge-agent" || ds.Namespace != "net" || c.Image != "r.example/sluice@sha256:"+strings.Repeat("ab", 32) ||
		s.NodeSelector["node-role.kubernetes.io/gateway"] != "true" || len(s.Tolerations) != 1 || s.Tolerations[0].Key != "gw" ||
		c.Resources.Limits.Memory().String() != "1Gi" || c.ReadinessProbe.HTTPGet.Port.IntValue() != 9999 ||
		!slices.Contains(c.Args, "127.0.0.1:9999") || c.Args[len(c.Args)-1] != "2s" {
		t.Errorf("values not in the DaemonSet: %+v\n%+v", s, c)
	}
	if cm.Data["policy.yaml"] != "pod_veths: {}\n" || s.Volumes[0].ConfigMap.Name != cm.Name {
		t.Errorf("policy %q in %s, mounted from %s", cm.Data["policy.yaml"], cm.Name, s.Volumes[0].ConfigMap.Name)
	}
	if _, err := Render(dir, "x", "y", map[string]any{"policy": ""}); err == nil || !strings.Contains(err.Error(), "policy: the node's policy") {
		t.Errorf("an empty policy: %v", err)
	}
}
