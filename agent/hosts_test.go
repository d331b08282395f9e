package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"sluice/stats"
	"sluice/units"
)

func TestParseHostQuery(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  hostQuery
		err   string
	}{
		{"", hostQuery{sort: "measured", limit: 25}, ""},
		{"q=10.0.&sort=drops&limit=5", hostQuery{search: "10.0.", sort: "drops", limit: 5}, ""},
		{"q=ALICE", hostQuery{search: "alice", sort: "measured", limit: 25}, ""},
		{"host=10.0.0.7", hostQuery{host: "10.0.0.7", sort: "measured", limit: 25}, ""},
		{"sort=name", hostQuery{}, `sort="name": want one of measured, bytes, drops, backlog, rtt`},
		{"limit=0", hostQuery{}, `limit="0": want 1 to 1000`},
		{"limit=1001", hostQuery{}, `limit="1001": want 1 to 1000`},
		{"limit=x", hostQuery{}, `limit="x"`},
		{"host=", hostQuery{}, `host="": want a host's name or address`},
		{"q=a&host=b", hostQuery{}, "q and host together"},
		{"q=a&q=b", hostQuery{}, "q given 2 times"},
		{"hosts=1", hostQuery{}, `unknown parameter "hosts" (known: q, host, sort, limit)`},
		{"q=" + strings.Repeat("a", 257), hostQuery{}, "q: 257 characters, at most 256"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			v, _ := url.ParseQuery(tc.query)
			got, err := parseHostQuery(v)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// hostsSample is a reading of two trees with per-host classes: egress
// hosts measured at 1..n Mbit/s, and an ingress tree with host 10.0.0.2
// in it too.
func hostsSample(n int) *stats.Sample {
	eg := &stats.Tree{Interface: "eth0", Direction: "egress", Classes: []*stats.Class{{Name: "(root)", ID: "1:1"}, {Name: "subs", ID: "1:10"}}}
	for i := 1; i <= n; i++ {
		eg.Classes = append(eg.Classes, &stats.Class{Name: fmt.Sprintf("subs/10.0.0.%d", i), ID: fmt.Sprintf("1:%x", 0x100+i),
			Rate: 1e6 / 8, Ceil: 1e7 / 8, Measured: units.Rate(i) * 1e6 / 8, Bytes: uint64(n-i) * 1000, Drops: uint32(i % 3), Backlog: uint32(i * 10)})
	}
	// Round trips: two hosts with enough samples, one with too few.
	for i, r := range map[int]*stats.RTT{5: {Samples: 50, P50: 0.03, P95: 0.08}, 9: {Samples: 3, P95: 0.5}, 12: {Samples: 20, P50: 0.02, P95: 0.04}} {
		if i <= n {
			eg.Classes[1+i].RTT = r
		}
	}
	in := &stats.Tree{Interface: "eth0", Direction: "ingress", Classes: []*stats.Class{{Name: "(root)", ID: "1:1"},
		{Name: "down/10.0.0.2", ID: "1:102", Rate: 2e6 / 8, Ceil: 2e7 / 8, Measured: 5e5 / 8}}}
	return &stats.Sample{At: time.Now(), Trees: []*stats.Tree{eg, in}}
}

func TestFindHosts(t *testing.T) {
	s := hostsSample(30)
	names := func(h Hosts) string {
		var out []string
		for _, r := range h.Hosts {
			out = append(out, r.Direction[:1]+":"+r.Host)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		name    string
		q       hostQuery
		matched int
		want    string
	}{
		{"top talkers by rate", hostQuery{sort: "measured", limit: 3}, 31, "e:10.0.0.30 e:10.0.0.29 e:10.0.0.28"},
		{"by bytes", hostQuery{sort: "bytes", limit: 2}, 31, "e:10.0.0.1 e:10.0.0.2"},
		{"by drops, ties by name", hostQuery{sort: "drops", limit: 3}, 31, "e:10.0.0.11 e:10.0.0.14 e:10.0.0.17"},
		{"by backlog", hostQuery{sort: "backlog", limit: 1}, 31, "e:10.0.0.30"},
		{"worst latency: p95 of hosts with enough samples first", hostQuery{sort: "rtt", limit: 3}, 31, "e:10.0.0.5 e:10.0.0.12 e:10.0.0.1"},
		{"search", hostQuery{search: "10.0.0.2", sort: "measured", limit: 25}, 12, "e:10.0.0.29 e:10.0.0.28 e:10.0.0.27 e:10.0.0.26 e:10.0.0.25 e:10.0.0.24 e:10.0.0.23 e:10.0.0.22 e:10.0.0.21 e:10.0.0.20 e:10.0.0.2 i:10.0.0.2"},
		{"search by class", hostQuery{search: "down/", sort: "measured", limit: 25}, 1, "i:10.0.0.2"},
		{"one host in both directions", hostQuery{host: "10.0.0.2", sort: "measured", limit: 25}, 2, "e:10.0.0.2 i:10.0.0.2"},
		{"no such host", hostQuery{host: "10.9.9.9", sort: "measured", limit: 25}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := findHosts(s, tc.q)
			if h.Total != 31 || h.Matched != tc.matched {
				t.Errorf("total %d matched %d, want 31 and %d", h.Total, h.Matched, tc.matched)
			}
			if got := names(h); !strings.HasPrefix(got, tc.want) || (tc.q.limit < 25 && got != tc.want) {
				t.Errorf("got %s\nwant %s", got, tc.want)
			}
		})
	}
	if h := findHosts(nil, hostQuery{limit: 5}); h.Hosts == nil || h.Total != 0 {
		t.Errorf("no reading: %+v (want an empty list, not null)", h)
	}
	r := findHosts(s, hostQuery{host: "10.0.0.7", sort: "measured", limit: 1}).Hosts[0]
	if r.Class != "subs/10.0.0.7" || r.Parent != "subs" || r.Interface != "eth0" || r.ID != "1:107" || r.Rate != 1e6/8 ||
		r.Ceil != 1e7/8 || r.Measured != 7e6/8 || r.Drops != 1 || r.Backlog != 70 {
		t.Errorf("row %+v", r)
	}
}

// A host's page asks for it by name: from then on the history keeps its
// classes' rate, drops per second, backlog and round trips, until no page has asked
// for watchTimeout; the other hosts stay uncharted.
func TestHistoryWatchesHosts(t *testing.T) {
	h := newHistory(10)
	s := hostsSample(3)
	t0 := s.At
	h.add(s)
	if got := h.watch("10.0.0.2"); !got {
		t.Fatal("watch refused")
	}
	for i := 1; i <= 3; i++ {
		s := hostsSample(3)
		s.At = t0.Add(time.Duration(i) * time.Second)
		s.Trees[0].Classes[3].Drops = uint32(10 * i) // subs/10.0.0.2: 10 drops a second
		// and 10 round trips a pass, of 20 ms + i ms each.
		sum := 0.0
		for j := 1; j <= i; j++ {
			sum += 10 * (0.020 + 0.001*float64(j))
		}
		s.Trees[0].Classes[3].RTT = &stats.RTT{Samples: uint64(10 * i), Mean: sum / float64(10*i)}
		h.add(s)
	}
	kinds := map[string]*Series{}
	for _, se := range h.snapshot().Series {
		if strings.Contains(se.Class, "/") {
			se := se
			kinds[se.Direction+" "+se.Class+" "+se.Kind] = &se
		}
	}
	if len(kinds) != 7 {
		t.Fatalf("host series %v, want rate, drops and backlog of 10.0.0.2 in each direction, and its round trips", kinds)
	}
	if r := kinds["egress subs/10.0.0.2 rtt"]; r.Unit != "seconds" || len(r.Values) != 4 || r.Values[1] != nil ||
		r.Values[2] == nil || math.Abs(*r.Values[2]-0.022) > 1e-9 || math.Abs(*r.Values[3]-0.023) > 1e-9 {
		t.Errorf("round-trip series %+v: want null before the second watched pass, then each pass's mean (22, 23 ms)", r)
	}
	d := kinds["egress subs/10.0.0.2 drops"]
	if d.Unit != "packets/s" || d.BPS != nil || len(d.Values) != 4 || d.Values[0] != nil || d.Values[1] != nil || *d.Values[2] != 10 || *d.Values[3] != 10 {
		t.Errorf("drops series %+v: want null before the second watched pass, then 10/s", d)
	}
	if r := kinds["egress subs/10.0.0.2 "]; r.Unit != "bytes/s" || *r.Values[3] != 2e6/8 || *r.BPS[3] != 2e6 {
		t.Errorf("rate series %+v", r)
	}
	if b := kinds["egress subs/10.0.0.2 backlog"]; b.Unit != "bytes" || *b.Values[3] != 20 {
		t.Errorf("backlog series %+v", b)
	}
	// Unasked for, the host is dropped from the passes that follow.
	s = hostsSample(3)
	s.At = time.Now().Add(watchTimeout + time.Second)
	h.add(s)
	snap := h.snapshot()
	for _, se := range snap.Series {
		if strings.Contains(se.Class, "/") && (se.Values != nil && se.Values[len(snap.At)-1] != nil) {
			t.Errorf("%s still charted after its page went away", se.Class)
		}
	}
	// At most maxWatched hosts: the one asked for longest ago gives way.
	for i := 0; i < maxWatched+3; i++ {
		h.watch(fmt.Sprintf("10.1.0.%d", i))
	}
	if len(h.watched) != maxWatched {
		t.Errorf("%d hosts watched, at most %d", len(h.watched), maxWatched)
	}
}

func TestHostsEndpoint(t *testing.T) {
	a := fakeAgent(40, false)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	get := func(q string) (int, Hosts, string) {
		resp, err := http.Get(srv.URL + "/api/v1/hosts" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var h Hosts
		json.Unmarshal(b, &h)
		return resp.StatusCode, h, string(b)
	}
	code, h, body := get("?q=10.0.0.3&limit=2&sort=bytes")
	if code != 200 || h.Total != 40 || h.Matched != 11 || len(h.Hosts) != 2 || h.Hosts[0].Host != "10.0.0.39" {
		t.Errorf("%d %s", code, body)
	}
	code, h, body = get("?host=10.0.0.5")
	if code != 200 || len(h.Hosts) != 1 || !h.Watched || a.hist.watched["10.0.0.5"].IsZero() {
		t.Errorf("one host: %d %s (watched %v)", code, body, a.hist.watched)
	}
	// The worst latency first, each row with its round trips: hosts with
	// enough samples by p95, then the rest.
	code, h, body = get("?sort=rtt&limit=40")
	if code != 200 || len(h.Hosts) != 40 || !strings.Contains(body, `"rtt":{"samples":`) {
		t.Fatalf("sort=rtt: %d %.600s", code, body)
	}
	enough := true
	for i, r := range h.Hosts {
		switch {
		case !r.RTT.Enough():
			enough = false
		case !enough:
			t.Errorf("sort=rtt: row %d (%s, %d samples) after a host with too few", i, r.Host, r.RTT.Samples)
		case i > 0 && r.RTT.P95 > h.Hosts[i-1].RTT.P95:
			t.Errorf("sort=rtt: row %d p95 %v above row %d's %v", i, r.RTT.P95, i-1, h.Hosts[i-1].RTT.P95)
		}
	}
	if !h.Hosts[0].RTT.Enough() || enough {
		t.Errorf("sort=rtt: the fake's hosts should mix enough and too few samples: %.600s", body)
	}
	if code, _, body = get("?sort=fastest"); code != 400 || !strings.Contains(body, `sort=\"fastest\"`) {
		t.Errorf("a bad sort: %d %s", code, body)
	}
}
