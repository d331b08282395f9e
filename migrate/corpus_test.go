package migrate

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// corpusDir is the peers' own example files (../shared/corpus beside the
// repository, or $SLUICE_CORPUS): the tools' text, read where it lies
// and never copied into the project.
func corpusDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SLUICE_CORPUS")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "corpus")
	}
	if _, err := os.Stat(filepath.Join(dir, "README.md")); err != nil {
		t.Skipf("no corpus of the peers' example files at %s (set SLUICE_CORPUS): %v", dir, err)
	}
	return dir
}

// Every file of the corpus imports, or is refused at its line for a
// reason docs/migrating.md lists. An import validates and plans; what
// each carried over is checked where the file says something a
// careless import would get wrong.
func TestImportTheToolsOwnExamples(t *testing.T) {
	dir := corpusDir(t)
	type refusal struct{ at, why string }
	for _, c := range []struct {
		name string
		run  func(string) (*Draft, error)
		// err: the import stops before the report (the file is not
		// a configuration); refused: the findings that fail it; else
		// it imports and has (in its YAML) each of has.
		err     string
		refused []refusal
		has     []string
	}{
		{name: "fireqos/etc-fireqos.conf.example", run: fq,
			// Its rates in shell arithmetic, its synacks class's SYNs.
			has: []string{"rate: 10370kbit", "rate: 845kbit", "name: synacks", "tcp_syn: true", "tcp_ack: true"}},
		{name: "fireqos/examples-fireqos.conf", run: fq,
			has: []string{"rate: 750kbit", "name: voip", "name: realtime", "name: torrents"}},
		// The example's own mistakes: a variable it never sets, a loop's
		// end without its start.
		{name: "fireqos/examples-fireqos-multiple-organizations.conf", run: fq,
			refused: []refusal{{`:62$`, `\$OUTPUT_RATE is not set in the file; did you mean \$OUTPUT_SPEED\?`}, {`:104$`, `not bash's control flow`}}},
		{name: "fireqos/tests-minimal-qos.conf", run: fq,
			has: []string{"rate: 11111kbit", "rate: 999kbit", "linklayer: atm", "leaf: fq_codel", "{sport: 22}", "{dport: 22}"}},
		{name: "htb.init", run: func(p string) (*Draft, error) { return HTBInit(p, Options{}) },
			has: []string{"name: www", "name: smtp", "default: dfl", "leaf: sfq", `classid: "1:10"`, `classid: "1:20"`, `classid: "1:30"`}},
		{name: "sqm/sqm-uci", run: func(p string) (*Draft, error) { return SQM(p, Options{}) },
			refused: []refusal{{`sqm-uci$`, `no queue is enabled, so sqm shapes nothing with this file: eth1 \(.*sqm-uci:3: option enabled '0'\)`}}},
		// The shell form's defaults: shaping nothing alone, the
		// interface sqm@DEV names with it.
		{name: "sqm/default.conf", run: func(p string) (*Draft, error) { return SQM(p, Options{}) },
			refused: []refusal{{`default.conf$`, `names no interface: sqm applies default.conf to the interface it is started on .*give --interface DEV`}}},
		{name: "sqm/default.conf", run: func(p string) (*Draft, error) { return SQM(p, Options{Interface: "eth0"}) },
			has: []string{"name: eth0", "rate: 1mbit", "rate: 85mbit", "leaf: cake"}},
		{name: "sqm/simple.qos", run: sqmRecipeFile, err: `an sqm recipe`},
		{name: "sqm/piece_of_cake.qos", run: sqmRecipeFile, err: `an sqm recipe`},
		{name: "sqm/layer_cake.qos", run: sqmRecipeFile, err: `an sqm recipe`},
		{name: "libreqos/v1.4", run: func(p string) (*Draft, error) { return LibreQoS(p, "") },
			has: []string{"name: Site_1", "name: AP_A", "rate: 1gbit"}},
		{name: "libreqos/v2.2", run: func(p string) (*Draft, error) { return LibreQoS(p, "") },
			has: []string{"name: Site_1", "name: AP_A", "name: PoP_6"}},
		// v2.2's other examples, each as the file it is the template of:
		// its rows in v2.0's layout, and the node tree as
		// manualNetwork.csv (no network.json beside it).
		{name: "libreqos/v2.2", run: lqWith(map[string]string{"ShapedDevices.example.v2.0.csv": "ShapedDevices.csv"}),
			has: []string{"name: Site_1", "name: PoP_6", "hosts_file: libreqos-download.csv"}},
		{name: "libreqos/v2.2", run: lqWith(map[string]string{"manualNetwork.template.csv": "manualNetwork.csv"}, "network.example.json"),
			has: []string{"name: SiteA", "name: SiteB", "name: SiteC"}},
		{name: "wondershaper/wondershaper.conf", run: ws,
			has: []string{"rate: 512kbit", "src: 80.0.0.0", "rate: 2048kbit"}},
		{name: "wondershaper/reference/wondershaper-1.2-903daf8", run: ws, err: `the wondershaper program itself`},
		{name: "wondershaper/reference/wondershaper-1.3-a31c265", run: ws, err: `the wondershaper program itself`},
		{name: "wondershaper/reference/wondershaper-1.3.1-aarontc", run: ws, err: `the wondershaper program itself`},
		{name: "wondershaper/reference/wondershaper-1.4.1", run: ws, err: `the wondershaper program itself`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := c.run(filepath.Join(dir, c.name))
			if c.err != "" {
				if err == nil || !regexp.MustCompile(c.err).MatchString(err.Error()) {
					t.Fatalf("want an error matching %q, got %v", c.err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.refused != nil {
				for _, r := range c.refused {
					wantFinding(t, d, Refused, r.at, r.why)
				}
				// The others follow from those: what an interface
				// refused held.
				cascade := regexp.MustCompile(`its interface statement \(line \d+\) was refused`)
				n := 0
				for _, f := range d.Report.Findings {
					if f.Kind == Refused && !cascade.MatchString(f.How) {
						n++
					}
				}
				if n != len(c.refused) {
					t.Errorf("%d refusals, want %d:\n%s", n, len(c.refused), d.Report.String())
				}
				return
			}
			if err := d.Report.Refusals(); err != nil {
				t.Fatalf("%v\n%s", err, d.Report.String())
			}
			if err := d.Check(); err != nil {
				t.Fatalf("the import does not validate: %v\n%s", err, d.Render())
			}
			out := string(d.Render())
			for _, want := range c.has {
				if !strings.Contains(out, want) {
					t.Errorf("no %q in:\n%s", want, out)
				}
			}
			for _, f := range d.Report.Findings {
				if f.Kind != Exact && f.How == "" {
					t.Errorf("a finding without its reason: %+v", f)
				}
			}
		})
	}
}

func sqmRecipeFile(p string) (*Draft, error) { return SQM(p, Options{}) }

// lqWith imports a copy of LibreQoS directory p with the files of as
// renamed (an example as the file it is the example of) and the files
// of without left out.
func lqWith(as map[string]string, without ...string) func(string) (*Draft, error) {
	return func(p string) (*Draft, error) {
		dir, err := os.MkdirTemp("", "lqcorpus")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if slices.Contains(without, e.Name()) {
				continue
			}
			b, err := os.ReadFile(filepath.Join(p, e.Name()))
			if err != nil {
				return nil, err
			}
			name := e.Name()
			if to, ok := as[name]; ok {
				name = to
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				return nil, err
			}
		}
		return LibreQoS(dir, "")
	}
}
func fq(p string) (*Draft, error) { return FireQOS(p, Options{}) }
func ws(p string) (*Draft, error) { return Wondershaper(p, nil, Options{}) }
