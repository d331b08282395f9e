package conform

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"sluice/policy"
)

// LoadPolicy reads a policy file for a run. With backend ("htb" or
// "edt") every tree of it runs on that data plane instead of its own:
// the file is read as it is first (its errors at its own lines), then
// again with the backend set, whose errors (keys the other backend
// refuses) name the backend and their class.
func LoadPolicy(file, backend string) (*policy.Policy, error) {
	pol, _, err := policy.Load(file)
	if err != nil || backend == "" {
		return pol, err
	}
	if backend != "htb" && backend != "edt" {
		return nil, fmt.Errorf("--backend %q: want htb or edt", backend)
	}
	src := pol.Source(file)
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return pol, nil
	}
	ifaces := value(doc.Content[0], "interfaces")
	if ifaces == nil {
		return pol, nil
	}
	for _, in := range ifaces.Content {
		for _, dir := range []string{"egress", "ingress"} {
			t := value(in, dir)
			if t == nil || t.Kind != yaml.MappingNode || value(t, "police") != nil {
				continue
			}
			if v := value(t, "backend"); v != nil {
				v.Value = backend
				continue
			}
			t.Content = append(t.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "backend"}, &yaml.Node{Kind: yaml.ScalarNode, Value: backend})
		}
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	pol, _, err = policy.Parse(file, out.Bytes())
	if es, ok := err.(policy.Errors); ok {
		for _, e := range es {
			e.Pos = policy.Pos{}
			e.Msg = "with backend " + backend + ": " + e.Msg
		}
		return nil, es
	}
	return pol, err
}

// value is the value of key in mapping n, or nil.
func value(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// writeEffective writes the policy as the run reads it (with --backend
// applied) to a file of its own, hosts_file and groups_file paths made
// absolute, for the agent to load; cleanup removes it.
func writeEffective(pol *policy.Policy) (file string, cleanup func(), err error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(pol.Source(pol.File), &doc); err != nil {
		return "", nil, err
	}
	dir := filepath.Dir(pol.File)
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n == nil {
			return
		}
		if n.Kind == yaml.MappingNode {
			for _, key := range []string{"hosts_file", "groups_file"} {
				if v := value(n, key); v != nil && v.Kind == yaml.ScalarNode && !filepath.IsAbs(v.Value) {
					v.Value = filepath.Join(dir, v.Value)
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&doc)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return "", nil, err
	}
	tmp, err := os.MkdirTemp("", "sluice-conform-policy")
	if err != nil {
		return "", nil, err
	}
	file = filepath.Join(tmp, filepath.Base(pol.File))
	if err := os.WriteFile(file, out, 0o600); err != nil {
		os.RemoveAll(tmp)
		return "", nil, err
	}
	return file, func() { os.RemoveAll(tmp) }, nil
}

// timed returns pol with `rtt: on` on each interface of names that
// does not say otherwise, so that each cell gives its subjects' round
// trips from their own TCP packets. pol as it is where that changes
// nothing.
func timed(pol *policy.Policy, names map[string]bool) (*policy.Policy, error) {
	src := pol.Source(pol.File)
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil || len(doc.Content) == 0 {
		return pol, err
	}
	ifaces := value(doc.Content[0], "interfaces")
	if ifaces == nil {
		return pol, nil
	}
	changed := false
	for _, in := range ifaces.Content {
		name := value(in, "name")
		if in.Kind != yaml.MappingNode || name == nil || !names[name.Value] || value(in, "rtt") != nil {
			continue
		}
		in.Content = append(in.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "rtt"}, &yaml.Node{Kind: yaml.ScalarNode, Value: "on"})
		changed = true
	}
	if !changed {
		return pol, nil
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	t, _, err := policy.Parse(pol.File, out.Bytes())
	return t, err
}

// timeable lists the interfaces of pol whose round trips a run may time
// without adding work to a packet's way: every tree of theirs classified
// by sluice's BPF program (an EDT tree, or HTB's with the BPF classifier),
// whose own hook times them. Where u32 classifies, timing would add an
// observing copy of the classifier on every packet: on an emulated
// machine that costs enough to move a share (the 6.1 lane: a class of
// bare ACKs beside TCP read 5.2% from its share, once in two runs).
// pol's trees' classifiers are the planner's (plan.Build settles auto).
func timeable(pol *policy.Policy) map[string]bool {
	out := map[string]bool{}
	for _, in := range pol.Interfaces {
		ok := in.Egress != nil || in.Ingress != nil
		for _, t := range []*policy.Tree{in.Egress, in.Ingress} {
			if t != nil && !(t.BPF || t.EDT()) {
				ok = false
			}
		}
		if ok {
			out[in.Name] = true
		}
	}
	return out
}
