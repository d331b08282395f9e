package main

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// The same binaries give the same digest, written twice; the image holds
// the binary, the CA bundle and the directories the agent writes, for
// each architecture, and runs the binary.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	b := bins{"amd64": file("a", "binary for amd64"), "arm": file("b", "binary for armv7")}
	ca := file("ca", "-----BEGIN CERTIFICATE-----\n")
	when := time.Unix(1700000000, 0)
	d1, err := write(filepath.Join(dir, "one"), b, ca, "v0.1.0+g1", when)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := write(filepath.Join(dir, "two"), b, ca, "v0.1.0+g1", when)
	if err != nil {
		t.Fatal(err)
	}
	if d1 != d2 {
		t.Errorf("two builds of the same inputs: %s and %s", d1, d2)
	}
	if d3, _ := write(filepath.Join(dir, "three"), bins{"amd64": b["amd64"], "arm": file("c", "another")}, ca, "v0.1.0+g1", when); d3 == d1 {
		t.Error("another binary, the same digest")
	}

	p, err := layout.FromPath(filepath.Join(dir, "one"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 || tm.Manifests[0].Digest != d1 || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v0.1.0_g1" {
		t.Fatalf("the layout's index: %+v (%v), want our index %s tagged v0.1.0_g1", tm, err, d1)
	}
	idx, err := top.ImageIndex(d1)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 2 {
		t.Fatalf("index: %+v %v", im, err)
	}
	for _, m := range im.Manifests {
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != m.Platform.Architecture || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/usr/bin/sluice" || !cf.Created.Time.Equal(when) {
			t.Errorf("%s: config %+v", m.Platform.Architecture, cf)
		}
		if m.Platform.Architecture == "arm" && m.Platform.Variant != "v7" {
			t.Errorf("arm is not v7: %+v", m.Platform)
		}
		layers, _ := img.Layers()
		if len(layers) != 1 {
			t.Fatalf("%d layers", len(layers))
		}
		rc, _ := layers[0].Uncompressed()
		tr := tar.NewReader(rc)
		files := map[string]string{}
		var names []string
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(tr)
			files[h.Name] = string(body)
			names = append(names, h.Name)
			if !h.ModTime.Equal(when) || h.Uid != 0 {
				t.Errorf("%s: time %v, uid %d", h.Name, h.ModTime, h.Uid)
			}
			if h.Name == "usr/bin/sluice" && h.Mode != 0o755 {
				t.Errorf("the binary's mode is %o", h.Mode)
			}
		}
		rc.Close()
		sort.Strings(names)
		want := map[string]string{"amd64": "binary for amd64", "arm": "binary for armv7"}[m.Platform.Architecture]
		if files["usr/bin/sluice"] != want || files["etc/ssl/certs/ca-certificates.crt"] != "-----BEGIN CERTIFICATE-----\n" || len(names) != 11 {
			t.Errorf("%s's layer: %v", m.Platform.Architecture, names)
		}
	}
}
