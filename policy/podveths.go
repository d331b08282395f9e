package policy

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"sluice/safefile"
	"sluice/units"
)

// PodVeths is `pod_veths:`: every pod of the node shaped on its own
// host-side device, as the CNI bandwidth plugin does, for CNIs that
// route to each pod through a veth of its own (Calico, Cilium without
// BPF host routing, kube-ovn). What a pod receives queues on its veth's
// egress, at its ingress-bandwidth cap; what it sends queues on an ifb
// of the veth's ingress, at its egress-bandwidth cap. Traffic between
// two pods of the node passes both and is shaped too.
//
// The veths are not in the policy: `sluice agent --kubernetes` finds
// each pod's device (the route to its address) and lists them in File;
// each line becomes an interface of the policy (Generated).
type PodVeths struct {
	Pos Pos
	// File is where the agent lists the veths (absolute): PodVethsFile
	// unless `file:` says another.
	File    string
	FilePos Pos
	// Leaf is each queue's leaf qdisc (auto if empty).
	Leaf    string
	LeafPos Pos
	// Veths are File's lines.
	Veths []*PodVeth
}

// PodVeth is one line of a pod_veths file: a pod's device and its caps.
type PodVeth struct {
	Device string
	Pod    string
	// Ingress caps what the pod receives (the veth's egress), Egress
	// what it sends (the veth's ingress, on an ifb); nil: not capped.
	Ingress, Egress *Rate
	Line            int
}

// PodVethsHeader is the header of a pod_veths file.
const PodVethsHeader = "device,pod,ingress,egress"

// PodVethsFile is where `sluice agent --kubernetes` lists the pods'
// veths by default: under the state directory, beside the pods files
// (PodsFile).
func PodVethsFile() string { return filepath.Join(stateBase(), "pods", "veths.csv") }

func (p *parser) podVeths(n *yaml.Node) *PodVeths {
	pv := &PodVeths{Pos: pos(n)}
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!null" || n.Value == "true") {
		// `pod_veths: true` (or the key alone): every default.
	} else if !p.fields(n, "pod_veths", map[string]func(*yaml.Node){
		"file": func(v *yaml.Node) {
			pv.File, _ = p.str(v, "pod_veths.file")
			pv.FilePos = pos(v)
		},
		"leaf": func(v *yaml.Node) {
			pv.Leaf, _ = p.str(v, "pod_veths.leaf")
			pv.LeafPos = pos(v)
		},
	}) {
		return nil
	}
	if pv.File == "" {
		pv.File, pv.FilePos = PodVethsFile(), pv.Pos
	} else if !filepath.IsAbs(pv.File) {
		pv.File = filepath.Join(p.dir, pv.File)
	}
	data, err := safefile.ReadRegular(pv.File, "pod_veths file", MaxHostsFileBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Not written yet: no pods (as a pods class's file).
		p.sources[pv.File] = []byte{}
		return pv
	case err != nil:
		p.d.Errorf(pv.FilePos, "pod_veths.file: %v", err)
		return nil
	}
	p.sources[pv.File] = data
	pv.Veths = p.podVethsCSV(pv.File, data)
	return pv
}

// podVethsCSV parses a pod_veths file: its header, then one line per
// pod (device, pod, and a cap for each direction, empty where none).
func (p *parser) podVethsCSV(file string, data []byte) []*PodVeth {
	data = bytes.TrimPrefix(data, []byte(bom))
	r := csv.NewReader(bytes.NewReader(data))
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true
	r.Comment = '#'
	errAt := func(line, col int, format string, args ...any) {
		p.d.ErrorIn(file, Pos{line, col}, format, args...)
	}
	header, err := r.Read()
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		line, col := csvPos(err)
		errAt(line, col, "pod_veths file: %v; expected the header %s", csvErr(err), PodVethsHeader)
		return nil
	}
	if strings.Join(header, ",") != PodVethsHeader {
		errAt(1, 1, "pod_veths file: header %q; expected %s", strings.Join(header, ","), PodVethsHeader)
		return nil
	}
	var out []*PodVeth
	devices := map[string]int{}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			line, col := csvPos(err)
			errAt(line, col, "pod_veths file: %v", csvErr(err))
			return out
		}
		line, _ := r.FieldPos(0)
		col := func(i int) int { _, c := r.FieldPos(i); return c }
		if len(rec) != 4 {
			errAt(line, 1, "pod_veths file: %d fields; expected 4 (%s)", len(rec), PodVethsHeader)
			continue
		}
		v := &PodVeth{Device: rec[0], Pod: rec[1], Line: line}
		if why := ifNameProblem(v.Device); why != "" {
			errAt(line, col(0), "pod_veths file: device %q: %s (a Linux device name)", v.Device, why)
			continue
		}
		if prev, dup := devices[v.Device]; dup {
			errAt(line, col(0), "pod_veths file: device %s appears twice (first at line %d): a veth carries one pod", v.Device, prev)
			continue
		}
		devices[v.Device] = line
		if v.Pod == "" {
			errAt(line, col(1), "pod_veths file: the pod's name is empty")
			continue
		}
		ok := true
		for i, dst := range []**Rate{&v.Ingress, &v.Egress} {
			s := rec[2+i]
			if s == "" {
				continue
			}
			rt, _, err := ParseRate(s)
			switch {
			case err != nil:
				errAt(line, col(2+i), "pod_veths file: %s cap: %v", []string{Ingress, Egress}[i], err)
				ok = false
			case rt.Percent > 0:
				errAt(line, col(2+i), "pod_veths file: %s cap %s: a rate (10mbit), not a percentage", []string{Ingress, Egress}[i], s)
				ok = false
			case rt.Bps < units.Rate(1000/8):
				errAt(line, col(2+i), "pod_veths file: %s cap %s: below 1kbit, the least Kubernetes takes", []string{Ingress, Egress}[i], s)
				ok = false
			default:
				rt.Pos = Pos{line, col(2 + i)}
				*dst = &rt
			}
		}
		if !ok {
			continue
		}
		if v.Ingress == nil && v.Egress == nil {
			errAt(line, col(2), "pod_veths file: pod %s has no cap in either direction", v.Pod)
			continue
		}
		out = append(out, v)
	}
	return out
}

// expandPodVeths adds an interface to pol for each pod veth: the veth's
// egress at the pod's ingress cap, its ingress at the pod's egress cap.
// A device the policy shapes itself is refused, at the file's line.
func (p *parser) expandPodVeths(pol *Policy) {
	pv := pol.PodVeths
	if pv == nil {
		return
	}
	// The agent writes both kinds of file: one cannot be the other.
	classFiles := (&Policy{File: pol.File, Interfaces: pol.Interfaces}).Files()[1:]
	if slices.Contains(classFiles, pv.File) {
		p.d.Errorf(pv.FilePos, "pod_veths.file %s is also a class's hosts_file or groups_file; give it a file of its own", pv.File)
		return
	}
	taken := map[string]bool{}
	for _, in := range pol.Interfaces {
		taken[in.Name] = true
		if in.Ingress != nil {
			taken[IfbName(in)] = true
		}
	}
	for _, v := range pv.Veths {
		in := &Interface{Pos: pv.Pos, Name: v.Device, NamePos: pv.Pos, Generated: v.Pod}
		tree := func(dir string, r *Rate) *Tree {
			return &Tree{Pos: pv.Pos, Dir: dir, Rate: r, Leaf: pv.Leaf, LeafPos: pv.LeafPos, Classifier: "auto"}
		}
		if v.Ingress != nil {
			in.Egress = tree(Egress, v.Ingress)
		}
		if v.Egress != nil {
			in.Ingress = tree(Ingress, v.Egress)
		}
		clash := ""
		switch {
		case taken[in.Name]:
			clash = "device " + in.Name
		case in.Ingress != nil && taken[IfbName(in)]:
			clash = "its ifb " + IfbName(in)
		}
		if clash != "" {
			p.d.ErrorIn(pv.File, Pos{v.Line, 1}, "pod_veths file: pod %s: %s is shaped by the policy already", v.Pod, clash)
			continue
		}
		taken[in.Name] = true
		if in.Ingress != nil {
			taken[IfbName(in)] = true
		}
		pol.Interfaces = append(pol.Interfaces, in)
	}
}

// String names the pod a generated interface is for, for messages.
func (v *PodVeth) String() string { return fmt.Sprintf("%s (pod %s)", v.Device, v.Pod) }
