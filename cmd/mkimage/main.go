// Command mkimage writes sluice's container image without Docker: an OCI
// image layout (skopeo, crane, podman and containerd read it) holding the
// static binary and a CA bundle, nothing else, as a multi-platform index
// of one image per architecture given. The same inputs give the same
// digest: every file's time is SOURCE_DATE_EPOCH's (or 0), and nothing
// of the build machine (user, time, order) gets in.
//
//	mkimage -o DIR -bin amd64=PATH [-bin arm64=PATH ...] [-ca FILE] [-version V]
//
// It prints the index's digest, and writes it to DIR/digest; the
// layout names the index by the version as a tag (Tag).
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type bins map[string]string

func (b bins) String() string { return fmt.Sprint(map[string]string(b)) }
func (b bins) Set(s string) error {
	arch, path, ok := strings.Cut(s, "=")
	if !ok || arch == "" || path == "" {
		return fmt.Errorf("%q: want ARCH=PATH (amd64=out/dist/sluice-...)", s)
	}
	b[arch] = path
	return nil
}

func main() {
	b := bins{}
	out := flag.String("o", "out/image", "the OCI layout directory to write (replaced)")
	ca := flag.String("ca", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle to include (the API server's and registries' TLS)")
	version := flag.String("version", "", "the version, for the image's labels")
	flag.Var(b, "bin", "ARCH=PATH: the static binary for a GOARCH (arm is armv7); repeat for each")
	flag.Parse()
	if len(b) == 0 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimage -o DIR -bin ARCH=PATH [-bin ARCH=PATH ...] [-ca FILE] [-version V]")
		os.Exit(2)
	}
	digest, err := write(*out, b, *ca, *version, epoch())
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println(digest)
}

// epoch is SOURCE_DATE_EPOCH, the reproducible builds' time, or 0.
func epoch() time.Time {
	if n, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		return time.Unix(n, 0).UTC()
	}
	return time.Unix(0, 0).UTC()
}

// write builds the index and writes it as an OCI layout at dir.
func write(dir string, b bins, caFile, version string, when time.Time) (v1.Hash, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("the CA bundle: %w", err)
	}
	arches := make([]string, 0, len(b))
	for a := range b {
		arches = append(arches, a)
	}
	sort.Strings(arches)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range arches {
		bin, err := os.ReadFile(b[arch])
		if err != nil {
			return v1.Hash{}, err
		}
		img, err := image(arch, bin, ca, version, when)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("%s: %w", arch, err)
		}
		p := &v1.Platform{OS: "linux", Architecture: arch}
		if arch == "arm" {
			p.Variant = "v7"
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}})
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, err
	}
	// The layout's own index names ours by a tag (the version, as a tag
	// may spell it): skopeo copy --all oci:DIR:TAG docker://REGISTRY/sluice:TAG.
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": Tag(version)})); err != nil {
		return v1.Hash{}, err
	}
	d, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	return d, os.WriteFile(filepath.Join(dir, "digest"), []byte(d.String()+"\n"), 0o644)
}

// Tag is version as an image tag may spell it ([A-Za-z0-9_.-], no +),
// "dev" for none.
func Tag(version string) string {
	if version == "" {
		return "dev"
	}
	t := []byte(version)
	for i, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			t[i] = '_'
		}
	}
	return string(t[:min(len(t), 128)])
}

// image is one architecture's image: a layer with the binary at
// /usr/bin/sluice, the CA bundle, and the directories the agent writes
// (mounted over in the DaemonSet, whose root is read-only).
func image(arch string, bin, ca []byte, version string, when time.Time) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entry := func(name string, mode int64, body []byte) error {
		h := &tar.Header{Name: name, Mode: mode, ModTime: when, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		if strings.HasSuffix(name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	for _, e := range []struct {
		name string
		mode int64
		body []byte
	}{
		{"etc/", 0o755, nil}, {"etc/sluice/", 0o755, nil}, {"etc/ssl/", 0o755, nil}, {"etc/ssl/certs/", 0o755, nil},
		{"etc/ssl/certs/ca-certificates.crt", 0o644, ca},
		{"run/", 0o755, nil}, {"run/sluice/", 0o700, nil}, {"tmp/", 0o1777, nil},
		{"usr/", 0o755, nil}, {"usr/bin/", 0o755, nil}, {"usr/bin/sluice", 0o755, bin},
	} {
		if err := entry(e.name, e.mode, e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: when}
	cf.OS, cf.Architecture = "linux", arch
	if arch == "arm" {
		cf.Variant = "v7"
	}
	cf.History = []v1.History{{Created: v1.Time{Time: when}, CreatedBy: "sluice cmd/mkimage", Comment: "the static binary and a CA bundle"}}
	cf.Config.Entrypoint = []string{"/usr/bin/sluice"}
	cf.Config.Env = []string{"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "sluice",
		"org.opencontainers.image.description": "declarative traffic shaping for Linux: the agent for Kubernetes nodes",
	}
	if version != "" {
		cf.Config.Labels["org.opencontainers.image.version"] = version
	}
	return mutate.ConfigFile(img, cf)
}
