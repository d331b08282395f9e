package migrate

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"sluice/safefile"
)

// sqm-scripts (OpenWrt's SQM) keeps one `config queue` section per
// shaped interface in /etc/config/sqm (UCI): download and upload in
// kbit/s (0: that direction unshaped), the leaf qdisc, the script that
// builds the tree, and the link layer. Upload is the interface's
// egress, download its ingress (sqm redirects it to an ifb, as sluice
// does). The scripts sluice reads, and what they build (sqm-scripts'
// own sources):
//   - simplest.qos: one HTB class at the link's rate with the qdisc as
//     its leaf.
//   - simple.qos: three HTB tiers under the link: priority (rate 128
//     kbit up, 32 down; ceil a third of the link; prio 1), best effort
//     (rate a sixth, ceil the link less 16 kbit, prio 2, the default)
//     and background (as best effort, prio 3), sorted by DSCP (egress:
//     iptables marks, ingress: u32 on the TOS byte); with squash_ingress
//     (the default) the ingress is one class. With a cake qdisc it is
//     layer_cake.
//   - piece_of_cake.qos: cake at the root, besteffort: one class.
//   - layer_cake.qos: cake at the root with its diffserv3 tins.
type sqmQueue struct {
	at    At
	name  string
	opt   map[string]string
	optAt map[string]At
}

// SQM imports sqm-scripts' configuration: OpenWrt's UCI file
// (/etc/config/sqm), or the shell form the other distributions install
// (/etc/sqm: default.conf and a DEV.iface.conf per interface; see
// sqmShell).
func SQM(file string, opt Options) (*Draft, error) {
	if fi, err := os.Lstat(file); err == nil && fi.IsDir() {
		return sqmShellDir(file, opt)
	}
	b, err := safefile.ReadRegular(file, "sqm config", maxSourceBytes)
	if err != nil {
		return nil, err
	}
	text := string(b)
	if sqmRecipe.MatchString(text) {
		return nil, fmt.Errorf("%s: this is an sqm recipe (a .qos script sqm runs to build its tree), not a configuration: import the configuration that names it, /etc/config/sqm on OpenWrt, or /etc/sqm (default.conf and DEV.iface.conf) elsewhere", file)
	}
	if sqmShellForm(text) {
		return sqmShellFile(file, opt)
	}
	d := &Draft{Tool: "sqm-scripts"}
	r := &d.Report
	var qs []*sqmQueue
	var cur *sqmQueue
	for i, line := range strings.Split(string(b), "\n") {
		at := At{file, i + 1}
		words, err := uciWords(line)
		if err != nil {
			r.Refuse(at, "line", "%v", err)
			continue
		}
		switch {
		case len(words) == 0:
		case words[0] == "config":
			cur = nil
			if len(words) >= 2 && words[1] == "queue" {
				cur = &sqmQueue{at: at, opt: map[string]string{}, optAt: map[string]At{}}
				if len(words) >= 3 {
					cur.name = words[2]
				}
				qs = append(qs, cur)
			}
		case words[0] == "option" && len(words) == 3:
			if cur != nil {
				cur.opt[words[1]], cur.optAt[words[1]] = words[2], at
			}
		case words[0] == "option" || words[0] == "list":
			if cur != nil {
				r.Refuse(at, words[0], "want `option NAME VALUE`")
			}
		default:
			r.Refuse(at, words[0], "not UCI: sqm's configuration has config and option lines (outside OpenWrt, NAME=VALUE lines such as UPLINK=1000)")
		}
	}
	if len(qs) == 0 && r.Refusals() == nil {
		r.Refuse(At{File: file}, "sqm config", "no `config queue` section")
	}
	for _, q := range qs {
		if ifc := q.draft(r, opt); ifc != nil {
			d.Interfaces = append(d.Interfaces, ifc)
		}
	}
	if len(d.Interfaces) == 0 && r.Refusals() == nil {
		var off []string
		for _, q := range qs {
			name := q.name
			if name == "" {
				name = "the unnamed queue"
			}
			off = append(off, fmt.Sprintf("%s (%s: option enabled '%s')", name, q.place("enabled"), q.get("enabled", "0")))
		}
		r.Refuse(At{File: file}, "sqm config", "no queue is enabled, so sqm shapes nothing with this file: %s; set option enabled '1' on the queue to import", strings.Join(off, ", "))
	}
	if r.Refusals() != nil {
		return d, nil
	}
	return d.settle(At{File: file}), nil
}

// uciWords splits a UCI line into words: quotes (' or ") group, #
// starts a comment outside them.
func uciWords(line string) ([]string, error) {
	var out []string
	var w strings.Builder
	in, quote := false, rune(0)
	for _, c := range strings.TrimRight(line, "\r") {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				w.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == '#':
			if in {
				out = append(out, w.String())
			}
			return out, nil
		case c == ' ' || c == '\t':
			if in {
				out = append(out, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote")
	}
	if in {
		out = append(out, w.String())
	}
	return out, nil
}

func (q *sqmQueue) get(k, def string) string {
	if v, ok := q.opt[k]; ok && v != "" {
		return v
	}
	return def
}

func (q *sqmQueue) place(k string) At {
	if a, ok := q.optAt[k]; ok {
		return a
	}
	return q.at
}

func (q *sqmQueue) draft(r *Report, opt Options) *Interface {
	what := "queue " + q.name
	if q.get("enabled", "0") != "1" {
		r.Exact(q.at, what, "not enabled: left out, as sqm leaves it")
		return nil
	}
	dev := q.get("interface", "")
	if dev == "" {
		r.Refuse(q.at, what, "no interface option")
		return nil
	}
	kbit := func(k string) int {
		s := q.get(k, "0")
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 || v > 100_000_000 {
			r.Refuse(q.place(k), k, "%q: want kbit/s (0: not shaped)", s)
			return 0
		}
		return v
	}
	down, up := kbit("download"), kbit("upload")
	script := q.get("script", "simple.qos")
	qdisc := q.get("qdisc", "fq_codel")
	switch script {
	case "simplest.qos", "simple.qos", "piece_of_cake.qos", "layer_cake.qos":
	default:
		r.Refuse(q.place("script"), "script "+script, "sluice reads simplest.qos, simple.qos, piece_of_cake.qos and layer_cake.qos; this script's tree is its own")
		return nil
	}
	if script == "piece_of_cake.qos" || script == "layer_cake.qos" {
		qdisc = "cake"
	}
	cake := strings.HasPrefix(qdisc, "cake")
	leaf := ""
	switch {
	case cake:
		leaf = "cake"
	case qdisc == "fq_codel" || qdisc == "sfq" || qdisc == "pfifo" || qdisc == "bfifo":
		leaf = qdisc
	default:
		r.Approx(q.place("qdisc"), "qdisc "+qdisc, "sluice has no %s leaf: it picks one (auto)", qdisc)
	}
	if q.get("qdisc_advanced", "0") == "1" && (q.get("iqdisc_opts", "") != "" || q.get("eqdisc_opts", "") != "") {
		r.Approx(q.place("qdisc_advanced"), "qdisc options", "%q / %q are not carried over: sluice sets its leaves' options", q.get("iqdisc_opts", ""), q.get("eqdisc_opts", ""))
	}
	ifc := &Interface{At: q.at, Name: dev}
	ll, overhead := q.linkLayer(r, cake)
	build := func(dir string, kb int) *Tree {
		if kb == 0 {
			r.Exact(q.at, what+" "+dir, "0: not shaped, as sqm leaves it")
			return nil
		}
		if kb < 32 {
			r.Refuse(q.place(dir), dir, "%d kbit/s: too slow for sqm's classes (its best effort ceil is the link less 16 kbit)", kb)
			return nil
		}
		link := float64(kb) * 1000
		t := &Tree{At: q.at, Rate: bitRate(float64(kb) * 1000), Leaf: leaf, Linklayer: ll, Overhead: overhead}
		if dir == "download" {
			t.Comment = "download: sqm's ingress, through an ifb"
		} else {
			t.Comment = "upload"
		}
		class := func(origin, name string, rate, ceil float64, prio int) *Class {
			c := &Class{At: q.at, Origin: origin, Name: name, rateBits: rate, ceilBits: ceil, Prio: intp(prio)}
			c.Rate, c.Ceil = bitRate(rate), bitRate(ceil)
			t.Classes = append(t.Classes, c)
			return c
		}
		dscp := func(c *Class, names ...string) {
			for _, n := range names {
				c.Match = append(c.Match, &Match{At: q.at, DSCP: n})
			}
		}
		tiers := script == "simple.qos" && !cake && !(dir == "download" && q.get("squash_ingress", "1") == "1")
		switch {
		case script == "layer_cake.qos" || script == "simple.qos" && cake:
			// cake's diffserv3: Bulk (CS1) at a sixteenth, Voice (CS7,
			// CS6, EF, VA, CS5, CS4) at a quarter, ahead of Best Effort.
			v := class("voice tin", "voice", link/4, link, 0)
			dscp(v, "CS7", "CS6", "EF", "VA", "CS5", "CS4")
			b := class("bulk tin", "bulk", link/16, link, 2)
			dscp(b, "CS1")
			class("best effort tin", "besteffort", link-link/4-link/16, link, 1)
			t.Default = "besteffort"
			r.Approx(q.at, what+" "+dir, "%s: cake's diffserv3 tins become three classes by DSCP (voice: a quarter and first, bulk: a sixteenth and last, best effort the rest); cake's tins are thresholds, HTB's rates are guarantees", script)
		case tiers:
			prioRate := 128e3
			if dir == "download" {
				prioRate = 32e3
			}
			kb3, kb6 := float64(kb/3)*1000, float64(kb/6)*1000
			p := class("1:11", "priority", prioRate, kb3, 1)
			if dir == "download" {
				// diffserv(): u32 on the TOS byte under 0xfc.
				dscp(p, "EF", "CS6", "CS7", "AF42", "4")
			} else {
				// iptables: --dscp-class CS6, EF, AF42, --tos Minimize-Delay.
				dscp(p, "CS6", "EF", "AF42")
				p.Match = append(p.Match, &Match{At: q.at, TOS: "0x10/0x3f"}) // iptables compares a TOS name under 0x3f
			}
			class("1:12", "besteffort", kb6, link-16e3, 2)
			bk := class("1:13", "background", kb6, link-16e3, 3)
			dscp(bk, "CS1")
			t.Default = "besteffort"
			if dir == "upload" {
				r.Approx(q.at, what+" upload", "simple.qos marks packets by DSCP with iptables (fw filters); here the same DSCP rules match in tc, which sees the packet as it leaves (after any rewrite), and ARP, which sqm put in the priority class, goes to the default")
			}
		default:
			origin := "1:10"
			if cake {
				origin = "cake"
			}
			class(origin, "all", link, link, 0)
			t.Default = "all"
			if cake {
				r.Approx(q.at, what+" "+dir, "%s: cake shapes at the root; here HTB shapes at the link's rate with cake as the class's leaf (cake's flow isolation kept, its own shaper not used)", script)
			}
		}
		fitRates(r, q.at, link, t.Classes)
		return t
	}
	ifc.Egress = build("upload", up)
	ifc.Ingress = build("download", down)
	if ifc.Egress == nil && ifc.Ingress == nil {
		return nil
	}
	return ifc
}

// linkLayer maps sqm's linklayer and overhead. sqm hands the overhead
// to cake (which counts from the IP packet: sluice's overhead is 14
// less) for cake qdiscs by default, otherwise to a size table (which
// counts from the Ethernet frame, as sluice does).
func (q *sqmQueue) linkLayer(r *Report, cake bool) (string, int) {
	ll := q.get("linklayer", "none")
	if ll == "none" {
		return "", 0
	}
	s := q.get("overhead", "0")
	ov, err := strconv.Atoi(s)
	if err != nil || ov < -64 || ov > 256 {
		r.Refuse(q.place("overhead"), "overhead", "%q: want bytes, -64 to 256", s)
		return "", 0
	}
	mech := q.get("linklayer_adaptation_mechanism", "default")
	fromIP := mech == "cake" || mech == "default" && cake
	if fromIP {
		ov -= 14
		r.Exact(q.place("overhead"), "overhead "+s, "counted by cake from the IP packet: %d from the Ethernet frame here", ov)
	}
	switch ll {
	case "atm":
		return "atm", ov
	case "ethernet":
		return "", ov
	}
	r.Refuse(q.place("linklayer"), "linklayer "+ll, "want none, ethernet or atm")
	return "", 0
}
