package kube

import (
	"bytes"
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"sluice/kube/corev1"
	"sluice/units"
)

// Host is a pod as a host of a pods class.
type Host struct {
	// Name is namespace.pod (a namespace has no dot), shortened with a
	// hash of the whole where longer than a host's 64 characters.
	Name  string
	Addrs []netip.Addr
	Wants
	// Group is the pod's namespace where it is an aggregate in the
	// host's direction: the host hangs below it.
	Group string
	// Problems are the annotations it carries that cannot be used.
	Problems []Problem
}

// HostOf reads pod as a host of a pods class of direction dir. ok is
// false where it is none: no annotation for dir, no address yet, on
// the host's network (its traffic is the node's), or finished
// (Succeeded or Failed: its address may already be another pod's).
func HostOf(pod *corev1.Pod, dir string) (h Host, ok bool) { return HostIn(pod, dir, false) }

// HostIn is HostOf for a pod whose namespace is an aggregate in dir
// where grouped (GroupOf): such a pod is a host without annotations of
// its own, below its namespace's group, where a sluice.io/class it
// carries is not used (a pod cannot leave its namespace's cap).
func HostIn(pod *corev1.Pod, dir string, grouped bool) (h Host, ok bool) {
	if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
		return h, false
	}
	w, ok, problems := Read(pod.Annotations, dir)
	if !ok && !grouped {
		return h, false
	}
	h = Host{Name: hostName(pod.Namespace, pod.Name), Wants: w, Problems: problems}
	if grouped {
		h.Group = pod.Namespace
		if h.Class != "" {
			h.Problems = append(h.Problems, Problem{Class, h.Class, groupNote(pod.Namespace, dir)})
			h.Class = ""
		}
	}
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
// addresses, rate, ceil, parent, and prio where a pod has one), sorted
// by name, so that a changed cap changes its line in place. A host of a
// group (its namespace's aggregate: RenderGroups) names it as parent.
// Where a pod has a weight, every pod's rate is its weight's part of
// the pods class (a percentage; 1 for a pod without); otherwise each
// takes the class's default share. A pod's class that is not among
// classes, or that a group's name shadows, is left out (the pod hangs
// below the pods class), as is an address listed by a pod before it (a
// stale pod's, not yet gone); dropped says which, by host.
func Render(hosts []Host, classes []string) (file []byte, dropped map[string][]string) {
	hosts = slices.Clone(hosts)
	slices.SortFunc(hosts, func(a, b Host) int { return strings.Compare(a.Name, b.Name) })
	drop := func(h, why string) {
		if dropped == nil {
			dropped = map[string][]string{}
		}
		dropped[h] = append(dropped[h], why)
	}
	type row struct {
		h     Host
		addrs []string
		class string
	}
	var rows []row
	groups := map[string]bool{}
	for _, h := range hosts {
		if h.Group != "" {
			groups[h.Group] = true
		}
	}
	seen := map[netip.Addr]string{}
	var total float64
	weighted, prios := false, false
	for _, h := range hosts {
		r := row{h: h, class: h.Class}
		for _, a := range h.Addrs {
			if other, dup := seen[a]; dup {
				drop(h.Name, fmt.Sprintf("address %s is pod %s's", a, other))
				continue
			}
			seen[a] = h.Name
			r.addrs = append(r.addrs, a.String())
		}
		if len(r.addrs) == 0 {
			continue
		}
		switch {
		case h.Group != "":
			r.class = h.Group
		case r.class != "" && !slices.Contains(classes, r.class):
			drop(h.Name, fmt.Sprintf("%s %q names no class of its tree (%s)", Class, r.class, strings.Join(classes, ", ")))
			r.class = ""
		case r.class != "" && groups[r.class]:
			// The parent column names a group before a class.
			drop(h.Name, fmt.Sprintf("%s %q: namespace %s is an aggregate on this node, and takes the name in the pods file", Class, r.class, r.class))
			r.class = ""
		}
		rows = append(rows, r)
		total += cmp.Or(h.Weight, 1)
		weighted = weighted || h.Weight > 0
		prios = prios || h.Prio != nil
	}
	var b bytes.Buffer
	b.WriteString("name,addresses,rate,ceil,parent")
	if prios {
		b.WriteString(",prio") // only where a pod has one: most files never change header
	}
	b.WriteByte('\n')
	for _, r := range rows {
		rate := ""
		if weighted {
			rate = strconv.FormatFloat(100*cmp.Or(r.h.Weight, 1)/total, 'g', 6, 64) + "%"
		}
		fmt.Fprintf(&b, "%s,%s,%s,%s,%s", r.h.Name, strings.Join(r.addrs, " "), rate, capText(r.h.Cap), r.class)
		if prios {
			b.WriteByte(',')
			if r.h.Prio != nil {
				b.WriteString(strconv.Itoa(*r.h.Prio))
			}
		}
		b.WriteByte('\n')
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
