package testutil

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// KubeAPI is a real Kubernetes API server with its etcd, on loopback,
// for one test: kube-apiserver and etcd built by scripts/kubeapi.sh
// (SLUICE_KUBEAPI_BIN names their directory). It authenticates one
// admin by token and admits pods without a service account (no
// controller manager makes them).
type KubeAPI struct {
	// Kubeconfig is a file that reaches it as the admin.
	Kubeconfig string
	URL        string
	t          testing.TB
	bin, dir   string
	port       int
	etcdURL    string
	api        *exec.Cmd
	exited     chan struct{} // closed when api has exited
}

const kubeToken = "sluice-e2e-admin-token"

// StartKubeAPI starts etcd and kube-apiserver, and stops them when the
// test ends. Without SLUICE_KUBEAPI_BIN it skips, unless
// SLUICE_REQUIRE_KUBEAPI=1 (CI), where that is a failure.
func StartKubeAPI(t testing.TB) *KubeAPI {
	t.Helper()
	bin := os.Getenv("SLUICE_KUBEAPI_BIN")
	if bin == "" {
		if os.Getenv("SLUICE_REQUIRE_KUBEAPI") == "1" {
			t.Fatal("SLUICE_KUBEAPI_BIN is not set: export SLUICE_KUBEAPI_BIN=$(scripts/kubeapi.sh)")
		}
		t.Skip("no API server: export SLUICE_KUBEAPI_BIN=$(scripts/kubeapi.sh) to run it")
	}
	dir := t.TempDir()
	k := &KubeAPI{t: t, bin: bin, dir: dir}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
	os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
	os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(kubeToken+",admin,admin,system:masters\n"), 0o600)

	client, peer := freePort(t), freePort(t)
	k.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", client)
	etcd := exec.Command(filepath.Join(bin, "etcd"), "--name", "e2e", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", k.etcdURL, "--advertise-client-urls", k.etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer), "--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-cluster", fmt.Sprintf("e2e=http://127.0.0.1:%d", peer), "--log-level", "error")
	etcd.Stdout, etcd.Stderr = logFile(t, dir, "etcd.log"), logFile(t, dir, "etcd.log")
	if err := etcd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Process.Kill(); etcd.Wait() })

	k.port = freePort(t)
	k.URL = fmt.Sprintf("https://127.0.0.1:%d", k.port)
	k.Start()
	t.Cleanup(k.Stop)
	k.Kubeconfig = filepath.Join(dir, "kubeconfig")
	os.WriteFile(k.Kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: %q}
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
`, k.URL, kubeToken)), 0o600)
	return k
}

// Start starts kube-apiserver (again, after Stop: on the same port and
// etcd, so that clients see a restart) and waits until it is ready.
func (k *KubeAPI) Start() {
	k.t.Helper()
	k.api = exec.Command(filepath.Join(k.bin, "kube-apiserver"),
		"--etcd-servers", k.etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(k.port), "--cert-dir", filepath.Join(k.dir, "certs"),
		"--token-auth-file", filepath.Join(k.dir, "tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", filepath.Join(k.dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(k.dir, "sa.key"), "--service-cluster-ip-range", "10.96.0.0/16",
		"--disable-admission-plugins", "ServiceAccount", "--endpoint-reconciler-type", "none", "--v", "0")
	log := logFile(k.t, k.dir, "kube-apiserver.log")
	k.api.Stdout, k.api.Stderr = log, log
	if err := k.api.Start(); err != nil {
		k.t.Fatal(err)
	}
	exited := make(chan struct{})
	k.exited = exited
	go func(c *exec.Cmd) { c.Wait(); close(exited) }(k.api)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(90 * time.Second)
	for {
		req, _ := http.NewRequest("GET", k.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+kubeToken)
		if r, err := hc.Do(req); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(k.dir, "kube-apiserver.log"))
			k.t.Fatalf("kube-apiserver exited:\n%s", tail(b, 3000))
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(k.dir, "kube-apiserver.log"))
			k.t.Fatalf("kube-apiserver not ready in 90 s:\n%s", tail(b, 3000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Stop stops kube-apiserver; etcd keeps what it stored.
func (k *KubeAPI) Stop() {
	if k.api != nil && k.api.Process != nil {
		k.api.Process.Kill()
		<-k.exited
		k.api = nil
	}
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func logFile(t testing.TB, dir, name string) *os.File {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
