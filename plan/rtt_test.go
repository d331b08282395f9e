package plan

import (
	"strings"
	"testing"

	"sluice/bpf"
	"sluice/policy"
)

// rttHooks plans src and returns its BPF hooks by site ("dev/egress").
func rttHooks(t *testing.T, src string, feats Features) (*Plan, map[string]*bpf.Hook) {
	t.Helper()
	p, _, err := policy.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := Build(p, feats, nil)
	if err != nil {
		t.Fatal(err)
	}
	hooks := map[string]*bpf.Hook{}
	for _, o := range pl.Objects() {
		if h, ok := o.(*bpf.Hook); ok {
			site := h.Dev + "/" + h.Direction()
			if hooks[site] != nil {
				t.Fatalf("two hooks on %s", site)
			}
			hooks[site] = h
		}
	}
	return pl, hooks
}

const rttTrees = `interfaces:
  - name: eth0
    rtt: {flows: 4096}
%s`

const rttEgress = `    egress:
      rate: 10mbit
      default: bulk
      classes:
        - {name: voip, rate: 1mbit, match: [{dport: 5060}]}
        - name: users
          rate: 4mbit
          per_host: {by: src, cidr: 10.0.0.0/30, rate: 1mbit}
        - {name: bulk, rate: 5mbit}
`

const rttIngress = `    ingress:
      rate: 20mbit
      default: down
      classes:
        - {name: down, rate: 20mbit}
`

// Each tree's packets start samples where they are classified, and end
// on the interface's hook the other way; every hook of the interface
// names the others, to share their maps.
func TestRTTHooks(t *testing.T) {
	for _, tc := range []struct {
		name, trees string
		want        map[string]string // site: what the hook does
	}{
		{"egress", rttEgress, map[string]string{"eth0/egress": "record observe", "eth0/ingress": "echo observe"}},
		{"ingress", rttIngress, map[string]string{"ifb-eth0/egress": "record observe", "eth0/egress": "echo observe"}},
		{"both", rttEgress + rttIngress, map[string]string{"eth0/egress": "record echo observe", "ifb-eth0/egress": "record echo observe"}},
		{"egress bpf", strings.Replace(rttEgress, "      default: bulk\n", "      default: bulk\n      classifier: bpf\n", 1),
			map[string]string{"eth0/egress": "record", "eth0/ingress": "echo observe"}},
		{"policed ingress", rttEgress + "    ingress:\n      police: {cir: 5mbit, cbs: 10kb}\n",
			map[string]string{"eth0/egress": "record observe", "eth0/ingress": "echo"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, hooks := rttHooks(t, strings.Replace(rttTrees, "%s", tc.trees, 1), Everything)
			if len(hooks) != len(tc.want) {
				t.Fatalf("hooks %v, want %v", keys(hooks), tc.want)
			}
			for site, want := range tc.want {
				h := hooks[site]
				if h == nil || h.Content.RTT == nil {
					t.Fatalf("%s: no round trips", site)
				}
				r := h.Content.RTT
				var got []string
				for _, f := range []struct {
					on   bool
					name string
				}{{r.Record, "record"}, {r.Echo, "echo"}, {r.Observe, "observe"}} {
					if f.on {
						got = append(got, f.name)
					}
				}
				if strings.Join(got, " ") != want {
					t.Errorf("%s: %v, want %s", site, got, want)
				}
				if r.Flows != 4096 {
					t.Errorf("%s: flows %d", site, r.Flows)
				}
				if r.Observe && r.Record && h.Content.SetPriority {
					t.Errorf("%s: an observing classifier sets skb->priority", site)
				}
				if len(h.Siblings) != len(tc.want)-1 {
					t.Errorf("%s: siblings %v", site, h.Siblings)
				}
			}
		})
	}
}

// Classes number their histograms in policy order, an ingress tree's
// from the second half; a host counts in its per_host class's; plan and
// records say which (ClassInfo.RTT, + 1).
func TestRTTIndexes(t *testing.T) {
	pl, hooks := rttHooks(t, strings.Replace(rttTrees, "%s", rttEgress+rttIngress, 1), Everything)
	eg := hooks["eth0/egress"].Content
	byClassid := map[uint32]uint32{}
	for _, tg := range eg.Targets {
		byClassid[tg.Classid] = tg.Rtt
	}
	want := map[string]uint32{"voip": 1, "users": 2, "bulk": 3, "down": RTTIngressBase + 1}
	for _, d := range pl.Devices {
		for _, c := range d.Classes {
			w, named := want[c.Name]
			switch {
			case named && c.RTT != w+1:
				t.Errorf("%s: RTT %d, want %d", c.Name, c.RTT, w+1)
			case !named && c.RTT != 0:
				t.Errorf("%s (a host or the root): RTT %d, want none of its own", c.Name, c.RTT)
			}
			if d.Dir == policy.Egress && named && c.Handle != 0 {
				if got, ok := byClassid[uint32(c.Handle)]; ok && got != w {
					t.Errorf("%s: target's histogram %d, want %d", c.Name, got, w)
				}
			}
		}
	}
	// The per_host class's hosts (host classes of HTB, in the observing
	// classifier's host table) count in users'.
	n := 0
	for _, tg := range eg.Hosts {
		n++
		if tg.Rtt != 2 {
			t.Errorf("host target %+v: histogram %d, want users' 2", tg, tg.Rtt)
		}
	}
	if n == 0 {
		t.Error("no host targets")
	}
}

func TestRTTNeedsBPF(t *testing.T) {
	p, _, err := policy.Parse("p.yaml", []byte(strings.Replace(rttTrees, "%s", rttEgress, 1)))
	if err != nil {
		t.Fatal(err)
	}
	feats := Everything
	feats.BPF = false
	if _, err := Build(p, feats, nil); err == nil || !strings.Contains(err.Error(), "p.yaml:3:10: eth0: rtt needs the BPF classifier") || strings.Count(err.Error(), "rtt needs") != 1 {
		t.Errorf("error %v", err)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
