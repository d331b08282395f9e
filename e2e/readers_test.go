package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"sluice/testutil"
)

// show, plan and munin work for a user without root where the kernel
// lets anyone read: tc objects through netlink, and sluice's records
// where the readers' group may read them (SLUICE_GROUP here: nogroup,
// which nobody has). BPF maps need root or CAP_BPF: show says what it
// left out, plan says why it cannot plan that tree. Nothing is written.
// Without the group the records stay root's and the reader is told how
// to get access.
func TestReadWithoutRoot(t *testing.T) {
	testutil.RequireRoot(t)
	light(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	// The binary, the policies and the records' base where nobody may
	// enter (as /run is).
	dir, nb := nobodysCopy(t)
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o755)
	p := testutil.NewPair(t)
	// write writes a policy of rate for the pair's device, with a BPF
	// classifier where bpf is set.
	write := func(name, rate string, bpf bool) string {
		classifier := ""
		if bpf {
			classifier = "      classifier: bpf\n"
		}
		f := filepath.Join(dir, name)
		os.WriteFile(f, []byte(policyFor(p.DevA, `    egress:
      rate: `+rate+`
`+classifier+`      default: b
      classes:
        - {name: a, rate: 1mbit, match: [{proto: udp, dport: 9001}]}
        - {name: b, rate: 1mbit}
`)), 0o644)
		return f
	}
	u32, changed, withBPF := write("u32.yaml", "10mbit", false), write("changed.yaml", "12mbit", false), write("bpf.yaml", "10mbit", true)
	asRoot := func(group string, args ...string) {
		t.Helper()
		if r := runSluice(t, nb, []string{"SLUICE_STATE_DIR=" + state, "SLUICE_GROUP=" + group}, append([]string{"--netns", p.A}, args...)...); r.code != 0 {
			t.Fatalf("%v as root: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	// asNobody runs sluice in the pair's namespace as uid and gid 65534.
	asNobody := func(group string, args ...string) result {
		t.Helper()
		cmd := exec.Command("ip", append([]string{"netns", "exec", p.A, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
			"env", "SLUICE_STATE_DIR=" + state, "SLUICE_GROUP=" + group, nb}, args...)...)
		cmd.Dir = dir
		return runCmd(t, cmd)
	}
	files := func() []string {
		var out []string
		filepath.WalkDir(state, func(path string, d os.DirEntry, err error) error {
			if err == nil {
				fi, _ := d.Info()
				out = append(out, path+" "+fi.ModTime().String())
			}
			return nil
		})
		return out
	}

	asRoot("nogroup", "apply", u32)
	// The records are the group's to read, never to write.
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Join(state, "netns", p.A), os.ModeDir | 0o750}, {filepath.Join(state, "netns", p.A, "state.json"), 0o640}} {
		var st syscall.Stat_t
		fi, err := os.Stat(f.path)
		if err != nil || syscall.Stat(f.path, &st) != nil || fi.Mode() != f.mode || st.Gid != 65534 || st.Uid != 0 {
			t.Errorf("%s: %v, uid %d gid %d (%v); want %v, root's, group nogroup's", f.path, fi.Mode(), st.Uid, st.Gid, err, f.mode)
		}
	}
	before := files()
	if r := asNobody("nogroup", "show", "--interval", "0"); r.code != 0 || !regexp.MustCompile(`(?m)^\s+a\s+1:\d+\s+1mbit\s+10mbit`).MatchString(r.stdout) {
		t.Errorf("show as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := asNobody("nogroup", "plan", u32); r.code != 0 || !strings.Contains(r.stdout, "no changes") {
		t.Errorf("plan as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := asNobody("nogroup", "plan", changed); r.code != 0 || !strings.Contains(r.stdout, "rate 10mbit -> 12mbit") {
		t.Errorf("plan of a change as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := asNobody("nogroup", "munin"); r.code != 0 || !strings.Contains(r.stdout, "c_a.value 0") {
		t.Errorf("munin as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if after := files(); !slices.Equal(before, after) {
		t.Errorf("the readers wrote to the records:\nbefore %v\nafter  %v", before, after)
	}
	if out := must(t, "--netns", p.A, "show", "--local", "--interval", "0"); strings.Contains(out, "12mbit") {
		t.Errorf("a reader's plan changed the kernel:\n%s", out)
	}

	// A BPF classifier: show leaves its counters out and says so; plan
	// cannot read the program and says why.
	asRoot("nogroup", "apply", withBPF)
	if r := asNobody("nogroup", "show", "--interval", "0"); r.code != 0 || !strings.Contains(r.stdout, "not read: sluice's BPF program and maps") || !regexp.MustCompile(`(?m)^\s+b\s+1:\d+`).MatchString(r.stdout) {
		t.Errorf("show of a bpf tree as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := asNobody("nogroup", "plan", withBPF); r.code != 1 || !strings.Contains(r.stderr, "not its BPF program") {
		t.Errorf("plan of a bpf tree as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Without the readers' group, records made from then on are root's:
	// the reader is told who may read them.
	asRoot("nogroup", "reset", p.DevA)
	os.RemoveAll(filepath.Join(state, "netns"))
	asRoot("no-such-group-sluice", "apply", u32)
	if r := asNobody("no-such-group-sluice", "show", "--interval", "0"); r.code != 1 || !strings.Contains(r.stderr, "readable by root and by the members of the group no-such-group-sluice") {
		t.Errorf("show of root's records as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
