package main

import (
	"fmt"
	"io"
	"path/filepath"

	"flusherd/client"
	"flusherd/internal/cli"
)

func cmdDirty(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("dirty", "dirty [--config FILE] [--stats-dir DIR] [--top N] [--json] [PATH...]\n\n"+
		"The files the running daemon tracks (with PATHs, only those that are one of\n"+
		"them or below one), oldest dirty data first: age of the dirty\n"+
		"data, device, list (b_dirty, b_io, b_more_io, b_more_io_wait, or failed: data\n"+
		"lost after a failed writeback), dirty and writeback pages (cachestat, now),\n"+
		"attempts since last clean, and the last error. --top defaults to 20; when more\n"+
		"files are tracked, a line on standard error says how many.",
		"flusherd dirty --top 10\n  flusherd dirty /srv/spool\n  flusherd dirty --json | jq '.[] | select(.list == \"b_more_io_wait\")'", stdout, stderr)
	var c cli.ConfigFlags
	c.Register(fset)
	top := fset.Int("top", 20, "show the N oldest files (0: all)")
	asJSON := fset.Bool("json", false, "print a JSON array (the control socket's DirtyFile objects)")
	pos, err := cli.ParseArgs(fset, args)
	if err != nil {
		return cli.ParseExit(err)
	}
	for i, p := range pos {
		if p == "" {
			fmt.Fprintln(stderr, "flusherd dirty: an empty PATH")
			return cli.ExitUsage
		}
		if pos[i], err = filepath.Abs(p); err != nil {
			fmt.Fprintf(stderr, "flusherd dirty: %v\n", err)
			return cli.ExitUsage
		}
	}
	if *top < 0 {
		fmt.Fprintln(stderr, "flusherd dirty: --top must not be negative")
		return cli.ExitUsage
	}
	cfg, err := c.LoadClient("dirty", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd dirty: %v\n", err)
		return cli.ExitUsage
	}
	return client.Dirty(cfg.Stats.Dir, pos, *top, *asJSON, stdout, stderr)
}
