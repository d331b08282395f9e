package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"sluice/engine"
	"sluice/features"
	"sluice/kernel"
	"sluice/migrate"
	"sluice/records"
)

// readLive reads dev (and the ifb its ingress is redirected to) in the
// namespace ns.
func readLive(ns, dev string) (*migrate.Live, error) {
	c, err := kernel.OpenReader(ns)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if !c.LinkExists(dev) {
		return nil, fmt.Errorf("import tc: no device %q here", dev)
	}
	s, err := c.Snapshot(dev)
	if err != nil {
		return nil, err
	}
	live := &migrate.Live{Dev: s, IfbName: c.IngressRedirect(s)}
	if live.IfbName != "" {
		if live.Ingress, err = c.Snapshot(live.IfbName); err != nil {
			return nil, err
		}
	}
	return live, nil
}

// planImport ends an import with the plan against the live kernel
// (the namespace --netns names): what applying it would change. It
// needs root and the policy's devices; without them it says so.
func (g *globals) planImport(cmd *cobra.Command, file, shown string) {
	if !privileged() {
		fmt.Fprintln(g.stderr, "(as root, import also shows the plan against the live kernel)")
		return
	}
	o, err := g.engineOptions(cmd)
	if err != nil {
		return
	}
	o.SkipMissing = true
	o.Warn = func(string) {} // the policy's warnings were the report's
	p, err := engine.Plan(file, o)
	if err != nil {
		msg := err.Error()
		if shown == "" {
			msg = strings.ReplaceAll(msg, file, "(the imported policy)")
		}
		fmt.Fprintf(g.stderr, "plan against the live kernel: %s\n", msg)
		return
	}
	defer p.Close()
	if len(p.Missing) > 0 {
		fmt.Fprintf(g.stderr, "not on this host (left out of the plan): %s\n", strings.Join(p.Missing, ", "))
	}
	if len(p.Plan.Devices) == 0 {
		return
	}
	how := "sluice apply " + shown
	if shown == "" {
		how = "sluice apply on the policy"
	}
	fmt.Fprintf(g.stderr, "plan against the live kernel (%s makes it):\n%s", how, p.Summary())
}

// importFormats are the formats `sluice import` reads.
var importFormats = []string{"htb.init", "wondershaper", "tc", "libreqos", "sqm", "fireqos"}

func importCmd(g *globals) *cobra.Command {
	var dir string
	var strict bool
	var opt migrate.Options
	var lqosConfig string
	var keepLeaves bool
	cmd := &cobra.Command{
		Use:   "import FORMAT SOURCE [-o DIR] | import wondershaper -- COMMAND LINE",
		Short: "Convert another tool's configuration into a sluice policy, with a report of what carried over",
		Long: `import reads the configuration of another shaping tool and writes the
sluice policy that does the same, with a comment on every class naming
the file, line and id it came from. The report (on standard error)
lists every construct: mapped exactly, approximated (and how), or
refused (FILE:LINE: why). A refusal writes nothing and exits 2;
--strict refuses approximations too. The policy is validated before it
is written.

Formats:
  tc            SOURCE is a live device (--netns for another namespace):
                its HTB tree, leaves and u32, fw, flower and matchall
                filters, as a hand-written script built them, and the
                ifb its ingress redirects to
  htb.init      SOURCE is the configuration directory (/etc/sysconfig/htb)
  fireqos       SOURCE is FireQOS's configuration (/etc/firehol/fireqos.conf):
                interfaces, classes, class groups and matches, read
                as literal statements with $VARIABLES (loops, functions
                and conditions are refused at their line)
  sqm           SOURCE is sqm-scripts' configuration: OpenWrt's
                /etc/config/sqm, or elsewhere the directory /etc/sqm
                (default.conf and each DEV.iface.conf), one
                DEV.iface.conf, or default.conf with --interface DEV:
                each enabled queue's interface, rates, qdisc and link
                layer, for simplest.qos, simple.qos, piece_of_cake.qos
                and layer_cake.qos
  libreqos      SOURCE is the directory of ShapedDevices.csv and network.json;
                the interfaces and capacities come from lqos.conf or
                ispConfig.py there, /etc/lqos.conf, or --config. The
                circuits become hosts files: -o is required
  wondershaper  SOURCE is a wondershaper script (LARTC's wshaper or
                wshaper.htb) or 1.4.1's wondershaper.conf; or give the
                command line that ran it after --:
                  sluice import wondershaper -- wondershaper eth0 800 220
                  sluice import wondershaper -- wondershaper -a eth0 -d 1024 -u 512

Without -o the policy goes to standard output. docs/migrating.md has a
worked example per tool and how to prove the result in the lab.`,
		Example: `  sluice import htb.init /etc/sysconfig/htb -o /etc/sluice
  sluice import libreqos /opt/libreqos/src -o /etc/sluice
  sluice import wondershaper -- wondershaper ppp0 800 220 > policy.yaml`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, rest := args[0], args[1:]
			var cmdline []string
			if at := cmd.ArgsLenAtDash(); at >= 0 {
				if at < 1 {
					return badInput(errors.New("import: the format comes before --"))
				}
				cmdline, rest = args[at:], args[1:at]
			}
			var d *migrate.Draft
			var err error
			if opt.Interface != "" && format != "sqm" {
				return badInput(fmt.Errorf("import %s: --interface is for sqm's shell configuration; %s's configuration names its devices", format, format))
			}
			switch format {
			case "htb.init":
				if len(rest) != 1 || cmdline != nil {
					return badInput(errors.New("import htb.init: want one SOURCE, the configuration directory"))
				}
				d, err = migrate.HTBInit(rest[0], opt)
			case "wondershaper":
				switch {
				case cmdline != nil && len(rest) == 0:
					if len(cmdline) == 0 {
						return badInput(errors.New("import wondershaper: nothing after --"))
					}
					d, err = migrate.Wondershaper("", cmdline, opt)
				case cmdline == nil && len(rest) == 1:
					d, err = migrate.Wondershaper(rest[0], nil, opt)
				default:
					return badInput(errors.New("import wondershaper: want a script or conf file, or the command line after --"))
				}
			case "fireqos":
				if len(rest) != 1 || cmdline != nil {
					return badInput(errors.New("import fireqos: want one SOURCE, FireQOS's configuration (/etc/firehol/fireqos.conf)"))
				}
				d, err = migrate.FireQOS(rest[0], opt)
			case "sqm":
				if len(rest) != 1 || cmdline != nil {
					return badInput(errors.New("import sqm: want one SOURCE, sqm's configuration (/etc/config/sqm, or /etc/sqm)"))
				}
				d, err = migrate.SQM(rest[0], opt)
			case "libreqos":
				if len(rest) != 1 || cmdline != nil {
					return badInput(errors.New("import libreqos: want one SOURCE, the directory of ShapedDevices.csv and network.json"))
				}
				d, err = migrate.LibreQoS(rest[0], lqosConfig)
			case "tc":
				if len(rest) != 1 || cmdline != nil {
					return badInput(errors.New("import tc: want one SOURCE, the device (--netns for another namespace)"))
				}
				if !privileged() {
					return failure(errors.New("import tc reads the kernel's traffic control: it needs root (or CAP_NET_ADMIN)"))
				}
				live, err := readLive(g.netns, rest[0])
				if err != nil {
					return failure(err)
				}
				d, err = migrate.TC(live, opt)
				if err != nil {
					return badInput(err)
				}
			default:
				return badInput(fmt.Errorf("import: unknown format %q; sluice imports %s", format, strings.Join(importFormats, ", ")))
			}
			if err != nil {
				return badInput(err)
			}
			if !keepLeaves && privileged() {
				// The leaves the old tool used that this kernel lacks
				// become auto (reported): the policy applies here.
				if rep, err := features.ProbeCached(records.Dir("")); err == nil {
					d.FitLeaves(func(kind string) bool { return rep.Qdiscs[kind] })
				}
			}
			fmt.Fprint(g.stderr, d.Report.String())
			if err := d.Report.Refusals(); err != nil {
				return badInput(err)
			}
			if dir == "" {
				if len(d.Hosts) > 0 {
					return badInput(errors.New("import: this policy comes with hosts files; give -o DIR"))
				}
				if strict && d.Report.Count(migrate.Approximated) > 0 {
					return badInput(fmt.Errorf("--strict: %d construct(s) were approximated (see the report)", d.Report.Count(migrate.Approximated)))
				}
				if err := d.Check(); err != nil {
					return failure(err)
				}
				if _, err := g.stdout.Write(d.Render()); err != nil {
					return err
				}
				tmp, err := os.CreateTemp("", "sluice-import-*.yaml")
				if err == nil {
					defer os.Remove(tmp.Name())
					tmp.Write(d.Render())
					tmp.Close()
					g.planImport(cmd, tmp.Name(), "")
				}
				return nil
			}
			file, err := d.Write(dir, strict)
			if err != nil {
				var re *migrate.RefusedError
				if errors.As(err, &re) || strings.HasPrefix(err.Error(), "--strict") {
					return badInput(err)
				}
				return failure(err)
			}
			fmt.Fprintf(g.stderr, "wrote %s\n", file)
			g.planImport(cmd, file, file)
			return nil
		},
	}
	cmd.Flags().StringVarP(&dir, "output", "o", "", "write policy.yaml (and hosts files) into `DIR` instead of printing the policy")
	cmd.Flags().BoolVar(&keepLeaves, "keep-leaves", false, "keep the old tool's leaf qdiscs even where this kernel lacks them (a policy for another host); by default, as root, such a leaf becomes auto and the report says so")
	cmd.Flags().BoolVar(&strict, "strict", false, "refuse the import if anything was approximated")
	cmd.Flags().StringVar(&lqosConfig, "config", "", "libreqos: the settings `FILE` (lqos.conf or ispConfig.py)")
	cmd.Flags().StringVar(&opt.Interface, "interface", "", "sqm: the `DEV` its shell configuration applies to (default.conf alone, as sqm@DEV reads it)")
	cmd.Flags().BoolVar(&opt.IPv4Only, "ipv4-only", false, "classify IPv4 alone, as the old tools did: rules without addresses do not match IPv6")
	return cmd
}
