package client

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/cli"
)

// TestStatsFromFiles: with no daemon answering, Stats prints each device's
// stats file under a header (escaped names), says the figures are not
// live, and limits the output to DEV when asked; an unknown DEV fails.
func TestStatsFromFiles(t *testing.T) {
	dir := t.TempDir()
	for dev, body := range map[string]string{"7:0": "BdiWritten: 4 kB\n", "8:0": "BdiWritten: 8 kB\n"} {
		if err := os.MkdirAll(filepath.Join(dir, "bdi", dev), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "bdi", dev, "stats"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out, errOut bytes.Buffer
	if code := Stats(dir, "", false, &out, &errOut); code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	want := "==> bdi/7:0 <==\nBdiWritten: 4 kB\n\n==> bdi/8:0 <==\nBdiWritten: 8 kB\n"
	if out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
	if !strings.Contains(errOut.String(), "does not answer") {
		t.Errorf("stderr does not say the figures are not live: %q", errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := Stats(dir, "8:0", true, &out, &errOut); code != cli.ExitOK || out.String() != "==> bdi/8:0 <==\nBdiWritten: 8 kB\n" || errOut.Len() != 0 {
		t.Errorf("DEV 8:0, files only: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	if code := Stats(dir, "9:0", true, &out, &errOut); code != cli.ExitFailed {
		t.Errorf("unknown DEV: exit %d, want %d", code, cli.ExitFailed)
	}
	if code := Stats(filepath.Join(dir, "nope"), "", true, &out, &errOut); code != cli.ExitFailed {
		t.Errorf("missing stats dir: exit %d, want %d", code, cli.ExitFailed)
	}
}

// TestStatsFileNotRegular: a FIFO in place of a stats file is refused,
// not opened for a read that could block.
func TestStatsFileNotRegular(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bdi", "7:0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "bdi", "7:0", "stats"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := Stats(dir, "", true, &out, &errOut); code != cli.ExitFailed || !strings.Contains(errOut.String(), "not a regular file") {
		t.Errorf("FIFO: exit %d, stderr %q", code, errOut.String())
	}
}

// TestUnreachable: dirty and sync without a daemon exit 3 and say where
// they looked.
func TestUnreachable(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	if code := Dirty(dir, nil, 20, false, &out, &errOut); code != cli.ExitUnreachable || !strings.Contains(errOut.String(), "is the daemon running") {
		t.Errorf("dirty: exit %d, stderr %q", code, errOut.String())
	}
	errOut.Reset()
	if code := Sync(dir, nil, time.Second, &out, &errOut); code != cli.ExitUnreachable || !strings.Contains(errOut.String(), dir) {
		t.Errorf("sync: exit %d, stderr %q", code, errOut.String())
	}
}
