package lab

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A variant's "@file" policy is read as a policy file is, from the
// scenario's own folder only, and every variant's policy is read and
// validated when the scenario is, before anything runs.
func TestScenarioPolicyFiles(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "lab")
	os.Mkdir(dir, 0o755)
	write := func(path, text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "secret"), "the-secret-line\n")
	write(filepath.Join(dir, "good.yaml"), "interfaces:\n  - name: wan\n    egress: {rate: 10mbit}\n")
	write(filepath.Join(dir, "bad.yaml"), "interfaces:\n  - name: wan\n    egress: {rate: fast}\n")
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	scenario := func(policies ...string) string {
		var b strings.Builder
		b.WriteString("name: files\nphases: [{name: p, duration: 1s}]\nvariants:\n")
		for i, p := range policies {
			b.WriteString("  - name: v" + string(rune('a'+i)) + "\n    policy: " + p + "\n")
		}
		file := filepath.Join(dir, "s.yaml")
		write(file, b.String())
		return file
	}
	s, err := Load(scenario(`""`, `"@good.yaml"`))
	if err != nil {
		t.Fatal(err)
	}
	if text, _ := s.policyText(s.Variants[1]); !strings.Contains(text, "10mbit") {
		t.Errorf("@good.yaml read as %q", text)
	}
	// A link inside the folder that leads out of it.
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	if err := os.Symlink(root, filepath.Join(dir, "sub", "up")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(dir, "sub", "root")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ ref, want string }{
		{`"@sub/up/secret"`, "leads outside"},
		{`"@sub/root/etc/passwd"`, "leads outside"},
		{`"@../secret"`, "in the scenario's folder"},
		{`"@../../../../dev/zero"`, "in the scenario's folder"},
		{`"@/dev/zero"`, "in the scenario's folder"},
		{`"@fifo.yaml"`, "not a regular file"},
		{`"@missing.yaml"`, "no such file"},
		{`"@."`, "not a regular file"},
	} {
		_, err := Load(scenario(c.ref))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "the-secret") {
			t.Errorf("policy %s: %v, want an error saying %q", c.ref, err, c.want)
		}
	}
	// The mistake is in the last variant: found at load.
	if _, err := Load(scenario(`""`, `"@good.yaml"`, `"@bad.yaml"`)); err == nil || !strings.Contains(err.Error(), "variant vc") || !strings.Contains(err.Error(), "fast") {
		t.Errorf("a bad last variant: %v", err)
	}
	if _, err := Parse("text", []byte("name: x\nphases: [{name: p, duration: 1s}]\nvariants: [{name: a, policy: \"@good.yaml\"}]\n")); err == nil {
		t.Error("a scenario given as text referred to a file")
	}
	// The scenario file itself is read as a bounded regular file.
	if _, err := Load(filepath.Join(dir, "fifo.yaml")); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO as the scenario: %v", err)
	}
}
