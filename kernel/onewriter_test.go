package kernel_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// writers are the calls that change the kernel: tc.Conn's writes and
// the classifier program's map writes (bpf.Program).
var writers = map[string]bool{
	"QdiscAdd": true, "QdiscChange": true, "QdiscDel": true, "ClassAdd": true, "ClassChange": true, "ClassDel": true,
	"FilterAdd": true, "FilterDel": true, "LinkAdd": true, "LinkUp": true, "LinkDel": true,
	"SwapHosts": true, "SetTarget": true,
}

// mayWrite are the places allowed to call them, and why.
var mayWrite = map[string]string{
	"kernel": "the executor: every change sluice makes",
	"tc":     "where the writes are defined",
	"bpf":    "where the program's writes are defined",
	"lab":    "the lab's own test bed (its namespaces, veths, delay lines), never a policy's objects",
	// The EDT maps benchmark times the agent's hosts edit
	// (engine.PlanHostsEdit) with the program's writes made directly:
	// the host kernel has no fq, so no EDT tree to find the program on.
	"bench/apply/edtmaps.go": "the EDT maps benchmark's raw program writes",
}

// One writer: outside the executor, no production code writes tc
// objects or BPF maps (a method of that name called anywhere else
// fails this test, whatever its receiver: rename rather than excuse).
func TestOnlyTheExecutorWrites(t *testing.T) {
	root := ".."
	fset := token.NewFileSet()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "out" || rel == "e2e" || rel == "testutil" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		if _, ok := mayWrite[rel]; ok {
			return nil
		}
		if _, ok := mayWrite[filepath.Dir(rel)]; ok {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && writers[sel.Sel.Name] {
				found = append(found, fset.Position(call.Pos()).String()+": "+sel.Sel.Name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Errorf("kernel writes outside the executor (engine sessions patch through kernel.ApplyPatch):\n%s", strings.Join(found, "\n"))
	}
}
