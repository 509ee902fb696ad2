package bdi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"flusherd/inode"
)

// newTestRegistry returns a Registry over a fakeFS whose devices are named
// by names (st_dev -> bdi name; missing: ENODEV), with stats files in a
// temporary directory, and stops it at the end of the test.
func newTestRegistry(t *testing.T, cfg Config, names map[uint64]string) (*Registry, *fakeFS, string) {
	t.Helper()
	dir := t.TempDir()
	fs := newFakeFS(func() time.Duration { return 0 })
	r := NewRegistry(Options{
		Config:     cfg,
		StatsDir:   dir,
		Opener:     fs,
		Thresholds: func() (uint64, uint64, error) { return 300, 100, nil },
		Resolve: func(dev uint64, path string) (string, error) {
			if n, ok := names[dev]; ok {
				return n, nil
			}
			return "", syscall.ENODEV
		},
	})
	t.Cleanup(r.Stop)
	return r, fs, dir
}

// TestRegistryDevices: a device's Writeback is made on its first use and
// reused after; two st_devs of one bdi (btrfs subvolumes) share it; a
// device that cannot be named is an error naming the path; rescans
// counted before the device existed are kept; Devices is sorted by name;
// Snapshot adds the thresholds; SetConfig reaches running devices and
// later ones.
func TestRegistryDevices(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		r, fs, _ := newTestRegistry(t, cfg, map[uint64]string{10: "8:0", 11: "btrfs-1", 12: "btrfs-1", 15: "7:3", 16: "9:1"})
		r.Rescanned(11)
		r.Rescanned(11)
		a, err := r.Device(10, "/a")
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := r.Device(10, "/a/b"); again != a {
			t.Fatal("a second Device call made another Writeback")
		}
		b1, _ := r.Device(11, "/b")
		b2, _ := r.Device(12, "/b/sub")
		if b1 != b2 || b1 == a {
			t.Fatalf("st_devs 11 and 12 of one bdi: %p and %p, want one Writeback (not %p)", b1, b2, a)
		}
		if s := b1.Snapshot(); s.Rescans != 2 {
			t.Errorf("rescans counted before the device started: %d, want 2", s.Rescans)
		}
		r.Rescanned(12)
		if s := b1.Snapshot(); s.Rescans != 3 {
			t.Errorf("rescans = %d, want 3", s.Rescans)
		}
		if _, err := r.Device(13, "/unnamed"); !errors.Is(err, syscall.ENODEV) || !strings.Contains(err.Error(), "/unnamed") {
			t.Errorf("an unnamed device: %v, want ENODEV naming /unnamed", err)
		}
		var names []string
		for _, wb := range r.Devices() {
			names = append(names, wb.Name)
		}
		if strings.Join(names, " ") != "8:0 btrfs-1" {
			t.Errorf("Devices = %v, want [8:0 btrfs-1]", names)
		}
		r.Device(16, "/d")
		r.Device(15, "/e")
		names = nil
		for _, wb := range r.Devices() {
			names = append(names, wb.Name)
		}
		if strings.Join(names, " ") != "7:3 8:0 9:1 btrfs-1" {
			t.Errorf("Devices = %v, want them sorted by name", names)
		}
		if every := a.stats.every; every != time.Second {
			t.Errorf("stats every %v with StatsEvery unset, want the default 1s", every)
		}
		if s := r.Snapshot(a); s.DirtyThresh != 300 || s.BackgroundThresh != 100 || s.BdiDirtyThresh != 300 {
			t.Errorf("thresholds %d/%d/%d, want 300/100/300", s.DirtyThresh, s.BackgroundThresh, s.BdiDirtyThresh)
		}
		f := fs.add("/a/f", 1, pg, 1)
		f.key.Dev = 10
		if err := r.MarkInodeDirty(f.path, f.key, "", Tree{Expire: time.Hour}); err != nil || a.Tracked() != 1 {
			t.Fatalf("MarkInodeDirty: %v, %d tracked on 8:0", err, a.Tracked())
		}
		if err := r.MarkInodeDirty("/x", inode.Key{Dev: 13, Ino: 1}, "", Tree{}); !errors.Is(err, syscall.ENODEV) {
			t.Errorf("MarkInodeDirty on an unnamed device: %v, want ENODEV", err)
		}
		short := cfg
		short.DirtyWritebackInterval = time.Minute
		r.SetConfig(short)
		synctest.Wait()
		a.mu.Lock()
		got := a.cfg.DirtyWritebackInterval
		a.mu.Unlock()
		if got != time.Minute {
			t.Errorf("a running device's interval after SetConfig: %v, want 1m", got)
		}
		c, _ := r.Device(14, "/c")
		if c != nil {
			t.Fatal("device 14 has no name, yet got a Writeback")
		}
	})
}

// TestRegistryTreeGone: a tree that is gone has its files dropped; when it
// was the last on its filesystem, the device is retired once it tracks
// nothing: its goroutine stops and its stats file and directory are
// removed. A device another st_dev still uses stays.
func TestRegistryTreeGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs, dir := newTestRegistry(t, testConfig(), map[uint64]string{10: "8:0", 11: "btrfs-1", 12: "btrfs-1"})
		f := fs.add("/a/f", 1, pg, 1)
		f.key.Dev = 10
		if err := r.MarkInodeDirty(f.path, f.key, "", Tree{Expire: time.Hour}); err != nil {
			t.Fatal(err)
		}
		a, _ := r.Device(10, "/a")
		b, _ := r.Device(11, "/b")
		r.Device(12, "/b/sub")
		synctest.Wait()
		stats := filepath.Join(dir, "bdi", "8:0", "stats")
		if _, err := os.Stat(stats); err != nil {
			t.Fatalf("no stats file for a running device: %v", err)
		}
		r.TreeGone("/a", 10, true)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		select {
		case <-a.Stopped():
		default:
			t.Fatal("the device of the last tree on it still runs")
		}
		if _, err := os.Stat(filepath.Dir(stats)); !os.IsNotExist(err) {
			t.Errorf("a retired device's stats directory: %v, want it removed", err)
		}
		if devs := r.Devices(); len(devs) != 1 || devs[0] != b {
			t.Errorf("devices after retiring 8:0: %v", devs)
		}
		if again, _ := r.Device(10, "/a"); again == a || again == nil {
			t.Error("a retired device's st_dev did not get a new Writeback")
		}
		// One of btrfs-1's two st_devs goes: the device stays.
		r.TreeGone("/b/sub", 12, true)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		select {
		case <-b.Stopped():
			t.Fatal("a device still used by another st_dev was stopped")
		default:
		}
	})
}

// TestRegistryShutdown: Shutdown drains every device within ctx, reports
// what its filesystem would not take (given up), what was lost earlier,
// and what was left when ctx ended, then stops the goroutines; a device is
// not made after it.
func TestRegistryShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.MaxPause = 100 * time.Millisecond
		r, fs, _ := newTestRegistry(t, cfg, map[uint64]string{10: "8:0", 11: "8:16"})
		mark := func(path string, dev, ino uint64, change func(f *fakeFile)) {
			f := fs.add(path, ino, pg, 1)
			f.key.Dev = dev
			change(f)
			if err := r.MarkInodeDirty(path, f.key, "", Tree{Expire: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
		mark("/a/ok", 10, 1, func(f *fakeFile) {})
		mark("/a/ro", 10, 2, func(f *fakeFile) { f.openErr = syscall.EROFS })
		mark("/b/stuck", 11, 3, func(f *fakeFile) { f.writeErr = syscall.EAGAIN })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rep := r.Shutdown(ctx)
		if g := rep.GivenUp["8:0"]; len(g) != 1 || g[0].Path != "/a/ro" || !errors.Is(g[0].Err, syscall.EROFS) {
			t.Errorf("given up on 8:0: %+v, want /a/ro with EROFS", g)
		}
		if _, ok := rep.Left["8:0"]; ok {
			t.Errorf("8:0 drained, yet reported left: %v", rep.Left["8:0"])
		}
		if l := rep.Left["8:16"]; len(l) != 1 || l[0] != "/b/stuck" {
			t.Errorf("left on 8:16: %v, want [/b/stuck]", l)
		}
		if len(rep.GivenUp) != 1 || len(rep.Left) != 1 {
			t.Errorf("report %+v, want one device in each part", rep)
		}
		for _, wb := range r.Devices() {
			select {
			case <-wb.Stopped():
			default:
				t.Errorf("%s still runs after Shutdown", wb.Name)
			}
		}
		if _, err := r.Device(12, "/c"); err == nil {
			t.Error("a device was made after Shutdown")
		}
	})
}

// TestDrainPolls: Drain retries a file that stays dirty with a pause that
// doubles from min_pause up to 100 ms, not in a busy loop, and returns
// ctx's error when ctx ends with the file still tracked.
func TestDrainPolls(t *testing.T) {
	cfg := testConfig()
	cfg.MinPause = 10 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/stuck", 1, pg, 1)
		f.writeErr = syscall.EAGAIN
		h.mark(f, time.Hour)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := h.wb.Drain(ctx, "test"); !errors.Is(err, context.DeadlineExceeded) {
			h.t.Fatalf("Drain of a file that stays dirty: %v, want the deadline", err)
		}
		// Drain's works at 0, 10, 30, 70, 150, 250, ... 950 ms (13);
		// the device's own b_more_io_wait retry, due at the same
		// instant as one of them, sometimes runs as a pass of its own.
		if n := len(h.fs.callsOf("sync_file_range", "/stuck")); n < 13 || n > 14 {
			h.t.Errorf("%d attempts in 1 s, want 13 or 14", n)
		}
	})
}

// TestTracksByName: a scan skips a file only when its number is tracked
// under its own name: a new file that took a deleted file's number (ext4
// reuses them at once) is looked at, as is another name of a tracked
// inode.
func TestTracksByName(t *testing.T) {
	epoch := time.Now()
	wb := New("8:0", testConfig(), func() time.Duration { return time.Since(epoch) }, memOpener{}, nil, nil)
	key := inode.Key{Dev: 8, Ino: 12}
	wb.MarkInodeDirty(key, "/srv/x/old", "", Tree{Expire: time.Hour})
	for path, want := range map[string]bool{"/srv/x/old": true, "/srv/y/new": false, "/srv/x/old2": false} {
		if got := wb.Tracks(key, path); got != want {
			t.Errorf("Tracks(%v, %q) = %v, want %v", key, path, got, want)
		}
	}
	if wb.Tracks(inode.Key{Dev: 8, Ino: 13}, "/srv/x/old") {
		t.Error("Tracks of an untracked number: true")
	}
}
