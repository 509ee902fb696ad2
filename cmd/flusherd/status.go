package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"flusherd/client"
	"flusherd/internal/cli"
)

func cmdStatus(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("status", "status [--config FILE] [--stats-dir DIR] [--json] [--interval D]\n\n"+
		"The running daemon's status: a line per tree (root, mode, expire, tracked\n"+
		"files, dirty bytes, the age of the oldest dirty data against the expire,\n"+
		"bytes written, failed attempts, blocked and failed files, and how long data\n"+
		"stayed dirty before flusherd began writing it over the last 10 minutes:\n"+
		"p50/p99/max), then a line per device.",
		"flusherd status\n  flusherd status --interval 2s\n  flusherd status --json | jq '.trees[] | select(.oldest_dirty_seconds > .expire_seconds)'", stdout, stderr)
	var c cli.ConfigFlags
	c.Register(fset)
	asJSON := fset.Bool("json", false, "print the control socket's status object (one per line with --interval)")
	var interval cli.Duration
	fset.Var(&interval, "interval", "print it again every `duration` (e.g. 2s) until interrupted, as watch(1) does")
	if code, stop := cli.ParseFlags(fset, args); stop {
		return code
	}
	cfg, err := c.LoadClient("status", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd status: %v\n", err)
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return client.Status(ctx, cfg.Stats.Dir, *asJSON, time.Duration(interval), stdout, stderr)
}
