package agent

import (
	"context"
	"fmt"
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
	a.kube = kube.New(kc)
	ctx, cancel := context.WithCancel(context.Background())
	a.stopKube = cancel
	if err := a.kube.Start(ctx, KubeSync); err != nil {
		cancel()
		return nil, err
	}
	if err := a.kube.SetTargets(kube.Targets(pol)); err != nil {
		cancel()
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
