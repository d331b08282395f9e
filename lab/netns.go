package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sluice/nsrun"
)

// InNetns runs f on an OS thread inside the named network namespace.
// Sockets opened by f stay in that namespace for their whole life, so a
// single process can be client, router and server at once.
func InNetns(ns string, f func() error) error {
	if ns == "" {
		return fmt.Errorf("network namespace: no name")
	}
	return nsrun.In(ns, f)
}

// netnsDir is where named network namespaces are mounted (iproute2's
// NETNS_RUN_DIR, and the netns library's).
const netnsDir = "/run/netns"

var shareMu sync.Mutex

// shareNetnsDir makes netnsDir a mount point with shared propagation
// before a namespace is mounted in it, as iproute2 does on its first
// `ip netns add`. Where the directory was still plain, that first `ip
// netns add` (after the bed was built) bound it onto itself and hid the
// bed's mounts beneath: its namespaces could no longer be entered or
// removed until a reboot (TestLabDownAfterIPNetnsAdd).
func shareNetnsDir() error {
	shareMu.Lock()
	defer shareMu.Unlock()
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err = unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount point (as ip netns add does): %w", netnsDir, err)
	}
	return nil
}

// createNS creates a named network namespace (as `ip netns add`).
func createNS(name string) error {
	if err := shareNetnsDir(); err != nil {
		return err
	}
	return nsrun.OnThread(func() error {
		h, err := netns.NewNamed(name) // moves this thread into it
		if err != nil {
			return fmt.Errorf("creating network namespace %s: %w", name, err)
		}
		return h.Close()
	})
}

// deleteNS removes a named network namespace; its devices go with it.
// As `ip netns del`, it removes the name even where it is not mounted
// (a file left by a run killed between creating and mounting it).
func deleteNS(name string) error {
	p := filepath.Join(netnsDir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// bedNS lists the namespaces of the lab (or conformance bed) named
// name: Prefix, the name, a dash and one role (router, c1, gw, far0...;
// roles have no dash). A name is not a prefix: lab rtr8's namespaces
// are not rtr8-b's (sllab-rtr8-b-router is lab rtr8-b's router, never
// lab rtr8's "b-router").
func bedNS(name string) []string {
	var out []string
	for _, ns := range listNS(Prefix + name + "-") {
		if ofBed(ns, name) {
			out = append(out, ns)
		}
	}
	return out
}

// ofBed: namespace ns is one of bed name's.
func ofBed(ns, name string) bool {
	role, ok := strings.CutPrefix(ns, Prefix+name+"-")
	return ok && role != "" && !strings.Contains(role, "-")
}

// listNS lists the named network namespaces starting with prefix.
func listNS(prefix string) []string {
	ents, _ := os.ReadDir("/var/run/netns")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}
