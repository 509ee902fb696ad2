package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// storageWithDaemon mounts an ext4 on a direct-I/O loop device and runs
// the daemon on its tree "w", with an expiry of an hour (so that only the
// keys under test write anything) and the [writeback] lines given.
func storageWithDaemon(t *testing.T, writeback string) (*testfs.FS, string, *flusherdProc) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", DirectIO: true})
	tree := filepath.Join(mnt.Dir, "w")
	mkdirs(t, tree)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "1s"
dirty_expire_interval = "1h"
%s
[[watch]]
path = %q
`, writeback, tree))
	return mnt, tree, d
}

// TestStreamingWriterBounded: a file appended 64 KiB every 10 ms (6.4 MB/s)
// for 4 s, with range_bytes = 1MiB and an expiry of an hour, never holds
// much more than 2 × range_bytes of dirty data: what lies behind its last
// range_bytes is written back as it grows (range_writebacks in the stats),
// without waiting for the expiry. The bound checked is 2 × range_bytes plus
// what the writer adds in two background checks (2 × 100 ms × 6.4 MB/s)
// plus 1 MiB of margin for a busy machine: 4.25 MiB. Without range
// writeback the file would hold all of its 25 MiB dirty (the kernel's
// thresholds on this machine are gigabytes, its expiry 30 s).
func TestStreamingWriterBounded(t *testing.T) {
	testfs.SkipShort(t, "a streaming writer under the daemon on loop-mounted ext4")
	mnt, tree, d := storageWithDaemon(t, `range_bytes = "1MiB"`)
	path := filepath.Join(tree, "stream.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(i)
	}
	var peak uint64
	const bound = (4<<20 + 256<<10) / 4096 // pages
	start := time.Now()
	for time.Since(start) < 4*time.Second {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
		dirty, _, err := cachestat(path, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		peak = max(peak, dirty)
		time.Sleep(10 * time.Millisecond)
	}
	size, _ := f.Seek(0, 1)
	t.Logf("file grew to %.1f MiB; peak dirty %.2f MiB (bound %.2f MiB)", float64(size)/(1<<20), float64(peak*4096)/(1<<20), float64(bound*4096)/(1<<20))
	if peak > bound {
		t.Errorf("the streaming file held %d dirty pages at its peak, want at most %d", peak, bound)
	}
	if dirty, _, _ := cachestat(path, 0, 0); dirty == 0 {
		t.Errorf("no dirty data left: the hot tail (the last range_bytes) was written back too")
	}
	testwait.For(t, "range_writebacks in the stats file", 5*time.Second, func() bool {
		return readStats(t, d.devStats(mnt.MajMin))["range_writebacks"] > 0
	})
	// Its writes are all needed (each background check must see it
	// written): it is not quieted, whatever the watcher.
	if q := readStats(t, filepath.Join(d.statsDir, "watch", "stats"))["quieted"]; q != 0 {
		t.Errorf("quieted %d with range writeback on, want 0", q)
	}
}

// TestBackgroundThresholdBurst: a 64 MiB burst in four files, with
// dirty_background_bytes = 16MiB, range writeback off and an expiry of an
// hour, is written back to under the threshold within seconds, without
// waiting for the expiry, the older data first: the two older files hold
// no more dirty data than the two newer ones (a file's chunks are written
// in turn with the other files', write_chunk at a time, and the in-flight
// window gives its room to the oldest file waiting for it: roomTurn), and
// the newest file is not written whole; and the writeback stops there:
// dirty data is left. It also reports the
// daemon's estimate of the dirty bytes (BdiReclaimable) against a
// cachestat scan of the files.
func TestBackgroundThresholdBurst(t *testing.T) {
	testfs.SkipShort(t, "a 16 MiB burst under the daemon on loop-mounted ext4")
	mnt, tree, d := storageWithDaemon(t, "dirty_background_bytes = \"16MiB\"\nrange_bytes = \"0\"")
	buf := make([]byte, 16<<20)
	for i := range buf {
		buf[i] = byte(i * 3)
	}
	var paths []string
	for i := range 4 {
		p := filepath.Join(tree, fmt.Sprintf("burst%d", i))
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
		time.Sleep(20 * time.Millisecond) // ages apart
	}
	written := time.Now()
	dirtyOf := func(p string) uint64 {
		n, _, err := cachestat(p, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return n * 4096
	}
	total := func() uint64 {
		var n uint64
		for _, p := range paths {
			n += dirtyOf(p)
		}
		return n
	}
	testwait.For(t, "the burst under dirty_background_bytes", 10*time.Second, func() bool { return total() <= 16<<20 })
	t.Logf("under 16 MiB %v after the burst (expiry: 1h)", time.Since(written).Round(10*time.Millisecond))
	time.Sleep(1500 * time.Millisecond) // the stats file, and nothing more written
	after := total()
	t.Logf("dirty MiB by file, oldest first: %.1f %.1f %.1f %.1f", float64(dirtyOf(paths[0]))/(1<<20), float64(dirtyOf(paths[1]))/(1<<20),
		float64(dirtyOf(paths[2]))/(1<<20), float64(dirtyOf(paths[3]))/(1<<20))
	// The stats file is rewritten at most every second: it is polled
	// for the figures already seen to have their effect.
	st := statsWhen(t, d.devStats(mnt.MajMin), 3*time.Second, func(s map[string]int64) bool {
		return s["background_works"] > 0 && s["BdiReclaimable"] > 0
	})
	if after == 0 {
		t.Errorf("every byte was written: background writeback did not stop under the threshold (BdiWritten %d kB, background_works %d)",
			st["BdiWritten"], st["background_works"])
	}
	if older, newer := dirtyOf(paths[0])+dirtyOf(paths[1]), dirtyOf(paths[2])+dirtyOf(paths[3]); older > newer {
		t.Errorf("the two older files hold %d dirty bytes, the two newer %d: want the older data written first", older, newer)
	}
	if n := dirtyOf(paths[3]); n == 0 {
		t.Errorf("the newest file was written back whole: %d dirty bytes left in all, in older files", after)
	}
	if st["background_works"] == 0 {
		t.Errorf("background_works = 0 in the stats file: %v", st)
	}
	est := uint64(st["BdiReclaimable"]) * 1024
	t.Logf("dirty bytes: daemon's estimate (BdiReclaimable) %.2f MiB, cachestat scan %.2f MiB", float64(est)/(1<<20), float64(after)/(1<<20))
	if est == 0 {
		t.Errorf("BdiReclaimable is 0 while the tracked files hold %d dirty bytes", after)
	}
}
