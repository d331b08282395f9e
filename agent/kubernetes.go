package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"sluice/engine"
	"sluice/kube"
	"sluice/policy"
)

// KubeSync is how long an agent waits at start for the first list of
// its node's pods: it applies nothing before, so that a restart does
// not shape the pods as if there were none.
const KubeSync = time.Minute

// startKube lists this node's pods and writes the pods files of pol's
// pods classes, before the policy is loaded again from them (New).
func (a *Agent) startKube(pol *policy.Policy) (*policy.Policy, error) {
	kc := *a.cfg.Kubernetes
	kc.Log = a.log
	kc.Changed = a.kickFiles
	pr := &podRoutes{ns: a.cfg.Netns}
	if kc.Device == nil {
		kc.Device = pr.device
	}
	a.kube = kube.New(kc)
	ctx, cancel := context.WithCancel(context.Background())
	a.stopKube = func() {
		cancel()
		pr.close()
	}
	if err := a.kube.Start(ctx, KubeSync); err != nil {
		return nil, err
	}
	if err := a.kube.SetTargets(kube.Targets(pol)); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	a.log.Info("kubernetes: pods listed", "node", kc.Node, "pods", len(a.kube.Pods()), "files", len(kube.Targets(pol)))
	return engine.Load(a.cfg.Policy, a.opts)
}

// kickFiles asks the loop to look at the policy's files now: the pods
// files were written.
func (a *Agent) kickFiles() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// kubeTargets keeps the pods files of pols' pods classes (the policy in
// force, and one being reloaded).
func (a *Agent) kubeTargets(pols ...*policy.Policy) {
	if a.kube == nil {
		return
	}
	var ts []kube.Target
	seen := map[string]bool{}
	for _, p := range pols {
		for _, t := range kube.Targets(p) {
			if !seen[t.File] {
				seen[t.File] = true
				ts = append(ts, t)
			}
		}
	}
	if err := a.kube.SetTargets(ts); err != nil {
		a.log.Error("kubernetes: writing the pods files failed", "err", err.Error())
	}
}

// podRoutes finds a pod's own device for pod_veths (kube.DeviceFunc):
// each of its addresses routed straight (no gateway) through one veth
// (or netkit) device of the node. The node's routes are opened at the
// first lookup and closed when the watch stops.
type podRoutes struct {
	mu     sync.Mutex
	ns     string
	r      *routes
	closed bool
}

func (p *podRoutes) device(addrs []netip.Addr) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return "", errors.New("the agent is stopping")
	}
	if p.r == nil {
		r, err := openRoutes(p.ns)
		if err != nil {
			return "", err
		}
		p.r = r
	}
	dev := ""
	for _, a := range addrs {
		rt, err := p.r.Lookup(a)
		switch {
		case err != nil:
			return "", err
		case rt.Gateway.IsValid():
			return "", fmt.Errorf("%s is routed through gateway %s on %s: %w", a, rt.Gateway, rt.Device, kube.ErrNotOwn)
		case rt.Kind != "veth" && rt.Kind != "netkit":
			return "", fmt.Errorf("%s is routed through %s, a %s device: %w", a, rt.Device, rt.Kind, kube.ErrNotOwn)
		case dev != "" && rt.Device != dev:
			return "", fmt.Errorf("the pod's addresses are routed through %s and %s: %w", dev, rt.Device, kube.ErrNotOwn)
		}
		dev = rt.Device
	}
	if dev == "" {
		return "", errors.New("the pod has no address")
	}
	return dev, nil
}

func (p *podRoutes) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.r != nil {
		p.r.Close()
	}
	p.closed = true
}
