package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// threads returns the number of threads of process pid.
func threads(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line")
	return 0
}

// TestDirtyOnHungFilesystem: `flusherd dirty` polled while a FUSE
// filesystem hangs in open answers (with the counts as last seen) and does
// not pile up the daemon's threads: at most one fresh read per device is
// stuck at a time, whatever the number of calls.
func TestDirtyOnHungFilesystem(t *testing.T) {
	testfs.SkipShort(t, "the daemon on a FUSE filesystem")
	ffs := faultfs.MountT(t)
	d := startDaemon(t, fmt.Sprintf("[[watch]]\npath = %q\nexpire = \"10m\"\n", ffs.Dir))
	for i := range 20 {
		writeDirty(t, filepath.Join(ffs.Dir, fmt.Sprintf("f%d", i)), 8<<10)
	}
	list := func() string {
		var out, errb bytes.Buffer
		if code := Main([]string{"dirty", "--top", "0", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
			t.Fatalf("flusherd dirty: exit %d: %s", code, errb.String())
		}
		return out.String()
	}
	testwait.For(t, "the 20 files tracked", 10*time.Second, func() bool { return strings.Count(list(), "\n") == 21 })
	pid := d.cmd.Process.Pid
	before := threads(t, pid)
	ffs.Set(faultfs.Faults{OpenDelay: 8 * time.Second})
	t.Cleanup(func() { ffs.Set(faultfs.Faults{}) })
	start := time.Now()
	for range 8 {
		if n := strings.Count(list(), "\n"); n != 21 {
			t.Fatalf("flusherd dirty listed %d lines while the filesystem hangs, want the header and 20 files", n)
		}
	}
	took := time.Since(start)
	after := threads(t, pid)
	t.Logf("threads %d -> %d after 8 listings in %s", before, after, took.Round(time.Millisecond))
	if after > before+4 {
		t.Errorf("threads %d -> %d after 8 listings of a hung filesystem: want at most a few more (one stuck read per device)", before, after)
	}
	if took > 8*1500*time.Millisecond {
		t.Errorf("8 listings took %s: each should give up on the hung device at once after its first stuck read", took)
	}
}
