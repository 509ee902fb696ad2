package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"flusherd/control"
	"flusherd/internal/cli"
)

// TestStatsDirClaimed: a second daemon with the same stats directory exits
// 1 at once, naming the other (the first keeps its socket); a stats
// directory others may write in, or one reached through a symlink into a
// watched tree, is refused.
func TestStatsDirClaimed(t *testing.T) {
	tree := t.TempDir()
	t.Setenv("NOTIFY_SOCKET", "") // not under systemd, whatever runs the tests
	d := startDaemon(t, fmt.Sprintf("[[watch]]\npath = %q\n", tree))
	var out bytes.Buffer
	code := Main([]string{"run", "--watch", t.TempDir(), "--stats-dir", d.statsDir}, &out, &out)
	if code != cli.ExitFailed || !strings.Contains(out.String(), "another flusherd runs with stats.dir") {
		t.Errorf("second daemon: exit %d, want 1 naming the other:\n%s", code, out.String())
	}
	if _, err := os.Stat(control.SocketPath(d.statsDir)); err != nil {
		t.Errorf("the first daemon's socket: %v", err)
	}
	// Not under systemd (no NOTIFY_SOCKET): the log speaks of no READY=1.
	if l := d.log.String(); !strings.Contains(l, "every root is watched (the initial scan goes on)") || strings.Contains(l, "READY=1") {
		t.Errorf("start-up log outside systemd:\n%s", l)
	}
	d.stop(t)

	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777|os.ModeSticky)
	out.Reset()
	code = Main([]string{"run", "--watch", t.TempDir(), "--stats-dir", open}, &out, &out)
	if code != cli.ExitFailed || !strings.Contains(out.String(), "writable by group or others (mode 01777)") ||
		!strings.Contains(out.String(), "chmod go-w it, or choose another directory with --stats-dir or stats.dir") {
		t.Errorf("world-writable stats dir: exit %d, want 1 with its whole mode and what to do:\n%s", code, out.String())
	}
	// Not ours: what to do, too.
	if os.Geteuid() == 0 {
		other := filepath.Join(t.TempDir(), "other")
		if err := os.Mkdir(other, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		out.Reset()
		code = Main([]string{"run", "--watch", t.TempDir(), "--stats-dir", other}, &out, &out)
		if code != cli.ExitFailed || !strings.Contains(out.String(), "belongs to uid 65534") || !strings.Contains(out.String(), "chown it, or choose another directory") {
			t.Errorf("stats dir of another user: exit %d:\n%s", code, out.String())
		}
	}

	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(tree, link); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	code = Main([]string{"run", "--watch", tree, "--stats-dir", filepath.Join(link, "run")}, &out, &out)
	if code == cli.ExitOK || !strings.Contains(out.String(), "inside the watched tree") {
		t.Errorf("stats dir inside the tree through a symlink: exit %d:\n%s", code, out.String())
	}
}

// TestEmptyPathFlags: --stats-dir "" and --config "" (an unset shell
// variable) are usage errors, not a quiet fall back to the defaults.
func TestEmptyPathFlags(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--watch", t.TempDir(), "--stats-dir", ""},
		{"run", "--config", "", "--watch", t.TempDir()},
		{"dirty", "--stats-dir", ""},
		{"sync", "--config", ""},
	} {
		var out bytes.Buffer
		if code := Main(args, &out, &out); code != cli.ExitUsage || !strings.Contains(out.String(), `invalid value "" for flag`) {
			t.Errorf("%q: exit %d, %q", args, code, out.String())
		}
	}
}
