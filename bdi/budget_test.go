package bdi

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"flusherd/inode"
	"flusherd/tree"
)

// TestTrackBudgetMarks: the budget is full at max tracked inodes, and
// its low-water mark is three quarters of max; no max is never full.
func TestTrackBudgetMarks(t *testing.T) {
	for _, c := range []struct {
		max, n         int64
		full, underLow bool
	}{
		{max: 0, n: 1 << 40, full: false, underLow: true},
		{max: 8, n: 8, full: true, underLow: false},
		{max: 8, n: 9, full: true, underLow: false},
		{max: 8, n: 7, full: false, underLow: false},
		{max: 8, n: 6, full: false, underLow: true},
		{max: 8, n: 0, full: false, underLow: true},
		{max: 400, n: 301, full: false, underLow: false},
		{max: 400, n: 300, full: false, underLow: true},
	} {
		var b trackBudget
		b.max.Store(c.max)
		b.n.Store(c.n)
		if got := b.full(); got != c.full {
			t.Errorf("max %d, %d tracked: full() = %v, want %v", c.max, c.n, got, c.full)
		}
		if got := b.underLow(); got != c.underLow {
			t.Errorf("max %d, %d tracked: underLow() = %v, want %v", c.max, c.n, got, c.underLow)
		}
	}
}

// TestTrackedBudgetFromLimit: "auto" takes half of the Go memory limit at
// BytesPerTrackedInode each; no limit, no bound.
func TestTrackedBudgetFromLimit(t *testing.T) {
	for _, c := range []struct{ limit, want int64 }{
		{0, 0},
		{-1, 0},
		{144 << 20, 294912}, // 160 MiB cgroup: 0.9 of it to the Go runtime
		{1 << 30, 2097152},
		{100, 1},
	} {
		if got := TrackedBudget(c.limit); got != c.want {
			t.Errorf("TrackedBudget(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
}

// TestFSPassDue: a pass is due for reports not covered by a pass begun
// since, when none runs, at once the first time or at the shutdown, else
// an interval after the last one began; it covers the reports numbered
// before it began.
func TestFSPassDue(t *testing.T) {
	const iv = time.Second
	for _, c := range []struct {
		name    string
		p       fsPass
		now     time.Duration
		urgent  bool
		due     bool
		covered bool
	}{
		{"first report", fsPass{seen: 1}, 0, false, true, false},
		{"running", fsPass{seen: 2, started: 1, running: true, ever: true, began: 0}, 5 * iv, false, false, false},
		{"within the interval", fsPass{seen: 2, started: 1, done: 1, ever: true, began: 10 * iv}, 10*iv + iv/2, false, false, false},
		{"within the interval, shutdown", fsPass{seen: 2, started: 1, done: 1, ever: true, began: 10 * iv}, 10*iv + iv/2, true, true, false},
		{"after the interval", fsPass{seen: 2, started: 1, done: 1, ever: true, began: 10 * iv}, 11 * iv, false, true, false},
		{"not made, within the interval", fsPass{seen: 1, started: 0, done: 0, ever: true, began: 10 * iv}, 10*iv + iv/2, false, false, false},
		{"nothing new", fsPass{seen: 3, started: 3, done: 3, ever: true, began: 0}, 60 * iv, false, false, true},
		{"started, not done", fsPass{seen: 3, started: 3, done: 2, running: true, ever: true}, 60 * iv, false, false, false},
	} {
		if got := c.p.due(c.now, iv, c.urgent); got != c.due {
			t.Errorf("%s: due = %v, want %v", c.name, got, c.due)
		}
		if got := c.p.covered(); got != c.covered {
			t.Errorf("%s: covered = %v, want %v", c.name, got, c.covered)
		}
	}
}

// passLog is a fake whole-filesystem pass over a fakeFS: it takes took
// (virtual time), then writes back every file of the fake, and records
// when each pass began and ended and how many ran at once.
type passLog struct {
	fs   *fakeFS
	took time.Duration
	err  error

	// unmade: the first pass cannot be made (its root cannot be
	// opened): it writes nothing.
	unmade bool

	mu             sync.Mutex
	began, ended   []time.Duration
	running, maxAt int
}

func (l *passLog) syncfs(r passReq) (int, bool, error) {
	l.mu.Lock()
	l.began = append(l.began, l.fs.now())
	l.running++
	l.maxAt = max(l.maxAt, l.running)
	l.mu.Unlock()
	time.Sleep(l.took)
	if l.unmade && len(l.began) == 1 {
		l.mu.Lock()
		l.running--
		l.ended = append(l.ended, l.fs.now())
		l.mu.Unlock()
		return -1, false, syscall.ENOENT
	}
	l.fs.mu.Lock()
	for _, f := range l.fs.files {
		if !f.keepDirty {
			clear(f.dirty)
			f.writeback = 0
		}
	}
	l.fs.mu.Unlock()
	l.mu.Lock()
	l.running--
	l.ended = append(l.ended, l.fs.now())
	l.mu.Unlock()
	return -1, true, l.err
}

func (l *passLog) passes() (began, ended []time.Duration, maxAt int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.began...), append([]time.Duration(nil), l.ended...), l.maxAt
}

// dirtyFiles returns the paths of the fake's files with dirty pages.
func (fs *fakeFS) dirtyFiles() []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []string
	for p, f := range fs.files {
		if len(f.dirty) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// TestOverBudget: in virtual time, a device with a budget of 4 tracks 4
// files written with an hour's expiry; the fifth enters the over-budget
// state and is not tracked, and a whole-filesystem pass starts at once.
// Files written after it (still over) are not tracked either, and the
// next pass starts the interval (1 s) after the first began, not before. After a completed pass the tracked files, clean, are
// forgotten at the next kupdate pass, the device is under its low-water
// mark with every report covered, and it leaves the state: a new file is
// tracked again. Every file ends clean, long before its expiry.
func TestOverBudget(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	const expire = time.Hour
	var pl *passLog
	withWB(t, cfg, func(h *harness) {
		mark := func(i int) {
			f := h.fs.add(fmt.Sprintf("/t/f%d", i), uint64(100+i), pg, 1)
			h.wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Root: "/t", Expire: expire})
		}
		for i := range 4 {
			mark(i)
		}
		synctest.Wait()
		if s := h.wb.Snapshot(); s.OverBudget != 0 || h.wb.Tracked() != 4 {
			t.Fatalf("at the budget: over_budget %d, %d tracked; want 0, 4", s.OverBudget, h.wb.Tracked())
		}
		mark(4)
		synctest.Wait()
		s := h.wb.Snapshot()
		if s.OverBudget != 1 || s.UntrackedReports != 1 || h.wb.Tracked() != 4 {
			t.Fatalf("past the budget: over_budget %d, untracked_reports %d, %d tracked; want 1, 1, 4",
				s.OverBudget, s.UntrackedReports, h.wb.Tracked())
		}
		time.Sleep(500 * time.Millisecond) // after the first pass (200 ms)
		mark(5)
		mark(6)
		synctest.Wait()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		began, ended, maxAt := pl.passes()
		if len(began) != 2 || began[0] != 0 || began[1] != time.Second || ended[0] != 200*time.Millisecond {
			t.Errorf("passes began at %v, ended at %v; want at 0 (ended at 200ms) and at 1s, the interval after the first", began, ended)
		}
		if maxAt != 1 {
			t.Errorf("%d passes ran at once, want 1", maxAt)
		}
		s = h.wb.Snapshot()
		if s.OverBudget != 0 || s.SyncfsPasses != 2 || s.UntrackedReports != 3 || s.SyncfsErrors != 0 {
			t.Errorf("after the passes: over_budget %d, syncfs_passes %d, untracked_reports %d, syncfs_errors %d; want 0, 2, 3, 0",
				s.OverBudget, s.SyncfsPasses, s.UntrackedReports, s.SyncfsErrors)
		}
		if n := h.wb.Tracked(); n != 0 {
			t.Errorf("%d files tracked after the passes, want 0 (clean, forgotten)", n)
		}
		if d := h.fs.dirtyFiles(); len(d) != 0 {
			t.Errorf("dirty after the passes: %v", d)
		}
		mark(7)
		synctest.Wait()
		if n, s := h.wb.Tracked(), h.wb.Snapshot(); n != 1 || s.UntrackedReports != 3 {
			t.Errorf("a file written after the state was left: %d tracked, untracked_reports %d; want 1, 3", n, s.UntrackedReports)
		}
	}, func(h *harness) {
		h.wb.budget.max.Store(4)
		pl = &passLog{fs: h.fs, took: 200 * time.Millisecond}
		h.wb.syncfs = pl.syncfs
	})
}

// TestOverBudgetStaysWhileFull: a pass that leaves the tracked files
// dirty (written again after it began) does not take the device out of
// the state: it stays over budget, and no pass runs while no new file is
// reported.
func TestOverBudgetStaysWhileFull(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	var pl *passLog
	withWB(t, cfg, func(h *harness) {
		var fs []*fakeFile
		for i := range 8 {
			f := h.fs.add(fmt.Sprintf("/t/f%d", i), uint64(100+i), pg, 1)
			fs = append(fs, f)
			f.keepDirty = true
			h.wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Root: "/t", Expire: time.Hour})
		}
		u := h.fs.add("/t/u", 99, pg, 1)
		h.wb.MarkInodeDirty(u.key, u.path, "", tree.Tree{Root: "/t", Expire: time.Hour})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		began, _, _ := pl.passes()
		if len(began) != 1 {
			t.Errorf("%d passes for one report, want 1", len(began))
		}
		// The tracked files, kept dirty, were written back by their
		// attempts (sync_file_range) but stay dirty: still tracked.
		if s := h.wb.Snapshot(); s.OverBudget != 1 || h.wb.Tracked() != 8 {
			t.Errorf("over_budget %d with %d tracked, want 1 with 8 (above the low-water mark, 6)", s.OverBudget, h.wb.Tracked())
		}
		for _, f := range fs {
			f.set(func(f *fakeFile) { f.keepDirty = false })
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.OverBudget != 0 {
			t.Errorf("over_budget %d once the tracked files were written, want 0", s.OverBudget)
		}
	}, func(h *harness) {
		h.wb.budget.max.Store(8)
		pl = &passLog{fs: h.fs}
		h.wb.syncfs = pl.syncfs
	})
}

// TestOverBudgetShutdown: at the shutdown a report not yet covered gets a
// pass at once, not after the interval, and Drain waits for it; a pass
// that fails is counted and reported as a loss.
func TestOverBudgetShutdown(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Minute
	var pl *passLog
	withWB(t, cfg, func(h *harness) {
		a := h.fs.add("/t/a", 1, pg, 1)
		h.wb.MarkInodeDirty(a.key, a.path, "", tree.Tree{Root: "/t", Expire: time.Hour})
		b := h.fs.add("/t/b", 2, pg, 1)
		h.wb.MarkInodeDirty(b.key, b.path, "", tree.Tree{Root: "/t", Expire: time.Hour})
		time.Sleep(time.Second) // the first pass runs (5 s)
		c := h.fs.add("/t/c", 3, pg, 1)
		h.wb.MarkInodeDirty(c.key, c.path, "", tree.Tree{Root: "/t", Expire: time.Hour})
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if u := h.wb.Uncovered(); len(u) != 1 || u[0] != "/t" {
			t.Fatalf("uncovered %v, want [/t]", u)
		}
		pl.mu.Lock()
		pl.err = syscall.EIO
		pl.mu.Unlock()
		h.wb.mu.Lock()
		h.wb.stop.on = true
		h.wb.mu.Unlock()
		start := h.now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.wb.Drain(ctx, "shutdown"); err != nil {
			t.Fatalf("Drain: %v", err)
		}
		began, _, _ := pl.passes()
		if len(began) != 2 || began[1]-start > 100*time.Millisecond {
			t.Errorf("passes began at %v, the shutdown at %v: want the second at once", began, start)
		}
		if s := h.wb.Snapshot(); s.SyncfsErrors != 1 {
			t.Errorf("syncfs_errors %d, want 1", s.SyncfsErrors)
		}
		if lost := h.wb.passesLost(); len(lost) != 1 || lost[0].Err == nil {
			t.Errorf("losses reported %v, want the failed pass's", lost)
		}
		if d := h.fs.dirtyFiles(); len(d) != 0 {
			t.Errorf("dirty after the drain: %v", d)
		}
	}, func(h *harness) {
		h.wb.budget.max.Store(1)
		pl = &passLog{fs: h.fs, took: 5 * time.Second}
		h.wb.syncfs = pl.syncfs
	})
}

// TestOverBudgetPassRetried: a pass that could not be made covers
// nothing: it is made again after the interval, with no new report, and
// counted in syncfs_errors; the state is left only after the pass made.
func TestOverBudgetPassRetried(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 2 * time.Second
	var pl *passLog
	withWB(t, cfg, func(h *harness) {
		a := h.fs.add("/t/a", 1, pg, 1)
		h.wb.MarkInodeDirty(a.key, a.path, "", tree.Tree{Root: "/t", Expire: time.Hour})
		synctest.Wait()
		if s := h.wb.Snapshot(); s.OverBudget != 1 || s.SyncfsErrors != 1 || len(h.wb.Uncovered()) != 1 {
			t.Errorf("after a pass not made: over_budget %d, syncfs_errors %d, uncovered %v; want 1, 1, [/t]",
				s.OverBudget, s.SyncfsErrors, h.wb.Uncovered())
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		began, _, _ := pl.passes()
		if len(began) != 2 || began[1] != 2*time.Second {
			t.Errorf("passes began at %v, want at 0 and 2s", began)
		}
		if s := h.wb.Snapshot(); s.OverBudget != 0 || s.SyncfsPasses != 1 || len(h.fs.dirtyFiles()) != 0 {
			t.Errorf("after the pass made: over_budget %d, syncfs_passes %d, dirty %v; want 0, 1, none",
				s.OverBudget, s.SyncfsPasses, h.fs.dirtyFiles())
		}
	}, func(h *harness) {
		h.wb.budget.max.Store(1)
		h.wb.budget.n.Store(1) // another device's file fills it
		pl = &passLog{fs: h.fs, unmade: true}
		h.wb.syncfs = pl.syncfs
	})
}

// TestTrackedBudgetShared: the budget is the Registry's, over all its
// devices: files of one device fill it for another, which then does not
// track its new file and is over budget; SetMaxTracked lifts it, and
// "unlimited" (0) never fills.
func TestTrackedBudgetShared(t *testing.T) {
	r, _, _ := newTestRegistry(t, testConfig(), map[uint64]string{1: "7:1", 2: "7:2"})
	r.SetMaxTracked(2)
	// (A root not on the fake devices: the pass's open finds another
	// st_dev and syncs nothing.)
	tr := tree.Tree{Root: t.TempDir(), Expire: time.Hour}
	for i := range 2 {
		if err := r.MarkInodeDirty(fmt.Sprintf("/t/a%d", i), inode.Key{Dev: 1, Ino: uint64(10 + i)}, "", tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.MarkInodeDirty("/t/b", inode.Key{Dev: 2, Ino: 20}, "", tr); err != nil {
		t.Fatal(err)
	}
	n, budget := r.TrackedInodes()
	wb2, _ := r.Device(2, "/t/b")
	if n != 2 || budget != 2 || wb2.Tracked() != 0 || wb2.Snapshot().OverBudget != 1 {
		t.Errorf("%d of %d tracked, device 2 tracks %d, over_budget %d; want 2 of 2, 0, 1",
			n, budget, wb2.Tracked(), wb2.Snapshot().OverBudget)
	}
	r.SetMaxTracked(0)
	if err := r.MarkInodeDirty("/t/c", inode.Key{Dev: 1, Ino: 30}, "", tr); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.TrackedInodes(); n != 3 {
		t.Errorf("%d tracked with no bound, want 3", n)
	}
}
