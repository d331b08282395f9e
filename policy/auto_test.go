package policy

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sluice/units"
)

func autoSrc(auto, classes string) string {
	return "interfaces:\n  - name: eth0\n    egress:\n      rate: auto\n" + auto + "      default: bulk\n      classes:\n" + classes +
		"        - name: bulk\n          rate: 50%\n"
}

const autoBlock = "      auto: {min: 5mbit, base: 20mbit, max: 80mbit}\n"

func TestAutoParses(t *testing.T) {
	src := autoSrc("      auto:\n        min: 5mbit\n        base: 20mbit\n        max: 80mbit\n        reflectors: [192.0.2.1, 192.0.2.2]\n        delay_threshold: 15ms\n        probe: timestamp\n",
		"        - name: voip\n          rate: 1mbit\n          ceil: 50%\n")
	p, warns, err := Parse("p.yaml", []byte(src))
	if err != nil || len(warns) > 0 {
		t.Fatalf("%v %v", warns, err)
	}
	tr := p.Interfaces[0].Egress
	a := tr.Auto
	if !tr.IsAuto() || a == nil {
		t.Fatalf("rate: auto not read: %+v", tr.Rate)
	}
	mb := func(x float64) units.Rate { return units.FromBits(x * 1e6) }
	if a.MinBps != mb(5) || a.BaseBps != mb(20) || a.MaxBps != mb(80) || tr.RateBps != mb(20) {
		t.Errorf("min %d base %d max %d rate %d", a.MinBps, a.BaseBps, a.MaxBps, tr.RateBps)
	}
	want := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}
	if !slices.Equal(a.Reflectors, want) || a.DelayThreshold != 15*time.Millisecond || a.Probe != "timestamp" {
		t.Errorf("reflectors %v threshold %v probe %q", a.Reflectors, a.DelayThreshold, a.Probe)
	}
	// The classes resolve at the base.
	if voip := tr.Classes[0]; voip.RateBps != mb(1) || voip.CeilBps != mb(10) || tr.Classes[1].RateBps != mb(10) {
		t.Errorf("voip %d/%d bulk %d", voip.RateBps, voip.CeilBps, tr.Classes[1].RateBps)
	}

	// Defaults.
	p, _, err = Parse("p.yaml", []byte(autoSrc(autoBlock, "")))
	if err != nil {
		t.Fatal(err)
	}
	a = p.Interfaces[0].Egress.Auto
	if !slices.Equal(a.Reflectors, DefaultReflectors) || a.DelayThreshold != 0 || a.Probe != "echo" {
		t.Errorf("defaults: reflectors %v threshold %v (want 0: auto) probe %q", a.Reflectors, a.DelayThreshold, a.Probe)
	}
	// delay_threshold: auto is the default, written out.
	p, _, err = Parse("p.yaml", []byte(autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, delay_threshold: auto}\n", "")))
	if err != nil {
		t.Fatal(err)
	}
	if a := p.Interfaces[0].Egress.Auto; a.DelayThreshold != 0 || a.DelayThresholdPos.Line != 5 {
		t.Errorf("delay_threshold: auto read as %v at %v", a.DelayThreshold, a.DelayThresholdPos)
	}
}

func TestAutoErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"auto without settings", autoSrc("", ""), `:4:13: eth0 egress: rate: auto needs auto: {min, base, max}`},
		{"settings without auto",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n" + autoBlock,
			`:5:13: eth0 egress: auto: is the settings of rate: auto, and this direction's rate is 20mbit`},
		{"min missing", autoSrc("      auto: {base: 20mbit, max: 80mbit}\n", ""), `eth0 egress: auto: min is required (like 5mbit)`},
		{"percent bound", autoSrc("      auto: {min: 10%, base: 20mbit, max: 80mbit}\n", ""), `:5:19: eth0 egress: auto: min must be absolute`},
		{"order", autoSrc("      auto: {min: 30mbit, base: 20mbit, max: 80mbit}\n", ""),
			`:5:13: eth0 egress: auto: want min <= base <= max, found min 30mbit, base 20mbit, max 80mbit`},
		{"ipv6 reflector", autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, reflectors: [2001:db8::1]}\n", ""),
			`reflectors: 2001:db8::1: IPv4 addresses only`},
		{"bad reflector", autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, reflectors: [one.one]}\n", ""),
			`reflectors: "one.one" is not an IP address`},
		{"twice", autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, reflectors: [192.0.2.1, 192.0.2.1]}\n", ""),
			`reflectors: 192.0.2.1 is listed twice`},
		{"empty reflectors", autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, reflectors: []}\n", ""),
			`reflectors: empty; leave the key out for the defaults`},
		{"threshold", autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, delay_threshold: 5s}\n", ""),
			`delay_threshold: expected auto or a time from 1ms to 1s`},
		{"threshold word", autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, delay_threshold: automatic}\n", ""),
			`:5:70: egress auto: delay_threshold: expected auto or a time from 1ms to 1s (like 10ms), found "automatic"`},
		{"probe", autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, probe: tcp}\n", ""), `probe: expected echo or timestamp, found "tcp"`},
		{"unknown key", autoSrc("      auto: {min: 5mbit, base: 20mbit, max: 80mbit, maximum: 1}\n", ""), `unknown key "maximum"`},
		{"guarantees above min", autoSrc(autoBlock, "        - name: voip\n          rate: 4mbit\n"),
			`:5:19: eth0 egress: at auto's min 5mbit, children's rates add up to 6.5mbit, above the egress rate (5mbit): absolute rates do not follow rate: auto; lower them, use percentages, or raise min: voip 4mbit, bulk 2.5mbit`},
		{"sharing", autoSrc(autoBlock+"      sharing: controller\n", ""), `sharing: controller with rate: auto is not supported yet`},
		{"percent police", autoSrc(autoBlock+"      classifier: bpf\n", "        - name: p\n          rate: 1mbit\n          police: {cir: 10%}\n"),
			`class p: police: with rate: auto, cir and pir must be absolute`},
		{"percent direction rate", "interfaces:\n  - name: eth0\n    egress:\n      rate: 50%\n",
			`rate must be absolute (like 19mbit) or auto`},
		{"auto on police", "interfaces:\n  - name: eth0\n    ingress:\n      police: {cir: 1mbit}\n" + autoBlock, `police directly under ingress polices without a tree`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse("p.yaml", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
		})
	}
}

// AtRate at the tree's own rate resolves every rate as validation did:
// the re-resolution and validation agree. At another rate percentages
// follow and absolute rates stay, and the tree itself is untouched.
func TestAtRate(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts.csv")
	if err := os.WriteFile(hosts, []byte("name,addresses,rate,ceil,parent\nann,10.0.1.2,10%,50%,\nbob,10.0.1.3,300kbit,2mbit,guests\ncat,10.0.1.4,,,\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ll := range []string{"ethernet", "ptm"} {
		src := "interfaces:\n  - name: eth0\n    egress:\n      rate: auto\n      linklayer: " + ll + "\n" + autoBlock + "      classifier: bpf\n      default: bulk\n      classes:\n" +
			"        - name: voip\n          rate: 1mbit\n          ceil: 50%\n" +
			"        - name: subs\n          rate: 40%\n          per_host: {cidr: 10.0.0.0/29, rate: 5%, hosts_file: hosts.csv}\n" +
			"        - name: guests\n          rate: 10%\n          ceil: 3mbit\n" +
			"        - name: nest\n          rate: 10%\n          classes:\n            - name: n1\n              rate: 50%\n            - name: n2\n              rate: 100kbit\n              ceil: 80%\n" +
			"        - name: many\n          rate: 5%\n          per_host: {cidr: 10.0.2.0/30}\n        - name: bulk\n          rate: 5%\n"
		file := filepath.Join(dir, "p.yaml")
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		p, _, err := Load(file)
		if err != nil {
			t.Fatal(err)
		}
		tr := p.Interfaces[0].Egress
		type val struct {
			name       string
			rate, ceil units.Rate
		}
		values := func(tr *Tree) []val {
			var out []val
			var walk func(cs []*Class)
			walk = func(cs []*Class) {
				for _, c := range cs {
					out = append(out, val{c.Name, c.RateBps, c.CeilBps})
					if ph := c.PerHost; ph != nil {
						out = append(out, val{c.Name + "/*", ph.RateBps, ph.CeilBps})
						for _, e := range ph.Entries {
							out = append(out, val{e.ClassName + "@" + e.ParentCls.Name, e.RateBps, e.CeilBps})
						}
					}
					for _, e := range c.Hosts {
						out = append(out, val{"hung " + e.ClassName, e.RateBps, e.CeilBps})
					}
					walk(c.Classes)
				}
			}
			walk(tr.Classes)
			return out
		}
		before := values(tr)
		if got := values(tr.AtRate(tr.RateBps + 1)); len(got) != len(before) {
			t.Fatalf("%s: %d values, want %d", ll, len(got), len(before))
		}
		cp := tr.AtRate(tr.RateBps)
		if ll == "ethernet" && !slices.Equal(values(cp), before) {
			t.Errorf("%s: at its own rate:\n%v\nvalidated:\n%v", ll, values(cp), before)
		}
		for i, v := range values(cp) {
			if d := int64(v.rate) - int64(before[i].rate); d < -1 || d > 1 || v.ceil-before[i].ceil > 1 || before[i].ceil-v.ceil > 1 {
				t.Errorf("%s: %s at its own rate %d/%d, validated %d/%d", ll, v.name, v.rate, v.ceil, before[i].rate, before[i].ceil)
			}
		}
		half := tr.AtRate(tr.RateBps / 2)
		if !slices.Equal(values(tr), before) {
			t.Fatalf("%s: AtRate changed the tree", ll)
		}
		if half.Classes[0] == tr.Classes[0] || half.Classes[1].PerHost == tr.Classes[1].PerHost ||
			half.Classes[1].PerHost.Entries[0] == tr.Classes[1].PerHost.Entries[0] {
			t.Fatalf("%s: the copy shares classes or hosts with the tree", ll)
		}
		got := map[string]val{}
		for _, v := range values(half) {
			got[v.name] = v
		}
		old := map[string]val{}
		for _, v := range before {
			old[v.name] = v
		}
		near := func(a, b units.Rate) bool { return a-b <= 1 || b-a <= 1 }
		for name, want := range map[string][2]units.Rate{
			// absolute rate stays; percentage ceil halves
			"voip": {old["voip"].rate, old["voip"].ceil / 2},
			// percentages of percentages follow
			"subs":   {old["subs"].rate / 2, old["subs"].ceil / 2},
			"subs/*": {old["subs/*"].rate / 2, old["subs/*"].ceil / 2},
			"n1":     {old["n1"].rate / 2, old["n1"].ceil / 2},
			// an absolute rate under a percentage parent stays; its
			// percentage ceil follows
			"n2":              {old["n2"].rate, old["n2"].ceil / 2},
			"guests":          {old["guests"].rate / 2, old["guests"].ceil},
			"many/*":          {old["many/*"].rate / 2, old["many/*"].ceil / 2},
			"subs/ann@subs":   {old["subs/ann@subs"].rate / 2, old["subs/ann@subs"].ceil / 2},
			"subs/bob@guests": {old["subs/bob@guests"].rate, old["subs/bob@guests"].ceil},
			"subs/cat@subs":   {old["subs/cat@subs"].rate / 2, old["subs/cat@subs"].ceil / 2},
		} {
			g, ok := got[name]
			if !ok || !near(g.rate, want[0]) || !near(g.ceil, want[1]) {
				t.Errorf("%s: %s at half the rate: %d/%d, want %d/%d", ll, name, g.rate, g.ceil, want[0], want[1])
			}
		}
		// The copy's hosts hang below the copy's classes.
		for _, e := range half.Classes[1].PerHost.Entries {
			if e.Owner != half.Classes[1] || (e.ParentCls != half.Classes[1] && e.ParentCls != half.Classes[2]) {
				t.Errorf("%s: entry %s still points into the tree", ll, e.Name)
			}
		}
		if len(half.Classes[2].Hosts) != 1 || half.Classes[2].Hosts[0] != half.Classes[1].PerHost.Entries[1] {
			t.Errorf("%s: the hung host is not the copy's entry", ll)
		}
		if half.Classes[3].Classes[0].Parent != half.Classes[3] {
			t.Errorf("%s: a nested class's parent is the tree's", ll)
		}
	}
}
