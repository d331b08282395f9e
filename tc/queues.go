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
	ch := ethtoolChannels{Cmd: 0x3c} // ETHTOOL_GCHANNELS
	if c.ethtool(dev, unsafe.Pointer(&ch)) != nil {
		return 0, false
	}
	n = int(ch.TxCount + ch.CombinedCount)
	return n, n > 0
}

// ethtool runs one SIOCETHTOOL request for dev in c's namespace; data
// points at the command's struct, which starts with its command number.
func (c *Conn) ethtool(dev string, data unsafe.Pointer) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c.ns.IsOpen() {
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		defer cur.Close()
		if err := netns.Set(c.ns); err != nil {
			return err
		}
		defer netns.Set(cur)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr [40]byte
	copy(ifr[:unix.IFNAMSIZ-1], dev)
	*(*uintptr)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = uintptr(data)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return e
	}
	return nil
}
