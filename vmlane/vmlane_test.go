package vmlane

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A kernel argument that names no kernel is refused before anything is
// fetched: `lab run --kernel '6.1*'` once asked apt for 54 packages.
func TestCheckKernel(t *testing.T) {
	img := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(img, []byte("not really"), 0o644)
	for _, c := range []struct {
		arg string
		ok  bool
	}{
		{"6.1", true}, {"6.12", true}, {"6.1.0-56", true}, {"6.12.57-1", true}, {img, true},
		{"6.1*", false}, {".*", false}, {"6", false}, {"6.1.0-56;reboot", false}, {"6.1.0-56 -y", false},
		{"", false}, {"vmlinuz", false}, {"./no-such-image", false}, {filepath.Dir(img) + "/", false},
	} {
		if err := CheckKernel(c.arg); (err == nil) != c.ok {
			t.Errorf("CheckKernel(%q) = %v", c.arg, err)
		}
	}
}

// out/ is where builds and tests write (the lane's guests and logs under
// out/vm among them), and they remove what they wrote while other go
// commands run: make install's out/share vanished under the race build's
// `go test ./...` as it listed packages, and failed that CI run. out/ is
// a module of its own (out/go.mod), so ./... never walks it: a
// directory there, even one holding a file that is not Go, is no
// package of sluice's.
func TestOutIsNotWalked(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	dir, err := os.MkdirTemp(filepath.Join("..", "out"), "walk-probe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte("this is not Go\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, "list", "./...")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list ./... beside a broken directory under out/: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "sluice/out") {
		t.Errorf("go list ./... lists packages under out/:\n%s", out)
	}
}
