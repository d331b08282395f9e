package kube

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"sluice/kube/corev1"
	"sluice/policy"
	"sluice/units"
)

// The annotations of a namespace that make its pods on a node one
// aggregate in a direction: a class below the pods class with a
// guarantee and a cap, the pods' classes below it, so that the
// namespace's pods share what it gets and together never take more
// than its cap. Quantities in bit/s, as kubernetes.io/egress-bandwidth
// ("50M"). Either makes the aggregate; the other then takes the pods
// class's default (a pod's default share; the class's ceil).
const (
	EgressGuarantee  = "sluice.io/egress-guarantee"
	EgressCap        = "sluice.io/egress-cap"
	IngressGuarantee = "sluice.io/ingress-guarantee"
	IngressCap       = "sluice.io/ingress-cap"
)

var groupForms = map[string][2]string{
	policy.Egress:  {EgressGuarantee, EgressCap},
	policy.Ingress: {IngressGuarantee, IngressCap},
}

// Group is a namespace's aggregate in one direction: a line of the
// pods class's groups_file.
type Group struct {
	Name           string     // the namespace
	Guarantee, Cap units.Rate // 0: the pods class's default
	// Problems are the annotations it carries that cannot be used.
	Problems []Problem
}

// GroupOf reads namespace ns's aggregate in direction dir. ok is false
// where it has none: its pods are then hosts of their own.
func GroupOf(ns *corev1.Namespace, dir string) (g Group, ok bool) {
	if ns == nil {
		return g, false
	}
	g.Name = ns.Name
	for i, name := range groupForms[dir] {
		v, set := ns.Annotations[name]
		if !set {
			continue
		}
		ok = true
		bits, err := capOf(v, false)
		if err != nil {
			g.Problems = append(g.Problems, Problem{name, v, err.Error()})
			continue
		}
		if r := units.FromBits(bits); i == 0 {
			g.Guarantee = r
		} else {
			g.Cap = r
		}
	}
	return g, ok
}

// RenderGroups is the groups file of a pods file's hosts (a
// groups_file: name,rate,ceil): each group a host names, sorted by
// name, so that an edited annotation changes its line in place.
func RenderGroups(hosts []Host, groups map[string]Group) []byte {
	var names []string
	for _, h := range hosts {
		if h.Group != "" && !slices.Contains(names, h.Group) {
			names = append(names, h.Group)
		}
	}
	slices.Sort(names)
	var b bytes.Buffer
	b.WriteString("name,rate,ceil\n")
	for _, n := range names {
		g := groups[n]
		fmt.Fprintf(&b, "%s,%s,%s\n", n, capText(g.Guarantee), capText(g.Cap))
	}
	return b.Bytes()
}

// groupNote is why a pod's sluice.io/class is not used where its
// namespace is an aggregate in direction dir.
func groupNote(ns, dir string) string {
	f := groupForms[dir]
	return fmt.Sprintf("namespace %s is an aggregate (%s): its pods hang below it", ns, strings.Join(f[:], ", "))
}
