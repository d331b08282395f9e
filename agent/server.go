package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sluice/nsrun"
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
	// the place of one held the longest for nothing (kept alive after a
	// reply, connected and silent, or not reading its reply), or is
	// closed at once if it is silent itself: clients that hold
	// connections they do not use cannot keep out those that ask
	// (connLimiter.victim).
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

// listenHTTP listens on addr with TCP_DEFER_ACCEPT: the kernel hands a
// connection over only once its first bytes arrive (HTTP's client
// speaks first), so clients that connect and stay silent wait in the
// kernel's queue, costing the agent no descriptor, and are not closed
// to come straight back. Measured with 2,000 such clients reconnecting
// as fast as they were closed: the server accepted and closed 10,000
// connections a second without it.
//
// The socket is made in the namespace the process started in (startNS),
// on a thread known to be there: --netns moves threads into the shaped
// namespace, and a listener made on one left there under load was bound
// inside it, beside a process that held the address outside.
func listenHTTP(addr string) (ln net.Listener, err error) {
	if !startNS.IsOpen() {
		return listenHere(addr)
	}
	err = nsrun.OnThread(func() error {
		if err := netns.Set(startNS); err != nil {
			return err
		}
		ln, err = listenHere(addr)
		return err
	})
	return ln, err
}

// startNS is the network namespace the process started in, taken before
// any thread moved.
var startNS, _ = netns.Get()

func listenHere(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, int(readHeaderTimeout/time.Second))
		})
		return cmp.Or(err, serr)
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

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
// connections. At the limit a new connection takes the place of one
// chosen by victim: silent and idle ones go first, then busy writers
// (clients that ask and never read would otherwise hold every
// connection: 260 of them left /healthz, the readiness probe,
// unanswered). The replies are shared, so an evicted writer frees no
// work, only its socket.
type connLimiter struct {
	net.Listener
	max   int
	mu    sync.Mutex
	conns map[net.Conn]*connUse
	now   func() time.Time // time.Now; tests move it
}

type connUse struct {
	busy  bool      // a request is being read or answered
	since time.Time // when it last became idle or busy
	seen  bool      // victim's mark: looked at, a request waiting
}

// connGrace is how long a new or idle connection is let be before it
// is closed ahead of a busy one: a client sends its request within
// milliseconds of connecting, but on a loaded machine the server may
// read it later.
const connGrace = 100 * time.Millisecond

// maxLooks bounds the idle connections victim looks into per accept.
const maxLooks = 16

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		if len(l.conns) >= l.max {
			v := l.victim(c)
			if v == c {
				l.mu.Unlock()
				c.Close()
				continue
			}
			delete(l.conns, v)
			v.Close()
		}
		l.conns[c] = &connUse{since: l.clock()}
		l.mu.Unlock()
		return c, nil
	}
}

func (l *connLimiter) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// victim is the connection to close to make room for c, just accepted:
// the first of
//  1. the one idle the longest, at least connGrace, with nothing to read;
//  2. the one busy the longest, at least connGrace;
//  3. c itself, if it has sent nothing yet;
//  4. the one idle the longest with nothing to read, however briefly;
//  5. the one busy the longest, however briefly;
//  6. the one idle the longest (each holds a request not read yet).
//
// An idle connection with bytes waiting holds a request the server has
// not got to: a client that asked, not one that holds a socket; and a
// client that asks has usually sent its request by the time the server
// accepts. Without this look and the grace, clients that reconnect as
// fast as they are closed (10,000 a second on two cores) made each new
// connection the oldest idle one within milliseconds, and a loaded
// machine closed half the /healthz requests unread. Now a silent
// connection lasts connGrace at least, and one that asked outlasts
// every silent one.
func (l *connLimiter) victim(c net.Conn) net.Conn {
	var busy, silent, asked net.Conn
	var busyAt time.Time
	now := l.clock()
	for _, u := range l.conns {
		u.seen = false
	}
	for looks := 0; looks < maxLooks; looks++ {
		var idle net.Conn
		var idleAt time.Time
		for oc, u := range l.conns {
			switch {
			case u.busy && looks == 0 && (busy == nil || u.since.Before(busyAt)):
				busy, busyAt = oc, u.since
			case !u.busy && !u.seen && (idle == nil || u.since.Before(idleAt)):
				idle, idleAt = oc, u.since
			}
		}
		if idle == nil {
			break
		}
		if !waiting(idle) {
			if now.Sub(idleAt) >= connGrace {
				return idle
			}
			silent = idle
			break
		}
		l.conns[idle].seen = true
		asked = cmp.Or(asked, idle)
	}
	switch {
	case busy != nil && now.Sub(busyAt) >= connGrace:
		return busy
	case !waiting(c):
		return c
	}
	return cmp.Or(silent, busy, asked, c)
}

// waiting reports whether c has received bytes not yet read.
func waiting(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n > 0
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
	default: // active: busy; new or idle: not
		u.busy, u.since = s == http.StateActive, l.clock()
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
