package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sluice/testutil"
)

// make install puts the binary, man pages and completions made from the
// commands, the examples, both units (pointing at the installed binary)
// and /etc/sluice/policy.yaml (a template, refused until edited) under DESTDIR, and keeps a policy
// already there; make deb packages the same, the policy a conffile, and
// the binary unpacked from it runs.
func TestInstallAndPackage(t *testing.T) {
	testutil.Slow(t)
	for _, tool := range []string{"make", "dpkg-deb", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("no %s (scripts/install-deps.sh installs it)", tool)
			}
			t.Skipf("no %s", tool)
		}
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	root := t.TempDir()
	run("make", "-C", "..", "install", "DESTDIR="+root, "PREFIX=/usr")
	read := func(rel string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatalf("installed: %v", err)
		}
		return string(b)
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/bin/sluice")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("usr/bin/sluice: %v", err)
	}
	for page, title := range map[string]string{"sluice.1": `"SLUICE"`, "sluice-apply.1": `"SLUICE-APPLY"`, "sluice-lab-conformance.1": `"SLUICE-LAB-CONFORMANCE"`} {
		if m := read("usr/share/man/man1/" + page); !strings.Contains(m, ".TH "+title+` "1"`) || !strings.Contains(m, ".SH SYNOPSIS") {
			t.Errorf("%s is not the man page of its command:\n%.300s", page, m)
		}
	}
	// sluice(1) has what --help does not; the policy and the agent have
	// their sections' pages; the documents are installed beside them.
	page := read("usr/share/man/man1/sluice.1")
	for _, sec := range []string{".SH EXAMPLE", ".SH EXIT STATUS", ".SH ENVIRONMENT", ".SH FILES", "sluice-policy\\fP(5)", "sluice-agent(8)"} {
		if !strings.Contains(page, sec) {
			t.Errorf("sluice.1 has no %q", sec)
		}
	}
	if m := read("usr/share/man/man5/sluice-policy.5"); !strings.Contains(m, ".TH SLUICE-POLICY 5") || !strings.Contains(m, "template: true") || !strings.Contains(m, ".SH Classes") || strings.Contains(m, "\n.TS") {
		t.Errorf("sluice-policy.5: not the policy reference as a page without tables:\n%.400s", m)
	}
	if m := read("usr/share/man/man8/sluice-agent.8"); !strings.Contains(m, `.TH "SLUICE-AGENT" "8"`) || !strings.Contains(m, ".SH SIGNALS") || !strings.Contains(m, "SIGHUP") {
		t.Errorf("sluice-agent.8 has no signals:\n%.400s", m)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/share/man/man1/sluice-agent.1")); err == nil {
		t.Error("sluice-agent is installed as a page of section 1 too")
	}
	if !strings.Contains(read("usr/share/doc/sluice/policy.md"), "# Policy reference") {
		t.Error("docs/policy.md is not installed")
	}
	// Every page renders without a warning where groff is.
	if groff, err := exec.LookPath("groff"); err == nil {
		pages, _ := filepath.Glob(filepath.Join(root, "usr/share/man/man*/*"))
		for _, p := range pages {
			out, err := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z", p).CombinedOutput()
			if err != nil || len(out) > 0 {
				t.Errorf("groff %s: %v\n%s", filepath.Base(p), err, out)
			}
		}
	}
	if !strings.Contains(read("usr/share/man/man1/sluice-plan.1"), "detailed-exitcode") {
		t.Error("sluice-plan.1 does not list plan's flags")
	}
	run("bash", "-n", filepath.Join(root, "usr/share/bash-completion/completions/sluice"))
	if !strings.Contains(read("usr/share/zsh/site-functions/_sluice"), "#compdef sluice") || !strings.Contains(read("usr/share/fish/vendor_completions.d/sluice.fish"), "complete -c sluice") {
		t.Error("zsh or fish completion missing")
	}
	for _, unit := range []string{"sluice-agent.service", "sluice-apply.service"} {
		u := read("usr/lib/systemd/system/" + unit)
		if !regexp.MustCompile(`(?m)^ExecStart=/usr/bin/sluice `).MatchString(u) || strings.Contains(u, "/usr/local/bin") {
			t.Errorf("%s does not run the installed binary:\n%s", unit, u)
		}
	}
	// The installed policy is a template: refused (bad input, 2) with
	// the line to delete, and valid once it is deleted.
	pol := filepath.Join(root, "etc/sluice/policy.yaml")
	out, err := exec.Command(filepath.Join(root, "usr/bin/sluice"), "validate", pol).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "this is the template sluice installs") {
		t.Errorf("sluice validate of the installed template: %v\n%s\nwant exit 2 and the template's message", err, out)
	}
	tmpl := read("etc/sluice/policy.yaml")
	os.WriteFile(pol, []byte(regexp.MustCompile(`(?m)^template: true.*\n`).ReplaceAllString(tmpl, "")), 0o644)
	run(filepath.Join(root, "usr/bin/sluice"), "validate", pol)
	run(filepath.Join(root, "usr/bin/sluice"), "validate", filepath.Join(root, "usr/share/doc/sluice/examples/office.yaml"))
	// A policy already there is the user's: a second install keeps it.
	os.WriteFile(pol, []byte("# mine\n"), 0o644)
	run("make", "-C", "..", "install", "DESTDIR="+root, "PREFIX=/usr")
	if read("etc/sluice/policy.yaml") != "# mine\n" {
		t.Error("install overwrote /etc/sluice/policy.yaml")
	}

	deb := makeDeb(t)
	if f := run("dpkg-deb", "-f", deb, "Package", "Depends"); !strings.Contains(f, "Package: sluice") || !strings.Contains(f, "Depends: iproute2") {
		t.Errorf("control:\n%s", f)
	}
	list := run("dpkg-deb", "-c", deb)
	for _, want := range []string{"./usr/bin/sluice", "./usr/share/man/man8/sluice-agent.8", "./usr/share/man/man5/sluice-policy.5", "./lib/systemd/system/sluice-agent.service",
		"./lib/systemd/system/sluice-apply.service", "./etc/sluice/policy.yaml", "./usr/share/bash-completion/completions/sluice"} {
		if !strings.Contains(list, want+"\n") {
			t.Errorf("the package lacks %s", want)
		}
	}
	if regexp.MustCompile(`(?m)^\S+ root/root .*\./usr/bin/sluice$`).FindString(list) == "" {
		t.Errorf("files are not root's in the package:\n%.400s", list)
	}
	x := t.TempDir()
	run("dpkg-deb", "-x", deb, x)
	ctl := t.TempDir()
	run("dpkg-deb", "-e", deb, ctl)
	if b, _ := os.ReadFile(filepath.Join(ctl, "conffiles")); string(b) != "/etc/sluice/policy.yaml\n" {
		t.Errorf("conffiles %q", b)
	}
	// Maintainer scripts: an upgrade restarts a running agent on the new
	// binary (it went on running the old one), a removal stops both
	// services (issue 58).
	for name, want := range map[string]string{"postinst": "systemctl try-restart sluice-agent.service", "prerm": "systemctl stop sluice-agent.service sluice-apply.service", "postrm": "daemon-reload"} {
		p := filepath.Join(ctl, name)
		b, err := os.ReadFile(p)
		fi, _ := os.Stat(p)
		if err != nil || !strings.Contains(string(b), want) || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("DEBIAN/%s: %v, executable %v, says %q: want %q", name, err, fi != nil && fi.Mode().Perm()&0o111 != 0, b, want)
		}
		if out, err := exec.Command("sh", "-n", p).CombinedOutput(); err != nil {
			t.Errorf("DEBIAN/%s is not a valid shell script: %v %s", name, err, out)
		}
	}
	if v := run(filepath.Join(x, "usr/bin/sluice"), "version"); !strings.HasPrefix(v, "sluice ") {
		t.Errorf("the packaged binary says %q", v)
	}
}

// makeDeb builds the package with make deb and returns its path, removed
// when the test ends.
func makeDeb(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("make", "-C", "..", "deb").CombinedOutput()
	if err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`building package 'sluice' in '([^']+\.deb)'`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("make deb built no package:\n%s", out)
	}
	deb := filepath.Join("..", m[1])
	t.Cleanup(func() { os.Remove(deb) })
	return deb
}
