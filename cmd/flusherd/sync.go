package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"flusherd/client"
	"flusherd/internal/cli"
)

func cmdSync(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("sync", "sync [--config FILE] [--stats-dir DIR] [--timeout D] [PATH...]\n\n"+
		"Integrity writeback (fdatasync, or one syncfs for a large batch) through the running\n"+
		"daemon, ahead of background writeback; waits for it. A named file must be a regular\n"+
		"file in a watched tree, and is written whether or not it is tracked; a directory means\n"+
		"every tracked file under it; no PATH means every tracked file. Flags may come after\n"+
		"the paths. A file deleted before its writeback is counted, not failed. Exit 1\n"+
		"naming each file that failed, 2 for a path refused (outside the trees, missing, not a\n"+
		"regular file or directory) when none failed, 3 if no daemon answers. When --timeout passes first,\n"+
		"the command gives up (exit 1) and the daemon finishes the sync anyway.",
		"flusherd sync /srv/db/wal /srv/db/data.1\n  flusherd sync /srv/spool        # every tracked file under it\n  flusherd sync                    # every tracked file", stdout, stderr)
	var c cli.ConfigFlags
	c.Register(fset)
	var timeoutFlag cli.Duration
	fset.Var(&timeoutFlag, "timeout", "give up waiting after this `duration`, e.g. 30s (0: wait as long as it takes); the daemon finishes the sync anyway")
	timeout := (*time.Duration)(&timeoutFlag)
	args, err := cli.ParseArgs(fset, args)
	if err != nil {
		return cli.ParseExit(err)
	}
	cfg, err := c.LoadClient("sync", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
		return cli.ExitUsage
	}
	var paths []string
	for _, p := range args {
		if p == "" {
			// An unset shell variable, not the current directory.
			fmt.Fprintln(stderr, "flusherd sync: an empty path")
			return cli.ExitUsage
		}
		if strings.HasSuffix(p, "/") {
			// filepath.Abs drops the slash, which asks for a directory:
			// "file/" is ENOTDIR, as for any other command.
			if _, err := os.Stat(p); errors.Is(err, syscall.ENOTDIR) {
				fmt.Fprintf(stderr, "flusherd sync: %s: not a directory\n", strconv.Quote(p))
				return cli.ExitUsage
			}
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
			return cli.ExitUsage
		}
		paths = append(paths, abs)
	}
	return client.Sync(cfg.Stats.Dir, paths, *timeout, stdout, stderr)
}
