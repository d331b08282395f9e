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

// KubeAPI is a real Kubernetes API server with its etcd, on loopback:
// kube-apiserver and etcd built by scripts/kubeapi.sh. It authenticates
// one admin by token and admits pods without a service account (no
// controller manager makes them).
type KubeAPI struct {
	// Kubeconfig is a file that reaches it as the admin.
	Kubeconfig string
	URL        string
	bin, dir   string
	port       int
	etcdURL    string
	etcd, api  *exec.Cmd
	exited     chan struct{} // closed when api has exited
}

const kubeToken = "sluice-e2e-admin-token"

// StartKubeAPI starts etcd and kube-apiserver for a test, and stops
// them when it ends. Without SLUICE_KUBEAPI_BIN it skips, unless
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
	k, err := NewKubeAPI(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// NewKubeAPI starts etcd and kube-apiserver from the binaries in bin,
// keeping their state and logs in dir; Close stops them.
func NewKubeAPI(bin, dir string) (*KubeAPI, error) {
	k := &KubeAPI{bin: bin, dir: dir}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})},
		{"sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})},
		{"tokens.csv", []byte(kubeToken + ",admin,admin,system:masters\n")},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return nil, err
		}
	}
	client, err := freePort()
	if err != nil {
		return nil, err
	}
	peer, err := freePort()
	if err != nil {
		return nil, err
	}
	k.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	k.etcd = exec.Command(filepath.Join(bin, "etcd"), "--name", "e2e", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", k.etcdURL, "--advertise-client-urls", k.etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL, "--log-level", "error")
	log, err := os.OpenFile(filepath.Join(dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	k.etcd.Stdout, k.etcd.Stderr = log, log
	if err := k.etcd.Start(); err != nil {
		return nil, err
	}
	if k.port, err = freePort(); err != nil {
		k.Close()
		return nil, err
	}
	k.URL = fmt.Sprintf("https://127.0.0.1:%d", k.port)
	if err := k.Start(); err != nil {
		k.Close()
		return nil, err
	}
	k.Kubeconfig = filepath.Join(dir, "kubeconfig")
	err = os.WriteFile(k.Kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
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
	if err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

// Start starts kube-apiserver (again, after Stop: on the same port and
// etcd, so that clients see a restart) and waits until it is ready.
func (k *KubeAPI) Start() error {
	k.api = exec.Command(filepath.Join(k.bin, "kube-apiserver"),
		"--etcd-servers", k.etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(k.port), "--cert-dir", filepath.Join(k.dir, "certs"),
		"--token-auth-file", filepath.Join(k.dir, "tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", filepath.Join(k.dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(k.dir, "sa.key"), "--service-cluster-ip-range", "10.96.0.0/16",
		"--disable-admission-plugins", "ServiceAccount", "--endpoint-reconciler-type", "none", "--v", "0")
	logName := filepath.Join(k.dir, "kube-apiserver.log")
	log, err := os.OpenFile(logName, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	k.api.Stdout, k.api.Stderr = log, log
	if err := k.api.Start(); err != nil {
		return err
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
				return nil
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logName)
			return fmt.Errorf("kube-apiserver exited:\n%s", tail(b, 3000))
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logName)
			k.Stop()
			return fmt.Errorf("kube-apiserver not ready in 90 s:\n%s", tail(b, 3000))
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

// Close stops kube-apiserver and etcd.
func (k *KubeAPI) Close() {
	k.Stop()
	if k.etcd != nil && k.etcd.Process != nil {
		k.etcd.Process.Kill()
		k.etcd.Wait()
		k.etcd = nil
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
