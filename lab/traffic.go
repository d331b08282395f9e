package lab

import (
	"sluice/units"

	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// FlowCounter is a flow's counters: what its receiver got and its
// sender wrote, and its sockets (for TCP_INFO). The lab's sampler reads
// them every bucket.
type FlowCounter struct {
	rx, tx atomic.Uint64                // rx: UDP's reads, and ended TCP sinks' bytes
	mu     sync.Mutex                   // guards conns and sinks, and rx's move from a sink
	conns  []syscall.RawConn            // sender sockets, for TCP_INFO
	sinks  map[syscall.RawConn]struct{} // open receiver sockets
}

// Received is the bytes the flow's receiver got: for TCP what its
// sockets received in order (tcpi_bytes_received), read or not, for UDP
// what it read. A TCP reader that lags (a busy CPU, a goroutine
// scheduled late) no longer moves a second's bytes into the next: after
// a phase's first second, which the statistics skip, its catch-up read
// 92 Mbit/s through an 85mbit class.
func (f *FlowCounter) Received() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.rx.Load()
	for c := range f.sinks {
		n += sinkBytes(c)
	}
	return n
}

// sinkBytes is what a TCP sink's socket has received in order, less the
// flow's 4-byte index and the sender's FIN, which takes a sequence
// number and so a byte of the count.
func sinkBytes(c syscall.RawConn) uint64 {
	var n uint64
	c.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return
		}
		head := uint64(4)
		switch info.State { // the kernel's TCP states, which BPF's names mirror
		case unix.BPF_TCP_CLOSE_WAIT, unix.BPF_TCP_LAST_ACK, unix.BPF_TCP_CLOSING, unix.BPF_TCP_TIME_WAIT:
			head++
		}
		if info.Bytes_received > head {
			n = info.Bytes_received - head
		}
	})
	return n
}

// addSink counts an open TCP sink's socket until endSink.
func (f *FlowCounter) addSink(c syscall.RawConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sinks == nil {
		f.sinks = map[syscall.RawConn]struct{}{}
	}
	f.sinks[c] = struct{}{}
}

// endSink moves a sink's bytes into rx before its socket closes.
func (f *FlowCounter) endSink(c syscall.RawConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rx.Add(sinkBytes(c))
	delete(f.sinks, c)
}

// Sent is the bytes the flow's sender has written.
func (f *FlowCounter) Sent() uint64 { return f.tx.Load() }

func (f *FlowCounter) addConn(c syscall.RawConn) {
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
}

// tcpInfo sums retransmits and segments and averages the smoothed RTT of
// the flow's open sender sockets.
func (f *FlowCounter) tcpInfo() (retrans, segs uint64, rtt time.Duration, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var rttSum time.Duration
	n := 0
	for _, c := range f.conns {
		c.Control(func(fd uintptr) {
			info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				return
			}
			retrans += uint64(info.Total_retrans)
			segs += uint64(info.Segs_out)
			rttSum += time.Duration(info.Rtt) * time.Microsecond
			n++
		})
	}
	if n == 0 {
		return 0, 0, 0, false
	}
	return retrans, segs, rttSum / time.Duration(n), true
}

// setTOS marks a socket's packets with DSCP dscp (both families).
func setTOS(fd uintptr, v6 bool, dscp int) error {
	if dscp <= 0 {
		return nil
	}
	if v6 {
		return unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_TCLASS, dscp<<2)
	}
	return unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS, dscp<<2)
}

// listen opens a listening TCP socket or a UDP socket at addr:port in ns.
func listen(ns, network string, at netip.AddrPort) (io.Closer, net.Listener, net.PacketConn, error) {
	var l net.Listener
	var pc net.PacketConn
	err := InNetns(ns, func() (err error) {
		if network == "tcp" {
			l, err = net.Listen("tcp", at.String())
		} else {
			pc, err = net.ListenPacket("udp", at.String())
		}
		return err
	})
	if err != nil {
		return nil, nil, nil, err
	}
	if l != nil {
		return l, l, nil, nil
	}
	return pc, nil, pc, nil
}

// dial connects from ns (from the local address from, if valid) to dst
// with DSCP dscp and, for TCP, congestion control cc set before the
// first packet leaves. It waits 15 s: a SYN may meet a full queue on a
// slow link (a 70 KB FIFO is 2.5 s at 220 kbit/s) and be dropped there,
// and TCP sends its third try 3 s after the first, its fourth 7 s after
// (examples/wondershaper.yaml's conformance timed out at 5 s).
func dial(ctx context.Context, ns, network string, from, dst netip.AddrPort, cc string, dscp int) (net.Conn, error) {
	d := net.Dialer{Timeout: 15 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if cc != "" {
				if serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc); serr != nil {
					serr = fmt.Errorf("congestion control %q: %w", cc, serr)
					return
				}
			}
			if serr = setTOS(fd, dst.Addr().Is6(), dscp); serr != nil {
				return
			}
			// Several flows from one fixed port (a subject matched by a
			// sport rule, to different ports of the sink) each bind it:
			// their 4-tuples differ, but without SO_REUSEADDR the
			// second bind fails ("address already in use").
			if network == "tcp" && from.Port() != 0 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	if from.Addr().IsValid() {
		if network == "tcp" {
			d.LocalAddr = net.TCPAddrFromAddrPort(from)
		} else {
			d.LocalAddr = net.UDPAddrFromAddrPort(from)
		}
	}
	var conn net.Conn
	err := InNetns(ns, func() (err error) {
		conn, err = d.DialContext(ctx, network, dst.String())
		return err
	})
	return conn, err
}

// serveTCP accepts connections and hands each to handle.
func serveTCP(l net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

// TCPSink accepts connections on addr:port in ns; each starts with the
// 4-byte index of its flow, then carries data counted as received.
func TCPSink(ns string, at netip.AddrPort, flows []*FlowCounter) (io.Closer, error) {
	c, l, _, err := listen(ns, "tcp", at)
	if err != nil {
		return nil, err
	}
	serveTCP(l, func(c net.Conn) {
		defer c.Close()
		var idx [4]byte
		if _, err := io.ReadFull(c, idx[:]); err != nil {
			return
		}
		i := int(binary.BigEndian.Uint32(idx[:]))
		if i >= len(flows) {
			return
		}
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			return
		}
		f := flows[i]
		f.addSink(rc)
		defer f.endSink(rc) // before the deferred close
		buf := make([]byte, 256<<10)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
	return c, nil
}

// TCPSend connects from ns (from the local address from, if valid) to
// dst as flow idx of its sink and sends as fast as TCP allows until ctx
// ends, with congestion control cc and DSCP dscp.
func TCPSend(ctx context.Context, ns string, from, dst netip.AddrPort, idx int, cc string, dscp int, f *FlowCounter) error {
	conn, err := dial(ctx, ns, "tcp", from, dst, cc, dscp)
	if err != nil {
		return err
	}
	defer conn.Close()
	rc, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(idx))
	if _, err := conn.Write(hdr[:]); err != nil {
		return err
	}
	f.addConn(rc)
	// When the window ends the flow stops at once, as a killed transfer
	// does: linger 0 resets the connection and discards what is still in
	// the send buffer (megabytes with autotuning), which would otherwise
	// drain into the next phase. Set before any close, so that no close
	// leaves the source port in TIME_WAIT for the next flow bound to it.
	tcp := conn.(*net.TCPConn)
	if err := tcp.SetLinger(0); err != nil {
		return err
	}
	go func() { <-ctx.Done(); conn.SetWriteDeadline(time.Now()) }()
	buf := make([]byte, 128<<10)
	for ctx.Err() == nil {
		n, err := conn.Write(buf)
		f.tx.Add(uint64(n))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	return nil
}

// UDPSink counts datagrams arriving on addr:port in ns.
func UDPSink(ns string, at netip.AddrPort, f *FlowCounter) (io.Closer, error) {
	c, _, pc, err := listen(ns, "udp", at)
	if err != nil {
		return nil, err
	}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			f.rx.Add(uint64(n))
		}
	}()
	return c, nil
}

// UDPSend sends size-byte datagrams at rate bytes/s from ns (from the
// local address from, if valid) to dst until ctx ends.
func UDPSend(ctx context.Context, ns string, from, dst netip.AddrPort, rate units.Rate, size, dscp int, f *FlowCounter) error {
	conn, err := dial(ctx, ns, "udp", from, dst, "", dscp)
	if err != nil {
		return err
	}
	defer conn.Close()
	buf := make([]byte, size)
	start := time.Now()
	var sent uint64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			due := uint64(now.Sub(start).Seconds() * float64(rate))
			for sent+uint64(size) <= due {
				if _, err := conn.Write(buf); err != nil && !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOBUFS) {
					return err
				}
				sent += uint64(size)
				f.tx.Add(uint64(size))
			}
		}
	}
}

// Sample is one probe: when it was sent (seconds since the run began)
// and its round trip, or Lost.
type Sample struct {
	T    float64 `json:"t"`
	RTT  float64 `json:"rtt_ms"`
	Lost bool    `json:"lost,omitempty"`
}

// probeLog collects a probe's samples.
type probeLog struct {
	mu      sync.Mutex
	samples []Sample
}

func (p *probeLog) add(s Sample) {
	p.mu.Lock()
	p.samples = append(p.samples, s)
	p.mu.Unlock()
}

func (p *probeLog) all() []Sample {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Sample(nil), p.samples...)
}

// tcpEchoServer echoes every byte on addr:port in ns.
func tcpEchoServer(ns string, at netip.AddrPort) (io.Closer, error) {
	c, l, _, err := listen(ns, "tcp", at)
	if err != nil {
		return nil, err
	}
	serveTCP(l, func(c net.Conn) {
		c.(*net.TCPConn).SetNoDelay(true)
		io.Copy(c, c)
		c.Close()
	})
	return c, nil
}

// rrProbe measures request/response round trips over one TCP connection,
// a request every interval (or as soon as the previous answer arrives).
func rrProbe(ctx context.Context, ns string, dst netip.AddrPort, size int, interval time.Duration, dscp int, t0 time.Time, log *probeLog) error {
	conn, err := dial(ctx, ns, "tcp", netip.AddrPort{}, dst, "", dscp)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetNoDelay(true)
	go func() { <-ctx.Done(); conn.SetDeadline(time.Now()) }()
	buf := make([]byte, max(size, 8))
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		sent := time.Now()
		if _, err := conn.Write(buf); err != nil {
			return nil
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			if ctx.Err() == nil {
				log.add(Sample{T: sent.Sub(t0).Seconds(), Lost: true})
			}
			return nil
		}
		log.add(Sample{T: sent.Sub(t0).Seconds(), RTT: float64(time.Since(sent)) / 1e6})
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	return nil
}

// udpEchoServer echoes datagrams on addr:port in ns.
func udpEchoServer(ns string, at netip.AddrPort) (io.Closer, error) {
	c, _, pc, err := listen(ns, "udp", at)
	if err != nil {
		return nil, err
	}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return c, nil
}

// pinger sends timestamped echo requests (UDP to an echo server, or
// ICMP) every interval and matches the replies by sequence number.
type pinger struct {
	conn  net.PacketConn
	dst   net.Addr
	icmp  bool
	v6    bool
	id    int
	mu    sync.Mutex
	sent  map[int]time.Time
	t0    time.Time
	log   *probeLog
	size  int
	timer time.Duration
}

func udpProbe(ctx context.Context, ns string, dst netip.AddrPort, size int, interval time.Duration, dscp int, t0 time.Time, log *probeLog) error {
	var c net.PacketConn
	if err := InNetns(ns, func() (err error) {
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			rc.Control(func(fd uintptr) { serr = setTOS(fd, dst.Addr().Is6(), dscp) })
			return serr
		}}
		network := "udp4"
		if dst.Addr().Is6() {
			network = "udp6"
		}
		c, err = lc.ListenPacket(ctx, network, ":0")
		return err
	}); err != nil {
		return err
	}
	p := &pinger{conn: c, dst: net.UDPAddrFromAddrPort(dst), t0: t0, log: log, size: max(size, 16), sent: map[int]time.Time{}}
	return p.run(ctx, interval)
}

func icmpProbe(ctx context.Context, ns string, dst netip.Addr, size int, interval time.Duration, t0 time.Time, log *probeLog) error {
	var c *icmp.PacketConn
	if err := InNetns(ns, func() (err error) {
		if dst.Is6() {
			c, err = icmp.ListenPacket("ip6:ipv6-icmp", "::")
		} else {
			c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		}
		return err
	}); err != nil {
		return fmt.Errorf("icmp socket (needs root): %w", err)
	}
	p := &pinger{conn: c, dst: &net.IPAddr{IP: dst.AsSlice()}, icmp: true, v6: dst.Is6(), id: os.Getpid()&0x7fff ^ rand.Intn(0x7fff),
		t0: t0, log: log, size: max(size, 16), sent: map[int]time.Time{}}
	return p.run(ctx, interval)
}

func (p *pinger) run(ctx context.Context, interval time.Duration) error {
	defer p.conn.Close()
	done := make(chan struct{})
	go p.receive(done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for seq := 0; ; seq++ {
		p.mu.Lock()
		p.sent[seq&0xffff] = time.Now()
		p.mu.Unlock()
		if err := p.send(seq); err != nil && ctx.Err() == nil {
			p.log.add(Sample{T: time.Since(p.t0).Seconds(), Lost: true})
		}
		select {
		case <-ctx.Done():
			// Replies still on their way count; then the rest are lost.
			time.Sleep(min(2*time.Second, 20*interval))
			p.conn.Close()
			<-done
			p.mu.Lock()
			for _, t := range p.sent {
				p.log.add(Sample{T: t.Sub(p.t0).Seconds(), Lost: true})
			}
			p.mu.Unlock()
			return nil
		case <-tick.C:
		}
	}
}

func (p *pinger) send(seq int) error {
	payload := make([]byte, p.size)
	binary.BigEndian.PutUint32(payload, uint32(seq))
	if !p.icmp {
		_, err := p.conn.WriteTo(payload, p.dst)
		return err
	}
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if p.v6 {
		typ = ipv6.ICMPTypeEchoRequest
	}
	m := icmp.Message{Type: typ, Body: &icmp.Echo{ID: p.id, Seq: seq & 0xffff, Data: payload}}
	b, err := m.Marshal(nil)
	if err != nil {
		return err
	}
	_, err = p.conn.WriteTo(b, p.dst)
	return err
}

func (p *pinger) receive(done chan struct{}) {
	defer close(done)
	buf := make([]byte, 65536)
	for {
		n, _, err := p.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		now := time.Now()
		seq := -1
		if p.icmp {
			proto := 1
			if p.v6 {
				proto = 58
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil {
				continue
			}
			e, ok := m.Body.(*icmp.Echo)
			if !ok || e.ID != p.id || (m.Type != ipv4.ICMPTypeEchoReply && m.Type != ipv6.ICMPTypeEchoReply) {
				continue
			}
			seq = e.Seq
		} else if n >= 4 {
			seq = int(binary.BigEndian.Uint32(buf) & 0xffff)
		}
		p.mu.Lock()
		sent, ok := p.sent[seq]
		delete(p.sent, seq)
		p.mu.Unlock()
		if ok {
			p.log.add(Sample{T: sent.Sub(p.t0).Seconds(), RTT: float64(now.Sub(sent)) / 1e6})
		}
	}
}
