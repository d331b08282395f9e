package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// scripts/version.sh, which stamps every build, on a tree's life: no
// tag, a release, changes on it, commits after it, a pre-release tag
// (not a release); and the forms sort as releases must, in dpkg's order
// (which RPM, apk and opkg share) and by semantic versioning's rules.
func TestVersionScript(t *testing.T) {
	script, dir, git := scratchRepo(t)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(script, append(args, dir)...).CombinedOutput()
		if err != nil {
			t.Fatalf("version.sh %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	commit := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			f := filepath.Join(dir, "f")
			b, _ := os.ReadFile(f)
			os.WriteFile(f, append(b, 'x'), 0o644)
			git("add", "f")
			git("commit", "-q", "-m", "c")
		}
	}
	if v := run(); v != "v0.0.0-dev" {
		t.Errorf("outside git: %q", v)
	}
	git("init", "-q")
	commit(2)
	head := func() string { return git("rev-parse", "--short=12", "HEAD") }
	semver := regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-dev\.(0|[1-9][0-9]*))?(\+g[0-9a-f]{12}(\.dirty)?)?$`)
	var debs []string
	for _, step := range []struct {
		name, want, deb, apk string
		do                   func()
	}{
		{"no release yet", "v0.0.0-dev.2+g@", "0.0.0~dev.2+g@", "0.0.0_pre2", func() {}},
		{"a release", "v0.1.0", "0.1.0", "0.1.0", func() { git("tag", "-a", "-m", "r", "v0.1.0") }},
		{"changes on it", "v0.1.1-dev.0+g@.dirty", "0.1.1~dev.0+g@.dirty", "0.1.1_pre0", func() { os.WriteFile(filepath.Join(dir, "f"), []byte("changed"), 0o644) }},
		{"a commit after it", "v0.1.1-dev.1+g@", "0.1.1~dev.1+g@", "0.1.1_pre1", func() { git("add", "f"); git("commit", "-q", "-m", "c") }},
		{"a pre-release tag is not a release", "v0.1.1-dev.3+g@", "0.1.1~dev.3+g@", "0.1.1_pre3", func() { commit(2); git("tag", "v0.2.0-rc1") }},
		{"the next release", "v0.1.1", "0.1.1", "0.1.1", func() { git("tag", "v0.1.1") }},
		{"after it", "v0.1.2-dev.12+g@", "0.1.2~dev.12+g@", "0.1.2_pre12", func() { commit(12) }},
	} {
		step.do()
		want := strings.ReplaceAll(step.want, "@", head())
		if v := run(); v != want {
			t.Errorf("%s: %q, want %q", step.name, v, want)
		}
		if !semver.MatchString(want) {
			t.Errorf("%s: %q is not a version of the form semver orders", step.name, want)
		}
		deb := strings.ReplaceAll(step.deb, "@", head())
		if v := run("--deb"); v != deb {
			t.Errorf("%s: --deb %q, want %q", step.name, v, deb)
		}
		// apk's grammar: numbers, then its own suffixes (_pre sorts
		// before the release it precedes).
		if v := run("--apk"); v != step.apk || !apkVersion.MatchString(v) {
			t.Errorf("%s: --apk %q, want %q", step.name, v, step.apk)
		}
		if v := run("--apk", "--from", want); v != step.apk {
			t.Errorf("%s: --apk --from %s: %q, want %q", step.name, want, v, step.apk)
		}
		if v := run("--deb", "--from", want); v != deb {
			t.Errorf("%s: --deb --from %s: %q, want %q", step.name, want, v, deb)
		}
		if step.name != "changes on it" {
			debs = append(debs, deb)
		}
	}
	// Each build sorts after the one before it.
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("no dpkg to order the Debian versions")
	}
	for i := 1; i < len(debs); i++ {
		if err := exec.Command("dpkg", "--compare-versions", debs[i-1], "lt", debs[i]).Run(); err != nil {
			t.Errorf("dpkg does not order %s before %s", debs[i-1], debs[i])
		}
	}
}

// A clone without tags (tags do not travel with every push): the
// release is the commit that added the changelog's newest release
// section, and the builds after it are ordered after it; a tag, where
// there is one, wins.
func TestVersionWithoutTags(t *testing.T) {
	script, dir, git := scratchRepo(t)
	changelog := func(text string) {
		t.Helper()
		os.MkdirAll(filepath.Join(dir, "docs"), 0o755)
		if err := os.WriteFile(filepath.Join(dir, "docs", "changelog.md"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		git("add", "-A")
		git("commit", "-q", "-m", "c")
	}
	version := func() string {
		t.Helper()
		out, err := exec.Command(script, dir).CombinedOutput()
		if err != nil {
			t.Fatalf("version.sh: %v\n%s", err, out)
		}
		return strings.ReplaceAll(strings.TrimSpace(string(out)), git("rev-parse", "--short=12", "HEAD"), "@")
	}
	git("init", "-q")
	changelog("# Changes\n\n## Unreleased\n\n- a\n")
	if v := version(); v != "v0.0.0-dev.1+g@" {
		t.Errorf("no release section: %q", v)
	}
	changelog("# Changes\n\n## Unreleased\n\n## v0.3.0 (2026-12-06)\n\n- a\n")
	if v := version(); v != "v0.3.0" {
		t.Errorf("on the commit that added v0.3.0's section: %q", v)
	}
	changelog("# Changes\n\n## Unreleased\n\n- b\n\n## v0.3.0 (2026-12-06)\n\n- a\n")
	changelog("# Changes\n\n## Unreleased\n\n- b\n- c\n\n## v0.3.0 (2026-12-06)\n\n- a\n")
	if v := version(); v != "v0.3.1-dev.2+g@" {
		t.Errorf("two commits after it: %q, want v0.3.1-dev.2+g@", v)
	}
	// A shallow clone's one commit seems to add the section: it is no
	// release.
	shallow := filepath.Join(t.TempDir(), "shallow")
	if out, err := exec.Command("git", "clone", "-q", "--depth", "1", "file://"+dir, shallow).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	if out, err := exec.Command(script, shallow).CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "v0.0.0-dev.1+g") {
		t.Errorf("a shallow clone: %q (%v), want v0.0.0-dev.1+g...", out, err)
	}
	git("tag", "v0.2.0")
	if v := version(); v != "v0.2.0" {
		t.Errorf("a tag wins over the changelog: %q", v)
	}
}

// scratchRepo is version.sh's path, an empty directory for a scratch
// repository, and git run in it (with an identity, unsigned).
func scratchRepo(t *testing.T) (script, dir string, git func(args ...string) string) {
	t.Helper()
	script, err := filepath.Abs("../scripts/version.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	git = func(args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	return script, dir, git
}

var apkVersion = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*(_(alpha|beta|pre|rc|cvs|svn|git|hg|p)[0-9]*)*$`)

// A stamped build says what was stamped.
func TestStamped(t *testing.T) {
	defer func(s, c string) { stamped, commit = s, c }(stamped, commit)
	stamped, commit = "v0.3.1-dev.4+g0123456789ab", "0123456789ab"
	if String() != stamped || Commit() != commit {
		t.Errorf("String %q, Commit %q", String(), Commit())
	}
	stamped, commit = "", ""
	if s := String(); !strings.HasPrefix(s, "v") {
		t.Errorf("unstamped: %q", s)
	}
}

// Every release tag of the repository has its section in
// docs/changelog.md, and the changelog names no release that has no tag.
func TestChangelogHasEveryRelease(t *testing.T) {
	b, err := os.ReadFile("../docs/changelog.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (v[0-9]+\.[0-9]+\.[0-9]+) \(\d{4}-\d{2}-\d{2}\)$`).FindAllStringSubmatch(string(b), -1) {
		sections[m[1]] = true
	}
	if !strings.Contains(string(b), "\n## Unreleased\n") {
		t.Error("docs/changelog.md has no Unreleased section for what comes next")
	}
	out, err := exec.Command("git", "-C", "..", "tag", "--list", "v*").Output()
	if err != nil {
		t.Skipf("no git repository to read tags from: %v", err)
	}
	tags := map[string]bool{}
	for _, tag := range strings.Fields(string(out)) {
		if regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(tag) {
			tags[tag] = true
			if !sections[tag] {
				t.Errorf("release %s has no section in docs/changelog.md (## %s (YYYY-MM-DD))", tag, tag)
			}
		}
	}
	// A section for a release not tagged is a release not cut; in a clone
	// without tags (a shallow one) there is nothing to compare.
	if len(tags) > 0 {
		for s := range sections {
			if !tags[s] {
				t.Errorf("docs/changelog.md has a section for %s, which is not tagged", s)
			}
		}
	}
}
