package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"flusherd/internal/testfs"
)

// setSysctl writes value to the /proc/sys file and restores the old value
// at cleanup (and when restore is called earlier).
func setSysctl(t *testing.T, path, value string) (restore func()) {
	t.Helper()
	old, err := os.ReadFile(path)
	if err != nil {
		testfs.Missing(t, "%s: %v", path, err)
	}
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	done := false
	restore = func() {
		if done {
			return
		}
		done = true
		if err := os.WriteFile(path, old, 0); err != nil {
			t.Errorf("restoring %s: %v", path, err)
		}
	}
	t.Cleanup(restore)
	return restore
}

// overflowWrites makes 10 directories in tree, waits for the daemon d to
// have seen them, then, with d stopped (SIGSTOP), writes 2,000 files of 4
// KiB in them, calls stopped (if not nil), and lets d go on (SIGCONT); it
// returns the files' paths. With the event queue cut to 16 events, the
// queue overflows.
func overflowWrites(t *testing.T, d *flusherdProc, tree string, stopped func()) []string {
	t.Helper()
	// Directories first, so that the files' events (not only the
	// directories') go to the queue: inotify watches them once their
	// creation was handled.
	for i := range 10 {
		if err := os.Mkdir(filepath.Join(tree, fmt.Sprint(i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	d.signal(syscall.SIGSTOP)
	var files []string
	for i := range 2000 {
		p := filepath.Join(tree, fmt.Sprint(i/200), fmt.Sprint(i))
		writeDirty(t, p, 4096)
		files = append(files, p)
	}
	if stopped != nil {
		stopped()
	}
	d.signal(syscall.SIGCONT)
	return files
}

// cutQueueConf is the configuration of the overflow tests: the watch
// backend, a pass every 200 ms, an expiry of 1 s, and the recursive trees,
// each with the expire given ("": the default).
func cutQueueConf(backend, expire string, trees ...string) string {
	conf := fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"200ms\"\ndirty_expire_interval = \"1s\"\n[watcher]\nbackend = %q\n", backend)
	for _, tree := range trees {
		conf += fmt.Sprintf("[[watch]]\npath = %q\n", tree)
		if expire != "" {
			conf += fmt.Sprintf("expire = %q\n", expire)
		}
	}
	return conf
}

// startCutQueue starts the daemon with conf (cutQueueConf), backend's
// event queue cut to 16 events (fs.<backend>.max_queued_events, read when
// the queue is made and restored at once after).
func startCutQueue(t *testing.T, backend, conf string) *flusherdProc {
	t.Helper()
	restore := setSysctl(t, "/proc/sys/fs/"+backend+"/max_queued_events", "16")
	d := startDaemon(t, conf)
	restore()
	if !strings.Contains(d.log.String(), "watch backend: "+backend) {
		t.Fatalf("daemon did not pick %s:\n%s", backend, d.log.String())
	}
	return d
}

// overflowed waits up to 5 s for d's watch/stats to count an overflow and
// fails the test if none comes: it would not test what it means to.
func overflowed(t *testing.T, d *flusherdProc) {
	t.Helper()
	ws := statsWhen(t, filepath.Join(d.statsDir, "watch", "stats"), 5*time.Second, func(ws map[string]int64) bool { return ws["overflows"] >= 1 })
	if ws["overflows"] < 1 {
		t.Fatalf("no overflow counted (%v): the test would not test what it means to", ws)
	}
}

// forBackends runs f once per backend of backends, as root, each on a new
// 256 MiB loop-mounted ext4 whose directory "tree", and dirs (relative to
// it), are made.
func forBackends(t *testing.T, backends []string, f func(t *testing.T, backend string, mnt *testfs.FS, tree string), dirs ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 256})
			tree := filepath.Join(mnt.Dir, "tree")
			for _, d := range append([]string{""}, dirs...) {
				if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			f(t, backend, mnt, tree)
		})
	}
}

// TestOverflow: with the backend's event queue cut to 16 events and the
// daemon stopped (SIGSTOP) while 2,000 files are written, the queue
// overflows; the daemon rescans the tree with cachestat and every file
// still gets clean within the bound. Both backends.
func TestOverflow(t *testing.T) {
	testfs.SkipShort(t, "queue overflows with the daemon stopped, each backend")
	forBackends(t, []string{"inotify", "fanotify"}, func(t *testing.T, backend string, mnt *testfs.FS, tree string) {
		d := startCutQueue(t, backend, cutQueueConf(backend, "", tree))
		files := overflowWrites(t, d, tree, nil)
		written := time.Now()
		for _, p := range files {
			waitClean(t, p, time.Until(written.Add(10*time.Second)))
		}
		ws := statsWhen(t, filepath.Join(d.statsDir, "watch", "stats"), 3*time.Second, func(ws map[string]int64) bool {
			return ws["overflows"] >= 1 && ws["rescans"] >= 1
		})
		ds := statsWhen(t, d.devStats(mnt.MajMin), 3*time.Second, func(ds map[string]int64) bool { return ds["rescans"] >= 1 })
		t.Logf("watch stats %v; device rescans %d", ws, ds["rescans"])
		if ws["overflows"] < 1 || ws["rescans"] < 1 {
			t.Errorf("want an overflow and a rescan counted, got %v", ws)
		}
		if ds["rescans"] < 1 {
			t.Errorf("device stats count no rescan: %v", ds)
		}
		d.stop(t)
	})
}

// TestRemoveTreeAfterOverflow: a tree that a reload removes while the
// events of its writes were lost (the fanotify queue, cut to 16 events,
// overflowed while the daemon was stopped) is scanned once more and its
// dirty files written back, though its expire is an hour away: the reload
// writes back a removed tree's files once more, and those the overflow
// hid are among them. The reload comes while the daemon is still stopped,
// so it is handled when the daemon goes on, before or after its reader
// reads the overflow. (A reload that comes while the overflow's rescan
// runs, or after it: watch.TestRescanCoversRemovedTree,
// TestOverflowAfterRemoval and TestRemovedTreeFinalScan.)
func TestRemoveTreeAfterOverflow(t *testing.T) {
	testfs.SkipShort(t, "a queue overflow with the daemon stopped")
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 256})
	keep, gone := filepath.Join(mnt.Dir, "keep"), filepath.Join(mnt.Dir, "gone")
	mkdirs(t, keep, gone)
	d := startCutQueue(t, "fanotify", cutQueueConf("fanotify", "1h", keep, gone))
	files := overflowWrites(t, d, gone, func() {
		d.reload(t, cutQueueConf("fanotify", "1h", keep))
		time.Sleep(50 * time.Millisecond)
	})
	written := time.Now()
	for _, p := range files {
		waitClean(t, p, time.Until(written.Add(15*time.Second)))
	}
	overflowed(t, d)
	d.stop(t)
}

// TestDeletedInOverflow: files tracked in a tree whose expire is an hour
// away, deleted while the daemon is stopped and the event queue (cut to 16
// events) overflows with other writes, are not kept until the hour: the
// overflow's rescan looks at the tracked names, finds these gone, and the
// next pass forgets them (inodes_gone). Under fanotify: the look at the
// tracked names after a rescan is the backends' common code
// (bdi.TestCheckNames checks what it finds), and TestOverflow runs both
// backends' overflows and rescans.
func TestDeletedInOverflow(t *testing.T) {
	testfs.SkipShort(t, "a queue overflow with the daemon stopped")
	forBackends(t, []string{"fanotify"}, func(t *testing.T, backend string, mnt *testfs.FS, tree string) {
		doomedDir := filepath.Join(tree, "doomed")
		d := startCutQueue(t, backend, cutQueueConf(backend, "1h", tree))
		var doomed []string
		for i := range 200 {
			p := filepath.Join(doomedDir, fmt.Sprint(i))
			writeDirty(t, p, 4096)
			doomed = append(doomed, p)
			if i%10 == 9 {
				time.Sleep(5 * time.Millisecond) // (the queue holds 16 events)
			}
		}
		devStats := d.devStats(mnt.MajMin)
		before := statsWhen(t, devStats, 5*time.Second, func(s map[string]int64) bool { return tracked(s) >= 200 })
		if tracked(before) < 200 {
			t.Fatalf("precondition: %d files tracked, want the 200 written (%s)", tracked(before), brief(before))
		}
		files := overflowWrites(t, d, tree, func() {
			for _, p := range doomed {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
			}
		})
		after := statsWhen(t, devStats, 5*time.Second, func(s map[string]int64) bool {
			return s["inodes_gone"]-before["inodes_gone"] >= 200 && tracked(s) <= int64(len(files))
		})
		if n := after["inodes_gone"] - before["inodes_gone"]; n < 200 || tracked(after) > int64(len(files)) {
			t.Errorf("5s after SIGCONT: inodes_gone +%d, %d tracked; want +200 and at most the %d files written meanwhile (%s)",
				n, tracked(after), len(files), brief(after))
		}
		overflowed(t, d)
		d.stop(t)
	}, "doomed")
}

// TestDirMovedInOverflow: a watched directory renamed while the daemon is
// stopped and its event queue (cut to 16 events) overflows, and a new
// directory made under its old name, are both watched afterwards: files
// written after SIGCONT in the moved directory, in a directory below it
// and in the new one get clean within the bound (with inotify, the moved
// directory's watch, known by its old name, used to report its events
// under that name and be replaced by the new directory's, and the files
// below it went unseen). Under inotify, whose watches are per directory:
// fanotify marks the filesystem, which a rename does not change (a
// renamed directory's files under their new names:
// watch.TestMovedDirReportsTrackedFiles; its overflow and rescan:
// TestOverflow).
func TestDirMovedInOverflow(t *testing.T) {
	testfs.SkipShort(t, "a queue overflow with the daemon stopped")
	forBackends(t, []string{"inotify"}, func(t *testing.T, backend string, mnt *testfs.FS, tree string) {
		d := startCutQueue(t, backend, cutQueueConf(backend, "500ms", tree))
		d.signal(syscall.SIGSTOP)
		for i := range 200 {
			p := filepath.Join(tree, fmt.Sprint("j", i))
			writeDirty(t, p, 0)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Rename(filepath.Join(tree, "d"), filepath.Join(tree, "dm")); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(tree, "d"), 0o755); err != nil {
			t.Fatal(err)
		}
		d.signal(syscall.SIGCONT)
		overflowed(t, d)
		time.Sleep(500 * time.Millisecond) // (the rescan)
		for round := range 2 {
			var files []string
			for _, dir := range []string{"dm", "dm/sub", "d"} {
				p := filepath.Join(tree, dir, fmt.Sprint("new", round))
				writeDirty(t, p, 64<<10)
				files = append(files, p)
			}
			written := time.Now()
			for _, p := range files {
				waitClean(t, p, time.Until(written.Add(cleanBound)))
			}
			time.Sleep(time.Second)
		}
		d.stop(t)
	}, "d/sub")
}
