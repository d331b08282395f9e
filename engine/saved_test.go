package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSavedPlan(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name, src string
		ok        bool
		err       string
	}{
		{"a policy", "interfaces:\n  - name: eth0\n", false, ""},
		{"a policy in flow style", `{"interfaces": [{"name": "eth0"}]}`, false, ""},
		{"not there", "", false, ""},
		{"a newer format", `{"sluice_plan": 2}`, true, "a saved plan of format 2; this sluice reads format 1"},
		{"lines without ids", `{"sluice_plan": 1, "policy_file": "/p.yaml", "changes": ["+ x"], "ids": []}`, true, "not whole"},
		{"a relative policy", `{"sluice_plan": 1, "policy_file": "p.yaml"}`, true, "not whole"},
		{"broken", `{"sluice_plan": 1, "ids": 7}`, true, "cannot be read"},
		{"whole", `{"sluice_plan": 1, "policy_file": "/p.yaml", "policy": "x", "changes": ["+ x"], "ids": ["add x 1"]}`, true, ""},
	} {
		path := filepath.Join(dir, "missing")
		if c.src != "" {
			path = write(strings.ReplaceAll(c.name, " ", "-"), c.src)
		}
		s, ok, err := ReadSavedPlan(path)
		switch {
		case ok != c.ok:
			t.Errorf("%s: ok %v, want %v", c.name, ok, c.ok)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want %q", c.name, err, c.err)
		case c.err != "" && !errors.As(err, new(*InputError)):
			t.Errorf("%s: %v is not bad input", c.name, err)
		case c.ok && c.err == "" && (s == nil || s.Source != "x"):
			t.Errorf("%s: read %+v", c.name, s)
		}
	}
}

func TestSavedPlanWrite(t *testing.T) {
	dir := t.TempDir()
	s := &SavedPlan{Format: SavedPlanFormat, File: "/p.yaml", Source: "x", Changes: []string{"+ a"}, IDs: []string{"add a 1"}}
	path := filepath.Join(dir, "p.plan")
	os.WriteFile(path, []byte("an older, longer plan than this one"), 0o644)
	if err := s.Write(path); err != nil {
		t.Fatal(err)
	}
	back, ok, err := ReadSavedPlan(path)
	if err != nil || !ok || back.Source != "x" || back.IDs[0] != "add a 1" {
		t.Fatalf("read back %+v %v %v", back, ok, err)
	}
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep"), 0o644)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	if err := s.Write(link); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("through a link: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("the link's target was written: %q", b)
	}
	if err := s.Write(dir); err == nil {
		t.Fatal("a directory was written as a plan")
	}
}

func TestStalePlanError(t *testing.T) {
	e := &StalePlanError{Path: "p.plan", Gone: []string{"+ a", "+ b"}, New: []string{"~ c", "~ d", "~ e", "~ f", "~ g", "~ h", "~ i"}}
	msg := e.Error()
	for _, want := range []string{"p.plan: the kernel moved since this plan was made", "planned, no longer needed as planned: + b",
		"needed now, not in the plan: ~ g", "... and 2 more"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "~ h") {
		t.Errorf("more than five lines listed:\n%s", msg)
	}
}
