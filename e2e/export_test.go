package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var statCounters = regexp.MustCompile(`direct_packets_stat \d+`)

// dump is what tc(8) shows of every device's qdiscs, classes and filters
// (root block, every class's block, ingress hook).
func dump(t *testing.T, ns string, devs []string) string {
	t.Helper()
	var b strings.Builder
	for _, d := range devs {
		b.WriteString(tcShow(t, ns, "-d", "qdisc", "show", "dev", d))
		cls := tcShow(t, ns, "-d", "class", "show", "dev", d)
		b.WriteString(cls)
		b.WriteString(tcShow(t, ns, "-d", "filter", "show", "dev", d))
		b.WriteString(tcShow(t, ns, "-d", "filter", "show", "dev", d, "ingress"))
		for _, m := range regexp.MustCompile(`class htb (\S+) `).FindAllStringSubmatch(cls, -1) {
			b.WriteString(tcShow(t, ns, "-d", "filter", "show", "dev", d, "parent", m[1]))
		}
	}
	return statCounters.ReplaceAllString(b.String(), "")
}

// The export, run by the real tc on a fresh device, builds exactly what
// apply builds: both kernels' dumps are identical.
func TestExportReproducesApply(t *testing.T) {
	for _, ex := range []struct {
		file string
		devs []string
	}{
		{"../examples/office.yaml", []string{"eth0", "eth1", "ifb-eth0"}},
		{"../examples/wondershaper.yaml", []string{"eth0", "ifb-eth0"}},
		{"../examples/ipv6.yaml", []string{"eth0"}},
	} {
		t.Run(filepath.Base(ex.file), func(t *testing.T) {
			var real []string
			for _, d := range ex.devs {
				if !strings.HasPrefix(d, "ifb-") {
					real = append(real, d)
				}
			}
			applied, exported := devNS(t, real...), devNS(t, real...)
			must(t, "--netns", applied, "apply", "-q", ex.file)

			for _, format := range []string{"sh", "tc"} {
				script := must(t, "--netns", applied, "export", ex.file, "--format", format)
				if format == "tc" {
					if !strings.Contains(script, "tc -batch") || strings.Contains(script, "\nqdisc") == false {
						t.Errorf("tc format:\n%.500s", script)
					}
					continue
				}
				path := filepath.Join(t.TempDir(), "export.sh")
				os.WriteFile(path, []byte(script), 0o755)
				out, err := exec.Command("ip", "netns", "exec", exported, "sh", path).CombinedOutput()
				if err != nil || len(out) > 0 {
					// tc prints the kernel's warnings (quantum too big or
					// small) on stderr: there must be none.
					t.Fatalf("running the export: %v\n%s", err, out)
				}
			}
			a, b := dump(t, applied, ex.devs), dump(t, exported, ex.devs)
			if a != b {
				t.Fatalf("kernels differ:\n--- apply\n%s\n--- export\n%s", a, b)
			}
			if !strings.Contains(a, "class htb") || !strings.Contains(a, "filter") {
				t.Fatalf("empty dump:\n%s", a)
			}
		})
	}
}
