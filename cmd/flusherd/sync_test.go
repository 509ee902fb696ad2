package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"flusherd/internal/cli"
	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// runSync runs `flusherd sync` against the daemon d and returns its exit
// code and output.
func runSync(t *testing.T, d *flusherdProc, paths ...string) (int, string) {
	t.Helper()
	return runAs(t, nil, append([]string{"sync", "--stats-dir", d.statsDir}, paths...)...)
}

// TestSyncAheadOfBackground: `flusherd sync FILE` issued while the daemon
// is busy writing back another tree on the same device (integrity mode:
// one fdatasync per file) returns within 10 s with its file clean while
// most of the other tree (at least 4000 of its 8000 files) is still dirty:
// it did not wait behind the background batch. The device is throttled to
// 20 MB/s (cgroup blk-throttle), so the background writeback takes about
// 25 s however fast the machine: the ordering is tested every time (on a
// fast disk an unthrottled background sometimes finished first).
func TestSyncAheadOfBackground(t *testing.T) {
	testfs.SkipShort(t, "500 MiB written to a 4 GiB loop-mounted ext4")
	// 4 GiB: ext4 starts writing back every dirty file itself once its
	// free space is under twice the dirty (delalloc) data
	// (ext4_nonda_switch), which 500 MiB on a 1 GiB filesystem is.
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 4096, DirectIO: true})
	bulk, db := filepath.Join(mnt.Dir, "bulk"), filepath.Join(mnt.Dir, "db")
	for _, d := range []string{bulk, db} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The bulk tree's files are written before the daemon starts (its
	// initial scan finds them): written while it runs, each new file's
	// journal handle would wait for the previous ones' fdatasync, and
	// the writer would go at the device's pace.
	var bulkFiles []string
	for i := range 8000 {
		p := filepath.Join(bulk, fmt.Sprintf("f%05d", i))
		writeDirty(t, p, 64<<10)
		bulkFiles = append(bulkFiles, p)
	}
	// Throttled from here: the daemon's background writeback of 500 MiB
	// takes about 25 s. (Lifted before the daemon's stop, which would
	// otherwise write the rest at that pace.)
	unthrottle := throttleWrites(t, mnt.MajMin, 20<<20)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "500ms"
# One request at a time, in small batches: the background writeback takes
# seconds however fast the machine, and yields often.
# integrity_syncfs = 0: one fdatasync per file, never one syncfs for a
# whole batch (which writes the 8000 files in well under a second).
[plug]
max_pending = 16
queue_depth = 1
integrity_syncfs = 0
[[watch]]
path = %q
mode = "integrity"
[[watch]]
path = %q
expire = "1h"
`, bulk, db))
	t.Cleanup(unthrottle)
	// Let background writeback of the bulk tree get going: wait until its
	// first files are clean (a fixed sleep either missed the start or the
	// end on a busy machine).
	testwait.For(t, "the background writeback of the bulk tree to start", 10*time.Second, func() bool {
		for _, p := range bulkFiles[:64] {
			if dirty, wb, err := cachestat(p, 0, 0); err == nil && dirty+wb == 0 {
				return true
			}
		}
		return false
	})
	target := filepath.Join(db, "wal")
	writeDirty(t, target, 256<<10)
	start := time.Now()
	code, out := runSync(t, d, target)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("flusherd sync exited %d: %s", code, out)
	}
	if dirty, wb, err := cachestat(target, 0, 0); err != nil || dirty+wb != 0 {
		t.Fatalf("after sync returned, %s has %d dirty, %d writeback pages (err %v)", target, dirty, wb, err)
	}
	still := 0
	for _, p := range bulkFiles {
		if dirty, wb, err := cachestat(p, 0, 0); err == nil && dirty+wb > 0 {
			still++
		}
	}
	t.Logf("the sync returned after %s; %d of %d background files were still dirty then", took.Round(10*time.Millisecond), still, len(bulkFiles))
	if took > 10*time.Second {
		t.Errorf("the sync took %s: it waited behind the background writeback", took)
	}
	if still < len(bulkFiles)/2 {
		t.Errorf("only %d of %d background files were still dirty when the sync returned: it waited behind them, or the throttle did not hold", still, len(bulkFiles))
	}
	// Its shutdown would write the rest of the bulk tree back, one
	// fdatasync a file: seconds that tell nothing here.
	d.kill()
}

// TestSyncReportsIOError: `flusherd sync` exits 1 and names the file when
// its fdatasync fails (a FUSE filesystem returning EIO), still after the
// fault is lifted (the failed writeback took the data; nothing is left to
// write), and exits 0 once the file was written again and written back; a
// path outside the watched trees is refused by name (exit 2), and one
// refused beside a failure leaves the exit 1.
func TestSyncReportsIOError(t *testing.T) {
	t.Parallel()
	ffs := faultfs.MountT(t)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_expire_interval = "1h"
[[watch]]
path = %q
`, ffs.Dir))
	p := filepath.Join(ffs.Dir, "journal")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(make([]byte, 8192))
	ffs.Set(faultfs.Faults{FsyncErr: syscall.EIO})
	code, out := runSync(t, d, p)
	if code != 1 || !strings.Contains(out, p) || !strings.Contains(out, "input/output error") {
		t.Fatalf("sync with EIO: exit %d, output %q; want exit 1 naming the file and the error", code, out)
	}
	ffs.Set(faultfs.Faults{})
	// The failed fdatasync left the pages clean: the data is lost, and a
	// later sync that finds nothing to write must not say otherwise.
	if code, out := runSync(t, d, p); code != 1 || !strings.Contains(out, "dropped after a failed writeback") {
		t.Fatalf("sync after the fault was lifted, before a new write: exit %d: %s; want 1 naming the loss", code, out)
	}
	if code, out := runSync(t, d, p); code != 1 || !strings.Contains(out, "dropped after a failed writeback") {
		t.Fatalf("a second sync before a new write: exit %d: %s; want the loss again", code, out)
	}
	// With a path refused beside it, the failure still sets the exit.
	missing := filepath.Join(ffs.Dir, "missing")
	if code, out := runSync(t, d, p, missing); code != 1 || !strings.Contains(out, "1 failed (above); 1 path refused") {
		t.Fatalf("sync of the lost file and a missing one: exit %d: %s; want 1, one failed and one refused", code, out)
	}
	// Written again: the new data is written and the file is clean.
	if _, err := f.WriteAt(make([]byte, 8192), 0); err != nil {
		t.Fatal(err)
	}
	if code, out := runSync(t, d, p); code != 0 {
		t.Fatalf("sync after the file was written again: exit %d: %s", code, out)
	}
	outside := filepath.Join(t.TempDir(), "elsewhere")
	writeDirty(t, outside, 10)
	if code, out := runSync(t, d, outside); code != cli.ExitUsage || !strings.Contains(out, "not in a watched tree") {
		t.Fatalf("sync of a file outside the trees: exit %d: %s", code, out)
	}
	d.stop(t)
	if code, out := runSync(t, d, p); code != 3 {
		t.Fatalf("sync with no daemon: exit %d, want 3: %s", code, out)
	}
}

// TestSyncDuplicates: one sync request that names a file more than once
// (the same path twice, a relative and an absolute name, a hard link, the
// file and its directory) writes it once, answers for every name, and the
// daemon keeps running.
func TestSyncDuplicates(t *testing.T) {
	t.Parallel()
	mnt, tree := mountTree(t, "ext4")
	d := startDaemon(t, fmt.Sprintf("[writeback]\ndirty_expire_interval = \"1h\"\n[[watch]]\npath = %q\n", tree))
	f, link := filepath.Join(tree, "f"), filepath.Join(tree, "link")
	writeDirty(t, f, 64<<10)
	if err := os.Link(f, link); err != nil {
		t.Fatal(err)
	}
	stats := d.devStats(mnt.MajMin)
	if !poll(10*time.Second, func() bool { return tracked(readStats(t, stats)) >= 1 }) {
		t.Fatal("the file was not tracked")
	}
	mustBeDirty(t, f)
	for _, paths := range [][]string{{f, f}, {f, link}, {f, tree}, {tree, tree}} {
		code, out := runSync(t, d, paths...)
		if code != 0 {
			t.Errorf("sync %q exited %d: %s", paths, code, out)
		}
		d.mustRun(t)
		writeDirty(t, f, 64<<10)
	}
}

// TestSyncTimeoutBeforeSend: a --timeout that runs out before the request
// is written says that nothing was synced (the daemon got nothing), not
// that the daemon goes on with it.
func TestSyncTimeoutBeforeSend(t *testing.T) {
	t.Parallel()
	tree := t.TempDir()
	d := startDaemon(t, fmt.Sprintf("[[watch]]\npath = %q\n", tree))
	var out bytes.Buffer
	code := Main([]string{"sync", "--stats-dir", d.statsDir, "--timeout", "1ns", tree}, &out, &out)
	if code != cli.ExitFailed || !strings.Contains(out.String(), "before the request was sent; nothing was synced") {
		t.Errorf("sync --timeout 1ns: exit %d, %q", code, out.String())
	}
}

// TestSyncDeletedFile: a tracked file deleted before a sync reaches it
// (`flusherd sync` of its directory, or with no path) is counted as
// deleted, with nothing to write, not failed: the command exits 0 and the
// other file is written back.
func TestSyncDeletedFile(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon syncing deleted files on loop-mounted ext4")
	_, tree := mountTree(t, "ext4")
	d := startDaemon(t, fmt.Sprintf("[writeback]\ndirty_expire_interval = \"1h\"\n[[watch]]\npath = %q\n", tree))
	for _, args := range [][]string{{tree}, nil} {
		gone, keep := filepath.Join(tree, "gone"), filepath.Join(tree, "keep")
		writeDirty(t, gone, 64<<10)
		writeDirty(t, keep, 64<<10)
		// The daemon's own list: the stats file may still count the
		// files of the round before, not yet these.
		if !poll(10*time.Second, func() bool {
			l := dirtyList(t, d)
			return strings.Contains(l, strconv.Quote(gone)) && strings.Contains(l, strconv.Quote(keep))
		}) {
			t.Fatalf("the files were not tracked:\n%s", dirtyList(t, d))
		}
		if err := os.Remove(gone); err != nil {
			t.Fatal(err)
		}
		code, out := runSync(t, d, args...)
		if code != 0 || !strings.Contains(out, "1 file written back; 1 deleted before its writeback") {
			t.Errorf("sync %q with a tracked file deleted: exit %d, %q; want 0 and the deleted file counted", args, code, out)
		}
		if dirty, wb, err := cachestat(keep, 0, 0); err != nil || dirty+wb != 0 {
			t.Errorf("after the sync, keep has %d dirty and %d writeback pages (err %v)", dirty, wb, err)
		}
		d.mustRun(t)
		if err := os.Remove(keep); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSyncTimeoutFlagErrors: a --timeout that is not a duration says
// what is wrong with it (exit 2), as the configuration's durations do.
func TestSyncTimeoutFlagErrors(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"5", `bad duration "5": a duration needs a unit`},
		{"-5s", "-5s is negative"},
		{"5 minutes", `want a number with a unit (ns, us, ms, s, m, h)`},
		{"9999999999h", "too large"},
	} {
		var out bytes.Buffer
		code := Main([]string{"sync", "--stats-dir", t.TempDir(), "--timeout", tc.arg}, &out, &out)
		if code != cli.ExitUsage || !strings.Contains(out.String(), tc.want) {
			t.Errorf("sync --timeout %q: exit %d, want %d and %q in %q", tc.arg, code, cli.ExitUsage, tc.want, out.String())
		}
	}
	// A bare zero is zero (wait as long as it takes), as --help says:
	// accepted, and with no daemon to ask, exit 3.
	var out bytes.Buffer
	if code := Main([]string{"sync", "--stats-dir", t.TempDir(), "--timeout", "0"}, &out, &out); code != cli.ExitUnreachable {
		t.Errorf("sync --timeout 0: exit %d, want %d: %s", code, cli.ExitUnreachable, out.String())
	}
}

// TestSyncPathErrors: an empty path is a usage error, not the current
// directory; a regular file named with a trailing slash is not a
// directory (exit 2), before any daemon is asked.
func TestSyncPathErrors(t *testing.T) {
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		arg  string
		code int
		want string
	}{
		{"", cli.ExitUsage, "an empty path"},
		{f + "/", cli.ExitUsage, "not a directory"},
	} {
		var out bytes.Buffer
		code := Main([]string{"sync", "--stats-dir", t.TempDir(), tc.arg}, &out, &out)
		if code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("sync %q: exit %d, %q; want exit %d and %q", tc.arg, code, out.String(), tc.code, tc.want)
		}
	}
}

// TestSyncSpecialFiles: sync of a FIFO, a device node or a symbolic link in
// a watched tree, or of a file named through a symbolic link to the tree,
// fails for that path (exit 1) with what it is, without opening it for I/O
// (a FIFO would block) or following the link; a path through a symbolic
// link into a tree is told the name it is watched under.
func TestSyncSpecialFiles(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mknod")
	}
	tree := t.TempDir()
	d := startDaemon(t, fmt.Sprintf("[[watch]]\npath = %q\n", tree))
	target := filepath.Join(tree, "target")
	if err := os.WriteFile(target, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo, dev, link := filepath.Join(tree, "fifo"), filepath.Join(tree, "null"), filepath.Join(tree, "link")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(dev, unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	treeLink := filepath.Join(t.TempDir(), "treelink") // to the tree, from outside
	if err := os.Symlink(tree, treeLink); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(treeLink, "target"), "a directory in the path is a symbolic link, which is not followed (it is watched as " + strconv.Quote(target) + ": name it so)"},
		{treeLink, "not in a watched tree as named (it is watched as " + strconv.Quote(tree) + ": name it so)"},
		{fifo, "not a regular file or directory"},
		{dev, "not a regular file or directory"},
		{link, "a symbolic link: not followed"},
	} {
		var out bytes.Buffer
		done := make(chan int, 1)
		go func() { done <- Main([]string{"sync", "--stats-dir", d.statsDir, c.path}, &out, &out) }()
		select {
		case code := <-done:
			if code != cli.ExitUsage || !strings.Contains(out.String(), c.want) || !strings.Contains(out.String(), "1 path refused") {
				t.Errorf("sync %s: exit %d, %q; want exit 2, %q and the path counted refused", c.path, code, out.String(), c.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("sync %s hung", c.path)
		}
	}
	d.stop(t)
}

// TestSyncAboveTreesAndTwice: `flusherd sync DIR` of a directory that holds
// trees syncs their tracked files under it (it said "not in a watched
// tree"); a file named twice (DIR and DIR/file) is written and counted
// once; a missing name that is not valid UTF-8 is reported without its
// raw bytes in the reason (the result names it, quoted).
func TestSyncAboveTreesAndTwice(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	tree := filepath.Join(base, "t")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, fmt.Sprintf("[writeback]\ndirty_expire_interval = \"1h\"\n[[watch]]\npath = %q\n", tree))
	a, b := filepath.Join(tree, "a"), filepath.Join(tree, "b")
	for _, p := range []string{a, b} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !poll(5*time.Second, func() bool { l := dirtyList(t, d); return strings.Contains(l, a) && strings.Contains(l, b) }) {
		t.Fatalf("a and b are not tracked:\n%s", dirtyList(t, d))
	}
	if code, out := runSync(t, d, base, a); code != 0 || !strings.Contains(out, "2 files written back") {
		t.Errorf("sync %s %s: exit %d, %q; want exit 0 and 2 files written back", base, a, code, out)
	}
	bad := filepath.Join(tree, "\xff")
	code, out := runSync(t, d, bad)
	if code != cli.ExitUsage || !strings.Contains(out, strconv.Quote(bad)) || strings.Contains(out, "\xff") || strings.ContainsRune(out, utf8.RuneError) {
		t.Errorf("sync of a missing non-UTF-8 name: exit %d, %q; want exit 2, the name quoted and no raw byte (nor U+FFFD, what JSON makes of one)", code, out)
	}
}

// TestSyncBelowFlatTree: in a tree watched with recursive = false, a file
// in a subdirectory and the subdirectory itself are both refused as not
// in a watched tree, with the reason (the subdirectory was accepted and
// "0 files written back", the file refused): the two say the same.
func TestSyncBelowFlatTree(t *testing.T) {
	t.Parallel()
	tree := filepath.Join(t.TempDir(), "t")
	sub := filepath.Join(tree, "sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(sub, "f")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(tree, "top")
	if err := os.WriteFile(top, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, fmt.Sprintf("[[watch]]\npath = %q\nrecursive = false\n", tree))
	for _, p := range []string{sub, f} {
		code, out := runSync(t, d, p)
		if code != cli.ExitUsage || !strings.Contains(out, "not in a watched tree") || !strings.Contains(out, "recursive = false") ||
			!strings.Contains(out, "0 files written back; 1 path refused, nothing to write (above)") {
			t.Errorf("sync %s: exit %d, %q; want exit 2, not in a watched tree, recursive = false, and the path counted refused", p, code, out)
		}
	}
	if code, out := runSync(t, d, tree, top); code != 0 {
		t.Errorf("sync of the flat tree's root and its own file: exit %d, %q", code, out)
	}
}

// TestSyncCoversWritesBeforeIt: `flusherd sync DIR` (and a sync of every
// file) writes back a file written just before it, whose event the daemon
// may not have read yet when the request comes: a sync is ordered after
// the events queued before it (watch.Backend.Fence). Each backend, on a
// loop-mounted ext4; 20 files, each written and synced at once.
func TestSyncCoversWritesBeforeIt(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"inotify", "fanotify"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
			d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_expire_interval = "1h"
[watcher]
backend = %q
[[watch]]
path = %q
`, backend, mnt.Dir))
			for i := range 20 {
				p := filepath.Join(mnt.Dir, fmt.Sprintf("f%02d", i))
				writeDirty(t, p, 64<<10)
				args := []string{mnt.Dir}
				if i%2 == 1 {
					args = nil // every tracked file
				}
				if code, out := runSync(t, d, args...); code != 0 {
					t.Fatalf("sync %v after writing %s: exit %d: %s", args, p, code, out)
				}
				if dirty, wb, err := cachestat(p, 0, 0); err != nil || dirty+wb != 0 {
					t.Fatalf("sync %v returned with %s written just before it still holding %d dirty and %d writeback pages (err %v)", args, p, dirty, wb, err)
				}
			}
		})
	}
}
