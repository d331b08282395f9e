//go:build faults

package kernel

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// With -tags faults, SLUICE_FAULTS kills the process at a chosen point,
// as a crash or an operator's kill -9 would:
//
//	kill-at-write=N   just before the N-th kernel write (counted from 1)
//	kill-at=POINT     at a named point: after-journal, before-commit
//	kill-at-patch-write=N  just before the N-th write of a patch
//	                  (Kernel.ApplyPatch: a controller step, a hosts edit)
//
// Only the end-to-end tests build this.
func installFaults(k *Kernel) {
	for _, f := range strings.Split(os.Getenv("SLUICE_FAULTS"), ",") {
		v, ok := strings.CutPrefix(f, "kill-at-write=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			continue
		}
		k.conn.BeforeWrite = func(i int, what string) error {
			if i == n {
				die()
			}
			return nil
		}
	}
}

// patchFaults installs kill-at-patch-write for one patch,
// counting from its first write; the returned func removes it.
func patchFaults(k *Kernel) func() {
	for _, f := range strings.Split(os.Getenv("SLUICE_FAULTS"), ",") {
		v, ok := strings.CutPrefix(f, "kill-at-patch-write=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			continue
		}
		prev, base := k.conn.BeforeWrite, k.conn.Writes()
		k.conn.BeforeWrite = func(i int, what string) error {
			if i-base == n {
				die()
			}
			if prev != nil {
				return prev(i, what)
			}
			return nil
		}
		return func() { k.conn.BeforeWrite = prev }
	}
	return func() {}
}

func faultPoint(name string) {
	for _, f := range strings.Split(os.Getenv("SLUICE_FAULTS"), ",") {
		if f == "kill-at="+name {
			die()
		}
	}
}

func die() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
