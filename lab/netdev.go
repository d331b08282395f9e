package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The building blocks of a test bed, for harnesses beyond the lab's own
// topology (package conform builds a gateway for any policy's devices).
// Each call names the namespaces it acts in; none touches the root
// namespace's devices.

// CreateNetns creates a named network namespace (as `ip netns add`).
func CreateNetns(name string) error { return createNS(name) }

// DeleteNetns removes a named network namespace and its devices.
func DeleteNetns(name string) error { return deleteNS(name) }

// BedNetns lists the namespaces of the lab or bed named name (bedNS).
func BedNetns(name string) []string { return bedNS(name) }

// handle opens a netlink handle inside namespace ns.
func handle(ns string) (*netlink.Handle, error) {
	nh, err := netns.GetFromName(ns)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", ns, err)
	}
	defer nh.Close()
	return netlink.NewHandleAt(nh)
}

var vethSeq atomic.Uint32

// Veth connects ns1's dev1 and ns2's dev2 with a veth pair of queues
// transmit and receive queues each (0: one), both up.
func Veth(ns1, dev1, ns2, dev2 string, queues int) error {
	n1, err := netns.GetFromName(ns1)
	if err != nil {
		return err
	}
	defer n1.Close()
	n2, err := netns.GetFromName(ns2)
	if err != nil {
		return err
	}
	defer n2.Close()
	root, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer root.Close()
	// A name unique in this namespace for the moment before the rename.
	tmp := fmt.Sprintf("slv%d.%d", os.Getpid()%100000, vethSeq.Add(1)%1000)
	if len(tmp) > 12 {
		tmp = fmt.Sprintf("slv%d", time.Now().UnixNano()%10000000)
	}
	attrs := netlink.LinkAttrs{Name: tmp, Namespace: netlink.NsFd(n1)}
	v := &netlink.Veth{LinkAttrs: attrs, PeerName: tmp + "p", PeerNamespace: netlink.NsFd(n2)}
	if queues > 1 {
		v.NumTxQueues, v.NumRxQueues = queues, queues
		v.PeerNumTxQueues, v.PeerNumRxQueues = uint32(queues), uint32(queues)
	}
	if err := root.LinkAdd(v); err != nil {
		return fmt.Errorf("veth %s/%s - %s/%s: %w", ns1, dev1, ns2, dev2, err)
	}
	for _, e := range []struct{ ns, from, to string }{{ns1, tmp, dev1}, {ns2, tmp + "p", dev2}} {
		h, err := handle(e.ns)
		if err != nil {
			return err
		}
		l, err := h.LinkByName(e.from)
		if err == nil {
			err = h.LinkSetName(l, e.to)
		}
		if err == nil {
			err = h.LinkSetUp(l)
		}
		h.Close()
		if err != nil {
			return fmt.Errorf("veth %s/%s: %w", e.ns, e.to, err)
		}
	}
	return nil
}

// Addrs adds host addresses (a /32 or /128 each) to ns's dev and brings
// it and lo up.
func Addrs(ns, dev string, addrs ...netip.Addr) error {
	h, err := handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := up(h, "lo"); err != nil {
		return err
	}
	var ps []netip.Prefix
	for _, a := range addrs {
		ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
	}
	return addrUp(h, dev, ps...)
}

// DelAddrs removes host addresses from ns's dev (those it lacks are
// ignored).
func DelAddrs(ns, dev string, addrs ...netip.Addr) error {
	h, err := handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		p := netip.PrefixFrom(a, a.BitLen())
		h.AddrDel(l, &netlink.Addr{IPNet: prefixNet(p)})
	}
	return nil
}

// Routes sends the host addresses addrs out of ns's dev, on-link, and
// makes them permanent neighbours with the MAC of peerNS's peerDev (no
// ARP or neighbour discovery on a bed). With del it removes them.
func Routes(ns, dev, peerNS, peerDev string, del bool, addrs ...netip.Addr) error {
	h, err := handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	if del {
		for _, a := range addrs {
			h.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(a, a.BitLen())), Scope: netlink.SCOPE_LINK})
			n := &netlink.Neigh{LinkIndex: l.Attrs().Index, IP: a.AsSlice(), Family: family(a)}
			h.NeighDel(n)
		}
		return nil
	}
	for _, a := range addrs {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(a, a.BitLen())), Scope: netlink.SCOPE_LINK}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("%s: route to %s via %s: %w", ns, a, dev, err)
		}
	}
	peer, err := handle(peerNS)
	if err != nil {
		return err
	}
	defer peer.Close()
	return pinNeighbours(h, dev, peer, peerDev, addrs...)
}

// DefaultRoutes sends everything out of ns's dev, on-link (IPv4 and
// IPv6), for hosts whose addresses are /32s and /128s with no subnet.
func DefaultRoutes(ns, dev string) error {
	h, err := handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	for _, f := range []int{unix.AF_INET, unix.AF_INET6} {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK, Family: f}
		if f == unix.AF_INET6 {
			r.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("%s: default route via %s: %w", ns, dev, err)
		}
	}
	return nil
}

// Forwarding turns on IPv4 and IPv6 forwarding in ns and off reverse
// path filtering, as a router has them.
func Forwarding(ns string) error {
	return InNetns(ns, func() error {
		for p, v := range map[string]string{
			"/proc/sys/net/ipv4/ip_forward":             "1",
			"/proc/sys/net/ipv6/conf/all/forwarding":    "1",
			"/proc/sys/net/ipv4/conf/all/rp_filter":     "0",
			"/proc/sys/net/ipv4/conf/default/rp_filter": "0",
		} {
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
}

func family(a netip.Addr) int {
	if a.Is6() {
		return unix.AF_INET6
	}
	return unix.AF_INET
}
