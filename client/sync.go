package client

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"flusherd/control"
	"flusherd/internal/cli"
)

// unreachableHint is the line printed after a control.ErrUnreachable: the
// two usual causes, a daemon that is not running and one that runs with
// another stats.dir.
// callFailed reports a failed call of command cmd to the daemon of
// statsDir, with a hint when it is not reachable, and returns the exit
// code: ExitUnreachable, or ExitFailed.
func callFailed(cmd, statsDir string, err error, stderr io.Writer) int {
	fmt.Fprintf(stderr, "flusherd %s: %v\n", cmd, err)
	if errors.Is(err, control.ErrUnreachable) {
		fmt.Fprint(stderr, unreachableHint(cmd, statsDir))
		return cli.ExitUnreachable
	}
	return cli.ExitFailed
}

func unreachableHint(cmd, statsDir string) string {
	return fmt.Sprintf("flusherd %s: is the daemon running (systemctl status flusherd)? Its socket is in its stats.dir; "+
		"this command looked in %s: pass the daemon's with --stats-dir or --config\n", cmd, strconv.Quote(statsDir))
}

// Sync asks the daemon whose stats directory is statsDir for integrity
// writeback of paths (absolute; none: every tracked file), waits for it
// at most timeout (0: no bound), prints the files that failed and the
// paths refused, and a summary, and returns the exit code: ExitFailed for
// a failed writeback, else ExitUsage for a path refused (outside the
// trees, not there, ...).
func Sync(statsDir string, paths []string, timeout time.Duration, stdout, stderr io.Writer) int {
	resp, err := control.Call(control.SocketPath(statsDir), control.Request{Op: "sync", Paths: control.Names(paths)}, timeout)
	switch {
	case errors.Is(err, control.ErrNotSent) && errors.Is(err, os.ErrDeadlineExceeded):
		fmt.Fprintf(stderr, "flusherd sync: --timeout %v ran out before the request was sent; nothing was synced\n", timeout)
		return cli.ExitFailed
	case errors.Is(err, os.ErrDeadlineExceeded):
		fmt.Fprintf(stderr, "flusherd sync: gave up after --timeout %v; the daemon goes on with the sync\n", timeout)
		return cli.ExitFailed
	}
	if err != nil {
		return callFailed("sync", statsDir, err, stderr)
	}
	failed, gone, refused := 0, 0, 0
	for _, f := range resp.Files {
		switch {
		case f.Refused:
			fmt.Fprintf(stderr, "flusherd sync: %s: %s\n", strconv.Quote(string(f.Path)), f.Error)
			refused++
		case f.Error != "":
			fmt.Fprintf(stderr, "flusherd sync: %s: %s\n", strconv.Quote(string(f.Path)), f.Error)
			failed++
		case f.Gone:
			gone++
		}
	}
	if resp.Error != "" {
		fmt.Fprintf(stderr, "flusherd sync: %s\n", resp.Error)
		return cli.ExitFailed
	}
	if ok := len(resp.Files) - failed - gone - refused; ok == 1 {
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
	if failed > 0 {
		fmt.Fprintf(stdout, "; %d failed (above)", failed)
	}
	if refused > 0 {
		fmt.Fprintf(stdout, "; %d %s refused, nothing to write (above)", refused, map[bool]string{true: "path", false: "paths"}[refused == 1])
	}
	fmt.Fprintln(stdout)
	switch {
	case failed > 0 || !resp.OK:
		return cli.ExitFailed
	case refused > 0:
		return cli.ExitUsage
	}
	return cli.ExitOK
}
