package agent

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"sluice/stats"
)

func BenchmarkScrapeNewReading(b *testing.B) {
	for _, zip := range []bool{false, true} {
		name := "text"
		if zip {
			name = "gzip"
		}
		b.Run(name, func(b *testing.B) {
			a := fakeAgent(10000, true)
			h := newScrapes(a.metrics, 2)
			for i := 0; i < b.N; i++ {
				a.mu.Lock()
				s := *a.sample
				s.At = time.Now()
				a.sample = &stats.Sample{At: s.At, Trees: s.Trees}
				a.mu.Unlock()
				req := httptest.NewRequest("GET", "/metrics", nil)
				if zip {
					req.Header = http.Header{"Accept-Encoding": {"gzip"}}
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatal(rec.Code)
				}
				b.SetBytes(int64(rec.Body.Len()))
			}
		})
	}
}
