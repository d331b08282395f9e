package tc

import (
	"runtime"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ethtoolChannels is struct ethtool_channels.
type ethtoolChannels struct {
	Cmd                                         uint32
	MaxRx, MaxTx, MaxOther, MaxCombined         uint32
	RxCount, TxCount, OtherCount, CombinedCount uint32
}

// TxQueuesInUse asks dev's driver (ethtool channels) how many transmit
// queues it uses: a device may allocate more (veth allocates one per
// CPU but uses one unless told), and a queue the stack never picks must
// not get a shard. ok is false when the driver does not say.
func (c *Conn) TxQueuesInUse(dev string) (n int, ok bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c.ns.IsOpen() {
		cur, err := netns.Get()
		if err != nil {
			return 0, false
		}
		defer cur.Close()
		if err := netns.Set(c.ns); err != nil {
			return 0, false
		}
		defer netns.Set(cur)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	ch := ethtoolChannels{Cmd: 0x3c} // ETHTOOL_GCHANNELS
	var ifr [40]byte
	copy(ifr[:unix.IFNAMSIZ-1], dev)
	*(*uintptr)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = uintptr(unsafe.Pointer(&ch))
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return 0, false
	}
	n = int(ch.TxCount + ch.CombinedCount)
	return n, n > 0
}
