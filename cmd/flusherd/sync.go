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

	"flusherd/control"
)

const exitUnreachable = 3

// socketPath is where the daemon with this config listens.
func socketPath(statsDir string) string { return filepath.Join(statsDir, "flusherd.sock") }

// unreachableHint is the line printed after a control.ErrUnreachable: the
// two usual causes, a daemon that is not running and one that runs with
// another stats.dir.
func unreachableHint(cmd, statsDir string) string {
	return fmt.Sprintf("flusherd %s: is the daemon running (systemctl status flusherd)? Its socket is in its stats.dir; "+
		"this command looked in %s: pass the daemon's with --stats-dir or --config\n", cmd, strconv.Quote(statsDir))
}

func cmdSync(args []string, stdout, stderr io.Writer) int {
	fset := newFlagSet("sync", "sync [--config FILE] [--stats-dir DIR] [--timeout D] [PATH...]\n\n"+
		"Integrity writeback (fdatasync, or one syncfs for a large batch) through the running\n"+
		"daemon, ahead of background writeback; waits for it. A named file must be a regular\n"+
		"file in a watched tree, and is written whether or not it is tracked; a directory means\n"+
		"every tracked file under it; no PATH means every tracked file. Flags may come after\n"+
		"the paths. A file deleted before its writeback is counted, not failed. Exit 1\n"+
		"naming each file that failed, 3 if no daemon answers. When --timeout passes first,\n"+
		"the command gives up (exit 1) and the daemon finishes the sync anyway.",
		"flusherd sync /srv/db/wal /srv/db/data.1\n  flusherd sync /srv/spool        # every tracked file under it\n  flusherd sync                    # every tracked file", stdout, stderr)
	var c commonFlags
	c.register(fset)
	var timeoutFlag durationFlag
	fset.Var(&timeoutFlag, "timeout", "give up waiting after this `duration`, e.g. 30s (0: wait as long as it takes); the daemon finishes the sync anyway")
	timeout := (*time.Duration)(&timeoutFlag)
	args, err := parseArgs(fset, args)
	if err != nil {
		return parseExit(err)
	}
	cfg, err := loadClientConfig(c)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
		return exitUsage
	}
	var paths []string
	for _, p := range args {
		if p == "" {
			// An unset shell variable, not the current directory.
			fmt.Fprintln(stderr, "flusherd sync: an empty path")
			return exitUsage
		}
		if strings.HasSuffix(p, "/") {
			// filepath.Abs drops the slash, which asks for a directory:
			// "file/" is ENOTDIR, as for any other command.
			if _, err := os.Stat(p); errors.Is(err, syscall.ENOTDIR) {
				fmt.Fprintf(stderr, "flusherd sync: %s: not a directory\n", strconv.Quote(p))
				return exitFailed
			}
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
			return exitUsage
		}
		paths = append(paths, abs)
	}
	resp, err := control.Call(socketPath(cfg.Stats.Dir), control.Request{Op: "sync", Paths: control.Names(paths)}, *timeout)
	switch {
	case errors.Is(err, control.ErrNotSent) && errors.Is(err, os.ErrDeadlineExceeded):
		fmt.Fprintf(stderr, "flusherd sync: --timeout %v ran out before the request was sent; nothing was synced\n", *timeout)
		return exitFailed
	case errors.Is(err, os.ErrDeadlineExceeded):
		fmt.Fprintf(stderr, "flusherd sync: gave up after --timeout %v; the daemon goes on with the sync\n", *timeout)
		return exitFailed
	}
	if err != nil {
		fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
		if errors.Is(err, control.ErrUnreachable) {
			fmt.Fprint(stderr, unreachableHint("sync", cfg.Stats.Dir))
			return exitUnreachable
		}
		return exitFailed
	}
	failed, gone := 0, 0
	for _, f := range resp.Files {
		switch {
		case f.Error != "":
			fmt.Fprintf(stderr, "flusherd sync: %s: %s\n", strconv.Quote(string(f.Path)), f.Error)
			failed++
		case f.Gone:
			gone++
		}
	}
	if resp.Error != "" {
		fmt.Fprintf(stderr, "flusherd sync: %s\n", resp.Error)
		return exitFailed
	}
	if ok := len(resp.Files) - failed - gone; ok == 1 {
		fmt.Fprint(stdout, "1 file written back")
	} else {
		fmt.Fprintf(stdout, "%d files written back", ok)
	}
	switch {
	case gone == 1:
		fmt.Fprint(stdout, "; 1 deleted before its writeback (nothing to write)")
	case gone > 1:
		fmt.Fprintf(stdout, "; %d deleted before their writeback (nothing to write)", gone)
	}
	fmt.Fprintln(stdout)
	if failed > 0 || !resp.OK {
		return exitFailed
	}
	return exitOK
}
