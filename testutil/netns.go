package testutil

import (
	"fmt"
	"io"
	"net"
	"sort"
	"time"

	"sluice/lab"
)

// InNetns runs f on a thread inside network namespace ns (see
// lab.InNetns).
func InNetns(ns string, f func() error) error { return lab.InNetns(ns, f) }

// TCPEchoServer listens on addr:port in ns and echoes whatever it reads.
func TCPEchoServer(ns, addr string, port int) (io.Closer, error) {
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
			go func() { io.Copy(c, c); c.Close() }()
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
