// Package probe measures the delay to reflectors with ICMP, for the
// rate controller of a variable link (package autorate): echo requests
// give the round trip, timestamp requests the delay each way (with the
// two clocks' offset in both, which a baseline takes out).
//
// One goroutine sends to the reflectors in turn and reads the replies
// between sends, on one socket: a raw socket when the process may open
// one (root, or CAP_NET_RAW), else an unprivileged ping socket (echo
// only: the kernel lets such sockets send nothing else).
package probe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

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
	cfg     Config
	conn    *icmp.PacketConn
	raw     bool
	id      int
	seq     int
	next    int // the reflector to ping next
	pending map[int]pending
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
	p := &Prober{cfg: cfg, id: os.Getpid()&0x7fff ^ rand.IntN(0x7fff), pending: map[int]pending{}}
	c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
	if err == nil {
		p.conn, p.raw = c, true
		return p, nil
	}
	if cfg.Timestamp {
		return nil, fmt.Errorf("probe: timestamps need a raw ICMP socket (root or CAP_NET_RAW): %w", err)
	}
	// A ping socket: the kernel sets the id to the socket's and checks
	// replies against it (net.ipv4.ping_group_range must allow us).
	c, uerr := icmp.ListenPacket("udp4", "0.0.0.0")
	if uerr != nil {
		return nil, fmt.Errorf("probe: no ICMP socket: raw: %v; ping socket: %w", err, uerr)
	}
	p.conn = c
	return p, nil
}

// Raw reports whether the socket is raw (else a ping socket).
func (p *Prober) Raw() bool { return p.raw }

// Close closes the socket.
func (p *Prober) Close() error { return p.conn.Close() }

// Run pings until ctx ends, calling reply for each answer and lost for
// each request unanswered within Timeout, from this goroutine. It
// returns nil when ctx ends, an error when the socket fails.
func (p *Prober) Run(ctx context.Context, reply func(Reply), lost func(to netip.Addr, sent time.Time)) error {
	buf := make([]byte, 1500)
	next := time.Now()
	for ctx.Err() == nil {
		now := time.Now()
		if !now.Before(next) {
			if err := p.send(now); err != nil {
				return err
			}
			next = next.Add(p.cfg.Interval)
			if next.Before(now) { // a stall (a suspended machine): no burst after it
				next = now.Add(p.cfg.Interval)
			}
			p.expire(now, lost)
		}
		// Until the next send, or sooner when ctx ends: read.
		wake := next
		if d, ok := ctx.Deadline(); ok && d.Before(wake) {
			wake = d
		}
		p.conn.SetReadDeadline(wake)
		n, from, err := p.conn.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("probe: read: %w", err)
		}
		if r, ok := p.parse(buf[:n], from, time.Now()); ok {
			reply(r)
		}
	}
	// What is still in flight is abandoned, not lost.
	return nil
}

func (p *Prober) send(now time.Time) error {
	to := p.cfg.Reflectors[p.next]
	p.next = (p.next + 1) % len(p.cfg.Reflectors)
	p.seq = (p.seq + 1) & 0xffff
	var b []byte
	if p.cfg.Timestamp {
		b = make([]byte, 20)
		b[0] = typeTimestamp
		binary.BigEndian.PutUint16(b[4:], uint16(p.id))
		binary.BigEndian.PutUint16(b[6:], uint16(p.seq))
		binary.BigEndian.PutUint32(b[8:], msOfDay(now))
		binary.BigEndian.PutUint16(b[2:], checksum(b))
	} else {
		var err error
		m := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: p.id, Seq: p.seq, Data: make([]byte, 8)}}
		if b, err = m.Marshal(nil); err != nil {
			return err
		}
	}
	var dst net.Addr = &net.IPAddr{IP: to.AsSlice()}
	if !p.raw {
		dst = &net.UDPAddr{IP: to.AsSlice()}
	}
	p.pending[p.seq] = pending{to: to, sent: now}
	// A request that cannot leave (no route, a link down) is lost as one
	// unanswered is: the caller hears of it when it expires.
	p.conn.WriteTo(b, dst)
	return nil
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
func (p *Prober) parse(b []byte, from net.Addr, at time.Time) (Reply, bool) {
	if len(b) < 8 {
		return Reply{}, false
	}
	id, seq := int(binary.BigEndian.Uint16(b[4:])), int(binary.BigEndian.Uint16(b[6:]))
	if p.raw && id != p.id { // a ping socket's id is the kernel's, and checked by it
		return Reply{}, false
	}
	q, ok := p.pending[seq]
	if !ok || !sameAddr(from, q.to) {
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

func sameAddr(a net.Addr, want netip.Addr) bool {
	var ip net.IP
	switch a := a.(type) {
	case *net.IPAddr:
		ip = a.IP
	case *net.UDPAddr:
		ip = a.IP
	}
	got, ok := netip.AddrFromSlice(ip)
	return ok && got.Unmap() == want
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
