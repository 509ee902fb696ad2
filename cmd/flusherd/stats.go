package main

import (
	"fmt"
	"io"

	"flusherd/client"
	"flusherd/internal/cli"
)

func cmdStats(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("stats", "stats [--config FILE] [--stats-dir DIR] [--files] [DEV]\n\n"+
		"Each device's statistics in the kernel's debugfs bdi stats layout: live from the\n"+
		"running daemon, or from its stats files when it does not answer (or with --files).\n"+
		"DEV (a bdi name such as 7:0 or 8:0) limits the output to that device.",
		"flusherd stats\n  flusherd stats --stats-dir /run/flusherd 7:0", stdout, stderr)
	var c cli.ConfigFlags
	c.Register(fset)
	filesOnly := fset.Bool("files", false, "read the stats files; do not ask the daemon")
	pos, err := cli.ParseArgs(fset, args)
	if err != nil {
		return cli.ParseExit(err)
	}
	if len(pos) > 1 {
		fmt.Fprintf(stderr, "flusherd stats: at most one DEV, got %q\n", pos)
		return cli.ExitUsage
	}
	dev := ""
	if len(pos) == 1 {
		dev = pos[0]
	}
	cfg, err := c.LoadClient("stats", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd stats: %v\n", err)
		return cli.ExitUsage
	}
	return client.Stats(cfg.Stats.Dir, dev, *filesOnly, stdout, stderr)
}
