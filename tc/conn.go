package tc

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sluice/internal/writecap"
)

// Conn talks rtnetlink to one network namespace. Links go through
// vishvananda/netlink's Handle; tc objects are encoded here on top of the
// same library's message primitives (see codec.go for why).
type Conn struct {
	links *netlink.Handle
	sock  *nl.SocketHandle
	ns    netns.NsHandle

	mu     sync.Mutex
	writes int
	// indexes caches device names' ifindexes while Pin holds it (nil
	// otherwise): one apply writes thousands of objects to one device,
	// and a link lookup per write cost as much as the write.
	indexes map[string]int
	// held keeps writes between Hold and Release (pipeline.go); rbuf is
	// Flush's receive buffer.
	held *held
	rbuf []byte
	// BeforeWrite, when set, runs before every write to the kernel with
	// the 1-based count of writes so far; an error it returns fails that
	// write as if the kernel had refused it. Tests use it to inject
	// faults; nothing else should.
	BeforeWrite func(n int, what string) error
}

// Open connects to the named network namespace (as `ip netns exec NAME`
// would), or to the caller's own when name is "".
func Open(name string) (*Conn, error) {
	ns, err := nsByName(name)
	if err != nil {
		return nil, err
	}
	return OpenNS(ns)
}

// nsByName opens the named network namespace's handle, or returns
// netns.None() (the caller's own) for "".
func nsByName(name string) (netns.NsHandle, error) {
	if name == "" {
		return netns.None(), nil
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		return netns.None(), fmt.Errorf("network namespace %q: %w", name, err)
	}
	return h, nil
}

// OpenNS connects to the namespace behind an open handle (netns.None() for
// the caller's own). Conn takes ownership of the handle.
func OpenNS(ns netns.NsHandle) (*Conn, error) {
	links, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		links.Close()
		ns.Close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	if err := s.SetExtAck(true); err != nil {
		s.Close()
		links.Close()
		ns.Close()
		return nil, err
	}
	return &Conn{links: links, sock: &nl.SocketHandle{Socket: s}, ns: ns}, nil
}

// Close releases the sockets and the namespace handle.
func (c *Conn) Close() {
	c.sock.Close()
	c.links.Close()
	if c.ns.IsOpen() {
		c.ns.Close()
	}
}

// Writer is a Conn's writes: qdiscs, classes, filters and links, held
// and flushed in batches, and the probes that create objects to learn
// what the kernel has. A Conn reads; Conn.Writer hands its Writer out
// for a writecap.Token, which only the executor and the test beds can
// name (TestOneWriterByImports).
type Writer struct{ *Conn }

// Writer returns c's writes.
func (c *Conn) Writer(writecap.Token) *Writer { return &Writer{c} }

// Links exposes the library handle for link-level work (bound to the
// same namespace): a Writer's, since the library writes as it reads.
func (c *Writer) Links() *netlink.Handle { return c.links }

// Writes returns how many writes this Conn has sent to the kernel.
func (c *Conn) Writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// ErrInjected marks a failure produced by BeforeWrite.
var ErrInjected = errors.New("injected failure")

func (c *Conn) countWrite(what string) error {
	c.mu.Lock()
	c.writes++
	n := c.writes
	hook := c.BeforeWrite
	c.mu.Unlock()
	if hook != nil {
		if err := hook(n, what); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conn) request(typ, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(typ, flags)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: c.sock}
	return req
}

// Pin makes IfIndex remember the indexes it resolves until the
// returned function runs. Only for a bounded run of work under
// sluice's lock (an apply, a read back): a long-lived Conn must not
// pin, since a device deleted and re-created gets a new index.
func (c *Conn) Pin() (unpin func()) {
	c.mu.Lock()
	c.indexes = map[string]int{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		c.indexes = nil
		c.mu.Unlock()
	}
}

func (c *Conn) forget(dev string) {
	c.mu.Lock()
	if c.indexes != nil {
		delete(c.indexes, dev)
	}
	c.mu.Unlock()
}

// IfIndex resolves a device name in the Conn's namespace.
func (c *Conn) IfIndex(dev string) (int, error) {
	c.mu.Lock()
	idx, ok := c.indexes[dev]
	c.mu.Unlock()
	if ok {
		return idx, nil
	}
	l, err := c.links.LinkByName(dev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return 0, fmt.Errorf("device %q does not exist", dev)
		}
		return 0, fmt.Errorf("device %q: %w", dev, err)
	}
	idx = l.Attrs().Index
	c.mu.Lock()
	if c.indexes != nil {
		c.indexes[dev] = idx
	}
	c.mu.Unlock()
	return idx, nil
}

// IfName resolves an index to a device name ("" if unknown).
func (c *Conn) IfName(index int) string {
	l, err := c.links.LinkByIndex(index)
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}

// LinkExists reports whether dev exists.
func (c *Conn) LinkExists(dev string) bool {
	_, err := c.links.LinkByName(dev)
	return err == nil
}

// LinkNames lists the namespace's devices, sorted (nil if they cannot
// be read).
func (c *Conn) LinkNames() []string {
	ls, err := c.links.LinkList()
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(ls))
	for _, l := range ls {
		names = append(names, l.Attrs().Name)
	}
	sort.Strings(names)
	return names
}

// GetLink reads a link's state, or nil if it does not exist.
func (c *Conn) GetLink(name string) *Link {
	l, err := c.links.LinkByName(name)
	if err != nil {
		return nil
	}
	a := l.Attrs()
	return &Link{Name: a.Name, Kind: l.Type(), MTU: a.MTU, Up: a.Flags&unix.IFF_UP != 0, Index: a.Index,
		RawIP: a.EncapType != "" && a.EncapType != "ether" && a.EncapType != "loopback", TxQueues: a.NumTxQueues}
}

// LinkAdd creates a link (an ifb) and sets it up.
func (c *Writer) LinkAdd(l *Link) error {
	if l.Kind != "ifb" {
		return fmt.Errorf("link %s: sluice only creates ifb devices", l.Name)
	}
	if err := c.countWrite("link add " + l.Name); err != nil {
		return fmt.Errorf("link add %s: %w", l.Name, err)
	}
	c.forget(l.Name)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = l.Name
	if l.MTU > 0 {
		attrs.MTU = l.MTU
	}
	if l.TxQueues > 0 {
		attrs.NumTxQueues, attrs.NumRxQueues = l.TxQueues, 1
	}
	if err := c.links.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
		return fmt.Errorf("link add %s: %w", l.Name, err)
	}
	if l.Up {
		// One operation for the caller: if the link cannot be set up,
		// it must not stay behind.
		if err := c.LinkUp(l.Name); err != nil {
			if lk, e := c.links.LinkByName(l.Name); e == nil {
				c.links.LinkDel(lk)
			}
			return err
		}
	}
	return nil
}

// LinkUp sets a link up.
func (c *Writer) LinkUp(name string) error {
	if err := c.countWrite("link up " + name); err != nil {
		return fmt.Errorf("link up %s: %w", name, err)
	}
	l, err := c.links.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link up %s: %w", name, err)
	}
	if err := c.links.LinkSetUp(l); err != nil {
		return fmt.Errorf("link up %s: %w", name, err)
	}
	return nil
}

// LinkDel deletes a link.
func (c *Writer) LinkDel(name string) error {
	if err := c.countWrite("link del " + name); err != nil {
		return fmt.Errorf("link del %s: %w", name, err)
	}
	c.forget(name)
	l, err := c.links.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link del %s: %w", name, err)
	}
	if err := c.links.LinkDel(l); err != nil {
		return fmt.Errorf("link del %s: %w", name, err)
	}
	return nil
}

// CountWrite counts a change made outside netlink (a BPF map update) as
// a write, so that fault injection (BeforeWrite) reaches it too.
func (c *Writer) CountWrite(what string) error { return c.countWrite(what) }

// NetnsID identifies the Conn's network namespace for as long as the
// machine runs: the namespace's cookie (never reused; kernels 5.14 and
// later) and its nsfs inode (reused once the namespace is gone). A
// namespace deleted and created again under the same name differs in
// both.
type NetnsID struct {
	Cookie uint64 `json:"cookie,omitempty"`
	Inode  uint64 `json:"inode"`
}

// NetnsID reads the identity of the Conn's namespace.
func (c *Conn) NetnsID() (NetnsID, error) {
	var id NetnsID
	if v, err := unix.GetsockoptUint64(c.sock.Socket.GetFd(), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE); err == nil {
		id.Cookie = v
	}
	var st unix.Stat_t
	var err error
	if c.ns.IsOpen() {
		err = unix.Fstat(int(c.ns), &st)
	} else {
		err = unix.Stat("/proc/self/ns/net", &st)
	}
	if err != nil {
		return id, fmt.Errorf("network namespace identity: %w", err)
	}
	id.Inode = st.Ino
	return id, nil
}

// RouteVia says which device the namespace routes dst through, as `ip
// route get` does, and the gateway where dst is not on that device's
// link itself (nil where it is).
func (c *Conn) RouteVia(dst net.IP) (*Link, net.IP, error) {
	rs, err := c.links.RouteGet(dst)
	if err != nil {
		return nil, nil, err
	}
	if len(rs) == 0 {
		return nil, nil, fmt.Errorf("no route to %s", dst)
	}
	r := rs[0]
	if r.Type == unix.RTN_LOCAL {
		return nil, nil, fmt.Errorf("%s is an address of this namespace", dst)
	}
	l, err := c.links.LinkByIndex(r.LinkIndex)
	if err != nil {
		return nil, nil, err
	}
	link := c.GetLink(l.Attrs().Name)
	if link == nil {
		return nil, nil, fmt.Errorf("the device of the route to %s is gone", dst)
	}
	return link, r.Gw, nil
}
