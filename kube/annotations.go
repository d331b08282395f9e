package kube

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"sluice/policy"
	"sluice/units"
)

// The annotations a pod's caps are read from. Kubernetes' own (read by
// the CNI bandwidth plugin) and Calico's are Quantities in bit/s ("10M"
// is 10^7, "1Gi" 2^30); kube-ovn's a number of Mbit/s.
const (
	IngressBandwidth = "kubernetes.io/ingress-bandwidth"
	EgressBandwidth  = "kubernetes.io/egress-bandwidth"
	CalicoIngress    = "qos.projectcalico.org/ingressBandwidth"
	CalicoEgress     = "qos.projectcalico.org/egressBandwidth"
	OVNIngress       = "ovn.kubernetes.io/ingress_rate"
	OVNEgress        = "ovn.kubernetes.io/egress_rate"
	// Class names a class of the pods class's tree to hang the pod
	// below instead (its prio, its guarantee, its share of what is
	// spare): `sluice.io/class: gold`.
	Class = "sluice.io/class"
	// Weight is a pod's share of its pods class against the other pods
	// of the file (1 by default): its guarantee, and so its share of
	// what is spare, `sluice.io/weight: "3"`.
	Weight = "sluice.io/weight"
	// Priority is a pod's prio, 0 (served first, and on EDT trees in
	// the prod queues) to 7, in place of its class's:
	// `sluice.io/priority: "0"`.
	Priority = "sluice.io/priority"
)

// MaxWeight bounds sluice.io/weight: a share a million times another's
// is as much as a weight can mean.
const MaxWeight = 1e6

// MinWeight bounds it below as the policy's weight is (1e-320, a
// subnormal, passed).
const MinWeight = policy.MinWeight

// decimal is how a weight is written: digits with an optional fraction
// (ParseFloat also takes hex floats, exponents, "Inf" and "1_0").
var decimal = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$|^\.[0-9]+$`)

// capForm is one annotation that caps a direction.
type capForm struct {
	name string
	mbit bool // kube-ovn's: a number of Mbit/s
}

var capForms = map[string][]capForm{
	policy.Egress:  {{EgressBandwidth, false}, {CalicoEgress, false}, {OVNEgress, true}},
	policy.Ingress: {{IngressBandwidth, false}, {CalicoIngress, false}, {OVNIngress, true}},
}

// The bounds kubelet holds the bandwidth annotations to, in bit/s.
const minCap, maxCap = 1e3, 1e15

// Problem is an annotation a pod carries that cannot be used: the pod
// stays a host, without it.
type Problem struct {
	Annotation, Value, Why string
}

func (p Problem) String() string {
	v := p.Value
	if len(v) > maxShown {
		// A value is up to 256 KiB: the log, the Event and what the
		// agent remembers quote its start.
		v = fmt.Sprintf("%s... (%d bytes)", strings.ToValidUTF8(v[:maxShown], ""), len(p.Value))
	}
	return fmt.Sprintf("annotation %s: %q: %s", p.Annotation, v, p.Why)
}

// maxShown is how much of an annotation's value a problem quotes.
const maxShown = 64

// Wants is what a pod's annotations ask in one direction.
type Wants struct {
	Cap units.Rate // 0: none (the pods class's ceil)
	// CapUnread: a cap annotation is there but cannot be read (a typo:
	// "10Mbit"). The pod is held closed, not let run to the class's
	// ceil: the watcher keeps its last good cap, or gives it the class's
	// per-pod rate (as the CNI bandwidth plugin fails such a pod).
	CapUnread bool
	Class     string  // "": the pods class itself
	Weight    float64 // 0: none (1)
	Prio      *int    // nil: its class's
}

// Read reads the annotations of direction dir (policy.Egress: what the
// pod sends; policy.Ingress: what it receives). Where a pod carries more
// than one form of cap, the smallest holds: each CNI that reads one
// would enforce it. ok is false where none applies to dir: the pod is
// then no host of a pods class of that direction.
func Read(ann map[string]string, dir string) (w Wants, ok bool, problems []Problem) {
	for _, f := range capForms[dir] {
		v, set := ann[f.name]
		if !set {
			continue
		}
		ok = true
		bits, err := capOf(v, f.mbit)
		if err != nil {
			problems = append(problems, Problem{f.name, v, err.Error() + "; the pod keeps its last cap (or its class's per-pod rate)"})
			w.CapUnread = true
			continue
		}
		if r := units.FromBits(bits); w.Cap == 0 || r < w.Cap {
			w.Cap = r
		}
	}
	if v, set := ann[Class]; set {
		ok = true
		w.Class = strings.TrimSpace(v)
	}
	if v, set := ann[Weight]; set {
		ok = true
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		switch {
		case err != nil || math.IsNaN(x) || !decimal.MatchString(strings.TrimSpace(v)):
			problems = append(problems, Problem{Weight, v, "not a decimal number (like 2 or 0.5)"})
		case x < MinWeight || x > MaxWeight:
			problems = append(problems, Problem{Weight, v, fmt.Sprintf("a weight is from %g to %g", MinWeight, MaxWeight)})
		default:
			w.Weight = x
		}
	}
	if v, set := ann[Priority]; set {
		ok = true
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > policy.MaxPrio {
			problems = append(problems, Problem{Priority, v, fmt.Sprintf("a prio is a number from 0 (served first) to %d", policy.MaxPrio)})
		} else {
			w.Prio = &n
		}
	}
	return w, ok, problems
}

// capOf reads a cap in bit/s.
func capOf(v string, mbit bool) (float64, error) {
	var bits float64
	if mbit {
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return 0, fmt.Errorf("not a number of Mbit/s")
		}
		bits = x * 1e6
	} else {
		q, err := resource.ParseQuantity(strings.TrimSpace(v))
		if err != nil {
			return 0, fmt.Errorf("not a quantity of bit/s like 10M (%v)", err)
		}
		bits = q.AsApproximateFloat64()
	}
	if bits < minCap || bits > maxCap {
		return 0, fmt.Errorf("%s bit/s is outside 1k to 1P, the range Kubernetes allows", strconv.FormatFloat(bits, 'g', -1, 64))
	}
	if units.FromBits(bits) > policy.MaxRateBps {
		return 0, fmt.Errorf("above %s, the most sluice shapes", policy.MaxRateBps.String())
	}
	return bits, nil
}
