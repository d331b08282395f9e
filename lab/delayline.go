package lab

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"sluice/features"
	"sluice/records"
	"sluice/tc"
)

// A delay line stands in for netem where the kernel lacks it (or where a
// scenario asks for it: modem emulator line): a
// namespace ("wire") between the router's wan and the server's isp in
// which every frame is redirected (u32 + mirred) into a TAP device, held
// by this process for the delay, written back, and redirected on to the
// other side. It is pure layer 2, so addresses and routes do not change,
// and it lives as long as the process: `lab run` can use it, `lab up`
// cannot.
//
//	router wan ─ r [wire: r → tap-up → s, s → tap-down → r] s ─ isp server
//
// Frames from veth are checksummed and segmented by the stack on their
// way into the TAP (it offers no offloads), so the line carries wire-sized
// frames whatever the senders' GSO settings.

// delayLineLimit is the most frames held per direction; beyond it frames
// are dropped, as netem's limit does.
const delayLineLimit = 20000

// impairment is what the modem adds to the path besides its rate: a
// delay each way and a share of frames lost each way.
type impairment struct {
	delay time.Duration
	loss  float64 // 0..1
}

func (im impairment) none() bool { return im.delay == 0 && im.loss == 0 }

// relayNeeded reads m's delay and loss and says whether they need the
// delay line: emulator line asks for it, netem for netem (refused on a
// kernel without it), auto (the default) for netem where the kernel has
// it.
func relayNeeded(m Modem) (impairment, bool, error) {
	var im impairment
	if m.Delay != "" {
		d, err := time.ParseDuration(m.Delay)
		if err != nil || d <= 0 {
			return im, false, fmt.Errorf("modem delay %q: want a duration like 20ms", m.Delay)
		}
		im.delay = d
	}
	if m.Loss != "" {
		v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(m.Loss), "%"), 64)
		if err != nil || !strings.HasSuffix(strings.TrimSpace(m.Loss), "%") || v <= 0 || v >= 100 {
			return im, false, fmt.Errorf("modem loss %q: want a percentage like 1%%", m.Loss)
		}
		im.loss = v / 100
	}
	switch m.Emulator {
	case "", "auto", "netem", "line":
	default:
		return im, false, fmt.Errorf("modem emulator %q: want auto, netem or line", m.Emulator)
	}
	if im.none() {
		return im, false, nil
	}
	if m.Emulator == "line" {
		return im, true, nil
	}
	rep, err := features.ProbeCached(records.Dir(""))
	if err != nil {
		return im, false, err
	}
	if m.Emulator == "netem" && !rep.Qdiscs["netem"] {
		return im, false, fmt.Errorf("modem emulator netem: this kernel has no netem qdisc (sch_netem); use emulator auto or line")
	}
	return im, !rep.Qdiscs["netem"], nil
}

// NeedsDelayLine says whether topo's delay or loss would be emulated by
// this process (the delay line), so that a bed left up could not keep it.
func NeedsDelayLine(topo Topology) bool {
	_, relay, err := relayNeeded(topo.Modem)
	return err == nil && relay
}

// delayLine holds the TAP devices' file descriptors and their relays.
type delayLine struct {
	files []*os.File
	wg    sync.WaitGroup
}

// startDelayLine wires the wire namespace's r and s through two TAPs
// and starts relaying with delay each way.
func startDelayLine(ns string, im impairment) (*delayLine, error) {
	dl := &delayLine{}
	c, closeBed, err := openBed(ns)
	if err != nil {
		return nil, err
	}
	defer closeBed()
	for _, tap := range []string{"tap-up", "tap-down"} {
		var f *os.File
		if err := InNetns(ns, func() (err error) { f, err = openTAP(tap); return err }); err != nil {
			dl.Close()
			return nil, fmt.Errorf("delay line: TAP %s: %w", tap, err)
		}
		dl.files = append(dl.files, f)
	}
	for _, dev := range []string{"r", "s", "tap-up", "tap-down"} {
		if err := c.LinkUp(dev); err != nil {
			dl.Close()
			return nil, fmt.Errorf("delay line: %s up: %w", dev, err)
		}
	}
	// r → tap-up → s and s → tap-down → r.
	for _, hop := range [][2]string{{"r", "tap-up"}, {"tap-up", "s"}, {"s", "tap-down"}, {"tap-down", "r"}} {
		if err := c.QdiscAdd(&tc.Qdisc{Dev: hop[0], Parent: tc.HandleIngress, Handle: tc.MakeHandle(0xFFFF, 0), Kind: "clsact"}, false); err != nil {
			dl.Close()
			return nil, fmt.Errorf("delay line: clsact on %s: %w", hop[0], err)
		}
		if err := c.FilterAdd(&tc.Filter{Dev: hop[0], Parent: tc.HandleIngressHook, Prio: relayPrio, Proto: tc.ProtoAll, Kind: "u32", Handle: 1,
			U32: &tc.U32{Sel: &tc.Sel{Keys: []tc.Key{{}}}, RedirectDev: hop[1]}}); err != nil {
			dl.Close()
			return nil, fmt.Errorf("delay line: redirect %s to %s: %w", hop[0], hop[1], err)
		}
	}
	for i, f := range dl.files {
		dl.relay(f, im, int64(i))
	}
	return dl, nil
}

// relayPrio is the prio of the delay line's redirects; bypassPrio, ahead
// of them, of the flows BypassLine lets fall out of the line.
const relayPrio, bypassPrio = 10, 1

// BypassLine has the delay line of namespace ns drop the raw flows
// (ACKSend's, SYNSend's) that enter it on the router's side, r, instead
// of relaying them (del: relays them again). They are shaped before the
// line and belong to no connection: carried, each costs the relay a
// read and a write, and on an emulated guest 2,400 small ACKs a second
// took the relay from the TCP flows beside them (the 6.1 lane: a TCP
// class 3.35 to 3.75 Mbit/s of its 4.16, the link 88 to 96% full, the
// ACKs taking what it left). A match sends a frame on to the line's own
// stack, which has no address and drops it.
func BypassLine(ns string, flows []RawFlow, del bool) error {
	c, closeBed, err := openBed(ns)
	if err != nil {
		return err
	}
	defer closeBed()
	at := &tc.Filter{Dev: "r", Parent: tc.HandleIngressHook, Prio: bypassPrio, Proto: tc.ProtoAll, Kind: "u32"}
	if del {
		return c.FilterDel(at)
	}
	for i, f := range flows {
		ports := uint32(f.Src.Port())<<16 | uint32(f.Dst.Port())
		var keys []tc.Key
		if f.Src.Addr().Is4() {
			s, d := f.Src.Addr().As4(), f.Dst.Addr().As4()
			keys = []tc.Key{
				{Mask: 0xff000000, Val: 0x45000000}, // IPv4 without options: the ports at 20
				{Mask: 0x00ff0000, Val: 6 << 16, Off: 8},
				{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(s[:]), Off: 12},
				{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(d[:]), Off: 16},
				{Mask: 0xffffffff, Val: ports, Off: 20},
			}
		} else {
			s, d := f.Src.Addr().As16(), f.Dst.Addr().As16()
			keys = []tc.Key{{Mask: 0xf0000000, Val: 0x60000000}, {Mask: 0x0000ff00, Val: 6 << 8, Off: 4}}
			for j := 0; j < 4; j++ {
				keys = append(keys, tc.Key{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(s[4*j:]), Off: int32(8 + 4*j)},
					tc.Key{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(d[4*j:]), Off: int32(24 + 4*j)})
			}
			keys = append(keys, tc.Key{Mask: 0xffffffff, Val: ports, Off: 40})
		}
		g := *at
		g.Handle = uint32(i + 1)
		g.U32 = &tc.U32{Sel: &tc.Sel{Flags: tc.SelTerminal, Keys: keys}, ClassID: tc.MakeHandle(1, 1)}
		if err := c.FilterAdd(&g); err != nil {
			c.FilterDel(at)
			return fmt.Errorf("delay line: bypass for %v > %v: %w", f.Src, f.Dst, err)
		}
	}
	return nil
}

// openTAP creates a TAP device in the calling thread's namespace.
func openTAP(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var ifr [40]byte
	copy(ifr[:unix.IFNAMSIZ-1], name)
	*(*uint16)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		unix.Close(fd)
		return nil, e
	}
	return os.NewFile(uintptr(fd), name), nil
}

type heldFrame struct {
	b  []byte
	at time.Time
}

// relay reads the frames the TAP transmits and writes each back (the
// TAP receives it) im.delay after it was read, in order, losing each
// with probability im.loss (independently, as netem's loss does).
func (dl *delayLine) relay(f *os.File, im impairment, seed int64) {
	delay := im.delay
	q := make(chan heldFrame, delayLineLimit)
	pool := sync.Pool{New: func() any { return make([]byte, 65536) }}
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(seed)))
	dl.wg.Add(2)
	go func() {
		defer dl.wg.Done()
		defer close(q)
		for {
			b := pool.Get().([]byte)
			n, err := f.Read(b[:cap(b)])
			if err != nil {
				return
			}
			if im.loss > 0 && rnd.Float64() < im.loss {
				pool.Put(b)
				continue
			}
			select {
			case q <- heldFrame{b[:n], time.Now().Add(delay)}:
			default: // full: dropped
				pool.Put(b)
			}
		}
	}()
	go func() {
		defer dl.wg.Done()
		for h := range q {
			if d := time.Until(h.at); d > 0 {
				time.Sleep(d)
			}
			f.Write(h.b)
			pool.Put(h.b[:cap(h.b)])
		}
	}()
}

// Close stops relaying (the frames held are lost).
func (dl *delayLine) Close() error {
	if dl == nil {
		return nil
	}
	for _, f := range dl.files {
		f.Close()
	}
	dl.wg.Wait()
	return nil
}

// StartDelayLine relays every frame between devices r and s of namespace
// ns through this process, each held for delay (a wire of that
// propagation delay each way), until Close. Frames are copied, so a
// sender's socket lets go of them as they reach the line.
func StartDelayLine(ns string, delay time.Duration) (io.Closer, error) {
	return startDelayLine(ns, impairment{delay: delay})
}
