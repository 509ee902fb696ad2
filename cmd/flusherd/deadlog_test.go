package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d := runDaemon(t, fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"200ms\"\n[[watch]]\npath = %q\nexpire = \"500ms\"\n", mnt.Dir),
		daemonOpts{stderr: w, args: []string{"--log-level", "debug"}})
	w.Close()
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
	if d.exited() {
		t.Fatalf("the daemon ended after its log reader went away: %v", d.err)
	}
	d.stop(t)
}
