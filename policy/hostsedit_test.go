package policy

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const editPolicy = `interfaces:
  - name: eth0
    egress:
      rate: 1gbit
      default: rest
      classes:
        - name: subs
          rate: 800mbit
          ceil: 900mbit
          per_host: {by: dst, hosts_file: hosts.csv, rate: 2mbit}
        - name: rest
          rate: 100mbit
    ingress:
      rate: 1gbit
      default: rest
      classes:
        - name: subs
          rate: 400mbit
          per_host: {by: src, hosts_file: hosts.csv, rate: 1mbit}
        - name: rest
          rate: 100mbit
`

// loadEdit writes the policy and hosts file and loads them.
func loadEdit(t *testing.T, hosts string) (*Policy, string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(editPolicy), 0o644)
	hf := filepath.Join(dir, "hosts.csv")
	os.WriteFile(hf, []byte(hosts), 0o644)
	p, _, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	return p, hf
}

// rates lists every hosts_file entry's resolved rate and ceil, by
// direction and name.
func entryRates(p *Policy) map[string][2]uint64 {
	out := map[string][2]uint64{}
	for _, in := range p.Interfaces {
		for _, tr := range []*Tree{in.Egress, in.Ingress} {
			for _, c := range tr.Classes {
				if c.PerHost == nil {
					continue
				}
				for _, e := range c.PerHost.Entries {
					out[tr.Dir+"/"+e.Name] = [2]uint64{uint64(e.RateBps), uint64(e.CeilBps)}
				}
			}
		}
	}
	return out
}

// An edit worked out line by line and applied gives the policy a full
// load of the new file gives, for random edits of rates and ceils
// (absolute, relative, empty for the default) in files with CRLF line
// ends, a missing last line end and a byte order mark.
func TestEditHostsMatchesLoad(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	rates := []string{"", "1mbit", "5mbit", "10%", "25mbit", "100mbit"}
	for round := range 200 {
		nl := "\n"
		if round%3 == 1 {
			nl = "\r\n"
		}
		bom := ""
		if round%5 == 2 {
			bom = "\xef\xbb\xbf"
		}
		n := 1 + r.IntN(40)
		lines := make([]string, n)
		row := func(i int) string {
			rate := rates[r.IntN(3)]
			ceil := rates[3+r.IntN(3)]
			return fmt.Sprintf("h%d,10.0.%d.%d fd00::%x,%s,%s", i, i/200, i%200+1, i+1, rate, ceil)
		}
		for i := range lines {
			lines[i] = row(i)
		}
		text := func() string {
			s := bom + "name,addresses,rate,ceil" + nl + strings.Join(lines, nl)
			if round%4 != 3 {
				s += nl
			}
			return s
		}
		before := text()
		p, hf := loadEdit(t, before)
		// Only the rate and ceil columns move.
		for k := 0; k < 1+r.IntN(3); k++ {
			i := r.IntN(n)
			lines[i] = row(i)
		}
		after := text()
		edits, ok, err := p.EditHosts(hf, []byte(before), []byte(after))
		if err != nil || !ok {
			t.Fatalf("round %d: ok %v err %v\n%q\n%q", round, ok, err, before, after)
		}
		for _, e := range edits {
			e.Apply()
		}
		os.WriteFile(hf, []byte(after), 0o644)
		full, _, err := Load(p.File)
		if err != nil {
			t.Fatal(err)
		}
		got, want := entryRates(p), entryRates(full)
		for k, w := range want {
			if got[k] != w {
				t.Fatalf("round %d: %s: edited %v, loaded %v\n%q\n%q", round, k, got[k], w, before, after)
			}
		}
	}
}

func TestEditHostsRefusesOrDefers(t *testing.T) {
	const base = "name,addresses,rate,ceil\na,10.0.0.1,1mbit,10mbit\n# a comment\nb,10.0.0.2 10.0.0.3,1mbit,10mbit\nc,10.0.0.4,,\n"
	for _, c := range []struct {
		name, after string
		ok          bool
		edits       int    // per direction
		err         string // a refusal, at the line
	}{
		{"nothing", base, true, 0, ""},
		{"a rate", strings.Replace(base, "a,10.0.0.1,1mbit", "a,10.0.0.1,3mbit", 1), true, 1, ""},
		{"a default taken", strings.Replace(base, "c,10.0.0.4,,", "c,10.0.0.4,5mbit,", 1), true, 1, ""},
		{"two hosts", strings.NewReplacer("a,10.0.0.1,1mbit,10mbit", "a,10.0.0.1,1mbit,20mbit", "c,10.0.0.4,,", "c,10.0.0.4,,30mbit").Replace(base), true, 2, ""},
		{"same rate, new text", strings.Replace(base, "a,10.0.0.1,1mbit", "a,10.0.0.1,1Mbit", 1), true, 1, ""},
		{"ceil below rate", strings.Replace(base, "a,10.0.0.1,1mbit,10mbit", "a,10.0.0.1,20mbit,10mbit", 1), false, 0, "hosts.csv:2:1: hosts file: host a: ceil 10mbit is below rate 20mbit"},
		{"bad rate", strings.Replace(base, "b,10.0.0.2 10.0.0.3,1mbit", "b,10.0.0.2 10.0.0.3,fast", 1), false, 0, "hosts.csv:4:"},
		{"fields", strings.Replace(base, "c,10.0.0.4,,", "c,10.0.0.4,", 1), false, 0, "hosts.csv:5:1: hosts file: 3 fields, the header has 4"},
		{"a name", strings.Replace(base, "a,10.0.0.1", "z,10.0.0.1", 1), false, 0, ""},
		{"an address", strings.Replace(base, "10.0.0.2 10.0.0.3", "10.0.0.2", 1), false, 0, ""},
		{"a line added", base + "d,10.0.0.9,,\n", false, 0, ""},
		{"a line removed", strings.Replace(base, "c,10.0.0.4,,\n", "", 1), false, 0, ""},
		{"the comment", strings.Replace(base, "# a comment", "# another", 1), false, 0, ""},
		{"the header", strings.Replace(base, "rate,ceil", "rate, ceil", 1), false, 0, ""},
		{"a quote", strings.Replace(base, "a,10.0.0.1", `"a",10.0.0.1`, 1), false, 0, ""},
		{"a parent column", strings.Replace(base, "c,10.0.0.4,,", "c,10.0.0.4,,,subs", 1), false, 0, "hosts.csv:5:1: hosts file: 5 fields, the header has 4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, hf := loadEdit(t, base)
			was := entryRates(p)
			edits, ok, err := p.EditHosts(hf, []byte(base), []byte(c.after))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || ok != c.ok || len(edits) != 2*c.edits {
				t.Fatalf("ok %v (want %v), %d edits (want %d), err %v", ok, c.ok, len(edits), 2*c.edits, err)
			}
			if got := entryRates(p); fmt.Sprint(got) != fmt.Sprint(was) {
				t.Errorf("EditHosts changed the policy: %v", got)
			}
		})
	}
}

// A policy remembers what it was read from, so that an edit is worked
// out against exactly that (not what the files hold by then).
func TestSourceIsWhatWasRead(t *testing.T) {
	const hosts = "name,addresses,rate,ceil\na,10.0.0.1,1mbit,10mbit\n"
	p, hf := loadEdit(t, hosts)
	os.WriteFile(hf, []byte(hosts+"b,10.0.0.2,,\n"), 0o644)
	if got := string(p.Source(hf)); got != hosts {
		t.Errorf("Source(hosts file) = %q, want what was read, %q", got, hosts)
	}
	if got := string(p.Source(p.File)); got != editPolicy {
		t.Errorf("Source(policy) = %q", got)
	}
	if p.Source("/nonexistent") != nil {
		t.Error("Source of a file not read is not nil")
	}
	files := p.Files()
	if len(files) != 2 || files[1] != hf {
		t.Errorf("Files() = %v, want the policy and %s", files, hf)
	}
}

// A hosts file with a prio column: a rate edit is taken in place, a
// prio edit needs a full load (a host's class changes its prio).
func TestEditHostsPrioColumn(t *testing.T) {
	const base = "name,addresses,rate,ceil,prio,parent\na,10.0.0.1,1mbit,10mbit,0,\nb,10.0.0.2,1mbit,10mbit,,\n"
	for _, c := range []struct {
		name, after string
		ok          bool
		edits       int
	}{
		{"a rate", strings.Replace(base, "a,10.0.0.1,1mbit", "a,10.0.0.1,2mbit", 1), true, 1},
		{"a prio", strings.Replace(base, "10mbit,0,", "10mbit,3,", 1), false, 0},
		{"a prio set", strings.Replace(base, "b,10.0.0.2,1mbit,10mbit,,", "b,10.0.0.2,1mbit,10mbit,2,", 1), false, 0},
		{"the same prio", strings.Replace(base, "10mbit,0,", "10mbit, 0,", 1), true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, hf := loadEdit(t, base)
			edits, ok, err := p.EditHosts(hf, []byte(base), []byte(c.after))
			if err != nil || ok != c.ok || len(edits) != 2*c.edits {
				t.Fatalf("ok %v (want %v), %d edits (want %d), err %v", ok, c.ok, len(edits), 2*c.edits, err)
			}
		})
	}
}
