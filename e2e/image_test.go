package e2e

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"sluice/kube"
	"sluice/testutil"
)

// The agent's image as a container runtime runs the DaemonSet: its root
// file system (the image's one layer, unpacked) mounted read-only, the
// policy mounted read-only at /etc/sluice, a fresh /run/sluice (the
// DaemonSet's hostPath), /proc and /sys; the agent shapes its node's
// pods from a real API server and writes nowhere else (issue 58: the
// read-only root had never been run; issue 61: the image is whole).
func TestImageRunsWithAReadOnlyRoot(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	api := testutil.StartKubeAPI(t)
	for _, tool := range []string{"make", "unshare", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("no %s", tool)
		}
	}
	if out, err := exec.Command("make", "-C", "..", "image", "IMAGE_ARCHES=amd64").CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	unpackImage(t, "../out/image", "amd64", root)
	// What a runtime makes in the root before it is made read-only: the
	// mount points.
	for _, d := range []string{"proc", "sys", "dev", "run/netns", "etc/kube"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := testutil.NewPair(t)
	pol := t.TempDir()
	os.WriteFile(filepath.Join(pol, "policy.yaml"), []byte(fmt.Sprintf(`interfaces:
  - name: %s
    egress:
      rate: 100mbit
      default: other
      classes:
        - {name: pods, rate: 80mbit, per_host: {pods: ingress}}
        - {name: other, rate: 20mbit}
`, p.DevA)), 0o644)
	kubeDir := filepath.Dir(api.Kubeconfig)

	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := corev1client.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	client.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	client.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
	if err := runPod(ctx, client.Pods("shop"), "web", "node-a", map[string]string{kube.IngressBandwidth: "7M"}, testutil.AddrB); err != nil {
		t.Fatal(err)
	}

	script := `set -e
r=$1 pol=$2 kube=$3 ns=$4
mount --make-rprivate /
mount --bind "$r" "$r"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount -t tmpfs -o size=1m,mode=755 dev "$r/dev"
mount -t tmpfs -o mode=700 state "$r/run/sluice"
mount --rbind /run/netns "$r/run/netns"
mount --bind "$pol" "$r/etc/sluice" && mount -o remount,bind,ro "$r/etc/sluice"
mount --bind "$kube" "$r/etc/kube" && mount -o remount,bind,ro "$r/etc/kube"
mount -o remount,bind,ro "$r"
exec chroot "$r" /usr/bin/sluice --netns "$ns" agent /etc/sluice/policy.yaml --kubernetes --kubeconfig /etc/kube/` + filepath.Base(api.Kubeconfig) + ` --node node-a --listen 127.0.0.1:0 --interval 500ms
`
	agent := exec.Command("unshare", "--mount", "--", "sh", "-c", script, "sh", root, pol, kubeDir, p.A)
	agent.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	logf := filepath.Join(t.TempDir(), "agent.log")
	lf, _ := os.Create(logf)
	agent.Stdout, agent.Stderr = lf, lf
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		agent.Process.Signal(os.Interrupt)
		agent.Wait()
		lf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf)
			t.Logf("agent log:\n%s", tail(string(b), 4000))
		}
	}()
	if _, ok := within(30*time.Second, func() bool {
		return strings.Contains(tcShow(t, p.A, "class", "show", "dev", p.DevA), "rate 7Mbit")
	}); !ok {
		t.Fatalf("the agent in the image did not shape the pod:\n%s", tcShow(t, p.A, "class", "show", "dev", p.DevA))
	}
	// Its root is read-only, as it sees it (mountinfo is relative to
	// its root: the line whose mount point is /), and /run/sluice not.
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", agent.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string]string{}
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 5 {
			opts[f[4]] = f[5]
		}
	}
	if !strings.HasPrefix(opts["/"], "ro") || !strings.HasPrefix(opts["/etc/sluice"], "ro") || !strings.HasPrefix(opts["/run/sluice"], "rw") {
		t.Errorf("the agent's mounts: / %q, /etc/sluice %q, /run/sluice %q; want the root and the policy read-only", opts["/"], opts["/etc/sluice"], opts["/run/sluice"])
	}
	// Still running, and nothing it tried to write was refused.
	time.Sleep(2 * time.Second)
	if agent.ProcessState != nil {
		t.Fatalf("the agent exited: %v", agent.ProcessState)
	}
	b, _ := os.ReadFile(logf)
	for _, bad := range []string{"read-only file system", "level=ERROR", "permission denied"} {
		if strings.Contains(strings.ToLower(string(b)), strings.ToLower(bad)) {
			t.Errorf("the agent's log says %q:\n%s", bad, tail(string(b), 3000))
		}
	}
}

// unpackImage writes the layers of arch's image in the OCI layout at dir
// into root.
func unpackImage(t *testing.T, dir, arch, root string) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 {
		t.Fatalf("the layout's index: %v %v", tm, err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range im.Manifests {
		if m.Platform == nil || m.Platform.Architecture != arch {
			continue
		}
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			rc, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(root, filepath.Clean("/"+h.Name))
				switch h.Typeflag {
				case tar.TypeDir:
					if err := os.MkdirAll(path, os.FileMode(h.Mode)&os.ModePerm|os.ModeDir); err != nil {
						t.Fatal(err)
					}
					os.Chmod(path, os.FileMode(h.Mode)&os.ModePerm)
				case tar.TypeReg:
					os.MkdirAll(filepath.Dir(path), 0o755)
					f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&os.ModePerm)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := io.Copy(f, tr); err != nil {
						t.Fatal(err)
					}
					f.Close()
				default:
					t.Fatalf("%s: an entry of type %c in the image", h.Name, h.Typeflag)
				}
			}
			rc.Close()
		}
		return
	}
	t.Fatalf("no %s image in %s", arch, dir)
}
