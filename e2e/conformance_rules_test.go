package e2e

import (
	"context"
	"strings"
	"testing"

	"sluice/conform"
	"sluice/testutil"
)

// Policies as users write them, not as the matrix's shapes are: classes
// that only UDP, a DSCP, a firewall mark, small pure ACKs, IPv6 or a
// source port reach, a VoIP office whose one class is UDP (issue 57: its
// reference once read 0 bit/s and every cell failed), and a LAN-to-LAN
// class behind a `not_src: LAN` rule (once unreachable from the bed's own
// addresses). Every subject must be driven by traffic its own rules
// select, land in its class, and get its reference share.
const ruleKindsPolicy = `interfaces:
  - name: wan0
    egress:
      rate: 10mbit
      default: bulk
      classes:
        - name: voip
          rate: 2mbit
          match:
            - {proto: udp, dport: 5060}
        - name: bulk
          rate: 8mbit
  - name: k0
    egress:
      rate: 20mbit
      default: rest
      classes:
        - {name: udp-only, rate: 2mbit, match: [{proto: udp}]}
        - {name: dscp-only, rate: 3mbit, match: [{dscp: AF41}]}
        - {name: mark-only, rate: 3mbit, match: [{mark: 7}]}
        - {name: acks-only, rate: 1mbit, prio: 0, match: [{tcp_ack: true}]}
        - {name: syns-only, rate: 1mbit, prio: 0, match: [{tcp_syn: true}]}
        - {name: v6-only, rate: 3mbit, match: [{src: 2001:db8:77::/48}]}
        - {name: sport-only, rate: 2mbit, match: [{sport: 25}]}
        - {name: rest, rate: 5mbit}
  - name: lan0
    egress:
      rate: 40mbit
      default: local
      classes:
        - name: internet
          rate: 24mbit
          match: [{not_src: 192.168.7.0/24}]
          per_host: {by: dst, cidr: 192.168.7.0/28, rate: 2mbit, ceil: 24mbit}
        - name: local
          rate: 16mbit
          match: [{src: 192.168.7.0/24}]
`

func TestConformanceDrivesEveryRuleKind(t *testing.T) {
	testutil.Slow(t)
	testutil.RequireRoot(t)
	testutil.Quiet(t)
	file := writePolicy(t, "kinds.yaml", ruleKindsPolicy)
	pol, err := conform.LoadPolicy(file, "")
	if err != nil {
		t.Fatal(err)
	}
	settle, measure := matrixTiming()
	// wan0 runs its automatic cells (the command's own); k0 each kind
	// beside the default class and all at once; lan0 two hosts and the
	// LAN class.
	cells := func(tree string, ss []*conform.Subject) []conform.Cell {
		if tree == "wan0/egress" {
			return nil
		}
		link := 20e6 * matrixScale()
		if tree == "lan0/egress" {
			link = 40e6 * matrixScale()
		}
		var all []conform.Demand
		for _, s := range ss {
			all = append(all, conform.GreedyDemand(s, 1, link))
		}
		out := []conform.Cell{{Name: "all", Demands: all}}
		last := all[len(all)-1]
		for _, d := range all[:len(all)-1] {
			if tree == "lan0/egress" && len(out) > 2 {
				break
			}
			out = append(out, conform.Cell{Name: d.Subject + " + " + last.Subject, Demands: []conform.Demand{d, last}})
		}
		return out
	}
	r, err := conform.Run(context.Background(), pol, conform.Options{
		Name: strings.TrimPrefix(testutil.Unique("ck"), testutil.Prefix), Scale: matrixScale(), Hosts: 3, RTT: conform.DefaultRTT,
		Settle: settle, Measure: measure,
		Cells: cells,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r.WriteText(&out, false)
	t.Logf("\n%s", out.String())
	kinds := map[string]string{"voip": "udp", "udp-only": "udp", "acks-only": "ack", "syns-only": "syn", "mark-only": "tcp", "dscp-only": "tcp", "v6-only": "tcp", "sport-only": "tcp", "local": "tcp"}
	for _, tr := range r.Trees {
		if tr.Skipped != "" {
			t.Errorf("%s: skipped: %s", tr.Name(), tr.Skipped)
			continue
		}
		if tr.Efficiency < 0.85 {
			t.Errorf("%s: a plain limit carried %.0f%% of its rate: the reference was not measured with traffic the tree carries", tr.Name(), 100*tr.Efficiency)
		}
		for _, s := range tr.Subjects {
			if s.NotDriven != "" || len(s.Misplaced) > 0 {
				t.Errorf("%s: %s: not driven %q, misplaced %q", tr.Name(), s.Name, s.NotDriven, s.Misplaced)
				continue
			}
			f := s.Flows[0]
			if want, ok := kinds[s.Name]; ok && f.Proto != want {
				t.Errorf("%s: driven by %s, want %s", s.Name, f.Proto, want)
			}
			switch s.Name {
			case "dscp-only":
				if f.DSCP != 34 {
					t.Errorf("dscp-only: DSCP %d", f.DSCP)
				}
			case "mark-only":
				if f.Mark != 7 {
					t.Errorf("mark-only: mark %d", f.Mark)
				}
			case "v6-only":
				if !f.Src.Addr().Is6() {
					t.Errorf("v6-only: %v", f.Src)
				}
			case "sport-only":
				if f.Src.Port() != 25 {
					t.Errorf("sport-only: %v", f.Src)
				}
			case "local":
				if !strings.HasPrefix(f.Src.Addr().String(), "192.168.7.") {
					t.Errorf("local: from %v, not from the LAN its rule names", f.Src)
				}
			}
		}
		for _, c := range tr.Cells {
			if !c.Verdict.Pass {
				t.Errorf("%s: %s: %s", tr.Name(), c.Name, c.Verdict.Why)
			}
			for _, s := range c.Verdict.Subjects {
				if s.MeasuredShare > 1.0001 || s.IdealShare > 1.0001 {
					t.Errorf("%s: %s: %s: a share over 100%%: %+v", tr.Name(), c.Name, s.Name, s)
				}
			}
		}
	}
	if len(r.Trees) != 3 || r.Measured() == 0 || !r.Pass || len(r.Undriven()) > 0 {
		t.Errorf("%d trees, %d cells measured, pass %v, undriven %v", len(r.Trees), r.Measured(), r.Pass, r.Undriven())
	}
}
