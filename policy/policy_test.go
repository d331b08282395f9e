package policy

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/units"
)

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in      string
		bps     uint64
		pct     float64
		warn    bool
		errPart string
	}{
		{in: "20mbit", bps: 2500000},
		{in: "19mbit", bps: 2375000},
		{in: "1.5gbit", bps: 187500000},
		{in: "220kbit", bps: 27500},
		{in: "8bit", bps: 1},
		{in: "1Mbit", bps: 125000},
		{in: "1mibit", bps: 131072},
		{in: "2mbps", bps: 2000000, warn: true},
		{in: "90%", pct: 90},
		{in: "100%", pct: 100},
		{in: "20mbits", errPart: `did you mean 20mbit?`},
		{in: "20", errPart: "missing unit: write 20mbit (megabits/s)"},
		{in: "19000", errPart: "missing unit: write 19000kbit (kilobits/s, 19mbit)"},
		{in: "2000000", errPart: "missing unit: write 2000000bit (bits/s, 2mbit)"},
		{in: "20mb", errPart: "is a size, not a rate"},
		{in: "20mbit/s", errPart: "not a tc unit; write 20mbit"},
		{in: "20mbti", errPart: "did you mean 20mbit?"},
		{in: "fast", errPart: "want a number and a unit"},
		{in: "0%", errPart: "bad percentage"},
		{in: "150%", errPart: "bad percentage"},
		{in: "4bit", errPart: "at least 8bit"},
	} {
		r, warn, err := ParseRate(tc.in)
		switch {
		case tc.errPart != "":
			if err == nil || !strings.Contains(err.Error(), tc.errPart) {
				t.Errorf("ParseRate(%q) error = %v, want it to contain %q", tc.in, err, tc.errPart)
			}
		case err != nil:
			t.Errorf("ParseRate(%q): %v", tc.in, err)
		case uint64(r.Bps) != tc.bps || r.Percent != tc.pct || (warn != "") != tc.warn:
			t.Errorf("ParseRate(%q) = %d B/s, %v%%, warning %q", tc.in, r.Bps, r.Percent, warn)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{"1600": 1600, "1600b": 1600, "15kb": 15360, "15k": 15360, "2mb": 2 << 20, "1.5kb": 1536} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, part := range map[string]string{"15kbit": "rate unit", "lots": "want a number", "0b": "between", "3xb": "unknown unit"} {
		if _, err := ParseSize(in); err == nil || !strings.Contains(err.Error(), part) {
			t.Errorf("ParseSize(%q) error = %v, want %q", in, err, part)
		}
	}
}

// wrap puts class lines into a minimal valid policy; line numbers in the
// cases below count from the top of the result (classes start at line 7).
func wrap(classes string) string {
	return "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      default: bulk\n      classes:\n" + classes +
		"        - name: bulk\n          rate: 1mbit\n"
}

func TestValidationErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"unknown key", wrap("        - name: a\n          rate: 1mbit\n          ceiling: 2mbit\n"),
			`:9:11: class a: unknown key "ceiling" (did you mean "ceil"?)`},
		{"bad unit", wrap("        - name: a\n          rate: 20mbits\n"),
			`:8:17: class a: rate: bad rate "20mbits": "mbits" is not a unit; did you mean 20mbit?`},
		{"ceil below rate", wrap("        - name: a\n          rate: 5mbit\n          ceil: 2mbit\n"),
			`:9:17: eth0 egress: class a: ceil 2mbit is below rate 5mbit`},
		{"children above parent", wrap("        - name: a\n          rate: 19.5mbit\n"),
			`:4:13: eth0 egress: children's rates add up to 20.5mbit, above the egress rate (20mbit): a 19.5mbit, bulk 1mbit`},
		{"nested children above parent", wrap("        - name: a\n          rate: 2mbit\n          classes:\n            - name: a1\n              rate: 2mbit\n            - name: a2\n              rate: 1kbit\n"),
			`:8:17: eth0 egress: children's rates add up to 2.001mbit, above the rate of class a (2mbit)`},
		{"duplicate name", wrap("        - name: bulk\n          rate: 1mbit\n"),
			`:9:17: eth0 egress: duplicate class name "bulk" (first at line 7)`},
		{"default missing",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      default: bulkk\n      classes:\n        - name: bulk\n          rate: 1mbit\n",
			`:5:16: eth0 egress: default class "bulkk" does not exist (did you mean "bulk"?)`},
		{"default not leaf",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      default: g\n      classes:\n        - name: g\n          rate: 1mbit\n          classes:\n            - name: c\n              rate: 1mbit\n",
			`:5:16: eth0 egress: default class "g" has children`},
		{"default required",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      classes:\n        - name: g\n          rate: 1mbit\n",
			`:4:7: eth0 egress: default is required`},
		{"per_host too large", wrap("        - name: a\n          rate: 1mbit\n          per_host:\n            cidr: 10.0.0.0/16\n"),
			`:10:19: eth0 egress: class a: per_host: 10.0.0.0/16 with one class per /32 needs 65534 classes; one per_host class holds at most 32766, even in a sharded tree`},
		{"port out of range", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - dport: 70000\n"),
			`:10:22: class a: match.dport: port "70000" out of range`},
		{"port range reversed", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - dport: 2000-1000\n"),
			`:10:22: class a: match.dport: bad port range "2000-1000"`},
		{"bad cidr", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - src: 10.0.0.0/33\n"),
			`:10:20: class a: match.src: bad CIDR "10.0.0.0/33"`},
		{"cidr host bits", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - src: 10.0.0.1/24\n"),
			`host bits are set; did you mean 10.0.0.0/24?`},
		{"bad dscp", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - dscp: EFF\n"),
			`:10:21: class a: match.dscp: unknown DSCP "EFF" (did you mean EF?)`},
		{"dscp number", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - dscp: 64\n"),
			`unknown DSCP "64"`},
		{"bad proto", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - proto: tpc\n"),
			`unknown protocol "tpc" (did you mean tcp?)`},
		{"ports need proto", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - { proto: icmp, dport: 22 }\n"),
			`ports need proto tcp, udp`},
		{"families clash", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - { src: 10.0.0.0/8, dst: \"2001:db8::/32\" }\n"),
			`no packet can match`},
		{"empty entry", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - {}\n"),
			`empty entry matches everything`},
		{"prio range", wrap("        - name: a\n          rate: 1mbit\n          prio: 9\n"),
			`:9:17: class a: prio: expected a whole number from 0 to 7, found "9"`},
		{"unknown leaf", wrap("        - name: a\n          rate: 1mbit\n          leaf: fq_codl\n"),
			`unknown leaf "fq_codl" (did you mean fq_codel?)`},
		{"bfifo packets", wrap("        - name: a\n          rate: 1mbit\n          leaf: bfifo\n          limit: 100\n"),
			`bfifo counts bytes`},
		{"root percent", "interfaces:\n  - name: eth0\n    egress:\n      rate: 50%\n",
			`:4:13: eth0 egress: rate must be absolute`},
		{"no interfaces", "interfaces: []\n", `no interfaces`},
		// Issue 16: input that validated but should not.
		{"empty dport list", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - dport: []\n"),
			`:10:22: class a: match.dport: an empty list; give at least one value or leave the field out`},
		{"empty dst list", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - {dst: [], proto: tcp}\n"),
			`:10:21: class a: match.dst: an empty list`},
		{"empty proto list", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - proto: []\n"),
			`match.proto: an empty list`},
		{"empty dscp list", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - dscp: []\n"),
			`match.dscp: an empty list`},
		{"rate beyond u64 bits", "interfaces:\n  - name: eth0\n    egress: {rate: 18446744073709551615bit}\n",
			`:3:20: egress rate: bad rate "18446744073709551615bit": above 8pbit, the most sluice shapes`},
		{"cburst beyond ticks", wrap("        - name: a\n          rate: 1mbit\n          ceil: 10mbit\n          cburst: 4000mb\n"),
			`:10:19: eth0 egress: class a: cburst 4194304000 bytes takes 3355 s at ceil 10mbit; HTB holds a burst of at most 275 s at its rate`},
		{"burst below a microsecond", wrap("        - name: a\n          rate: 10mbit\n          burst: 1\n"),
			`:9:18: eth0 egress: class a: burst 1 bytes lasts less than a microsecond at rate 10mbit, and HTB would keep it as 0; give at least 2 bytes`},
		{"quantum beyond int32", wrap("        - name: a\n          rate: 1mbit\n          quantum: 4000mb\n"),
			`class a: quantum 4194304000 bytes: HTB holds at most 2147483647`},
		{"per_host rate that comes to nothing", wrap("        - name: a\n          rate: 1mbit\n          per_host: {by: dst, cidr: 10.0.0.0/24, rate: 1e-300%}\n"),
			`class a: per_host: rate 1e-300% comes to less than 1 byte/s`},
		{"weight zero", wrap("        - name: a\n          rate: 1mbit\n          weight: 0\n"),
			`:9:19: class a: weight: expected a number from 0.001 to 1e+06`},
		{"weight subnormal", wrap("        - name: a\n          rate: 1mbit\n          weight: 1e-320\n"),
			`:9:19: class a: weight: expected a number from 0.001 to 1e+06`},
		{"weight a rate", wrap("        - name: a\n          rate: 1mbit\n          weight: 5mbit\n"),
			`class a: weight: expected a number from 0.001 to 1e+06 (weights are relative: 1, 2, 3 or 10, 20, 30 mean the same), found "5mbit"`},
		{"weight on some siblings", wrap("        - name: a\n          rate: 1mbit\n          weight: 2\n"),
			`:9:19: eth0 egress: weight is set on a but not on bulk (prio 0, at the top of the tree): weights are relative, so set weight on every sibling of one prio or on none`},
		{"edt burst beyond", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      backend: edt\n      default: a\n      classes:\n        - {name: a, rate: 1mbit, ceil: 2mbit, burst: 4000mb}\n",
			`:8:54: eth0 egress: class a: burst 4194304000 bytes is 16777 s of the aggregate's cap 2mbit; an EDT aggregate's burst is at most 4s of its cap (1000000 bytes)`},
		{"weight on edt", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      backend: edt\n      default: a\n      classes:\n        - {name: a, rate: 1mbit, weight: 2}\n",
			`:8:42: eth0 egress: class a: weight shares spare capacity between HTB classes; an edt aggregate is paced at its own ceil`},
		{"sharing unknown mode", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      sharing: fair\n      classes: [{name: a, rate: 1mbit}]\n",
			`:5:16: egress sharing: expected controller (the agent's weighted max-min controller), found "fair"`},
		{"sharing without mode", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      sharing: {quantum: 2s}\n      classes: [{name: a, rate: 1mbit}]\n",
			`:5:16: egress sharing: mode: controller is required`},
		{"sharing quantum", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      sharing: {mode: controller, quantum: 10ms}\n      classes: [{name: a, rate: 1mbit}]\n",
			`:5:44: egress sharing: quantum: expected a time from 100ms to 1m0s (like 1s), found "10ms"`},
		{"sharing apply_above", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      sharing: {mode: controller, apply_above: 0.8}\n      classes: [{name: a, rate: 1mbit}]\n",
			`:5:48: egress sharing: apply_above: expected a percentage from 1% to 100% (like 80%), found "0.8"`},
		{"sharing apply_above tiny", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      sharing: {mode: controller, apply_above: 1e-300%}\n      classes: [{name: a, rate: 1mbit}]\n",
			`:5:48: egress sharing: apply_above: expected a percentage from 1% to 100% (like 80%), found "1e-300%"`},
		{"sharing cap above", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      sharing: {mode: controller, cap: 30mbit}\n      classes: [{name: a, rate: 1mbit}]\n",
			`:5:40: eth0 egress sharing: cap 30mbit is above the 20mbit the children can get together`},
		{"sharing on a leaf", wrap("        - name: a\n          rate: 1mbit\n          sharing: controller\n"),
			`:9:20: eth0 egress: class a sharing: the controller shares between child classes, and this class has none`},
		{"sharing on edt over a per_host class", "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      backend: edt\n      default: a\n      sharing: controller\n      classes: [{name: a, rate: 1mbit}, {name: h, rate: 1mbit, per_host: {by: dst, cidr: 10.0.0.0/30}}]\n",
			`:7:16: eth0 egress sharing: with backend edt the controller shares between leaf classes (each one aggregate with its own clock), and h has children or hosts`},
		{"two documents", "interfaces:\n  - name: eth0\n    egress: {rate: 1mbit}\n---\ninterfaces: []\n",
			`:4:1: a second YAML document (after ---): a policy file holds one`},
		{"comments only", "# nothing yet\n\n", `:1:1: empty policy: expected "interfaces:"`},
		{"null document", "~\n", `:1:1: empty policy`},
		{"interface name too long in bytes", "interfaces:\n  - name: \"ethéééééééé\"\n    egress: {rate: 1mbit}\n", `must be 1 to 15 bytes`},
		{"interface name control character", "interfaces:\n  - name: \"eth\\x010\"\n    egress: {rate: 1mbit}\n", `must not contain control characters`},
		{"interface name dotdot", "interfaces:\n  - name: \"..\"\n    egress: {rate: 1mbit}\n", `cannot be . or ..`},
		{"ifb name tab", "interfaces:\n  - name: eth0\n    ingress: {rate: 1mbit, ifb: \"a\\tb\"}\n", `ifb name "a\tb": must not contain spaces`},
		{"not yaml", "interfaces:\n  - name: [\n", `invalid YAML`},
		{"interface twice", "interfaces:\n  - name: eth0\n    egress: {rate: 1mbit}\n  - name: eth0\n    egress: {rate: 1mbit}\n",
			`:4:11: interface "eth0" appears twice (first at line 2)`},
		{"interface name", "interfaces:\n  - name: a/b\n    egress: {rate: 1mbit}\n", `interface name "a/b"`},
		{"nothing to do", "interfaces:\n  - name: eth0\n", `nothing to do`},
		{"repeated key", wrap("        - name: a\n          rate: 1mbit\n          rate: 2mbit\n"),
			`:9:11: class a: key "rate" repeated (first at line 8)`},
		{"tcp_ack bool", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - tcp_ack: yes\n"),
			`tcp_ack: expected true or false, found "yes"`},
		{"tcp_syn bool", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - tcp_syn: 1\n"),
			`tcp_syn: expected true or false, found "1"`},
		{"tcp_syn on udp", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - {proto: udp, tcp_syn: true}\n"),
			`:10:37: eth0 egress: class a: match: tcp_syn matches TCP packets, but proto says 17`},
		{"tcp_syn with tcp_ack", wrap("        - name: a\n          rate: 1mbit\n          match:\n            - {tcp_ack: true, tcp_syn: true}\n"),
			`no packet can match: tcp_ack takes packets with SYN clear`},
		{"inner default needs match", wrap("        - name: g\n          rate: 1mbit\n          default: c\n          classes:\n            - name: c\n              rate: 1mbit\n"),
			`default needs match rules`},
		{"police without cir", wrap("        - name: a\n          rate: 1mbit\n          police: {cbs: 10kb}\n"),
			`:9:19: eth0 egress: class a: police: cir is required`},
		{"police pir below cir", wrap("        - name: a\n          rate: 1mbit\n          police: {cir: 2mbit, pir: 1mbit}\n"),
			`eth0 egress: class a: police: pir 1mbit is below cir 2mbit`},
		{"police ebs with pir", wrap("        - name: a\n          rate: 1mbit\n          police: {cir: 1mbit, pir: 2mbit, ebs: 1kb}\n"),
			`police: ebs belongs to the single-rate meter`},
		{"police bad action", wrap("        - name: a\n          rate: 1mbit\n          police: {cir: 1mbit, red: remark:AF99}\n"),
			`:9:37: class a: police.red: unknown DSCP "AF99"`},
		{"police bad mode", wrap("        - name: a\n          rate: 1mbit\n          police: {cir: 1mbit, mode: colour}\n"),
			`police.mode: expected blind or aware, found "colour"`},
		{"police on inner class", wrap("        - name: a\n          rate: 1mbit\n          police: {cir: 1mbit}\n          classes:\n            - name: b\n              rate: 1mbit\n"),
			`class a: police is for leaf classes`},
		{"police with u32",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      classifier: u32\n      default: a\n      classes:\n        - name: a\n          rate: 1mbit\n          police: {cir: 1mbit}\n",
			`:5:19: eth0 egress: police needs classifier bpf`},
		{"bad classifier",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      classifier: ebpf\n",
			`:5:19: egress classifier: expected u32, bpf or auto, found "ebpf"`},
		{"police beside a tree",
			"interfaces:\n  - name: eth0\n    ingress:\n      rate: 20mbit\n      police: {cir: 1mbit}\n",
			`:5:15: eth0 ingress: police directly under ingress polices without a tree`},
		{"hosts_file missing", wrap("        - name: a\n          rate: 1mbit\n          per_host: {hosts_file: nope.csv}\n"),
			`:9:34: class a: per_host.hosts_file: open nope.csv: no such file or directory`},
		{"edt key on htb",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      horizon: 50ms\n",
			`:5:16: eth0 egress: horizon is for backend edt (this direction's backend is htb)`},
		{"bad linklayer",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      linklayer: adsl\n",
			`:5:18: egress linklayer: expected ethernet, atm (ADSL) or ptm (VDSL2), found "adsl"`},
		{"overhead out of range",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      overhead: 300\n",
			`:5:17: egress overhead (bytes each packet gains on the link): expected a whole number from -64 to 256, found "300"`},
		{"mpu out of range",
			"interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      mpu: -1\n",
			`:5:12: egress mpu (the least bytes a packet counts as): expected a whole number from 0 to 256, found "-1"`},
		{"linklayer on a bare policer",
			"interfaces:\n  - name: eth0\n    ingress:\n      linklayer: atm\n      police: {cir: 1mbit}\n",
			`:4:18: eth0 ingress: linklayer sizes a shaped tree's packets; police directly under ingress has no tree`},
		{"bad backend",
			"interfaces:\n  - name: eth0\n    egress:\n      backend: hfsc\n      rate: 20mbit\n",
			`:4:16: egress backend: expected htb or edt, found "hfsc"`},
		{"horizon out of range",
			"interfaces:\n  - name: eth0\n    egress:\n      backend: edt\n      rate: 20mbit\n      horizon: 20s\n",
			`:6:16: egress horizon: expected a time from 1ms to 10s (like 100ms), found "20s"`},
		{"bad edt burst",
			"interfaces:\n  - name: eth0\n    egress:\n      backend: edt\n      rate: 20mbit\n      burst: lots\n",
			`:6:14: egress burst: expected a time (5ms) or a size (64kb), found "lots"`},
		{"htb key on edt class",
			"interfaces:\n  - name: eth0\n    egress:\n      backend: edt\n      rate: 20mbit\n      default: a\n      classes:\n        - name: a\n          rate: 1mbit\n          leaf: sfq\n",
			`:10:17: eth0 egress: class a: leaf is for HTB classes; backend edt paces each class in BPF and queues in fq`},
		{"edt with u32",
			"interfaces:\n  - name: eth0\n    egress:\n      backend: edt\n      classifier: u32\n      rate: 20mbit\n",
			`:5:19: eth0 egress: backend edt classifies in its own BPF program; classifier u32 cannot feed it`},
		{"edt police only",
			"interfaces:\n  - name: eth0\n    ingress:\n      backend: edt\n      police: {cir: 1mbit}\n",
			`:4:16: eth0 ingress: backend edt shapes a class tree; police directly under ingress has none`},
		{"bad exempt match", "interfaces:\n  - name: eth0\n    egress:\n      backend: edt\n      rate: 20mbit\n      exempt: [{dport: 70000}]\n",
			`egress exempt`},
		{"edt hosts too many", "interfaces:\n  - name: eth0\n    egress:\n      backend: edt\n      rate: 20mbit\n      default: a\n      classes:\n        - name: a\n          rate: 1mbit\n          per_host: {cidr: 10.0.0.0/8}\n",
			`the EDT backend's host table holds at most 1048576 per tree`},
		{"per_host needs cidr or file", wrap("        - name: a\n          rate: 1mbit\n          per_host: {by: dst}\n"),
			`class a: per_host: cidr or hosts_file is required`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse("p.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("no error; want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "p.yaml:") {
					t.Errorf("error line %q does not start with FILE:LINE:COL", line)
				}
			}
		})
	}
}

func TestBytesRateWarns(t *testing.T) {
	p, warns, err := Parse("p.yaml", []byte(wrap("        - name: a\n          rate: 2mbps\n")))
	if err != nil || p == nil {
		t.Fatal(err)
	}
	if len(warns) != 1 || !strings.Contains(warns[0].Error(), "p.yaml:8:17: warning: class a: rate: 2mbps is megabytes per second") {
		t.Fatalf("warnings = %v", warns)
	}
}

func TestResolvedRates(t *testing.T) {
	src := "interfaces:\n  - name: eth0\n    egress:\n      rate: 20mbit\n      default: b\n      classes:\n" +
		"        - name: a\n          rate: 25%\n          ceil: 50%\n          classes:\n            - name: a1\n              rate: 50%\n" +
		"        - name: b\n          rate: 10mbit\n"
	p, _, err := Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	a := p.Interfaces[0].Egress.Classes[0]
	a1 := a.Classes[0]
	b := p.Interfaces[0].Egress.Classes[1]
	if a.RateBps != 625000 || a.CeilBps != 1250000 {
		t.Errorf("a: rate %d ceil %d", a.RateBps, a.CeilBps)
	}
	// A child's percentages are of its parent's rate (rate) and ceil
	// (ceil); its ceil defaults to the parent's ceil.
	if a1.RateBps != 312500 || a1.CeilBps != 1250000 {
		t.Errorf("a1: rate %d ceil %d", a1.RateBps, a1.CeilBps)
	}
	if b.CeilBps != 2500000 {
		t.Errorf("b: ceil %d, want the link rate", b.CeilBps)
	}
}

// linklayer ptm shapes every rate at 64/65 of the policy's, hosts_file
// edits as a reload would; atm and ethernet keep them.
func TestPTMScalesRates(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts.csv")
	before := "name,addresses,rate,ceil\nann,10.0.0.2,6500kbit,13mbit\n"
	after := "name,addresses,rate,ceil\nann,10.0.0.2,13mbit,13mbit\n"
	if err := os.WriteFile(hosts, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	src := func(ll string) string {
		return "interfaces:\n  - name: eth0\n    egress:\n      rate: 65mbit\n      linklayer: " + ll + "\n      default: rest\n" +
			"      classes:\n        - name: subs\n          rate: 50%\n          per_host: {hosts_file: hosts.csv}\n        - name: rest\n          rate: 13mbit\n"
	}
	for _, c := range []struct {
		ll               string
		link, rest, host units.Rate
	}{
		{"ptm", 8000000, 1600000, 800000},
		{"atm", 8125000, 1625000, 812500},
	} {
		file := filepath.Join(dir, "p.yaml")
		if err := os.WriteFile(file, []byte(src(c.ll)), 0o644); err != nil {
			t.Fatal(err)
		}
		p, errs, err := Load(file)
		if err != nil || len(errs) > 0 {
			t.Fatalf("%s: %v %v", c.ll, errs, err)
		}
		tr := p.Interfaces[0].Egress
		ph := tr.Classes[0].PerHost
		if tr.RateBps != c.link || tr.Classes[1].RateBps != c.rest || ph.Entries[0].RateBps != c.host {
			t.Errorf("%s: link %d, rest %d, host %d bytes/s; want %d, %d, %d", c.ll, tr.RateBps, tr.Classes[1].RateBps, ph.Entries[0].RateBps, c.link, c.rest, c.host)
		}
		// A live edit of the host's rate resolves as a reload does.
		edits, ok, err := p.EditHosts(hosts, []byte(before), []byte(after))
		if err != nil || !ok || len(edits) != 1 || edits[0].RateBps != 2*c.host {
			t.Errorf("%s: hosts edit %+v (%v, %v), want a rate of %d bytes/s", c.ll, edits, ok, err, 2*c.host)
		}
	}
}

func TestBareRateLimit(t *testing.T) {
	p, _, err := Parse("p.yaml", []byte("interfaces:\n  - name: eth0\n    ingress:\n      rate: 800kbit\n"))
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Interfaces[0].Ingress
	if len(tr.Classes) != 1 || tr.Default != "default" || tr.Classes[0].RateBps != 100000 {
		t.Fatalf("implicit class: %+v default %q", tr.Classes, tr.Default)
	}
	if IfbName(p.Interfaces[0]) != "ifb-eth0" {
		t.Errorf("ifb name %q", IfbName(p.Interfaces[0]))
	}
	long := &Interface{Name: "enp0s31f6abcdef", Ingress: tr}
	if n := IfbName(long); len(n) > 15 || !strings.HasPrefix(n, "ifb-enp0s31") {
		t.Errorf("long ifb name %q", n)
	}
}

func TestHosts(t *testing.T) {
	for _, tc := range []struct {
		cidr        string
		prefix      int
		n           int
		first, last string
	}{
		{"192.168.1.0/24", 32, 254, "192.168.1.1/32", "192.168.1.254/32"},
		{"10.0.0.0/30", 32, 2, "10.0.0.1/32", "10.0.0.2/32"},
		{"10.0.0.0/31", 32, 2, "10.0.0.0/32", "10.0.0.1/32"},
		{"10.0.0.0/22", 32, 1022, "10.0.0.1/32", "10.0.3.254/32"},
		{"2001:db8::/120", 128, 256, "2001:db8::/128", "2001:db8::ff/128"},
		{"2001:db8::/56", 64, 256, "2001:db8::/64", "2001:db8:0:ff::/64"},
	} {
		ph := &PerHost{CIDR: netip.MustParsePrefix(tc.cidr), Prefix: tc.prefix}
		hs := ph.Hosts()
		if len(hs) != tc.n || ph.HostCount() != tc.n || hs[0].String() != tc.first || hs[len(hs)-1].String() != tc.last {
			t.Errorf("%s/%d: %d hosts (count %d) %v..%v", tc.cidr, tc.prefix, len(hs), ph.HostCount(), hs[0], hs[len(hs)-1])
		}
	}
}

// An EDT tree takes its defaults, 100,000 hosts (beyond HTB's id
// space), and bursts as times or sizes.
func TestEDTKeys(t *testing.T) {
	p, _, err := Parse("p.yaml", []byte("interfaces:\n  - name: eth0\n    egress:\n      backend: edt\n      rate: 10gbit\n      default: b\n      classes:\n        - name: a\n          rate: 1gbit\n          per_host: {cidr: 10.0.0.0/15, rate: 1mbit, ceil: 50mbit}\n        - name: b\n          rate: 1gbit\n"))
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Interfaces[0].Egress
	if !tr.EDT() || !tr.BPF || tr.Horizon != DefaultHorizon || tr.Burst.Time != DefaultEDTBurst || tr.Hosts != 131070 {
		t.Fatalf("edt tree: backend %q bpf %v horizon %v burst %+v hosts %d", tr.Backend, tr.BPF, tr.Horizon, tr.Burst, tr.Hosts)
	}
	if ns := tr.Burst.NS(1_250_000); ns != 5_000_000 {
		t.Fatalf("5ms burst: %d ns", ns)
	}
	if ns := (&Burst{Bytes: 64 << 10}).NS(1_250_000); ns != 52_428_800 {
		t.Fatalf("64kb at 10mbit: %d ns, want 52.4288 ms", ns)
	}
	p, _, err = Parse("p.yaml", []byte("interfaces:\n  - name: eth0\n    ingress:\n      backend: edt\n      rate: 10mbit\n      burst: 64kb\n      horizon: 250ms\n      queues: 4\n"))
	if err != nil {
		t.Fatal(err)
	}
	tr = p.Interfaces[0].Ingress
	if tr.Burst.Bytes != 65536 || tr.Horizon != 250*time.Millisecond || tr.Queues != 4 {
		t.Fatalf("ingress edt: %+v %v %d", tr.Burst, tr.Horizon, tr.Queues)
	}
}

func TestExamplesAreValid(t *testing.T) {
	files, _ := filepath.Glob("../examples/*.yaml")
	if len(files) < 4 {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		if _, warns, err := Load(f); err != nil || len(warns) > 0 {
			t.Errorf("%s: %v %v", f, err, warns)
		}
	}
}

// HTB never reads an inner class's prio: validation says so, except
// where a sharing controller reads it (prio 0 is prod) or on a leaf.
func TestPrioOnAClassWithChildrenWarns(t *testing.T) {
	tree := func(sharing, prio string) string {
		return "interfaces:\n  - name: eth0\n    egress:\n      rate: 4mbit\n      default: a\n" + sharing + "      classes:\n" +
			"        - name: web\n          rate: 1mbit\n          prio: 1\n" +
			"        - name: office\n          rate: 2mbit\n          prio: " + prio + "\n          classes:\n            - {name: a, rate: 1mbit}\n            - {name: b, rate: 1mbit}\n"
	}
	_, warns, err := Parse("p.yaml", []byte(tree("", "2")))
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 1 || !strings.Contains(warns[0].Error(), "p.yaml:12:17: warning: eth0 egress: class office: prio 2 on a class with children does nothing in HTB") {
		t.Fatalf("warnings = %v", warns)
	}
	for _, src := range []string{tree("", "0"), tree("      sharing: controller\n", "2")} {
		if _, warns, err := Parse("p.yaml", []byte(src)); err != nil || len(warns) != 0 {
			t.Errorf("warnings %v, error %v for:\n%s", warns, err, src)
		}
	}
}

// A pfifo leaf without a limit takes the device's txqueuelen in
// packets, GSO packets among them: validation warns where it is written
// (a class's, a per_host's, or the tree's where a class inherits it),
// and not where a limit is set.
func TestPfifoWithoutLimitWarns(t *testing.T) {
	const head = "interfaces:\n  - name: eth0\n    egress:\n      rate: 10mbit\n"
	for _, tc := range []struct {
		src  string
		want string // "" : no warning
	}{
		{head + "      default: a\n      classes:\n        - {name: a, rate: 1mbit, leaf: pfifo}\n", "p.yaml:7:40: warning: eth0 egress: class a: leaf pfifo without limit"},
		{head + "      leaf: pfifo\n", "p.yaml:5:13: warning: eth0 egress: leaf pfifo without limit"},
		{head + "      leaf: pfifo\n      default: a\n      classes:\n        - {name: a, rate: 1mbit, limit: 100}\n        - {name: b, rate: 1mbit}\n", "p.yaml:5:13: warning"},
		{head + "      default: o\n      classes:\n        - {name: o, rate: 1mbit, leaf: bfifo}\n        - name: h\n          rate: 1mbit\n          per_host: {by: dst, cidr: 10.0.0.0/30, leaf: pfifo}\n", "class h: per_host: leaf pfifo without limit"},
		{head + "      default: a\n      classes:\n        - {name: a, rate: 1mbit, leaf: pfifo, limit: 100}\n", ""},
		{head + "      leaf: pfifo\n      default: a\n      classes:\n        - {name: a, rate: 1mbit, limit: 100}\n        - {name: b, rate: 1mbit, leaf: bfifo}\n", ""},
		{head + "      leaf: none\n", ""},
	} {
		_, warns, err := Parse("p.yaml", []byte(tc.src))
		if err != nil {
			t.Fatalf("%v:\n%s", err, tc.src)
		}
		switch {
		case tc.want == "" && len(warns) != 0:
			t.Errorf("warnings %v for:\n%s", warns, tc.src)
		case tc.want != "" && (len(warns) != 1 || !strings.Contains(warns[0].Error(), tc.want) || !strings.Contains(warns[0].Error(), "set limit, or use bfifo or auto")):
			t.Errorf("warnings %v, want one with %q, for:\n%s", warns, tc.want, tc.src)
		}
	}
}

// The policy the package installs says `template: true`: refused with a
// message that says to edit it, at the key's line, and valid once the
// line goes (so the template itself stays a working example).
func TestTemplateRefused(t *testing.T) {
	src, err := os.ReadFile("../deploy/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	line := 0
	var kept []string
	for i, l := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(l, "template:") {
			line = i + 1
			continue
		}
		kept = append(kept, l)
	}
	if line == 0 {
		t.Fatal("deploy/policy.yaml has no top-level template: line")
	}
	_, _, err = Parse("policy.yaml", src)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("policy.yaml:%d:", line)) || !strings.Contains(err.Error(), "delete this line") {
		t.Fatalf("the installed template: %v; want line %d refused with %q", err, line, TemplateRefused)
	}
	if strings.Count(err.Error(), "\n") != 0 {
		t.Errorf("the template has other problems than being one:\n%v", err)
	}
	if _, _, err := Parse("policy.yaml", []byte(strings.Join(kept, "\n"))); err != nil {
		t.Errorf("the template without its template line: %v", err)
	}
	if _, _, err := Parse("p.yaml", []byte("template: false\n"+strings.Join(kept, "\n"))); err != nil {
		t.Errorf("template: false: %v", err)
	}
	if _, _, err := Parse("p.yaml", []byte("template: yes\n"+strings.Join(kept, "\n"))); err == nil || !strings.Contains(err.Error(), "p.yaml:1:11: policy.template: expected true or false") {
		t.Errorf("template: yes: %v", err)
	}
}
