// Command sluice shapes Linux network traffic from a declarative policy.
// See README.md, or run `sluice --help`.
package main

import (
	"os"

	"sluice/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
