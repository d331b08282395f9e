package agent

import (
	"bytes"
	"cmp"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// The agent's HTTP server is bounded in every resource a client can
// make it hold, so that no client, hostile or careless, can take from
// the passes that keep the policy in force. Measured before these
// bounds: 20,000 idle keep-alive connections ran the agent out of file
// descriptors (its passes failed, drift went unrepaired), and 200
// clients that asked for the status at 10,000 hosts and never read
// took its memory from 82 MB to 1.7 GB.
const (
	// MaxConns is how many connections it holds at once. Each costs a
	// descriptor and a goroutine. At the limit, a new connection takes
	// the place of the one idle the longest (kept alive after a reply,
	// or connected and silent): clients that hold connections they do
	// not use cannot keep out those that ask. Only when every connection
	// is busy with a request is a new one closed at once.
	MaxConns = 256
	// A request must arrive whole within readTimeout (headers within
	// readHeaderTimeout), its reply be read within writeTimeout, and a
	// kept-alive connection is closed after idleTimeout.
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 10 * time.Second
	maxHeaderBytes    = 16 << 10
	// metricsInFlight bounds the /metrics scrapes gathered at once (each
	// walks every class).
	metricsInFlight = 2
)

// serve starts the HTTP server on ln with the bounds above.
func (a *Agent) serve(ln net.Listener) *http.Server {
	lim := &connLimiter{Listener: ln, max: MaxConns, conns: map[net.Conn]*connUse{}}
	srv := &http.Server{
		Handler:           a.Handler(),
		ConnState:         lim.state,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		// A client's misbehaviour is not the agent's to log.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go srv.Serve(lim)
	return srv
}

// connLimiter is the listener that holds the server to MaxConns
// connections, evicting the longest idle one to make room, or where
// none is idle the one busy the longest: clients that ask and never read
// would otherwise hold every connection (260 of them left /healthz, the
// readiness probe, unanswered). The replies are shared, so an evicted
// writer frees no work, only its socket.
type connLimiter struct {
	net.Listener
	max   int
	mu    sync.Mutex
	seq   uint64
	conns map[net.Conn]*connUse
}

type connUse struct {
	busy bool   // a request is being read or answered
	last uint64 // when it last became idle or busy (a sequence, not a clock)
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		if len(l.conns) >= l.max {
			var idle, busy net.Conn
			var idleAt, busyAt uint64
			for oc, u := range l.conns {
				switch {
				case !u.busy && (idle == nil || u.last < idleAt):
					idle, idleAt = oc, u.last
				case u.busy && (busy == nil || u.last < busyAt):
					busy, busyAt = oc, u.last
				}
			}
			oldest := cmp.Or(idle, busy)
			delete(l.conns, oldest)
			oldest.Close()
		}
		l.seq++
		l.conns[c] = &connUse{last: l.seq}
		l.mu.Unlock()
		return c, nil
	}
}

// state follows the server's view of each connection (http.Server's
// ConnState).
func (l *connLimiter) state(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u, ok := l.conns[c]
	switch {
	case s == http.StateClosed || s == http.StateHijacked:
		delete(l.conns, c)
	case !ok:
	case s == http.StateActive:
		l.seq++
		u.busy, u.last = true, l.seq
	default: // new, idle
		l.seq++
		u.busy, u.last = false, l.seq
	}
}

// held is how many connections the server holds now.
func (l *connLimiter) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// replies holds the JSON replies, encoded once per reading and shared
// by every request until the next: a slow reader holds a reference to
// one buffer, not a copy of its own, and a thousand requests cost one
// encoding.
type replies struct {
	mu   sync.Mutex
	gen  map[string]uint64
	body map[string][]byte
	// The /api/v1/hosts replies of reading hostGen, by query; work
	// lets one request at a time work one out.
	hostGen  uint64
	hostBody map[string][]byte
	work     sync.Mutex
}

// maxHostReplies bounds the /api/v1/hosts replies held for a reading
// (a search string makes any number of queries).
const maxHostReplies = 64

// hosts returns the /api/v1/hosts reply for query key at generation
// gen: held while the reading lasts (up to maxHostReplies of them),
// and encoded by one request at a time.
func (r *replies) hosts(key string, gen uint64, v func() any) []byte {
	r.mu.Lock()
	if r.hostGen != gen || r.hostBody == nil {
		r.hostGen, r.hostBody = gen, map[string][]byte{}
	}
	if b, ok := r.hostBody[key]; ok {
		r.mu.Unlock()
		return b
	}
	r.mu.Unlock()
	r.work.Lock()
	defer r.work.Unlock()
	r.mu.Lock()
	if b, ok := r.hostBody[key]; ok && r.hostGen == gen { // made while this one waited
		r.mu.Unlock()
		return b
	}
	r.mu.Unlock()
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(v())
	r.mu.Lock()
	if r.hostGen == gen && len(r.hostBody) < maxHostReplies {
		r.hostBody[key] = buf.Bytes()
	}
	r.mu.Unlock()
	return buf.Bytes()
}

// get returns the reply named key for generation gen, encoding v() when
// the one held is older.
func (r *replies) get(key string, gen uint64, v func() any) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.body == nil {
		r.gen, r.body = map[string]uint64{}, map[string][]byte{}
	}
	if b, ok := r.body[key]; ok && r.gen[key] == gen {
		return b
	}
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(v())
	r.body[key], r.gen[key] = buf.Bytes(), gen
	return buf.Bytes()
}

// generation is the agent's reading's: it moves whenever the status or
// the history may have changed.
func (a *Agent) generation() uint64 {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.gen
}

// allowedHost reports whether a request's Host header names this agent:
// an IP address, localhost, this machine's name, or one given with
// --allow-host. Anything else is a name a browser was sent to by a
// DNS record pointing at the agent (DNS rebinding), whose page must not
// read the subscribers' names and addresses.
func (a *Agent) allowedHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if host == "" || net.ParseIP(host) != nil || strings.EqualFold(host, "localhost") {
		return true
	}
	for _, h := range a.hostNames {
		if strings.EqualFold(host, h) {
			return true
		}
	}
	return false
}

// hostNames is this machine's name (and its first label) and the names
// given with --allow-host.
func hostNames(extra []string) []string {
	out := append([]string(nil), extra...)
	if h, err := os.Hostname(); err == nil && h != "" {
		out = append(out, h)
		if short, _, ok := strings.Cut(h, "."); ok {
			out = append(out, short)
		}
	}
	return out
}
