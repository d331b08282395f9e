package agent

import (
	"strings"
	"sync"
	"time"

	"sluice/stats"
)

// maxCharted bounds the classes per tree whose rate is kept for the
// charts: a tree of 10,000 hosts charts its named classes, not each host.
const maxCharted = 64

// history keeps the measured rate of every charted class over the last
// passes, for the dashboard's charts (a page opened late still sees the
// last minutes).
type history struct {
	mu   sync.Mutex
	max  int
	at   []time.Time
	rate [][]point
	// keys holds one copy of each series' key. A reading's names may
	// point into the records buffer of the pass that read them
	// (kernel's unpack does not copy): kept by the history, one name
	// kept a whole pass's buffer alive, 1.5 MB a pass at 10,000 hosts,
	// until the history was full (950 MB).
	keys map[seriesKey]seriesKey
}

type seriesKey struct {
	Interface, Direction, Class, Kind string
}

type point struct {
	key seriesKey
	bps float64
}

func newHistory(max int) *history { return &history{max: max} }

func (h *history) add(s *stats.Sample) {
	var m []point
	for _, t := range s.Trees {
		n := 0
		for _, c := range t.Classes {
			if IsHostClass(c.Name) || n >= maxCharted {
				continue
			}
			n++
			m = append(m, point{seriesKey{t.Interface, t.Direction, c.Name, ""}, c.Measured})
		}
		for _, sh := range t.Sharing {
			limit := sh.Ceil
			if sh.Applied {
				limit = sh.Limit
			}
			m = append(m, point{seriesKey{t.Interface, t.Direction, sh.Class, "demand"}, sh.Demand},
				point{seriesKey{t.Interface, t.Direction, sh.Class, "share"}, sh.Share},
				point{seriesKey{t.Interface, t.Direction, sh.Class, "limit"}, limit})
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys == nil {
		h.keys = map[seriesKey]seriesKey{}
	}
	for i := range m {
		k, ok := h.keys[m[i].key]
		if !ok {
			k = seriesKey{strings.Clone(m[i].key.Interface), strings.Clone(m[i].key.Direction), strings.Clone(m[i].key.Class), m[i].key.Kind}
			if len(h.keys) > 1<<16 { // classes come and go: start afresh rather than grow
				clear(h.keys)
			}
			h.keys[k] = k
		}
		m[i].key = k
	}
	h.at = append(h.at, s.At)
	h.rate = append(h.rate, m)
	if len(h.at) > h.max {
		// Shift rather than ring: max is a few hundred small maps.
		h.at = append(h.at[:0:0], h.at[len(h.at)-h.max:]...)
		h.rate = append(h.rate[:0:0], h.rate[len(h.rate)-h.max:]...)
	}
}

// History is what /api/v1/history returns: the time of each pass (Unix
// seconds) and, per class, its measured rate in bits/s at each (null
// where the class did not exist).
type History struct {
	At     []float64 `json:"at"`
	Series []Series  `json:"series"`
}

// Series is one class's rates over the history: its measured rate, or
// (Kind) what a sharing controller counted as its demand, its share,
// and the limit it kept it at.
type Series struct {
	Interface string     `json:"interface"`
	Direction string     `json:"direction"`
	Class     string     `json:"class"`
	Kind      string     `json:"kind,omitempty"` // "", demand, share, limit
	BPS       []*float64 `json:"bps"`
}

func (h *history) snapshot() History {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := History{At: make([]float64, len(h.at)), Series: []Series{}}
	index := map[seriesKey]int{}
	for i, at := range h.at {
		out.At[i] = float64(at.UnixMilli()) / 1000
		for _, p := range h.rate[i] {
			k := p.key
			j, ok := index[k]
			if !ok {
				j = len(out.Series)
				index[k] = j
				out.Series = append(out.Series, Series{Interface: k.Interface, Direction: k.Direction, Class: k.Class, Kind: k.Kind,
					BPS: make([]*float64, len(h.at))})
			}
			v := p.bps
			out.Series[j].BPS[i] = &v
		}
	}
	return out
}
