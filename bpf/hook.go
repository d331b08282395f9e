package bpf

import "fmt"

// Hook is the classifier on one clsact hook of a device, as one object
// of a plan: the program and everything in its maps. It satisfies the
// kernel layer's object interface (Key, Device, Describe) so that it is
// diffed, applied and rolled back with the tc objects around it.
type Hook struct {
	Dev     string
	Ingress bool // the ingress hook (policing without a tree); else egress
	Prio    uint16
	Content *Content
	// Base, on a change, is what the maps hold now (only the difference
	// is written).
	Base *Content
	// Set on readback.
	Version  string // the version in the filter's name
	ProgID   uint32
	Capacity uint32 // the size of the live counter map
	HistCap  uint32 // the size of the live delay histogram map
	FlowCap  uint32 // the size of the live flow map (0: a program without one)
	// Note says what the hook is for (plans).
	Note string
	// Controlled lists the targets (indices in Content.Targets) whose
	// Rate and Horizon a sharing controller sets at run time (EDT
	// aggregates under `sharing: controller`; plans only).
	Controlled []uint32
	// Siblings are the other hooks of the interface that time round
	// trips (Content.RTT): a program loaded for this hook shares their
	// flows and histograms (plans only).
	Siblings []Site
}

// Site is where a hook is: a device's ingress or egress.
type Site struct {
	Dev     string
	Ingress bool
}

// Direction is "ingress" or "egress".
func (h *Hook) Direction() string {
	if h.Ingress {
		return "ingress"
	}
	return "egress"
}

func (h *Hook) Key() string    { return "bpf/" + h.Dev + "/" + h.Direction() }
func (h *Hook) Device() string { return h.Dev }
func (h *Hook) Describe() string {
	s := fmt.Sprintf("bpf classifier %s %s prio %d: %s", h.Dev, h.Direction(), h.Prio, h.Content.Summary())
	if h.Note != "" {
		s += "  # " + h.Note
	}
	return s
}

// Replaceable says why a live hook cannot take want's content in place
// (another program version, or maps too small), or "" if it can.
func (h *Hook) Replaceable(want *Hook) string {
	switch {
	case h.Version != Version:
		return fmt.Sprintf("program version %s becomes %s", h.Version, Version)
	case h.Capacity <= want.Content.maxCounter():
		return fmt.Sprintf("the counter map (%d entries) is too small", h.Capacity)
	case h.HistCap <= want.Content.maxHist():
		return fmt.Sprintf("the delay histogram map (%d entries) is too small", h.HistCap)
	case (h.Content.RTT == nil) != (want.Content.RTT == nil):
		// A program timing round trips shares its maps with the
		// interface's other hooks from its load on.
		if want.Content.RTT != nil {
			return "round trips are timed now: a program that shares the interface's flows"
		}
		return "round trips are no longer timed"
	case want.Content.RTT != nil && h.FlowCap != want.Content.RTT.flows():
		return fmt.Sprintf("the flow map holds %d flows; %d wanted", h.FlowCap, want.Content.RTT.flows())
	}
	return ""
}
