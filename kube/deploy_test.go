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

	"sluice/policy"
	"sluice/records"
)

// The DaemonSet in deploy/kubernetes runs the agent as this package
// expects: in the node's network, told its node by the downward API,
// allowed to list pods and send Events; its policy loads and has a pods
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
	for _, want := range []string{"pods:get", "pods:list", "pods:watch", "events:create"} {
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
	type deployment struct {
		Metadata struct{ Name string }
		Spec     struct {
			Template struct {
				Metadata struct{ Annotations map[string]string }
			}
		}
	}
	got := map[string]string{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d deployment
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{policy.Egress, policy.Ingress} {
			w, ok, problems := Read(d.Spec.Template.Metadata.Annotations, dir)
			if len(problems) > 0 {
				t.Errorf("%s %s: %v", d.Metadata.Name, dir, problems)
			}
			prio := "-"
			if w.Prio != nil {
				prio = strconv.Itoa(*w.Prio)
			}
			got[d.Metadata.Name+" "+dir] = fmt.Sprintf("%v cap %s prio %s weight %g", ok, capText(w.Cap), prio, w.Weight)
		}
	}
	want := map[string]string{
		"voice-gateway egress":  "true cap 20mbit prio 0 weight 4",
		"voice-gateway ingress": "true cap 20mbit prio 0 weight 4",
		"backup egress":         "true cap 200mbit prio 7 weight 0",
		"backup ingress":        "true cap  prio 7 weight 0", // a host, uncapped, last
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("read %v\nwant %v", got, want)
	}
}
