package bdi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/inode"
	"flusherd/tree"
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
		if err := r.MarkInodeDirty(f.path, f.key, "", tree.Tree{Expire: time.Hour}); err != nil || a.Tracked() != 1 {
			t.Fatalf("MarkInodeDirty: %v, %d tracked on 8:0", err, a.Tracked())
		}
		if err := r.MarkInodeDirty("/x", inode.Key{Dev: 13, Ino: 1}, "", tree.Tree{}); !errors.Is(err, syscall.ENODEV) {
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
		if err := r.MarkInodeDirty(f.path, f.key, "", tree.Tree{Expire: time.Hour}); err != nil {
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
		r.TreeGone("/a", 10, true, false)
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
		r.TreeGone("/b/sub", 12, true, false)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		select {
		case <-b.Stopped():
			t.Fatal("a device still used by another st_dev was stopped")
		default:
		}
	})
}

// TestRegistryRetire: Retire, after a reload took out the last tree on a
// device, stops it once the retired tree's files are written back and
// forgotten, and removes its stats directory; not while one is tracked,
// and not when unused says the device is used again.
func TestRegistryRetire(t *testing.T) {
	for _, used := range []bool{false, true} {
		t.Run(fmt.Sprintf("used=%v", used), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, fs, dir := newTestRegistry(t, testConfig(), map[uint64]string{10: "8:0"})
				f := fs.add("/a/f", 1, pg, 1)
				f.key.Dev = 10
				if err := r.MarkInodeDirty(f.path, f.key, "", tree.Tree{Expire: time.Hour}); err != nil {
					t.Fatal(err)
				}
				a, _ := r.Device(10, "/a")
				synctest.Wait()
				stats := filepath.Join(dir, "bdi", "8:0", "stats")
				asked := 0
				r.Retire(10, func() bool { asked++; return !used })
				time.Sleep(time.Second)
				synctest.Wait()
				select {
				case <-a.Stopped():
					t.Fatal("a device with a file tracked was stopped")
				default:
				}
				if asked != 0 {
					t.Errorf("unused asked %d times while a file is tracked", asked)
				}
				if n := r.TreeRemoved("/a", func(string) bool { return false }); n != 1 {
					t.Fatalf("TreeRemoved: %d files, want 1", n)
				}
				time.Sleep(time.Second)
				synctest.Wait()
				if got := fs.dirtyFiles(); len(got) != 0 {
					t.Errorf("dirty after the retired tree's writeback: %q", got)
				}
				stopped := false
				select {
				case <-a.Stopped():
					stopped = true
				default:
				}
				_, err := os.Stat(filepath.Dir(stats))
				if stopped == used || os.IsNotExist(err) == used || asked != 1 {
					t.Errorf("used again: %v; stopped: %v, stats directory: %v, unused asked %d times", used, stopped, err, asked)
				}
			})
		})
	}
}

// TestRegistryShutdown: Shutdown drains every device within ctx, reports
// what its filesystem would not take or open (given up: EROFS, an open's
// EIO), what was lost, and what else was left when ctx ended, then stops the goroutines; a device is
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
			if err := r.MarkInodeDirty(path, f.key, "", tree.Tree{Expire: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
		mark("/a/ok", 10, 1, func(f *fakeFile) {})
		mark("/a/ro", 10, 2, func(f *fakeFile) { f.openErr = syscall.EROFS })
		mark("/a/shut", 10, 4, func(f *fakeFile) {
			f.openErr = &os.PathError{Op: "open_by_handle_at", Path: "h", Err: syscall.EIO} // a filesystem shut down
		})
		mark("/b/stuck", 11, 3, func(f *fakeFile) { f.writeErr = syscall.EAGAIN })
		var lost *fakeFile
		mark("/b/lost", 11, 5, func(f *fakeFile) { f.writeErr, lost = syscall.EIO, f })
		go func() {
			// The kernel marks the failed pages clean: the data is lost.
			time.Sleep(time.Second)
			lost.set(func(f *fakeFile) { f.writeErr = nil; clear(f.dirty) })
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rep := r.Shutdown(ctx)
		given := map[string]error{}
		for _, g := range rep.GivenUp["8:0"] {
			given[g.Path] = g.Err
		}
		if len(given) != 2 || !errors.Is(given["/a/ro"], syscall.EROFS) || !errors.Is(given["/a/shut"], syscall.EIO) {
			t.Errorf("given up on 8:0: %v, want /a/ro with EROFS and /a/shut with EIO", given)
		}
		if _, ok := rep.Left["8:0"]; ok {
			t.Errorf("8:0 drained, yet reported left: %v", rep.Left["8:0"])
		}
		if l := rep.Left["8:16"]; len(l) != 1 || l[0] != "/b/stuck" {
			t.Errorf("left on 8:16: %v, want [/b/stuck] (a lost file is reported lost, not left)", l)
		}
		if l := rep.Lost["8:16"]; len(l) != 1 || l[0].Path != "/b/lost" || !errors.Is(l[0].Err, syscall.EIO) {
			t.Errorf("lost on 8:16: %+v, want /b/lost with EIO", l)
		}
		if len(rep.GivenUp) != 1 || len(rep.Left) != 1 || len(rep.Lost) != 1 {
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
	wb := New("8:0", testConfig(), func() time.Duration { return time.Since(epoch) }, Files{Opener: memOpener{}, Handles: memOpener{}}, nil, nil)
	key := inode.Key{Dev: 8, Ino: 12}
	wb.MarkInodeDirty(key, "/srv/x/old", "", tree.Tree{Expire: time.Hour})
	for path, want := range map[string]bool{"/srv/x/old": true, "/srv/y/new": false, "/srv/x/old2": false} {
		if got := wb.Tracks(key, path); got != want {
			t.Errorf("Tracks(%v, %q) = %v, want %v", key, path, got, want)
		}
	}
	if wb.Tracks(inode.Key{Dev: 8, Ino: 13}, "/srv/x/old") {
		t.Error("Tracks of an untracked number: true")
	}
}

// TestMarkInodesDirty: a batch of reports (Registry.MarkInodesDirty)
// leaves every device's lists as the same reports made one by one do:
// across runs of one device longer than markBatchMax, several devices,
// reports without a handle of untracked files (the handle is asked of the
// opener, without the lock), closes with no write, and a rename; a report
// on a device that cannot be named gets its error and the others none; and
// a batch on an idle device wakes its loop, which writes the files back.
func TestMarkInodesDirty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		newReg := func() (*Registry, *handleFS) {
			fs := &handleFS{fakeFS: newFakeFS(func() time.Duration { return 0 })}
			r := NewRegistry(Options{Config: testConfig(), Opener: fs, Handles: fs,
				Resolve: func(dev uint64, path string) (string, error) {
					if dev == 13 {
						return "", syscall.ENODEV
					}
					return fmt.Sprintf("7:%d", dev), nil
				}})
			t.Cleanup(r.Stop)
			return r, fs
		}
		batchReg, batchFS := newReg()
		singleReg, singleFS := newReg()
		tr := tree.Tree{Expire: time.Second}
		var first, second []Mark
		for _, fs := range []*handleFS{batchFS, singleFS} {
			first, second = first[:0], second[:0] // the same on both sides
			ino := uint64(0)
			for _, dev := range []uint64{7, 7, 8, 13, 7} {
				n := map[uint64]int{7: 70, 8: 3, 13: 2}[dev]
				for range n {
					ino++
					f := fs.add(fmt.Sprintf("/d%d/f%d", dev, ino), ino, pg, 1)
					f.key.Dev = dev
					m := Mark{Path: f.path, Key: f.key, Tree: tr}
					if ino%3 == 0 {
						m.Handle = f.handle // some with the handle (fanotify), some without
					}
					first = append(first, m)
					m.Closed = ino%4 == 0
					if ino == 5 {
						m.Path = "/d7/renamed"
					}
					second = append(second, m)
				}
			}
		}
		// A file on each side whose data was lost (on the failed list),
		// the two in step: a close with no write keeps the loss
		// (LostBefore, its error kept), a write would end it.
		var lost []*fakeFile
		for _, side := range []struct {
			r  *Registry
			fs *handleFS
		}{{batchReg, batchFS}, {singleReg, singleFS}} {
			f := side.fs.add("/d8/lost", 999, pg, 1)
			f.key.Dev = 8
			f.set(func(f *fakeFile) { f.writeErr = syscall.EIO })
			if err := side.r.MarkInodeDirty(f.path, f.key, f.handle, tree.Tree{}); err != nil {
				t.Fatal(err)
			}
			lost = append(lost, f)
		}
		time.Sleep(6 * time.Second) // a kupdate pass: EIO
		synctest.Wait()
		for _, f := range lost {
			f.set(func(f *fakeFile) { f.writeErr = nil; clear(f.dirty) })
		}
		time.Sleep(6 * time.Second) // the retry: clean, the data lost
		synctest.Wait()
		for _, r := range []*Registry{batchReg, singleReg} {
			if wb, _ := r.Device(8, "/d8"); len(wb.Failed()) != 1 {
				t.Fatalf("Failed() = %+v, want /d8/lost", wb.Failed())
			}
		}
		f := lost[0]
		second = append(second, Mark{Path: f.path, Key: f.key, Handle: f.handle, Tree: tr, Closed: true})
		for i, batch := range [][]Mark{first, second} {
			batchReg.MarkInodesDirty(batch)
			for _, m := range batch {
				mark := singleReg.MarkInodeDirty
				if m.Closed {
					mark = singleReg.MarkInodeClosed
				}
				err := mark(m.Path, m.Key, m.Handle, m.Tree)
				if fmt.Sprint(m.Err) != fmt.Sprint(err) {
					t.Errorf("batch %d, %s: error %v in the batch, %v alone", i, m.Path, m.Err, err)
				}
				if (m.Key.Dev == 13) != errors.Is(m.Err, syscall.ENODEV) {
					t.Errorf("batch %d, %s (dev %d): error %v", i, m.Path, m.Key.Dev, m.Err)
				}
			}
			// The background checks count every file on both sides
			// (before the kupdate pass at 15 s).
			time.Sleep(2 * backgroundCheckInterval)
			synctest.Wait()
			a, b := batchReg.Devices(), singleReg.Devices()
			if len(a) != 2 || len(b) != 2 {
				t.Fatalf("devices: %d batched, %d alone, want 2", len(a), len(b))
			}
			for j := range a {
				got, want := a[j].Inodes(), b[j].Inodes()
				slices.SortFunc(got, func(x, y InodeInfo) int { return cmp.Compare(x.Key.Ino, y.Key.Ino) })
				slices.SortFunc(want, func(x, y InodeInfo) int { return cmp.Compare(x.Key.Ino, y.Key.Ino) })
				if d := gocmp.Diff(want, got); d != "" {
					t.Errorf("batch %d, device %s: lists differ (-alone +batched):\n%s", i, a[j].Name, d)
				}
				if len(got) == 0 {
					t.Errorf("batch %d, device %s: nothing tracked", i, a[j].Name)
				}
			}
		}
		want := 0
		for _, m := range first {
			if m.Handle == "" && m.Key.Dev != 13 {
				want++ // untracked, no handle: asked of the opener
			}
		}
		if n := len(batchFS.callsOf("handle_of", "")); n != want || n != len(singleFS.callsOf("handle_of", "")) {
			t.Errorf("%d handles asked of the opener, want %d (as alone: %d)", n, want, len(singleFS.callsOf("handle_of", "")))
		}
		// Idle devices (everything written back), then a batch: it wakes
		// the loop, which has no timer set while idle.
		for range 2 {
			time.Sleep(time.Minute)
			synctest.Wait()
			for _, wb := range batchReg.Devices() {
				if n := wb.Tracked(); n != 0 {
					t.Fatalf("device %s: %d files still tracked a minute later", wb.Name, n)
				}
			}
			late := batchFS.add(fmt.Sprintf("/d7/late%d", batchFS.handles), 1000+uint64(batchFS.handles), pg, 1)
			batchReg.MarkInodesDirty([]Mark{{Path: late.path, Key: late.key, Handle: late.handle, Tree: tr}})
			time.Sleep(time.Minute)
			synctest.Wait()
			if len(batchFS.callsOf("sync_file_range", late.path)) == 0 {
				t.Errorf("%s, reported to an idle device, not written back a minute later: the batch did not wake its loop", late.path)
			}
		}
	})
}

// oneDeviceRegistry is a Registry on a fake filesystem (opened by handle)
// whose every st_dev is the device 7:0, stopped at the test's end.
func oneDeviceRegistry(t *testing.T) (*Registry, *handleFS) {
	fs := &handleFS{fakeFS: newFakeFS(func() time.Duration { return 0 })}
	r := NewRegistry(Options{Config: testConfig(), Opener: fs, Handles: fs,
		Resolve: func(dev uint64, path string) (string, error) { return "7:0", nil }})
	t.Cleanup(r.Stop)
	return r, fs
}

// TestMarkKeepName: a report with KeepName (a scan's, which read the name
// from a directory some time before) tracks an untracked inode under its
// name, but leaves a tracked inode the name it has (events may have
// renamed it since); the same report without KeepName renames it. (The
// untracked one has no handle: it is marked alone, the opener asked for
// its handle.)
func TestMarkKeepName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs := oneDeviceRegistry(t)
		tr := tree.Tree{Expire: time.Hour}
		f := fs.add("/d/new", 1, pg, 1)
		g := fs.add("/d/g", 2, pg, 1)
		if err := r.MarkInodeDirty(f.path, f.key, f.handle, tr); err != nil {
			t.Fatal(err)
		}
		ms := []Mark{{Path: "/d/old", Key: f.key, Tree: tr, KeepName: true}, {Path: g.path, Key: g.key, Tree: tr, KeepName: true}}
		r.MarkInodesDirty(ms)
		for _, m := range ms {
			if m.Err != nil {
				t.Fatal(m.Err)
			}
		}
		if !r.Tracks(f.key, f.path) || r.Tracks(f.key, "/d/old") {
			t.Errorf("a tracked file reported with KeepName under an older name: not tracked as %s any more", f.path)
		}
		if !r.Tracks(g.key, g.path) {
			t.Errorf("an untracked file reported with KeepName: not tracked as %s", g.path)
		}
		r.MarkInodesDirty([]Mark{{Path: "/d/renamed", Key: f.key, Tree: tr}})
		if !r.Tracks(f.key, "/d/renamed") {
			t.Errorf("a report without KeepName did not rename the tracked file")
		}
	})
}

// TestMarkLeaving: a report with Leaving (made with a tree a reload has
// removed) tracks the file as the reload leaves the removed tree's files:
// it is written back at the next pass, though its expire is an hour away,
// and then forgotten.
func TestMarkLeaving(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs := oneDeviceRegistry(t)
		tr := tree.Tree{Expire: time.Hour}
		f := fs.add("/d/leaving", 1, pg, 1)
		g := fs.add("/d/staying", 2, pg, 1)
		ms := []Mark{{Path: f.path, Key: f.key, Handle: f.handle, Tree: tr, Leaving: true}, {Path: g.path, Key: g.key, Handle: g.handle, Tree: tr}}
		r.MarkInodesDirty(ms)
		time.Sleep(10 * time.Second) // a few passes, well before the hour
		synctest.Wait()
		if len(fs.callsOf("sync_file_range", f.path)) == 0 {
			t.Errorf("%s (leaving) not written back at the next pass", f.path)
		}
		if r.Tracks(f.key, "") {
			t.Errorf("%s (leaving) still tracked after its writeback", f.path)
		}
		if len(fs.callsOf("sync_file_range", g.path)) != 0 || !r.Tracks(g.key, g.path) {
			t.Errorf("%s (not leaving, expire an hour away): written back or not tracked", g.path)
		}
	})
}

// onlyDeviceStats returns the stats of r's one device (oneDeviceRegistry).
func onlyDeviceStats(t *testing.T, r *Registry) Stats {
	t.Helper()
	ds := r.Devices()
	if len(ds) != 1 {
		t.Fatalf("%d devices, want 1", len(ds))
	}
	return ds[0].Snapshot()
}

// attempted reports whether f was opened more than once (the background
// check's count of it, after its write) or written back: an attempt on it
// ran.
func attempted(fs *handleFS, f *fakeFile) bool {
	return len(fs.callsOf("open_by_handle", string(f.handle))) > 1 || len(fs.callsOf("sync_file_range", f.path)) > 0
}

// markFiles reports each of the fake files as written, under tree, with
// its handle.
func markFiles(t *testing.T, r *Registry, tr tree.Tree, files ...*fakeFile) {
	t.Helper()
	for _, f := range files {
		if err := r.MarkInodeDirty(f.path, f.key, f.handle, tr); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInodeUnlinked: a name of a tracked file deleted (InodeUnlinked with
// its handle) brings its attempt forward to the next pass, though its
// expiry is an hour away: a file gone for good is found so and forgotten
// (inodes_gone), one that still exists (another name, held open) is
// written back and forgotten once clean. A report with another handle (the
// number given to a new file), without a handle, or of a file not tracked
// changes nothing: no attempt before the hour, nothing tracked.
func TestInodeUnlinked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs := oneDeviceRegistry(t)
		tr := tree.Tree{Expire: time.Hour}
		gone := fs.add("/d/gone", 1, pg, 1)
		linked := fs.add("/d/linked", 2, pg, 1)
		reused := fs.add("/d/reused", 3, pg, 1)
		nohandle := fs.add("/d/nohandle", 4, pg, 1)
		untracked := fs.add("/d/untracked", 5, pg, 1)
		markFiles(t, r, tr, gone, linked, reused, nohandle)
		fs.remove(gone.path)
		r.InodeUnlinked(gone.key, gone.handle)
		r.InodeUnlinked(linked.key, linked.handle)
		r.InodeUnlinked(reused.key, "h-other")
		r.InodeUnlinked(nohandle.key, "")
		r.InodeUnlinked(untracked.key, untracked.handle)
		r.InodeUnlinked(inode.Key{Dev: 99, Ino: 1}, "h1") // a device not known
		time.Sleep(10 * time.Second)                      // two passes, well before the hour
		synctest.Wait()
		if r.Tracks(gone.key, "") {
			t.Errorf("%s: deleted, still tracked after the next pass", gone.path)
		}
		if len(fs.callsOf("open_by_handle", string(gone.handle))) == 0 {
			t.Errorf("%s: no attempt looked for it", gone.path)
		}
		if len(fs.callsOf("sync_file_range", linked.path)) == 0 || r.Tracks(linked.key, "") {
			t.Errorf("%s: one name deleted, the file still there: not written back and forgotten at the next pass", linked.path)
		}
		for _, f := range []*fakeFile{reused, nohandle} {
			if attempted(fs, f) || !r.Tracks(f.key, f.path) {
				t.Errorf("%s: attempted before its expiry, or no longer tracked", f.path)
			}
		}
		if r.Tracks(untracked.key, "") {
			t.Errorf("%s: tracked by a deletion", untracked.path)
		}
		if len(r.Devices()) != 1 {
			t.Fatalf("%d devices, want 1 (a deletion on an unknown device makes none)", len(r.Devices()))
		}
		if s := onlyDeviceStats(t, r); s.InodesGone != 1 {
			t.Errorf("inodes_gone %d, want 1", s.InodesGone)
		}
	})
}

// TestNameUnlinked: a deletion told by name (inotify's IN_DELETE, no
// handle) brings the attempt of the tracked inode with that key and name
// forward to the next pass, which forgets a file gone and writes back one
// that another name keeps; a name that is not the inode's (the number
// given to another file, tracked under its own name), a name of no
// tracked inode, an empty name and an unknown device change nothing before
// the expiry. A new file given a deleted file's number and reported
// without a handle is told apart by its handle, asked for since the
// deletion was told (inode.Unlinked): tracked afresh, the deleted one
// forgotten as gone.
func TestNameUnlinked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs := oneDeviceRegistry(t)
		tr := tree.Tree{Expire: time.Hour}
		gone := fs.add("/d/gone", 1, pg, 1)
		linked := fs.add("/d/linked", 2, pg, 1)
		renamed := fs.add("/d/renamed", 3, pg, 1)
		markFiles(t, r, tr, gone, linked, renamed)
		fs.remove(gone.path)
		r.NameUnlinked(gone.key, gone.path)
		r.NameUnlinked(linked.key, linked.path)
		r.NameUnlinked(renamed.key, "/d/old-name")
		r.NameUnlinked(inode.Key{Dev: gone.key.Dev, Ino: 77}, "/d/untracked")
		r.NameUnlinked(inode.Key{Dev: 99, Ino: 1}, "/d/gone") // a device not known
		r.NameUnlinked(renamed.key, "")
		// A file deleted, its number given at once to a new file,
		// reported without a handle (inotify): its handle is asked for,
		// and the new file is tracked afresh, at its own expiry.
		taken := fs.add("/d/taken", 5, pg, 1)
		taken.set(func(f *fakeFile) { f.handle = inode.MakeHandle(1, []byte("ino5gen1")) })
		if err := r.MarkInodeDirty(taken.path, taken.key, "", tr); err != nil {
			t.Fatal(err)
		}
		fs.remove(taken.path)
		r.NameUnlinked(taken.key, taken.path)
		nf := fs.add("/d/new", 5, pg, 1)
		nf.set(func(f *fakeFile) { f.handle = inode.MakeHandle(1, []byte("ino5gen2")) })
		if err := r.MarkInodeDirty(nf.path, nf.key, "", tr); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second) // two passes, well before the hour
		synctest.Wait()
		if r.Tracks(gone.key, "") {
			t.Errorf("%s: deleted, still tracked after the next pass", gone.path)
		}
		if attempted(fs, nf) || !r.Tracks(nf.key, nf.path) {
			t.Errorf("%s (a deleted file's number): attempted before its expiry, or not tracked", nf.path)
		}
		if len(fs.callsOf("sync_file_range", linked.path)) == 0 || r.Tracks(linked.key, "") {
			t.Errorf("%s: a name deleted, the file still there: not written back and forgotten at the next pass", linked.path)
		}
		if attempted(fs, renamed) || !r.Tracks(renamed.key, renamed.path) {
			t.Errorf("%s: another name's deletion had it attempted before its expiry, or it is no longer tracked", renamed.path)
		}
		if len(r.Devices()) != 1 {
			t.Fatalf("%d devices, want 1 (a deletion on an unknown device makes none)", len(r.Devices()))
		}
		if s := onlyDeviceStats(t, r); s.InodesGone != 2 {
			t.Errorf("inodes_gone %d, want 2", s.InodesGone)
		}
	})
}

// TestCheckNames: after a rescan (events may have been lost), a tracked
// file whose name finds nothing (deleted) or another inode (replaced by a
// rename over it) is requeued, and the next pass forgets it; one renamed
// (its new name unseen) is written back early, as is one whose directory
// was moved and replaced by a symlink; one still there, and one outside
// the rescanned tree, are left for their expiry. The names are
// real files, looked at with lstat(2); the fake opener stands for them.
func TestCheckNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs := oneDeviceRegistry(t)
		tr := tree.Tree{Expire: time.Hour}
		base := t.TempDir()
		root, other := filepath.Join(base, "tree"), filepath.Join(base, "other")
		for _, d := range []string{root, other} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		sub := filepath.Join(root, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		inSub := sub + "/f"
		files := map[string]*fakeFile{}
		for i, p := range []string{root + "/keep", root + "/gone", root + "/replaced", root + "/renamed", other + "/gone", inSub} {
			if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			key, _, err := inode.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			f := fs.add(p, uint64(i+1), pg, 1)
			f.set(func(f *fakeFile) { f.key = key })
			files[p] = f
			if err := r.MarkInodeDirty(p, key, f.handle, tr); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{root + "/gone", other + "/gone"} {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			fs.remove(p)
		}
		replaced := root + "/replaced"
		if err := os.WriteFile(replaced+".tmp", []byte("new"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(replaced+".tmp", replaced); err != nil {
			t.Fatal(err)
		}
		fs.remove(replaced)
		renamed := files[root+"/renamed"]
		if err := os.Rename(renamed.path, root+"/renamed2"); err != nil {
			t.Fatal(err)
		}
		fs.mu.Lock()
		delete(fs.files, renamed.path)
		renamed.path = root + "/renamed2"
		fs.files[renamed.path] = renamed
		fs.mu.Unlock()

		// A directory replaced by a symlink to one that holds a file of
		// the same name: the tracked file's name is gone.
		if err := os.Rename(sub, other+"/sub"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(other, sub); err != nil {
			t.Fatal(err)
		}
		if n := r.known(files[replaced].key.Dev).CheckNames(root); n != 4 {
			t.Errorf("CheckNames requeued %d files, want 4 (gone, replaced, renamed, under the symlink)", n)
		}
		time.Sleep(10 * time.Second) // two passes, well before the hour
		synctest.Wait()
		for _, p := range []string{root + "/gone", replaced} {
			if r.Tracks(files[p].key, "") {
				t.Errorf("%s: still tracked after the next pass", p)
			}
		}
		if len(fs.callsOf("sync_file_range", renamed.path)) == 0 {
			t.Errorf("%s: renamed, its name not seen: not written back at the next pass", renamed.path)
		}
		if len(fs.callsOf("open_by_handle", string(files[inSub].handle))) == 0 {
			t.Errorf("%s: its directory replaced by a symlink: not looked at by the next pass", inSub)
		}
		for _, p := range []string{root + "/keep", other + "/gone"} {
			if attempted(fs, files[p]) || !r.Tracks(files[p].key, p) {
				t.Errorf("%s: attempted before its expiry, or no longer tracked", p)
			}
		}
		if s := onlyDeviceStats(t, r); s.InodesGone != 2 {
			t.Errorf("inodes_gone %d, want 2", s.InodesGone)
		}
	})
}

// TestNumberTakenDuringAttempt: the file of a tracked inode is deleted and
// a new file takes its number while an attempt runs on the old one (its
// handle, known, is stale): the new file is written, and the old one is
// counted in inodes_gone.
func TestNumberTakenDuringAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs := oneDeviceRegistry(t)
		old := fs.add("/d/old", 1, pg, 1)
		old.set(func(f *fakeFile) { f.handle = inode.MakeHandle(1, []byte("ino1gen1")) })
		if err := r.MarkInodeDirty(old.path, old.key, old.handle, tree.Tree{Expire: 0}); err != nil {
			t.Fatal(err)
		}
		afterSample(t, fs.fakeFS, old)
		old.set(func(f *fakeFile) {
			f.onOpen = func() {
				// In the attempt's open: the file is deleted and
				// a new one, reported, takes its number.
				fs.remove("/d/old")
				nf := fs.add("/d/new", 1, pg, 1)
				nf.set(func(f *fakeFile) { f.handle = inode.MakeHandle(1, []byte("ino1gen2")) })
				if err := r.MarkInodeDirty(nf.path, nf.key, nf.handle, tree.Tree{Expire: 0}); err != nil {
					t.Error(err)
				}
			}
		})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if len(fs.callsOf("sync_file_range", "/d/new")) == 0 || r.Tracks(old.key, "") {
			t.Errorf("the new file was not written back and forgotten (tracked: %v)", r.Tracks(old.key, ""))
		}
		if s := onlyDeviceStats(t, r); s.InodesGone != 1 {
			t.Errorf("inodes_gone %d, want 1 (the old file)", s.InodesGone)
		}
	})
}

// observedRegistry is a Registry of one device, 7:0, over a fake
// filesystem with opens by handle, logging at info level to logs.
func observedRegistry(t *testing.T) (*Registry, *handleFS, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	fs := &handleFS{fakeFS: newFakeFS(func() time.Duration { return 0 })}
	r := NewRegistry(Options{Config: testConfig(), Opener: fs, Handles: fs, Log: zap.New(core),
		Resolve: func(dev uint64, path string) (string, error) { return "7:0", nil }})
	t.Cleanup(r.Stop)
	return r, fs, logs
}

// TestDeletionDuringIdlePass: a deletion told during a pass whose only
// attempt makes no progress (a blocked file) puts the deleted file on
// b_more_io; the pass is not taken for a busy loop (no warning), and
// another pass of the same work forgets the deleted file.
func TestDeletionDuringIdlePass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs, logs := observedRegistry(t)
		gone := fs.add("/d/gone", 2, pg, 1)
		if err := r.MarkInodeDirty(gone.path, gone.key, gone.handle, tree.Tree{Expire: time.Hour}); err != nil {
			t.Fatal(err)
		}
		blocked := fs.add("/d/blocked", 1, pg, 1)
		if err := r.MarkInodeDirty(blocked.path, blocked.key, blocked.handle, tree.Tree{Expire: 0}); err != nil {
			t.Fatal(err)
		}
		afterSample(t, fs.fakeFS, blocked)
		told := false
		blocked.set(func(f *fakeFile) {
			f.openErr = syscall.EAGAIN
			f.onOpen = func() {
				if !told {
					told = true
					fs.remove(gone.path)
					r.InodeUnlinked(gone.key, gone.handle)
				}
			}
		})
		time.Sleep(4990 * time.Millisecond) // the first kupdate pass
		synctest.Wait()
		if !told {
			t.Fatal("precondition: the blocked file was not attempted")
		}
		if n := len(fs.callsOf("open_by_handle", string(gone.handle))); n == 0 || r.Tracks(gone.key, "") {
			t.Errorf("the deleted file: %d attempts, tracked %v; want it forgotten by the same work", n, r.Tracks(gone.key, ""))
		}
		if n := logs.FilterMessageSnippet("busy loop").Len(); n != 0 {
			t.Errorf("%d busy-loop warnings, want none", n)
		}
	})
}

// TestNewFileTakesNumber: a report of a new file with a tracked inode's
// number and another handle (the tracked file was deleted; ext4 gives its
// number to the next file at once) forgets the deleted one (inodes_gone)
// and tracks the new file afresh: at its own tree's expiry, not at the
// deleted file's place, which its deletion had brought forward to the next
// pass.
func TestNewFileTakesNumber(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs := oneDeviceRegistry(t)
		tr := tree.Tree{Expire: time.Hour}
		old := fs.add("/d/old", 1, pg, 1)
		// Handles as the kernel makes them: one type and length, the
		// generation differs.
		old.set(func(f *fakeFile) { f.handle = inode.MakeHandle(1, []byte("ino1gen1")) })
		if err := r.MarkInodeDirty(old.path, old.key, old.handle, tr); err != nil {
			t.Fatal(err)
		}
		fs.remove(old.path)
		r.InodeUnlinked(old.key, old.handle)
		nf := fs.add("/d/new", 1, pg, 1)
		nf.set(func(f *fakeFile) { f.handle = inode.MakeHandle(1, []byte("ino1gen2")) })
		if nf.key != old.key || nf.handle == old.handle {
			t.Fatalf("set-up: %v %q, want the old number with a new handle", nf.key, nf.handle)
		}
		if err := r.MarkInodeDirty(nf.path, nf.key, nf.handle, tr); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second) // two passes, well before the hour
		synctest.Wait()
		if attempted(fs, nf) {
			t.Errorf("the new file was attempted before its expiry")
		}
		if !r.Tracks(nf.key, nf.path) {
			t.Errorf("the new file is not tracked under %s", nf.path)
		}
		s := onlyDeviceStats(t, r)
		if s.InodesGone != 1 || s.BDirty != 1 {
			t.Errorf("inodes_gone %d, b_dirty %d; want 1, 1", s.InodesGone, s.BDirty)
		}
		// A handle of another layout for the number (another
		// encoding of one inode) is not taken for a new file.
		if err := r.MarkInodeDirty(nf.path, nf.key, inode.MakeHandle(2, []byte("ino1gen2par1gen1")), tr); err != nil {
			t.Fatal(err)
		}
		if s := onlyDeviceStats(t, r); s.InodesGone != 1 {
			t.Errorf("a handle of another layout: inodes_gone %d, want 1 still", s.InodesGone)
		}
	})
}

// TestMadeReportTakesHandle: a report without a handle of a directory
// entry made (Mark.Made) under a tracked inode's number asks the opener
// for the file's handle: a new file that took the number of a tracked one
// deleted unseen (no deletion told) is tracked as itself, the old one
// forgotten as gone. The same report not made keeps the tracked handle.
func TestMadeReportTakesHandle(t *testing.T) {
	for _, made := range []bool{false, true} {
		t.Run(fmt.Sprintf("made=%v", made), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, fs := oneDeviceRegistry(t)
				tr := tree.Tree{Expire: time.Hour}
				old := fs.add("/d/log", 1, pg, 1)
				old.set(func(f *fakeFile) { f.handle = inode.MakeHandle(1, []byte("ino1gen1")) })
				if err := r.MarkInodeDirty(old.path, old.key, old.handle, tr); err != nil {
					t.Fatal(err)
				}
				fs.remove(old.path) // (no deletion told)
				nf := fs.add("/d/log", 1, pg, 1)
				nf.set(func(f *fakeFile) { f.handle = inode.MakeHandle(1, []byte("ino1gen2")) })
				r.MarkInodesDirty([]Mark{{Path: nf.path, Key: nf.key, Tree: tr, Made: made}})
				s := onlyDeviceStats(t, r)
				if want := map[bool]uint64{false: 0, true: 1}[made]; s.InodesGone != want {
					t.Errorf("inodes_gone %d, want %d", s.InodesGone, want)
				}
				if !r.Tracks(nf.key, nf.path) {
					t.Errorf("not tracked under %s", nf.path)
				}
			})
		})
	}
}

// TestRegistryObserve: the observer Registry.Observe subscribes is told
// of each device's attempts' opens and forgotten inodes; after
// Observe(nil) it is told nothing.
func TestRegistryObserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs := oneDeviceRegistry(t)
		ob := &observerFS{fakeFS: fs.fakeFS}
		r.Observe(ob)
		tr := tree.Tree{Expire: time.Hour}
		f := fs.add("/d/told", 1, pg, 1)
		r.MarkInodesDirty([]Mark{{Path: f.path, Key: f.key, Handle: f.handle, Tree: tr, Leaving: true}})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if diff := gocmp.Diff([]string{"opened 1", "forgot 1"}, slices.Compact(ob.all())); diff != "" {
			t.Errorf("what the observer was told (-want +got):\n%s", diff)
		}
		r.Observe(nil)
		g := fs.add("/d/untold", 2, pg, 1)
		r.MarkInodesDirty([]Mark{{Path: g.path, Key: g.key, Handle: g.handle, Tree: tr, Leaving: true}})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if len(fs.callsOf("sync_file_range", g.path)) == 0 {
			t.Fatalf("%s not written back", g.path)
		}
		if got := slices.Compact(ob.all()); len(got) != 2 {
			t.Errorf("after Observe(nil), the observer was told %v, want only the first file's", got)
		}
	})
}

// TestTreeGoneTrackedWarned: a tree that is gone with files tracked as
// dirty is warned of, with their count and dirty pages at the last look
// (a renamed or mounted-over tree's files are still dirty, now the kernel
// flusher's); one whose files are all clean, or whose filesystem was
// unmounted (which wrote them back), is an info line.
func TestTreeGoneTrackedWarned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fs, logs := observedRegistry(t)
		for i, p := range []string{"/t/a", "/t/b", "/v/a"} {
			f := fs.add(p, uint64(i+1), 3*pg, 3)
			if err := r.MarkInodeDirty(f.path, f.key, f.handle, tree.Tree{Expire: time.Hour}); err != nil {
				t.Fatal(err)
			}
			afterSample(t, fs.fakeFS, f)
		}
		clean := fs.add("/u/c", 4, pg, 0)
		if err := r.MarkInodeDirty(clean.path, clean.key, clean.handle, tree.Tree{Expire: 0}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(6 * time.Second) // a kupdate pass finds /u/c clean
		synctest.Wait()
		r.TreeGone("/t", clean.key.Dev, false, false)
		r.TreeGone("/u", clean.key.Dev, false, false)
		r.TreeGone("/v", clean.key.Dev, false, true) // unmounted: written back
		w := logs.FilterMessageSnippet("some tracked as dirty: if the tree was renamed or mounted over").All()
		if len(w) != 1 || w[0].Level != zapcore.WarnLevel {
			t.Fatalf("warnings %+v, want one for /t", w)
		}
		f := w[0].ContextMap()
		if f["root"] != "/t" || f["files"] != int64(2) || f["tracked"] != int64(2) || f["dirty_pages_last_seen"] != uint64(6) {
			t.Errorf("warning's fields %v, want root /t, 2 files tracked, 6 dirty pages", f)
		}
		if i := logs.FilterMessage("dropped the files of a tree that is gone").All(); len(i) != 2 || i[0].ContextMap()["root"] != "/u" || i[1].ContextMap()["root"] != "/v" {
			t.Errorf("info lines %+v, want one for /u and one for /v", i)
		}
	})
}

// TestUnverifiedWithout: the shutdown's unverified writes leave out the
// files the report names given up, lost or left (an "outcome not known,
// clean" line would contradict it), from the named paths and the count.
func TestUnverifiedWithout(t *testing.T) {
	u := Unverified{Paths: []string{"/a", "/b", "/c", "/d"}, Files: 10}
	got := u.without([]GivenUp{{Path: "/a"}}, []GivenUp{{Path: "/c"}}, []string{"/d", "/x"})
	if want := (Unverified{Paths: []string{"/b"}, Files: 7}); !gocmp.Equal(got, want) {
		t.Errorf("without: %+v, want %+v", got, want)
	}
	if got := u.without(nil, nil, nil); !gocmp.Equal(got, u) {
		t.Errorf("without nothing: %+v, want %+v", got, u)
	}
}
