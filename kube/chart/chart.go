// Package chart renders sluice's Helm chart (deploy/helm/sluice) with
// Helm's own engine, as `helm template` does, for the tests that check
// what it makes: locally, and against a real API server. Nothing of the
// sluice binary imports it.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/engine"
)

// Object is one rendered manifest: its kind, name, and the document.
type Object struct {
	Kind, Name string
	Template   string // the template that made it
	Doc        map[string]any
	YAML       []byte
}

// Render renders the chart at dir as release name in namespace with
// values over the chart's defaults, and returns the objects in the
// order of their templates.
func Render(dir, name, namespace string, values map[string]any) ([]Object, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, err
	}
	vals, err := util.ToRenderValues(ch, values, common.ReleaseOptions{Name: name, Namespace: namespace, IsInstall: true, Revision: 1}, nil)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	files := make([]string, 0, len(out))
	for f := range out {
		if strings.HasSuffix(f, ".yaml") {
			files = append(files, f)
		}
	}
	sort.Strings(files)
	var objs []Object
	for _, f := range files {
		dec := yaml.NewDecoder(strings.NewReader(out[f]))
		for {
			var n yaml.Node
			if err := dec.Decode(&n); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			var doc map[string]any
			if err := n.Decode(&doc); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if doc == nil {
				continue
			}
			var buf bytes.Buffer
			enc := yaml.NewEncoder(&buf)
			if err := enc.Encode(&n); err != nil {
				return nil, err
			}
			kind, _ := doc["kind"].(string)
			meta, _ := doc["metadata"].(map[string]any)
			objName, _ := meta["name"].(string)
			objs = append(objs, Object{Kind: kind, Name: objName, Template: filepath.Base(f), Doc: doc, YAML: buf.Bytes()})
		}
	}
	return objs, nil
}
