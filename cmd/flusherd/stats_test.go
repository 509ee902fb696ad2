package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"flusherd/internal/cli"

	"golang.org/x/sys/unix"
)

// TestStatsCommand: `flusherd stats` prints each device's file, and a FIFO,
// a symlink or a glob character in the stats dir neither hangs it nor
// leads it astray.
func TestStatsCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "st[ab]")
	for _, d := range []string{"7:0", "fifo", "link"} {
		os.MkdirAll(filepath.Join(dir, "bdi", d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "bdi", "7:0", "stats"), []byte("b_dirty:                     3\n"), 0o644)
	if err := unix.Mkfifo(filepath.Join(dir, "bdi", "fifo", "stats"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink("/dev/zero", filepath.Join(dir, "bdi", "link", "stats"))
	// A sibling the glob "st[ab]" would match.
	os.MkdirAll(filepath.Join(filepath.Dir(dir), "sta", "bdi", "9:9"), 0o755)
	os.WriteFile(filepath.Join(filepath.Dir(dir), "sta", "bdi", "9:9", "stats"), []byte("wrong\n"), 0o644)

	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- Main([]string{"stats", "--stats-dir", dir}, &out, &errb) }()
	var code int
	select {
	case code = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("flusherd stats hung")
	}
	if code != cli.ExitFailed || !strings.Contains(errb.String(), "not a regular file") && !strings.Contains(errb.String(), "too many levels") {
		t.Errorf("exit %d, stderr %q: want exit 1 naming the bad file", code, errb.String())
	}
	if strings.Contains(out.String(), "wrong") {
		t.Errorf("read the stats of a directory the name only matches as a glob:\n%s", out.String())
	}

	// Without the bad entries, the good file is printed.
	os.RemoveAll(filepath.Join(dir, "bdi", "fifo"))
	os.RemoveAll(filepath.Join(dir, "bdi", "link"))
	out.Reset()
	errb.Reset()
	if code := Main([]string{"stats", "--stats-dir", dir}, &out, &errb); code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if want := "==> bdi/7:0 <==\nb_dirty:                     3\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
}

// TestClientCommandsWithADeadTree: stats, dirty and sync read the
// configuration for its stats.dir only, so a watch path that cannot be
// looked at (missing here; a dead FUSE server's root fails with ENOTCONN)
// does not stop them, while run and check-config still refuse it.
func TestClientCommandsWithADeadTree(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "flusherd.toml")
	statsDir := filepath.Join(dir, "run")
	os.MkdirAll(filepath.Join(statsDir, "bdi", "7:0"), 0o755)
	os.WriteFile(filepath.Join(statsDir, "bdi", "7:0", "stats"), []byte("b_dirty:                     3\n"), 0o644)
	os.WriteFile(conf, []byte(fmt.Sprintf("[stats]\ndir = %q\n[[watch]]\npath = %q\n", statsDir, filepath.Join(dir, "gone"))), 0o644)
	var out, errb bytes.Buffer
	if code := Main([]string{"stats", "--config", conf, "--files"}, &out, &errb); code != cli.ExitOK || !strings.Contains(out.String(), "b_dirty:") {
		t.Errorf("flusherd stats with a missing watch root: exit %d, stdout %q, stderr %q; want the stats", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := Main([]string{"dirty", "--config", conf}, &out, &errb); code == cli.ExitUsage || strings.Contains(errb.String(), "watch[0].path") {
		t.Errorf("flusherd dirty with a missing watch root: exit %d, stderr %q; want it to try the daemon, not refuse the watch path", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"check-config", conf}, &out, &errb); code != cli.ExitUsage || !strings.Contains(errb.String(), "watch[0].path") {
		t.Errorf("check-config with a missing watch root: exit %d, stderr %q; want exit 2 naming watch[0].path", code, errb.String())
	}
}

// TestStatsMissingDir: a stats dir that does not exist gets one message
// saying so, not first a promise to show the files "as the daemon last
// wrote them".
func TestStatsMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nowhere")
	var out, errb bytes.Buffer
	if code := Main([]string{"stats", "--stats-dir", dir}, &out, &errb); code != cli.ExitFailed {
		t.Errorf("exit %d, want %d", code, cli.ExitFailed)
	}
	want := fmt.Sprintf("flusherd stats: %s does not exist: is flusherd running with this stats dir?\n", dir)
	if errb.String() != want {
		t.Errorf("stderr %q, want %q", errb.String(), want)
	}
}
