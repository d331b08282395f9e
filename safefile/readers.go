package safefile

import (
	"os"
	"os/user"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// ReadersEnv names the group that may read the records, in place of
// ReadersGroup.
const ReadersEnv = "SLUICE_GROUP"

// ReadersGroup is the group whose members may read what sluice keeps in
// its record directories (show, plan and munin without root): the
// packages create it. Where it does not exist the records stay the
// owner's alone, as before. Reading is all it gives: nothing sluice
// keeps is writable by the group, and the directories' owner check
// still refuses any the group could change.
const ReadersGroup = "sluice"

// ReadersName is the readers' group's name: $SLUICE_GROUP, else
// ReadersGroup.
func ReadersName() string {
	if name := os.Getenv(ReadersEnv); name != "" {
		return name
	}
	return ReadersGroup
}

var readers = sync.OnceValues(func() (int, bool) {
	g, err := user.LookupGroup(ReadersName())
	if err != nil {
		return 0, false
	}
	gid, err := strconv.Atoi(g.Gid)
	return gid, err == nil && gid >= 0
})

// Readers reports the readers' group id, if the group exists.
func Readers() (gid int, ok bool) { return readers() }

// dirMode and fileMode are what sluice creates record directories and
// files with: readable by the readers' group where it exists.
func dirMode() uint32 {
	if _, ok := readers(); ok {
		return 0o750
	}
	return 0o700
}

func fileMode() uint32 {
	if _, ok := readers(); ok {
		return 0o640
	}
	return 0o600
}

// shareFd gives the readers' group what fd names, where the group exists
// (best effort: a failure leaves it the owner's alone, which is safe).
func shareFd(fd int) {
	if gid, ok := readers(); ok {
		unix.Fchown(fd, -1, gid)
	}
}
