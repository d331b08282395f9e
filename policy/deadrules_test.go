package policy

import (
	"strings"
	"testing"
)

// Rules no packet can reach are warnings that name both lines; rules
// that overlap without being covered, or come first, are not.
func TestDeadRuleWarnings(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       []string // warnings, as substrings; none: no warning
	}{
		{"the same rule twice", `
        - {name: voip, rate: 2mbit, match: [{proto: udp, dport: 5060}]}
        - {name: sip, rate: 1mbit, match: [{proto: udp, dport: 5060}]}
        - {name: bulk, rate: 1mbit}`,
			[]string{"class sip: the rule at line 8 can never match: class voip's rule at line 7 takes every packet it matches first (first match wins); no rule of class sip can match, so it gets no traffic"}},
		{"a prefix before per-host classes of it", `
        - {name: lan, rate: 2mbit, match: [{dst: 192.168.1.0/24}]}
        - name: users
          rate: 1mbit
          match: [{dst: 192.168.1.0/24}]
          per_host: {cidr: 192.168.1.0/24, rate: 10kbit}
        - {name: bulk, rate: 1mbit}`,
			[]string{"class users: the rule at line 10 can never match: class lan's rule at line 7"}},
		{"narrower first", `
        - {name: voip, rate: 2mbit, match: [{proto: udp, dport: 5060}]}
        - {name: udp, rate: 1mbit, match: [{proto: udp}]}
        - {name: bulk, rate: 1mbit}`, nil},
		{"overlapping, not covered", `
        - {name: a, rate: 2mbit, match: [{proto: tcp, dport: 1000-2000}]}
        - {name: b, rate: 1mbit, match: [{proto: tcp, dport: 1500-2500}]}
        - {name: bulk, rate: 1mbit}`, nil},
		{"IPv6 hosts behind an IPv4 rule", `
        - name: users
          rate: 1mbit
          match: [{dst: 198.51.100.0/25}]
          per_host: {by: src, cidr: "2001:db8:103::/56", prefix: 60, rate: 10kbit}
        - {name: bulk, rate: 1mbit}`,
			[]string{"its hosts (cidr 2001:db8:103::/56) are IPv6 and every rule of the class matches IPv4 alone: no packet reaches a host"}},
		{"hosts of both families", `
        - name: users
          rate: 1mbit
          match: [{dst: 198.51.100.0/25}, {dst: "2001:db8:103::/56"}]
          per_host: {by: dst, cidr: "2001:db8:103::/56", prefix: 60, rate: 10kbit}
        - {name: bulk, rate: 1mbit}`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n      default: bulk\n      classes:" + c.body + "\n"
			_, warns, err := Parse("p.yaml", []byte(src))
			if err != nil {
				t.Fatalf("%v\n%s", err, src)
			}
			var got []string
			for _, w := range warns {
				got = append(got, w.Error())
			}
			all := strings.Join(got, "\n")
			for _, w := range c.want {
				if !strings.Contains(all, w) {
					t.Errorf("no warning %q in:\n%s", w, all)
				}
			}
			if len(c.want) == 0 && len(got) > 0 {
				t.Errorf("warnings where none is due:\n%s", all)
			}
		})
	}
}
