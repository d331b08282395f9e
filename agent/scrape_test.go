package agent

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/encoding/prototext"

	"sluice/stats"
)

// families fetches url with the headers given and decodes the body in
// the format it says, returning sluice's families as text by name.
func families(t *testing.T, h http.Handler, header http.Header) map[string]string {
	t.Helper()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header = header
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var body io.Reader = rec.Body
	if rec.Header().Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = zr
	}
	dec := expfmt.NewDecoder(body, expfmt.ResponseFormat(rec.Header()))
	out := map[string]string{}
	for {
		var f dto.MetricFamily
		if err := dec.Decode(&f); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding %s: %v", rec.Header().Get("Content-Type"), err)
		}
		if strings.HasPrefix(f.GetName(), "sluice_") {
			if _, dup := out[f.GetName()]; dup {
				t.Errorf("family %s twice", f.GetName())
			}
			out[f.GetName()] = prototext.Format(&f)
		}
	}
	return out
}

// A scrape says what promhttp would say of the same gatherer, in every
// format and encoding a client may ask for, and a second scrape of the
// same reading reuses the class metrics' encoding.
func TestScrapeMatchesPromhttp(t *testing.T) {
	a := fakeAgent(300, true)
	// Names the text format must escape.
	tr := a.sample.Trees[0]
	tr.Classes = append(tr.Classes, &stats.Class{Name: `od"d\\cl` + "\n" + `/10.9.9.9`, ID: "1:fff", Parent: "1:10", Rate: 1e6 / 8, Ceil: 2e6 / 8, Bytes: 5, Packets: 1})
	ours := newScrapes(a.metrics, 2)
	ref := promhttp.HandlerFor(a.metrics.gatherer, promhttp.HandlerOpts{})
	for _, tt := range []struct {
		name   string
		header http.Header
	}{
		{"text", http.Header{}},
		{"text gzip", http.Header{"Accept-Encoding": {"gzip"}}},
		{"protobuf", http.Header{"Accept": {"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"}}},
		{"protobuf gzip", http.Header{"Accept": {"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"}, "Accept-Encoding": {"br, gzip;q=0.5"}}},
		{"gzip refused", http.Header{"Accept-Encoding": {"gzip;q=0"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := families(t, ref, tt.header)
			got := families(t, ours, tt.header)
			if len(want) < 8 || !strings.Contains(want["sluice_class_sent_bytes_total"], "10.0.1.43") {
				t.Fatalf("the reference has %d families", len(want))
			}
			for name, w := range want {
				if got[name] != w {
					t.Errorf("%s differs:\n%.600s\nwant\n%.600s", name, got[name], w)
				}
			}
			for name := range got {
				if _, ok := want[name]; !ok {
					t.Errorf("%s is not in the reference", name)
				}
			}
		})
	}
	first, _ := ours.classes(scrapeKey{expfmt.Negotiate(http.Header{}), false})
	again, _ := ours.classes(scrapeKey{expfmt.Negotiate(http.Header{}), false})
	if len(first.b) == 0 || first != again {
		t.Error("a second scrape of one reading encoded the classes again")
	}
}

// A body a response is still writing is never written over; once the
// last response releases it, after a newer reading replaced it, its
// buffer takes the next reading's body, which reads as a fresh one.
func TestScrapeBodiesReused(t *testing.T) {
	a := fakeAgent(50, true)
	s := newScrapes(a.metrics, 2)
	newReading := func() {
		a.mu.Lock()
		a.sample = &stats.Sample{At: time.Now(), Trees: a.sample.Trees}
		a.mu.Unlock()
	}
	for _, zip := range []bool{false, true} {
		k := scrapeKey{expfmt.Negotiate(http.Header{}), zip}
		held, _ := s.classes(k) // a response in flight
		was, at := string(held.b), &held.b[0]
		newReading()
		next, _ := s.classes(k)
		if string(held.b) != was || &next.b[0] == at {
			t.Fatalf("gzip %v: a new reading wrote into a body still being written", zip)
		}
		at2 := &next.b[0]
		s.release(k, next)
		s.release(k, held) // the last one out: its buffer may be kept
		newReading()
		third, _ := s.classes(k)
		if p := &third.b[0]; p != at && p != at2 {
			t.Errorf("gzip %v: neither released buffer was reused", zip)
		}
		fresh, _ := newScrapes(a.metrics, 2).classes(k)
		if !bytes.Equal(third.b, fresh.b) {
			t.Errorf("gzip %v: a body in a reused buffer differs from a fresh one", zip)
		}
		s.release(k, third)
	}
}

func TestGzipAccepted(t *testing.T) {
	for v, want := range map[string]bool{"": false, "gzip": true, "br, gzip;q=0.5": true, "GZIP": true, "gzip;q=0": false, "gzip; q=0": false, "deflate": false, "x-gzip": false} {
		if got := gzipAccepted(http.Header{"Accept-Encoding": {v}}); got != want {
			t.Errorf("Accept-Encoding %q: %v, want %v", v, got, want)
		}
	}
}

// blockedWriter is a client that never reads: its Write waits.
type blockedWriter struct {
	h       http.Header
	started chan struct{}
	release chan struct{}
}

func (b *blockedWriter) Header() http.Header { return b.h }
func (b *blockedWriter) WriteHeader(int)     {}
func (b *blockedWriter) Write(p []byte) (int, error) {
	select {
	case b.started <- struct{}{}:
	default:
	}
	<-b.release
	return len(p), nil
}

// Clients that never read do not hold the in-flight slots: the slots
// bound gathering and encoding, and a body being written is shared
// (issue 58: two such clients kept every scrape at 503 for 30 s).
func TestScrapeSlotsAreNotHeldByReaders(t *testing.T) {
	a := fakeAgent(50, true)
	s := newScrapes(a.metrics, 2)
	release := make(chan struct{})
	defer close(release)
	for i := 0; i < 4; i++ {
		w := &blockedWriter{h: http.Header{}, started: make(chan struct{}, 1), release: release}
		go s.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		select {
		case <-w.started:
		case <-time.After(5 * time.Second):
			t.Fatalf("blocked client %d never got to write", i)
		}
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("with four clients that never read: status %d, want 200", rec.Code)
	}
}
