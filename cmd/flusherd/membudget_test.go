package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// TestTrackedInodeBudget: on a loop-mounted ext4, a tree with an hour's
// expiry and writeback.max_tracked_inodes = 300 gets 1,500 small files.
// The device enters the over-budget state (its log line, over_budget,
// untracked_reports), whole-filesystem passes run (syncfs_passes, no
// syncfs_errors), the tracked files never exceed the budget, and every
// file is clean by cachestat within 15 s of the last write, an hour
// before its expiry and well before the kernel's own flusher (30 s). The
// device then leaves the state (over_budget 0, its log line), and a file
// written afterwards is tracked again. With each backend, and in an
// integrity tree.
func TestTrackedInodeBudget(t *testing.T) {
	testfs.SkipShort(t, "1,500 files on a loop-mounted ext4 under a small tracked-inode budget")
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, c := range []struct{ name, backend, mode string }{
		{"fanotify", "fanotify", "writeback"},
		{"inotify", "inotify", "writeback"},
		{"integrity", "fanotify", "integrity"},
	} {
		t.Run(c.name, func(t *testing.T) { trackedInodeBudget(t, c.backend, c.mode) })
	}
}

// trackedInodeBudget is TestTrackedInodeBudget with a backend, and a tree
// mode: an integrity tree's passes sync through the descriptor held for
// its filesystem's error cursor.
func trackedInodeBudget(t *testing.T, backend, mode string) {
	const budget, dirs, perDir = 300, 5, 300
	mnt, tree := mountTree(t, "ext4")
	d := runDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "1s"
max_tracked_inodes = %d
[watcher]
backend = %q
[[watch]]
path = %q
mode = %q
expire = "1h"
`, budget, backend, tree, mode), daemonOpts{bin: plainBinary})
	stats := d.devStats(mnt.MajMin)
	var paths []string
	for i := range dirs {
		dir := filepath.Join(tree, fmt.Sprintf("d%d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range perDir {
			p := filepath.Join(dir, fmt.Sprintf("f%03d", j))
			writeDirty(t, p, 4096)
			paths = append(paths, p)
		}
	}
	wrote := time.Now()
	// Every file clean, while the tracked files stay within the budget.
	maxTracked := int64(0)
	clean := testwait.Poll(15*time.Second, func() bool {
		if s := readStats(t, stats); s != nil {
			maxTracked = max(maxTracked, tracked(s))
		}
		for len(paths) > 0 {
			dt, wb, err := cachestat(paths[0], 0, 0)
			if err != nil {
				t.Fatalf("cachestat %s: %v", paths[0], err)
			}
			if dt+wb > 0 {
				return false
			}
			paths = paths[1:]
		}
		return true
	})
	if !clean {
		t.Fatalf("%d of %d files still dirty %v after the last write (first: %s)", len(paths), dirs*perDir, time.Since(wrote).Round(time.Millisecond), paths[0])
	}
	t.Logf("every file clean %v after the last write", time.Since(wrote).Round(time.Millisecond))
	if maxTracked > budget {
		t.Errorf("%d files tracked at once, over the budget of %d", maxTracked, budget)
	}
	s := statsWhen(t, stats, 20*time.Second, func(s map[string]int64) bool {
		return s["over_budget"] == 0 && s["untracked_reports"] > 0 && s["syncfs_passes"] > 0
	})
	t.Logf("stats: over_budget %d, untracked_reports %d, syncfs_passes %d, syncfs_errors %d, tracked %d",
		s["over_budget"], s["untracked_reports"], s["syncfs_passes"], s["syncfs_errors"], tracked(s))
	if s["over_budget"] != 0 {
		t.Errorf("over_budget %d 20 s after every file was clean, want 0", s["over_budget"])
	}
	if s["untracked_reports"] == 0 || s["syncfs_passes"] == 0 || s["syncfs_errors"] != 0 {
		t.Errorf("untracked_reports %d, syncfs_passes %d, syncfs_errors %d: want the first two positive, no error",
			s["untracked_reports"], s["syncfs_passes"], s["syncfs_errors"])
	}
	log := d.log.String()
	for _, line := range []string{"tracked-inode budget full", "new files are tracked again"} {
		if !strings.Contains(log, line) {
			t.Errorf("the log does not say %q", line)
		}
	}
	// Tracked again: a file written now is on b_dirty (an hour's expiry).
	late := filepath.Join(tree, "late")
	before := s["untracked_reports"]
	writeDirty(t, late, 4096)
	s = statsWhen(t, stats, 5*time.Second, func(s map[string]int64) bool { return s["b_dirty"] >= 1 })
	if s["b_dirty"] < 1 || s["untracked_reports"] != before {
		t.Errorf("a file written after the state was left: b_dirty %d, untracked_reports %d (was %d); want it tracked",
			s["b_dirty"], s["untracked_reports"], before)
	}
	if dt, _, err := cachestat(late, 0, 0); err != nil || dt == 0 {
		t.Errorf("the late file is clean (%d dirty pages, %v): nothing should have written it within its hour", dt, err)
	}
}

// TestTrackedInodeBudgetSyncfsError: an integrity tree on FUSE with a
// budget of 2 files; a third file, written while the server fails WRITE
// with EIO, is not tracked, and the pass that writes it back reports the
// failure from the filesystem's error cursor: syncfs_errors, an error in
// the log, and a shutdown whose last line counts a loss instead of
// saying that every file is clean.
func TestTrackedInodeBudgetSyncfsError(t *testing.T) {
	testfs.SkipShort(t, "the daemon over its tracked-inode budget on FUSE failing writeback")
	ffs := faultfs.MountT(t)
	d := runDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
max_tracked_inodes = 2
[[watch]]
path = %q
mode = "integrity"
expire = "1h"
`, ffs.Dir), daemonOpts{bin: plainBinary})
	stats := d.devStats("0:" + fmt.Sprint(minorOf(t, ffs.Dir)))
	writeHeld(t, filepath.Join(ffs.Dir, "a"), 8192)
	writeHeld(t, filepath.Join(ffs.Dir, "b"), 8192)
	if s := statsWhen(t, stats, 5*time.Second, func(s map[string]int64) bool { return tracked(s) == 2 }); tracked(s) != 2 {
		t.Fatalf("%d files tracked, want 2", tracked(s))
	}
	// The set full, a pass may run and its files be looked at again:
	// the fault comes once that has settled, so that it strikes the
	// third file's writeback, not theirs.
	time.Sleep(time.Second)
	ffs.Set(faultfs.Faults{WriteErr: syscall.EIO})
	writeHeld(t, filepath.Join(ffs.Dir, "c"), 8192)
	s := statsWhen(t, stats, 10*time.Second, func(s map[string]int64) bool { return s["syncfs_errors"] > 0 })
	// KNOWN RACE: the attempts that make room write the two tracked
	// files back (their writes fail too: the fault is the whole
	// filesystem's). When the third file's failed write is made before
	// the pass's syncfs (by another syncfs of the daemon's), its pages
	// are dropped and the pass, its descriptor opened after the error,
	// sees none. The loss is still logged and counted at the stop, but
	// not as the pass's; the stricter checks apply only when the pass
	// saw it.
	passSaw := s["syncfs_errors"] > 0
	if s["untracked_reports"] == 0 {
		t.Fatalf("untracked_reports %d: want it positive", s["untracked_reports"])
	}
	if !passSaw && !strings.Contains(d.log.String(), "data lost") {
		t.Fatalf("syncfs_errors 0 and no loss logged: the failed writeback is not reported")
	}
	if passSaw && !poll(2*time.Second, func() bool { return strings.Contains(d.log.String(), "reported a writeback error") }) {
		t.Errorf("the failed pass is not logged")
	}
	ffs.Set(faultfs.Faults{})
	d.term(t, 30*time.Second)
	log := d.log.String()
	if strings.Contains(log, "every tracked file is clean") || !strings.Contains(log, "exiting with files not written back") {
		t.Errorf("the shutdown's last line does not count the loss:\n%s", log)
	}
	if passSaw && !strings.Contains(log, "files not tracked over the tracked-inode budget") {
		t.Errorf("the shutdown does not name the failed pass's filesystem")
	}
	if !passSaw {
		t.Logf("the error was taken by the attempts' read of the error cursor, not by the pass (the known race)")
	}
}
