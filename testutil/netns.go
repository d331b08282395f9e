package testutil

import (
	"fmt"
	"io"
	"net"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"sluice/nsrun"
)

// InNetns runs f on a thread inside network namespace ns (nsrun.In).
// testutil reaches no further up than nsrun: the tc and bpf packages'
// tests would otherwise compile the whole stack.
func InNetns(ns string, f func() error) error {
	if ns == "" {
		return fmt.Errorf("network namespace: no name")
	}
	return nsrun.In(ns, f)
}

// TCPEchoServer listens on addr:port in ns and echoes whatever it reads.
func TCPEchoServer(ns, addr string, port int) (io.Closer, error) {
	return tcpServer(ns, addr, port, func(c net.Conn) { io.Copy(c, c) })
}

// tcpServer listens on addr:port in ns and hands each connection to
// serve, closing it after.
func tcpServer(ns, addr string, port int, serve func(net.Conn)) (io.Closer, error) {
	var l net.Listener
	err := InNetns(ns, func() (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort(addr, fmt.Sprint(port)))
		return err
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { serve(c); c.Close() }()
		}
	}()
	return l, nil
}

// TCPEchoRTTs connects from ns to addr:port and measures count
// request/response round trips of 64 bytes, interval apart.
func TCPEchoRTTs(ns, addr string, port, count int, interval time.Duration) ([]time.Duration, error) {
	var c net.Conn
	if err := InNetns(ns, func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(addr, fmt.Sprint(port)), 5*time.Second)
		return err
	}); err != nil {
		return nil, err
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	buf := make([]byte, 64)
	var rtts []time.Duration
	for i := 0; i < count; i++ {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
		rtts = append(rtts, time.Since(t0))
		time.Sleep(interval)
	}
	return rtts, nil
}

// MeanDuration and percentile helpers.
func MeanDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s / time.Duration(len(ds))
}

// Percentile returns the p-th percentile (0..100) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// UDPEchoServer listens on addr:port (UDP) in ns and sends every
// datagram back to its sender.
func UDPEchoServer(ns, addr string, port int) (io.Closer, error) {
	var c net.PacketConn
	if err := InNetns(ns, func() (err error) {
		c, err = net.ListenPacket("udp", net.JoinHostPort(addr, fmt.Sprint(port)))
		return err
	}); err != nil {
		return nil, err
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			c.WriteTo(buf[:n], from)
		}
	}()
	return c, nil
}

// UDPEchoRTTs sends count datagrams of 64 bytes from ns to addr:port,
// interval apart, and returns the round trips of those that came back
// within half a second (and how many did not).
func UDPEchoRTTs(ns, addr string, port, count int, interval time.Duration) (rtts []time.Duration, lost int, err error) {
	var c net.Conn
	if err := InNetns(ns, func() (err error) {
		c, err = net.Dial("udp", net.JoinHostPort(addr, fmt.Sprint(port)))
		return err
	}); err != nil {
		return nil, 0, err
	}
	defer c.Close()
	buf := make([]byte, 64)
	for i := 0; i < count; i++ {
		buf[0] = byte(i)
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			return nil, 0, err
		}
		c.SetReadDeadline(t0.Add(500 * time.Millisecond))
		for {
			n, err := c.Read(buf)
			if err != nil {
				lost++
				break
			}
			if n > 0 && buf[0] == byte(i) {
				rtts = append(rtts, time.Since(t0))
				break
			}
		}
		time.Sleep(interval)
	}
	return rtts, lost, nil
}

// TCPSink accepts connections on addr:port in ns and discards what it
// reads.
func TCPSink(ns, addr string, port int) (io.Closer, error) {
	return tcpServer(ns, addr, port, func(c net.Conn) { io.Copy(io.Discard, c) })
}

// TCPFlowInfo is what the kernel's TCP_INFO says about one sender.
type TCPFlowInfo struct {
	BytesAcked   uint64
	TotalRetrans uint32 // segments retransmitted
	ReordSeen    uint32 // reordering events seen
	Reordering   uint32 // the reordering degree TCP assumes (3 by default)
}

// TCPSend opens flows connections from ns to addr:port, writes as fast
// as they take for d, and returns each sender's TCP_INFO at the end.
func TCPSend(ns, addr string, port, flows int, d time.Duration) ([]TCPFlowInfo, error) {
	return tcpSend(ns, addr, port, flows, d, nil)
}

// TCPSendUntil is TCPSend until stop is closed (or an hour has passed):
// load that lasts as long as a measurement of unknown length takes (a
// command's start costs seconds on an emulated machine). Closing stop
// ends the load at once: the connections are reset, not drained.
func TCPSendUntil(ns, addr string, port, flows int, stop <-chan struct{}) ([]TCPFlowInfo, error) {
	return tcpSend(ns, addr, port, flows, time.Hour, stop)
}

func tcpSend(ns, addr string, port, flows int, d time.Duration, stop <-chan struct{}) ([]TCPFlowInfo, error) {
	conns := make([]*net.TCPConn, flows)
	for i := range conns {
		if err := InNetns(ns, func() error {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, fmt.Sprint(port)), 5*time.Second)
			if err == nil {
				conns[i] = c.(*net.TCPConn)
			}
			return err
		}); err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	end := time.Now().Add(d)
	buf := make([]byte, 64<<10)
	done := make(chan struct{}, flows)
	for _, c := range conns {
		c.SetWriteDeadline(end)
		go func() {
			for time.Now().Before(end) {
				if _, err := c.Write(buf); err != nil {
					break
				}
			}
			done <- struct{}{}
		}()
	}
	if stop != nil {
		// A deadline in the past ends a blocked write at once.
		finished := make(chan struct{})
		defer close(finished)
		go func() {
			select {
			case <-stop:
				for _, c := range conns {
					// The load ends now: closed with a linger of 0, a
					// connection is reset and what it still buffers is
					// dropped (a plain close would send its megabytes
					// for seconds more at a shaped rate: one autorate
					// run read that tail as load and as a full queue).
					c.SetLinger(0)
					c.SetWriteDeadline(time.Unix(1, 0))
				}
			case <-finished:
			}
		}()
	}
	for range conns {
		<-done
	}
	out := make([]TCPFlowInfo, flows)
	for i, c := range conns {
		raw, err := c.SyscallConn()
		if err != nil {
			return nil, err
		}
		var info *unix.TCPInfo
		var gerr error
		raw.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if gerr != nil {
			return nil, gerr
		}
		out[i] = TCPFlowInfo{BytesAcked: info.Bytes_acked, TotalRetrans: info.Total_retrans, ReordSeen: info.Reord_seen, Reordering: info.Reordering}
	}
	return out, nil
}
