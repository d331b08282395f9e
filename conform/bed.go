package conform

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sluice/lab"
	"sluice/records"
)

// The bed: a gateway namespace that has the policy's devices, each
// wired to a namespace of its own beyond it ("far"), and one more device
// toward a namespace on its other side ("near"). A flow of an egress
// tree goes near -> gateway -> DEV -> far, of an ingress tree far -> DEV
// -> gateway -> near, so every packet the policy sees is forwarded, as
// on a real gateway, and no sender's socket holds a queue of the
// gateway's (TCP small queues would count it).
//
//	near ── [slnear  gateway  DEV] ── [wire r|s] ── far (one per device)
//
// With a round-trip time, the wire is sluice's delay line (lab): it
// holds every frame half the RTT each way, beyond the shaper, so TCP
// sees a WAN's RTT while the gateway sees its packets at once.
type bed struct {
	name     string
	gw, near string
	nearDev  string            // the gateway's device toward near
	far      map[string]string // policy device -> its far namespace
	wire     map[string]string // policy device -> its delay line's namespace
	lines    []io.Closer
}

const peerDev = "peer" // each far and near namespace's one device

// newBed builds the bed for devices devs (queues: transmit queues of
// each, 0 for one) with a round trip of rtt beyond each device.
func newBed(name string, devs []string, queues map[string]int, rtt time.Duration) (b *bed, err error) {
	if strings.ContainsAny(name, "/ ") || name == "" || len(name) > 20 {
		return nil, fmt.Errorf("bed name %q: letters, digits and dashes, at most 20", name)
	}
	pre := lab.Prefix + name + "-"
	if len(lab.BedNetns(name)) > 0 {
		return nil, fmt.Errorf("a bed named %q is already up (sluice lab down %s)", name, name)
	}
	b = &bed{name: name, gw: pre + "gw", near: pre + "near", far: map[string]string{}, wire: map[string]string{}}
	// Every failure returns a nil bed: the deferred down works on built
	// (on b it found nil, panicked, and left the namespaces behind).
	built := b
	defer func() {
		if err != nil {
			built.down()
		}
	}()
	b.nearDev = "slnear"
	for taken := true; taken; {
		taken = false
		for _, d := range devs {
			if d == b.nearDev {
				b.nearDev += "x"
				taken = true
			}
		}
	}
	nss := []string{b.gw, b.near}
	for i, d := range devs {
		if d == "lo" {
			return nil, fmt.Errorf("device lo cannot be shaped in a bed")
		}
		b.far[d] = fmt.Sprintf("%sfar%d", pre, i)
		nss = append(nss, b.far[d])
		if rtt > 0 {
			b.wire[d] = fmt.Sprintf("%swire%d", pre, i)
			nss = append(nss, b.wire[d])
		}
	}
	for _, ns := range nss {
		if err := lab.CreateNetns(ns); err != nil {
			return nil, err
		}
	}
	if err := lab.Veth(b.gw, b.nearDev, b.near, peerDev, 0); err != nil {
		return nil, err
	}
	for _, d := range devs {
		if rtt <= 0 {
			if err := lab.Veth(b.gw, d, b.far[d], peerDev, queues[d]); err != nil {
				return nil, err
			}
			continue
		}
		if err := lab.Veth(b.gw, d, b.wire[d], "r", queues[d]); err != nil {
			return nil, err
		}
		if err := lab.Veth(b.wire[d], "s", b.far[d], peerDev, 0); err != nil {
			return nil, err
		}
		line, err := lab.StartDelayLine(b.wire[d], rtt/2)
		if err != nil {
			return nil, err
		}
		b.lines = append(b.lines, line)
	}
	for _, ns := range nss {
		if err := lab.Addrs(ns, "lo"); err != nil {
			return nil, err
		}
	}
	if err := lab.Forwarding(b.gw); err != nil {
		return nil, err
	}
	return b, nil
}

// down removes every namespace of the bed, and what sluice recorded for
// its gateway.
func (b *bed) down() {
	for _, l := range b.lines {
		l.Close()
	}
	for _, ns := range lab.BedNetns(b.name) {
		lab.DeleteNetns(ns)
	}
	os.RemoveAll(records.Dir(b.gw))
	os.RemoveAll(filepath.Join(os.TempDir(), "sluice-conform-"+b.name))
}

// ends are where a tree's flows start and end: for egress, near sends
// and the device's far namespace receives; for ingress the other way.
func (b *bed) ends(dev, dir string) (sendNS, recvNS string) {
	if dir == "ingress" {
		return b.far[dev], b.near
	}
	return b.near, b.far[dev]
}

// route gives the flows' addresses to their ends and routes them
// through the gateway (del: takes them away again).
func (b *bed) route(dev, dir string, flows []Flow, del bool) error {
	var src, dst []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, f := range flows {
		for _, x := range []struct {
			a   netip.Addr
			out *[]netip.Addr
		}{{f.Src.Addr(), &src}, {f.Dst.Addr(), &dst}} {
			if !seen[x.a] {
				seen[x.a] = true
				*x.out = append(*x.out, x.a)
			}
		}
	}
	nearAddrs, farAddrs := src, dst
	if dir == "ingress" {
		nearAddrs, farAddrs = dst, src
	}
	far := b.far[dev]
	steps := []func() error{
		func() error { return lab.Routes(b.gw, b.nearDev, b.near, peerDev, del, nearAddrs...) },
		func() error { return lab.Routes(b.gw, dev, far, peerDev, del, farAddrs...) },
		func() error { return lab.Routes(b.near, peerDev, b.gw, b.nearDev, del, farAddrs...) },
		func() error { return lab.Routes(far, peerDev, b.gw, dev, del, nearAddrs...) },
	}
	if del {
		for _, s := range steps {
			s()
		}
		lab.DelAddrs(b.near, peerDev, nearAddrs...)
		lab.DelAddrs(far, peerDev, farAddrs...)
		return nil
	}
	if len(nearAddrs) > 0 {
		if err := lab.Addrs(b.near, peerDev, nearAddrs...); err != nil {
			return err
		}
	}
	if len(farAddrs) > 0 {
		if err := lab.Addrs(far, peerDev, farAddrs...); err != nil {
			return err
		}
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// mark has the gateway set the firewall mark of each flow that carries
// one (del: removes the bed's marking).
func (b *bed) mark(flows []Flow, del bool) error {
	var mf []lab.MarkedFlow
	for _, f := range flows {
		if f.Mark != 0 {
			proto := f.Proto
			if rawTCP(proto) {
				proto = "tcp"
			}
			mf = append(mf, lab.MarkedFlow{Proto: proto, Src: f.Src, Dst: f.Dst, Mark: f.Mark})
		}
	}
	if len(mf) == 0 {
		return nil
	}
	return lab.MarkFlows(b.gw, mf, del)
}

// sink ends the raw ACKs and SYNs among flows once the shaper has
// counted them: an egress tree's at the wire's door, where the delay
// line lets them fall out rather than relay them (lab.BypassLine), any
// other in the namespace they reach (lab.SinkRawFlows), so that none
// draws a reset back through the bed. del takes that away.
func (b *bed) sink(dev, dir string, flows []Flow, del bool) error {
	var raw []lab.RawFlow
	for _, f := range flows {
		if rawTCP(f.Proto) {
			raw = append(raw, lab.RawFlow{Src: f.Src, Dst: f.Dst})
		}
	}
	if len(raw) == 0 {
		return nil
	}
	if w := b.wire[dev]; w != "" && dir != "ingress" {
		return lab.BypassLine(w, raw, del)
	}
	_, recv := b.ends(dev, dir)
	return lab.SinkRawFlows(recv, raw, del)
}
