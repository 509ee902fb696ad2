package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"flusherd/internal/testfs"
)

// throttleWrites limits writes to the block device majMin to bps bytes a
// second with cgroup v1 blk-throttle at the root (every writer, the
// kernel's writeback included), and removes the limit at cleanup.
func throttleWrites(t *testing.T, majMin string, bps int64) {
	t.Helper()
	const knob = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device"
	if _, err := os.Stat(knob); err != nil {
		testfs.Missing(t, "cgroup v1 blk-throttle (%s): %v", knob, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(knob, []byte(majMin+" 0"), 0); err != nil {
			t.Errorf("remove the write throttle of %s: %v", majMin, err)
		}
	})
	if err := os.WriteFile(knob, []byte(fmt.Sprintf("%s %d", majMin, bps)), 0); err != nil {
		t.Fatalf("throttle %s: %v", majMin, err)
	}
}

// TestSlowDeviceSmallFile: on a device throttled to 20 MB/s, a small file
// written 2 s into a 96 MiB stream is clean within expire + interval + 1 s:
// flusherd keeps at most writeback.max_inflight under writeback on the
// device, so the stream cannot queue ahead of it. Before the bound, the
// whole stream was put in flight (the throttle queue takes every
// submission without blocking) and the small file waited behind it: about
// 4.2 s here, which the "unbounded" case (max_inflight 64GiB) shows side by
// side.
func TestSlowDeviceSmallFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts, cgroup blk-throttle")
	}
	for _, c := range []struct {
		name     string
		inflight string
		bounded  bool
	}{{"bounded", "16MiB", true}, {"unbounded", "64GiB", false}} {
		t.Run(c.name, func(t *testing.T) {
			mnt := testfs.Mount(t, testfs.Options{Type: "ext4", DirectIO: true})
			tree := filepath.Join(mnt.Dir, "w")
			mkdirs(t, tree)
			d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "500ms"
dirty_expire_interval = "1s"
max_inflight = %q
[[watch]]
path = %q
`, c.inflight, tree))
			// Registered after the daemon: undone before it stops.
			throttleWrites(t, mnt.MajMin, 20<<20)
			// The stream: 96 MiB in the page cache at once, as a copy
			// of a file would leave it (the writer is not held back
			// by balance_dirty_pages at this size).
			big := filepath.Join(tree, "big")
			writeDirty(t, big, 96<<20)
			time.Sleep(2 * time.Second)
			small := filepath.Join(tree, "small.txt")
			writeDirty(t, small, 6)
			start := time.Now()
			ok, dirty, wb, err := cleanWithin(small, 20*time.Second)
			took := time.Since(start)
			bd, bwb, _ := cachestat(big, 0, 0)
			t.Logf("small.txt clean after %s (max_inflight %s); big still had %d dirty, %d writeback pages", took.Round(10*time.Millisecond), c.inflight, bd, bwb)
			if !ok {
				t.Fatalf("small.txt still dirty after 20 s: %d dirty, %d writeback (%v)", dirty, wb, err)
			}
			if bound := time.Second + 500*time.Millisecond + time.Second; c.bounded && took > bound {
				t.Errorf("small.txt took %s to be clean beside the stream, more than expire + interval + 1 s (%s)", took, bound)
			}
			st := readStats(t, filepath.Join(d.statsDir, "bdi", mnt.MajMin, "stats"))
			if c.bounded && st["throttled"] == 0 {
				t.Errorf("no attempt was deferred by max_inflight: %v", st)
			}
			if c.bounded {
				// SIGTERM still throttled: the rest of the stream
				// (under 96 MiB at 20 MB/s) is written, not waited
				// out to shutdown_timeout (30 s).
				start := time.Now()
				d.stop(t)
				took := time.Since(start)
				t.Logf("SIGTERM with the stream left: exit after %s", took.Round(10*time.Millisecond))
				if took > 15*time.Second {
					t.Errorf("shutdown took %s for under 96 MiB at 20 MB/s", took)
				}
			}
		})
	}
}
