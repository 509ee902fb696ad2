package main

import (
	"fmt"
	"io"

	"flusherd/client"
	"flusherd/internal/cli"
)

func cmdDirty(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("dirty", "dirty [--config FILE] [--stats-dir DIR] [--top N] [--json]\n\n"+
		"The files the running daemon tracks, oldest dirty data first: age of the dirty\n"+
		"data, device, list (b_dirty, b_io, b_more_io, b_more_io_wait, or failed: data\n"+
		"lost after a failed writeback), dirty and writeback pages (cachestat, now),\n"+
		"attempts since last clean, and the last error. --top defaults to 20; when more\n"+
		"files are tracked, a line on standard error says how many.",
		"flusherd dirty --top 10\n  flusherd dirty --json | jq '.[] | select(.list == \"b_more_io_wait\")'", stdout, stderr)
	var c commonFlags
	c.register(fset)
	top := fset.Int("top", 20, "show the N oldest files (0: all)")
	asJSON := fset.Bool("json", false, "print a JSON array (the control socket's DirtyFile objects)")
	if code, stop := cli.ParseFlags(fset, args); stop {
		return code
	}
	if *top < 0 {
		fmt.Fprintln(stderr, "flusherd dirty: --top must not be negative")
		return cli.ExitUsage
	}
	cfg, err := loadClientConfig(c)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd dirty: %v\n", err)
		return cli.ExitUsage
	}
	return client.Dirty(cfg.Stats.Dir, *top, *asJSON, stdout, stderr)
}
