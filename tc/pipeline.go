package tc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Holding writes: building a tree of 10,000 subscribers is 20,000
// writes, and one request and one acknowledgement per write cost a
// quarter of the time (two system calls each, plus the library's 64 KB
// receive buffer, zeroed per call). While a Conn holds, its writes are
// encoded and kept; Flush sends them in one sendmsg. The kernel runs
// the messages of one send in order and keeps going after a failure, so
// every held write gets its own outcome: only the last message asks for
// an acknowledgement, the others are answered only when they fail.

// MaxSend bounds one send: every failed message is answered with a
// copy of itself, and all the answers of a send must fit the socket's
// receive buffer (raised to holdRcvBuf below) or some would be lost.
// Callers that hold many writes flush about this often, so that little
// waits in memory.
const (
	MaxSend    = 256
	holdRcvBuf = 4 << 20
)

type held struct {
	buf   []byte   // the messages, back to back
	offs  []int    // where each message starts in buf
	seqs  []uint32 // each message's sequence number
	whats []string // each message's description, for errors
}

// Hold makes the Conn keep its writes until Flush (or Held reaches
// the caller's bound). Only writes through tc objects are held; links
// and BPF loads still go at once, so callers flush before them.
func (c *Writer) Hold() {
	if c.held == nil {
		c.held = &held{}
		// Best effort: a larger buffer only matters for sends with
		// many failures, and MaxSend keeps those within the default.
		unix.SetsockoptInt(c.sock.Socket.GetFd(), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, holdRcvBuf)
	}
}

// Held returns how many writes wait for Flush.
func (c *Writer) Held() int {
	if c.held == nil {
		return 0
	}
	return len(c.held.seqs)
}

// Release flushes nothing: it stops holding and drops any held writes
// (call Flush first to send them).
func (c *Writer) Release() { c.held = nil }

// hold encodes req behind the others and returns at once.
func (c *Conn) hold(req *nl.NetlinkRequest, what string) {
	h := c.held
	// Consecutive, which send relies on: the socket is the Conn's own
	// and Hold is not for concurrent use.
	req.Seq = atomic.AddUint32(&c.sock.Seq, 1)
	req.Flags &^= unix.NLM_F_ACK
	h.offs = append(h.offs, len(h.buf))
	h.buf = append(h.buf, req.Serialize()...)
	h.seqs = append(h.seqs, req.Seq)
	h.whats = append(h.whats, what)
}

// Flush sends the held writes and returns each one's outcome, in the
// order they were written (nil: applied). A failure of a send itself is
// the outcome of each of its writes.
func (c *Writer) Flush() []error {
	h := c.held
	if h == nil || len(h.seqs) == 0 {
		return nil
	}
	defer func() {
		h.buf, h.offs, h.seqs, h.whats = h.buf[:0], h.offs[:0], h.seqs[:0], h.whats[:0]
	}()
	s := c.sock.Socket
	s.Lock()
	defer s.Unlock()
	if c.rbuf == nil {
		c.rbuf = make([]byte, 1<<16)
	}
	errs := make([]error, len(h.seqs))
	for from := 0; from < len(h.seqs); from += MaxSend {
		to := min(from+MaxSend, len(h.seqs))
		end := len(h.buf)
		if to < len(h.seqs) {
			end = h.offs[to]
		}
		c.send(s.GetFd(), h.buf[h.offs[from]:end], h.offs[to-1]-h.offs[from], from, to, errs)
	}
	return errs
}

// send sends msgs, the held writes from..to (the last at offset last),
// and files their outcomes in errs.
func (c *Conn) send(fd int, msgs []byte, last, from, to int, errs []error) {
	h := c.held
	fail := func(err error) {
		for i := from; i < to; i++ {
			errs[i] = fmt.Errorf("%s: %w", h.whats[i], err)
		}
	}
	// The last message asks for the acknowledgement that ends the
	// answers.
	flags := binary.NativeEndian.Uint16(msgs[last+6:])
	binary.NativeEndian.PutUint16(msgs[last+6:], flags|unix.NLM_F_ACK)
	if err := unix.Sendto(fd, msgs, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		fail(err)
		return
	}
	first, end := h.seqs[from], h.seqs[to-1]
	for {
		n, err := recvWait(fd, c.rbuf)
		if err != nil {
			// ENOBUFS: answers were lost, so which writes failed is
			// unknown.
			fail(fmt.Errorf("reading the kernel's answers: %w", err))
			return
		}
		answers, err := syscall.ParseNetlinkMessage(c.rbuf[:n])
		if err != nil {
			fail(err)
			return
		}
		for _, m := range answers {
			seq := m.Header.Seq
			// Sequence numbers of one send are consecutive.
			if m.Header.Type != unix.NLMSG_ERROR || seq-first > end-first {
				continue // not ours: an answer to an earlier request
			}
			i := from + int(seq-first)
			if err := ackError(m); err != nil {
				errs[i] = fmt.Errorf("%s: %w", h.whats[i], err)
			}
			if seq == end {
				return
			}
		}
	}
}

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// recvWait reads one datagram. The kernel answers within the send, so
// the answers are normally there; the wait covers a slow scheduler.
func recvWait(fd int, b []byte) (int, error) {
	for {
		n, _, err := unix.Recvfrom(fd, b, 0)
		if err == unix.EINTR {
			continue
		}
		if err != unix.EAGAIN {
			return n, err
		}
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		k, err := unix.Poll(p, 10_000)
		if err != nil && err != unix.EINTR {
			return 0, err
		}
		if k == 0 {
			return 0, errors.New("no answer in 10 s")
		}
	}
}

// ackError decodes an NLMSG_ERROR answer: nil for an acknowledgement,
// else the errno with the kernel's extended message, as the netlink
// library words it.
func ackError(m syscall.NetlinkMessage) error {
	if len(m.Data) < 4 {
		return errors.New("short netlink answer")
	}
	errno := int32(binary.NativeEndian.Uint32(m.Data))
	if errno == 0 {
		return nil
	}
	err := error(syscall.Errno(-errno))
	rest := m.Data[4:]
	if m.Header.Flags&unix.NLM_F_ACK_TLVS == 0 || len(rest) < unix.SizeofNlMsghdr {
		return err
	}
	// Skip the copy of the request (just its header when capped).
	echo := int(binary.NativeEndian.Uint32(rest))
	if m.Header.Flags&unix.NLM_F_CAPPED != 0 {
		echo = unix.SizeofNlMsghdr
	}
	if nlmAlign(echo) > len(rest) {
		return err
	}
	for a := rest[nlmAlign(echo):]; len(a) >= unix.SizeofRtAttr; {
		l := int(binary.NativeEndian.Uint16(a))
		if l < unix.SizeofRtAttr || l > len(a) {
			break
		}
		if binary.NativeEndian.Uint16(a[2:]) == unix.NLMSGERR_ATTR_MSG {
			err = fmt.Errorf("%w: %s", err, unix.ByteSliceToString(a[unix.SizeofRtAttr:l]))
		}
		a = a[min(nlmAlign(l), len(a)):]
	}
	return err
}
