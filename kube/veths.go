package kube

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"sluice/kube/corev1"
	"sluice/policy"
	"sluice/units"
)

// Veth is a pod shaped on its own host-side device (pod_veths): what it
// receives at Ingress on the device's egress, what it sends at Egress
// on an ifb of the device's ingress (0: not capped).
type Veth struct {
	Device          string
	Pod             string // namespace.pod, as a host's name
	Ingress, Egress units.Rate
}

// DeviceFunc finds the node's device that a pod's addresses are routed
// through. An error wrapping ErrNotOwn says the pod has no device of its
// own (a bridge, a gateway): it stays so until the pod changes. Any
// other error (no route yet, the device not up) is tried again.
type DeviceFunc func(addrs []netip.Addr) (string, error)

// ErrNotOwn marks a pod whose addresses do not reach a device of its
// own (DeviceFunc).
var ErrNotOwn = errors.New("not a device of the pod's own")

// VethsOf lists the pods that pod_veths shapes: those with a cap in
// either direction (annotations as for a pods class), not on the
// host's network, not finished, with an address. Each is shaped on the
// device device finds for it, unless another pod of the list is found
// on the same device (then neither: a shared device is not a pod's
// own). pending lists the pods whose device could not be found yet and
// why; refused those that have none of their own and why.
func VethsOf(pods []*corev1.Pod, device DeviceFunc) (veths []Veth, pending, refused map[*corev1.Pod]string) {
	pending, refused = map[*corev1.Pod]string{}, map[*corev1.Pod]string{}
	on := map[string][]int{} // device -> indexes in veths
	var who []*corev1.Pod
	for _, p := range pods {
		in, inOK := HostOf(p, policy.Ingress)
		out, outOK := HostOf(p, policy.Egress)
		v := Veth{Pod: hostName(p.Namespace, p.Name)}
		var addrs []netip.Addr
		if inOK {
			v.Ingress, addrs = in.Cap, in.Addrs
		}
		if outOK {
			v.Egress, addrs = out.Cap, out.Addrs
		}
		if v.Ingress == 0 && v.Egress == 0 {
			continue
		}
		dev, err := device(addrs)
		switch {
		case errors.Is(err, ErrNotOwn):
			refused[p] = err.Error()
			continue
		case err != nil:
			pending[p] = err.Error()
			continue
		}
		v.Device = dev
		on[dev] = append(on[dev], len(veths))
		veths = append(veths, v)
		who = append(who, p)
	}
	var out []Veth
	for i, v := range veths {
		if others := on[v.Device]; len(others) > 1 {
			var names []string
			for _, j := range others {
				names = append(names, veths[j].Pod)
			}
			slices.Sort(names)
			refused[who[i]] = fmt.Sprintf("device %s carries pods %s: %v (shape it with a pods class)", v.Device, strings.Join(names, ", "), ErrNotOwn)
			continue
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b Veth) int { return strings.Compare(a.Device, b.Device) })
	return out, pending, refused
}

// CapProblems are pod's cap annotations that cannot be read, in either
// direction (what pod_veths uses of its annotations).
func CapProblems(pod *corev1.Pod) []Problem {
	var out []Problem
	for _, dir := range []string{policy.Ingress, policy.Egress} {
		_, _, problems := Read(pod.Annotations, dir)
		for _, pr := range problems {
			if slices.ContainsFunc(capForms[dir], func(f capForm) bool { return f.name == pr.Annotation }) {
				out = append(out, pr)
			}
		}
	}
	return out
}

// RenderVeths writes a pod_veths file (policy.PodVethsHeader), sorted
// by device.
func RenderVeths(veths []Veth) []byte {
	var b bytes.Buffer
	b.WriteString(policy.PodVethsHeader + "\n")
	for _, v := range veths {
		fmt.Fprintf(&b, "%s,%s,%s,%s\n", v.Device, v.Pod, capText(v.Ingress), capText(v.Egress))
	}
	return b.Bytes()
}
