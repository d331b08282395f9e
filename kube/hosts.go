package kube

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"sluice/units"
)

// Host is a pod as a host of a pods class.
type Host struct {
	// Name is namespace.pod (a namespace has no dot), shortened with a
	// hash of the whole where longer than a host's 64 characters.
	Name  string
	Addrs []netip.Addr
	Wants
	// Problems are the annotations it carries that cannot be used.
	Problems []Problem
}

// HostOf reads pod as a host of a pods class of direction dir. ok is
// false where it is none: no annotation for dir, no address yet, on
// the host's network (its traffic is the node's), or finished
// (Succeeded or Failed: its address may already be another pod's).
func HostOf(pod *corev1.Pod, dir string) (h Host, ok bool) {
	if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
		return h, false
	}
	w, ok, problems := Read(pod.Annotations, dir)
	if !ok {
		return h, false
	}
	h = Host{Name: hostName(pod.Namespace, pod.Name), Wants: w, Problems: problems}
	ips := pod.Status.PodIPs
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: pod.Status.PodIP}}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil && !slices.Contains(h.Addrs, a.Unmap()) {
			h.Addrs = append(h.Addrs, a.Unmap())
		}
	}
	return h, len(h.Addrs) > 0
}

// hostName is a pod's name as a host: namespace.pod, at most 64
// characters.
func hostName(ns, pod string) string {
	n := ns + "." + pod
	if len(n) <= 64 {
		return n
	}
	f := fnv.New64a()
	f.Write([]byte(n))
	return fmt.Sprintf("%s-%016x", n[:47], f.Sum64())
}

// Render is the pods file that lists hosts (a hosts_file: name,
// addresses, rate, ceil, parent), sorted by name, so that a changed cap
// changes its line in place. A pod's class that is not among classes
// is left out (the pod hangs below the pods class), as is an address
// listed by a pod before it (a stale pod's, not yet gone); dropped says
// which, by host.
func Render(hosts []Host, classes []string) (file []byte, dropped map[string][]string) {
	hosts = slices.Clone(hosts)
	slices.SortFunc(hosts, func(a, b Host) int { return strings.Compare(a.Name, b.Name) })
	var b bytes.Buffer
	b.WriteString("name,addresses,rate,ceil,parent\n")
	seen := map[netip.Addr]string{}
	drop := func(h, why string) {
		if dropped == nil {
			dropped = map[string][]string{}
		}
		dropped[h] = append(dropped[h], why)
	}
	for _, h := range hosts {
		var addrs []string
		for _, a := range h.Addrs {
			if other, dup := seen[a]; dup {
				drop(h.Name, fmt.Sprintf("address %s is pod %s's", a, other))
				continue
			}
			seen[a] = h.Name
			addrs = append(addrs, a.String())
		}
		if len(addrs) == 0 {
			continue
		}
		class := h.Class
		if class != "" && !slices.Contains(classes, class) {
			drop(h.Name, fmt.Sprintf("%s %q names no class of its tree (%s)", Class, class, strings.Join(classes, ", ")))
			class = ""
		}
		fmt.Fprintf(&b, "%s,%s,,%s,%s\n", h.Name, strings.Join(addrs, " "), capText(h.Cap), class)
	}
	return b.Bytes(), dropped
}

// capText writes a cap as the hosts file reads it: in bit/s, with the
// largest decimal unit that keeps it exact ("" for none).
func capText(r units.Rate) string {
	if r == 0 {
		return ""
	}
	bits := r.Bits()
	for _, u := range []struct {
		n    uint64
		unit string
	}{{1e12, "tbit"}, {1e9, "gbit"}, {1e6, "mbit"}, {1e3, "kbit"}} {
		if bits%u.n == 0 {
			return fmt.Sprintf("%d%s", bits/u.n, u.unit)
		}
	}
	return fmt.Sprintf("%dbit", bits)
}
