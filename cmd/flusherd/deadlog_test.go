package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"flusherd/internal/testfs"
)

// TestDeadLogReader: a daemon whose standard error is a pipe whose reader
// goes away keeps running (a log write fails with EPIPE; no SIGPIPE), writes
// back what is written afterwards, and exits 0 at SIGTERM.
func TestDeadLogReader(t *testing.T) {
	testfs.SkipShort(t, "the daemon on loop-mounted ext4")
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	dir := t.TempDir()
	cfg := filepath.Join(dir, "flusherd.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"200ms\"\n[[watch]]\npath = %q\nexpire = \"500ms\"\n", mnt.Dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "run", "--config", cfg, "--stats-dir", filepath.Join(dir, "run"), "--log-level", "debug")
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	sc := bufio.NewScanner(r)
	for sc.Scan() && !strings.Contains(sc.Text(), "ready") {
	}
	r.Close() // the log reader goes away
	// Debug lines come with each attempt: the next one hits the closed
	// pipe.
	for i := range 3 {
		p := filepath.Join(mnt.Dir, fmt.Sprintf("f%d", i))
		writeDirty(t, p, 64<<10)
		waitClean(t, p, 10*time.Second)
	}
	select {
	case err := <-exited:
		t.Fatalf("the daemon ended after its log reader went away: %v", err)
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v, want 0", err)
		}
		exited <- nil // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("no exit 30s after SIGTERM")
	}
}
