package bpf

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// skbContext mirrors struct __sk_buff (192 bytes, linux/bpf.h) for
// BPF_PROG_TEST_RUN: only the fields the kernel lets a test set or
// reports back are named.
type skbContext struct {
	Len      uint32 // 0
	_        uint32
	Mark     uint32 // 8
	_        [5]uint32
	Priority uint32 // 32
	_        uint32
	Ifindex  uint32 // 40
	_        uint32
	CB       [5]uint32 // 48
	_        [2]uint32
	_        [76]byte // 76: data pointers, socket fields
	Tstamp   uint64   // 152
	WireLen  uint32   // 160
	GSOSegs  uint32   // 164
	_        uint64   // 168: sk
	GSOSize  uint32   // 176
	_        uint32   // 180: tstamp_type
	HWTstamp uint64   // 184
}

// Verdicts a tc program returns.
const (
	VerdictOK   = 0 // TC_ACT_OK
	VerdictShot = 2 // TC_ACT_SHOT
)

// Packet is one test-run input: an Ethernet frame (or a bare IP packet
// for L2Len 0), the skb mark, and the time the packet is seen at (ns;
// used by policers and pacers when the content's TestClock is set).
type Packet struct {
	Frame []byte
	Mark  uint32
	Time  uint64
	// Tstamp is the skb's timestamp on arrival at the hook (the
	// departure time TCP's own pacing gave it; 0: none).
	Tstamp uint64
	// WireLen and GSOSegs make the frame stand for a GSO packet of
	// WireLen bytes in GSOSegs segments (0: a plain packet).
	WireLen uint32
	GSOSegs uint32
}

// context is the skb the kernel builds for pkt: the test clock goes in
// cb[0..1] (see clock() in classifier.c).
func (pkt Packet) context() skbContext {
	in := skbContext{Mark: pkt.Mark, Tstamp: pkt.Tstamp, WireLen: pkt.WireLen, GSOSegs: pkt.GSOSegs}
	in.CB[0], in.CB[1] = uint32(pkt.Time), uint32(pkt.Time>>32)
	return in
}

// Result is what the program did to a packet.
type Result struct {
	Verdict  uint32
	Priority uint32 // skb->priority: the class handed to HTB
	Tstamp   uint64 // skb->tstamp after the program (EDT: the departure time)
	Frame    []byte // the packet after the program (DSCP remarks)
}

// Run runs the classifier once on pkt through BPF_PROG_TEST_RUN.
func (p *Writer) Run(pkt Packet) (Result, error) {
	in := pkt.context()
	var out skbContext
	data := make([]byte, len(pkt.Frame)+64)
	opts := &ebpf.RunOptions{Data: pkt.Frame, DataOut: data, Context: in, ContextOut: &out}
	v, err := p.objs.SluiceClassify.Run(opts)
	if err != nil {
		return Result{}, fmt.Errorf("bpf test run: %w", err)
	}
	return Result{Verdict: v, Priority: out.Priority, Tstamp: out.Tstamp, Frame: opts.DataOut}, nil
}

// RunRepeat runs the program repeat times on pkt inside the kernel, in
// one call (for concurrency tests: several goroutines at once put the
// runs on several CPUs). At least repeat times: a call a signal
// interrupts is started again from its first repetition (cilium/ebpf's
// Run), and the runs before the signal have left their counts.
func (p *Writer) RunRepeat(pkt Packet, repeat int) error {
	in := pkt.context()
	opts := &ebpf.RunOptions{Data: pkt.Frame, Context: in, Repeat: uint32(repeat)}
	if _, err := p.objs.SluiceClassify.Run(opts); err != nil {
		return fmt.Errorf("bpf test run: %w", err)
	}
	return nil
}

// Benchmark runs the classifier repeat times on frame in the kernel and
// returns the mean time per run.
func (p *Writer) Benchmark(frame []byte, repeat int) (time.Duration, error) {
	_, d, err := p.objs.SluiceClassify.Benchmark(frame, repeat, nil)
	return d, err
}
