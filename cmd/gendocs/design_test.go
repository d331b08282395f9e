package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// docs/design.md's package map names every package of the module, and
// nothing that is gone: the map a new engineer reads first stays true.
func TestDesignMapsEveryPackage(t *testing.T) {
	b, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## Package map")
	if start < 0 {
		t.Fatal("docs/design.md has no Package map section")
	}
	section := doc[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	mapped := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| ([^|]+) \\|").FindAllStringSubmatch(section, -1) {
		for _, name := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(m[1], -1) {
			mapped[name[1]] = true
		}
	}
	have := map[string]bool{}
	root := "../.."
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			// Not packages of this module: other modules, data, hidden.
			base := d.Name()
			if rel != "." && (strings.HasPrefix(base, ".") || base == "testdata" || base == "out" || base == "node_modules") {
				return filepath.SkipDir
			}
			if rel != "." {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && rel != filepath.Base(rel) {
			have[filepath.ToSlash(filepath.Dir(rel))] = true
		}
		return nil
	})
	var missing, gone []string
	for p := range have {
		if !mapped[p] {
			missing = append(missing, p)
		}
	}
	for p := range mapped {
		if !have[p] {
			gone = append(gone, p)
		}
	}
	sort.Strings(missing)
	sort.Strings(gone)
	if len(missing) > 0 || len(gone) > 0 {
		t.Errorf("docs/design.md's package map: missing %v, listed but gone %v", missing, gone)
	}
}
