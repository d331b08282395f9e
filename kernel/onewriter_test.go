package kernel_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// One writer, by imports. A tc.Conn, a bpf.Program and a kernel.Kernel
// only read; their writes are a tc.Writer's, a bpf.Writer's and a
// kernel.Executor's, which only a writecap.Token gets. So a package can
// change the kernel only by importing one of writeImports: the token's
// package, or a library or system interface that writes on its own.
// Each package that imports one is named in mayImport with its reason,
// and a name there that no longer imports it fails too, so the list is
// what the code does.
var writeImports = map[string]string{
	"sluice/internal/writecap":          "the token that gets tc.Writer, bpf.Writer and kernel.Executor",
	"github.com/vishvananda/netlink":    "netlink's handle writes as it reads (QdiscReplace, ClassReplace, FilterReplace, LinkSet*)",
	"github.com/vishvananda/netlink/nl": "raw rtnetlink requests",
	"github.com/cilium/ebpf":            "maps' Update, Put and Delete; programs and maps opened by id",
	"github.com/cilium/ebpf/link":       "programs attached to hooks",
	"os/exec":                           "tc(8), ip(8), or any tool that writes",
	"golang.org/x/sys/unix":             "raw netlink and bpf(2) system calls",
	"syscall":                           "raw netlink and bpf(2) system calls",
}

// mayImport are the packages (by directory) allowed each of
// writeImports, and why. Tests (_test.go) are not checked: they stand
// in for other tools, and inject faults.
var mayImport = map[string]map[string]string{
	"tc":  {"sluice/internal/writecap": "defines tc.Writer", "github.com/vishvananda/netlink": "its links", "github.com/vishvananda/netlink/nl": "its tc codec", "golang.org/x/sys/unix": "its netlink sockets", "syscall": "netlink messages and errnos"},
	"bpf": {"sluice/internal/writecap": "defines bpf.Writer", "github.com/cilium/ebpf": "loads and reads the classifier"},
	"kernel": {"sluice/internal/writecap": "the executor", "syscall": "fault injection's kill (-tags faults)",
		"github.com/vishvananda/netlink": "ProbeScratch's veth, in a namespace of its own",
		"github.com/cilium/ebpf":         "ProbeScratch's program", "github.com/cilium/ebpf/link": "ProbeScratch's attach"},
	"engine": {"sluice/internal/writecap": "drives the executor: a pass's Execute, limits' ApplyPatch, hosts' WriteHosts, reset", "golang.org/x/sys/unix": "notification types, to tell its own writes apart"},
	"lab": {"sluice/internal/writecap": "the test bed's own modem and delay lines, never a policy's objects", "github.com/vishvananda/netlink": "the test bed's links and addresses",
		"os/exec": "traffic generators and the bed's tools", "golang.org/x/sys/unix": "the bed's taps, raw flows and mounts", "syscall": "sockets' errors and raw connections"},
	"bpf/bpftest":             {"sluice/internal/writecap": "tests' and benchmarks' own loaded programs (their test runs, the EDT maps benchmark's writes)"},
	"bench/apply":             {"os/exec": "the tc scripts it compares against"},
	"bench/classify":          {"os/exec": "its bed's ip commands", "golang.org/x/sys/unix": "frames sent on its own veth"},
	"bench/agent":             {"os/exec": "runs the agent it measures", "syscall": "stops it"},
	"bench/edtcpu":            {"os/exec": "its bed's tools"},
	"bench/internal/benchrun": {"os/exec": "runs the benchmarks' tools"},
	"bench/kube":              {"os/exec": "runs the agent and the API server it measures"},
	"bench/probe":             {"os/exec": "ping, to compare", "syscall": "its own CPU time (getrusage)"},
	"bench/rtt":               {"os/exec": "its bed's tools"},
	"bench/utilization":       {"os/exec": "tc scripts and iperf3, to compare"},
	"vmlane":                  {"os/exec": "qemu and the guest's tools"},
	"testutil":                {"os/exec": "the tests' beds (ip, tc as another tool would)", "golang.org/x/sys/unix": "TCP_INFO of the tests' flows", "syscall": "pauses the work beside while a test measures"},
	"agent":                   {"golang.org/x/sys/unix": "its HTTP listener's socket options and the watched files' stat", "syscall": "its listener's raw connection"},
	"cli":                     {"syscall": "signals"},
	"conform":                 {"golang.org/x/sys/unix": "O_NOFOLLOW for its report files"},
	"probe":                   {"golang.org/x/sys/unix": "the prober's ICMP sockets"},
	"records":                 {"syscall": "the lock file's flock and stat"},
	"safefile":                {"golang.org/x/sys/unix": "openat and mkdirat without following links", "syscall": "the same"},
	"stats":                   {"golang.org/x/sys/unix": "the monotonic clock EDT's departure times are on"},
}

// mayNameSysctls are the packages allowed to name a path under
// /proc/sys or /sys, where a write changes the kernel (os.WriteFile
// needs no import of writeImports).
var mayNameSysctls = map[string]string{
	"kernel":   "reads a device's transmit queues",
	"features": "reads what the kernel has (release, default qdisc, congestion controls, BTF)",
	"lab":      "the test bed's forwarding and rp_filter",
	"conform":  "reads the bed's transmit queues",
}

func TestOneWriterByImports(t *testing.T) {
	found, used, err := writeReach("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s (only the executor writes: take a kernel.Reader, or name the package in mayImport with why it may write)", f)
	}
	for pkg, imps := range mayImport {
		for imp := range imps {
			if !used[pkg+" "+imp] {
				t.Errorf("mayImport: %s no longer imports %s: take it off", pkg, imp)
			}
		}
	}
}

// Each way to write the kernel that did not go through the executor,
// in a scratch package: the check names it.
func TestOneWriterByImportsCatchesEachEscape(t *testing.T) {
	for _, tt := range []struct{ name, src, want string }{
		{"bpf.Program.Write", `import ("sluice/bpf"; "sluice/internal/writecap")
func f(p *bpf.Program, c *bpf.Content) error { return p.Writer(writecap.Token{}).Write(c, nil) }`, "sluice/internal/writecap"},
		{"QdiscReplace through netlink's handle", `import "github.com/vishvananda/netlink"
func f(h *netlink.Handle, q netlink.Qdisc) error { return h.QdiscReplace(q) }`, "github.com/vishvananda/netlink"},
		{"LinkSetUp through tc.Writer.Links", `import ("sluice/tc"; "sluice/internal/writecap")
func f(c *tc.Conn) error { return c.Writer(writecap.Token{}).Links().LinkSetUp(nil) }`, "sluice/internal/writecap"},
		{"a map's Update", `import "github.com/cilium/ebpf"
func f(id ebpf.MapID) error { m, _ := ebpf.NewMapFromID(id); return m.Update(uint32(0), uint64(1), ebpf.UpdateAny) }`, "github.com/cilium/ebpf"},
		{"exec of tc", `import "os/exec"
func f() error { return exec.Command("tc", "qdisc", "del", "dev", "eth0", "root").Run() }`, "os/exec"},
		{"a sysctl", `import "os"
func f() error { return os.WriteFile("/proc/sys/net/core/default_qdisc", []byte("pfifo"), 0) }`, "/proc/sys/net/core/default_qdisc"},
		{"a device's sysfs", `import "os"
func f() error { return os.WriteFile("/sys/class/net/eth0/tx_queue_len", []byte("0"), 0) }`, "/sys/class/net/eth0/tx_queue_len"},
		{"the executor's Apply, no journal", `import ("sluice/kernel"; "sluice/internal/writecap")
func f(k *kernel.Kernel, d *kernel.Diff) { k.Executor(writecap.Token{}).Apply(d) }`, "sluice/internal/writecap"},
		{"WriteHosts past the engine", `import ("sluice/kernel"; "sluice/internal/writecap")
func f() { kernel.WriteHosts(writecap.Token{}, "", 0, nil) }`, "sluice/internal/writecap"},
		{"a raw netlink socket", `import "golang.org/x/sys/unix"
func f() (int, error) { return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE) }`, "golang.org/x/sys/unix"},
		{"a raw netlink socket, renamed", `import sc "syscall"
func f() (int, error) { return sc.Socket(sc.AF_NETLINK, sc.SOCK_RAW, 0) }`, "syscall"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			pkg := filepath.Join(dir, "scratch")
			if err := os.Mkdir(pkg, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(pkg, "x.go"), []byte("package scratch\n\n"+tt.src+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			found, _, err := writeReach(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(found) != 1 || !strings.Contains(found[0], tt.want) {
				t.Errorf("found %q, want one naming %s", found, tt.want)
			}
		})
	}
	// What only reads passes: a kernel.Reader and a bpf.View.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(`package scratch
import ("os"; "sluice/kernel")
func f() (uint64, error) { r, err := kernel.OpenReader(""); if err != nil { return 0, err }; defer r.Close(); v, _ := r.OpenHook("eth0", false); _ = v; os.ReadFile("/proc/self/status"); return r.TxBytes("eth0") }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if found, _, err := writeReach(dir); err != nil || len(found) != 0 {
		t.Errorf("a reader: %q, %v", found, err)
	}
}

// writeReach parses the Go files under root (tests, out, testdata and
// hidden directories left out) and returns where a package imports one
// of writeImports or names a /proc/sys or /sys path without leave, and
// the allowances used ("DIR IMPORT").
func writeReach(root string) (found []string, used map[string]bool, err error) {
	used = map[string]bool{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (rel == "out" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			why, writes := writeImports[p]
			if !writes {
				continue
			}
			if _, ok := mayImport[pkg][p]; ok {
				used[pkg+" "+p] = true
				continue
			}
			found = append(found, fmt.Sprintf("%s: package %s imports %s (%s)", fset.Position(imp.Pos()), pkg, p, why))
		}
		if _, ok := mayNameSysctls[pkg]; ok {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, _ := strconv.Unquote(lit.Value)
			if strings.HasPrefix(s, "/proc/sys/") || strings.HasPrefix(s, "/sys/") {
				found = append(found, fmt.Sprintf("%s: package %s names %s, where a write changes the kernel", fset.Position(lit.Pos()), pkg, s))
			}
			return true
		})
		return nil
	})
	sort.Strings(found)
	return found, used, err
}
