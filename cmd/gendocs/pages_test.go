package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A table becomes a definition list: the first cell the term, the rest
// its definition (after their headings where there are more than two
// columns); a | in backquotes stays in its cell.
func TestTablesToLists(t *testing.T) {
	in := "before\n\n| key | meaning |\n|---|---|\n| `a` | one `x|y` two |\n| b | three |\n\nafter\n\n| k | v | w |\n| --- | --- | --- |\n| c | 1 | 2 |\n"
	want := "before\n\n`a`\n: one `x|y` two\n\nb\n: three\n\n\nafter\n\nc\n: v: 1; w: 2\n\n"
	if got := tablesToLists(in); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}

// The pages gendocs writes: sluice(1) with the sections --help lacks,
// sluice-agent in section 8 and named so everywhere, sluice-policy(5)
// from docs/policy.md; all render without a warning where groff is.
func TestPages(t *testing.T) {
	dir := t.TempDir()
	if err := write(dir, "../../docs"); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, "man", p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	root := read("man1/sluice.1")
	for _, s := range []string{".SH EXAMPLE", ".SH EXIT STATUS", ".SH ENVIRONMENT", ".SH FILES", "sluice-agent(8)"} {
		if !strings.Contains(root, s) {
			t.Errorf("sluice.1 lacks %q", s)
		}
	}
	if strings.Contains(root, "PLACEHOLDER") || strings.Count(root, ".SH SEE ALSO") != 1 {
		t.Errorf("sluice.1's sections were not merged:\n%s", root)
	}
	if _, err := os.Stat(filepath.Join(dir, "man", "man1", "sluice-agent.1")); err == nil {
		t.Error("man1/sluice-agent.1 is still there")
	}
	if p := read("man8/sluice-agent.8"); !strings.Contains(p, `"8"`) || !strings.Contains(p, ".SH SIGNALS") {
		t.Errorf("sluice-agent.8:\n%.300s", p)
	}
	pol := read("man5/sluice-policy.5")
	if !strings.Contains(pol, ".SH Classes") || strings.Contains(pol, ".TS") || strings.Contains(pol, "](") {
		t.Errorf("sluice-policy.5 is not docs/policy.md as a page (sections, no tables, no markdown links)")
	}
	groff, err := exec.LookPath("groff")
	if err != nil {
		t.Skip("no groff to render the pages")
	}
	pages, _ := filepath.Glob(filepath.Join(dir, "man", "man*", "*"))
	for _, p := range pages {
		if out, err := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z", p).CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("groff %s: %v\n%s", filepath.Base(p), err, out)
		}
	}
}
