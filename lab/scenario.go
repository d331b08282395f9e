package lab

import (
	"bytes"
	"embed"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"sluice/policy"
	"sluice/safefile"
)

//go:embed scenarios/*.yaml
var builtin embed.FS

// Scenario is an experiment: a topology, the variants to compare (each a
// policy, or none), a timeline of phases, the traffic, and expectations.
type Scenario struct {
	Name        string    `yaml:"name"`
	Description string    `yaml:"description"`
	Article     string    `yaml:"article"` // the figures this reproduces, for reports
	Topology    Topology  `yaml:"topology"`
	Variants    []Variant `yaml:"variants"`
	// Matrix expands the scenario once per combination of its values:
	// every {{key}} in the file is replaced (cc-matrix uses it).
	Matrix  map[string][]string `yaml:"matrix"`
	Phases  []Phase             `yaml:"phases"`
	Traffic []Traffic           `yaml:"traffic"`
	Expect  []string            `yaml:"expect"`
	// Settle is left out at the start of each phase, while queues fill
	// (default 1s).
	Settle string `yaml:"settle"`

	File string `yaml:"-"`
	// dir is the folder a file-read scenario's "@file" policies are in.
	dir string
}

// Variant is one way to run the scenario.
type Variant struct {
	Name string `yaml:"name"`
	// Policy is a sluice policy (YAML) for the router's devices lan, wan;
	// empty means unshaped.
	Policy string `yaml:"policy"`
	// Note says what the variant shows, for reports.
	Note string `yaml:"note"`

	// Matrix holds a matrix expansion's values (nil otherwise).
	Matrix map[string]string `yaml:"-"`

	// traffic overrides the scenario's for matrix expansions, whose
	// substitutions differ per variant.
	traffic []Traffic
	// text is the policy, read from its file for "@file.yaml".
	text string
}

// Phase is a named stretch of the timeline.
type Phase struct {
	Name     string `yaml:"name"`
	Duration string `yaml:"duration"`
	// Modem sets the modem's line rates for the phase (a variable link:
	// LTE, cable, satellite); a direction it leaves out, or a phase
	// without it, has the topology's rate. Only a direction the
	// topology's modem limits can change.
	Modem *PhaseModem `yaml:"modem"`
}

// PhaseModem is a phase's modem rates, tc units.
type PhaseModem struct {
	Up   string `yaml:"up"`
	Down string `yaml:"down"`
}

// modemDirs are the modem's directions, in the order they are set.
var modemDirs = []string{"up", "down"}

// rate is m's rate in direction dir ("up" or "down").
func (m PhaseModem) rate(dir string) string {
	if dir == "up" {
		return m.Up
	}
	return m.Down
}

// modemRate is the modem's rate in direction dir ("up", "down") during
// phase p: its own, or the topology's.
func (s *Scenario) modemRate(p Phase, dir string) string {
	if p.Modem != nil {
		if r := p.Modem.rate(dir); r != "" {
			return r
		}
	}
	return PhaseModem{Up: s.Topology.Modem.Up, Down: s.Topology.Modem.Down}.rate(dir)
}

// variableModem reports whether any phase changes the modem's rates.
func (s *Scenario) variableModem() bool {
	for _, p := range s.Phases {
		if p.Modem != nil {
			return true
		}
	}
	return false
}

// Traffic is a generator or a probe.
type Traffic struct {
	Name string `yaml:"name"`
	// Type: tcp (bulk, as fast as TCP goes), udp (constant bit rate),
	// rr (request/response over TCP), udp-echo and ping (latency probes).
	Type string    `yaml:"type"`
	From Endpoints `yaml:"from"`
	To   Endpoints `yaml:"to"`
	// Family: 4 (default) or 6.
	Family int `yaml:"family"`
	// Flows: parallel TCP connections per endpoint pair (default 1).
	Flows    int      `yaml:"flows"`
	CC       string   `yaml:"cc"`       // tcp: congestion control (reno, cubic, bbr)
	DSCP     string   `yaml:"dscp"`     // name or number
	Rate     string   `yaml:"rate"`     // udp
	Size     int      `yaml:"size"`     // udp and probe payload bytes
	Interval string   `yaml:"interval"` // probes (default 100ms)
	Port     int      `yaml:"port"`     // default: chosen per item
	Phases   []string `yaml:"phases"`   // active in these phases (default all)
	Start    string   `yaml:"start"`    // or: from this time ...
	Duration string   `yaml:"duration"` // ... for this long
	// Class is the policy class its packets fall into, for per-class
	// results and expectations ("interactive" or "wan/interactive").
	Class string `yaml:"class"`
}

// Endpoints is one host name or a list; "clients" means every client.
type Endpoints []string

func (e *Endpoints) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*e = Endpoints{n.Value}
		return nil
	case yaml.SequenceNode:
		var s []string
		if err := n.Decode(&s); err != nil {
			return err
		}
		*e = s
		return nil
	}
	return fmt.Errorf("line %d: expected a host name or a list of them", n.Line)
}

// Builtin lists the scenarios shipped with sluice.
func Builtin() []string {
	ents, _ := builtin.ReadDir("scenarios")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(out)
	return out
}

// Load reads a scenario by built-in name or file path and expands its
// matrix. Every expansion shares the topology and phases; an expectation
// that names a matrix key is expanded like the variants.
func Load(nameOrPath string) (*Scenario, error) {
	var src []byte
	var err error
	file := nameOrPath
	if !strings.ContainsAny(nameOrPath, "/.") {
		src, err = builtin.ReadFile("scenarios/" + nameOrPath + ".yaml")
		if err != nil {
			return nil, fmt.Errorf("no scenario %q; built in: %s", nameOrPath, strings.Join(Builtin(), ", "))
		}
		file = "scenario " + nameOrPath
	} else if src, err = safefile.ReadRegular(nameOrPath, "scenario", MaxScenarioBytes); err != nil {
		return nil, err
	}
	s, err := parse(file, src)
	if err != nil {
		return nil, err
	}
	if file == nameOrPath {
		s.dir = filepath.Dir(nameOrPath)
	}
	return s, s.readPolicies()
}

// MaxScenarioBytes bounds a scenario file: far above any real one.
const MaxScenarioBytes = 1 << 20

// Parse reads a scenario from src. A variant's policy that refers to a
// file ("@file.yaml") is refused: only a scenario loaded from a file has
// a folder to find it in.
func Parse(file string, src []byte) (*Scenario, error) {
	s, err := parse(file, src)
	if err != nil {
		return nil, err
	}
	return s, s.readPolicies()
}

func parse(file string, src []byte) (*Scenario, error) {
	s, err := decode(file, src)
	if err != nil {
		return nil, err
	}
	if len(s.Matrix) > 0 {
		keys := make([]string, 0, len(s.Matrix))
		for k := range s.Matrix {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		combos := []map[string]string{{}}
		for _, k := range keys {
			var next []map[string]string
			for _, c := range combos {
				for _, v := range s.Matrix[k] {
					m := map[string]string{k: v}
					for a, b := range c {
						m[a] = b
					}
					next = append(next, m)
				}
			}
			combos = next
		}
		var variants []Variant
		// An expectation naming a key ("fq_codel-{{cc}}/bulk: ...")
		// becomes one per value; the others stay one line.
		var expect []string
		seen := map[string]bool{}
		for _, c := range combos {
			text := string(src)
			for k, v := range c {
				text = strings.ReplaceAll(text, "{{"+k+"}}", v)
			}
			x, err := decode(file, []byte(text))
			if err != nil {
				return nil, err
			}
			for _, v := range x.Variants {
				v.traffic = x.Traffic
				v.Matrix = c
				variants = append(variants, v)
			}
			for _, e := range x.Expect {
				if !seen[e] {
					seen[e] = true
					expect = append(expect, e)
				}
			}
		}
		s.Variants, s.Expect = variants, expect
	}
	s.File = file
	return s, s.validate()
}

// allTraffic is every variant's traffic (a matrix's, its keys filled in).
func (s *Scenario) allTraffic() []Traffic {
	if len(s.Matrix) == 0 {
		return s.Traffic
	}
	var out []Traffic
	for _, v := range s.Variants {
		out = append(out, s.TrafficFor(v)...)
	}
	return out
}

// TrafficFor returns the traffic a variant runs.
func (s *Scenario) TrafficFor(v Variant) []Traffic {
	if v.traffic != nil {
		return v.traffic
	}
	return s.Traffic
}

func decode(file string, src []byte) (*Scenario, error) {
	var s Scenario
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%s: %s", file, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return &s, nil
}

// RunTime is how long the scenario's traffic runs at scale 1: its
// timeline once per variant (building and clearing the test bed come on
// top, a few seconds).
func (s *Scenario) RunTime() time.Duration {
	_, _, total, err := s.phaseTimes(1)
	if err != nil {
		return 0
	}
	return total * time.Duration(max(len(s.Variants), 1))
}

// Durations of the timeline.
func (s *Scenario) phaseTimes(scale float64) ([]Phase, []time.Duration, time.Duration, error) {
	var ds []time.Duration
	var total time.Duration
	for _, p := range s.Phases {
		d, err := time.ParseDuration(p.Duration)
		if err != nil || d <= 0 {
			return nil, nil, 0, fmt.Errorf("%s: phase %s: duration %q: want a duration like 5s", s.File, p.Name, p.Duration)
		}
		f := float64(d) * scale
		// Checked before adding: two phases of 2562047h wrapped the
		// sum negative, and a "584-year" run ended at once.
		if f > float64(maxTimeline) || float64(total)+f > float64(maxTimeline) {
			return nil, nil, 0, fmt.Errorf("%s: phase %s: duration %q: the phases last more than %s in all, the most a run may", s.File, p.Name, p.Duration, maxTimeline)
		}
		d = time.Duration(f)
		ds = append(ds, d)
		total += d
	}
	return s.Phases, ds, total, nil
}

// ccName is what the kernel takes as a congestion control's name
// (TCP_CA_NAME_MAX, 16 with its NUL).
var ccName = regexp.MustCompile(`^[a-z0-9_]{1,15}$`)

// Preflight checks on this host, before a test bed is built, what a
// run at scale needs that parsing cannot see: the timeline scaled, and
// every congestion control a traffic names (a TCP socket is given it,
// which loads its module where there is one).
func (s *Scenario) Preflight(scale float64) error {
	if _, _, _, err := s.phaseTimes(scale); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, t := range s.allTraffic() {
		if t.CC == "" || seen[t.CC] {
			continue
		}
		seen[t.CC] = true
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		err = unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, t.CC)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("%s: traffic %s: cc %q: this kernel has no such congestion control (%v; see /proc/sys/net/ipv4/tcp_available_congestion_control)", s.File, t.Name, t.CC, err)
		}
	}
	return nil
}

// maxTimeline bounds a scenario's phases together (a week: a soak).
const maxTimeline = 7 * 24 * time.Hour

// nameProblem says what is wrong with a name a scenario gives (of
// itself, a phase, a variant, a traffic): names land in reports,
// terminals and file names.
func nameProblem(n string) string {
	for _, r := range n {
		if r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 {
			return "must not contain control characters (a newline, a tab, an escape)"
		}
	}
	if len(n) > 64 {
		return "may be at most 64 bytes"
	}
	return ""
}

func (s *Scenario) validate() error {
	var errs []string
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Sprintf("%s: "+format, append([]any{s.File}, args...)...))
	}
	if s.Name == "" {
		bad("name is required")
	}
	named := func(what, n string) {
		if why := nameProblem(n); why != "" {
			bad("%s %q: %s", what, n, why)
		}
	}
	named("name", s.Name)
	for _, p := range s.Phases {
		named("phase", p.Name)
	}
	for _, v := range s.Variants {
		named("variant", v.Name)
	}
	for _, t := range s.Traffic {
		named("traffic", t.Name)
	}
	for _, t := range s.allTraffic() {
		if t.CC != "" && !ccName.MatchString(t.CC) {
			bad("traffic %s: cc %q: want a congestion control's name (reno, cubic, bbr: letters, digits and _, at most 15)", t.Name, t.CC)
		}
	}
	if c := s.Topology.Clients; c < 0 || c > 200 {
		bad("topology: clients %d: want 1 to 200 (0 or none for 1)", c)
	}
	if len(s.Phases) == 0 {
		bad("phases: at least one phase is required")
	}
	if _, _, _, err := s.phaseTimes(1); err != nil {
		errs = append(errs, err.Error())
	}
	for _, p := range s.Phases {
		if p.Modem == nil {
			continue
		}
		for _, dir := range modemDirs {
			r := p.Modem.rate(dir)
			if r == "" {
				continue
			}
			if s.modemRate(Phase{}, dir) == "" {
				bad("phase %s: modem %s %s: the topology's modem has no %s rate to change", p.Name, dir, r, dir)
			} else if _, err := parseRate(r); err != nil {
				bad("phase %s: modem %s %q: %v", p.Name, dir, r, err)
			}
		}
	}
	phases := map[string]bool{}
	for _, p := range s.Phases {
		if phases[p.Name] {
			bad("phase %q appears twice", p.Name)
		}
		phases[p.Name] = true
	}
	if len(s.Variants) == 0 {
		s.Variants = []Variant{{Name: "unshaped"}}
	}
	seen := map[string]bool{}
	for _, v := range s.Variants {
		if v.Name == "" || seen[v.Name] {
			bad("variant names must be given and unique (%q)", v.Name)
		}
		seen[v.Name] = true
	}
	if s.Settle != "" {
		if _, err := time.ParseDuration(s.Settle); err != nil {
			bad("settle %q: want a duration", s.Settle)
		}
	}
	names := map[string]bool{}
	for i, t := range s.Traffic {
		where := fmt.Sprintf("traffic %d (%s)", i+1, t.Name)
		if t.Name == "" {
			bad("traffic %d: name is required", i+1)
		} else if names[t.Name] {
			bad("%s: name used twice", where)
		}
		names[t.Name] = true
		switch t.Type {
		case "tcp", "udp", "rr", "udp-echo", "ping":
		default:
			bad("%s: type %q: want tcp, udp, rr, udp-echo or ping", where, t.Type)
		}
		if len(t.From) == 0 || len(t.To) == 0 {
			bad("%s: from and to are required", where)
		}
		for _, e := range append(append([]string{}, t.From...), t.To...) {
			if e != "server" && e != "clients" && !validClient(e, s.Topology.Clients) {
				bad("%s: host %q: want server, clients or client1..client%d", where, e, max(s.Topology.Clients, 1))
			}
		}
		if t.Family != 0 && t.Family != 4 && t.Family != 6 {
			bad("%s: family %d: want 4 or 6", where, t.Family)
		}
		if t.Type == "udp" {
			if _, err := parseRate(t.Rate); err != nil {
				bad("%s: rate %q: %v", where, t.Rate, err)
			}
		}
		if t.Interval != "" {
			if d, err := time.ParseDuration(t.Interval); err != nil || d <= 0 {
				bad("%s: interval %q: want a duration like 100ms", where, t.Interval)
			}
		}
		if t.DSCP != "" {
			if _, err := parseDSCP(t.DSCP); err != nil {
				bad("%s: %v", where, err)
			}
		}
		for _, p := range t.Phases {
			if !phases[p] {
				bad("%s: phase %q is not in phases", where, p)
			}
		}
		if len(t.Phases) > 0 && (t.Start != "" || t.Duration != "") {
			bad("%s: give phases or start/duration, not both", where)
		}
	}
	for _, e := range s.Expect {
		x, err := parseExpectation(e)
		if err != nil {
			bad("expect %q: %v", e, err)
			continue
		}
		// A window past the phase's end reads nothing.
		for _, p := range s.Phases {
			if d, err := time.ParseDuration(p.Duration); err == nil && p.Name == x.Phase && x.After >= d.Seconds() {
				bad("expect %q: after %gs: phase %s lasts %s", e, x.After, p.Name, p.Duration)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

func validClient(e string, n int) bool {
	var i int
	if _, err := fmt.Sscanf(e, "client%d", &i); err != nil || fmt.Sprintf("client%d", i) != e {
		return false
	}
	return i >= 1 && i <= max(n, 1)
}

var dscpByName = map[string]int{"cs0": 0, "cs1": 8, "cs2": 16, "cs3": 24, "cs4": 32, "cs5": 40, "cs6": 48, "cs7": 56,
	"af11": 10, "af12": 12, "af13": 14, "af21": 18, "af22": 20, "af23": 22, "af31": 26, "af32": 28, "af33": 30,
	"af41": 34, "af42": 36, "af43": 38, "ef": 46, "le": 1}

func parseDSCP(s string) (int, error) {
	if v, ok := dscpByName[strings.ToLower(s)]; ok {
		return v, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 || v > 63 {
		return 0, fmt.Errorf("dscp %q: want a name (EF, AF41, CS1...) or 0-63", s)
	}
	return v, nil
}

// readPolicies reads every variant's policy before anything runs: a
// policy may come from a file in the scenario's folder ("@file.yaml",
// read as a policy file is: a regular file, bounded), never from outside
// it; and each must parse and validate, so that a mistake in the last
// variant is found before the first one runs.
func (s *Scenario) readPolicies() error {
	for i := range s.Variants {
		v := &s.Variants[i]
		where := fmt.Sprintf("%s: variant %s", s.File, v.Name)
		v.text = v.Policy
		if ref, ok := strings.CutPrefix(v.Policy, "@"); ok {
			switch {
			case s.dir == "":
				return fmt.Errorf("%s: policy %q: only a scenario read from a file may refer to one", where, v.Policy)
			case !filepath.IsLocal(ref):
				return fmt.Errorf("%s: policy %q: must name a file in the scenario's folder (%s), not outside it", where, v.Policy, s.dir)
			}
			b, err := safefile.ReadIn(s.dir, ref, "policy", policy.MaxPolicyBytes)
			if err != nil {
				return fmt.Errorf("%s: policy %q: %w", where, v.Policy, err)
			}
			v.text = string(b)
		}
		if strings.TrimSpace(v.text) == "" {
			continue // unshaped
		}
		if _, _, err := policy.Parse(s.Name+"/"+v.Name, []byte(v.text)); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

// policyText is a variant's policy, as read when the scenario was.
func (s *Scenario) policyText(v Variant) (string, error) {
	if strings.HasPrefix(v.Policy, "@") && v.text == "" {
		return "", fmt.Errorf("%s: variant %s: policy %q was not read", s.File, v.Name, v.Policy)
	}
	return v.text, nil
}

// Select returns s with only the variants named (all, when none are
// named) and the expectations that concern them: those of no variant,
// of a selected one, or measured against one (`0.95 of limit/alone`).
// A run of some variants (`lab run --variant`) checks theirs, not the
// others' as failed.
func (s *Scenario) Select(names []string) *Scenario {
	if len(names) == 0 {
		return s
	}
	out := *s
	out.Variants, out.Expect = nil, nil
	for _, v := range s.Variants {
		if slices.Contains(names, v.Name) {
			out.Variants = append(out.Variants, v)
		}
	}
	for _, text := range s.Expect {
		e, err := parseExpectation(text)
		if err != nil || e.Variant == "" || slices.Contains(names, e.Variant) {
			out.Expect = append(out.Expect, text)
		}
	}
	return &out
}
