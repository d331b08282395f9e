package agent

import (
	"fmt"
	"net/netip"

	"sluice/tc"
)

// routes looks up, read only, which device of a namespace its routes
// send an address through: how the agent finds a pod's own veth for
// pod_veths (a CNI routes each pod's address to the host side of its
// veth).
type routes struct{ conn *tc.Conn }

// openRoutes reads the routes of network namespace ns ("": the
// caller's).
func openRoutes(ns string) (*routes, error) {
	c, err := tc.Open(ns)
	if err != nil {
		return nil, err
	}
	return &routes{conn: c}, nil
}

// Close releases the namespace's handle.
func (r *routes) Close() { r.conn.Close() }

// route is where an address is sent: its device (name and kind: veth,
// bridge, ...) and the gateway, where it is not on that device's link.
type route struct {
	Device, Kind string
	Gateway      netip.Addr
}

// Lookup says where the namespace sends a.
func (r *routes) Lookup(a netip.Addr) (route, error) {
	l, gw, err := r.conn.RouteVia(a.AsSlice())
	if err != nil {
		return route{}, fmt.Errorf("route to %s: %w", a, err)
	}
	out := route{Device: l.Name, Kind: l.Kind}
	if g, ok := netip.AddrFromSlice(gw); ok && !g.IsUnspecified() {
		out.Gateway = g.Unmap()
	}
	return out, nil
}
