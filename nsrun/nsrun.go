// Package nsrun runs a function inside a named network namespace, on an
// OS thread of its own: what the function opens (a socket) stays in
// that namespace for its whole life, while the rest of the process
// stays where it is. The lab builds its test beds with it; the agent
// opens its prober's socket in the namespace it shapes.
package nsrun

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// In runs f on an OS thread inside the named network namespace ("": the
// caller's own, on this goroutine).
func In(ns string, f func() error) error {
	if ns == "" {
		return f()
	}
	target, err := netns.GetFromName(ns)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", ns, err)
	}
	defer target.Close()
	return OnThread(func() error {
		if err := netns.Set(target); err != nil {
			return err
		}
		return f()
	})
}

// OnThread runs f on a locked OS thread and moves the thread back to its
// namespace afterwards. If it cannot, the thread is never unlocked and
// the runtime discards it with the goroutine.
func OnThread(f func() error) error {
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
