package agent

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
)

// web holds the dashboard: one page, its script, and dygraphs 2.2.1
// (MIT, vendored from Debian's libjs-dygraphs; see docs/agent.md for why
// that library). Nothing is fetched from outside the agent.
//
//go:embed web
var web embed.FS

// Handler serves the dashboard (/), its files (/static/), metrics
// (/metrics), the JSON API (/api/v1/status, /api/v1/hosts,
// /api/v1/history) and
// /healthz.
func (a *Agent) Handler() http.Handler {
	static, _ := fs.Sub(web, "web")
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServer(http.FS(static))))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		b, _ := fs.ReadFile(static, "index.html")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(b)
	})
	mux.Handle("GET /metrics", newScrapes(a.metrics, metricsInFlight))
	mux.HandleFunc("GET /api/v1/status", func(w http.ResponseWriter, r *http.Request) {
		hosts := true
		if v := r.URL.Query().Get("hosts"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				apiError(w, http.StatusBadRequest, fmt.Sprintf("hosts=%q: want true or false (1 or 0)", v))
				return
			}
			hosts = b
		}
		for k := range r.URL.Query() {
			if k != "hosts" {
				apiError(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q (known: hosts)", k))
				return
			}
		}
		key := "status?hosts=" + strconv.FormatBool(hosts)
		writeShared(w, a.replies.get(key, a.generation(), func() any { return a.Status(hosts) }))
	})
	mux.HandleFunc("GET /api/v1/history", func(w http.ResponseWriter, r *http.Request) {
		if len(r.URL.Query()) > 0 {
			apiError(w, http.StatusBadRequest, "history takes no parameters")
			return
		}
		writeShared(w, a.replies.get("history", a.generation(), func() any { return a.hist.snapshot() }))
	})
	mux.HandleFunc("GET /api/v1/hosts", func(w http.ResponseWriter, r *http.Request) {
		q, err := parseHostQuery(r.URL.Query())
		if err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return
		}
		// One reply per query and reading, shared; the queries of a
		// reading beyond the cache's bound are worked out one at a time,
		// so that a flood of them takes one CPU at most, never the
		// passes' (eight flooding clients took a pass from 37 to 134 ms).
		writeShared(w, a.replies.hosts(q.key(), a.generation(), func() any { return a.Hosts(q) }))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := a.Healthy()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		fmt.Fprintln(w, why)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if endpoint(r.URL.Path) {
			w.Header().Set("Allow", "GET, HEAD")
			apiError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: the agent's HTTP server only answers GET (and HEAD)", r.Method, r.URL.Path))
			return
		}
		apiError(w, http.StatusNotFound, fmt.Sprintf("%s %s: no such endpoint (see /api/v1/status, /api/v1/hosts, /api/v1/history, /metrics, /healthz)", r.Method, r.URL.Path))
	})
	return a.headers(mux)
}

// endpoint reports whether path is one the server answers (for 405
// rather than 404 to another method).
func endpoint(path string) bool {
	switch path {
	case "/", "/metrics", "/api/v1/status", "/api/v1/history", "/api/v1/hosts", "/healthz":
		return true
	}
	return strings.HasPrefix(path, "/static/")
}

// headers forbids the page anything from elsewhere: the dashboard works
// offline, cannot be made to load a foreign script, and no other site
// may frame it or, by a DNS name it points at the agent, read it.
func (a *Agent) headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		if !a.allowedHost(r.Host) {
			apiError(w, http.StatusMisdirectedRequest, fmt.Sprintf("Host %q: not a name of this agent (it answers to IP addresses, localhost and this machine's name; add others with --allow-host)", r.Host))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// writeShared writes a JSON reply encoded once and shared (replies).
func writeShared(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.Encode(v)
}

func apiError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
