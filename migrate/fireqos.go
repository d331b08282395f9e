package migrate

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sluice/policy"
	"sluice/safefile"
)

// FireQOS's configuration (/etc/firehol/fireqos.conf) is a bash script
// that FireQOS sources: `interface DEV NAME input|output|both rate R`,
// then `class NAME [params]` and `match ...` statements, `class group`
// ... `class group end` for nesting. What it builds, read from FireQOS
// 3.1.7 and checked against it on the kernel (e2e):
//   - one HTB per interface (input: on an ifb the ingress redirects
//     to), root class X:1 at the rate (ceil defaults to the rate);
//   - classes numbered from X:11 in file order, a group's children
//     continuing the count; a `default` class appended at the end of
//     the interface (X:8000) and of each group (X:8001, ...);
//   - a class's rate defaults to the interface's minimum (rate/100),
//     and is raised to it; its ceil is its parent's unless given;
//   - bare rates are kbit/s, `kbps` 1024 bytes/s, `%` of the parent's
//     rate (for a ceil too: FireQOS reads the parent's rate for both),
//     in bash's integer arithmetic; tc gets whole kbit/s;
//   - prio follows file order (0, 1, 2... among siblings; `balanced`
//     gives all 4), at most 7;
//   - every match is a u32 filter at the class's parent with a prio
//     in file order, IPv4 only unless the interface, class or match
//     says 46 or 6: the first match in file order wins;
//   - a group's own matches send traffic into it, and what none of its
//     children's matches takes goes to its default (a gate here).
//
// The file is read as bash would for literal statements and variables
// (VAR=value, $VAR, ${VAR}); loops, conditions, functions, command
// substitution and sourcing are refused at their line: sluice does
// not run the script.
func FireQOS(file string, opt Options) (*Draft, error) {
	b, err := safefile.ReadRegular(file, "FireQOS config", maxSourceBytes)
	if err != nil {
		return nil, err
	}
	d := &Draft{Tool: "FireQOS"}
	fq := &fqRun{d: d, r: &d.Report, opt: opt, file: file,
		minDivisor: 100, defaultQdisc: "fq_codel", balancedPrio: 4, services: fqServices()}
	stmts := fqStatements(file, b, fq.r)
	for _, s := range stmts {
		if fq.full {
			break // one refusal, not one per class past the limit
		}
		fq.statement(s)
	}
	fq.closeInterfaces()
	if len(d.Interfaces) == 0 && d.Report.Refusals() == nil {
		d.Report.Refuse(At{File: file}, "FireQOS config", "no interface statement")
	}
	if d.Report.Refusals() != nil {
		return d, nil
	}
	return d.settle(At{File: file}), nil
}

// fqStmt is one simple command of the script, its words expanded.
type fqStmt struct {
	at    At
	words []string
}

var fqAssign = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// fqStatements splits the script into simple commands (lines joined at
// a trailing backslash, split at ; and cut at comments), expanding
// variables as bash would for literal statements. Assignments are kept
// as statements ("NAME=value" one word) for the interpreter.
func fqStatements(file string, b []byte, r *Report) []fqStmt {
	vars := map[string]string{}
	funcs := map[string][]fqLine{}
	var out []fqStmt
	var fn string     // the function whose body is being read
	var body []fqLine // its lines
	var fnAt At       // where it starts
	const maxFuncCalls = 4096
	calls := 0 // function calls expanded: bounded, as a file's calls can multiply
	var expand func(l fqLine, depth int)
	expand = func(l fqLine, depth int) {
		for _, part := range fqSplit(l.text) {
			words, err := fqWords(part, vars)
			if err != nil {
				r.Refuse(l.at, strings.TrimSpace(part), "%v", err)
				if f := strings.Fields(part); len(f) > 0 && strings.HasPrefix(f[0], "interface") {
					// What follows belongs to it: say so there.
					out = append(out, fqStmt{l.at, []string{fqRefusedInterface}})
				}
				continue
			}
			if len(words) == 0 {
				continue
			}
			if words[0] == "export" || words[0] == "declare" || words[0] == "local" || words[0] == "readonly" {
				words = words[1:]
				if len(words) > 0 && strings.HasPrefix(words[0], "-") {
					words = words[1:]
				}
			}
			if len(words) == 0 {
				continue
			}
			if fb, ok := funcs[words[0]]; ok {
				// A function the file defined: its statements, here,
				// with the variables as they are now (as bash runs it).
				switch {
				case len(words) > 1:
					r.Refuse(l.at, words[0], "a function called with arguments: sluice expands functions without them")
				case depth >= 8:
					r.Refuse(l.at, words[0], "functions call each other more than 8 deep")
				case calls >= maxFuncCalls:
					if calls == maxFuncCalls {
						r.Refuse(l.at, words[0], "more than %d function calls in all: sluice stops expanding them", maxFuncCalls)
					}
					calls++
				default:
					calls++
					for _, bl := range fb {
						expand(bl, depth+1)
					}
				}
				continue
			}
			if fqAssign.MatchString(words[0]) {
				if len(words) > 1 {
					r.Refuse(l.at, words[0], "an assignment before a command: sluice reads literal statements")
					continue
				}
				k, v, _ := strings.Cut(words[0], "=")
				vars[k] = v
			}
			out = append(out, fqStmt{l.at, words})
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), maxSourceBytes)
	line, start := "", 0
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimRight(sc.Text(), "\r")
		if line == "" {
			start = n
		}
		if strings.HasSuffix(text, "\\") && shellComment(text) == text {
			line += strings.TrimSuffix(text, "\\") + " "
			continue
		}
		line += text
		l := fqLine{At{file, start}, shellComment(line)}
		line = ""
		trimmed := strings.TrimSpace(l.text)
		switch {
		case fn != "" && trimmed == "}":
			funcs[fn], fn = body, ""
		case fn != "" && trimmed == "{" && len(body) == 0:
		case fn != "":
			body = append(body, l)
		case fqFuncDef.MatchString(trimmed):
			m := fqFuncDef.FindStringSubmatch(trimmed)
			fn, body, fnAt = m[1]+m[2], nil, l.at
		default:
			expand(l, 0)
		}
	}
	if fn != "" {
		r.Refuse(fnAt, fn, "a function without its closing }")
	}
	if err := sc.Err(); err != nil {
		r.Refuse(At{File: file}, "FireQOS config", "%v", err)
	}
	return out
}

// fqRefusedInterface stands for an interface statement that could not
// be read: its classes and matches are refused as its.
const fqRefusedInterface = "\x00refused interface"

// fqLine is a line of a config (continuations joined, comment cut).
type fqLine struct {
	at   At
	text string
}

// fqFuncDef is a shell function's first line, NAME() { or function
// NAME {, its body on the lines that follow up to a lone }.
var fqFuncDef = regexp.MustCompile(`^(?:function\s+([A-Za-z_][A-Za-z0-9_]*)\s*(?:\(\s*\))?|([A-Za-z_][A-Za-z0-9_]*)\s*\(\s*\))\s*\{?$`)

// fqSplit splits a line at ; and & outside quotes; a & or | there is
// kept in the part so that fqWords refuses it.
func fqSplit(line string) []string {
	var parts []string
	var quote rune
	last := 0
	for i, c := range line {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == ';':
			parts = append(parts, line[last:i])
			last = i + 1
		}
	}
	return append(parts, line[last:])
}

// fqWords splits a command into words: quotes group and are removed,
// $NAME and ${NAME} expand (outside single quotes; split at spaces
// outside double quotes, as bash splits an unquoted expansion).
func fqWords(s string, vars map[string]string) ([]string, error) {
	var out []string
	var w strings.Builder
	in := false
	flush := func() {
		if in {
			out = append(out, w.String())
			w.Reset()
			in = false
		}
	}
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case c == '\\' && i+1 < len(s) && quote == 0:
			i++
			w.WriteByte(s[i])
			in = true
		case c == '`':
			return nil, fmt.Errorf("command substitution: sluice does not run the script")
		case c == '$' && strings.HasPrefix(s[i:], "$(("):
			// Integer arithmetic on literals and the file's variables:
			// what a FireQOS config computes its rates with.
			end := arithEnd(s[i:])
			if end < 0 {
				return nil, fmt.Errorf("$(( without its closing ))")
			}
			v, err := shellArith(s[i+3:i+end-2], vars)
			if err != nil {
				return nil, err
			}
			w.WriteString(strconv.FormatInt(v, 10))
			in = true
			i += end - 1
		case c == '$':
			name, n, err := fqVarRef(s[i:])
			if err != nil {
				return nil, err
			}
			v, ok := vars[name]
			if !ok {
				return nil, fmt.Errorf("$%s is not set in the file%s (sluice reads the file alone, not the environment FireQOS runs in)", name, varHint(name, vars))
			}
			i += n - 1
			if quote == '"' {
				w.WriteString(v)
				in = true
				continue
			}
			// Unquoted: the value splits at spaces.
			fs := strings.Fields(v)
			for k, f := range fs {
				if k > 0 {
					flush()
				}
				w.WriteString(f)
				in = true
			}
		case quote == '"':
			if c == '"' {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			flush()
		case c == '|' || c == '&' || c == '<' || c == '>' || c == '(' || c == ')' || c == '{' || c == '}':
			if c == '{' || c == '}' {
				if !in && (i+1 == len(s) || s[i+1] == ' ' || s[i+1] == '\t') {
					return nil, fmt.Errorf("a brace group: sluice reads literal statements, not bash's control flow")
				}
				w.WriteByte(c)
				in = true
				continue
			}
			return nil, fmt.Errorf("%q: pipes, redirections, subshells and functions are bash, not FireQOS statements; sluice does not run the script", string(c))
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote")
	}
	flush()
	if len(out) > 0 {
		switch out[0] {
		case "for", "while", "until", "if", "then", "else", "elif", "fi", "do", "done", "case", "esac", "function", "select", "source", ".", "eval", "exec", "return", "exit", "break", "continue":
			return nil, fmt.Errorf("%s: sluice reads literal FireQOS statements and variables, not bash's control flow (write the statements out)", out[0])
		}
	}
	return out, nil
}

// fqVarRef reads a $NAME or ${NAME} reference at the start of s: the
// name and the bytes it takes.
func fqVarRef(s string) (string, int, error) {
	if strings.HasPrefix(s, "$(") {
		return "", 0, fmt.Errorf("command substitution: sluice does not run the script")
	}
	if strings.HasPrefix(s, "${") {
		end := strings.IndexByte(s, '}')
		if end < 0 {
			return "", 0, fmt.Errorf("unterminated ${")
		}
		name := s[2:end]
		if !fqName.MatchString(name) {
			return "", 0, fmt.Errorf("${%s}: only plain ${NAME} expands here", name)
		}
		return name, end + 1, nil
	}
	m := fqName.FindString(s[1:])
	if m == "" {
		return "", 0, fmt.Errorf("a lone $ or a special parameter: sluice reads literal statements")
	}
	return m, 1 + len(m), nil
}

var fqName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*`)

// fqRun interprets the statements.
type fqRun struct {
	d    *Draft
	r    *Report
	opt  Options
	file string

	minDivisor   int64
	defaultQdisc string
	balancedPrio int
	services     map[string][]string

	// ctxs are the interfaces being built: two for `both`.
	ctxs []*fqIface
	// refusedIface is where the last interface statement was refused
	// (nil once another is read).
	refusedIface *At
	ifcs         map[string]*Interface
	taken        map[string]map[string]bool // class names per tree
	// full: a tree passed the classes HTB holds; reading stops there,
	// so that memory stays proportional to what can be imported.
	full bool
}

// fqIface is one direction of an interface while it is read.
type fqIface struct {
	at       At
	dev, dir string // dir: input or output
	tree     *Tree
	rate     int64 // bytes/s, as FireQOS keeps them
	minrate  int64
	ipv      string // 4, 6 or 46
	root     *fqClass
	stack    []*fqClass // open parents; stack[0] is the root
	cur      *fqClass   // the class matches attach to
	matchSeq int        // FireQOS's filter prio, per interface
	lastPrio int
	all      []*fqClass
	done     bool
}

// fqClass is a class (or the interface's root) while it is read.
type fqClass struct {
	cl         *Class
	name       string // FireQOS's
	isDefault  bool
	rate, ceil int64 // bytes/s
	qdisc      string
	ipv        string
	balanced   bool
	counter    int // the next child's id
	nextPrio   int
	parent     *fqClass
	children   []*fqClass
	group      bool
	hasDefault bool
	ruleOrder  []int // FireQOS prio of each of cl.Match
	ruleAt     []At
}

func (f *fqRun) statement(s fqStmt) {
	w := s.words
	if fqAssign.MatchString(w[0]) {
		k, v, _ := strings.Cut(w[0], "=")
		f.setting(s.at, k, v)
		return
	}
	cmd, ipv := w[0], ""
	for _, suf := range []string{"46", "4", "6"} {
		if base := strings.TrimSuffix(cmd, suf); base != cmd && (base == "interface" || base == "class" || base == "match" || base == "server" || base == "client") {
			cmd, ipv = base, suf
			break
		}
	}
	switch cmd {
	case fqRefusedInterface:
		f.closeInterfaces()
		f.refusedIface = &s.at
	case "interface":
		f.refusedIface = nil
		f.interfaceStmt(s.at, w[1:], ipv)
	case "class":
		if len(f.ctxs) == 0 {
			f.refuseOutside(s.at, "class")
			return
		}
		for _, c := range f.ctxs {
			f.classStmt(c, s.at, w[1:], ipv)
		}
	case "match", "server", "client":
		if len(f.ctxs) == 0 {
			f.refuseOutside(s.at, cmd)
			return
		}
		for _, c := range f.ctxs {
			all := [][]string{w[1:]}
			if cmd != "match" {
				var ok bool
				if all, ok = f.service(c, s.at, cmd, w[1:]); !ok {
					return
				}
			}
			for _, args := range all {
				f.matchStmt(c, s.at, strings.Join(w, " "), args, ipv)
			}
		}
	case "echo", ":", "true", "set":
		// FireQOS's own scripts print; nothing to shape.
	default:
		f.r.Refuse(s.at, cmd, "not a FireQOS statement (interface, class, match, server, client) or a variable")
	}
}

// refuseOutside refuses a class or match with no interface open: one
// that came before any, or whose interface was refused.
func (f *fqRun) refuseOutside(at At, cmd string) {
	if f.refusedIface != nil {
		f.r.Refuse(at, cmd, "its interface statement (line %d) was refused", f.refusedIface.Line)
		return
	}
	f.r.Refuse(at, cmd, "a %s before any interface", cmd)
}

// setting reads an assignment: FireQOS's own settings change what it
// builds; other variables are the script's.
func (f *fqRun) setting(at At, k, v string) {
	if name, ok := fqServiceVar(k); ok {
		// The file's own service (FireHOL's way: server_rtp_ports=...).
		f.services[name] = strings.Fields(v)
		return
	}
	switch k {
	case "FIREQOS_MIN_RATE_DIVISOR":
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			f.r.Refuse(at, k, "want a whole number above 0, not %q", v)
			return
		}
		f.minDivisor = n
	case "FIREQOS_DEFAULT_QDISC":
		f.defaultQdisc = v
	case "FIREQOS_BALANCED_PRIO":
		n, err := strconv.Atoi(v)
		if err != nil {
			f.r.Refuse(at, k, "want a whole number, not %q", v)
			return
		}
		f.balancedPrio = n
	case "FIREQOS_INTERFACE_DEFAULT_CLASSID":
		f.r.Refuse(at, k, "sluice names the default class itself; remove the setting to import")
	case "FIREQOS_CONNMARK_RESTORE":
		if v != "" {
			f.r.Approx(at, k, "connmark restoring on input is not carried over; marks are not matched here")
		}
	}
}

// fqParams is what a class or interface statement sets.
type fqParams struct {
	rate, ceil, minrate  string
	prio                 string
	qdisc, qdiscOpt      string
	balanced             bool
	burst, cburst        string
	quantum, mtu         string
	linklayer            string
	overhead             string
	adslSide, adslEncaps string
	ignored              []string
}

// parseParams reads FireQOS's class and interface parameters. Rates
// after `input` or `output` count only for that direction.
func (f *fqRun) parseParams(at At, dir string, args []string) (*fqParams, bool) {
	p := &fqParams{}
	// Parameters that take a value: rates for one direction, the rest
	// for both.
	perDir := map[string]*string{"rate": &p.rate, "min": &p.rate, "commit": &p.rate, "ceil": &p.ceil, "max": &p.ceil, "minrate": &p.minrate}
	valued := map[string]*string{"prio": &p.prio, "burst": &p.burst, "cburst": &p.cburst, "quantum": &p.quantum,
		"mtu": &p.mtu, "linklayer": &p.linklayer, "overhead": &p.overhead, "qdisc": &p.qdisc}
	cur := dir
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch a {
		case "input", "output":
			cur = a
			continue
		case "priority", "balanced":
			p.balanced = a == "balanced"
			continue
		case "sfq", "pfifo", "bfifo", "fq_codel", "codel", "none":
			p.qdisc = a
		case "adsl":
			if i+2 >= len(args) {
				f.r.Refuse(at, a, "wants local|remote and an encapsulation")
				return nil, false
			}
			p.linklayer, p.adslSide, p.adslEncaps = "adsl", args[i+1], args[i+2]
			i += 2
			continue
		case "atm", "ethernet":
			p.linklayer = a
			continue
		case "hashfilter":
			f.r.Refuse(at, a, "FireQOS's hash filters have no sluice equivalent here; a per_host class (hosts_file) does the same job")
			return nil, false
		default:
			dst, ok := perDir[a]
			if !ok {
				dst = valued[a]
			}
			isIgnored := a == "r2q" || a == "mpu" || a == "tsize"
			if dst == nil && !isIgnored {
				f.r.Refuse(at, a, "not a FireQOS class or interface parameter")
				return nil, false
			}
			if i+1 >= len(args) {
				f.r.Refuse(at, a, "wants a value")
				return nil, false
			}
			i++
			switch {
			case isIgnored:
				p.ignored = append(p.ignored, a+" "+args[i])
			case perDir[a] == nil || cur == dir:
				*dst = args[i]
			}
			if a != "qdisc" {
				continue
			}
		}
		// A qdisc, by name or after `qdisc`, may take `options OPTS`.
		if i+1 < len(args) && args[i+1] == "options" {
			if i+2 >= len(args) {
				f.r.Refuse(at, "options", "wants a value")
				return nil, false
			}
			p.qdiscOpt = args[i+2]
			i += 2
		}
	}
	return p, true
}

// fqRateBytes evaluates a FireQOS rate as its rate2bps does: units
// replaced by integer factors, evaluated left to right in bash's
// integer arithmetic, to kbit/s and then bytes/s. base is the parent's
// rate in bytes/s (for %; 0 where there is none).
func fqRateBytes(s string, base int64) (int64, error) {
	m := fqRateRe.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q: FireQOS takes a whole number with bit, kbit, mbit, gbit (also capitalised), bps, kbps, mbps, gbps or %% (bash integer arithmetic: no fractions)", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n > 1<<40 {
		return 0, fmt.Errorf("%q: out of range", s)
	}
	// Bound the arithmetic before doing it (bash wraps at 64 bits;
	// nobody shapes at petabits).
	perUnit := map[string]float64{"": 1, "kbit": 1, "Kbit": 1, "mbit": 1e3, "Mbit": 1e3, "gbit": 1e6, "Gbit": 1e6,
		"bps": 0.008, "Bps": 0.008, "kbps": 8.192, "Kbps": 8.192, "mbps": 8388.608, "Mbps": 8388.608, "gbps": 8589934.592, "Gbps": 8589934.592,
		"%": 8 * float64(base) / 100 / 1000}
	if f, ok := perUnit[m[2]]; ok && float64(n)*f > 1e10 {
		return 0, fmt.Errorf("%q: out of range (over 10 Tbit/s)", s)
	}
	var kbit int64
	switch m[2] {
	case "", "kbit", "Kbit":
		kbit = n
	case "mbit", "Mbit":
		kbit = n * 1000
	case "gbit", "Gbit":
		kbit = n * 1000 * 1000
	case "bps", "Bps":
		kbit = n * 8 / 1000
	case "kbps", "Kbps":
		kbit = n * 8 * 1024 / 1000
	case "mbps", "Mbps":
		kbit = n * 8 * 1024 * 1024 / 1000
	case "gbps", "Gbps":
		kbit = n * 8 * 1024 * 1024 * 1024 / 1000
	case "%":
		if base <= 0 {
			return 0, fmt.Errorf("%q: a percentage needs a parent rate", s)
		}
		kbit = n * 8 * base / 100 / 1000
	default:
		return 0, fmt.Errorf("%q: FireQOS takes bit, kbit, mbit, gbit (also capitalised), bps, kbps, mbps, gbps or %%", s)
	}
	if kbit <= 0 && n > 0 {
		return 0, fmt.Errorf("%q: under 1 kbit/s, which FireQOS's integer arithmetic makes 0", s)
	}
	return kbit * 1000 / 8, nil
}

var fqRateRe = regexp.MustCompile(`^([0-9]+)([A-Za-z%]*)$`)

// kbitRate is what tc gets for bytes/s: FireQOS writes whole kbit/s.
func kbitRate(bytes int64) (string, float64) {
	k := float64(bytes * 8 / 1000)
	return bitRate(k * 1000), k * 1000
}

func (f *fqRun) interfaceStmt(at At, args []string, ipv string) {
	f.closeInterfaces()
	if len(args) < 3 {
		f.r.Refuse(at, "interface", "wants DEV NAME input|output|both and a rate")
		return
	}
	dev, name, dir := args[0], args[1], args[2]
	dirs := []string{dir}
	switch dir {
	case "both", "bidirectional":
		dirs = []string{"input", "output"}
	case "input", "output":
	default:
		f.r.Refuse(at, "interface "+dev, "%q: want input, output or both", dir)
		return
	}
	if ipv == "" {
		ipv = "4"
	}
	for _, dr := range dirs {
		p, ok := f.parseParams(at, dr, args[3:])
		if !ok {
			return
		}
		if p.rate == "" {
			f.r.Refuse(at, "interface "+dev, "no rate for its %s", dr)
			return
		}
		rate, err := fqRateBytes(p.rate, 0)
		if err != nil || rate <= 0 {
			f.r.Refuse(at, "interface "+dev+" rate", "%v", orZero(err))
			return
		}
		ceil := rate
		if p.ceil != "" {
			if ceil, err = fqRateBytes(p.ceil, 0); err != nil {
				f.r.Refuse(at, "interface "+dev+" ceil", "%v", err)
				return
			}
		}
		minrate := rate / f.minDivisor
		if p.minrate != "" {
			if minrate, err = fqRateBytes(p.minrate, rate); err != nil {
				f.r.Refuse(at, "interface "+dev+" minrate", "%v", err)
				return
			}
		}
		mtu := int64(1500)
		if p.mtu != "" {
			if mtu, err = strconv.ParseInt(p.mtu, 10, 64); err != nil || mtu <= 0 {
				f.r.Refuse(at, "mtu", "want a whole number of bytes, not %q", p.mtu)
				return
			}
		}
		// FireQOS's r2q is minrate/mtu (at least 1), and minrate at
		// least r2q*mtu.
		minrate = max(minrate, max(minrate/mtu, 1)*mtu)
		rs, rbits := kbitRate(rate)
		t := &Tree{At: at, Comment: fmt.Sprintf("FireQOS interface %s (%s)", name, dr), Rate: rs}
		if ceil != rate {
			f.r.Approx(at, "interface "+name+" ceil", "the interface's ceil above its rate is dropped: the tree's rate is what it sends")
		}
		qdisc := p.qdisc
		if qdisc == "" {
			qdisc = f.defaultQdisc
		}
		t.Leaf = f.leaf(at, qdisc, p.qdiscOpt, true)
		if !f.linklayer(at, t, p) {
			return
		}
		for _, ig := range p.ignored {
			f.r.Approx(at, ig, "sluice sizes HTB's quanta and the link layer's table itself")
		}
		root := &fqClass{cl: &Class{Name: name}, rate: rate, ceil: rate, qdisc: qdisc, ipv: ipv, balanced: p.balanced, counter: 10}
		root.cl.rateBits, root.cl.ceilBits = rbits, rbits
		c := &fqIface{at: at, dev: dev, dir: dr, tree: t, rate: rate, minrate: minrate, ipv: ipv, root: root}
		c.stack = []*fqClass{root}
		f.ctxs = append(f.ctxs, c)
		if f.ifcs == nil {
			f.ifcs = map[string]*Interface{}
		}
		ifc := f.ifcs[dev]
		if ifc == nil {
			ifc = &Interface{At: at, Name: dev}
			f.ifcs[dev] = ifc
			f.d.Interfaces = append(f.d.Interfaces, ifc)
		}
		slot := &ifc.Egress
		if dr == "input" {
			slot = &ifc.Ingress
		}
		if *slot != nil {
			f.r.Refuse(at, "interface "+dev, "a second %s interface on %s: FireQOS replaces the first one's tree", dr, dev)
			return
		}
		*slot = t
		f.r.Exact(at, "interface "+name, "%s of %s at %s (%s)", map[string]string{"input": "ingress", "output": "egress"}[dr], dev, rs, map[string]string{"input": "through an ifb, as FireQOS did", "output": "its own queue"}[dr])
	}
}

func orZero(err error) error {
	if err == nil {
		return fmt.Errorf("a rate of 0")
	}
	return err
}

// leaf maps FireQOS's qdisc names to sluice's leaves.
func (f *fqRun) leaf(at At, q, opts string, tree bool) string {
	if opts != "" && opts != "default" {
		f.r.Approx(at, "qdisc options "+opts, "not carried over: sluice sizes its leaves itself (a class's `limit` sets the queue)")
	}
	switch q {
	case "sfq", "pfifo", "bfifo", "fq_codel":
		return q
	case "codel":
		f.r.Approx(at, "qdisc codel", "fq_codel here (sluice has no plain codel leaf): the same AQM, per flow")
		return "fq_codel"
	case "none":
		if tree {
			return "none"
		}
		f.r.Approx(at, "qdisc none", "pfifo here (what HTB gives a class without a qdisc)")
		return "pfifo"
	}
	f.r.Refuse(at, "qdisc "+q, "FireQOS takes sfq, pfifo, bfifo, fq_codel, codel or none")
	return ""
}

// adslOverhead is the per-packet overhead of an ADSL encapsulation
// (bytes over the IP packet, the usual tables'), by FireQOS's names.
var adslOverhead = map[string]int{
	"ipoa-vcmux": 8, "ipoa-vc": 8, "ipoa-mux": 8, "IPoA-VC/Mux": 8,
	"ipoa-llcsnap": 16, "ipoa-llc": 16, "ipoa-snap": 16, "IPoA-LLC/SNAP": 16,
	"bridged-vcmux": 24, "bridged-vc": 24, "bridged-mux": 24, "Bridged-VC/Mux": 24,
	"bridged-llcsnap": 32, "bridged-llc": 32, "bridged-snap": 32, "Bridged-LLC/SNAP": 32,
	"pppoa-vcmux": 10, "pppoa-vc": 10, "pppoa-mux": 10, "PPPoA-VC/Mux": 10,
	"pppoa-llcsnap": 14, "pppoa-llc": 14, "pppoa-snap": 14, "PPPoA-LLC/SNAP": 14,
	"pppoe-vcmux": 32, "pppoe-vc": 32, "pppoe-mux": 32, "PPPoE-VC/Mux": 32,
	"pppoe-llcsnap": 40, "pppoe-llc": 40, "pppoe-snap": 40, "PPPoE-LLC/SNAP": 40,
}

func (f *fqRun) linklayer(at At, t *Tree, p *fqParams) bool {
	switch p.linklayer {
	case "":
	case "ethernet":
		t.Linklayer = "ethernet"
	case "atm":
		t.Linklayer = "atm"
	case "adsl":
		o, ok := adslOverhead[p.adslEncaps]
		diff := map[string]int{"local": 0, "remote": -14}
		d, sideOK := diff[p.adslSide]
		if !ok || !sideOK {
			f.r.Refuse(at, "adsl "+p.adslSide+" "+p.adslEncaps, "FireQOS takes adsl local|remote and one of its encapsulations (pppoe-llcsnap, pppoa-vcmux, ...)")
			return false
		}
		t.Linklayer, t.Overhead = "atm", o+d
		f.r.Exact(at, "adsl "+p.adslSide+" "+p.adslEncaps, "linklayer atm, overhead %d", t.Overhead)
	default:
		f.r.Refuse(at, "linklayer "+p.linklayer, "want ethernet or atm")
		return false
	}
	if p.overhead != "" {
		n, err := strconv.Atoi(p.overhead)
		if err != nil {
			f.r.Refuse(at, "overhead "+p.overhead, "want a whole number of bytes")
			return false
		}
		t.Overhead = n
	}
	return true
}

// closeInterfaces ends the interfaces being read: open groups end, and
// each gets its default class and its tree.
func (f *fqRun) closeInterfaces() {
	for _, c := range f.ctxs {
		if c.done {
			continue
		}
		c.done = true
		for len(c.stack) > 1 {
			f.r.Approx(c.at, "class group "+c.stack[len(c.stack)-1].cl.Name, "no `class group end`: ended with the interface, as FireQOS does")
			f.endGroup(c, c.at)
		}
		f.addDefault(c, c.root, c.at)
		f.finish(c)
	}
	f.ctxs = nil
}

// classStmt reads `class [group] NAME params` and `class group end`.
func (f *fqRun) classStmt(c *fqIface, at At, args []string, ipv string) {
	if len(args) == 0 {
		f.r.Refuse(at, "class", "wants a name")
		return
	}
	group := false
	if args[0] == "group" {
		args = args[1:]
		if len(args) > 0 && args[0] == "end" {
			if len(c.stack) <= 1 {
				f.r.Refuse(at, "class group end", "no class group is open")
				return
			}
			f.endGroup(c, at)
			return
		}
		group = true
	}
	if len(args) == 0 {
		f.r.Refuse(at, "class", "wants a name")
		return
	}
	// The class a group's first child follows is the group itself: it
	// becomes the parent.
	if c.cur != nil && c.cur.group && len(c.cur.children) == 0 && c.stack[len(c.stack)-1] != c.cur {
		c.stack = append(c.stack, c.cur)
	}
	parent := c.stack[len(c.stack)-1]
	name := args[0]
	if name == "default" && group {
		f.r.Refuse(at, "class group default", "the default class cannot have children")
		return
	}
	p, ok := f.parseParams(at, c.dir, args[1:])
	if !ok {
		return
	}
	f.newClass(c, parent, at, name, group, p, ipv)
}

func (f *fqRun) newClass(c *fqIface, parent *fqClass, at At, name string, group bool, p *fqParams, ipv string) *fqClass {
	parent.counter++
	id := parent.counter
	if name == "default" {
		id = 8000
		if parent != c.root {
			id = 8000 + parent.defaultNo(c)
		}
		parent.hasDefault = true
	}
	rate := c.minrate
	var err error
	if p.rate != "" {
		if rate, err = fqRateBytes(p.rate, parent.rate); err != nil {
			f.r.Refuse(at, "class "+name+" rate", "%v", err)
			return nil
		}
	} else if group {
		f.r.Approx(at, "class group "+name, "no committed rate: FireQOS warns and gives it the minimum, %s", bitRate(float64(c.minrate*8)))
	}
	if rate < c.minrate {
		f.r.Exact(at, "class "+name+" rate", "raised to the interface's minimum (rate/%d), %s, as FireQOS does", f.minDivisor, bitRate(float64(c.minrate*8/1000*1000)))
		rate = c.minrate
	}
	ceil := parent.ceil
	if p.ceil != "" {
		// FireQOS reads a ceil's % of the parent's rate, not its ceil.
		if ceil, err = fqRateBytes(p.ceil, parent.rate); err != nil {
			f.r.Refuse(at, "class "+name+" ceil", "%v", err)
			return nil
		}
	}
	prio := 0
	switch {
	case p.prio == "keep" || p.prio == "last":
		prio = c.lastPrio
	case p.prio != "":
		n, err := strconv.Atoi(p.prio)
		if err != nil {
			f.r.Refuse(at, "class "+name+" prio", "want a number, keep or last, not %q", p.prio)
			return nil
		}
		prio, parent.nextPrio = n, n+1
	case parent.balanced:
		prio = f.balancedPrio
	default:
		prio = parent.nextPrio
		parent.nextPrio++
	}
	if prio < 0 || prio > 7 {
		clamped := min(max(prio, 0), 7)
		f.r.Exact(at, "class "+name+" prio "+strconv.Itoa(prio), "HTB takes 0 to 7: %d, as FireQOS sets it", clamped)
		prio = clamped
	}
	c.lastPrio = prio
	qdisc := parent.qdisc
	if p.qdisc != "" {
		qdisc = p.qdisc
	}
	if ipv == "" {
		ipv = parent.ipv
	}
	taken := f.takenIn(c)
	display := name
	if name == "default" && parent != c.root {
		display = parent.cl.Name + "-default"
	}
	cl := &Class{At: at, Origin: fmt.Sprintf("1:%d", id), Name: uniqueName(className(display, "class"), taken)}
	rs, rbits := kbitRate(rate)
	cs, cbits := kbitRate(ceil)
	cl.Rate, cl.rateBits, cl.Ceil, cl.ceilBits = rs, rbits, cs, cbits
	if !group {
		cl.Prio = intp(prio)
	}
	if ceil < rate {
		f.r.Approx(at, "class "+name+" ceil", "below its rate (FireQOS refuses this at start): the rate here")
	}
	if p.burst != "" {
		if n, err := tcSize(p.burst); err != nil {
			f.r.Refuse(at, "burst "+p.burst, "%v", err)
		} else {
			cl.Burst = byteSize(n)
		}
	}
	if p.cburst != "" {
		if n, err := tcSize(p.cburst); err != nil {
			f.r.Refuse(at, "cburst "+p.cburst, "%v", err)
		} else {
			cl.Cburst = byteSize(n)
		}
	}
	if p.quantum != "" {
		f.r.Approx(at, "quantum "+p.quantum, "sluice sets quanta by the classes' rates (weights); FireQOS gave every class one MTU")
	}
	if p.linklayer != "" || p.overhead != "" {
		f.r.Refuse(at, "class "+name+" linklayer", "a group's own link layer (a nested HTB with its own size table) has no sluice equivalent: set it on the interface")
	}
	if !group {
		if l := f.leaf(at, qdisc, p.qdiscOpt, false); l != "" && l != c.tree.Leaf {
			cl.Leaf = l
		}
	}
	// The root and FireQOS's default class take two more.
	if len(c.all)+2 >= policy.MaxClasses {
		f.r.Refuse(at, "class "+name, "interface %s (%s) has %d classes here, the most one HTB tree holds (%d with its root and default); the rest of the file is not read", c.dev, c.dir, len(c.all), policy.MaxClasses)
		f.full = true
		return nil
	}
	k := &fqClass{cl: cl, name: name, isDefault: name == "default", rate: rate, ceil: ceil, qdisc: qdisc, ipv: ipv, balanced: p.balanced, parent: parent, group: group}
	if group {
		k.counter = parent.counter // a group's children continue the count
	}
	parent.children = append(parent.children, k)
	parent.cl.Classes = append(parent.cl.Classes, cl)
	c.all = append(c.all, k)
	c.cur = k
	if group {
		f.r.Exact(at, "class group "+name, "class %s (%s, ceil %s) with its classes below it; its own matches make it a gate", cl.Name, cl.Rate, cl.Ceil)
	} else {
		f.r.Exact(at, "class "+name, "class %s (%s, ceil %s%s)", cl.Name, cl.Rate, cl.Ceil, prioText(cl.Prio))
	}
	return k
}

func prioText(p *int) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf(", prio %d", *p)
}

// defaultNo is the number FireQOS gives a group's default (8000 plus
// the groups opened so far in the interface).
func (k *fqClass) defaultNo(c *fqIface) int {
	n := 0
	for _, x := range c.all {
		if x.group {
			n++
		}
		if x == k {
			return n
		}
	}
	return n
}

func (f *fqRun) takenIn(c *fqIface) map[string]bool {
	if f.taken == nil {
		f.taken = map[string]map[string]bool{}
	}
	key := c.dev + "/" + c.dir
	if f.taken[key] == nil {
		f.taken[key] = map[string]bool{}
	}
	return f.taken[key]
}

// endGroup closes the innermost group: its default is appended, and
// the outer count continues from the inner one.
func (f *fqRun) endGroup(c *fqIface, at At) {
	if c.cur != nil && c.cur.group && len(c.cur.children) == 0 && c.stack[len(c.stack)-1] != c.cur {
		c.stack = append(c.stack, c.cur) // a group with no children yet
	}
	g := c.stack[len(c.stack)-1]
	f.addDefault(c, g, at)
	c.stack = c.stack[:len(c.stack)-1]
	c.stack[len(c.stack)-1].counter = g.counter
	c.cur = g
	if len(g.cl.Match) == 0 {
		f.r.Approx(g.cl.At, "class group "+g.cl.Name, "no match sends traffic into the group, so under FireQOS its classes carried nothing; here their rules take part beside the group's siblings")
	} else {
		for _, ch := range g.children {
			if ch.isDefault {
				g.cl.Default = ch.cl.Name
			}
		}
	}
}

// addDefault appends the `default` class FireQOS adds where none was
// declared.
func (f *fqRun) addDefault(c *fqIface, parent *fqClass, at At) {
	if parent.hasDefault {
		return
	}
	if k := f.newClass(c, parent, at, "default", false, &fqParams{}, ""); k != nil {
		f.r.Exact(at, "class default", "FireQOS's default class (%s), appended as FireQOS does", k.cl.Origin)
	}
}

// finish hangs the interface's classes on its tree and checks the
// order of its rules.
func (f *fqRun) finish(c *fqIface) {
	t := c.tree
	t.Classes = c.root.cl.Classes
	for _, k := range c.root.children {
		if k.isDefault {
			t.Default = k.cl.Name
		}
	}
	fitRates(f.r, c.at, c.root.cl.rateBits, t.Classes)
	f.orderNotes(c.root)
	if c.ipv == "4" {
		finishMatches(f.r, c.at, t.Classes, f.opt, "to the default class")
	}
	if c.root.balanced {
		f.r.Approx(c.at, "balanced", "every class at prio %d shares what is spare in proportion to its rate here; FireQOS's one-MTU quanta shared it equally by packets", f.balancedPrio)
	}
}

// orderNotes: FireQOS tries a level's matches in file order (their
// filter prio), sluice a level's classes in file order. Where a match
// comes before one of an earlier class, packets matching both go
// elsewhere.
func (f *fqRun) orderNotes(parent *fqClass) {
	type rule struct {
		prio  int
		class int
		at    At
		name  string
	}
	var rs []rule
	for i, k := range parent.children {
		for j := range k.cl.Match {
			rs = append(rs, rule{k.ruleOrder[j], i, k.ruleAt[j], k.cl.Name})
		}
		f.orderNotes(k)
	}
	// rs is in class order: the rules of the classes before a's are a
	// prefix of it, and the first of them FireQOS tried after a is the
	// first where the prefix's highest prio passes a's (a search, not a
	// scan: 20,000 classes took seconds).
	pm := make([]int, len(rs)) // the highest prio in rs[:k+1]
	start := map[int]int{}     // a class's first rule in rs
	for k, r := range rs {
		pm[k] = r.prio
		if k > 0 {
			pm[k] = max(pm[k], pm[k-1])
		}
		if _, ok := start[r.class]; !ok {
			start[r.class] = k
		}
	}
	for _, a := range rs {
		n := start[a.class]
		k := sort.Search(n, func(k int) bool { return pm[k] > a.prio })
		if k == n {
			continue
		}
		// Every earlier class with a rule FireQOS tried after this one
		// (a note is rare: the scan runs only for one).
		var names []string
		first := map[string]At{} // its first such rule
		for _, b := range rs[k:n] {
			if b.prio > a.prio {
				if _, ok := first[b.name]; !ok {
					first[b.name] = b.at
					names = append(names, b.name)
				}
			}
		}
		list := ""
		for i, name := range names {
			if i == 8 {
				list += fmt.Sprintf(", and %d more", len(names)-i)
				break
			}
			if i > 0 {
				list += ", "
			}
			list += fmt.Sprintf("%s's at line %d", name, first[name].Line)
		}
		f.r.Approx(a.at, "match order", "FireQOS tried this match (for %s) before the rules of %s; here those come first (classes in file order): a packet matching both goes to the earlier class (%s)", a.name, list, strings.Join(names[:min(len(names), 8)], ", "))
	}
}

// tcpFlag sets a TCP flag rule (FireQOS's ack or syn) on the TCP rules
// of base, noting how sluice's differs (how); FireQOS ignores it for
// other protocols, and so does this.
func (f *fqRun) tcpFlag(at At, base []*Match, name string, set func(*Match), how string) {
	tcp := false
	for _, x := range base {
		if x.Proto == "tcp" {
			set(x)
			tcp = true
		}
	}
	if tcp {
		f.r.Approx(at, "match "+name, "%s", how)
	} else {
		f.r.Approx(at, "match "+name, "FireQOS reads %s only with tcp: ignored here as there", name)
	}
}

// service turns `server|client SERVICE[,SERVICE...] [params]` into
// match arguments, one match per protocol and port as FireQOS's
// simple_service makes them: the service's ports as destination ports
// of the request, reversed where the packets are replies.
func (f *fqRun) service(c *fqIface, at At, kind string, args []string) ([][]string, bool) {
	if len(args) == 0 {
		f.r.Refuse(at, kind, "wants a service name")
		return nil, false
	}
	var out [][]string
	for _, s := range strings.Split(args[0], ",") {
		ps, ok := f.services[s]
		if !ok {
			f.r.Refuse(at, kind+" "+s, "not in FireHOL's service table (services.common, services.fireqos): define server_%s_ports=\"PROTO/PORT ...\" in the file, or write `match PROTO dport PORT`", s)
			return nil, false
		}
		for _, p := range ps {
			proto, port, ok := strings.Cut(p, "/")
			if !ok || proto == "any" && port == "any" {
				f.r.Refuse(at, kind+" "+s, "service %s is %q: every packet, not a service a class can be given by its ports", s, p)
				return nil, false
			}
			var m []string
			if proto != "any" {
				m = append(m, "proto", proto)
			}
			if port != "any" {
				m = append(m, "dports", port)
			}
			if kind == "server" && c.dir == "output" || kind == "client" && c.dir == "input" {
				m = append(m, "reverse")
			}
			out = append(out, append(m, args[1:]...))
		}
	}
	return out, true
}

// fqServices are the services `server` and `client` name: FireHOL's
// table (fqServiceTable), with what a newer FireHOL installed here
// defines besides. A config's own server_NAME_ports variables add to
// them as it is read (setting).
func fqServices() map[string][]string {
	m := map[string][]string{}
	for name, ports := range fqServiceTable {
		m[name] = strings.Fields(ports)
	}
	for _, file := range []string{"/usr/lib/firehol/services.common", "/usr/lib/firehol/services.fireqos"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
			if name, ok2 := fqServiceVar(k); ok && ok2 && m[name] == nil {
				if ps := strings.Fields(strings.Trim(v, `"'`)); len(ps) > 0 {
					m[name] = ps
				}
			}
		}
	}
	return m
}

// fqServiceVar reads server_NAME_ports, FireHOL's way to define a
// service.
func fqServiceVar(k string) (string, bool) {
	if !strings.HasPrefix(k, "server_") || !strings.HasSuffix(k, "_ports") || len(k) <= len("server__ports") {
		return "", false
	}
	return strings.TrimSuffix(strings.TrimPrefix(k, "server_"), "_ports"), true
}

// fqMatchArgs is what a match statement says.
type fqMatchArgs struct {
	protos, ports, sports, dports, src, dst, ips, tos, dscp, marks []string
	ack, syn, reverse                                              bool
	class, prio                                                    string
}

func (f *fqRun) matchStmt(c *fqIface, at At, what string, args []string, ipv string) {
	if c.cur == nil {
		f.r.Refuse(at, "match", "a match above all classes (FireQOS refuses it too: it has no class to send to)")
		return
	}
	m := fqMatchArgs{}
	list := func(v string) []string {
		var out []string
		for _, x := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
			if x != "any" {
				out = append(out, x)
			}
		}
		return out
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := func() (string, bool) {
			if i+1 >= len(args) {
				f.r.Refuse(at, "match "+a, "wants a value")
				return "", false
			}
			i++
			return args[i], true
		}
		switch a {
		case "input", "output":
			m.reverse = a != c.dir
		case "reverse":
			m.reverse = true
		case "tcp", "TCP", "udp", "UDP", "icmp", "ICMP", "gre", "GRE", "ipv6", "IPv6", "all":
			m.protos = []string{strings.ToLower(a)}
		case "ack", "acks":
			m.ack = true
		case "syn", "syns":
			m.syn = true
		case "mark", "marks", "connmark", "connmarks", "custommark", "custommarks":
			f.r.Refuse(at, "match "+a, "FireHOL's mark types map onto bit ranges set in firehol-defaults.conf, which sluice does not read: write `rawmark VALUE/MASK`")
			return
		case "at", "root", "flowid", "custom", "estimator", "police", "limit", "srcmac", "smac", "dstmac", "dmac", "insidegre", "arp":
			f.r.Refuse(at, "match "+a, "no sluice equivalent for FireQOS's %s", a)
			return
		default:
			v, ok := val()
			if !ok {
				return
			}
			switch a {
			case "proto", "protocol", "protocols":
				m.protos = list(v)
			case "port", "ports":
				m.ports = list(v)
			case "sport", "sports":
				m.sports = list(v)
			case "dport", "dports":
				m.dports = list(v)
			case "src":
				m.src = list(v)
			case "dst":
				m.dst = list(v)
			case "ip", "ips", "net", "nets", "host", "hosts":
				m.ips = list(v)
			case "tos":
				m.tos = list(v)
			case "dscp":
				m.dscp = list(v)
			case "rawmark", "rawmarks":
				m.marks = list(v)
			case "class":
				m.class = v
			case "prio":
				m.prio = v
			default:
				f.r.Refuse(at, "match "+a, "not a FireQOS match option")
				return
			}
		}
	}
	if m.reverse {
		m.src, m.dst, m.sports, m.dports = m.dst, m.src, m.dports, m.sports
	}
	if len(m.ports) > 0 && len(m.sports)+len(m.dports) > 0 || len(m.ips) > 0 && len(m.src)+len(m.dst) > 0 || len(m.tos) > 0 && len(m.dscp) > 0 {
		f.r.Refuse(at, "match", "port with sport/dport, ip with src/dst, or tos with dscp: FireQOS refuses these together")
		return
	}
	target := c.cur
	if m.class != "" && m.class != c.cur.name {
		target = nil
		for _, k := range c.all {
			if k.name == m.class {
				target = k
				break
			}
		}
		if target == nil {
			f.r.Refuse(at, "match class "+m.class, "no such class (declared before this match) in this interface")
			return
		}
		if target.parent != c.cur.parent {
			f.r.Refuse(at, "match class "+m.class, "a class of another level: FireQOS's filter would sit where the class cannot be reached from")
			return
		}
	}
	if ipv == "" {
		ipv = target.ipv
	}
	seq := c.matchSeq + 1
	if m.prio != "" {
		n, err := strconv.Atoi(m.prio)
		if err != nil {
			f.r.Refuse(at, "match prio "+m.prio, "want a number")
			return
		}
		seq = n
	} else {
		c.matchSeq++
		seq = c.matchSeq * 10
	}
	rules, ok := f.rules(at, &m, ipv)
	if !ok {
		return
	}
	dir := map[string]string{"input": "ingress", "output": "egress"}[c.dir]
	f.r.Exact(at, what, "%d rule(s) of class %s (%s %s)", len(rules), target.cl.Name, c.dev, dir)
	for _, r := range rules {
		target.cl.Match = append(target.cl.Match, r)
		target.ruleOrder = append(target.ruleOrder, seq)
		target.ruleAt = append(target.ruleAt, at)
	}
}

// rules expands a match into sluice's entries: one per protocol, TOS
// or DSCP value and mark, and two (source and destination) for `port`
// and `ip`.
func (f *fqRun) rules(at At, m *fqMatchArgs, ipv string) ([]*Match, bool) {
	ports := func(vs []string) ([]string, bool) {
		var out []string
		for _, v := range vs {
			lo, hi, rng := strings.Cut(strings.Replace(v, ":", "-", 1), "-")
			a, err1 := strconv.ParseUint(lo, 10, 16)
			b, err2 := strconv.ParseUint(hi, 10, 16)
			switch {
			case err1 != nil || rng && err2 != nil:
				f.r.Refuse(at, "port "+v, "want a port number or a range FROM:TO (FireQOS's arithmetic reads a name as 0)")
				return nil, false
			case rng && b > a:
				out = append(out, fmt.Sprintf("%d-%d", a, b))
			default:
				out = append(out, strconv.FormatUint(a, 10))
			}
		}
		return out, true
	}
	addrs := func(vs []string) ([]string, bool) {
		for _, v := range vs {
			if _, err := netip.ParsePrefix(v); err != nil {
				if _, err := netip.ParseAddr(v); err != nil {
					f.r.Refuse(at, "address "+v, "not an address or prefix")
					return nil, false
				}
			}
		}
		return vs, true
	}
	var ok bool
	for _, l := range []*[]string{&m.ports, &m.sports, &m.dports} {
		if *l, ok = ports(*l); !ok {
			return nil, false
		}
	}
	for _, l := range []*[]string{&m.src, &m.dst, &m.ips} {
		if *l, ok = addrs(*l); !ok {
			return nil, false
		}
	}
	n := max(len(m.protos), 1) * max(len(m.tos), 1) * max(len(m.dscp), 1) * max(len(m.marks), 1)
	for _, l := range [][]string{m.ports, m.ips} {
		if len(l) > 0 {
			n *= 2
		}
	}
	if n > 256 {
		f.r.Refuse(at, "match", "expands to %d rules (lists of protocols, TOS, DSCP and marks multiply, and port and ip double them): split it", n)
		return nil, false
	}
	base := []*Match{{At: at}}
	cross := func(n int, set func(*Match, int)) {
		if n == 0 {
			return
		}
		var out []*Match
		for _, b := range base {
			for i := 0; i < n; i++ {
				c := *b
				set(&c, i)
				out = append(out, &c)
			}
		}
		base = out
	}
	var protos []string
	for _, p := range m.protos {
		if p != "all" {
			protos = append(protos, strings.ToLower(p))
		}
	}
	cross(len(protos), func(x *Match, i int) { x.Proto = protos[i] })
	if len(m.ports) > 0 {
		cross(2, func(x *Match, i int) {
			if i == 0 {
				x.Sport = m.ports
			} else {
				x.Dport = m.ports
			}
		})
	}
	for _, x := range base {
		if len(m.sports) > 0 {
			x.Sport = m.sports
		}
		if len(m.dports) > 0 {
			x.Dport = m.dports
		}
		x.Src, x.Dst = m.src, m.dst
	}
	if len(m.ips) > 0 {
		cross(2, func(x *Match, i int) {
			if i == 0 {
				x.Src = m.ips
			} else {
				x.Dst = m.ips
			}
		})
	}
	var tos []string
	for _, t := range m.tos {
		v, ok := fqTOS(t)
		if !ok {
			f.r.Refuse(at, "tos "+t, "want a FireQOS TOS name or VALUE[/MASK]")
			return nil, false
		}
		if v != "" {
			tos = append(tos, v)
		}
	}
	cross(len(tos), func(x *Match, i int) { x.TOS = tos[i] })
	var dscp []string
	for _, d := range m.dscp {
		u := strings.ToUpper(d)
		if fqDSCP[u] {
			dscp = append(dscp, u)
			continue
		}
		f.r.Approx(at, "dscp "+d, "FireQOS knows DSCP by name only (CS0-CS7, AF11-AF43, EF): its filter matched every DSCP, and so does this rule (write `dscp: %s` in the policy if that was meant)", d)
	}
	cross(len(dscp), func(x *Match, i int) { x.DSCP = dscp[i] })
	cross(len(m.marks), func(x *Match, i int) { x.Mark = m.marks[i] })
	if m.ack {
		f.tcpFlag(at, base, "ack", func(x *Match) { x.TCPAck = true },
			"sluice's tcp_ack: TCP with only ACK among its flags (ECE/CWR may be set) under 128 bytes; FireQOS's: exactly ACK, under 64 bytes, no IP options")
	}
	if m.syn {
		f.tcpFlag(at, base, "syn", func(x *Match) { x.TCPSyn = true },
			"sluice's tcp_syn: TCP with SYN set (SYN-ACKs too), its flags read past any IP options; FireQOS's u32 read them at a fixed offset (no IP options)")
	}
	fam6 := ipv == "6"
	var out []*Match
	for _, x := range base {
		if len(x.Src)+len(x.Dst)+len(x.Sport)+len(x.Dport) == 0 && x.Proto == "" && x.DSCP == "" && x.TOS == "" && x.Mark == "" {
			// No condition: every packet of the rule's families (sluice
			// refuses an empty entry).
			switch ipv {
			case "6":
				x.Src = []string{"::/0"}
			case "46":
				v6 := *x
				v6.Src = []string{"::/0"}
				out = append(out, &v6)
				fallthrough
			default:
				x.Src = []string{"0.0.0.0/0"}
			}
		}
		out = append(out, x)
	}
	base = out
	for _, x := range base {
		has := len(x.Src)+len(x.Dst) > 0
		for _, a := range append(slices.Clone(x.Src), x.Dst...) {
			p, err := netip.ParsePrefix(a)
			if err != nil {
				pa, _ := netip.ParseAddr(a)
				p = netip.PrefixFrom(pa, pa.BitLen())
			}
			if p.Addr().Is6() != fam6 && ipv != "46" {
				f.r.Refuse(at, "address "+a, "an IPv%s rule with an address of the other family: FireQOS's filter never matched it", ipv)
				return nil, false
			}
		}
		if fam6 && !has {
			x.Src = []string{"::/0"} // IPv6 alone, as FireQOS's filter
		}
	}
	if ipv == "46" {
		f.r.Exact(at, "match (IPv4 and IPv6)", "rules without addresses match both families here too")
	}
	return base, true
}

// fqTOS is a FireQOS TOS value as sluice's value/mask ("" for any).
func fqTOS(t string) (string, bool) {
	switch t {
	case "lowdelay", "min-delay", "minimize-delay", "minimum-delay", "low-delay", "interactive":
		return "0x10/0x10", true
	case "throughput", "maximize-throughput", "maximum-throughput", "max-throughput", "high-throughput", "bulk":
		return "0x08/0x08", true
	case "reliability", "maximize-reliability", "maximum-reliability", "max-reliability", "reliable":
		return "0x04/0x04", true
	case "mincost", "min-cost", "minimize-cost", "minimum-cost", "low-cost", "cheap":
		return "0x02/0x02", true
	case "normal", "normal-service":
		return "0x00/0x1e", true
	case "all":
		return "", true
	}
	v, mask, hasMask := strings.Cut(t, "/")
	if !hasMask {
		mask = "0xff"
	}
	a, err1 := strconv.ParseUint(v, 0, 8)
	b, err2 := strconv.ParseUint(mask, 0, 8)
	if err1 != nil || err2 != nil {
		return "", false
	}
	return fmt.Sprintf("0x%02x/0x%02x", a, b), true
}

var fqDSCP = map[string]bool{"CS0": true, "CS1": true, "CS2": true, "CS3": true, "CS4": true, "CS5": true, "CS6": true, "CS7": true,
	"AF11": true, "AF12": true, "AF13": true, "AF21": true, "AF22": true, "AF23": true, "AF31": true, "AF32": true, "AF33": true,
	"AF41": true, "AF42": true, "AF43": true, "EF": true}

// varHint names a variable the file sets that an unset name may have
// meant: a typo, or one of the same family (OUTPUT_RATE for
// OUTPUT_SPEED).
func varHint(name string, vars map[string]string) string {
	var names []string
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	if s := policy.Suggest(name, names); s != "" {
		return "; did you mean $" + s + "?"
	}
	if head, _, ok := strings.Cut(name, "_"); ok && len(head) >= 3 {
		for _, k := range names {
			if strings.HasPrefix(k, head+"_") {
				return "; did you mean $" + k + "?"
			}
		}
	}
	return ""
}
