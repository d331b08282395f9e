package migrate

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"sluice/safefile"
)

// The wondershaper variants in use (seed 002): LARTC's 1.1a scripts
// (wshaper, CBQ; wshaper.htb, HTB) with the settings at their top;
// Debian's 1.1a package, the CBQ script taking DEV DOWNLINK UPLINK on
// its command line; magnific0's 1.4.1, `-a DEV -d KBIT -u KBIT` or a
// wondershaper.conf of IFACE, DSPEED and USPEED.
const (
	wsDebian = "wondershaper 1.1a (Debian, CBQ)"
	wsCBQ    = "wondershaper 1.1a (LARTC wshaper, CBQ)"
	wsHTB    = "wondershaper 1.1a (LARTC wshaper.htb, HTB)"
	ws141    = "wondershaper 1.4.1 (magnific0)"
)

type wsConfig struct {
	variant  string
	at       At // the command line or the file
	dev      string
	down, up int // kbit/s; 0: not shaped
	vars     map[string][]string
	varAt    map[string]At
	ackOnly  bool // the small-packet rule also wants ACK alone set
	mldonkey bool // UDP from port 4666 to the low class (Debian's)
	lowClass bool // a 1:30 class for NOPRIO traffic
}

// Wondershaper imports wondershaper's settings: a script or
// wondershaper.conf (file), or the command line that ran it (args,
// the program's name first).
func Wondershaper(file string, args []string, opt Options) (*Draft, error) {
	var cfg *wsConfig
	var err error
	if len(args) > 0 {
		cfg, err = wsCommandLine(args)
	} else {
		cfg, err = wsFile(file)
	}
	if err != nil {
		return nil, err
	}
	return cfg.draft(opt)
}

var wsAssign = regexp.MustCompile(`^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)

// wsFile reads a script or a wondershaper.conf: the shell assignments
// at top level (quotes and bash arrays understood, $N left for the
// command line), and which of the variants' rules the script has.
func wsFile(file string) (*wsConfig, error) {
	b, err := safefile.ReadRegular(file, "wondershaper script or conf", maxSourceBytes)
	if err != nil {
		return nil, err
	}
	text := string(b)
	c := &wsConfig{at: At{File: file}, vars: map[string][]string{}, varAt: map[string]At{}}
	for i, line := range strings.Split(text, "\n") {
		line = shellComment(line)
		m := wsAssign.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, seen := c.vars[m[1]]; seen && strings.Contains(m[2], "$") {
			continue // 1.4.1's `eval export X=$X` keeps what the conf set
		}
		c.vars[m[1]] = shellWords(m[2])
		c.varAt[m[1]] = At{file, i + 1}
	}
	has := func(re string) bool { return regexp.MustCompile(re).MatchString(text) }
	if has(`(?m)^\s*while\s+getopts\b`) && !has(`(?m)^\s*\[wondershaper\]`) {
		// Releases from 1.2 on are a program that reads its settings
		// from its options: the settings are in the command line.
		return nil, fmt.Errorf("%s: this is the wondershaper program itself (it reads the device and rates from its options), not a configuration: import the command line that runs it, as in `sluice import wondershaper -- wondershaper -a eth0 -d 1024 -u 512`, or 1.4.1's wondershaper.conf", file)
	}
	switch {
	case has(`(?m)^\s*\[wondershaper\]`) || c.vars["IFACE"] != nil || c.vars["USPEED"] != nil || c.vars["DSPEED"] != nil:
		c.variant = ws141
		c.dev = c.one("IFACE")
		c.down, err = c.kbit("DSPEED", true)
		if err != nil {
			return nil, err
		}
		c.up, err = c.kbit("USPEED", true)
		if err != nil {
			return nil, err
		}
		c.lowClass = true
		return c, nil
	case has(`\bcbq\b`):
		c.variant = wsCBQ
	case has(`\bhtb\b`):
		c.variant = wsHTB
	default:
		return nil, fmt.Errorf("%s: not a wondershaper script or wondershaper.conf (no cbq or htb root, no IFACE/USPEED/DSPEED)", file)
	}
	c.ackOnly = has(`0x10\s+0xff\s+at\s+33`)
	c.mldonkey = has(`sport\s+4666`)
	c.lowClass = has(`classid\s+1:30`)
	for _, v := range []string{"DEV", "DOWNLINK", "UPLINK"} {
		if w := c.vars[v]; len(w) == 1 && strings.HasPrefix(w[0], "$") {
			return nil, fmt.Errorf("%s: %s is taken from the command line (%s): import the command line instead, as in `sluice import wondershaper -- wondershaper eth0 800 220`",
				c.varAt[v], v, w[0])
		}
	}
	c.dev = c.one("DEV")
	if c.down, err = c.kbit("DOWNLINK", false); err != nil {
		return nil, err
	}
	if c.up, err = c.kbit("UPLINK", false); err != nil {
		return nil, err
	}
	return c, nil
}

// classAt is where classes say they came from: the file, or nothing
// for a command line (the report names it).
func (c *wsConfig) classAt() At {
	if strings.HasPrefix(c.at.File, "command line") {
		return At{}
	}
	return c.at
}

func (c *wsConfig) one(v string) string {
	if w := c.vars[v]; len(w) > 0 {
		return w[0]
	}
	return ""
}

func (c *wsConfig) kbit(v string, optional bool) (int, error) {
	s := c.one(v)
	if s == "" {
		if optional {
			return 0, nil
		}
		return 0, fmt.Errorf("%s: %s is not set", c.at, v)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s: %s=%s: want a whole number of kbit/s (the script does integer arithmetic with it)", c.varAt[v], v, s)
	}
	return n, nil
}

// shellComment cuts a line at a '#' that starts a word outside quotes.
func shellComment(line string) string {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '"' || r == '\'':
			quote = r
		case r == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return line[:i]
		}
	}
	return line
}

// shellWords reads the right side of an assignment: a quoted or bare
// word, or a bash array ( a "b" ), without expansion.
func shellWords(s string) []string {
	s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), ";"))
	if strings.HasPrefix(s, "(") {
		s = strings.TrimSuffix(strings.TrimPrefix(s, "("), ")")
	}
	var out []string
	for _, f := range strings.Fields(s) {
		f = strings.Trim(f, `"'`)
		if f != "" {
			out = append(out, f)
		}
	}
	if out == nil {
		return []string{}
	}
	return out
}

// wsCommandLine reads `wondershaper DEV DOWN UP` (Debian's 1.1a) or
// `wondershaper -a DEV [-d KBIT] [-u KBIT]` (1.4.1).
func wsCommandLine(args []string) (*wsConfig, error) {
	at := At{File: "command line: " + strings.Join(args, " ")}
	rest := args
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") && strings.Contains(filepath.Base(rest[0]), "wondershaper") {
		rest = rest[1:]
	}
	c := &wsConfig{at: at, vars: map[string][]string{}, varAt: map[string]At{}}
	kb := func(what, s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%s: %s %q: want a whole number of kbit/s", at, what, s)
		}
		return n, nil
	}
	if len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
		c.variant, c.lowClass = ws141, true
		var conf string
		for i := 0; i < len(rest); i++ {
			f := rest[i]
			val := func() (string, error) {
				if i+1 >= len(rest) {
					return "", fmt.Errorf("%s: %s needs a value", at, f)
				}
				i++
				return rest[i], nil
			}
			var err error
			var v string
			switch f {
			case "-a":
				c.dev, err = val()
			case "-d":
				if v, err = val(); err == nil {
					c.down, err = kb("-d", v)
				}
			case "-u":
				if v, err = val(); err == nil {
					c.up, err = kb("-u", v)
				}
			case "-f":
				conf, err = val()
			case "-p":
				if conf == "" {
					conf = "/etc/systemd/wondershaper.conf"
				}
			case "-c", "-s", "-h", "-v":
				return nil, fmt.Errorf("%s: %s clears, shows or prints; it sets up nothing to import", at, f)
			default:
				return nil, fmt.Errorf("%s: %s is not a wondershaper 1.4.1 option (-a -d -u -p -f)", at, f)
			}
			if err != nil {
				return nil, err
			}
		}
		if conf != "" {
			fc, err := wsFile(conf)
			if err != nil {
				return nil, err
			}
			// Options given on the command line before -p are
			// overridden by the conf, as `source` does.
			c.vars, c.varAt = fc.vars, fc.varAt
			if fc.dev != "" {
				c.dev = fc.dev
			}
			if fc.down != 0 {
				c.down = fc.down
			}
			if fc.up != 0 {
				c.up = fc.up
			}
		}
		return c, nil
	}
	switch len(rest) {
	case 3:
	case 1, 2:
		return nil, fmt.Errorf("%s: with %d argument(s) Debian's wondershaper shows or clears a device; it sets up nothing to import", at, len(rest))
	default:
		return nil, fmt.Errorf("%s: want `wondershaper DEV DOWNLINK UPLINK` (Debian's 1.1a) or `wondershaper -a DEV -d KBIT -u KBIT` (1.4.1)", at)
	}
	c.variant, c.mldonkey, c.lowClass = wsDebian, true, true
	c.dev = rest[0]
	var err error
	if c.down, err = kb("DOWNLINK", rest[1]); err != nil {
		return nil, err
	}
	if c.up, err = kb("UPLINK", rest[2]); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *wsConfig) draft(opt Options) (*Draft, error) {
	if c.dev == "" {
		return nil, fmt.Errorf("%s: no device (DEV, IFACE or -a)", c.at)
	}
	if c.up == 0 && c.down == 0 {
		return nil, fmt.Errorf("%s: neither an upload nor a download rate", c.at)
	}
	d := &Draft{Tool: c.variant + ", " + c.at.String()}
	defer d.settle(c.at)
	r := &d.Report
	if c.up > 0 && c.up < 10 {
		// 9*UPLINK/10 in the shell's integer arithmetic is 0kbit,
		// which tc refuses.
		r.Refuse(c.at, fmt.Sprintf("UPLINK %d", c.up), "below 10 kbit/s the script's own classes get a rate of 0, which tc refuses")
	}
	ifc := &Interface{At: c.at, Name: c.dev}
	d.Interfaces = []*Interface{ifc}
	kbit := func(v int) float64 { return float64(v) * 1000 }
	if c.up > 0 {
		up := kbit(c.up)
		t := &Tree{At: c.at, Rate: bitRate(up), Default: "bulk", Comment: "class 1:1: UPLINK"}
		mk := func(origin, name, comment string, rate, ceil float64, prio int) *Class {
			return &Class{At: c.classAt(), Origin: origin, Name: name, Comment: comment, Prio: intp(prio),
				rateBits: rate, ceilBits: ceil, Rate: bitRate(rate), Ceil: bitRate(ceil), Leaf: "sfq"}
		}
		pct := func(p int) float64 { return kbit(p * c.up / 100) }
		var inter, bulk, low *Class
		switch c.variant {
		case ws141:
			inter = mk("1:10", "interactive", "TOS minimum delay, HIPRIODST, ICMP, small TCP packets", max(pct(20), 1000), pct(95), 1)
			bulk = mk("1:20", "bulk", "everything else", max(pct(40), 1000), pct(95), 2)
			low = mk("1:30", "low", "NOPRIO hosts and ports", max(pct(20), 1000), pct(90), 3)
			r.Approx(c.at, "sfq quantum 6000", "sluice's sfq leaves take the kernel's quantum (one MTU)")
		case wsHTB:
			// HTB's ceil defaults to the class's own rate.
			inter = mk("1:10", "interactive", "TOS minimum delay, ICMP, small ACKs", up, up, 1)
			bulk = mk("1:20", "bulk", "everything else", kbit(9*c.up/10), kbit(9*c.up/10), 2)
			low = mk("1:30", "low", "NOPRIO hosts and ports", kbit(8*c.up/10), kbit(8*c.up/10), 2)
			for _, cl := range []*Class{inter, bulk, low} {
				cl.Burst = "6kb"
			}
		default:
			// CBQ's classes under the bounded 1:1 borrow up to it.
			inter = mk("1:10", "interactive", "TOS minimum delay, ICMP, small TCP packets", up, up, 1)
			bulk = mk("1:20", "bulk", "everything else", kbit(9*c.up/10), up, 2)
			low = mk("1:30", "low", "NOPRIO hosts and ports", kbit(8*c.up/10), up, 2)
			r.Approx(c.at, "CBQ", "CBQ (gone from Linux since 6.3) becomes HTB: the classes keep their rates and prios and borrow up to UPLINK as CBQ's unbounded classes under the bounded 1:1 did; allot and avpkt have no HTB counterpart")
		}
		r.Exact(c.at, "class 1:1", "the egress tree's rate, %s", t.Rate)
		r.Exact(c.at, "sfq perturb 10", "leaf: sfq (sluice's rehashes every 10 s)")
		inter.Match = append(inter.Match, &Match{At: c.at, TOS: "0x10/0xff"})
		r.Exact(c.at, "match ip tos 0x10 0xff", "tos: 0x10/0xff on interactive")
		for _, h := range c.vars["HIPRIODST"] {
			p, err := parsePrefix4(h)
			if err != nil {
				r.Refuse(c.varAt["HIPRIODST"], "HIPRIODST "+h, "%v", err)
				continue
			}
			inter.Match = append(inter.Match, &Match{At: c.varAt["HIPRIODST"], Dst: []string{prefixText(p)}})
		}
		inter.Match = append(inter.Match, &Match{At: c.at, Proto: "icmp"})
		r.Exact(c.at, "match ip protocol 1", "proto: icmp on interactive")
		inter.Match = append(inter.Match, &Match{At: c.at, TCPAck: true})
		if c.ackOnly {
			r.Approx(c.at, "small ACKs", "tcp_ack: pure ACKs under 128 bytes, with or without IP options; the old rule took ACK-only TCP packets under 64 bytes without options")
		} else {
			r.Approx(c.at, "small TCP packets", "tcp_ack: pure ACKs under 128 bytes; the old rule took every TCP packet under 64 bytes without IP options (SYN, FIN and RST too)")
		}
		if c.mldonkey {
			low.Match = append(low.Match, &Match{At: c.at, Proto: "udp", Sport: []string{"4666"}})
			r.Exact(c.at, "UDP from port 4666", "proto: udp, sport: 4666 on low (MLDonkey)")
		}
		noprio := 0
		for _, v := range []string{"NOPRIOPORTDST", "NOPRIOPORTSRC", "NOPRIOHOSTSRC", "NOPRIOHOSTDST"} {
			for _, w := range c.vars[v] {
				m := &Match{At: c.varAt[v]}
				var err error
				switch v {
				case "NOPRIOPORTDST", "NOPRIOPORTSRC":
					var ps []string
					if ps, err = portMask(w); err == nil {
						if v == "NOPRIOPORTDST" {
							m.Dport = ps
						} else {
							m.Sport = ps
						}
					}
				default:
					p, perr := parsePrefix4(w)
					if perr != nil {
						// tc reads what is not a dotted quad as its
						// short form: "80" is 80.0.0.0. The rule the
						// script installed matched that address.
						if tp, ok := tcShortIPv4(w); ok {
							p, perr = tp, nil
							r.Approx(c.varAt[v], v+" "+w, "not an address as written: tc read it as %s, which the old rule matched, and so does this one (if a port was meant, it belongs in NOPRIOPORT%s)",
								prefixText(tp), strings.TrimPrefix(v, "NOPRIOHOST"))
						}
					}
					err = perr
					if v == "NOPRIOHOSTSRC" {
						m.Src = []string{prefixText(p)}
					} else {
						m.Dst = []string{prefixText(p)}
					}
				}
				if err != nil {
					r.Refuse(c.varAt[v], v+" "+w, "%v", err)
					continue
				}
				low.Match = append(low.Match, m)
				noprio++
			}
		}
		t.Classes = []*Class{inter, bulk}
		if c.lowClass || noprio > 0 {
			t.Classes = append(t.Classes, low)
		}
		r.Exact(c.at, "match ip dst 0.0.0.0/0 flowid 1:20", "bulk is the default class")
		fitRates(r, c.at, up, t.Classes)
		switch c.variant {
		case ws141:
			// Its IPv6 filters fail to install: each shares a prio with
			// an IPv4 filter (the kernel refuses a second protocol at
			// one prio) or is not valid tc (`match ip6 tos`).
			finishMatches(r, c.at, t.Classes, opt, "to bulk: 1.4.1's IPv6 filters fail to install")
		case wsHTB:
			finishMatches(r, c.at, t.Classes, opt, "to bulk, HTB's default")
		default:
			finishMatches(r, c.at, t.Classes, opt, "to CBQ's root link class, unshaped by UPLINK")
			r.Approx(c.at, "IPv6 on the uplink", "CBQ left IPv6 to its root link class, unshaped by UPLINK; here IPv6 is shaped")
		}
		ifc.Egress = t
	}
	if c.down > 0 {
		down := kbit(c.down)
		if c.variant == ws141 {
			ifc.Ingress = &Tree{At: c.at, Rate: bitRate(down), Default: "all", Comment: "ifb0, class 2:1: DSPEED",
				Classes: []*Class{{At: c.classAt(), Origin: "2:1", Name: "all", Rate: bitRate(down), Leaf: "pfifo"}}}
			r.Exact(c.at, "ifb0 with class 2:1", "ingress: %s on an ifb of sluice's own (1.4.1 used ifb0, which other tools may share)", ifc.Ingress.Rate)
		} else {
			ifc.Ingress = &Tree{At: c.at, Police: &Police{CIR: bitRate(down), CBS: "10kb", Red: "drop"}, Comment: "the ingress policer: DOWNLINK"}
			r.Approx(c.at, "ingress police rate "+bitRate(down)+" burst 10k drop", "a BPF policer (cir %s, cbs 10kb, red drop) that meters IPv6 too; the old one matched IPv4 alone (`protocol ip`)", bitRate(down))
		}
	}
	return d, nil
}

// tcShortIPv4 reads an IPv4 address as tc(8) does where it is not a
// dotted quad: up to four parts, each a C number (0x1f, 017, 31) of at
// most 255, the missing ones zero ("80" is 80.0.0.0, "10.1" 10.1.0.0).
// Without a length it is one address.
func tcShortIPv4(s string) (netip.Prefix, bool) {
	addr, bits := s, 32
	if a, l, ok := strings.Cut(s, "/"); ok {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 || n > 32 {
			return netip.Prefix{}, false
		}
		addr, bits = a, n
	}
	var b [4]byte
	parts := strings.Split(addr, ".")
	if len(parts) > 4 {
		return netip.Prefix{}, false
	}
	for i, part := range parts {
		n, err := strconv.ParseUint(part, 0, 8)
		// C's strtoul, not Go's literals: no 0b, 0o or underscores.
		if err != nil || part == "" || strings.ContainsAny(part, "+_bBoO") {
			return netip.Prefix{}, false
		}
		b[i] = byte(n)
	}
	return netip.PrefixFrom(netip.AddrFrom4(b), bits).Masked(), true
}
