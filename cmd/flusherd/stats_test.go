package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	if code != exitFailed || !strings.Contains(errb.String(), "not a regular file") && !strings.Contains(errb.String(), "too many levels") {
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
	if code := Main([]string{"stats", "--stats-dir", dir}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if want := "==> bdi/7:0 <==\nb_dirty:                     3\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
}
