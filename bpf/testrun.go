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
// used by policers when the content's TestClock is set).
type Packet struct {
	Frame []byte
	Mark  uint32
	Time  uint64
	// WireLen and GSOSegs make the frame stand for a GSO packet of
	// WireLen bytes in GSOSegs segments (0: a plain packet).
	WireLen uint32
	GSOSegs uint32
}

// Result is what the program did to a packet.
type Result struct {
	Verdict  uint32
	Priority uint32 // skb->priority: the class handed to HTB
	Frame    []byte // the packet after the program (DSCP remarks)
}

// Run runs the classifier once on pkt through BPF_PROG_TEST_RUN.
func (p *Program) Run(pkt Packet) (Result, error) {
	in := skbContext{Mark: pkt.Mark, Tstamp: pkt.Time, WireLen: pkt.WireLen, GSOSegs: pkt.GSOSegs}
	var out skbContext
	data := make([]byte, len(pkt.Frame)+64)
	opts := &ebpf.RunOptions{Data: pkt.Frame, DataOut: data, Context: in, ContextOut: &out}
	v, err := p.objs.SluiceClassify.Run(opts)
	if err != nil {
		return Result{}, fmt.Errorf("bpf test run: %w", err)
	}
	return Result{Verdict: v, Priority: out.Priority, Frame: opts.DataOut}, nil
}

// Benchmark runs the classifier repeat times on frame in the kernel and
// returns the mean time per run.
func (p *Program) Benchmark(frame []byte, repeat int) (time.Duration, error) {
	_, d, err := p.objs.SluiceClassify.Benchmark(frame, repeat, nil)
	return d, err
}
