package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ACKFrame is the size on the wire (Ethernet, IP, TCP, no options or
// payload) of one pure ACK ACKSend sends, or one SYN SYNSend sends, IPv4
// and IPv6.
func ACKFrame(v6 bool) int {
	if v6 {
		return 14 + 40 + 20
	}
	return 14 + 20 + 20
}

// ACKSend sends small pure TCP ACKs (flags ACK only, no payload: what a
// download's receiver sends, and what a tcp_ack rule matches) from ns,
// from from to dst, at rate frames' bits per second, with DSCP dscp,
// until ctx ends. They belong to no connection: the receiver answers
// each with a reset, in the other direction. f's sent bytes count whole
// frames.
func ACKSend(ctx context.Context, ns string, from, dst netip.AddrPort, rate float64, dscp int, f *FlowCounter) error {
	return rawTCPSend(ctx, ns, from, dst, rate, dscp, tcpACK, f)
}

// SYNSend sends bare TCP SYNs (no options, no payload: what a tcp_syn
// rule matches; a connection's first packet) like ACKSend sends ACKs.
// A receiver with no listener on dst answers each with a reset.
func SYNSend(ctx context.Context, ns string, from, dst netip.AddrPort, rate float64, dscp int, f *FlowCounter) error {
	return rawTCPSend(ctx, ns, from, dst, rate, dscp, tcpSYN, f)
}

// TCP flags a raw sender sets.
const (
	tcpSYN = 0x02
	tcpACK = 0x10
)

func rawTCPSend(ctx context.Context, ns string, from, dst netip.AddrPort, rate float64, dscp int, flags byte, f *FlowCounter) error {
	v6 := dst.Addr().Is6()
	fam := unix.AF_INET
	if v6 {
		fam = unix.AF_INET6
	}
	var fd int
	err := InNetns(ns, func() (err error) {
		fd, err = unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			return fmt.Errorf("raw TCP socket: %w", err)
		}
		if err := setTOS(uintptr(fd), v6, dscp); err != nil {
			return err
		}
		if v6 {
			return unix.Bind(fd, &unix.SockaddrInet6{Addr: from.Addr().As16()})
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Addr: from.Addr().As4()})
	})
	if err != nil {
		if fd > 0 {
			unix.Close(fd)
		}
		return err
	}
	defer unix.Close(fd)
	var to unix.Sockaddr = &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	if v6 {
		to = &unix.SockaddrInet6{Addr: dst.Addr().As16()}
	}
	seg := tcpSegment(from, dst, 1, 1, flags)
	what := "a pure ACK"
	if flags&tcpSYN != 0 {
		what = "a SYN"
		binary.BigEndian.PutUint32(seg[8:], 0) // no acknowledgment number without ACK
	}
	frame := ACKFrame(v6)
	start := time.Now()
	var sent uint64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for seq := uint32(1); ; {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			due := uint64(now.Sub(start).Seconds() * rate / 8)
			for sent+uint64(frame) <= due {
				seq += 1000
				binary.BigEndian.PutUint32(seg[4:], seq)
				setTCPChecksum(seg, from.Addr(), dst.Addr())
				if err := unix.Sendto(fd, seg, 0, to); err != nil && !errors.Is(err, syscall.ENOBUFS) {
					return fmt.Errorf("sending %s: %w", what, err)
				}
				sent += uint64(frame)
				f.tx.Add(uint64(frame))
			}
		}
	}
}

// tcpSegment is a 20-byte TCP header with flags.
func tcpSegment(from, dst netip.AddrPort, seq, ack uint32, flags byte) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b[0:], from.Port())
	binary.BigEndian.PutUint16(b[2:], dst.Port())
	binary.BigEndian.PutUint32(b[4:], seq)
	binary.BigEndian.PutUint32(b[8:], ack)
	b[12] = 5 << 4 // data offset: five words, no options
	b[13] = flags
	binary.BigEndian.PutUint16(b[14:], 64240)
	return b
}

// setTCPChecksum fills in seg's checksum over the pseudo-header of src
// and dst (RFC 793, RFC 8200 8.1).
func setTCPChecksum(seg []byte, src, dst netip.Addr) {
	seg[16], seg[17] = 0, 0
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	sum += unix.IPPROTO_TCP + uint32(len(seg))
	add(seg)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(seg[16:], ^uint16(sum))
}

// MarkedFlow is a flow whose packets a gateway's firewall marks.
type MarkedFlow struct {
	Proto    string // tcp or udp (a pure ACK is tcp)
	Src, Dst netip.AddrPort
	Mark     uint32
}

// markTable is the nftables table a bed's gateway marks flows in.
const markTable = "sluice_lab_marks"

// MarkFlows has namespace ns (a bed's gateway) set each flow's firewall
// mark on the packets it forwards, as a gateway's firewall would
// (nftables, its forward hook: before the egress qdisc classifies);
// with del it removes the bed's marking table. Needs nft(8).
func MarkFlows(ns string, flows []MarkedFlow, del bool) error {
	if del {
		return nft(ns, fmt.Sprintf("table inet %s\ndelete table inet %s\n", markTable, markTable))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n  chain forward {\n    type filter hook forward priority mangle; policy accept;\n", markTable)
	for _, f := range flows {
		ip := "ip"
		if f.Src.Addr().Is6() {
			ip = "ip6"
		}
		fmt.Fprintf(&b, "    %s saddr %s %s daddr %s meta l4proto %s th sport %d th dport %d meta mark set %#x\n",
			ip, f.Src.Addr(), ip, f.Dst.Addr(), f.Proto, f.Src.Port(), f.Dst.Port(), f.Mark)
	}
	b.WriteString("  }\n}\n")
	return nft(ns, b.String())
}

// RawFlow is a flow of raw TCP packets (ACKSend's, SYNSend's).
type RawFlow struct{ Src, Dst netip.AddrPort }

// sinkTable is the nftables table a bed's receiving namespace drops
// raw flows in.
const sinkTable = "sluice_lab_sink"

// SinkRawFlows has namespace ns (where raw flows end) drop the packets
// of flows, TCP from Src to Dst that ACKSend or SYNSend sends, as they
// arrive (nftables, its input hook); with del it removes the table.
// They belong to no connection, and unsunk each draws a reset back the
// way it came: as many packets again through the bed, on the path the
// TCP flows beside them need for their ACKs (the 6.1 lane's emulated
// guest, its delay line carrying 2,400 ACKs and 2,400 resets a second:
// the TCP class 3.40 of its 3.73 Mbit/s, the ACKs taking what it left).
// Needs nft(8).
func SinkRawFlows(ns string, flows []RawFlow, del bool) error {
	if del {
		return nft(ns, fmt.Sprintf("table inet %s\ndelete table inet %s\n", sinkTable, sinkTable))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n  chain input {\n    type filter hook input priority -300; policy accept;\n", sinkTable)
	for _, f := range flows {
		src, dst := f.Src, f.Dst
		ip := "ip"
		if src.Addr().Is6() {
			ip = "ip6"
		}
		fmt.Fprintf(&b, "    %s saddr %s %s daddr %s tcp sport %d tcp dport %d drop\n",
			ip, src.Addr(), ip, dst.Addr(), src.Port(), dst.Port())
	}
	b.WriteString("  }\n}\n")
	return nft(ns, b.String())
}

// nft runs nft -f - with script in namespace ns.
func nft(ns, script string) error {
	path, err := exec.LookPath("nft")
	if err != nil {
		return fmt.Errorf("the bed sets firewall marks with nft(8), which is not installed (Debian: nftables)")
	}
	// A child forked on a thread inside ns starts in ns.
	return InNetns(ns, func() error {
		cmd := exec.Command(path, "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft: %v: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	})
}
