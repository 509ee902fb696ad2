package bdi

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/tree"
)

// TestRemoveStaleTemps: the temporary files of WriteFileAtomic that a
// killed process left (renameio's ".stats<digits>" and the older
// ".stats-<digits>") are removed where the daemon writes stats files
// (watch/ and bdi/<dev>/); the stats files, other names, directories,
// symlinks, and files of those names anywhere else under stats.dir (a
// user's, in a watched tree below it) are not; and WriteFileAtomic itself
// leaves none behind.
func TestRemoveStaleTemps(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFileAtomic(filepath.Join(dir, "bdi", "7:0", "stats"), func(w io.Writer) error { _, err := io.WriteString(w, "x\n"); return err }); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(filepath.Join(dir, "bdi", "7:0", "stats"), func(w io.Writer) error { return errors.New("fails") }); err == nil {
		t.Fatal("a failing write was not reported")
	}
	if n, err := RemoveStaleTemps(dir); n != 0 || err != nil {
		t.Fatalf("after WriteFileAtomic alone: %d removed (%v), want none left behind", n, err)
	}
	stale := []string{"bdi/7:0/.stats-4567", "bdi/7:0/.stats98765432", "bdi/8:1/.stats2", "watch/.stats1"}
	kept := []string{"bdi/7:0/stats", "watch/stats", ".statsx1", "bdi/.dirty123", "stats123", ".stats-",
		".stats123", "tree/data/.stats2024", "tree/.stats-7", "bdi/7:0/sub/.stats9", "watch/x/.stats3", "bdi/.stats5"}
	for _, p := range append(append([]string{}, stale...), kept...) {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, ".stats55"), 0o755); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, ".stats77")); err != nil {
		t.Fatal(err)
	}
	n, err := RemoveStaleTemps(dir)
	if err != nil || n != len(stale) {
		t.Errorf("RemoveStaleTemps = %d, %v; want %d, nil", n, err, len(stale))
	}
	for _, p := range stale {
		if _, err := os.Lstat(filepath.Join(dir, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: still there (%v)", p, err)
		}
	}
	for _, p := range append(kept, ".stats55", ".stats77") {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s: removed (%v)", p, err)
		}
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the symlink's target: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dir, "bdi", "7:0", "stats"))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("stats file mode %v (%v), want 0644", fi.Mode(), err)
	}
}

// TestStatsWriterSchedule: the stats file is written at once the first
// time; a change is written once `every` has passed since the last write,
// not before; no change, no write; a device that has gone idle is written
// at once; after a failed write the next try waits its backoff (unless
// forced), and a write that succeeds again says so.
func TestStatsWriterSchedule(t *testing.T) {
	dir := t.TempDir()
	core, logs := observer.New(zap.InfoLevel)
	cfg := testConfig()
	wb, fs, now := newIdleWB(t, cfg)
	thresholdErr := error(nil)
	wb.stats = NewStatsWriter(dir, "7:0", time.Second, func() (uint64, uint64, error) { return 300, 100, thresholdErr }, zap.New(core))
	path := filepath.Join(dir, "bdi", "7:0", "stats")
	bDirty := func() int { t.Helper(); return statsBDirty(t, path) }
	wb.writeStats(false)
	if n := bDirty(); n != 0 {
		t.Fatalf("first write: b_dirty %d, want 0", n)
	}
	thresholds := func() (uint64, uint64) {
		data, _ := os.ReadFile(path)
		s, err := ParseStats(data, pg)
		if err != nil {
			t.Fatal(err)
		}
		return s.DirtyThresh, s.BackgroundThresh
	}
	if d, b := thresholds(); d != 300 || b != 100 {
		t.Errorf("thresholds in the file %d, %d; want 300, 100", d, b)
	}
	f := fs.add("/a", 1, pg, 1)
	wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: time.Hour})
	*now = 999 * time.Millisecond
	wb.writeStats(false)
	if n := bDirty(); n != 0 {
		t.Fatalf("a change within `every` of the last write was written (b_dirty %d)", n)
	}
	if at, due := wb.stats.due(wb.gen); !due || at != time.Second {
		t.Fatalf("due = %v, %v; want at 1s", at, due)
	}
	*now = time.Second
	wb.writeStats(false)
	if n := bDirty(); n != 1 {
		t.Fatalf("a change `every` after the last write: b_dirty %d, want 1", n)
	}
	if _, due := wb.stats.due(wb.gen); due {
		t.Fatal("due with nothing new")
	}
	// Another change half of `every` after that write: held back.
	g := fs.add("/g", 2, pg, 1)
	wb.MarkInodeDirty(g.key, g.path, "", tree.Tree{Expire: time.Hour})
	*now = 1500 * time.Millisecond
	wb.writeStats(false)
	if n := bDirty(); n != 1 {
		t.Fatalf("a change 0.5 s after the last write was written (b_dirty %d)", n)
	}
	*now = 2 * time.Second
	wb.writeStats(false)
	if n := bDirty(); n != 2 {
		t.Fatalf("`every` after the last write: b_dirty %d, want 2", n)
	}
	os.Remove(path)
	*now = time.Minute
	wb.writeStats(false)
	if n := bDirty(); n != -1 {
		t.Fatal("rewritten with nothing new")
	}
	thresholdErr = errors.New("no /proc/vmstat")
	wb.writeStats(true)
	if n := bDirty(); n != 2 {
		t.Fatalf("forced: b_dirty %d, want 2", n)
	}
	if d, b := thresholds(); d != 0 || b != 0 {
		t.Errorf("thresholds that could not be read: %d, %d in the file, want 0, 0", d, b)
	}
	// Idle: written at once, within `every`.
	*now += time.Millisecond
	wb.DropUnder("/")
	wb.writeStats(false)
	if n := bDirty(); n != 0 {
		t.Fatalf("gone idle: b_dirty %d, want 0 at once", n)
	}
	// The file cannot be written: bdi/ is a regular file.
	if err := os.RemoveAll(filepath.Join(dir, "bdi")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bdi"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	failedAt := *now + time.Second
	*now = failedAt
	wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: time.Hour})
	wb.writeStats(false)
	if at, due := wb.stats.due(wb.gen); !due || at != failedAt+statsRetryMin {
		t.Fatalf("after a failed write: due %v, %v; want at %v", at, due, failedAt+statsRetryMin)
	}
	os.Remove(filepath.Join(dir, "bdi"))
	*now = failedAt + statsRetryMin - 1
	wb.writeStats(false)
	if n := bDirty(); n != -1 {
		t.Fatal("written before the backoff after a failure had passed")
	}
	*now = failedAt + statsRetryMin
	wb.writeStats(false)
	if n := bDirty(); n != 1 {
		t.Fatalf("once the backoff passed: b_dirty %d, want 1", n)
	}
	if n := logs.FilterMessageSnippet("stats file written again").Len(); n != 1 {
		t.Errorf("%d lines saying the file is written again, want 1", n)
	}
}

// statsBDirty returns b_dirty from the stats file at path, -1 when there
// is none.
func statsBDirty(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	s, err := ParseStats(data, pg)
	if err != nil {
		t.Fatal(err)
	}
	return s.BDirty
}
