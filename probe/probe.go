// Package probe measures the delay to reflectors with ICMP, for the
// rate controller of a variable link (package autorate): echo requests
// give the round trip, timestamp requests the delay each way (with the
// two clocks' offset in both, which a baseline takes out).
//
// One goroutine sends to the reflectors in turn and, once per send,
// reads the replies the kernel stamped on arrival, on one socket: a raw
// socket when the process may open one (root, or CAP_NET_RAW), else an
// unprivileged ping socket (echo only: the kernel lets such sockets send
// nothing else).
package probe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// native is the byte order of the kernel's control messages.
var native = binary.NativeEndian

// ICMP types of the timestamp exchange (RFC 792), which x/net names not.
const (
	typeTimestamp      = 13
	typeTimestampReply = 14
)

// Config is what to probe and how often.
type Config struct {
	// Reflectors are pinged in turn, one every Interval (20 Hz in all at
	// 50 ms, as cake-autorate does). IPv4 only for timestamps.
	Reflectors []netip.Addr
	Interval   time.Duration
	// Timestamp sends ICMP timestamp requests (the delay each way)
	// instead of echo requests (the round trip); it needs a raw socket.
	Timestamp bool
	// Timeout: a reply later than this is counted lost (late), and a
	// reply that comes after it is dropped. 1 s.
	Timeout time.Duration
}

// Reply is one answer.
type Reply struct {
	Reflector netip.Addr
	Sent, At  time.Time
	// RTT is the round trip; Up and Down, for a timestamp reply, the
	// delay each way as the two clocks read it (their offset added to
	// Up and taken from Down), to a millisecond.
	RTT       time.Duration
	Up, Down  time.Duration
	Timestamp bool
}

// Prober is an open socket and the requests in flight. Run it in one
// goroutine.
type Prober struct {
	cfg Config
	fd  int
	raw bool
	id  int
	seq int
	// mu guards reflectors and next (SetReflectors).
	mu         sync.Mutex
	reflectors []netip.Addr
	next       int // the reflector to ping next
	pending    map[int]pending
	buf        []byte
	oob        []byte
}

type pending struct {
	to   netip.Addr
	sent time.Time
}

// Open opens the socket: raw when allowed, else a ping socket (then
// only echo, and Timestamp is an error).
func Open(cfg Config) (*Prober, error) {
	if len(cfg.Reflectors) == 0 {
		return nil, errors.New("probe: no reflectors")
	}
	for _, r := range cfg.Reflectors {
		if !r.Is4() {
			return nil, fmt.Errorf("probe: reflector %s: IPv4 only", r)
		}
	}
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("probe: interval %v: want more than 0", cfg.Interval)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	p := &Prober{cfg: cfg, reflectors: slices.Clone(cfg.Reflectors), id: os.Getpid()&0x7fff ^ rand.IntN(0x7fff), pending: map[int]pending{},
		buf: make([]byte, 1500), oob: make([]byte, 128)}
	const flags = unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|flags, unix.IPPROTO_ICMP)
	if err == nil {
		p.fd, p.raw = fd, true
		// Only the two reply types reach the socket, not every ICMP
		// message of the host.
		mask := ^uint32(1<<ipv4.ICMPTypeEchoReply | 1<<typeTimestampReply)
		if err := unix.SetsockoptInt(fd, unix.SOL_RAW, unix.ICMP_FILTER, int(int32(mask))); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("probe: filter ICMP types: %w", err)
		}
	} else {
		if cfg.Timestamp {
			return nil, fmt.Errorf("probe: timestamps need a raw ICMP socket (root or CAP_NET_RAW): %w", err)
		}
		// A ping socket: the kernel sets the id to the socket's and checks
		// replies against it (net.ipv4.ping_group_range must allow us).
		ufd, uerr := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|flags, unix.IPPROTO_ICMP)
		if uerr != nil {
			return nil, fmt.Errorf("probe: no ICMP socket: raw: %v; ping socket: %w", err, uerr)
		}
		p.fd = ufd
	}
	// The kernel stamps each reply as it arrives: the prober need not
	// wake for each one, only to send (20 times a second, not 40).
	if err := unix.SetsockoptInt(p.fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		unix.Close(p.fd)
		return nil, fmt.Errorf("probe: receive timestamps: %w", err)
	}
	return p, nil
}

// Raw reports whether the socket is raw (else a ping socket).
func (p *Prober) Raw() bool { return p.raw }

// Close closes the socket.
func (p *Prober) Close() error { return unix.Close(p.fd) }

// Run pings until ctx ends, calling reply for each answer and lost for
// each request unanswered within Timeout, from this goroutine. It wakes
// once per Interval: it reads the replies queued (stamped by the kernel
// on arrival), counts what expired, and sends the next request. It
// returns nil when ctx ends, an error when the socket fails.
func (p *Prober) Run(ctx context.Context, reply func(Reply), lost func(to netip.Addr, sent time.Time)) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	next := time.Now()
	for {
		select {
		case <-ctx.Done():
			// What is still in flight is abandoned, not lost.
			return p.drain(reply)
		case <-timer.C:
		}
		if err := p.drain(reply); err != nil {
			return err
		}
		now := time.Now()
		p.expire(now, lost)
		p.send(now)
		next = next.Add(p.cfg.Interval)
		if !next.After(now) { // a stall (a suspended machine): no burst after it
			next = now.Add(p.cfg.Interval)
		}
		timer.Reset(next.Sub(now))
	}
}

// drain reads every reply queued.
func (p *Prober) drain(reply func(Reply)) error {
	for {
		n, oobn, _, from, err := unix.Recvmsg(p.fd, p.buf, p.oob, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EINTR {
			return nil
		}
		if err != nil {
			return fmt.Errorf("probe: read: %w", err)
		}
		at := time.Now()
		if cms, err := unix.ParseSocketControlMessage(p.oob[:oobn]); err == nil {
			for _, cm := range cms {
				if cm.Header.Level == unix.SOL_SOCKET && cm.Header.Type == unix.SCM_TIMESTAMPNS && len(cm.Data) >= 16 {
					at = time.Unix(int64(native.Uint64(cm.Data)), int64(native.Uint64(cm.Data[8:])))
				}
			}
		}
		b := p.buf[:n]
		if p.raw { // a raw socket's read starts with the IP header
			if len(b) < 20 || len(b) < int(b[0]&0x0f)*4 {
				continue
			}
			b = b[int(b[0]&0x0f)*4:]
		}
		sa, ok := from.(*unix.SockaddrInet4)
		if !ok {
			continue
		}
		if r, ok := p.parse(b, netip.AddrFrom4(sa.Addr), at); ok {
			reply(r)
		}
	}
}

// SetReflectors replaces the reflectors pinged (a reflector pool's
// replacement), from any goroutine; the next request goes to the first.
// Replies from the old ones still in flight are still reported.
func (p *Prober) SetReflectors(rs []netip.Addr) error {
	for _, r := range rs {
		if !r.Is4() {
			return fmt.Errorf("probe: reflector %s: IPv4 only", r)
		}
	}
	if len(rs) == 0 {
		return errors.New("probe: no reflectors")
	}
	p.mu.Lock()
	p.reflectors, p.next = slices.Clone(rs), 0
	p.mu.Unlock()
	return nil
}

func (p *Prober) send(now time.Time) {
	p.mu.Lock()
	p.next %= len(p.reflectors)
	to := p.reflectors[p.next]
	p.next++
	p.mu.Unlock()
	p.seq = (p.seq + 1) & 0xffff
	b := make([]byte, 20)
	b[0] = byte(ipv4.ICMPTypeEcho)
	binary.BigEndian.PutUint16(b[4:], uint16(p.id))
	binary.BigEndian.PutUint16(b[6:], uint16(p.seq))
	if p.cfg.Timestamp {
		b[0] = typeTimestamp
		binary.BigEndian.PutUint32(b[8:], msOfDay(now))
	}
	if p.raw { // a ping socket's checksum is the kernel's
		binary.BigEndian.PutUint16(b[2:], checksum(b))
	}
	p.pending[p.seq] = pending{to: to, sent: now}
	// A request that cannot leave (no route, a link down) is lost as one
	// unanswered is: the caller hears of it when it expires.
	unix.Sendto(p.fd, b, 0, &unix.SockaddrInet4{Addr: to.As4()})
}

// expire reports the requests older than Timeout as lost.
func (p *Prober) expire(now time.Time, lost func(netip.Addr, time.Time)) {
	for seq, q := range p.pending {
		if now.Sub(q.sent) >= p.cfg.Timeout {
			delete(p.pending, seq)
			lost(q.to, q.sent)
		}
	}
}

// parse matches a reply to its request.
func (p *Prober) parse(b []byte, from netip.Addr, at time.Time) (Reply, bool) {
	if len(b) < 8 {
		return Reply{}, false
	}
	id, seq := int(binary.BigEndian.Uint16(b[4:])), int(binary.BigEndian.Uint16(b[6:]))
	if p.raw && id != p.id { // a ping socket's id is the kernel's, and checked by it
		return Reply{}, false
	}
	q, ok := p.pending[seq]
	if !ok || from != q.to {
		return Reply{}, false
	}
	r := Reply{Reflector: q.to, Sent: q.sent, At: at, RTT: at.Sub(q.sent)}
	switch {
	case b[0] == byte(ipv4.ICMPTypeEchoReply) && !p.cfg.Timestamp:
	case b[0] == typeTimestampReply && p.cfg.Timestamp && len(b) >= 20:
		orig, recv, xmit := binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:]), binary.BigEndian.Uint32(b[16:])
		// The high bit marks a clock that is not milliseconds of the UTC
		// day (RFC 792): the round trip is all it gives.
		if recv&0x80000000 == 0 && xmit&0x80000000 == 0 {
			r.Timestamp = true
			r.Up = msDiff(recv, orig)
			r.Down = msDiff(msOfDay(at), xmit)
		}
	default:
		return Reply{}, false
	}
	delete(p.pending, seq)
	return r, true
}

const day = 24 * 60 * 60 * 1000

// msOfDay is t in milliseconds since midnight UTC, as ICMP timestamps
// are.
func msOfDay(t time.Time) uint32 {
	t = t.UTC()
	return uint32((t.Hour()*3600+t.Minute()*60+t.Second())*1000 + t.Nanosecond()/1e6)
}

// msDiff is b - a across midnight, as a duration (within half a day).
func msDiff(b, a uint32) time.Duration {
	d := (int64(b) - int64(a)) % day
	if d > day/2 {
		d -= day
	} else if d < -day/2 {
		d += day
	}
	return time.Duration(d) * time.Millisecond
}

// checksum is the Internet checksum of b (its checksum field zero).
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
