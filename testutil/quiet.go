package testutil

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// BesideEnv names the pid file of the work `make test` runs beside the
// host suite (scripts/beside.sh: the API server's build, the race
// builds, fuzzing), which the Makefile exports to the suite.
const BesideEnv = "SLUICE_BESIDE"

var quiet struct {
	sync.Mutex
	n    int // tests measuring now
	pgid int // the chain stopped, 0: none
}

// Quiet stops the work beside the suite while t measures, and lets it go
// on when t (and every other test that asked) ends. That work runs at the
// lowest priority, but it still takes whatever the CPUs leave, and
// measurements held to a tight reference (a controller that reads 5 ms
// of queueing delay, shares within a few percent of the ideal) have
// failed beside it. Outside `make test` it does nothing.
func Quiet(t testing.TB) {
	t.Helper()
	file := os.Getenv(BesideEnv)
	if file == "" {
		return
	}
	quiet.Lock()
	defer quiet.Unlock()
	if quiet.n == 0 {
		pgid := besideGroup(file)
		if pgid == 0 || syscall.Kill(-pgid, syscall.SIGSTOP) != nil {
			return // none, or finished
		}
		quiet.pgid = pgid
		t.Logf("quiet: the work beside the suite (process group %d) waits while this test measures", pgid)
	}
	quiet.n++
	t.Cleanup(func() {
		quiet.Lock()
		defer quiet.Unlock()
		if quiet.n--; quiet.n == 0 && quiet.pgid != 0 {
			syscall.Kill(-quiet.pgid, syscall.SIGCONT)
			quiet.pgid = 0
		}
	})
}

// besideGroup is the process group of the chain file names, or 0 where
// there is none: the pid must still be the chain's (beside.sh run), never
// another process that reused it.
func besideGroup(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return 0
	}
	args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
	if len(args) < 3 || !strings.HasSuffix(args[len(args)-2], "beside.sh") || args[len(args)-1] != "run" {
		return 0
	}
	if pg, err := syscall.Getpgid(pid); err != nil || pg != pid {
		return 0
	}
	return pid
}
