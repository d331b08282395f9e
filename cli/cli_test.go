package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// sluice runs the command line in-process and returns its exit code,
// standard output and standard error.
func sluice(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Bad input, whatever the command, exits 2 with a message that says
// what is wrong and where, prints nothing on standard output, and
// leaves sluice's records directory as it was: nothing was changed.
func TestBadInputSaysWhatAndWhereAndChangesNothing(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "run")
	t.Setenv("SLUICE_STATE_DIR", state)
	good := writeFile(t, dir, "good.yaml", "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n")
	typo := writeFile(t, dir, "typo.yaml", "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbitt\n")
	unknown := writeFile(t, dir, "unknown.yaml", "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n      burts: 10k\n")
	over := writeFile(t, dir, "over.yaml", `interfaces:
  - name: eth0
    egress:
      rate: 10mbit
      default: b
      classes:
        - {name: a, rate: 8mbit}
        - {name: b, rate: 4mbit}
`)
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	for _, tc := range []struct {
		name     string
		args     []string
		want     []string // every one in the message
		needRoot bool     // the command checks privileges before its input
	}{
		{"a unit misspelt, at its line and column", []string{"validate", typo},
			[]string{typo + ":4:13:", `bad rate "10mbitt"`, "did you mean 10mbit?"}, false},
		{"an unknown key, at its line", []string{"validate", unknown}, []string{unknown + ":5:", "burts"}, false},
		{"rates over the parent's", []string{"validate", over}, []string{over + ":", "12mbit", "10mbit"}, false},
		{"a missing policy", []string{"validate", filepath.Join(dir, "none.yaml")}, []string{"none.yaml", "no such file"}, false},
		{"a FIFO as the policy", []string{"validate", fifo}, []string{"fifo.yaml", "not a regular file (a FIFO)"}, false},
		{"no policy", []string{"validate"}, []string{"accepts 1 arg(s), received 0"}, false},
		{"an unknown command", []string{"bogus"}, []string{`unknown command "bogus"`}, false},
		{"an unknown flag names the help", []string{"validate", "--frobnicate", good}, []string{"unknown flag: --frobnicate", "sluice validate --help"}, false},
		{"export's bad --kernel", []string{"export", "--kernel", "nope", good}, []string{`--kernel "nope": expected local or full`}, false},
		{"export's bad policy", []string{"export", "--kernel", "full", typo}, []string{typo + ":4:13:"}, false},
		{"import of an unknown format", []string{"import", "nope", good}, []string{`unknown format "nope"`, "fireqos"}, false},
		{"import tc without its device", []string{"import", "tc"}, []string{"want one SOURCE, the device"}, false},
		{"lab conformance's bad backend", []string{"lab", "conformance", "--backend", "xyz", good}, []string{`--backend "xyz": want htb or edt`}, false},
		{"lab run of an unknown scenario", []string{"lab", "run", "nosuch"}, []string{`no scenario "nosuch"`, "fair-share"}, false},
		{"plan's empty --netns", []string{"plan", "--netns=", good}, []string{"--netns: network namespace name is empty"}, true},
		{"apply's --netns with a slash", []string{"apply", "--netns", "a/b", good}, []string{`"a/b": must not contain '/'`}, true},
		{"reset's --netns climbing out", []string{"reset", "--netns", "../x"}, []string{`"../x": must not contain '/'`}, true},
		{"apply of a misspelt policy", []string{"apply", typo}, []string{typo + ":4:13:"}, true},
		{"plan of a misspelt policy", []string{"plan", typo}, []string{typo + ":4:13:"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needRoot && !root {
				t.Skip("the command checks privileges before reading its input")
			}
			code, out, errs := sluice(t, tc.args...)
			if code != ExitBadInput {
				t.Errorf("exit %d; want %d (bad input)\n%s", code, ExitBadInput, errs)
			}
			if out != "" {
				t.Errorf("standard output on bad input: %q", out)
			}
			if !strings.HasPrefix(errs, "sluice: ") {
				t.Errorf("message %q does not start with sluice:", errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("message %q does not say %q", errs, w)
				}
			}
			if _, err := os.Lstat(state); !os.IsNotExist(err) {
				t.Errorf("bad input made the records directory %s (%v)", state, err)
			}
		})
	}
}

// A good policy validates with exit 0 and says so; version prints the
// version. The counterpart of the table above: the same helper reads a
// success as one.
func TestGoodInputSucceeds(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"validate", []string{"validate", good}, "good.yaml"},
		{"version", []string{"version"}, "sluice"},
		{"export for any kernel", []string{"export", "--kernel", "full", "--fresh", good}, "htb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := sluice(t, tc.args...)
			if code != 0 || !strings.Contains(out+errs, tc.want) {
				t.Fatalf("exit %d, output %q %q; want 0 and %q", code, out, errs, tc.want)
			}
		})
	}
}

func mkfifo(path string) error { return syscall.Mkfifo(path, 0o600) }
