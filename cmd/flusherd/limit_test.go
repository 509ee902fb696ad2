package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"flusherd/internal/testfs"
)

// treeOverWatchLimit mounts an ext4 with a tree of dirs directories
// (tree/d00...) and gives the daemon options that run it in a user
// namespace of its own whose inotify watch limit
// (user.max_inotify_watches) is limit, so that the tree cannot be fully
// watched. The limit is the namespace's alone: no other process's watches
// count against it, and no other process is limited by it.
func treeOverWatchLimit(t *testing.T, dirs, limit int) (mnt *testfs.FS, tree string, o daemonOpts) {
	t.Helper()
	mnt = testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 128})
	tree = filepath.Join(mnt.Dir, "tree")
	for i := range dirs {
		if err := os.MkdirAll(filepath.Join(tree, fmt.Sprintf("d%02d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return mnt, tree, daemonOpts{inotifyWatches: limit}
}

// TestInotifyWatchLimit: under an inotify watch limit of 20 (its user
// namespace's), a tree of 61 directories cannot be fully watched. The daemon
// logs one clear error naming the limit, its value, the unwatched count
// and the fanotify backend; keeps serving the watched part; and finds the
// files written in unwatched directories by its periodic rescans.
func TestInotifyWatchLimit(t *testing.T) {
	testfs.SkipShort(t, "the daemon over the inotify watch limit until a rescan")
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	const limit = 20
	_, tree, o := treeOverWatchLimit(t, 60, limit)
	d := runDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "1s"
[watcher]
backend = "inotify"
rescan_interval = "300ms"
[[watch]]
path = %q
`, tree), o)
	log := d.log.String()
	ws := readStats(t, filepath.Join(d.statsDir, "watch", "stats"))
	t.Logf("limit %d; watch stats %v", limit, ws)
	if ws["unwatched_dirs"] == 0 {
		t.Fatalf("every directory was watched under a limit of %d", limit)
	}
	if n := strings.Count(log, "out of inotify watches"); n != 1 {
		t.Errorf("want one watch-limit error, got %d:\n%s", n, log)
	}
	for _, want := range []string{"user.max_inotify_watches", fmt.Sprintf(`"limit": "%d"`, limit),
		`"unwatched_dirs": `, "fanotify"} {
		if !strings.Contains(log, want) {
			t.Errorf("the watch-limit error lacks %q:\n%s", want, log)
		}
	}
	// Files in every directory, watched or not, get clean.
	var files []string
	for i := range 60 {
		p := filepath.Join(tree, fmt.Sprintf("d%02d", i), "f")
		writeDirty(t, p, 8192)
		files = append(files, p)
	}
	written := time.Now()
	for _, p := range files {
		waitClean(t, p, time.Until(written.Add(10*time.Second)))
	}
	ws = statsWhen(t, filepath.Join(d.statsDir, "watch", "stats"), 3*time.Second, func(ws map[string]int64) bool { return ws["rescans"] > 0 })
	if ws["rescans"] == 0 {
		t.Errorf("no rescan counted: %v", ws)
	}
	d.stop(t)
}

// TestInotifyWatchLimitShutdown: files written in directories that are out
// of inotify watches, in directories made below them since, and in
// directories moved in below them, with the periodic rescan an hour away,
// are found by the shutdown's scan of those directories and written back
// before the daemon says every tracked file is clean.
func TestInotifyWatchLimitShutdown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	const limit = 10
	mnt, tree, o := treeOverWatchLimit(t, 40, limit)
	d := runDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "1h"
[watcher]
backend = "inotify"
rescan_interval = "1h"
[[watch]]
path = %q
`, tree), o)
	ws := readStats(t, filepath.Join(d.statsDir, "watch", "stats"))
	if ws["unwatched_dirs"] == 0 {
		t.Fatalf("every directory was watched under a limit of %d", limit)
	}
	rescans := ws["rescans"]
	// In each directory: a file, a file two levels down in directories
	// made since, and a directory moved in from outside the tree with a
	// file in it (none of which reports an event in an unwatched one).
	var files []string
	for i := range 40 {
		d := filepath.Join(tree, fmt.Sprintf("d%02d", i))
		deep := filepath.Join(d, "late", "deeper")
		out := filepath.Join(mnt.Dir, fmt.Sprintf("out%02d", i))
		for _, dir := range []string{deep, out} {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		writeDirty(t, filepath.Join(out, "m"), 8192)
		if err := os.Rename(out, filepath.Join(d, "moved")); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{filepath.Join(d, "f"), filepath.Join(deep, "g"), filepath.Join(d, "moved", "m")} {
			if p != filepath.Join(d, "moved", "m") {
				writeDirty(t, p, 8192)
			}
			files = append(files, p)
		}
	}
	dirty := 0
	for _, p := range files {
		if dp, wb, err := cachestat(p, 0, 0); err != nil {
			t.Fatal(err)
		} else if dp+wb > 0 {
			dirty++
		}
	}
	if dirty == 0 {
		t.Fatal("no file was dirty before the shutdown: the test shows nothing")
	}
	// A file outside the tree, on the same filesystem: still dirty after
	// the shutdown, or the test cannot tell the daemon's writeback from
	// the filesystem's own.
	control := filepath.Join(mnt.Dir, "control")
	writeDirty(t, control, 8192)
	d.stop(t)
	if dp, wb, err := cachestat(control, 0, 0); err != nil {
		t.Fatal(err)
	} else {
		if dp+wb == 0 {
			t.Fatalf("%s, outside the tree, is clean after the shutdown: something other than the daemon wrote the filesystem back, and the test cannot tell", control)
		}
	}
	for _, p := range files {
		if dp, wb, err := cachestat(p, 0, 0); err != nil {
			t.Fatal(err)
		} else if dp+wb > 0 {
			t.Errorf("%s: %d dirty, %d writeback pages after the shutdown", p, dp, wb)
		}
	}
	log := d.log.String()
	if n := strings.Count(log, "out of inotify watches"); n != 1 {
		t.Errorf("the watch limit was logged %d times, want once:\n%s", n, log)
	}
	if !strings.Contains(log, "every tracked file is clean") {
		t.Errorf("the last line does not say every tracked file is clean:\n%s", log)
	}
	ws = readStats(t, filepath.Join(d.statsDir, "watch", "stats"))
	t.Logf("%d of %d files dirty before the shutdown; watch stats after it %v", dirty, len(files), ws)
	if ws["rescans"] <= rescans {
		t.Errorf("the shutdown's scan of the unwatched directories was not counted (rescans %d before it): %v", rescans, ws)
	}
}
