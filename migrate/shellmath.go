package migrate

import (
	"fmt"
	"strconv"
	"strings"
)

// Shell arithmetic, as config files that are shell scripts write it
// (FireQOS's example: INPUT_SPEED="$((12200 * 85 / 100))kbit"): integers,
// + - * / % and parentheses, unary minus, and variables set earlier in
// the file (NAME or $NAME). Division truncates toward zero, as bash's
// does. Nothing runs: a name the file does not set is an error, as is
// anything else bash would compute (comparisons, assignments, bases).

// shellArith evaluates expr with vars.
func shellArith(expr string, vars map[string]string) (int64, error) {
	p := &arith{s: expr, vars: vars}
	v, err := p.sum()
	if err != nil {
		return 0, err
	}
	p.space()
	if p.i < len(p.s) {
		return 0, fmt.Errorf("$((%s)): %q is not integer arithmetic sluice reads (+ - * / %% and parentheses)", expr, p.s[p.i:])
	}
	return v, nil
}

// arithEnd finds the end of a $(( ... )) that starts s: the index just
// past its closing "))", -1 where there is none.
func arithEnd(s string) int {
	depth := 0
	for i := 3; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			if depth > 0 {
				depth--
				continue
			}
			if i+1 < len(s) && s[i+1] == ')' {
				return i + 2
			}
			return -1
		}
	}
	return -1
}

type arith struct {
	s     string
	i     int
	vars  map[string]string
	depth int
}

func (p *arith) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *arith) sum() (int64, error) {
	v, err := p.product()
	for err == nil {
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != '+' && p.s[p.i] != '-' {
			break
		}
		op := p.s[p.i]
		p.i++
		var w int64
		if w, err = p.product(); err == nil {
			if op == '+' {
				v += w
			} else {
				v -= w
			}
		}
	}
	return v, err
}

func (p *arith) product() (int64, error) {
	v, err := p.unary()
	for err == nil {
		p.space()
		if p.i >= len(p.s) || !strings.ContainsRune("*/%", rune(p.s[p.i])) {
			break
		}
		op := p.s[p.i]
		p.i++
		var w int64
		if w, err = p.unary(); err != nil {
			break
		}
		switch {
		case op == '*':
			v *= w
		case w == 0:
			return 0, fmt.Errorf("$((%s)): division by zero", p.s)
		case op == '/':
			v /= w
		default:
			v %= w
		}
	}
	return v, err
}

func (p *arith) unary() (int64, error) {
	p.space()
	if p.i < len(p.s) && (p.s[p.i] == '-' || p.s[p.i] == '+') {
		neg := p.s[p.i] == '-'
		p.i++
		v, err := p.unary()
		if neg {
			v = -v
		}
		return v, err
	}
	return p.atom()
}

func (p *arith) atom() (int64, error) {
	p.space()
	if p.i >= len(p.s) {
		return 0, fmt.Errorf("$((%s)): ends where a number was expected", p.s)
	}
	c := p.s[p.i]
	switch {
	case c == '(':
		if p.depth++; p.depth > 32 {
			return 0, fmt.Errorf("$((%s)): nested too deep", p.s)
		}
		p.i++
		v, err := p.sum()
		if err != nil {
			return 0, err
		}
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != ')' {
			return 0, fmt.Errorf("$((%s)): a ( without its )", p.s)
		}
		p.i++
		p.depth--
		return v, nil
	case c >= '0' && c <= '9':
		j := p.i
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		text := p.s[p.i:j]
		p.i = j
		if len(text) > 1 && text[0] == '0' {
			return 0, fmt.Errorf("$((%s)): %s is octal to the shell; sluice reads decimal numbers only", p.s, text)
		}
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("$((%s)): %s: %v", p.s, text, err)
		}
		return v, nil
	case c == '$' || c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
		if c == '$' {
			p.i++
			if p.i < len(p.s) && p.s[p.i] == '{' {
				end := strings.IndexByte(p.s[p.i:], '}')
				if end < 0 {
					return 0, fmt.Errorf("$((%s)): unterminated ${", p.s)
				}
				return p.variable(p.s[p.i+1:p.i+end], end+1)
			}
		}
		name := fqName.FindString(p.s[p.i:])
		if name == "" {
			return 0, fmt.Errorf("$((%s)): a lone $", p.s)
		}
		return p.variable(name, len(name))
	}
	return 0, fmt.Errorf("$((%s)): %q is not integer arithmetic sluice reads (+ - * / %% and parentheses)", p.s, p.s[p.i:])
}

// variable reads NAME's value as a number (the shell reads an unset or
// empty one as 0; sluice asks for it to be set in the file).
func (p *arith) variable(name string, n int) (int64, error) {
	p.i += n
	v, ok := p.vars[name]
	if !ok {
		return 0, fmt.Errorf("$((%s)): %s is not set in the file (sluice reads the file alone)", p.s, name)
	}
	x, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("$((%s)): %s is %q, not a whole number", p.s, name, v)
	}
	return x, nil
}
