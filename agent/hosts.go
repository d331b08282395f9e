package agent

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"sluice/stats"
	"sluice/units"
)

// Hosts is what /api/v1/hosts returns: the per-host classes of the last
// reading that match a search, the busiest first (the console's top
// talkers), or every class of one host (its page).
type Hosts struct {
	// Total counts the per-host classes in the reading, Matched those
	// the search matched; Hosts holds the first Limit of those.
	Total   int       `json:"total"`
	Matched int       `json:"matched"`
	Sort    string    `json:"sort"`
	Hosts   []HostRow `json:"hosts"`
	// Watched is true when the history now keeps this host's series
	// (a request naming one host).
	Watched bool `json:"watched,omitempty"`
}

// HostRow is one per-host class: the host (the part of the class name
// after its per_host class's) in one tree, with its limits and counters
// as in a class of the reading.
type HostRow struct {
	Host      string     `json:"host"`
	Class     string     `json:"class"`
	Parent    string     `json:"parent"`
	Interface string     `json:"interface"`
	Direction string     `json:"direction"`
	ID        string     `json:"id"`
	Rate      units.Rate `json:"rate_bytes_per_second"`
	Ceil      units.Rate `json:"ceil_bytes_per_second"`
	Measured  units.Rate `json:"measured_bytes_per_second"`
	Bytes     uint64     `json:"bytes"`
	Drops     uint32     `json:"drops"`
	Backlog   uint32     `json:"backlog_bytes"`
	// RTT is the host's passive round trips where its interface times
	// them (rtt: on); fewer than stats.MinRTTSamples samples give no
	// quantiles worth showing.
	RTT *stats.RTT `json:"rtt,omitempty"`
}

// MarshalJSON adds the rates in bits per second under their names
// before base units (deprecated: docs/changelog.md).
func (r HostRow) MarshalJSON() ([]byte, error) {
	type fields HostRow
	return json.Marshal(struct {
		fields
		stats.OldRates
	}{fields(r), stats.OldRatesOf(r.Rate, r.Ceil, r.Measured)})
}

// hostQuery is a parsed /api/v1/hosts request.
type hostQuery struct {
	search string // substring of host or class, any case
	host   string // exact host: its page
	sort   string // measured, bytes, drops, backlog or rtt
	limit  int
}

const (
	hostsDefaultLimit = 25
	hostsMaxLimit     = 1000
)

var hostSorts = []string{"measured", "bytes", "drops", "backlog", "rtt"}

// key is the query in one canonical form (the cache's key).
func (q hostQuery) key() string {
	return fmt.Sprintf("%q %q %s %d", q.search, q.host, q.sort, q.limit)
}

// parseHostQuery reads q, host, sort and limit; anything else, or a bad
// value, is an error naming it.
func parseHostQuery(v url.Values) (hostQuery, error) {
	q := hostQuery{sort: "measured", limit: hostsDefaultLimit}
	for k, vs := range v {
		if len(vs) != 1 {
			return q, fmt.Errorf("%s given %d times", k, len(vs))
		}
		val := vs[0]
		switch k {
		case "q":
			if len(val) > 256 {
				return q, fmt.Errorf("q: %d characters, at most 256", len(val))
			}
			q.search = strings.ToLower(val)
		case "host":
			if val == "" || len(val) > 256 {
				return q, fmt.Errorf("host=%q: want a host's name or address", val)
			}
			q.host = val
		case "sort":
			if !slices.Contains(hostSorts, val) {
				return q, fmt.Errorf("sort=%q: want one of %s", val, strings.Join(hostSorts, ", "))
			}
			q.sort = val
		case "limit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > hostsMaxLimit {
				return q, fmt.Errorf("limit=%q: want 1 to %d", val, hostsMaxLimit)
			}
			q.limit = n
		default:
			return q, fmt.Errorf("unknown parameter %q (known: q, host, sort, limit)", k)
		}
	}
	if q.host != "" && q.search != "" {
		return q, fmt.Errorf("q and host together: host names one host, q searches")
	}
	return q, nil
}

// splitHost returns a per-host class name's per_host class and host.
func splitHost(name string) (parent, host string, ok bool) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}

// findHosts answers q from a reading.
func findHosts(s *stats.Sample, q hostQuery) Hosts {
	out := Hosts{Sort: q.sort, Hosts: []HostRow{}}
	if s == nil {
		return out
	}
	for _, t := range s.Trees {
		for _, c := range t.Classes {
			parent, host, ok := splitHost(c.Name)
			if !ok {
				continue
			}
			out.Total++
			switch {
			case q.host != "" && host != q.host:
				continue
			case q.search != "" && !strings.Contains(strings.ToLower(c.Name), q.search):
				continue
			}
			out.Matched++
			out.Hosts = append(out.Hosts, HostRow{Host: host, Class: c.Name, Parent: parent, Interface: t.Interface,
				Direction: t.Direction, ID: c.ID, Rate: c.Rate, Ceil: c.Ceil, Measured: c.Measured, Bytes: c.Bytes,
				Drops: c.Drops, Backlog: c.Backlog, RTT: c.RTT})
		}
	}
	key := func(r HostRow) float64 {
		switch q.sort {
		case "bytes":
			return float64(r.Bytes)
		case "drops":
			return float64(r.Drops)
		case "backlog":
			return float64(r.Backlog)
		case "rtt":
			// The worst latency first: p95 of hosts with enough
			// samples; the rest after them.
			if !r.RTT.Enough() {
				return -1
			}
			return r.RTT.P95
		}
		return float64(r.Measured)
	}
	// The busiest first; ties by name, so that a page does not shuffle.
	slices.SortStableFunc(out.Hosts, func(a, b HostRow) int {
		if c := cmp.Compare(key(b), key(a)); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.Host, b.Host), strings.Compare(a.Interface, b.Interface), strings.Compare(a.Direction, b.Direction))
	})
	if len(out.Hosts) > q.limit {
		out.Hosts = out.Hosts[:q.limit]
	}
	return out
}

// Hosts answers a /api/v1/hosts query from the last reading. A query
// naming one host also has the history keep that host's series (rate,
// drops, backlog) for the next minutes, for its page's charts.
func (a *Agent) Hosts(q hostQuery) Hosts {
	a.mu.RLock()
	s := a.sample
	a.mu.RUnlock()
	h := findHosts(s, q)
	if q.host != "" {
		h.Watched = a.hist.watch(q.host)
	}
	return h
}
