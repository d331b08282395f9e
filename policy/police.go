package policy

import (
	"time"

	"sluice/units"

	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// Police is a token-bucket policer: RFC 2697 srTCM (cir, cbs, ebs) or,
// with pir, RFC 2698 trTCM (cir, cbs, pir, pbs). Each colour has an
// action. Packets are never queued: what exceeds is dropped or remarked
// at once.
type Police struct {
	Pos  Pos
	CIR  *Rate
	PIR  *Rate
	CBS  *Size
	EBS  *Size
	PBS  *Size
	Mode string // "blind" (default) or "aware": the pre-colour comes from the DSCP
	// Actions per colour (green, yellow, red).
	Actions [3]PoliceAction

	// Resolved by validation: bytes/s and bytes.
	CIRBps, PIRBps               units.Rate
	CBSBytes, EBSBytes, PBSBytes uint64
}

// TwoRate reports whether this is an RFC 2698 trTCM.
func (p *Police) TwoRate() bool { return p.PIR != nil }

// PoliceAction is what a policer does with a packet of one colour.
type PoliceAction struct {
	Kind string // "pass", "drop" or "remark"
	DSCP uint8  // for remark
	Pos  Pos
}

// Colour names in policy files, in colour order.
var Colours = [3]string{"green", "yellow", "red"}

func (p *parser) police(n *yaml.Node, label string) *Police {
	pl := &Police{Pos: pos(n), Mode: "blind",
		Actions: [3]PoliceAction{{Kind: "pass"}, {Kind: "pass"}, {Kind: "drop"}}}
	what := label + ": police"
	h := map[string]func(*yaml.Node){
		"cir": func(v *yaml.Node) { pl.CIR = p.rate(v, what+".cir") },
		"pir": func(v *yaml.Node) { pl.PIR = p.rate(v, what+".pir") },
		"cbs": func(v *yaml.Node) { pl.CBS = p.size(v, what+".cbs") },
		"ebs": func(v *yaml.Node) { pl.EBS = p.size(v, what+".ebs") },
		"pbs": func(v *yaml.Node) { pl.PBS = p.size(v, what+".pbs") },
		"mode": func(v *yaml.Node) {
			s, _ := p.str(v, what+".mode")
			if s != "blind" && s != "aware" {
				p.d.Errorf(pos(v), "%s.mode: expected blind or aware, found %q", what, s)
			}
			pl.Mode = s
		},
	}
	for i, c := range Colours {
		h[c] = func(v *yaml.Node) {
			s, ok := p.str(v, what+"."+c)
			if !ok {
				return
			}
			a, err := parsePoliceAction(s)
			if err != nil {
				p.d.Errorf(pos(v), "%s.%s: %v", what, c, err)
				return
			}
			a.Pos = pos(v)
			pl.Actions[i] = a
		}
	}
	p.fields(n, what, h)
	return pl
}

func parsePoliceAction(s string) (PoliceAction, error) {
	switch s {
	case "pass", "drop":
		return PoliceAction{Kind: s}, nil
	}
	if d, ok := strings.CutPrefix(s, "remark:"); ok {
		v, err := parseDSCP(strings.TrimSpace(d))
		if err != nil {
			return PoliceAction{}, err
		}
		return PoliceAction{Kind: "remark", DSCP: v}, nil
	}
	return PoliceAction{}, fmt.Errorf("expected pass, drop or remark:<DSCP> (like remark:AF12 or remark:10), found %q", s)
}

// validatePolice resolves rates against parent (for percentages) and
// checks the meter's parameters.
func validatePolice(what string, pl *Police, parent units.Rate, d *Diag) {
	what += ": police"
	if pl.CIR == nil {
		d.Errorf(pl.Pos, "%s: cir is required (the committed rate, like 20mbit)", what)
		return
	}
	if pl.CIR.Percent > 0 && parent == 0 {
		d.Errorf(pl.CIR.Pos, "%s: cir must be absolute here (like 20mbit)", what)
		return
	}
	pl.CIRBps = pl.CIR.Resolve(parent)
	if pl.CIRBps == 0 {
		d.Errorf(pl.CIR.Pos, "%s: cir comes to less than 1 byte/s", what)
		return
	}
	// Default committed burst: 10 ms at cir, at least two full frames.
	pl.CBSBytes = max(pl.CIRBps.BytesIn(10*time.Millisecond), 3028)
	if pl.CBS != nil {
		pl.CBSBytes = pl.CBS.Bytes
	}
	const maxBurst = 1 << 30
	checkBurst := func(s *Size, name string) {
		if s != nil && (s.Bytes == 0 || s.Bytes > maxBurst) {
			d.Errorf(s.Pos, "%s.%s: must be between 1 byte and 1gb", what, name)
		}
	}
	checkBurst(pl.CBS, "cbs")
	checkBurst(pl.PBS, "pbs")
	if pl.EBS != nil && pl.EBS.Bytes > maxBurst {
		d.Errorf(pl.EBS.Pos, "%s.ebs: must be at most 1gb", what)
	}
	if pl.CBS != nil && pl.CBSBytes < 1514 {
		d.Warnf(pl.CBS.Pos, "%s.cbs: %d bytes is below one full-size frame: such packets are never green", what, pl.CBSBytes)
	}
	if pl.TwoRate() {
		if pl.EBS != nil {
			d.Errorf(pl.EBS.Pos, "%s: ebs belongs to the single-rate meter (cir, cbs, ebs); with pir use pbs", what)
		}
		if pl.PIR.Percent > 0 && parent == 0 {
			d.Errorf(pl.PIR.Pos, "%s: pir must be absolute here", what)
			return
		}
		pl.PIRBps = pl.PIR.Resolve(parent)
		if pl.PIRBps < pl.CIRBps {
			d.Errorf(pl.PIR.Pos, "%s: pir %s is below cir %s (RFC 2698 needs PIR >= CIR)", what, pl.PIRBps.String(), pl.CIRBps.String())
		}
		pl.PBSBytes = max(pl.PIRBps.BytesIn(10*time.Millisecond), pl.CBSBytes)
		if pl.PBS != nil {
			pl.PBSBytes = pl.PBS.Bytes
		}
		if pl.PBSBytes < pl.CBSBytes {
			d.Warnf(pl.PBS.Pos, "%s.pbs: %d bytes is below cbs %d: no packet larger than pbs is ever green or yellow", what, pl.PBSBytes, pl.CBSBytes)
		}
	} else {
		if pl.PBS != nil {
			d.Errorf(pl.PBS.Pos, "%s: pbs belongs to the two-rate meter; give pir too, or use ebs", what)
		}
		if pl.EBS != nil {
			pl.EBSBytes = pl.EBS.Bytes
		}
	}
}
