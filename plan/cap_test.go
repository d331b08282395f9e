package plan

import (
	"testing"

	"sluice/bpf"
	"sluice/tc"
)

// A sharing's cap is a class: the children its controller limits hang
// under "(cap)" (or "OWNER/(cap)" for a class's sharing) whose ceil is
// the cap; prod stays beside it; no cap, or an EDT tree, makes none.
func TestCapClass(t *testing.T) {
	for _, tt := range []struct {
		name, policy string
		// want: class -> its parent's name ("" for the tree's own class)
		want map[string]string
		cap  map[string]float64 // cap class -> ceil, bits/s
	}{
		{"direction's cap, prod beside it", `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: b
      sharing: {mode: controller, cap: 80%}
      classes:
        - {name: prod, rate: 3mbit, prio: 0}
        - {name: a, rate: 1mbit, prio: 1}
        - {name: b, rate: 2mbit, prio: 1}
`, map[string]string{"prod": RootClassName, "a": "(cap)", "b": "(cap)", "(cap)": RootClassName}, map[string]float64{"(cap)": 24e6}},
		{"a class's cap, a rate, one prio (no prod)", `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: x
      classes:
        - name: tenants
          rate: 10mbit
          ceil: 20mbit
          sharing: {mode: controller, cap: 12mbit}
          classes:
            - {name: x, rate: 1mbit}
            - {name: y, rate: 1mbit}
        - {name: other, rate: 1mbit}
`, map[string]string{"x": "tenants/(cap)", "y": "tenants/(cap)", "tenants/(cap)": "tenants", "tenants": RootClassName, "other": RootClassName}, map[string]float64{"tenants/(cap)": 12e6}},
		{"no cap", `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      default: b
      sharing: controller
      classes:
        - {name: a, rate: 1mbit}
        - {name: b, rate: 2mbit}
`, map[string]string{"a": RootClassName, "b": RootClassName}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := firstDevice(t, tt.policy)
			name := map[tc.Handle]string{RootClassID: RootClassName}
			for _, ci := range d.Classes {
				name[ci.Handle] = ci.Name
			}
			got := map[string]string{}
			for _, ci := range d.Classes {
				got[ci.Name] = name[ci.Parent]
				if want, ok := tt.cap[ci.Name]; ok && ci.Ceil.BitsFloat() != want {
					t.Errorf("%s: ceil %v, want %v bit/s", ci.Name, ci.Ceil.BitsFloat(), want)
				}
			}
			for c, parent := range tt.want {
				if got[c] != parent {
					t.Errorf("%s under %q, want %q (all: %v)", c, got[c], parent, got)
				}
			}
			for c := range got {
				if _, ok := tt.want[c]; !ok {
					t.Errorf("unexpected class %s", c)
				}
			}
			// The tc objects agree with the class list.
			for _, o := range d.Objects {
				if cl, ok := o.(*tc.Class); ok && cl.Name != RootClassName && name[cl.Parent] != tt.want[cl.Name] {
					t.Errorf("tc class %s has parent %s", cl.Name, cl.Parent)
				}
			}
		})
	}
	// An EDT tree's cap is an aggregate: the nonprod classes' targets take
	// a slot on its clock (Group), prod's do not.
	d := firstDevice(t, `interfaces:
  - name: eth0
    egress:
      rate: 30mbit
      backend: edt
      default: b
      sharing: {mode: controller, cap: 80%}
      classes:
        - {name: prod, rate: 3mbit, ceil: 30mbit, prio: 0, match: [{dport: 53}]}
        - {name: a, rate: 1mbit, ceil: 30mbit, prio: 1, match: [{dport: 80}]}
        - {name: b, rate: 2mbit, ceil: 30mbit, prio: 1}
`)
	counter := map[string]uint32{}
	for _, ci := range d.Classes {
		counter[ci.Name] = ci.Counter
	}
	var hook *bpf.Hook
	for _, o := range d.Objects {
		if h, ok := o.(*bpf.Hook); ok {
			hook = h
		}
	}
	if hook == nil || counter["(cap)"] == 0 {
		t.Fatalf("no hook, or no (cap) aggregate: %+v", d.Classes)
	}
	group := map[string]uint32{}
	var capAt uint32
	for i, tg := range hook.Content.Targets {
		for name, n := range counter {
			if n != 0 && tg.Counter == n {
				group[name] = tg.Group
				if name == "(cap)" {
					capAt = uint32(i) + 1
					if tg.Rate.BitsFloat() != 24e6 {
						t.Errorf("(cap) paced at %v bit/s, want 24e6", tg.Rate.BitsFloat())
					}
				}
			}
		}
	}
	if group["a"] != capAt || group["b"] != capAt || group["prod"] != 0 || capAt == 0 {
		t.Errorf("groups %v, want a and b on the (cap) aggregate (%d), prod on none", group, capAt)
	}
}

// firstDevice plans src for a kernel with everything and returns its
// first device.
func firstDevice(t *testing.T, src string) *Device {
	t.Helper()
	pl, err := Build(parseEDT(t, src), Everything, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pl.Devices[0]
}
