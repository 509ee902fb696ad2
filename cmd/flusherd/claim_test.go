package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"flusherd/internal/cli"
	"flusherd/internal/testwait"
)

// refusedRun runs a second flusherd over --watch dir (recursive) with a
// stats directory of its own, expects it to exit 1 at once, and returns
// its output. It must have written nothing: no device's stats file.
func refusedRun(t *testing.T, dir string) string {
	t.Helper()
	d := runDaemon(t, "", daemonOpts{args: []string{"--watch", dir}, mayExit: true, env: []string{"JOURNAL_STREAM=", "NOTIFY_SOCKET="}})
	if !testwait.Poll(30*time.Second, d.exited) || d.exitCode() != cli.ExitFailed {
		t.Fatalf("a second flusherd over %s: exited %v, code %d, want exit %d:\n%s", dir, d.exited(), d.exitCode(), cli.ExitFailed, d.log.String())
	}
	out, statsDir := d.log.String(), d.statsDir
	if _, err := os.Stat(filepath.Join(statsDir, "bdi")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused daemon made %s/bdi (%v): it went on after the refusal", statsDir, err)
	}
	if strings.Contains(string(out), "watching") {
		t.Errorf("the refused daemon set up its tree:\n%s", out)
	}
	return string(out)
}

// reloadAndWait reloads d with conf (flusherdProc.reload) and waits for the
// reload's line; it returns the log since.
func reloadAndWait(t *testing.T, d *flusherdProc, conf string) string {
	t.Helper()
	from := len(d.log.String())
	d.reload(t, conf)
	testwait.For(t, "the reload", 10*time.Second, func() bool {
		return strings.Contains(d.log.String()[from:], "configuration reloaded")
	})
	return d.log.String()[from:]
}

// TestSecondDaemonRefused: a flusherd over a tree that another flusherd
// serves, with another stats directory, exits 1 before doing anything,
// naming the other's pid; so does one inside the other's tree, and one
// around it. A reload that adds a tree another daemon serves leaves it
// out, naming that daemon; a tree the reload retires, or whose daemon
// stopped, can be served by another.
func TestSecondDaemonRefused(t *testing.T) {
	base := t.TempDir()
	t1, t2 := filepath.Join(base, "t1"), filepath.Join(base, "t2")
	mkdirs(t, filepath.Join(t1, "sub"), t2)
	watch := func(trees ...string) string {
		var b strings.Builder
		for _, tr := range trees {
			fmt.Fprintf(&b, "[[watch]]\npath = %q\n", tr)
		}
		return b.String()
	}
	d1 := startDaemon(t, watch(t1))
	d2 := startDaemon(t, watch(t2))
	pid1, pid2 := strconv.Itoa(d1.cmd.Process.Pid), strconv.Itoa(d2.cmd.Process.Pid)

	for _, tc := range []struct{ dir, want string }{
		{t1, strconv.Quote(t1) + " is served by another flusherd (pid " + pid1 + "); stop it first"},
		{filepath.Join(t1, "sub"), strconv.Quote(filepath.Join(t1, "sub")) + " is inside " + strconv.Quote(t1) +
			", which another flusherd (pid " + pid1 + ") serves with its subdirectories; stop it first"},
		{base, "a tree inside " + strconv.Quote(base) + " is served by another flusherd (pid "},
	} {
		// The error is a field of the log line: its quotes escaped.
		if out := refusedRun(t, tc.dir); !strings.Contains(out, strings.ReplaceAll(tc.want, `"`, `\"`)) {
			t.Errorf("a second flusherd over %s says:\n%s\nwant %s", tc.dir, out, tc.want)
		}
	}

	// d1's reload adding t2, d2's: left out, naming d2.
	log := reloadAndWait(t, d1, watch(t1, t2))
	if !strings.Contains(log, "cannot watch a root added by the reload") || !strings.Contains(log, "(pid "+pid2+")") ||
		!strings.Contains(log, `"roots_added": 0`) {
		t.Errorf("d1's reload adding d2's tree:\n%s", log)
	}
	// d2 stopped: the same reload adds t2.
	d2.stop(t)
	if log := reloadAndWait(t, d1, watch(t1, t2)); !strings.Contains(log, `"roots_added": 1`) {
		t.Errorf("d1's reload adding t2 after d2 stopped:\n%s", log)
	}
	// t1 retired by d1: another daemon may serve it; t2 is still d1's.
	reloadAndWait(t, d1, watch(t2))
	d3 := startDaemon(t, watch(t1))
	refusedRun(t, t2)
	d3.stop(t)
	d1.stop(t)
}
