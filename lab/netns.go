package lab

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"

	"github.com/vishvananda/netns"
)

// InNetns runs f on an OS thread inside the named network namespace.
// Sockets opened by f stay in that namespace for their whole life, so a
// single process can be client, router and server at once.
func InNetns(ns string, f func() error) error {
	target, err := netns.GetFromName(ns)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", ns, err)
	}
	defer target.Close()
	return inNS(target, f)
}

func inNS(target netns.NsHandle, f func() error) error {
	return onThread(func() error {
		if err := netns.Set(target); err != nil {
			return err
		}
		return f()
	})
}

// onThread runs f on a locked OS thread and moves the thread back to its
// namespace afterwards. If it cannot, the thread is never unlocked and
// the runtime discards it with the goroutine.
func onThread(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		err = f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// createNS creates a named network namespace (as `ip netns add`).
func createNS(name string) error {
	return onThread(func() error {
		h, err := netns.NewNamed(name) // moves this thread into it
		if err != nil {
			return fmt.Errorf("creating network namespace %s: %w", name, err)
		}
		return h.Close()
	})
}

// deleteNS removes a named network namespace; its devices go with it.
func deleteNS(name string) error {
	err := netns.DeleteNamed(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
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
