package policy

import (
	"sluice/units"

	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Fuzz targets: `go test -fuzz=FuzzParse ./policy` (CI runs each for a
// bounded time; testdata/fuzz holds the committed corpus, where a
// failing input found by fuzzing is also written).

// FuzzParse: any bytes give a policy or located errors, never a panic;
// a policy that parses satisfies what the planner relies on.
func FuzzParse(f *testing.F) {
	// The files the agent writes (pod_veths') are none here.
	f.Setenv("SLUICE_STATE_DIR", f.TempDir())
	examples, _ := filepath.Glob("../examples/*.yaml")
	for _, e := range examples {
		if b, err := os.ReadFile(e); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(wrap("        - name: a\n          rate: 1mbit\n          match:\n            - dport: []\n")))
	f.Add([]byte("interfaces:\n  - name: eth0\n    egress: {rate: 1mbit}\n---\ninterfaces: []\n"))
	f.Add([]byte("# nothing\n"))
	f.Add([]byte("interfaces:\n  - name: eth0\n    egress: {rate: 18446744073709551615bit}\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		p, _, err := Parse("f.yaml", src)
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error without positions: %v", err)
			}
			for _, e := range es {
				if e.Pos.Line < 1 || e.Pos.Col < 1 || e.Msg == "" {
					t.Fatalf("error without a position or message: %+v", e)
				}
			}
			return
		}
		if len(p.Interfaces) == 0 && p.PodVeths == nil {
			t.Fatal("a valid policy without interfaces or pod_veths")
		}
		for _, in := range p.Interfaces {
			if why := ifNameProblem(in.Name); why != "" {
				t.Fatalf("interface %q: %s", in.Name, why)
			}
			for _, tr := range []*Tree{in.Egress, in.Ingress} {
				if tr == nil || tr.Police != nil {
					continue
				}
				if tr.RateBps == 0 || tr.RateBps > MaxRateBps {
					t.Fatalf("tree rate %d", tr.RateBps)
				}
				checkClasses(t, tr, tr.Classes, tr.RateBps)
			}
		}
	})
}

func checkClasses(t *testing.T, tr *Tree, cs []*Class, parentRate units.Rate) {
	var sum units.Rate
	for _, c := range cs {
		if !validName(c.Name) || c.RateBps == 0 || c.CeilBps < c.RateBps {
			t.Fatalf("class %q: rate %d ceil %d", c.Name, c.RateBps, c.CeilBps)
		}
		for _, m := range c.Match {
			if len(m.Fields) == 0 {
				t.Fatalf("class %s: an empty match entry", c.Name)
			}
			for f := range m.Fields {
				empty := f == "src" && len(m.Src) == 0 || f == "dst" && len(m.Dst) == 0 ||
					f == "sport" && len(m.Sport) == 0 || f == "dport" && len(m.Dport) == 0 ||
					f == "proto" && len(m.Proto) == 0 || f == "dscp" && len(m.DSCP) == 0
				if empty {
					t.Fatalf("class %s: match field %s given but empty (would match everything)", c.Name, f)
				}
			}
		}
		sum += c.RateBps
		checkClasses(t, tr, c.Classes, c.RateBps)
	}
	if sum > parentRate {
		t.Fatalf("children's rates %d above their parent's %d", sum, parentRate)
	}
}

// FuzzHostsCSV: a hosts file gives entries or errors at its lines,
// never a panic; entries have valid names, addresses, no duplicates.
func FuzzHostsCSV(f *testing.F) {
	if b, err := os.ReadFile("../examples/isp-hosts.csv"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("name,addresses,rate,ceil\nal\"ice,10.1.0.1,,\n"))
	f.Add([]byte("\xef\xbb\xbfname,addresses,rate,ceil,parent\nbob,10.1.0.2 2001:db8::/64,2mbit,10mbit,gold\n"))
	f.Add([]byte("name,addresses,rate,ceil\n# comment\nx,10.0.0.0/24,50%,\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &parser{d: &Diag{File: "p.yaml"}}
		out := p.hostsCSV("h.csv", data, false)
		names, addrs := map[string]bool{}, map[netip.Prefix]bool{}
		for _, e := range out {
			if !validName(e.Name) || names[e.Name] || len(e.Addrs) == 0 || e.File != "h.csv" || e.Line < 2 {
				t.Fatalf("bad entry %+v", e)
			}
			names[e.Name] = true
			for _, a := range e.Addrs {
				if addrs[a] || !a.IsValid() || a.Masked() != a {
					t.Fatalf("address %v twice or not a network", a)
				}
				addrs[a] = true
			}
		}
		for _, e := range p.d.Errs {
			if e.Pos.Line < 1 || e.Pos.Col < 1 || !strings.HasPrefix(e.Msg, "hosts file") {
				t.Fatalf("error without a position: %+v", e)
			}
		}
	})
}

// FuzzUnits: rates and sizes parse to what the kernel can hold, or to a
// message naming the input.
func FuzzUnits(f *testing.F) {
	for _, s := range []string{"20mbit", "1.5gbit", "90%", "2mbps", "15kb", "18446744073709551615bit", "4000mb", "1e3kbit", ".5mbit", "1..2mbit"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if r, _, err := ParseRate(s); err == nil {
			if r.Percent == 0 && (r.Bps == 0 || r.Bps > MaxRateBps) || r.Percent < 0 || r.Percent > 100 {
				t.Fatalf("ParseRate(%q) = %+v", s, r)
			}
			if r.Percent == 0 && r.Bps.String() == "" {
				t.Fatalf("Rate(%d).String() empty", r.Bps)
			}
		} else if !strings.Contains(err.Error(), "rate") && !strings.Contains(err.Error(), "percentage") {
			t.Fatalf("ParseRate(%q): %v", s, err)
		}
		if b, err := ParseSize(s); err == nil && (b < 1 || b > 1<<32-1) {
			t.Fatalf("ParseSize(%q) = %d", s, b)
		}
	})
}
