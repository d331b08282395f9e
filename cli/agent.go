package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"sluice/agent"
	"sluice/kube"
	"sluice/records"
)

func agentCmd(g *globals) *cobra.Command {
	var cfg agent.Config
	var logFormat, logLevel string
	var kubernetes bool
	var kubeconfig, node string
	cmd := &cobra.Command{
		Use:   "agent POLICY",
		Short: "Keep POLICY applied, repair drift, reload edits; serve metrics and a live dashboard",
		Long: `agent applies POLICY and keeps the kernel at it: every --interval it reads
every tree back and repairs what changed behind its back (a class changed
with tc, a root qdisc replaced, a device that went and came back, a BPF
program detached), logging and counting each repair. Interfaces that do
not exist are waited for; the others are shaped.

An edit of POLICY (or of a hosts_file it names) is applied within a
second, with exactly the semantics of 'sluice apply'; so is SIGHUP. A
policy that does not validate is refused, its errors logged and shown at
/api/v1/status, and the one in force stays.

With --listen it serves Prometheus metrics at /metrics, its status as JSON
at /api/v1/status (and the charts' data at /api/v1/history), /healthz,
and a live dashboard at /. 'sluice show' asks a running agent.

With --kubernetes it lists this node's pods (in the cluster, or with
--kubeconfig) and makes each pod with a bandwidth annotation a host of
the policy's pods classes (per_host: {pods: egress|ingress}): an
annotation edited takes effect live, a pod deleted leaves. See
docs/kubernetes.md.

SIGTERM or SIGINT stops it within 2 s, leaving the shaping in place, or
removing what it applied with --reset-on-exit. A second agent on the same
namespace is refused. See docs/agent.md.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f := cmd.Flags().Lookup("netns"); f != nil && f.Changed {
				if err := records.ValidNetnsName(g.netns); err != nil {
					return badInput(fmt.Errorf("--netns: %w", err))
				}
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return badInput(fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel))
			}
			hopts := &slog.HandlerOptions{Level: level}
			switch logFormat {
			case "text":
				cfg.Log = slog.New(slog.NewTextHandler(g.stderr, hopts))
			case "json":
				cfg.Log = slog.New(slog.NewJSONHandler(g.stderr, hopts))
			default:
				return badInput(fmt.Errorf("--log-format %q: want text or json", logFormat))
			}
			cfg.Policy, cfg.Netns = args[0], g.netns
			if !kubernetes && (kubeconfig != "" || node != "") {
				return badInput(errors.New("--kubeconfig and --node go with --kubernetes"))
			}
			if kubernetes {
				n, err := kube.NodeName(node)
				if err != nil {
					return badInput(err)
				}
				client, err := kube.Client(kubeconfig)
				if err != nil {
					return badInput(err)
				}
				cfg.Kubernetes = &kube.Config{Client: client, Node: n}
			}
			a, err := agent.New(cfg)
			if err != nil {
				if errors.Is(err, records.ErrAgentRunning) {
					return failure(err)
				}
				return classify(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			sigs := make(chan os.Signal, 4)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
			defer signal.Stop(sigs)
			go func() {
				for s := range sigs {
					if s == syscall.SIGHUP {
						a.Reload()
						continue
					}
					cfg.Log.Info("stopping", "signal", s.String())
					cancel()
					return
				}
			}()
			if err := a.Run(ctx); err != nil {
				return failure(err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:9464", "HTTP address for /metrics, /api/v1/status and the dashboard (\"\": none)")
	f.StringSliceVar(&cfg.AllowHosts, "allow-host", nil, "a name the HTTP server answers to besides IP addresses, localhost and this machine's name (repeatable; others get 421: DNS rebinding)")
	f.DurationVar(&cfg.Interval, "interval", time.Second, "time between reconcile passes (100ms to 1h)")
	f.BoolVar(&cfg.ResetOnExit, "reset-on-exit", false, "remove what the agent applied when it stops")
	f.BoolVar(&cfg.HostMetrics, "host-metrics", false, "export per-host classes with a host label (one series per host)")
	f.BoolVar(&kubernetes, "kubernetes", false, "take the hosts of pods classes from this node's pods and their bandwidth annotations")
	f.StringVar(&kubeconfig, "kubeconfig", "", "with --kubernetes: the kubeconfig file (default: the pod's service account, in the cluster)")
	f.StringVar(&node, "node", "", "with --kubernetes: this node's name (default: $NODE_NAME, else the host name)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}
