package bdi

import (
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/tree"
)

// BytesPerTrackedInode is the memory the daemon is taken to need per
// tracked inode when a budget is derived from its memory limit: 138 B of
// live heap per inode in bdi (BenchmarkTrackedInodeMemory at 1,000,000
// inodes), with room for the watcher's share and the collector's headroom
// (the daemon's RSS grew by 140 to 170 B per dirty file under a 160 MiB
// limit).
const BytesPerTrackedInode = 256

// TrackedBudgetShare is the part of the Go memory limit that the tracked
// inodes may take, in tenths (half).
const TrackedBudgetShare = 5

// TrackedBudget returns the number of inodes that fit in
// TrackedBudgetShare tenths of memLimit (bytes; 0 or less: no limit,
// and 0, no bound, is returned).
func TrackedBudget(memLimit int64) int64 {
	if memLimit <= 0 {
		return 0
	}
	share := memLimit/10*TrackedBudgetShare + memLimit%10*TrackedBudgetShare/10
	return max(1, share/BytesPerTrackedInode)
}

// lowWaterDiv sets the low-water mark of the budget: a device over budget
// leaves that state only at or under max - max/lowWaterDiv tracked inodes
// (three quarters), so that it does not enter and leave it at every file.
const lowWaterDiv = 4

// minSyncfsInterval is the shortest time between the starts of two
// whole-filesystem passes of one filesystem.
const minSyncfsInterval = time.Second

// trackBudget bounds the inodes tracked by all the devices of a Registry
// (writeback.max_tracked_inodes). Safe for concurrent use.
type trackBudget struct {
	max atomic.Int64 // 0: no bound
	n   atomic.Int64 // inodes tracked now, every device's
}

// full reports whether no inode may be added.
func (b *trackBudget) full() bool {
	m := b.max.Load()
	return m > 0 && b.n.Load() >= m
}

// underLow reports whether the tracked inodes are at or under the
// low-water mark.
func (b *trackBudget) underLow() bool {
	m := b.max.Load()
	return m <= 0 || b.n.Load() <= m-m/lowWaterDiv
}

// overBudget is a device's state past the tracked-inode budget: a file
// newly reported while it is on is not tracked, and the filesystem it is
// on is written back whole by syncfs(2) passes instead: the kernel's
// writeback of a whole superblock, sync_filesystem (sync_inodes_sb, a
// wb_writeback of every dirty inode of the sb with WB_SYNC_ALL, then
// ->sync_fs), which needs no list of the inodes. A file not tracked is
// clean once a pass that began after its write has completed, since
// syncfs writes and waits on every page of the filesystem dirty when it
// began: a pass covers the reports numbered before its start (fsPass).
// The state is left when the tracked inodes are under the low-water mark
// and every report is covered; a file written again after that is
// reported and tracked as any. The list lock guards it.
type overBudget struct {
	on bool
	// fses holds the filesystems (st_dev) with reports not tracked since
	// the state was entered.
	fses map[uint64]*fsPass
	// entered counts the times the state was entered; untracked the
	// reports not tracked; passes the passes completed; errs those that
	// reported a writeback error, or could not be made.
	entered, untracked, passes, errs uint64
	// lost holds the errors of failed passes, by filesystem root, for the
	// shutdown's report: data not tracked may have been lost.
	lost map[string]error
}

// fsPass is one filesystem's passes. Reports not tracked are numbered
// (seen); a pass covers those numbered up to seen at its start.
type fsPass struct {
	dev  uint64
	root string    // the tree root of the last report not tracked: opened for syncfs
	path string    // that report's file: opened when root is on another filesystem
	key  inode.Key // that file's key
	// seen numbers the reports not tracked; started is seen when the
	// running (or last) pass began; done is seen when the last completed
	// pass began.
	seen, started, done uint64
	running, ever       bool          // a pass runs; one was started
	began               time.Duration // daemon clock: the last pass's start
	fd                  int           // root, held from the first pass to the state's end; -1: none
}

// due reports whether a pass of p is to start at now: reports not
// covered by a pass begun since, none running, and interval since the
// last start (at once for the first, or when urgent: the shutdown).
func (p *fsPass) due(now, interval time.Duration, urgent bool) bool {
	return !p.running && p.seen > p.started && (urgent || !p.ever || now-p.began >= interval)
}

// covered reports whether every report not tracked is covered by a
// completed pass.
func (p *fsPass) covered() bool { return !p.running && p.done >= p.seen }

// untrackedLocked takes a report of a new file (key at path, in tree t)
// that the budget does not let the device track: the device enters the
// over-budget state if it was not in it, and the file's filesystem is
// marked for a pass. The watcher is told the file is not tracked
// (AttemptObserver.Forgotten), so that its next write is reported. It
// reports whether the goroutine is to be woken (a pass may be due).
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) untrackedLocked(key inode.Key, path string, t tree.Tree) bool {
	ob := &wb.over
	if !ob.on {
		ob.on = true
		ob.entered++
		wb.log.Warn("tracked-inode budget full: files newly written on this device are not tracked; whole-filesystem passes (syncfs) write them back until the tracked files fall under the low-water mark",
			zap.Int64("max_tracked_inodes", wb.budget.max.Load()), zap.Int64("tracked", wb.budget.n.Load()))
	}
	if ob.fses == nil {
		ob.fses = map[uint64]*fsPass{}
	}
	p := ob.fses[key.Dev]
	if p == nil {
		p = &fsPass{dev: key.Dev, fd: -1}
		ob.fses[key.Dev] = p
	}
	p.seen++
	p.root, p.path, p.key = t.Root, path, key
	ob.untracked++
	wb.gen++
	if wb.files.Observer != nil {
		wb.files.Observer.Forgotten(key)
	}
	return p.seen == p.started+1
}

// passReq is a pass to run: a snapshot of its fsPass.
type passReq struct {
	p          *fsPass
	dev        uint64
	root, path string
	key        inode.Key
	fd         int
	began      time.Duration
	// vseq is the last writeback-mode write of dev recorded when the
	// pass began, and voldest the oldest not yet covered then (verifying):
	// the pass covers them as a read of the cursor would.
	vseq    uint64
	voldest time.Duration
}

// budgetStep is the goroutine's step of the over-budget state: it starts
// the passes that are due, each on a goroutine of its own (at most one at
// a time per filesystem), and leaves the state when the tracked inodes
// are under the low-water mark and every report not tracked is covered.
func (wb *Writeback) budgetStep() {
	now := wb.now()
	var reqs []passReq
	var fds []int
	wb.mu.Lock()
	ob := &wb.over
	if !ob.on {
		wb.mu.Unlock()
		return
	}
	covered := true
	for _, p := range ob.fses {
		if p.due(now, wb.syncfsIntervalLocked(), wb.stop.on) {
			p.running, p.ever, p.started, p.began = true, true, p.seen, now
			r := passReq{p: p, dev: p.dev, root: p.root, path: p.path, key: p.key, fd: p.fd, began: now}
			if v := wb.verify.fs[p.dev]; v != nil {
				v.seal()
				r.vseq, r.voldest = v.seq, v.oldest
			}
			reqs = append(reqs, r)
		}
		covered = covered && p.covered()
	}
	if covered && wb.budget.underLow() {
		for _, p := range ob.fses {
			if p.fd >= 0 {
				fds = append(fds, p.fd)
			}
		}
		ob.on, ob.fses = false, nil
		wb.gen++
		wb.log.Info("tracked files under the budget's low-water mark and every file not tracked written back: new files are tracked again",
			zap.Int64("tracked", wb.budget.n.Load()), zap.Uint64("syncfs_passes", ob.passes))
	}
	wb.mu.Unlock()
	for _, fd := range fds {
		unix.Close(fd)
	}
	for _, r := range reqs {
		go wb.runPass(r)
	}
}

// syncfsIntervalLocked is the shortest time between two passes of one
// filesystem: dirty_writeback_interval, at least minSyncfsInterval.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) syncfsIntervalLocked() time.Duration {
	return max(wb.cfg.DirtyWritebackInterval, minSyncfsInterval)
}

// budgetWakeLocked returns when the goroutine should look at the
// over-budget state again (a pass due, or the low-water mark, which other
// devices' forgotten inodes may reach), and false when it is not on.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) budgetWakeLocked(now time.Duration) (time.Duration, bool) {
	if !wb.over.on {
		return 0, false
	}
	iv := wb.syncfsIntervalLocked()
	d := iv
	for _, p := range wb.over.fses {
		if !p.running && p.seen > p.started {
			d = min(d, p.began+iv-now)
		}
	}
	return max(d, time.Millisecond), true
}

// uncoveredLocked returns the roots of the filesystems with reports not
// tracked that no completed pass covers yet. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) uncoveredLocked() []string {
	var out []string
	if !wb.over.on {
		return nil
	}
	for _, p := range wb.over.fses {
		if !p.covered() {
			out = append(out, p.root)
		}
	}
	return out
}

// runPass runs one whole-filesystem pass (wb.syncfs) off the device's
// goroutine and hands its result back under the list lock: a completed
// pass covers the reports numbered before it began, and the tracked
// inodes dirtied before it began are moved to b_more_io, so that the next
// pass's attempts find them clean (cachestat) and forget them, which
// brings the device back under its budget. An error of syncfs is a
// writeback error somewhere in the filesystem (its error cursor, s_wb_err,
// held since the first pass, or since the tree was added for an
// integrity tree's filesystem: ErrWatch): it is logged and counted, and
// the data of files not tracked may be lost with it. A pass that could
// not be made (the root could not be opened) covers nothing and is made
// again after the interval.
func (wb *Writeback) runPass(r passReq) {
	fd, synced, err := wb.syncfs(r)
	if fd != r.fd && r.fd >= 0 {
		unix.Close(r.fd)
	}
	now := wb.now()
	if synced && wb.errs != nil {
		wb.errs.Record(r.dev, now, err)
	}
	var lines []func()
	wb.mu.Lock()
	p := r.p
	p.running = false
	keep := wb.over.on && wb.over.fses[r.dev] == p
	if keep {
		p.fd = fd
	}
	if !synced {
		p.started = p.done // due again after the interval
	}
	if synced {
		p.done = max(p.done, r.p.started)
		wb.over.passes++
		if err == nil {
			wb.side.syncfsDone(r.dev, r.began)
		}
		wb.bDirty.moveExpired(&wb.BMoreIO, r.began, true)
		lines = wb.passCoveredLocked(r.dev, r.vseq, r.voldest)
	}
	if err != nil {
		wb.over.errs++
		if synced {
			if wb.over.lost == nil {
				wb.over.lost = map[string]error{}
			}
			wb.over.lost[r.root] = err
		}
	}
	wb.gen++
	wb.mu.Unlock()
	if !keep && fd >= 0 {
		unix.Close(fd)
	}
	for _, l := range lines {
		l()
	}
	switch {
	case err != nil && synced:
		wb.log.Error("whole-filesystem writeback (syncfs) of a device over its tracked-inode budget reported a writeback error: data of files not tracked may be lost",
			logpath.String("root", r.root), zap.Error(err))
	case err != nil:
		wb.log.Warn("whole-filesystem writeback (syncfs) could not be made; retried after the interval",
			logpath.String("root", r.root), zap.Error(err))
	default:
		wb.log.Debug("whole-filesystem writeback (syncfs) done", logpath.String("root", r.root),
			zap.Duration("took", now-r.began))
	}
	wb.live.kick()
}

// syncfsFS is a device's whole-filesystem pass (Writeback.syncfs):
// syncfs(2) of r's filesystem. It returns the descriptor to keep for the
// next pass (-1: none), whether syncfs ran (then every page dirtied
// before the call is written, whatever err), and the error.
type syncfsFS func(r passReq) (fd int, synced bool, err error)

// syncfsOS is the real syncfsFS. An integrity tree's filesystem is synced
// through ErrWatch's descriptor (its error cursor reaches back to the
// tree's addition); another through a descriptor of r.root, held from the
// first pass; a root on another filesystem than the file's (a tree over a
// mount point) through the file itself, opened for the pass.
func (wb *Writeback) syncfsOS(r passReq) (int, bool, error) {
	if wb.errs != nil {
		if at, errno, ok := wb.errs.LastError(r.dev, r.began); ok {
			if at >= r.began && errno != 0 {
				return r.fd, true, fmt.Errorf("syncfs: %w", errno)
			}
			return r.fd, true, nil
		}
	}
	fd := r.fd
	if fd < 0 {
		var err error
		fd, err = unix.Open(r.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, false, fmt.Errorf("open %s: %w", r.root, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Dev != r.dev {
			unix.Close(fd)
			synced, err := wb.syncfsFile(r)
			return -1, synced, err
		}
	}
	if err := unix.Syncfs(fd); err != nil {
		return fd, true, fmt.Errorf("syncfs: %w", err)
	}
	return fd, true, nil
}

// syncfsFile is syncfsOS through r's file, opened as an attempt opens it.
func (wb *Writeback) syncfsFile(r passReq) (bool, error) {
	f, err := wb.files.Opener.Open(r.path, r.key)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sf, ok := f.(interface{ Syncfs() error })
	if !ok {
		return false, fmt.Errorf("%s: no syncfs", r.path)
	}
	return true, sf.Syncfs()
}

// Uncovered returns the roots of the filesystems holding files not
// tracked for the budget that no completed whole-filesystem pass has
// covered yet.
func (wb *Writeback) Uncovered() []string {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return wb.uncoveredLocked()
}

// passesLost returns the failed passes' errors, one per filesystem root,
// for the shutdown's report.
func (wb *Writeback) passesLost() []GivenUp {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	var out []GivenUp
	for root, err := range wb.over.lost {
		out = append(out, GivenUp{Path: root + " (files not tracked over the tracked-inode budget)", Err: err})
	}
	return out
}
