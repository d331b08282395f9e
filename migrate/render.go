package migrate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"sluice/policy"
	"sluice/safefile"
)

// Render writes the draft as a policy file: each class carries a
// comment naming where it came from.
func (d *Draft) Render() []byte {
	root := mapping()
	root.HeadComment = fmt.Sprintf("Imported from %s by `sluice import`.\nEach class names the file, line and id it came from; the import's\nreport says what carried over exactly and what did not.", d.Tool)
	var ifs []*yaml.Node
	for _, ifc := range d.Interfaces {
		n := mapping()
		put(n, "name", scalar(ifc.Name), "")
		if ifc.Egress != nil {
			put(n, "egress", renderTree(ifc.Egress), ifc.Egress.Comment)
		}
		if ifc.Ingress != nil {
			put(n, "ingress", renderTree(ifc.Ingress), ifc.Ingress.Comment)
		}
		ifs = append(ifs, n)
	}
	put(root, "interfaces", sequence(ifs...), "")
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		panic(err) // nodes built here always encode
	}
	return b.Bytes()
}

func renderTree(t *Tree) *yaml.Node {
	n := mapping()
	if t.Police != nil && len(t.Classes) == 0 {
		put(n, "police", renderPolice(t.Police), "")
		return n
	}
	put(n, "rate", scalar(t.Rate), "")
	if t.Linklayer != "" {
		put(n, "linklayer", scalar(t.Linklayer), "")
	}
	if t.Overhead != 0 {
		put(n, "overhead", plain(strconv.Itoa(t.Overhead)), "")
	}
	if t.Leaf != "" {
		put(n, "leaf", scalar(t.Leaf), "")
	}
	put(n, "default", scalar(t.Default), "")
	put(n, "classes", renderClasses(t.Classes), "")
	return n
}

func renderPolice(p *Police) *yaml.Node {
	n := mapping()
	n.Style = yaml.FlowStyle
	put(n, "cir", scalar(p.CIR), "")
	if p.CBS != "" {
		put(n, "cbs", scalar(p.CBS), "")
	}
	if p.Red != "" {
		put(n, "red", scalar(p.Red), "")
	}
	return n
}

func renderClasses(cs []*Class) *yaml.Node {
	var items []*yaml.Node
	for _, c := range cs {
		n := mapping()
		put(n, "name", scalar(c.Name), "")
		n.Content[1].LineComment = commentText(classComment(c))
		if c.ClassID != "" {
			id := scalar(c.ClassID)
			id.Style = yaml.DoubleQuotedStyle // 1:20 is a number to YAML 1.1
			put(n, "classid", id, "")
		}
		put(n, "rate", scalar(c.Rate), "")
		opt := func(k, v string) {
			if v != "" {
				put(n, k, scalar(v), "")
			}
		}
		opt("ceil", c.Ceil)
		if c.Prio != nil {
			put(n, "prio", plain(strconv.Itoa(*c.Prio)), "")
		}
		opt("burst", c.Burst)
		opt("cburst", c.Cburst)
		opt("quantum", c.Quantum)
		opt("leaf", c.Leaf)
		if c.Limit != "" {
			put(n, "limit", plain(c.Limit), "")
		}
		if len(c.Match) > 0 {
			var ms []*yaml.Node
			for _, m := range c.Match {
				ms = append(ms, renderMatch(m))
			}
			put(n, "match", sequence(ms...), "")
		}
		if c.PerHost != nil {
			p := mapping()
			put(p, "by", scalar(c.PerHost.By), "")
			put(p, "hosts_file", scalar(c.PerHost.HostsFile), "")
			if c.PerHost.Rate != "" {
				put(p, "rate", scalar(c.PerHost.Rate), "")
			}
			if c.PerHost.Ceil != "" {
				put(p, "ceil", scalar(c.PerHost.Ceil), "")
			}
			if c.PerHost.Prio != nil {
				put(p, "prio", plain(strconv.Itoa(*c.PerHost.Prio)), "")
			}
			if c.PerHost.Leaf != "" {
				put(p, "leaf", scalar(c.PerHost.Leaf), "")
			}
			if c.PerHost.Limit != "" {
				put(p, "limit", scalar(c.PerHost.Limit), "")
			}
			put(n, "per_host", p, "")
		}
		if len(c.Classes) > 0 {
			put(n, "classes", renderClasses(c.Classes), "")
		}
		opt("default", c.Default)
		items = append(items, n)
	}
	return sequence(items...)
}

func classComment(c *Class) string {
	var parts []string
	if c.At.File != "" {
		parts = append(parts, c.At.String())
	}
	switch {
	case strings.Contains(c.Origin, " "): // "node Hilltop": names its kind
		parts = append(parts, c.Origin)
	case c.Origin != "":
		parts = append(parts, "class "+c.Origin)
	}
	s := strings.Join(parts, ", ")
	if c.Comment != "" {
		if s != "" {
			s += ": "
		}
		s += c.Comment
	}
	return s
}

func renderMatch(m *Match) *yaml.Node {
	n := mapping()
	n.Style = yaml.FlowStyle
	list := func(k string, vs []string) {
		s := scalar
		if strings.HasSuffix(k, "port") {
			s = plain
		}
		switch len(vs) {
		case 0:
		case 1:
			put(n, k, s(vs[0]), "")
		default:
			var items []*yaml.Node
			for _, v := range vs {
				items = append(items, s(v))
			}
			s := sequence(items...)
			s.Style = yaml.FlowStyle
			put(n, k, s, "")
		}
	}
	list("src", m.Src)
	list("dst", m.Dst)
	list("not_src", m.NotSrc)
	list("not_dst", m.NotDst)
	if m.Proto != "" {
		put(n, "proto", scalar(m.Proto), "")
	}
	list("sport", m.Sport)
	list("dport", m.Dport)
	if m.DSCP != "" {
		put(n, "dscp", plain(m.DSCP), "")
	}
	if m.TOS != "" {
		put(n, "tos", scalar(m.TOS), "")
	}
	if m.TCPAck {
		put(n, "tcp_ack", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"}, "")
	}
	if m.TCPSyn {
		put(n, "tcp_syn", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"}, "")
	}
	if m.Mark != "" {
		put(n, "mark", plain(m.Mark), "")
	}
	return n
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode} }

func sequence(items ...*yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.SequenceNode, Content: items}
}

// scalar is a string scalar: the encoder quotes it where YAML would
// read it as something else (a number, a bool, a colon).
func scalar(v string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: strings.ToValidUTF8(v, "?")}
}

// plain is a scalar YAML resolves by itself (a number, a port range).
func plain(v string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Value: strings.ToValidUTF8(v, "?")}
}

func put(m *yaml.Node, k string, v *yaml.Node, comment string) {
	key := scalar(k)
	key.Tag = ""
	key.LineComment = commentText(comment)
	m.Content = append(m.Content, key, v)
}

// commentText is s made fit for a comment line. An import copies text
// from its file into comments (a FireQOS interface's name, a class's
// description), and that text may hold anything: bytes that are not
// UTF-8 (a Latin-1 name) made the YAML encoder panic, and a line break
// (YAML also reads U+0085, U+2028 and U+2029 as one) would end the
// comment and leave the rest as YAML.
func commentText(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\r' || r == 0x85 || r == 0x2028 || r == 0x2029:
			return ' '
		case r < 0x20 && r != '\t' || r == 0x7f:
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}

// RenderHosts writes a hosts file.
func RenderHosts(hosts []Host) []byte {
	var b bytes.Buffer
	b.WriteString("name,addresses,rate,ceil,parent\n")
	for _, h := range hosts {
		if h.Comment != "" {
			fmt.Fprintf(&b, "# %s\n", commentText(h.Comment))
		}
		fmt.Fprintf(&b, "%s,%s,%s,%s,%s\n", h.Name, strings.Join(h.Addresses, " "), h.Rate, h.Ceil, h.Parent)
	}
	return b.Bytes()
}

// Check validates the rendered policy (one without hosts files) as
// sluice will read it.
func (d *Draft) Check() error {
	if err := d.parse(); err != nil {
		return fmt.Errorf("the imported policy does not validate (a bug in the importer; please report it with the source):\n%w", err)
	}
	return nil
}

// settle turns a draft that sluice would not accept into a refusal:
// what an importer passed through from the source (a rate too small to
// hold its burst, say) is then reported at the source, not written.
func (d *Draft) settle(at At) *Draft {
	for _, ifc := range d.Interfaces {
		if !utf8.ValidString(ifc.Name) {
			d.Report.Refuse(ifc.At, fmt.Sprintf("device %q", ifc.Name), "not valid UTF-8: a policy cannot name it")
		}
	}
	if d.Report.Refusals() != nil {
		return d
	}
	d.collapseHosts()
	d.keepIDs()
	if err := d.parse(); err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		d.Report.Refuse(at, "the configuration as a whole", "sluice would not accept the result: %s", msg)
	}
	return d
}

// parse reads the rendered policy as sluice will, with its hosts files
// (written to a scratch directory for it).
func (d *Draft) parse() error {
	if len(d.Hosts) == 0 {
		_, _, err := policy.Parse("policy.yaml", d.Render())
		return err
	}
	tmp, err := os.MkdirTemp("", "sluice-import-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := writeNew(filepath.Join(tmp, "policy.yaml"), d.Render()); err != nil {
		return err
	}
	for name, hosts := range d.Hosts {
		if err := writeNew(filepath.Join(tmp, name), RenderHosts(hosts)); err != nil {
			return err
		}
	}
	if _, _, err := policy.Load(filepath.Join(tmp, "policy.yaml")); err != nil {
		return errors.New(strings.ReplaceAll(err.Error(), tmp+string(filepath.Separator), ""))
	}
	return nil
}

// Write validates the draft and writes policy.yaml and its hosts files
// into dir (created if missing). Nothing is written when the draft
// has refusals, when strict is set and something was approximated, or
// when the policy does not validate; existing files are replaced only
// once every new one is complete.
func (d *Draft) Write(dir string, strict bool) (string, error) {
	if err := d.Report.Refusals(); err != nil {
		return "", err
	}
	if strict && d.Report.Count(Approximated) > 0 {
		return "", fmt.Errorf("--strict: %d construct(s) were approximated (see the report)", d.Report.Count(Approximated))
	}
	files := map[string][]byte{"policy.yaml": d.Render()}
	for name, hosts := range d.Hosts {
		files[name] = RenderHosts(hosts)
	}
	if err := safefile.OutDir(dir); err != nil {
		return "", err
	}
	// Validate in a scratch directory beside the target, so that a
	// hosts file resolves as it will.
	tmp, err := os.MkdirTemp(dir, ".sluice-import-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, name := range sortedKeys(files) {
		if err := writeNew(filepath.Join(tmp, name), files[name]); err != nil {
			return "", err
		}
	}
	if _, _, err := policy.Load(filepath.Join(tmp, "policy.yaml")); err != nil {
		return "", fmt.Errorf("the imported policy does not validate (a bug in the importer; please report it with the source):\n%w", err)
	}
	for _, name := range sortedKeys(files) {
		target := filepath.Join(dir, name)
		if fi, err := os.Lstat(target); err == nil && !fi.Mode().IsRegular() {
			return "", fmt.Errorf("%s exists and is not a regular file; not replacing it", target)
		}
		// rename(2) replaces a link itself, never what it points to.
		if err := os.Rename(filepath.Join(tmp, name), target); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, "policy.yaml"), nil
}

func writeNew(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
