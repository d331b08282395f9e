package cli

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"sluice/version"
)

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print sluice's version, the commit it was built from, and Go's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintf(g.stdout, "sluice %s (commit %s, %s, %s/%s)\n", version.String(), version.Commit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
