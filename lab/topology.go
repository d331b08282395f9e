// Package lab is sluice's test bed: network namespaces wired like a home
// or office (clients behind a router, a server as "the internet", a modem
// link in between), built-in traffic generators and probes, measurements
// of what a policy does to them, and reports. It is also the demo and
// the benchmark harness.
package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sluice/records"
	"sluice/tc"
	"sluice/units"
)

// Prefix starts the names of every namespace the lab creates, so that
// `sluice lab down --all` finds what a crashed run left behind.
const Prefix = "sllab-"

// Topology describes the test bed.
type Topology struct {
	// Clients is the number of client hosts on the LAN (default 1).
	Clients int `yaml:"clients"`
	// Modem limits the link between the router and the server, like a DSL
	// or cable modem whose own buffer fills when nobody shapes in front
	// of it. Empty rates leave the link unlimited.
	Modem Modem `yaml:"modem"`
}

// Modem is the bottleneck behind the router.
type Modem struct {
	Up     string `yaml:"up"`     // rate toward the server, tc units
	Down   string `yaml:"down"`   // rate toward the router
	Buffer string `yaml:"buffer"` // its queue, as time at its rate (default 200ms)
	// Delay adds a propagation delay each way on the server side, Loss
	// (a percentage) loses that share of frames each way, independently.
	Delay string `yaml:"delay"`
	Loss  string `yaml:"loss"`
	// Emulator says what adds them: netem (refused on a kernel without
	// it), line (sluice's own delay line, which lives only as long as
	// `lab run`), or auto (the default): netem where the kernel has it.
	Emulator string `yaml:"emulator"`
	// Linklayer atm makes the modem's line carry cells (48 bytes of
	// every 53, the last one padded), and Overhead adds bytes to every
	// packet (an ADSL line's encapsulation): the line's rate is what it
	// syncs at, and a shaper that counts bytes as Ethernet does sends
	// more than it carries.
	Linklayer string `yaml:"linklayer"`
	Overhead  int    `yaml:"overhead"`
}

// stab is the size table the modem's line counts packets with.
func (m Modem) stab() (*tc.Stab, error) {
	if m.Overhead < -64 || m.Overhead > 256 {
		return nil, fmt.Errorf("modem overhead %d: want bytes from -64 to 256", m.Overhead)
	}
	switch m.Linklayer {
	case "", "ethernet":
		if m.Overhead == 0 {
			return nil, nil
		}
		return &tc.Stab{Overhead: int32(m.Overhead), Linklayer: tc.LinkEthernet}, nil
	case "atm":
		return &tc.Stab{Overhead: int32(m.Overhead), Linklayer: tc.LinkATM}, nil
	}
	return nil, fmt.Errorf("modem linklayer %q: want ethernet or atm", m.Linklayer)
}

// Addresses of the test bed.
var (
	LANPrefix4 = netip.MustParsePrefix("10.77.0.0/24")
	LANPrefix6 = netip.MustParsePrefix("fd77::/64")
	RouterLAN4 = netip.MustParseAddr("10.77.0.1")
	RouterLAN6 = netip.MustParseAddr("fd77::1")
	RouterWAN4 = netip.MustParseAddr("10.78.0.1")
	RouterWAN6 = netip.MustParseAddr("fd78::1")
	Server4    = netip.MustParseAddr("10.78.0.2")
	Server6    = netip.MustParseAddr("fd78::2")
)

// ClientAddr returns client i's addresses (i from 1).
func ClientAddr(i int) (netip.Addr, netip.Addr) {
	a4 := LANPrefix4.Addr().As4()
	a4[3] = byte(10 + i)
	a6 := LANPrefix6.Addr().As16()
	a6[15] = byte(10 + i)
	return netip.AddrFrom4(a4), netip.AddrFrom16(a6)
}

// Bed is a test bed that is up.
type Bed struct {
	Name    string
	Router  string // namespace with devices lan and wan
	Switch  string // namespace with the LAN bridge
	Server  string // namespace with device isp
	Clients []string
	Topo    Topology
	// Modem is the namespace of the modem between router and server,
	// when the topology has one (else empty). Wire is the delay line's
	// namespace between modem and server, when the modem's delay is
	// emulated without netem (else empty).
	Modem string
	Wire  string

	delay *delayLine
	// modemBursts is each direction's bucket, and gsoCapped whether
	// the senders' GSO size is capped (SetModemRate).
	mu          sync.Mutex
	modemBursts map[string]uint32
	gsoCapped   bool
}

// Names of a bed's namespaces.
func bedNames(name string, clients int) *Bed {
	b := &Bed{Name: name, Router: Prefix + name + "-router", Switch: Prefix + name + "-switch", Server: Prefix + name + "-server"}
	for i := 1; i <= clients; i++ {
		b.Clients = append(b.Clients, fmt.Sprintf("%s%s-c%d", Prefix, name, i))
	}
	return b
}

// Host returns the namespace and addresses of an endpoint name:
// "server" or "client1".."clientN".
func (b *Bed) Host(name string) (ns string, a4, a6 netip.Addr, err error) {
	if name == "server" {
		return b.Server, Server4, Server6, nil
	}
	var i int
	if _, err := fmt.Sscanf(name, "client%d", &i); err != nil || i < 1 || i > len(b.Clients) || fmt.Sprintf("client%d", i) != name {
		return "", netip.Addr{}, netip.Addr{}, fmt.Errorf("unknown host %q: want server or client1..client%d", name, len(b.Clients))
	}
	a4, a6 = ClientAddr(i)
	return b.Clients[i-1], a4, a6, nil
}

// Up builds a test bed. On failure it removes what it created.
func Up(name string, topo Topology) (b *Bed, err error) {
	if topo.Clients == 0 {
		topo.Clients = 1
	}
	if topo.Clients > 200 {
		return nil, fmt.Errorf("%d clients: the lab's LAN holds at most 200", topo.Clients)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	b = bedNames(name, topo.Clients)
	b.Topo = topo
	im, relay, err := relayNeeded(topo.Modem)
	if err != nil {
		return nil, err
	}
	if relay {
		b.Wire = Prefix + name + "-wire"
	}
	if topo.Modem.Up != "" || topo.Modem.Down != "" || !im.none() {
		b.Modem = Prefix + name + "-modem"
	}
	if len(bedNS(name)) > 0 {
		return nil, fmt.Errorf("a lab named %q is already up (sluice lab down %s)", name, name)
	}
	// Whatever fails from here, what was built goes: the deferred Down
	// works on built, since every failure returns a nil Bed (it once
	// called Down on that nil, and a failed build panicked and left its
	// namespaces behind).
	built := b
	defer func() {
		if err != nil {
			built.Down()
			b = nil
		}
	}()
	for _, ns := range b.all() {
		if err := createNS(ns); err != nil {
			return nil, err
		}
	}
	h := map[string]*netlink.Handle{}
	for _, ns := range b.all() {
		nh, err := netns.GetFromName(ns)
		if err != nil {
			return nil, err
		}
		hd, err := netlink.NewHandleAt(nh)
		nh.Close()
		if err != nil {
			return nil, err
		}
		defer hd.Close()
		h[ns] = hd
		if err := up(hd, "lo"); err != nil {
			return nil, err
		}
	}
	// The LAN: a bridge in the switch namespace, one port per client and
	// one for the router.
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := h[b.Switch].LinkAdd(br); err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	wire := func(ns1, dev1, ns2, dev2 string) error { return Veth(ns1, dev1, ns2, dev2, 0) }
	for i, c := range b.Clients {
		port := fmt.Sprintf("c%d", i+1)
		if err := wire(c, "eth0", b.Switch, port); err != nil {
			return nil, err
		}
		if err := enslave(h[b.Switch], port, "br0"); err != nil {
			return nil, err
		}
		a4, a6 := ClientAddr(i + 1)
		if err := addrUp(h[c], "eth0", netip.PrefixFrom(a4, 24), netip.PrefixFrom(a6, 64)); err != nil {
			return nil, err
		}
		if err := defaultRoutes(h[c], "eth0", RouterLAN4, RouterLAN6); err != nil {
			return nil, err
		}
	}
	if err := wire(b.Router, "lan", b.Switch, "router"); err != nil {
		return nil, err
	}
	if err := enslave(h[b.Switch], "router", "br0"); err != nil {
		return nil, err
	}
	if err := up(h[b.Switch], "br0"); err != nil {
		return nil, err
	}
	// The WAN: router wan ── [modem router|isp] ── [wire r|s] ── isp server.
	// The modem routes (layer 3), so that the server's packets leave
	// their sockets when they reach it, as they leave a real server's on
	// its own NIC: a modem queue on the server's own device would count
	// against each TCP socket's small-queue budget (TSQ, about a
	// millisecond of its pacing rate) and hold every flow to a couple of
	// packets per trip through that queue, which a real sender never
	// sees (measured on Debian's 6.1 under emulation, where the modem
	// became the bottleneck: flows stuck at 1.2 Mbit/s with 8 KB in
	// flight below the socket and no loss, fairness 0.40).
	wanPeer, wanPeerDev := b.Server, "isp" // what the router's wan faces
	ispPeer, ispPeerDev := b.Router, "wan" // what the server's isp faces
	if b.Modem != "" {
		wanPeer, wanPeerDev, ispPeer, ispPeerDev = b.Modem, "router", b.Modem, "isp"
		if err := wire(b.Router, "wan", b.Modem, "router"); err != nil {
			return nil, err
		}
	}
	switch {
	case b.Wire != "":
		if err := wire(b.Modem, "isp", b.Wire, "r"); err != nil {
			return nil, err
		}
		if err := wire(b.Wire, "s", b.Server, "isp"); err != nil {
			return nil, err
		}
		if b.delay, err = startDelayLine(b.Wire, im); err != nil {
			return nil, err
		}
	case b.Modem != "":
		if err := wire(b.Modem, "isp", b.Server, "isp"); err != nil {
			return nil, err
		}
	default:
		if err := wire(b.Router, "wan", b.Server, "isp"); err != nil {
			return nil, err
		}
	}
	if err := addrUp(h[b.Router], "lan", netip.PrefixFrom(RouterLAN4, 24), netip.PrefixFrom(RouterLAN6, 64)); err != nil {
		return nil, err
	}
	if err := addrUp(h[b.Router], "wan", netip.PrefixFrom(RouterWAN4, 24), netip.PrefixFrom(RouterWAN6, 64)); err != nil {
		return nil, err
	}
	if err := addrUp(h[b.Server], "isp", netip.PrefixFrom(Server4, 24), netip.PrefixFrom(Server6, 64)); err != nil {
		return nil, err
	}
	if err := defaultRoutes(h[b.Server], "isp", RouterWAN4, RouterWAN6); err != nil {
		return nil, err
	}
	// The modem's loss would hit ARP and neighbour discovery too: a lost
	// exchange leaves the link dead for a second or more (85% of a
	// short run's pings lost, seen in CI). Known neighbours measure the
	// link, not the resolver.
	if err := pinNeighbours(h[b.Router], "wan", h[wanPeer], wanPeerDev, Server4, Server6); err != nil {
		return nil, err
	}
	if err := pinNeighbours(h[b.Server], "isp", h[ispPeer], ispPeerDev, RouterWAN4, RouterWAN6); err != nil {
		return nil, err
	}
	forwarders := []string{b.Router}
	if b.Modem != "" {
		forwarders = append(forwarders, b.Modem)
		if err := b.modemRoutes(h[b.Modem], h[b.Router], h[b.Server]); err != nil {
			return nil, err
		}
	}
	for _, ns := range forwarders {
		if err := InNetns(ns, func() error {
			for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
				if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	netem := im
	if relay {
		netem = impairment{} // the delay line carries it
	}
	if err := b.modem(topo.Modem, netem); err != nil {
		return nil, err
	}
	if st, _ := topo.Modem.stab(); st != nil {
		// A line that counts each packet needs packets: a GSO packet
		// is sized once for all its segments, by the shaper's table
		// and by the modem's (tbf splits one past its bucket and counts
		// the pieces without the table). One segment per packet from
		// every host that sends, as a DSL user's would be on the wire.
		for _, ns := range append([]string{b.Server, b.Router}, b.Clients...) {
			links, err := h[ns].LinkList()
			if err != nil {
				return nil, err
			}
			for _, l := range links {
				if l.Attrs().Name == "lo" {
					continue
				}
				if err := h[ns].LinkSetGSOMaxSegs(l, 1); err != nil {
					return nil, fmt.Errorf("%s: one segment per packet on %s: %w", ns, l.Attrs().Name, err)
				}
			}
		}
	}
	return b, nil
}

func (b *Bed) all() []string {
	all := append([]string{b.Router, b.Switch, b.Server}, b.Clients...)
	for _, ns := range []string{b.Modem, b.Wire} {
		if ns != "" {
			all = append(all, ns)
		}
	}
	return all
}

// modemRoutes makes the modem a router between its two devices with no
// addresses of its own: a host route to each side, and each side's
// addresses as permanent neighbours.
func (b *Bed) modemRoutes(m, router, server *netlink.Handle) error {
	for _, side := range []struct {
		dev, peerDev string
		peer         *netlink.Handle
		addrs        []netip.Addr
	}{{"router", "wan", router, []netip.Addr{RouterWAN4, RouterWAN6}}, {"isp", "isp", server, []netip.Addr{Server4, Server6}}} {
		if err := up(m, side.dev); err != nil {
			return err
		}
		l, err := m.LinkByName(side.dev)
		if err != nil {
			return err
		}
		for _, a := range side.addrs {
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}, Scope: netlink.SCOPE_LINK}
			if err := m.RouteAdd(r); err != nil {
				return fmt.Errorf("modem: route to %s: %w", a, err)
			}
		}
		if err := pinNeighbours(m, side.dev, side.peer, side.peerDev, side.addrs...); err != nil {
			return fmt.Errorf("modem: %w", err)
		}
	}
	// The LAN lies behind the router, everything else behind the server.
	rl, err := m.LinkByName("router")
	if err != nil {
		return err
	}
	il, err := m.LinkByName("isp")
	if err != nil {
		return err
	}
	for _, r := range []*netlink.Route{
		{LinkIndex: rl.Attrs().Index, Dst: prefixNet(LANPrefix4), Gw: RouterWAN4.AsSlice()},
		{LinkIndex: rl.Attrs().Index, Dst: prefixNet(LANPrefix6), Gw: RouterWAN6.AsSlice()},
		{LinkIndex: il.Attrs().Index, Gw: Server4.AsSlice()},
		{LinkIndex: il.Attrs().Index, Gw: Server6.AsSlice(), Family: unix.AF_INET6},
	} {
		if err := m.RouteAdd(r); err != nil {
			return fmt.Errorf("modem: route %v: %w", r, err)
		}
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func up(h *netlink.Handle, dev string) error {
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	return h.LinkSetUp(l)
}

func enslave(h *netlink.Handle, dev, master string) error {
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	m, err := h.LinkByName(master)
	if err != nil {
		return err
	}
	if err := h.LinkSetMaster(l, m); err != nil {
		return err
	}
	return h.LinkSetUp(l)
}

func addrUp(h *netlink.Handle, dev string, ps ...netip.Prefix) error {
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	for _, p := range ps {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", p, dev, err)
		}
	}
	return h.LinkSetUp(l)
}

// pinNeighbours makes the addresses of peer's peerDev permanent
// neighbours on h's dev.
func pinNeighbours(h *netlink.Handle, dev string, peer *netlink.Handle, peerDev string, addrs ...netip.Addr) error {
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	pl, err := peer.LinkByName(peerDev)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		n := &netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT, IP: a.AsSlice(), HardwareAddr: pl.Attrs().HardwareAddr, Family: unix.AF_INET}
		if a.Is6() {
			n.Family = unix.AF_INET6
		}
		if err := h.NeighSet(n); err != nil {
			return fmt.Errorf("neighbour %s on %s: %w", a, dev, err)
		}
	}
	return nil
}

func defaultRoutes(h *netlink.Handle, dev string, gws ...netip.Addr) error {
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	for _, gw := range gws {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
		if gw.Is6() {
			r.Family = unix.AF_INET6
		}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	return nil
}

// modemTbf is the modem's line toward dev at bps, its queue limit bytes.
func modemTbf(dev string, bps units.Rate, burst, limit uint32, stab *tc.Stab) *tc.Qdisc {
	return &tc.Qdisc{Dev: dev, Parent: tc.HandleRoot, Handle: tc.MakeHandle(1, 0), Kind: "tbf",
		Tbf: &tc.Tbf{Rate: bps, Burst: burst, Limit: limit}, Stab: stab}
}

// modemBurst is the modem's bucket at bps: 10 ms. A tbf loses the tokens
// beyond its bucket whenever its timer fires late, and under emulation
// (the stock-kernel lane) or on a loaded machine that is often more than
// a millisecond: with 1 ms the modem of 8.4mbit carried 7.8 Mbit/s while
// the router's classes were busy, below the 8mbit shaper behind it; with
// 10 ms, 8.2 to 8.6.
func modemBurst(bps units.Rate) uint32 { return uint32(max(bps.BytesIn(10*time.Millisecond), 3028)) }

// modemLimit is the modem's queue: buf at the topology's rate, in bytes,
// which a variable link keeps when its rate changes (a modem's buffer is
// memory: at a lower rate it holds more time, the bufferbloat a shaper
// in front must keep out of).
func modemLimit(bps units.Rate, buf time.Duration) uint32 {
	return uint32(max(bps.BytesIn(buf), 3*1514))
}

// SetModemRate changes the modem's line rate in one direction (up:
// toward the server; down: toward the router) while the bed runs, as a
// variable link's capacity changes: the queue stays Buffer long at the
// new rate. The direction must have a rate already.
func (b *Bed) SetModemRate(dir, rate string) error {
	if dir != "up" && dir != "down" {
		return fmt.Errorf("modem direction %q: want up or down", dir)
	}
	dev, had := "router", PhaseModem{Up: b.Topo.Modem.Up, Down: b.Topo.Modem.Down}.rate(dir)
	if dir == "up" {
		dev = "isp"
	}
	if b.Modem == "" || had == "" {
		return fmt.Errorf("the modem has no %s rate to change", dir)
	}
	bps, err := parseRate(rate)
	if err != nil {
		return fmt.Errorf("modem rate %q: %w", rate, err)
	}
	base, err := parseRate(had)
	if err != nil {
		return fmt.Errorf("modem rate %q: %w", had, err)
	}
	buf, err := b.Topo.Modem.buffer()
	if err != nil {
		return err
	}
	stab, err := b.Topo.Modem.stab()
	if err != nil {
		return err
	}
	// The bucket follows the rate, 10 ms of it, but never drops below a
	// packet the tbf may hold: tbf sends a queued packet only when the
	// bucket holds its length, and does not split what it queued before,
	// so a packet (a GSO segment) queued under a larger bucket would
	// wait forever (a bulk TCP flow stalled for good at 20 -> 5 Mbit/s
	// with the bucket cut to 10 ms of the new rate, Linux 6.18;
	// iproute2's `tc qdisc change` the same). A tbf splits a larger GSO
	// packet as it queues it, so what it holds is at most its bucket,
	// and at most the senders' GSO size, which the first change caps at
	// modemGSO (the lab's traffic starts after it). Before, the bucket
	// never shrank: after 100 Mbit/s the modem at 20 let 125 KB through
	// at once, 50 ms of its rate, and what passed over 200 ms read 12%
	// above the line.
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.modemBursts == nil {
		b.modemBursts = map[string]uint32{}
	}
	held := uint32(64 << 10) // a GSO packet queued before the cap
	if b.gsoCapped {
		held = modemGSO
	} else if err := b.capGSO(); err != nil {
		return err
	}
	cur := b.modemBursts[dir]
	if cur == 0 {
		cur = modemBurst(base)
	}
	burst := max(modemBurst(bps), min(cur, held))
	b.modemBursts[dir] = burst
	c, closeBed, err := openBed(b.Modem)
	if err != nil {
		return err
	}
	defer closeBed()
	if err := c.QdiscChange(modemTbf(dev, bps, burst, modemLimit(base, buf), stab)); err != nil {
		return fmt.Errorf("modem tbf on %s to %s: %w", dev, rate, err)
	}
	return nil
}

// modemGSO is the senders' GSO size once the modem's rate changes: the
// largest packet the modem's tbf may hold, so the least its bucket may
// be (8 KB: 33 ms at the lane's 2 Mbit/s, under 10 ms from 6.6 Mbit/s).
const modemGSO = 8 << 10

// capGSO caps the GSO size of every device that sends toward the modem
// (the clients', the router's, the server's) at modemGSO.
func (b *Bed) capGSO() error {
	type nsDev struct{ ns, dev string }
	devs := []nsDev{{b.Router, "lan"}, {b.Router, "wan"}, {b.Server, "isp"}}
	for _, c := range b.Clients {
		devs = append(devs, nsDev{c, "eth0"})
	}
	for _, d := range devs {
		if err := InNetns(d.ns, func() error {
			l, err := netlink.LinkByName(d.dev)
			if err != nil {
				return err
			}
			return netlink.LinkSetGSOMaxSize(l, modemGSO)
		}); err != nil {
			return fmt.Errorf("GSO size of %s in %s: %w", d.dev, d.ns, err)
		}
	}
	b.gsoCapped = true
	return nil
}

// buffer is the modem's queue, as time at its rate.
func (m Modem) buffer() (time.Duration, error) {
	if m.Buffer == "" {
		return 200 * time.Millisecond, nil
	}
	d, err := time.ParseDuration(m.Buffer)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("modem buffer %q: want a duration like 200ms", m.Buffer)
	}
	return d, nil
}

// modem emulates the link between the router and the server in the
// modem's namespace: a tbf on its device toward the router (downlink) and
// on its device toward the server (uplink), each with a queue of Buffer
// at its rate, as a modem has; with a delay or loss, a netem under each
// tbf (or alone). No impairment is none, or the delay line's (b.Wire) to
// carry.
func (b *Bed) modem(m Modem, im impairment) error {
	if b.Modem == "" {
		return nil
	}
	buf, err := m.buffer()
	if err != nil {
		return err
	}
	stab, err := m.stab()
	if err != nil {
		return err
	}
	c, closeBed, err := openBed(b.Modem)
	if err != nil {
		return err
	}
	defer closeBed()
	shape := func(dev, rate string) error {
		l, err := c.Links().LinkByName(dev)
		if err != nil {
			return err
		}
		parent := uint32(netlink.HANDLE_ROOT)
		if rate != "" {
			bps, err := parseRate(rate)
			if err != nil {
				return fmt.Errorf("modem rate %q: %w", rate, err)
			}
			if err := c.QdiscAdd(modemTbf(dev, bps, modemBurst(bps), modemLimit(bps, buf), stab), false); err != nil {
				return fmt.Errorf("modem tbf on %s: %w", dev, err)
			}
			parent = netlink.MakeHandle(1, 1)
		}
		if !im.none() {
			ne := netlink.NewNetem(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: parent, Handle: netlink.MakeHandle(10, 0)},
				netlink.NetemQdiscAttrs{Latency: uint32(im.delay.Microseconds()), Loss: float32(im.loss * 100), Limit: 100000})
			if err := c.Links().QdiscAdd(ne); err != nil {
				return fmt.Errorf("modem delay on %s: %w", dev, err)
			}
		}
		return nil
	}
	if m.Down != "" || !im.none() {
		if err := shape("router", m.Down); err != nil {
			return err
		}
	}
	if m.Up != "" || !im.none() {
		return shape("isp", m.Up)
	}
	return nil
}

// Down removes the bed's namespaces and sluice's records for its router.
func (b *Bed) Down() error {
	var errs []string
	b.delay.Close()
	for _, ns := range b.all() {
		if err := deleteNS(ns); err != nil {
			errs = append(errs, err.Error())
		}
	}
	os.RemoveAll(records.Dir(b.Router))
	if len(errs) > 0 {
		return fmt.Errorf("lab down: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Down removes the lab named name; DownAll every lab namespace (also
// those a crashed run left).
func Down(name string) ([]string, error) {
	return down(bedNS(name))
}

// DownAll removes every namespace with the lab prefix.
func DownAll() ([]string, error) { return down(listNS(Prefix)) }

func down(nss []string) ([]string, error) {
	var removed, errs []string
	for _, ns := range nss {
		if err := deleteNS(ns); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		removed = append(removed, ns)
		os.RemoveAll(records.Dir(ns))
	}
	if len(errs) > 0 {
		return removed, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return removed, nil
}

// Hold claims test bed name for one run until release. A second run on
// the bed (lab run --name of a bed in use, two demos at once) attached
// to the first one's namespaces: it reset the first one's policy under
// its traffic, then failed to bind its ports. Take it before Up or
// Attach: of two runs, only the one that holds it builds the bed.
func Hold(name string) (release func(), err error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	l, err := records.AcquireLabLock(records.Dir(""), name)
	if err != nil {
		return nil, fmt.Errorf("test bed %s: %w", name, err)
	}
	return l.Release, nil
}

// checkName refuses a lab name that cannot prefix the bed's namespaces
// or name its lock file.
func checkName(name string) error {
	if strings.ContainsAny(name, "/ ") || name == "" || name == "." || name == ".." {
		return fmt.Errorf("lab name %q: use letters, digits and dashes", name)
	}
	return nil
}

// Attach returns a Bed for namespaces that are already up.
func Attach(name string) (*Bed, error) {
	nss := bedNS(name)
	if len(nss) == 0 {
		return nil, fmt.Errorf("no lab named %q is up (sluice lab up SCENARIO)", name)
	}
	n := 0
	for _, ns := range nss {
		var i int
		if _, err := fmt.Sscanf(strings.TrimPrefix(ns, Prefix+name+"-"), "c%d", &i); err == nil && i > n {
			n = i
		}
	}
	b := bedNames(name, n)
	b.Topo.Clients = n
	for _, ns := range nss {
		switch ns {
		case Prefix + name + "-modem":
			b.Modem = ns
		case Prefix + name + "-wire":
			b.Wire = ns
		}
	}
	return b, nil
}
