// Command gendocs writes sluice's man pages and shell completions, made
// from its commands and docs/policy.md, under DIR: man/man1/*.1,
// man5/sluice-policy.5, man8/sluice-agent.8, bash-completion/completions/sluice,
// zsh/site-functions/_sluice and fish/vendor_completions.d/sluice.fish
// (`make install`, `make deb`). Their date is SOURCE_DATE_EPOCH's where
// it is set, so that a package built twice from one commit is the same.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra/doc"

	"sluice/cli"
)

func main() {
	if len(os.Args) != 2 && len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gendocs DIR [DOCS]  (DOCS: the docs directory, ./docs by default)")
		os.Exit(2)
	}
	docs := "docs"
	if len(os.Args) == 3 {
		docs = os.Args[2]
	}
	if err := write(os.Args[1], docs); err != nil {
		fmt.Fprintln(os.Stderr, "gendocs:", err)
		os.Exit(1)
	}
}

func write(dir, docs string) error {
	root := cli.New()
	root.DisableAutoGenTag = true
	date := time.Now()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		date = time.Unix(n, 0).UTC()
	}
	man := filepath.Join(dir, "man", "man1")
	if err := os.MkdirAll(man, 0o755); err != nil {
		return err
	}
	hdr := &doc.GenManHeader{Section: "1", Date: &date, Source: "sluice", Manual: "sluice manual"}
	if err := doc.GenManTree(root, hdr, man); err != nil {
		return err
	}
	if err := insertSections(filepath.Join(man, "sluice.1"), markdown(rootSections)); err != nil {
		return err
	}
	if err := insertSections(filepath.Join(man, "sluice-agent.1"), markdown(agentSections)); err != nil {
		return err
	}
	if err := movePage(dir, "sluice-agent", "8"); err != nil {
		return err
	}
	src, err := os.ReadFile(filepath.Join(docs, "policy.md"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "man", "man5"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "man", "man5", "sluice-policy.5"), policyPage(src, date.Format("Jan 2006")), 0o644); err != nil {
		return err
	}
	for _, c := range []struct {
		path string
		gen  func(f *os.File) error
	}{
		{"bash-completion/completions/sluice", func(f *os.File) error { return root.GenBashCompletionV2(f, true) }},
		{"zsh/site-functions/_sluice", func(f *os.File) error { return root.GenZshCompletion(f) }},
		{"fish/vendor_completions.d/sluice.fish", func(f *os.File) error { return root.GenFishCompletion(f, true) }},
	} {
		p := filepath.Join(dir, c.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		err = c.gen(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}
