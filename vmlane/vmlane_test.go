package vmlane

import (
	"os"
	"path/filepath"
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
