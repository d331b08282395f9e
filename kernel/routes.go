package kernel

import (
	"fmt"
	"net/netip"

	"sluice/tc"
)

// Routes looks up, read only, which device of a namespace its routes
// send an address through: how the agent finds a pod's own veth for
// pod_veths (a CNI routes each pod's address to the host side of its
// veth).
type Routes struct{ conn *tc.Conn }

// OpenRoutes reads the routes of network namespace ns ("": the
// caller's).
func OpenRoutes(ns string) (*Routes, error) {
	c, err := tc.Open(ns)
	if err != nil {
		return nil, err
	}
	return &Routes{conn: c}, nil
}

// Close releases the namespace's handle.
func (r *Routes) Close() { r.conn.Close() }

// Route is where an address is sent: its device (name and kind: veth,
// bridge, ...) and the gateway, where it is not on that device's link.
type Route struct {
	Device, Kind string
	Gateway      netip.Addr
}

// Lookup says where the namespace sends a.
func (r *Routes) Lookup(a netip.Addr) (Route, error) {
	l, gw, err := r.conn.RouteVia(a.AsSlice())
	if err != nil {
		return Route{}, fmt.Errorf("route to %s: %w", a, err)
	}
	out := Route{Device: l.Name, Kind: l.Kind}
	if g, ok := netip.AddrFromSlice(gw); ok && !g.IsUnspecified() {
		out.Gateway = g.Unmap()
	}
	return out, nil
}
