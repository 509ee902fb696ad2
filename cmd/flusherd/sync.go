package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"flusherd/control"
)

const exitUnreachable = 3

// socketPath is where the daemon with this config listens.
func socketPath(statsDir string) string { return filepath.Join(statsDir, "flusherd.sock") }

func cmdSync(args []string, stdout, stderr io.Writer) int {
	fset := newFlagSet("sync", "sync [--config FILE] [--stats-dir DIR] [--timeout D] [PATH...]\n\n"+
		"Integrity writeback (fdatasync, or one syncfs for a large batch) through the running\n"+
		"daemon, ahead of background writeback; waits for it. A file is written whether or\n"+
		"not it is tracked; a directory means every tracked file under it; no PATH means\n"+
		"every tracked file. Exit 1 naming each file that failed, 3 if no daemon answers.",
		"flusherd sync /srv/db/wal /srv/db/data.1\n  flusherd sync /srv/spool        # every tracked file under it\n  flusherd sync                    # every tracked file", stderr)
	var c commonFlags
	c.register(fset)
	timeout := fset.Duration("timeout", 0, "give up after this long (0: wait as long as it takes)")
	if err := fset.Parse(args); err != nil {
		return parseExit(err)
	}
	cfg, err := loadConfig(c, nil)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
		return exitUsage
	}
	var paths []string
	for _, p := range fset.Args() {
		abs, err := filepath.Abs(p)
		if err != nil {
			fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
			return exitUsage
		}
		paths = append(paths, abs)
	}
	resp, err := control.Call(socketPath(cfg.Stats.Dir), control.Request{Op: "sync", Paths: paths}, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
		if errors.Is(err, control.ErrUnreachable) {
			return exitUnreachable
		}
		return exitFailed
	}
	failed := false
	for _, f := range resp.Files {
		if f.Error != "" {
			fmt.Fprintf(stderr, "flusherd sync: %s: %s\n", strconv.Quote(f.Path), f.Error)
			failed = true
		}
	}
	if !failed && resp.OK {
		fmt.Fprintf(stdout, "%d files written back\n", len(resp.Files))
	}
	if resp.Error != "" {
		fmt.Fprintf(stderr, "flusherd sync: %s\n", resp.Error)
		failed = true
	}
	if failed || !resp.OK {
		return exitFailed
	}
	return exitOK
}
