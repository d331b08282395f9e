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
