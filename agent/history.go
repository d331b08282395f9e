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

// history keeps, over the last passes, the measured rate, drops per
// second and backlog of every charted class, the sharing controllers'
// decisions, and the same for the hosts a console page watches, for the
// dashboard's charts (a page opened late still sees the last minutes).
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
	// adds counts the passes added; every max of them the keys of the
	// series gone are swept.
	adds int
	// drops is each class's drop counter at the pass before, for drops
	// per second.
	drops map[seriesKey]dropMark
	// rtts is each class's round-trip samples and their sum at the pass
	// before, for the mean round trip of each pass's new samples.
	rtts map[seriesKey]rttMark
	// watched holds the hosts whose classes are kept too, each until
	// when (a host's page asks every second; maxWatched at most).
	watched map[string]time.Time
}

type dropMark struct {
	n  uint32
	at time.Time
}

type rttMark struct {
	n   uint64
	sum float64 // seconds
	at  time.Time
}

const (
	maxWatched   = 16
	watchTimeout = 2 * time.Minute
)

type seriesKey struct {
	Interface, Direction, Class, Kind string
}

type point struct {
	key seriesKey
	v   float64 // in the unit of its kind
}

func newHistory(max int) *history { return &history{max: max} }

func (h *history) add(s *stats.Sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var m []point
	watching := h.expire(s.At)
	for _, t := range s.Trees {
		n := 0
		for _, c := range t.Classes {
			if IsHostClass(c.Name) {
				if !watching {
					continue // the common case: no page asks for a host
				}
				if _, host, _ := splitHost(c.Name); h.watched[host].IsZero() {
					continue
				}
			} else if n >= maxCharted {
				continue
			} else {
				n++
			}
			m = append(m, point{seriesKey{t.Interface, t.Direction, c.Name, ""}, float64(c.Measured)},
				point{seriesKey{t.Interface, t.Direction, c.Name, "backlog"}, float64(c.Backlog)})
			dk := seriesKey{t.Interface, t.Direction, c.Name, "drops"}
			if d, ok := h.drops[dk]; ok && c.Drops >= d.n && s.At.After(d.at) {
				m = append(m, point{dk, float64(c.Drops-d.n) / s.At.Sub(d.at).Seconds()})
			}
			if h.drops == nil {
				h.drops = map[seriesKey]dropMark{}
			}
			h.drops[h.key(dk)] = dropMark{c.Drops, s.At}
			if c.RTT != nil {
				// The mean of the samples the pass brought; none where
				// it brought none (an idle host has no round trips).
				rk := seriesKey{t.Interface, t.Direction, c.Name, "rtt"}
				sum := c.RTT.Mean * float64(c.RTT.Samples)
				if r, ok := h.rtts[rk]; ok && c.RTT.Samples > r.n {
					m = append(m, point{rk, (sum - r.sum) / float64(c.RTT.Samples-r.n)})
				}
				if h.rtts == nil {
					h.rtts = map[seriesKey]rttMark{}
				}
				h.rtts[h.key(rk)] = rttMark{c.RTT.Samples, sum, s.At}
			}
		}
		for _, sh := range t.Sharing {
			limit := sh.Ceil
			if sh.Applied {
				limit = sh.Limit
			}
			m = append(m, point{seriesKey{t.Interface, t.Direction, sh.Class, "demand"}, float64(sh.Demand)},
				point{seriesKey{t.Interface, t.Direction, sh.Class, "share"}, float64(sh.Share)},
				point{seriesKey{t.Interface, t.Direction, sh.Class, "limit"}, float64(limit)})
		}
	}
	for i := range m {
		m[i].key = h.key(m[i].key)
	}
	// A class gone (a pod deleted, a host no page watches any more) has
	// no drop counter to difference against.
	for k, d := range h.drops {
		if !d.at.Equal(s.At) {
			delete(h.drops, k)
		}
	}
	for k, r := range h.rtts {
		if !r.at.Equal(s.At) {
			delete(h.rtts, k)
		}
	}
	h.at = append(h.at, s.At)
	h.rate = append(h.rate, m)
	if len(h.at) > h.max {
		// Shift rather than ring: max is a few hundred small maps.
		h.at = append(h.at[:0:0], h.at[len(h.at)-h.max:]...)
		h.rate = append(h.rate[:0:0], h.rate[len(h.rate)-h.max:]...)
	}
	h.adds++
	if h.adds%max(h.max, 1) == 0 {
		h.sweep()
	}
}

// sweep forgets the keys of the series that left the history: classes
// come and go (pods churn), and a key kept for each one that ever was
// grew the agent by a few MB an hour.
func (h *history) sweep() {
	live := make(map[seriesKey]bool, len(h.keys))
	for _, m := range h.rate {
		for _, p := range m {
			live[p.key] = true
		}
	}
	for k := range h.drops {
		live[k] = true
	}
	for k := range h.rtts {
		live[k] = true
	}
	for k := range h.keys {
		if !live[k] {
			delete(h.keys, k)
		}
	}
}

// key returns the history's own copy of k (see keys).
func (h *history) key(k seriesKey) seriesKey {
	if h.keys == nil {
		h.keys = map[seriesKey]seriesKey{}
	}
	kept, ok := h.keys[k]
	if !ok {
		kept = seriesKey{strings.Clone(k.Interface), strings.Clone(k.Direction), strings.Clone(k.Class), k.Kind}
		h.keys[kept] = kept
	}
	return kept
}

// watch has the history keep host's classes for watchTimeout from now;
// beyond maxWatched hosts, the one watched longest ago gives way.
func (h *history) watch(host string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watched == nil {
		h.watched = map[string]time.Time{}
	}
	now := time.Now()
	if _, ok := h.watched[host]; !ok && len(h.watched) >= maxWatched {
		var oldest string
		for k, until := range h.watched {
			if oldest == "" || until.Before(h.watched[oldest]) {
				oldest = k
			}
		}
		delete(h.watched, oldest)
	}
	h.watched[strings.Clone(host)] = now.Add(watchTimeout)
	return true
}

// expire forgets the hosts no page has asked for lately; it reports
// whether any is still watched. h.mu is held.
func (h *history) expire(now time.Time) bool {
	for k, until := range h.watched {
		if now.After(until) {
			delete(h.watched, k)
		}
	}
	return len(h.watched) > 0
}

// History is what /api/v1/history returns: the time of each pass (Unix
// seconds) and, per class, its measured rate in bytes/s at each (null
// where the class did not exist), its drops per second and its backlog
// in bytes.
type History struct {
	At     []float64 `json:"at"`
	Series []Series  `json:"series"`
}

// Series is one class's values over the history, in Unit: its measured
// rate, or (Kind) what a sharing controller counted as its demand, its
// share and the limit it kept it at, all in bytes/s; or its drops per
// second or its backlog in bytes; or (rtt, where its interface times
// round trips) the mean round trip of the samples each pass brought, in
// seconds (null where it brought none). A rate's series also has BPS,
// the same in bit/s (deprecated: docs/changelog.md).
type Series struct {
	Interface string     `json:"interface"`
	Direction string     `json:"direction"`
	Class     string     `json:"class"`
	Kind      string     `json:"kind,omitempty"` // "", demand, share, limit; drops, backlog; rtt
	Unit      string     `json:"unit"`           // bytes/s, packets/s, bytes, seconds
	BPS       []*float64 `json:"bps,omitempty"`
	Values    []*float64 `json:"values,omitempty"`
}

// unit is what a series of kind counts.
func unit(kind string) string {
	switch kind {
	case "drops":
		return "packets/s"
	case "backlog":
		return "bytes"
	case "rtt":
		return "seconds"
	}
	return "bytes/s"
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
				se := Series{Interface: k.Interface, Direction: k.Direction, Class: k.Class, Kind: k.Kind, Unit: unit(k.Kind)}
				se.Values = make([]*float64, len(h.at))
				if se.Unit == "bytes/s" {
					se.BPS = make([]*float64, len(h.at))
				}
				out.Series = append(out.Series, se)
			}
			v := p.v
			out.Series[j].Values[i] = &v
			if out.Series[j].BPS != nil {
				b := v * 8
				out.Series[j].BPS[i] = &b
			}
		}
	}
	return out
}
