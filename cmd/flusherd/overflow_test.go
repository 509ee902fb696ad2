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
	d.cmd.Process.Signal(syscall.SIGSTOP)
	var files []string
	for i := range 2000 {
		p := filepath.Join(tree, fmt.Sprint(i/200), fmt.Sprint(i))
		writeDirty(t, p, 4096)
		files = append(files, p)
	}
	if stopped != nil {
		stopped()
	}
	d.cmd.Process.Signal(syscall.SIGCONT)
	return files
}

// startCutQueue starts the daemon with backend's event queue cut to 16
// events (fs.<backend>.max_queued_events, read when the queue is made and
// restored at once after), a pass every 200 ms and one recursive tree at
// tree, whose expire is expire ("": the default, 1 s here).
func startCutQueue(t *testing.T, backend, tree, expire string) *flusherdProc {
	t.Helper()
	restore := setSysctl(t, "/proc/sys/fs/"+backend+"/max_queued_events", "16")
	conf := fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"200ms\"\ndirty_expire_interval = \"1s\"\n[watcher]\nbackend = %q\n[[watch]]\npath = %q\n", backend, tree)
	if expire != "" {
		conf += fmt.Sprintf("expire = %q\n", expire)
	}
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

// forBackends runs f once per backend, as root, each on a new 256 MiB
// loop-mounted ext4 whose directory "tree", and dirs (relative to it), are
// made.
func forBackends(t *testing.T, f func(t *testing.T, backend string, mnt *testfs.FS, tree string), dirs ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, backend := range []string{"inotify", "fanotify"} {
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
	forBackends(t, func(t *testing.T, backend string, mnt *testfs.FS, tree string) {
		d := startCutQueue(t, backend, tree, "")
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
// hid are among them. The reload comes while the daemon is still stopped
// (handled when it goes on, before or after its reader reads the
// overflow), at once after SIGCONT, or 50 ms later (while the overflow's
// rescan runs, or after it).
func TestRemoveTreeAfterOverflow(t *testing.T) {
	testfs.SkipShort(t, "queue overflows with the daemon stopped, three timings")
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, when := range []string{"while stopped", "at SIGCONT", "50ms after"} {
		t.Run(when, func(t *testing.T) {
			mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 256})
			keep, gone := filepath.Join(mnt.Dir, "keep"), filepath.Join(mnt.Dir, "gone")
			for _, d := range []string{keep, gone} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			restore := setSysctl(t, "/proc/sys/fs/fanotify/max_queued_events", "16")
			conf := func(trees ...string) string {
				c := `
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "1s"
[watcher]
backend = "fanotify"
`
				for _, tr := range trees {
					c += fmt.Sprintf("[[watch]]\npath = %q\nexpire = \"1h\"\n", tr)
				}
				return c
			}
			d := startDaemon(t, conf(keep, gone))
			restore()
			files := overflowWrites(t, d, gone, func() {
				if when == "while stopped" {
					reloadWith(t, d, conf(keep))
					time.Sleep(50 * time.Millisecond)
				}
			})
			switch when {
			case "at SIGCONT":
				reloadWith(t, d, conf(keep))
			case "50ms after":
				time.Sleep(50 * time.Millisecond)
				reloadWith(t, d, conf(keep))
			}
			written := time.Now()
			for _, p := range files {
				waitClean(t, p, time.Until(written.Add(15*time.Second)))
			}
			overflowed(t, d)
			d.stop(t)
		})
	}
}

// TestDeletedInOverflow: files tracked in a tree whose expire is an hour
// away, deleted while the daemon is stopped and the event queue (cut to 16
// events) overflows with other writes, are not kept until the hour: the
// overflow's rescan looks at the tracked names, finds these gone, and the
// next pass forgets them (inodes_gone). Both backends.
func TestDeletedInOverflow(t *testing.T) {
	testfs.SkipShort(t, "queue overflows with the daemon stopped, each backend")
	forBackends(t, func(t *testing.T, backend string, mnt *testfs.FS, tree string) {
		doomedDir := filepath.Join(tree, "doomed")
		d := startCutQueue(t, backend, tree, "1h")
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
// below it went unseen). Both backends.
func TestDirMovedInOverflow(t *testing.T) {
	testfs.SkipShort(t, "queue overflows with the daemon stopped, each backend")
	forBackends(t, func(t *testing.T, backend string, mnt *testfs.FS, tree string) {
		d := startCutQueue(t, backend, tree, "500ms")
		d.cmd.Process.Signal(syscall.SIGSTOP)
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
		d.cmd.Process.Signal(syscall.SIGCONT)
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
