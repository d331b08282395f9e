package agent

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"sluice/stats"
)

// A scrape is the agent's own metrics, gathered and encoded for each
// request (a few hundred series), then the class metrics, encoded once
// per reading and per format, and compressed once: with per-host series
// a 10,000-host tree is 90,000 of them, whose encoding and gzip were
// most of a scrape (190 to 270 ms) when every request redid them. The
// exposition formats allow this: families may come in any order, and a
// gzip body may be several members one after another (RFC 1952), which
// every HTTP client and Prometheus read as one.
type scrapes struct {
	m *metrics
	// inflight bounds the scrapes served at once.
	inflight chan struct{}

	mu     sync.Mutex
	of     *stats.Sample
	bodies map[scrapeKey]*body
	// sizes are the last bodies' sizes: the next of the same kind is
	// about as large, and a buffer grown to it at once is not copied
	// on its way (a third of a 9 MB text scrape's time).
	sizes map[scrapeKey]int
	// spare holds the buffers of an earlier reading's bodies that no
	// response still writes: a new 9 MB buffer is cleared by the
	// runtime before use, a fifth of a scrape's time.
	spare map[scrapeKey][]byte
}

// body is the class metrics of one reading in one format, and how many
// responses are writing it: its buffer is reused once none is and a
// newer reading has replaced it.
type body struct {
	b    []byte
	refs int
	old  bool // a newer reading's bodies have replaced it
}

type scrapeKey struct {
	format expfmt.Format
	gzip   bool
}

func newScrapes(m *metrics, inflight int) *scrapes {
	return &scrapes{m: m, inflight: make(chan struct{}, inflight)}
}

// ServeHTTP answers a scrape as promhttp would: the format the client
// accepts (text, or protobuf when asked), gzip when accepted, 503 beyond
// the in-flight bound. The bound covers gathering and encoding, not
// writing: a client that never reads holds the shared body, not a slot
// (two such clients kept every scrape at 503 for the 30 s write timeout).
func (s *scrapes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var slot sync.Once
	free := func() { slot.Do(func() { <-s.inflight }) }
	select {
	case s.inflight <- struct{}{}:
		defer free()
	default:
		http.Error(w, "Limit of concurrent requests reached, try again later.", http.StatusServiceUnavailable)
		return
	}
	format := expfmt.Negotiate(r.Header)
	zip := gzipAccepted(r.Header)
	own, err := s.m.registry.Gather()
	if err != nil {
		http.Error(w, "gathering the agent's metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	var head bytes.Buffer
	var out io.Writer = &head
	var zw *gzip.Writer
	if zip {
		zw = newGzip(&head)
		out = zw
	}
	enc := expfmt.NewEncoder(out, format)
	for _, f := range own {
		if err := enc.Encode(f); err != nil {
			http.Error(w, "encoding the agent's metrics: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	if zw != nil {
		zw.Close()
	}
	key := scrapeKey{format, zip}
	classes, err := s.classes(key)
	if err != nil {
		http.Error(w, "encoding the class metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer s.release(key, classes)
	free()
	w.Header().Set("Content-Type", string(format))
	if zip {
		w.Header().Set("Content-Encoding", "gzip")
	}
	w.Header().Set("Vary", "Accept-Encoding")
	w.Write(head.Bytes())
	w.Write(classes.b)
}

// release ends a response's use of body b of kind k: the last one out
// of a replaced body keeps its buffer for the next reading.
func (s *scrapes) release(k scrapeKey, b *body) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.refs--; b.refs == 0 && b.old {
		s.keep(k, b)
	}
}

// keep takes a replaced body's buffer as the spare of its kind (under
// s.mu).
func (s *scrapes) keep(k scrapeKey, b *body) {
	if s.spare == nil {
		s.spare = map[scrapeKey][]byte{}
	}
	if cap(b.b) > cap(s.spare[k]) {
		s.spare[k] = b.b[:0]
	}
	b.b = nil
}

// classes returns the class metrics of the current reading encoded for
// k, encoding them on the first request for that reading and format.
// The caller writes it, then releases it.
func (s *scrapes) classes(k scrapeKey) (*body, error) {
	text := k.format.FormatType() == expfmt.TypeTextPlain
	var smp *stats.Sample
	var fams []*dto.MetricFamily
	var err error
	if text {
		// The sums, nine series a class, are written straight from the
		// reading; only the rest goes through the registry.
		s.m.a.mu.RLock()
		smp = s.m.a.sample
		s.m.a.mu.RUnlock()
		fams, err = s.m.extras.Gather()
	} else {
		smp, fams, err = s.m.classFamilies()
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if smp != s.of || s.bodies == nil {
		for kind, b := range s.bodies {
			if b.old = true; b.refs == 0 {
				s.keep(kind, b)
			}
		}
		s.of, s.bodies = smp, map[scrapeKey]*body{}
	}
	if b, ok := s.bodies[k]; ok {
		b.refs++
		return b, nil
	}
	buf := bytes.NewBuffer(s.spare[k])
	delete(s.spare, k)
	buf.Grow(s.sizes[k] + s.sizes[k]/8)
	var out io.Writer = buf
	var zw *gzip.Writer
	if k.gzip {
		zw = newGzip(buf)
		out = zw
	}
	// The hosts' round trips (eleven series a host, as many bytes as
	// the sums) are written, and compressed, on a second thread beside
	// the rest, and follow it (as their own gzip member): a 10,000-host
	// scrape took 68 ms in one stream, 40 in two.
	var hostPart chan []byte
	if text && smp != nil && s.m.a.cfg.HostMetrics {
		hostPart = make(chan []byte, 1)
		go func() { hostPart <- s.m.hostRTTText(smp, k.gzip) }()
	}
	if text && smp != nil {
		bw := bufio.NewWriterSize(out, 64<<10)
		s.m.writeSums(bw, smp)
		if err := bw.Flush(); err != nil {
			return nil, err
		}
	}
	enc := expfmt.NewEncoder(out, k.format)
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return nil, err
		}
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return nil, err
		}
	}
	if hostPart != nil {
		buf.Write(<-hostPart)
	}
	b := &body{b: buf.Bytes(), refs: 1}
	s.bodies[k] = b
	if s.sizes == nil {
		s.sizes = map[scrapeKey]int{}
	}
	s.sizes[k] = buf.Len()
	return b, nil
}

// gzipAccepted reports whether the request accepts gzip.
func gzipAccepted(h http.Header) bool {
	for _, v := range h.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			name, q, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(name), "gzip") && strings.ReplaceAll(strings.TrimSpace(q), " ", "") != "q=0" {
				return true
			}
		}
	}
	return false
}

// writeSums writes the per-class sums of reading smp in the text
// exposition format (version 0.0.4), as the registry and expfmt would
// (TestScrapeMatchesPromhttp holds them to it), at a tenth of the cost:
// no metric objects, no label pairs, no consistency checks.
func (m *metrics) writeSums(w *bufio.Writer, smp *stats.Sample) {
	order, sums := m.sums(smp)
	// A series' labels are the same in all nine families: built once,
	// in sorted label-name order (class, device, direction, host).
	names := []string{"device", "direction", "class", "host"}
	var labels []byte
	ends := make([]int, len(order))
	for i, key := range order {
		x := sums[key]
		labels = append(labels, '{')
		for j, li := range []int{2, 0, 1, 3} {
			if li >= len(x.lv) {
				break
			}
			if j > 0 {
				labels = append(labels, ',')
			}
			labels = append(labels, names[li]...)
			labels = append(labels, '=', '"')
			labels = appendLabelValue(labels, x.lv[li])
			labels = append(labels, '"')
		}
		labels = append(labels, '}', ' ')
		ends[i] = len(labels)
	}
	var line []byte
	for f, v := range m.sumValues(&classSum{}) {
		if len(order) == 0 {
			break
		}
		nh := m.named[v.d]
		typ := "gauge"
		if v.t == prometheus.CounterValue {
			typ = "counter"
		}
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", nh[0], escapeHelp(nh[1]), nh[0], typ)
		from := 0
		for i, key := range order {
			line = append(line[:0], nh[0]...)
			line = append(line, labels[from:ends[i]]...)
			line = strconv.AppendFloat(line, sums[key].value(f), 'g', -1, 64)
			line = append(line, '\n')
			w.Write(line)
			from = ends[i]
		}
	}
}

// hostRTTText is writeHostRTT's text on its own, compressed as a gzip
// member when zip is true.
func (m *metrics) hostRTTText(smp *stats.Sample, zip bool) []byte {
	var b bytes.Buffer
	var out io.Writer = &b
	var zw *gzip.Writer
	if zip {
		zw = newGzip(&b)
		out = zw
	}
	bw := bufio.NewWriterSize(out, 64<<10)
	m.writeHostRTT(bw, smp)
	bw.Flush() // into memory: no error
	if zw != nil {
		zw.Close()
	}
	if zip && b.Len() <= 20 { // nothing written: an empty member is still 20 bytes
		return nil
	}
	return b.Bytes()
}

// writeHostRTT writes sluice_host_rtt_seconds (with --host-metrics) in
// the text format, as writeSums writes the sums: eleven series for each
// host with samples, 110,000 lines at 10,000 hosts.
func (m *metrics) writeHostRTT(w *bufio.Writer, smp *stats.Sample) {
	hs := m.hostRTTs(smp)
	if len(hs) == 0 {
		return
	}
	nh := m.named[m.hostRTT]
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", nh[0], escapeHelp(nh[1]), nh[0])
	les := make([]string, len(hostRTTBounds))
	for i, le := range hostRTTBounds {
		les[i] = `,le="` + strconv.FormatFloat(le, 'g', -1, 64) + `"} `
	}
	var labels, line []byte
	for _, h := range hs {
		labels = labels[:0]
		for j, name := range []string{"class", "device", "direction", "host"} {
			if j > 0 {
				labels = append(labels, ',')
			}
			labels = append(labels, name...)
			labels = append(labels, '=', '"')
			labels = appendLabelValue(labels, h.lv[[]int{2, 0, 1, 3}[j]])
			labels = append(labels, '"')
		}
		for i, le := range les {
			line = append(append(append(line[:0], nh[0]...), "_bucket{"...), labels...)
			line = strconv.AppendUint(append(line, le...), h.below[i], 10)
			w.Write(append(line, '\n'))
		}
		line = append(append(append(line[:0], nh[0]...), "_bucket{"...), labels...)
		line = strconv.AppendUint(append(line, `,le="+Inf"} `...), h.count, 10)
		w.Write(append(line, '\n'))
		line = append(append(append(line[:0], nh[0]...), "_sum{"...), labels...)
		line = strconv.AppendFloat(append(line, '}', ' '), h.sum, 'g', -1, 64)
		w.Write(append(line, '\n'))
		line = append(append(append(line[:0], nh[0]...), "_count{"...), labels...)
		line = strconv.AppendUint(append(line, '}', ' '), h.count, 10)
		w.Write(append(line, '\n'))
	}
}

// newGzip compresses a scrape at gzip's best speed: a 10,000-host
// scrape with per-host series took 48 ms at the default level and 28 at
// best speed (go test -bench ScrapeNewReading/gzip), for a body 6%
// larger (352 KB for 332). A scraper pays per scrape in time, not in a
// few KB on its network.
func newGzip(w io.Writer) *gzip.Writer {
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	return zw
}

var helpEscaper = strings.NewReplacer("\\", `\\`, "\n", `\n`)

func escapeHelp(s string) string { return helpEscaper.Replace(s) }

// appendLabelValue appends v escaped as the text format wants: a
// backslash, a double quote and a newline.
func appendLabelValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b = append(b, '\\', '\\')
		case '"':
			b = append(b, '\\', '"')
		case '\n':
			b = append(b, '\\', 'n')
		default:
			b = append(b, c)
		}
	}
	return b
}
