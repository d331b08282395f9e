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
	m := regexp.MustCompile(`(?m)^package: (\S+\.deb)$`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("make deb built no package:\n%s", out)
	}
	deb := filepath.Join("..", m[1])
	t.Cleanup(func() { os.Remove(deb) })
	return deb
}

// The other packages of the one description (deploy/nfpm.yaml): rpm and
// apk as a server gets them, ipk as OpenWrt does, each with the version
// in its own format, its files, its conffile, its dependencies and
// maintainer scripts of its own init system that enable and start
// nothing; the binary in it runs and says the same version. (Debian's
// is installed and started under systemd: TestDebUnitsStartUnderSystemd.)
func TestPackagesForEveryFormat(t *testing.T) {
	testutil.Slow(t)
	for _, tool := range []string{"rpm", "tar", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("no %s (scripts/install-deps.sh installs it)", tool)
			}
			t.Skipf("no %s", tool)
		}
	}
	run := func(dir, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	version := strings.TrimSpace(run("..", "scripts/version.sh"))
	debv := strings.TrimSpace(run("..", "scripts/version.sh", "--deb", "--from", version))
	apkv := strings.TrimSpace(run("..", "scripts/version.sh", "--apk", "--from", version))
	out := run("..", "scripts/packages.sh", "rpm:amd64", "apk:amd64", "ipk:amd64")
	pkgs := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^package: (\S+\.(rpm|apk|ipk))$`).FindAllStringSubmatch(out, -1) {
		pkgs[m[2]] = filepath.Join("..", m[1])
		t.Cleanup(func() { os.Remove(filepath.Join("..", m[1])) })
	}
	if len(pkgs) != 3 {
		t.Fatalf("packages.sh built %v:\n%s", pkgs, out)
	}
	has := func(what, list string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !regexp.MustCompile(`(?m)^\.?` + regexp.QuoteMeta(w) + `$`).MatchString(list) {
				t.Errorf("%s lacks %s:\n%.1500s", what, w, list)
			}
		}
	}
	// Maintainer scripts: they may reload the init system and stop what
	// runs; they never enable or start.
	starts := regexp.MustCompile(`\b(systemctl (enable|start|restart)|rc-update add|/etc/init\.d/sluice-agent (enable|start)|rc-service \S+ start)\b`)
	checkScripts := func(what, scripts string) {
		t.Helper()
		for _, l := range strings.Split(scripts, "\n") {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "#") || strings.HasPrefix(l, "echo ") {
				continue // what the user is told to do
			}
			if m := starts.FindString(l); m != "" {
				t.Errorf("%s's scripts start or enable a service: %q", what, l)
			}
		}
	}
	unpack := func(archive string, args ...string) string {
		t.Helper()
		dir := t.TempDir()
		run("", "tar", append([]string{"-x", "-z", "-f", archive, "-C", dir}, args...)...)
		return dir
	}

	// rpm: Fedora's unit directory, %config(noreplace), iproute.
	rpm := pkgs["rpm"]
	if q := run("", "rpm", "-qp", "--qf", "%{VERSION}|%{ARCH}|[%{REQUIRES} ]", rpm); !strings.HasPrefix(q, debv+"|x86_64|") || !strings.Contains(q, "iproute ") {
		t.Errorf("rpm: %q, want version %s, x86_64, requires iproute", q, debv)
	}
	has("rpm", run("", "rpm", "-qpl", rpm), "/usr/bin/sluice", "/usr/lib/systemd/system/sluice-agent.service",
		"/usr/lib/systemd/system/sluice-apply.service", "/etc/sluice/policy.yaml", "/usr/share/man/man5/sluice-policy.5",
		"/usr/share/man/man8/sluice-agent.8", "/usr/share/doc/sluice/policy.md")
	has("rpm config files", run("", "rpm", "-qp", "--configfiles", rpm), "/etc/sluice/policy.yaml")
	scripts := run("", "rpm", "-qp", "--scripts", rpm)
	checkScripts("rpm", scripts)
	if !strings.Contains(scripts, "try-restart sluice-agent") || !strings.Contains(scripts, "preuninstall") {
		t.Errorf("rpm scripts:\n%s", scripts)
	}

	// apk: OpenRC's script, apk's version grammar.
	apk := unpack(pkgs["apk"], "--warning=no-unknown-keyword", "--ignore-zeros")
	info, err := os.ReadFile(filepath.Join(apk, ".PKGINFO"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pkgver = " + apkv + "\n", "arch = x86_64\n", "depend = iproute2\n"} {
		if !strings.Contains(string(info), want) {
			t.Errorf("apk .PKGINFO lacks %q:\n%s", want, info)
		}
	}
	for _, f := range []string{"usr/bin/sluice", "etc/init.d/sluice-agent", "etc/sluice/policy.yaml", "usr/share/man/man1/sluice.1"} {
		if _, err := os.Stat(filepath.Join(apk, f)); err != nil {
			t.Errorf("apk: %v", err)
		}
	}
	var all string
	for _, s := range []string{".post-install", ".pre-deinstall", ".post-deinstall"} {
		b, err := os.ReadFile(filepath.Join(apk, s))
		if err != nil {
			t.Errorf("apk: %v", err)
		}
		all += string(b)
		run("", "sh", "-n", filepath.Join(apk, s))
	}
	if strings.Contains(all, "systemctl") {
		t.Errorf("apk scripts speak to systemd:\n%s", all)
	}
	checkScripts("apk", all)
	run("", "sh", "-n", filepath.Join(apk, "etc/init.d/sluice-agent"))
	if v := run("", filepath.Join(apk, "usr/bin/sluice"), "version"); !strings.Contains(v, version) {
		t.Errorf("the packaged binary says %q, want %s", v, version)
	}

	// ipk: procd's script, a router's dependencies, no pages on flash.
	ipk := unpack(pkgs["ipk"])
	ctl := unpack(filepath.Join(ipk, "control.tar.gz"))
	control, _ := os.ReadFile(filepath.Join(ctl, "control"))
	for _, want := range []string{"Version: " + debv + "\n", "Architecture: x86_64\n", "Depends: kmod-sched-core, kmod-ifb\n"} {
		if !strings.Contains(string(control), want) {
			t.Errorf("ipk control lacks %q:\n%s", want, control)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ctl, "conffiles")); string(b) != "/etc/sluice/policy.yaml\n" {
		t.Errorf("ipk conffiles: %q", b)
	}
	all = ""
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		b, err := os.ReadFile(filepath.Join(ctl, s))
		if err != nil {
			t.Errorf("ipk: %v", err)
		}
		all += string(b)
		run("", "sh", "-n", filepath.Join(ctl, s))
	}
	if strings.Contains(all, "systemctl") {
		t.Errorf("ipk scripts speak to systemd:\n%s", all)
	}
	checkScripts("ipk", all)
	data := run("", "tar", "-t", "-z", "-f", filepath.Join(ipk, "data.tar.gz"))
	has("ipk", data, "./usr/bin/sluice", "./etc/init.d/sluice-agent", "./etc/sluice/policy.yaml")
	if strings.Contains(data, "usr/share") {
		t.Errorf("ipk carries pages or documents to a router's flash:\n%s", data)
	}
}

// make image writes the same image twice (the same digest), and the
// DaemonSet's manifest beside it names that image by digest.
func TestMakeImageIsReproducible(t *testing.T) {
	testutil.Slow(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	build := func() string {
		t.Helper()
		out, err := exec.Command("make", "-C", "..", "image", "IMAGE_ARCHES=amd64").CombinedOutput()
		if err != nil {
			t.Fatalf("make image: %v\n%s", err, out)
		}
		d, err := os.ReadFile("../out/image/digest")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(d))
	}
	d1, d2 := build(), build()
	if d1 != d2 || !strings.HasPrefix(d1, "sha256:") {
		t.Fatalf("two builds: %s and %s", d1, d2)
	}
	m, err := os.ReadFile("../out/image/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\s+image: registry\.example/sluice@` + regexp.QuoteMeta(d1) + `$`).Match(m) {
		t.Errorf("out/image/sluice.yaml does not name the image by its digest %s", d1)
	}
}
