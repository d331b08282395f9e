package kube

import (
	"path/filepath"
	"slices"

	"sluice/policy"
	"sluice/units"
)

// Target is a pods file to keep: the hosts of a pods class
// (per_host: {pods: egress|ingress}).
type Target struct {
	File string // absolute, as policy.Files names it
	Dir  string // policy.Egress or policy.Ingress
	// Classes are those a pod's sluice.io/class may name: the pods
	// class and the plain classes of its tree (a hosts_file's parent).
	Classes []string
	// Groups is the groups file of the namespaces' aggregates (absolute).
	Groups string
	// Veths: File is the policy's pod_veths file (each pod's device and
	// caps), not a pods class's hosts.
	Veths bool
	// PodRate is the pods class's per-pod rate: the cap of a pod whose
	// cap annotation cannot be read and that had no good one before.
	PodRate units.Rate
}

// Targets lists pol's pods classes, one per file, after its pod_veths
// file where it has one.
func Targets(pol *policy.Policy) []Target {
	var out []Target
	if pol.PodVeths != nil {
		out = append(out, Target{File: pol.PodVeths.File, Veths: true})
	}
	seen := map[string]int{}
	for _, in := range pol.Interfaces {
		for _, t := range []*policy.Tree{in.Egress, in.Ingress} {
			if t == nil {
				continue
			}
			var plain []string
			var pods []*policy.Class
			var walk func(cs []*policy.Class)
			walk = func(cs []*policy.Class) {
				for _, c := range cs {
					switch {
					case c.Group != "": // a namespace's aggregate: its pods name it
					case c.PerHost != nil && c.PerHost.Pods != "":
						pods = append(pods, c)
					case len(c.Match) == 0 && c.PerHost == nil && len(c.Classes) == 0:
						plain = append(plain, c.Name)
					}
					walk(c.Classes)
				}
			}
			walk(t.Classes)
			abs := func(f string) string {
				if f != "" && !filepath.IsAbs(f) {
					f = filepath.Join(filepath.Dir(pol.File), f)
				}
				return f
			}
			for _, c := range pods {
				f := abs(c.PerHost.HostsFile)
				classes := append([]string{c.Name}, plain...)
				if i, ok := seen[f]; ok {
					// One file listing the pods of several classes: a
					// class a pod names must be one in each tree.
					out[i].Classes = slices.DeleteFunc(out[i].Classes, func(n string) bool { return !slices.Contains(classes, n) })
					continue
				}
				seen[f] = len(out)
				out = append(out, Target{File: f, Dir: c.PerHost.Pods, Classes: classes, Groups: abs(c.PerHost.GroupsFile),
					PodRate: max(c.PerHost.RateBps, units.FromBits(minCap))})
			}
		}
	}
	return out
}
