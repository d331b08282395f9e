package policy

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// BenchmarkLoadHosts10k parses a policy with a 10,000-line hosts file:
// the parsing part of a one-subscriber change.
func BenchmarkLoadHosts10k(b *testing.B) {
	dir := b.TempDir()
	var csv strings.Builder
	csv.WriteString("name,addresses,rate,ceil\n")
	for i := range 10000 {
		fmt.Fprintf(&csv, "s%d,10.%d.%d.%d,2mbit,20mbit\n", i, 64+i>>16, i>>8&0xff, i&0xff)
	}
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(csv.String()), 0o644)
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(`interfaces:
  - name: eth0
    egress:
      rate: 10gbit
      default: rest
      classes:
        - name: subs
          rate: 9gbit
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 500mbit
`), 0o644)
	for b.Loop() {
		if _, _, err := Load(file); err != nil {
			b.Fatal(err)
		}
	}
}

// validName is the regexp names were checked with, by hand.
func TestValidNameIsTheRegexp(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)
	alphabet := "aZ09_.-/ é\x00"
	r := rand.New(rand.NewPCG(1, 2))
	cases := []string{"", "a", ".a", "-a", "_a", strings.Repeat("a", 64), strings.Repeat("a", 65), "a b", "a/b"}
	for range 20000 {
		n := r.IntN(70)
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		cases = append(cases, b.String())
	}
	for _, s := range cases {
		if validName(s) != re.MatchString(s) {
			t.Fatalf("validName(%q) = %v, the regexp says %v", s, validName(s), re.MatchString(s))
		}
	}
}

// loadWithHosts writes csv beside a policy whose class subs takes its
// hosts from it, with extra lines in the egress tree, and loads it.
func loadWithHosts(t *testing.T, csv, extra, classLines string) (*Policy, Errors, error) {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte(csv), 0o644)
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(`interfaces:
  - name: eth0
    egress:
      rate: 10gbit
      default: rest
`+extra+`      classes:
        - name: subs
          rate: 9gbit
          per_host: {by: dst, hosts_file: hosts.csv}
`+classLines+`        - name: rest
          rate: 500mbit
`), 0o644)
	return Load(file)
}

func TestHostsFileEdgeCases(t *testing.T) {
	// A quote inside an unquoted field is the CSV's error, at its place
	// (it used to panic).
	_, _, err := loadWithHosts(t, "name,addresses,rate,ceil\nal\"ice,10.1.0.1,,\n", "", "")
	if err == nil || !strings.Contains(err.Error(), "hosts.csv:2:3: hosts file: bare \" in non-quoted-field") {
		t.Errorf("quote in a field: %v", err)
	}
	_, _, err = loadWithHosts(t, "name,\"addr\nesses,rate,ceil\n", "", "")
	if err == nil || !strings.Contains(err.Error(), "hosts.csv:") {
		t.Errorf("broken header: %v", err)
	}
	// A byte order mark (spreadsheets write one) is not part of the header.
	p, _, err := loadWithHosts(t, "\xef\xbb\xbfname,addresses,rate,ceil\nalice,10.1.0.1,,\n", "", "")
	if err != nil || p.Interfaces[0].Egress.Hosts != 1 {
		t.Errorf("CSV with a BOM: %v", err)
	}
	// u32 cannot look a host up after other tests: said at validate.
	_, _, err = loadWithHosts(t, "name,addresses,rate,ceil\nalice,10.1.0.1,,\n", "      classifier: u32\n", "")
	if err != nil {
		t.Fatalf("u32 with a plain hosts_file: %v", err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hosts.csv"), []byte("name,addresses,rate,ceil\nalice,10.1.0.1,,\n"), 0o644)
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(`interfaces:
  - name: eth0
    egress:
      rate: 10gbit
      default: rest
      classifier: u32
      classes:
        - name: subs
          rate: 9gbit
          match: [{proto: tcp}]
          per_host: {by: dst, hosts_file: hosts.csv}
        - name: rest
          rate: 500mbit
`), 0o644)
	if _, _, err := Load(file); err == nil || !strings.Contains(err.Error(), "p.yaml:6:19: eth0 egress: class subs combines a hosts_file with match rules, which u32 cannot") {
		t.Errorf("u32 with hosts_file and match: %v", err)
	}
}

// The header's optional columns, parent and prio, come in either order,
// each once; a prio is 0 to 7 or empty (the per_host's).
func TestHostsFilePrioColumn(t *testing.T) {
	for _, c := range []struct {
		name, csv string
		prios     []int // -1: none
		err       string
	}{
		{"prio", "name,addresses,rate,ceil,prio\na,10.1.0.1,,,0\nb,10.1.0.2,,,\nc,10.1.0.3,,,7\n", []int{0, -1, 7}, ""},
		{"both, prio first", "name,addresses,rate,ceil,prio,parent\na,10.1.0.1,,,2,gold\n", []int{2}, ""},
		{"both, parent first", "name,addresses,rate,ceil,parent,prio\na,10.1.0.1,,,gold,2\n", []int{2}, ""},
		{"prio too high", "name,addresses,rate,ceil,prio\na,10.1.0.1,,,8\n", nil, `hosts.csv:2:14: hosts file: host a: prio "8": a number from 0 (served first) to 7`},
		{"prio not a number", "name,addresses,rate,ceil,prio\na,10.1.0.1,,,high\n", nil, `prio "high"`},
		{"unknown column", "name,addresses,rate,ceil,weight\na,10.1.0.1,,,1\n", nil, `hosts.csv:1:1: hosts file: column 5 of the header is "weight": the optional columns are parent and prio`},
		{"repeated column", "name,addresses,rate,ceil,prio,prio\na,10.1.0.1,,,1,1\n", nil, `column 6 of the header repeats "prio"`},
		{"short header", "name,addresses,rate\na,10.1.0.1,\n", nil, `expected name,addresses,rate,ceil[,parent][,prio]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, _, err := loadWithHosts(t, c.csv, "", "        - {name: gold, rate: 100mbit}\n")
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, e := range p.Interfaces[0].Egress.Classes[0].PerHost.Entries {
				if e.Prio == nil {
					got = append(got, -1)
				} else {
					got = append(got, *e.Prio)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.prios) {
				t.Errorf("prios %v, want %v", got, c.prios)
			}
		})
	}
}

// How many host classes a tree holds is known, and checked, at validate.
func TestHostCountsAtValidate(t *testing.T) {
	many := func(n int) string {
		var b strings.Builder
		b.WriteString("name,addresses,rate,ceil\n")
		for i := range n {
			fmt.Fprintf(&b, "s%d,10.%d.%d.%d,,\n", i, 64+i>>16, i>>8&0xff, i&0xff)
		}
		return b.String()
	}
	p, warns, err := loadWithHosts(t, many(10000), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if tr := p.Interfaces[0].Egress; tr.Hosts != 10000 || tr.ClassCount != 10002 || len(warns) != 0 {
		t.Errorf("10,000 hosts: counted %d hosts, %d classes, warnings %v", tr.Hosts, tr.ClassCount, warns)
	}
	_, warns, err = loadWithHosts(t, many(40000), "", "")
	if err != nil || len(warns) != 1 || !strings.Contains(warns[0].Error(), "40002 classes (40000 of them hosts) do not fit one HTB (at most 32766): the tree must be sharded over at least 2 transmit queues") {
		t.Errorf("40,000 hosts: %v %v", err, warns)
	}
	_, _, err = loadWithHosts(t, many(40000), "      shards: 1\n", "")
	if err == nil || !strings.Contains(err.Error(), "shards: 1 forbids sharding, and at least 2 shards are needed") {
		t.Errorf("40,000 hosts, one shard: %v", err)
	}
}

// An IPv4-mapped address in a hosts file is the IPv4 host: its traffic
// is IPv4 on the wire (filed as IPv6, it went unshaped, silently).
func TestHostsFileIPv4Mapped(t *testing.T) {
	p, _, err := loadWithHosts(t, "name,addresses,rate,ceil\nalice,::ffff:10.0.0.7,,\nbob,::ffff:10.0.1.0/120 2001:db8::7,,\n", "", "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range p.Interfaces[0].Egress.Classes {
		if c.PerHost == nil {
			continue
		}
		for _, e := range c.PerHost.Entries {
			for _, a := range e.Addrs {
				got = append(got, e.Name+" "+a.String())
			}
		}
	}
	if want := "alice 10.0.0.7/32,bob 10.0.1.0/24,bob 2001:db8::7/128"; strings.Join(got, ",") != want {
		t.Errorf("addresses %v, want %s", got, want)
	}
	_, _, err = loadWithHosts(t, "name,addresses,rate,ceil\ncarol,::ffff:0:0/80,,\n", "", "")
	if err == nil || !strings.Contains(err.Error(), "host bits are set") {
		t.Errorf("a mapped CIDR wider than the mapped space: %v", err)
	}
}

// A rate given in a hosts file that comes to nothing is refused, as a
// class's is, at its line; it was once held at 1 byte/s in silence.
func TestHostsFileRateThatComesToNothing(t *testing.T) {
	_, _, err := loadWithHosts(t, "name,addresses,rate,ceil\nalice,10.1.0.1,1e-300%,\n", "", "")
	if err == nil || !strings.Contains(err.Error(), "hosts.csv:2:1: hosts file: host alice: rate 1e-300% comes to less than 1 byte/s") {
		t.Errorf("a host's rate of 1e-300%%: %v", err)
	}
	_, _, err = loadWithHosts(t, "name,addresses,rate,ceil\nalice,10.1.0.1,,\n", "", "")
	if err != nil {
		t.Errorf("a host at the per_host default: %v", err)
	}
}
