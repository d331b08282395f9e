package agent

import (
	"net/netip"
	"strings"
	"testing"

	"sluice/testutil"
)

// routes says where a namespace sends an address, as `ip route get`
// does: a pod's /32 on its veth, an address behind a gateway with the
// gateway, an address of a bridge's subnet on the bridge; the
// namespace's own address and an address without a route are errors.
func TestRoutesLookup(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetns(t, "r")
	sh := func(args ...string) { t.Helper(); testutil.NS(t, ns, "ip", args...) }
	sh("link", "add", "calia", "type", "veth", "peer", "name", "caliap")
	sh("link", "set", "calia", "up")
	sh("link", "set", "caliap", "up")
	sh("route", "add", "10.66.0.2/32", "dev", "calia")
	sh("link", "add", "cni0", "type", "bridge")
	sh("addr", "add", "10.66.1.1/24", "dev", "cni0")
	sh("link", "set", "cni0", "up")
	sh("route", "add", "10.70.0.0/16", "via", "10.66.1.254")
	r, err := openRoutes(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, c := range []struct {
		addr, dev, kind, gw, err string
	}{
		{addr: "10.66.0.2", dev: "calia", kind: "veth"},
		{addr: "10.66.1.7", dev: "cni0", kind: "bridge"},
		{addr: "10.70.3.4", dev: "cni0", kind: "bridge", gw: "10.66.1.254"},
		{addr: "10.66.1.1", err: "an address of this namespace"},
		{addr: "192.0.2.1", err: "route to 192.0.2.1"},
	} {
		rt, err := r.Lookup(netip.MustParseAddr(c.addr))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %+v, %v; want an error with %q", c.addr, rt, err, c.err)
			}
			continue
		}
		gw := ""
		if rt.Gateway.IsValid() {
			gw = rt.Gateway.String()
		}
		if err != nil || rt.Device != c.dev || rt.Kind != c.kind || gw != c.gw {
			t.Errorf("%s: %+v (gateway %q), %v; want %s, a %s, gateway %q", c.addr, rt, gw, err, c.dev, c.kind, c.gw)
		}
	}
}
