package kube

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"sluice/kube/kubetest"
	"sluice/policy"
	"sluice/records"
)

// The DaemonSet in deploy/kubernetes runs the agent as this package
// expects: in the node's network, told its node by the downward API,
// allowed to list pods and namespaces and send Events; its policy loads and has a pods
// class each way, in the default pods files.
func TestDeployManifest(t *testing.T) {
	t.Setenv("SLUICE_STATE_DIR", t.TempDir())
	b, err := os.ReadFile("../deploy/kubernetes/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]map[string]any{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		kinds[doc["kind"].(string)] = doc
	}
	get := func(v any, path ...any) any {
		for _, p := range path {
			switch k := p.(type) {
			case string:
				v = v.(map[string]any)[k]
			case int:
				v = v.([]any)[k]
			}
		}
		return v
	}
	ds := kinds["DaemonSet"]
	spec := get(ds, "spec", "template", "spec")
	if get(spec, "hostNetwork") != true || get(spec, "serviceAccountName") != "sluice-agent" {
		t.Errorf("DaemonSet: hostNetwork %v, service account %v", get(spec, "hostNetwork"), get(spec, "serviceAccountName"))
	}
	c := get(spec, "containers", 0)
	var args []string
	for _, a := range get(c, "args").([]any) {
		args = append(args, a.(string))
	}
	if args[0] != "agent" || !slices.Contains(args, "--kubernetes") || args[1] != "/etc/sluice/policy.yaml" {
		t.Errorf("args %v", args)
	}
	// Bounded and confined (issue 58): a memory limit, the runtime's
	// capabilities dropped but shaping's, its seccomp profile.
	sc := get(c, "securityContext")
	var drop, add []string
	for _, x := range get(sc, "capabilities", "drop").([]any) {
		drop = append(drop, x.(string))
	}
	for _, x := range get(sc, "capabilities", "add").([]any) {
		add = append(add, x.(string))
	}
	if !slices.Equal(drop, []string{"ALL"}) || strings.Join(add, ",") != "NET_ADMIN,BPF,PERFMON,SYS_ADMIN" ||
		get(sc, "seccompProfile", "type") != "RuntimeDefault" || get(sc, "allowPrivilegeEscalation") != false {
		t.Errorf("securityContext %v", sc)
	}
	if get(c, "resources", "limits", "memory") == nil {
		t.Errorf("no memory limit: %v", get(c, "resources"))
	}
	env := get(c, "env", 0)
	if get(env, "name") != "NODE_NAME" || get(env, "valueFrom", "fieldRef", "fieldPath") != "spec.nodeName" {
		t.Errorf("env %v: the node's name must come from spec.nodeName", env)
	}
	var rules []string
	for _, r := range get(kinds["ClusterRole"], "rules").([]any) {
		for _, res := range get(r, "resources").([]any) {
			for _, v := range get(r, "verbs").([]any) {
				rules = append(rules, res.(string)+":"+v.(string))
			}
		}
	}
	for _, want := range []string{"pods:get", "pods:list", "pods:watch", "namespaces:list", "namespaces:watch", "events:create"} {
		if !slices.Contains(rules, want) {
			t.Errorf("ClusterRole lacks %s: %v", want, rules)
		}
	}
	src := get(kinds["ConfigMap"], "data", "policy.yaml").(string)
	pol, _, err := policy.Parse("/etc/sluice/policy.yaml", []byte(src))
	if err != nil {
		t.Fatalf("the ConfigMap's policy: %v", err)
	}
	var got []string
	for _, tg := range Targets(pol) {
		got = append(got, tg.Dir+" "+tg.File)
	}
	want := []string{policy.Ingress + " " + policy.PodsFile(policy.Ingress), policy.Egress + " " + policy.PodsFile(policy.Egress)}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Errorf("pods files %v, want %v", got, want)
	}
	// The pods files are in the state directory the agent's records
	// use (the one the DaemonSet keeps on the node).
	if d := filepath.Dir(filepath.Dir(policy.PodsFile(policy.Egress))); d != records.Dir("") {
		t.Errorf("pods files under %s, records under %s", d, records.Dir(""))
	}
}

// The example pods' annotations read as their comments say, with no
// problem.
func TestExamplePods(t *testing.T) {
	b, err := os.ReadFile("../deploy/kubernetes/example-pods.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type meta struct {
		Name, Namespace string
		Annotations     map[string]string
	}
	type object struct {
		Kind     string
		Metadata meta
		Spec     struct {
			Template struct{ Metadata meta }
		}
	}
	got := map[string]string{}
	groups := map[string]bool{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d object
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if d.Kind == "Namespace" {
			for _, dir := range []string{policy.Egress, policy.Ingress} {
				g, ok := GroupOf(kubetest.Namespace(d.Metadata.Name, d.Metadata.Annotations), dir)
				if len(g.Problems) > 0 {
					t.Errorf("namespace %s %s: %v", d.Metadata.Name, dir, g.Problems)
				}
				groups[d.Metadata.Name+" "+dir] = ok
				got[d.Metadata.Name+" "+dir] = fmt.Sprintf("%v guarantee %s cap %s", ok, capText(g.Guarantee), capText(g.Cap))
			}
			continue
		}
		for _, dir := range []string{policy.Egress, policy.Ingress} {
			pod := kubetest.Pod(d.Metadata.Namespace, d.Metadata.Name, "n", d.Spec.Template.Metadata.Annotations, "10.0.0.2")
			h, ok := HostIn(pod, dir, groups[d.Metadata.Namespace+" "+dir])
			w, problems := h.Wants, h.Problems
			if len(problems) > 0 {
				t.Errorf("%s %s: %v", d.Metadata.Name, dir, problems)
			}
			prio := "-"
			if w.Prio != nil {
				prio = strconv.Itoa(*w.Prio)
			}
			got[d.Metadata.Name+" "+dir] = fmt.Sprintf("%v cap %s prio %s weight %g group %q", ok, capText(w.Cap), prio, w.Weight, h.Group)
		}
	}
	want := map[string]string{
		"voice-gateway egress":  `true cap 20mbit prio 0 weight 4 group ""`,
		"voice-gateway ingress": `true cap 20mbit prio 0 weight 4 group ""`,
		"batch egress":          "true guarantee 50mbit cap 300mbit",
		"batch ingress":         "true guarantee 50mbit cap 300mbit",
		"backup egress":         `true cap 200mbit prio 7 weight 0 group "batch"`,
		"backup ingress":        `true cap  prio 7 weight 0 group "batch"`, // uncapped itself, last, in batch's 300
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("read %v\nwant %v", got, want)
	}
}
