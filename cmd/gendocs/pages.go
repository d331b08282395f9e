package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
)

// The sections a man page of a command has that --help does not: what a
// reader of sluice(1) looks for first (EXIT STATUS, FILES, ENVIRONMENT)
// and sluice-agent(8)'s life as a service. Markdown, rendered to roff.
const rootSections = `# EXIT STATUS
**0**
: success: applied, valid, nothing to change.

**1**
: failure while acting: the kernel refused a change (what was changed is rolled back), a lock was not had in time, a measurement failed its expectations.

**2**
: bad input: a policy, flag or file that is not valid; each problem as FILE:LINE:COL: message, and nothing changed.

**3**
: **plan --detailed-exitcode** only: there are changes to make.

# ENVIRONMENT
**SLUICE_STATE_DIR**
: where sluice keeps its records of what it made (default /run/sluice; tests move it).

**GOGC**, **GOMEMLIMIT**
: the Go runtime's memory settings; apply sets its own for a large policy unless one is given.

# FILES
*/etc/sluice/policy.yaml*
: the policy the units apply; installed as a template that is refused until edited (see **sluice-policy**(5)).

*/run/sluice/*
: sluice's records of what it made in each network namespace, and the locks that keep two writers apart. On tmpfs: the kernel's objects do not survive a reboot either.

*/usr/share/doc/sluice/*
: the documentation, and examples/ with a policy for each use.

# SEE ALSO
**sluice-policy**(5), **tc**(8), **tc-htb**(8), **ip-netns**(8)
`

const agentSections = `# SIGNALS
**SIGHUP**
: read the policy again and apply the difference (as an edit of the file does, within a second).

**SIGTERM**, **SIGINT**
: stop within 2 s, leaving the shaping in place (**--reset-on-exit** removes it).

# SERVICE
*sluice-agent.service* runs **sluice agent /etc/sluice/policy.yaml --listen 127.0.0.1:9464**. Neither it nor *sluice-apply.service* (a oneshot that applies the policy once at boot on a box without the agent) is enabled by the package, and both refuse the installed template until it is edited:

    sudoedit /etc/sluice/policy.yaml    # your link; delete "template: true"
    sluice validate /etc/sluice/policy.yaml
    sudo systemctl enable --now sluice-agent
    sudo systemctl reload sluice-agent  # after an edit

A policy that does not validate is refused, its errors logged and shown at /api/v1/status and /healthz (503); the policy in force stays.

# FILES
*/etc/sluice/policy.yaml*
: the policy (**sluice-policy**(5)).

*/run/sluice/*
: records and the agent's file (its pid, policy and address), read by **sluice show**.

# SEE ALSO
**sluice-policy**(5), and /usr/share/doc/sluice/agent.md
`

// markdown renders md, sections only, to roff (md2man makes a
// document's first level-1 heading its title: a placeholder takes it).
func markdown(md string) []byte {
	out := md2man.Render([]byte("# PLACEHOLDER\n\n" + md))
	return ascii(regexp.MustCompile(`(?m)^\.TH "?PLACEHOLDER.*\n`).ReplaceAll(out, nil))
}

// tablesToLists rewrites markdown tables as definition lists: a man
// page's tables (tbl) cannot wrap a long cell, and docs/policy.md's
// second column is prose. The first cell is the term; the others, after
// their column's heading where there are more than two, its definition.
func tablesToLists(doc string) string {
	lines := strings.Split(doc, "\n")
	var out []string
	cells := func(l string) []string {
		l = strings.TrimSpace(l)
		l = strings.TrimSuffix(strings.TrimPrefix(l, "|"), "|")
		// A | inside backquotes is not a column's edge.
		var cs []string
		quoted, start := false, 0
		for i := 0; i < len(l); i++ {
			switch {
			case l[i] == '`':
				quoted = !quoted
			case l[i] == '\\' && i+1 < len(l) && l[i+1] == '|':
				i++
			case l[i] == '|' && !quoted:
				cs = append(cs, strings.TrimSpace(l[start:i]))
				start = i + 1
			}
		}
		cs = append(cs, strings.TrimSpace(l[start:]))
		for i := range cs {
			cs[i] = strings.ReplaceAll(cs[i], "\\|", "|")
		}
		return cs
	}
	sep := regexp.MustCompile(`^\|?\s*:?-{3,}`)
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(strings.TrimSpace(lines[i]), "|") || i+1 >= len(lines) || !sep.MatchString(strings.TrimSpace(lines[i+1])) {
			out = append(out, lines[i])
			continue
		}
		head := cells(lines[i])
		i += 2
		for ; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
			c := cells(lines[i])
			def := c[1:]
			if len(c) > 2 {
				def = nil
				for j, v := range c[1:] {
					if j+1 < len(head) && head[j+1] != "" {
						v = head[j+1] + ": " + v
					}
					def = append(def, v)
				}
			}
			out = append(out, c[0], ": "+strings.Join(def, "; "), "")
		}
		i--
	}
	return strings.Join(out, "\n")
}

// insertSections puts extra's sections before page's SEE ALSO (cobra's
// list of the commands), and the references of extra's own SEE ALSO at
// the end of that list, and writes the page back.
func insertSections(page string, extra []byte) error {
	b, err := os.ReadFile(page)
	if err != nil {
		return err
	}
	const see = ".SH SEE ALSO\n"
	body, refs, _ := bytes.Cut(extra, []byte(see))
	refs = bytes.TrimSpace(refs)
	i := bytes.Index(b, []byte("\n"+see))
	if i < 0 {
		b = append(b, body...)
		if len(refs) > 0 {
			b = append(append(append(b, see...), refs...), '\n')
		}
		return os.WriteFile(page, b, 0o644)
	}
	out := append(append([]byte{}, b[:i+1]...), body...)
	out = append(out, bytes.TrimRight(b[i+1:], "\n")...)
	if len(refs) > 0 {
		out = append(append(out, ", "...), refs...)
	}
	return os.WriteFile(page, append(out, '\n'), 0o644)
}

// policyPage is sluice-policy(5), made from docs/policy.md: its headings
// one level up (the page's sections), links to other documents named by
// their installed path.
func policyPage(src []byte, date string) []byte {
	doc := string(src)
	// The document's own title becomes NAME and DESCRIPTION.
	if i := strings.Index(doc, "\n"); strings.HasPrefix(doc, "# ") && i > 0 {
		doc = doc[i+1:]
	}
	doc = regexp.MustCompile(`(?m)^##(#*) `).ReplaceAllString(doc, "#$1 ")
	doc = tablesToLists(doc)
	doc = regexp.MustCompile(`\]\(([a-z-]+)\.md(#[^)]*)?\)`).ReplaceAllString(doc, "] (/usr/share/doc/sluice/$1.md)")
	doc = regexp.MustCompile(`\]\((\.\./)?examples/([^)]+)\)`).ReplaceAllString(doc, "] (/usr/share/doc/sluice/examples/$2)")
	head := fmt.Sprintf("%% SLUICE-POLICY 5 \"%s\" \"sluice\" \"sluice manual\"\n\n"+
		"# NAME\nsluice-policy - the policy file of sluice: interfaces, class trees, rules, shares and policers\n\n"+
		"# SYNOPSIS\n*/etc/sluice/policy.yaml*, or any file given to **sluice validate**, **plan**, **apply** or **agent**\n\n"+
		"# DESCRIPTION\n", date)
	tail := "\n# SEE ALSO\n**sluice**(1), **sluice-agent**(8), **sluice-validate**(1), and the examples in /usr/share/doc/sluice/examples\n"
	return ascii(md2man.Render([]byte(head + doc + tail)))
}

// ascii writes every character beyond ASCII as groff's escape for it
// (\[u2014]): troff reads its input as Latin-1 unless told otherwise.
func ascii(b []byte) []byte {
	var out bytes.Buffer
	for _, r := range string(b) {
		if r < 0x80 {
			out.WriteRune(r)
		} else {
			fmt.Fprintf(&out, "\\[u%04X]", r)
		}
	}
	return out.Bytes()
}

// movePage rewrites man1/NAME.1 as manS/NAME.S, and every page's
// reference NAME(1) as NAME(S).
func movePage(dir, name, section string) error {
	from := filepath.Join(dir, "man", "man1", name+".1")
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	b = regexp.MustCompile(`(?m)^(\.TH "[^"]+" )"1"`).ReplaceAll(b, []byte(`$1"`+section+`"`))
	to := filepath.Join(dir, "man", "man"+section, name+"."+section)
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		return err
	}
	if err := os.Remove(from); err != nil {
		return err
	}
	pages, _ := filepath.Glob(filepath.Join(dir, "man", "man*", "*"))
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		nb := bytes.ReplaceAll(b, []byte(name+"(1)"), []byte(name+"("+section+")"))
		if !bytes.Equal(b, nb) {
			if err := os.WriteFile(p, nb, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}
