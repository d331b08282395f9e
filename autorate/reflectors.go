package autorate

import (
	"slices"
	"time"
)

// Pool keeps the reflectors in use healthy: of every reflector known,
// Active are pinged, the rest wait as spares. A reflector that answers
// late (or not at all) LateCount times within LateWindow is replaced by
// the next spare, and so is one whose baseline lies more than Outlier
// above the lowest when they are compared (every minute, by the
// caller): a far or slow reflector adds its own delay to every sample.
type Pool struct {
	LateCount  int           // 3
	LateWindow time.Duration // 30 s
	Outlier    time.Duration // 10 ms

	active []string
	spares []string
	late   map[string][]time.Time
}

// NewPool takes the first n of reflectors as active, the rest as spares.
func NewPool(reflectors []string, n int) *Pool {
	n = min(n, len(reflectors))
	return &Pool{LateCount: 3, LateWindow: 30 * time.Second, Outlier: 10 * time.Millisecond,
		active: slices.Clone(reflectors[:n]), spares: slices.Clone(reflectors[n:]), late: map[string][]time.Time{}}
}

// Active is the reflectors to ping.
func (p *Pool) Active() []string { return slices.Clone(p.active) }

// Late counts a late answer or a lost one from r at at, and replaces r
// when it has been late too often; replaced is its replacement, "" when
// r stays (or there is no spare: a reflector that answers late still
// answers).
func (p *Pool) Late(r string, at time.Time) (replaced string) {
	if !slices.Contains(p.active, r) {
		return ""
	}
	ts := append(p.late[r], at)
	for len(ts) > 0 && at.Sub(ts[0]) > p.LateWindow {
		ts = ts[1:]
	}
	p.late[r] = ts
	if len(ts) < p.LateCount {
		return ""
	}
	return p.replace(r)
}

// Compare replaces the active reflectors whose baseline lies more than
// Outlier above the lowest, and returns the pairs replaced (old, new).
func (p *Pool) Compare(baselines map[string]time.Duration) [][2]string {
	lowest, found := time.Duration(0), false
	for _, r := range p.active {
		if b, ok := baselines[r]; ok && (!found || b < lowest) {
			lowest, found = b, true
		}
	}
	var out [][2]string
	for _, r := range slices.Clone(p.active) {
		if b, ok := baselines[r]; ok && b-lowest > p.Outlier {
			if n := p.replace(r); n != "" {
				out = append(out, [2]string{r, n})
			}
		}
	}
	return out
}

// replace swaps r for the first spare; r goes to the back of the spares
// (a reflector late today may do tomorrow).
func (p *Pool) replace(r string) string {
	if len(p.spares) == 0 {
		return ""
	}
	i := slices.Index(p.active, r)
	n := p.spares[0]
	p.active[i] = n
	p.spares = append(p.spares[1:], r)
	delete(p.late, r)
	return n
}
