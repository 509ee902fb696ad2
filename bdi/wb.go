// Package bdi is flusherd's per-device writeback: one goroutine per backing
// device ("bdi", named as in /sys/class/bdi) owns that device's lists of
// dirty inodes, b_dirty, b_io, b_more_io and b_more_io_wait, takes work
// items, runs kupdate-style passes and issues writeback through a plug.
//
// It models fs/fs-writeback.c (wb_workfn, wb_do_writeback,
// wb_check_old_data_flush, wb_writeback, queue_io, move_expired_inodes,
// writeback_sb_inodes, __writeback_single_inode, requeue_inode,
// __mark_inode_dirty) as changed by the series "writeback: avoid touching
// dirtied_when on blocked inodes", and block/blk-core.c's plug.
//
// Locks (the fields each guards carry "+checklocks:mu", checked by gVisor's
// checklocks analyzer in CI; functions named ...Locked carry
// "+checklocks:wb.mu"):
//   - Registry.mu guards the device maps. Nothing else is locked and no
//     system call is made while it is held (Device resolves a new bdi
//     outside it). Registry.Shutdown's own mu, under which nothing else is
//     locked, gathers the devices' reports.
//   - Writeback.mu, the list lock (a holdMutex: its longest hold is
//     list_lock_max_us in the stats), guards the lists, the inode map,
//     every tracked Inode's fields, the counters and the work list;
//     wbIndex and the plug are the device goroutine's own. It is a leaf:
//     no other lock is taken under it, and no system call that can block
//     (open, close, cachestat, writeback, syncfs) is made under it.
//   - ErrWatch: a filesystem's check mutex (held across its syncfs), then
//     ErrWatch.mu (brief); never under Writeback.mu.
//   - inode.Handles.mu is a leaf of its own package; opens are made
//     outside it.
//
// So no two of these locks are ever held in an order that could deadlock:
// each is a leaf but ErrWatch's check mutex, whose only inner lock is
// ErrWatch.mu.
package bdi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/lists"
	"flusherd/policy"
)

// timeSlice bounds a pass once something was written (writeback_sb_inodes
// stops after HZ/10).
const timeSlice = 100 * time.Millisecond

// Config holds a device's tunables. Durations are time.Duration
// (nanoseconds); WriteChunk is in bytes.
type Config struct {
	DirtyWritebackInterval time.Duration // kupdate period
	MinPause, MaxPause     time.Duration // b_more_io_wait backoff
	WriteChunk             int64         // most bytes written per inode per attempt
	MaxInflight            int64         // bytes under writeback on the device before big files wait; 0: no bound
	Requeue                policy.RequeueBlocked
	PlugEnabled            bool
	MaxPending             int // plug requests before a forced flush
	QueueDepth             int // requests in flight during a flush
	// IntegritySyncfs: a batch holding at least this many integrity
	// requests for one filesystem makes them durable with one syncfs(2)
	// (sync_inodes_sb plus sync_fs, as the kernel's syncfs does) instead
	// of an fdatasync each; 0: never.
	IntegritySyncfs int
	// AttemptTimeout bounds one writeback system call; one that takes
	// longer counts as blocked (ETIMEDOUT) and its inode stays Busy until
	// the call returns. 0: no bound.
	AttemptTimeout time.Duration
}

// Tree is what a watched tree contributes to its inodes.
type Tree struct {
	Expire    time.Duration // dirty_expire_interval for its inodes
	Integrity bool          // fdatasync instead of sync_file_range
}

// SyncMode is the work's writeback_sync_modes.
type SyncMode uint8

const (
	SyncNone SyncMode = iota // WB_SYNC_NONE: start writeback
	SyncAll                  // WB_SYNC_ALL: data integrity, fdatasync
)

// Work is a writeback work item, struct wb_writeback_work.
type Work struct {
	NrPages       int64 // pages to write before the work ends
	SyncMode      SyncMode
	ForKupdate    bool
	ForBackground bool
	// All queues every dirty inode dirtied before the work started, not
	// only expired ones (sync and shutdown work).
	All    bool
	Reason string
	// Files, when set, limits the work to these files (a sync request):
	// each is written with fdatasync at once (FlushPlug), and Errs[i] is
	// set to Files[i]'s error.
	Files []FileRef
	Errs  []error

	start       time.Duration
	waitSpliced bool
	progress    bool
	throttled   bool // an attempt was deferred by max_inflight
	done        chan struct{}
}

// FileRef names one file of a sync request.
type FileRef struct {
	Key  inode.Key
	Path string
	Tree Tree
}

// Done is closed when the work has run.
func (w *Work) Done() <-chan struct{} { return w.done }

// Writeback is one device's writeback state and goroutine, struct
// bdi_writeback.
type Writeback struct {
	Name string

	cfg    Config
	now    func() time.Duration
	open   inode.Opener
	log    *zap.Logger
	errLog *zap.Logger // rate-limited
	stats  *statsWriter

	mu holdMutex // the list lock (its longest hold is in the stats)
	// +checklocks:mu
	inodes map[inode.Key]*inode.Inode
	// +checklocks:mu
	bDirty dirtyList
	// +checklocks:mu
	BIO lists.List[*inode.Inode]
	// +checklocks:mu
	BMoreIO lists.List[*inode.Inode]
	// +checklocks:mu
	BMoreIOWait lists.List[*inode.Inode]
	// +checklocks:mu
	inflight lists.List[*inode.Inode] // under an attempt (I_SYNC); counted as b_io
	errs     *ErrWatch                // the integrity trees' filesystems' error cursors; may be nil
	// bFailed holds inodes whose data was lost: a writeback of theirs
	// failed and the kernel then dropped their dirty pages, so nothing
	// is left to retry. They stay tracked, reported as failed (stats,
	// flusherd dirty, shutdown) until written again (MarkInodeDirty);
	// they are not Dirty, which is how an inode on it is told from one on
	// a writeback list (every one of those is Dirty). nfailed is its length.
	// +checklocks:mu
	bFailed lists.List[*inode.Inode]
	// +checklocks:mu
	nfailed int
	// +checklocks:mu
	work []*Work
	// +checklocks:mu
	gen uint64 // bumped on every change, for the stats writer
	// +checklocks:mu
	written uint64 // pages written back (BdiWritten)
	// +checklocks:mu
	throttled uint64 // attempts deferred by max_inflight
	// +checklocks:mu
	nerrors uint64 // failed attempts (writeback_errors)
	// +checklocks:mu
	gone uint64 // inodes dropped because their file went away
	// +checklocks:mu
	rescans uint64 // tree rescans on this device (Registry.Rescanned)
	// +checklocks:mu
	outcomes [policy.NumOutcomes]uint64 // attempts by outcome
	// +checklocks:mu
	stuck int // calls past attempt_timeout that have not returned
	// +checklocks:mu
	offLoop map[uint64]time.Duration // calls running off the device's goroutine (closes, detached calls), by id: when they began
	// +checklocks:mu
	detached uint64 // writeback calls detached (see detachAfter)
	// +checklocks:mu
	detachReturned bool // a detached call returned: retry b_more_io_wait now
	// +checklocks:mu
	lateErr map[inode.Key]error // errors of detached calls, for the inode's next attempt
	// +checklocks:mu
	unbusy chan struct{} // closed when a Busy inode's call returns (unbusyLocked); nil until asked for
	// +checklocks:mu
	reprobe map[uint64]bool // devs whose detached probe said sync_file_range is unsupported
	// +checklocks:mu
	offLoopSeq uint64
	// +checklocks:mu
	classWarned bool // the expire-class limit was logged
	// +checklocks:mu
	newCfg *Config // a reload's tunables, taken by the goroutine
	// +checklocks:mu
	bandwidth uint64 // kB/s, smoothed
	// +checklocks:mu
	pause time.Duration
	// +checklocks:mu
	plugStats [3]uint64 // the plug's requests, merges, batches, published after each work
	// +checklocks:mu
	running bool

	// shuttingDown: the daemon is exiting (Registry.Shutdown); a file
	// whose filesystem cannot be written (FSUnavailable: EROFS,
	// ESHUTDOWN, ENODEV, ENXIO), or that the daemon may not open (EACCES,
	// EPERM), is given up at once and recorded in givenUp instead of
	// being retried until shutdown_timeout.
	// +checklocks:mu
	shuttingDown bool
	// +checklocks:mu
	givenUp []GivenUp

	wake    chan struct{}
	stopped chan struct{}

	// Loops counts iterations of the writeback loop (wakeups).
	Loops atomic.Uint64
	// beat is the daemon clock (nanoseconds) at the goroutine's last sign
	// of life; sleeping is set while it waits for work or a timer.
	beat     atomic.Int64
	sleeping atomic.Bool
	// stallMax is the longest time (nanoseconds) between two signs of
	// life of the goroutine while it was awake: how long one wait (a
	// batch's call, an open) kept it from its loop. Written by the
	// goroutine, read by Snapshot.
	stallMax atomic.Int64
	// BeforePass, if set before Run, is called by the goroutine before
	// each round of work (a test hook: a hook that blocks wedges the
	// loop, which Healthy must notice).
	BeforePass func()
	// Trace, if set before Run, is called after each attempt with the
	// file's path, the attempt's outcome and where the inode went (like
	// the kernel's writeback_single_inode tracepoint). It runs on the
	// writeback goroutine, without locks held.
	Trace func(path string, o policy.Outcome, d policy.Dest, err error)

	// Owned by the writeback goroutine.
	plug         Plug
	backoff      policy.Backoff
	lastOldFlush time.Duration
	waitRetryAt  time.Duration
	pass         passCounters
	probed       map[uint64]bool // dev -> sync_file_range probed
	// wbIndex is each chunked file's writeback index: the byte offset its
	// next attempt starts at (mapping->writeback_index). Only files larger
	// than write_chunk have one, so it is kept here, not in every Inode.
	wbIndex     map[inode.Key]int64
	fallback    map[uint64]bool // dev -> use fdatasync for start-writeback
	lastBusyLog time.Duration
	opener      *opener // nil until the first timed open
	openTimer   *time.Timer
	bwPages     uint64        // pages written in the current bandwidth period
	bwTime      time.Duration // submission time in the current period
}

type passCounters struct {
	pages, cleaned uint64
	// sized counts whole-file attempts that found more than write_chunk
	// and handed the file to the chunked path: no pages, but progress.
	sized uint64
	// throttled counts attempts deferred by max_inflight: they are
	// retried after at most throttleRetry, not after the growing
	// backoff, or the device would sit idle between them.
	throttled uint64
}

// throttleRetry is the longest wait before the files deferred by
// max_inflight are tried again (b_more_io_wait's pause is cut to it).
const throttleRetry = 50 * time.Millisecond

func (p passCounters) progress() bool { return p.pages > 0 || p.cleaned > 0 || p.sized > 0 }

// New returns a device's writeback state; Run starts its goroutine. now is
// the daemon's monotonic clock; stats may be nil (no stats file).
func New(name string, cfg Config, now func() time.Duration, open inode.Opener, log *zap.Logger, stats *statsWriter) *Writeback {
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("bdi", name))
	wb := &Writeback{
		Name:     name,
		cfg:      cfg,
		now:      now,
		open:     open,
		log:      log,
		errLog:   log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewSamplerWithOptions(c, 10*time.Second, 5, 0) })),
		stats:    stats,
		inodes:   make(map[inode.Key]*inode.Inode),
		wake:     make(chan struct{}, 1),
		stopped:  make(chan struct{}),
		backoff:  policy.Backoff{Min: cfg.MinPause, Max: cfg.MaxPause},
		probed:   make(map[uint64]bool),
		wbIndex:  make(map[inode.Key]int64),
		fallback: make(map[uint64]bool),
	}
	wb.plug = Plug{Enabled: cfg.PlugEnabled, MaxPending: cfg.MaxPending, Submit: wb.submit}
	return wb
}

func (wb *Writeback) kick() {
	select {
	case wb.wake <- struct{}{}:
	default:
	}
}

// hasDirtyIOLocked is wb_has_dirty_io. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) hasDirtyIOLocked() bool {
	return !wb.bDirty.empty() || !wb.BIO.Empty() || !wb.BMoreIO.Empty() || !wb.BMoreIOWait.Empty() || !wb.inflight.Empty()
}

// MarkInodeDirty is __mark_inode_dirty for a write seen on the file key at
// path: the first time an inode is dirtied it gets dirtiedWhen = now and
// goes onto b_dirty; an inode that is already dirty keeps its dirtiedWhen
// and its place; one under a writeback attempt is flagged redirtied and the
// attempt's requeue decides its list. path replaces the recorded path (a
// rename). h is the file's handle if the caller has it (fanotify); for a
// new inode without one, it is asked of the opener when that is an
// inode.HandleOpener. Safe for concurrent use.
func (wb *Writeback) MarkInodeDirty(key inode.Key, path string, h inode.Handle, t Tree) {
	now := wb.now()
	wb.mu.Lock()
	in := wb.inodes[key]
	if in == nil && h == "" {
		if ho, ok := wb.open.(inode.HandleOpener); ok {
			// A new inode: its handle is taken once, without the lock
			// (no handle: it is opened by path).
			wb.mu.Unlock()
			h, _ = ho.HandleOf(path, key)
			wb.mu.Lock()
			in = wb.inodes[key]
		}
	}
	if in == nil {
		class, exact := wb.bDirty.class(t.Expire)
		if !exact && !wb.classWarned {
			wb.classWarned = true
			wb.log.Warn("more than 255 distinct expire intervals hold files on this device (reloads); new files share the nearest one",
				zap.Stringer("expire", t.Expire), zap.Stringer("used", wb.bDirty.classes[class].expire))
		}
		in = &inode.Inode{Key: key, Class: class}
		in.SetPath(path)
		in.SetHandle(h)
		if t.Integrity {
			in.State |= inode.Integrity
		}
		wb.inodes[key] = in
	} else {
		switch old := in.Handle(); {
		case h == "" || h == old:
		case old == "":
			in.SetHandle(h)
		default:
			// The same (dev, ino) with another handle: the tracked inode
			// was deleted and a new file took its number (ext4 reuses
			// numbers at once). The inode is that file now.
			in.SetHandle(h)
			in.SetPath(path)
			in.Errors, in.LastErr = 0, 0
		}
		if !in.HasPath(path) {
			in.SetOtherPath(in.Path())
			in.SetPath(path)
		}
		if wb.failedLocked(in) {
			// Written again: its earlier loss is no longer the
			// state of its data. It is dirty like a new file.
			lists.Remove(in)
			wb.nfailed--
			in.Errors, in.LastErr, in.Retries = 0, 0, 0
		}
	}
	wasIdle := false
	switch {
	case in.Has(inode.Sync):
		in.State |= inode.Dirty | inode.Redirtied
	case in.Has(inode.Dirty):
		// Already dirty: dirtiedWhen is not changed.
	default:
		wasIdle = !wb.hasDirtyIOLocked()
		in.State |= inode.Dirty
		in.DirtiedWhen = now
		wb.bDirty.pushBack(in)
	}
	wb.gen++
	wb.mu.Unlock()
	if wasIdle {
		wb.kick()
	}
}

// parkFailedLocked moves in to bFailed. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) parkFailedLocked(in *inode.Inode) {
	in.State &^= inode.Dirty | inode.Sync | inode.Redirtied | inode.DataError | inode.Wrote
	wb.bFailed.MoveToBack(in)
	wb.nfailed++
}

// forgetFailedLocked forgets an inode on bFailed. Preconditions: wb.mu
// held.
//
// +checklocks:wb.mu
func (wb *Writeback) forgetFailedLocked(in *inode.Inode) {
	lists.Remove(in)
	wb.nfailed--
	delete(wb.inodes, in.Key)
	delete(wb.wbIndex, in.Key)
	wb.bDirty.unref(in.Class)
	in.State = 0
}

// failedLocked reports whether in is on bFailed. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) failedLocked(in *inode.Inode) bool {
	return in.Link().Linked() && !in.Has(inode.Dirty)
}

// Failed returns the inodes whose data was lost (see bFailed): path and
// the errno of the failure.
func (wb *Writeback) Failed() []GivenUp {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	var out []GivenUp
	for in := range wb.bFailed.All {
		out = append(out, GivenUp{Path: in.Path(), Err: errnoError(in.LastErr)})
	}
	return out
}

// errnoError turns a LastErr back into an error.
func errnoError(e uint8) error {
	if e == 0 || e == inode.ErrnoOther {
		return errors.New("writeback failed")
	}
	return unix.Errno(e)
}

// RetireUnder is for a tree removed from the configuration (a reload):
// every tracked inode below root for which keep(path) is false (keep says
// whether another tree still holds the path) is written back once more,
// at the next pass, and then forgotten. It returns how many. keep is
// called without the list lock (it takes the watcher's).
func (wb *Writeback) RetireUnder(root string, keep func(path string) bool) int {
	type cand struct {
		in   *inode.Inode
		path string
	}
	var cands []cand
	wb.mu.Lock()
	for _, in := range wb.inodes {
		if in.InDir(root) {
			cands = append(cands, cand{in, in.Path()})
		}
	}
	wb.mu.Unlock()
	leaving := make(map[*inode.Inode]bool, len(cands))
	for _, c := range cands {
		if !keep(c.path) {
			leaving[c.in] = true
		}
	}
	n := 0
	wb.mu.Lock()
	for in := range leaving {
		if wb.inodes[in.Key] != in {
			continue // forgotten meanwhile
		}
		n++
		if wb.failedLocked(in) {
			// Nothing to write: its data was lost earlier (logged
			// then); the tree no longer holds it.
			wb.forgetFailedLocked(in)
			continue
		}
		in.State |= inode.Leaving
		if !in.Has(inode.Sync) {
			wb.BMoreIO.MoveToBack(in) // taken by the next queue_io
		}
	}
	wb.gen++
	wb.mu.Unlock()
	if n > 0 {
		wb.Queue(&Work{NrPages: math.MaxInt64, Reason: "reload"})
	}
	return n
}

// MaxDirtyAge returns the age of the oldest dirty data of a tracked inode
// (now minus the smallest dirtiedWhen), 0 when nothing is tracked. It
// looks at the front of each b_dirty class (each is in dirtiedWhen order)
// and at every inode of the other lists.
func (wb *Writeback) MaxDirtyAge() time.Duration {
	now := wb.now()
	wb.mu.Lock()
	defer wb.mu.Unlock()
	oldest, any := now, false
	see := func(in *inode.Inode) {
		if in != nil && in.DirtiedWhen < oldest {
			oldest = in.DirtiedWhen
		}
		any = any || in != nil
	}
	for _, c := range wb.bDirty.classes {
		see(c.list.Front())
	}
	for _, l := range []*lists.List[*inode.Inode]{&wb.BIO, &wb.BMoreIO, &wb.BMoreIOWait, &wb.inflight} {
		for in := range l.All {
			see(in)
		}
	}
	if !any {
		return 0
	}
	return now - oldest
}

// DropUnder forgets every tracked inode whose path is below root (its tree
// is gone: removed or unmounted); one under an attempt is dropped when the
// attempt completes. It returns the number dropped or marked.
func (wb *Writeback) DropUnder(root string) int {
	n := 0
	wb.mu.Lock()
	for k, in := range wb.inodes {
		if !in.InDir(root) {
			continue
		}
		n++
		if in.Has(inode.Sync) {
			in.State |= inode.Dropped
			continue
		}
		if wb.failedLocked(in) {
			wb.nfailed--
		}
		lists.Remove(in)
		delete(wb.inodes, k)
		wb.bDirty.unref(in.Class)
		in.State = 0
		wb.gone++
	}
	wb.gen++
	wb.mu.Unlock()
	wb.kick()
	return n
}

// Tracked returns the number of tracked (dirty) inodes.
func (wb *Writeback) Tracked() int {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return len(wb.inodes) - wb.nfailed
}

// Queue adds work for the goroutine (wb_queue_work) and wakes it.
func (wb *Writeback) Queue(w *Work) {
	w.done = make(chan struct{})
	wb.mu.Lock()
	wb.work = append(wb.work, w)
	wb.mu.Unlock()
	wb.kick()
}

func (wb *Writeback) dequeue() *Work {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	if len(wb.work) == 0 {
		return nil
	}
	w := wb.work[0]
	wb.work[0] = nil
	wb.work = wb.work[1:]
	return w
}

func (wb *Writeback) workQueued() bool {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return len(wb.work) > 0
}

// Run is the writeback goroutine, wb_workfn: it runs queued work and
// kupdate passes, then sleeps. Sleep rules: while b_more_io_wait is
// non-empty, the backoff pause (kupdate then runs early); with other dirty
// io, until the next dirty_writeback_interval tick; with nothing dirty, no
// timer at all until MarkInodeDirty or Queue wakes it. Run returns when ctx
// is done.
func (wb *Writeback) Run(ctx context.Context) {
	defer close(wb.stopped)
	defer func() {
		if wb.opener != nil {
			close(wb.opener.jobs)
		}
	}()
	wb.mu.Lock()
	wb.running = true
	wb.mu.Unlock()
	wb.beat.Store(int64(wb.now()))
	var timer *time.Timer
	for ctx.Err() == nil {
		wb.Loops.Add(1)
		wb.alive()
		if wb.BeforePass != nil {
			wb.BeforePass()
		}
		wb.applyConfig()
		wb.doWriteback()
		wb.writeStats(false)
		d, arm := wb.sleepFor()
		if arm && d <= 0 {
			continue // more to do now; the loop checks ctx first
		}
		var tc <-chan time.Time
		if arm {
			tc = resetTimer(&timer, d)
		}
		wb.sleeping.Store(true)
		select {
		case <-wb.wake:
		case <-tc:
		case <-ctx.Done():
		}
		wb.sleeping.Store(false)
		wb.beat.Store(int64(wb.now())) // the sleep is not a stall
		if timer != nil {
			timer.Stop()
		}
	}
	wb.mu.Lock()
	wb.running = false
	wb.mu.Unlock()
	wb.writeStats(true)
}

// alive records a sign of life of the goroutine, and the time since the
// last one when it is the longest yet (loop_stall_max_us).
func (wb *Writeback) alive() {
	now := int64(wb.now())
	if gap := now - wb.beat.Swap(now); gap > wb.stallMax.Load() {
		wb.stallMax.Store(gap)
	}
}

// Healthy reports whether the writeback goroutine is sleeping (nothing to
// do until a timer or a wakeup) or has shown a sign of life within limit:
// an iteration of its loop, an inode taken off b_io, or a request of a
// batch finished or given up on (attempt_timeout). A goroutine stuck for
// longer is wedged; the watchdog stops pinging for it. Calls stuck in the
// kernel (a frozen filesystem) do not make it unhealthy: they are given up
// on after attempt_timeout, and counted in StuckCalls.
func (wb *Writeback) Healthy(limit time.Duration) bool {
	if wb.sleeping.Load() {
		return true
	}
	select {
	case <-wb.stopped:
		return true // stopped on purpose
	default:
	}
	return wb.now()-time.Duration(wb.beat.Load()) < limit
}

// StuckCalls returns the number of writeback system calls (opens
// included) that exceeded attempt_timeout and have not returned.
func (wb *Writeback) StuckCalls() int {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return wb.stuck + wb.stuckOffLoopLocked()
}

// SetConfig replaces the device's tunables (a configuration reload). The
// goroutine takes them at its next round of work; a pass in progress ends
// with the old ones.
func (wb *Writeback) SetConfig(cfg Config) {
	wb.mu.Lock()
	wb.newCfg = &cfg
	wb.mu.Unlock()
	wb.kick()
}

// applyConfig installs a pending SetConfig; called by the goroutine
// between rounds, when no request is in flight.
func (wb *Writeback) applyConfig() {
	wb.mu.Lock()
	cfg := wb.newCfg
	wb.newCfg = nil
	if cfg != nil {
		wb.cfg = *cfg
		wb.backoff.Min, wb.backoff.Max = cfg.MinPause, cfg.MaxPause
		if wb.backoff.Pause > cfg.MaxPause {
			wb.backoff.Pause = cfg.MaxPause
		}
	}
	wb.mu.Unlock()
	if cfg != nil {
		wb.plug.Enabled, wb.plug.MaxPending = cfg.PlugEnabled, cfg.MaxPending
		wb.log.Info("configuration applied", zap.Stringer("dirty_writeback_interval", cfg.DirtyWritebackInterval),
			zap.Stringer("min_pause", cfg.MinPause), zap.Stringer("max_pause", cfg.MaxPause), zap.Int64("write_chunk", cfg.WriteChunk))
	}
}

// Stopped is closed when Run has returned.
func (wb *Writeback) Stopped() <-chan struct{} { return wb.stopped }

// sleepFor returns how long to sleep, and whether to arm a timer at all.
func (wb *Writeback) sleepFor() (time.Duration, bool) {
	now := wb.now()
	wb.mu.Lock()
	defer wb.mu.Unlock()
	if len(wb.work) > 0 {
		return 0, true
	}
	tick := wb.lastOldFlush + wb.cfg.DirtyWritebackInterval - now
	// A change not yet in the stats file (rate-limited, or backing off
	// after a failed write) is written when its turn comes, not at the
	// next tick, which may be far off.
	at, statsDue := wb.stats.due(wb.gen)
	if statsDue {
		tick = min(tick, max(at-now, time.Millisecond))
	}
	if !wb.BMoreIOWait.Empty() {
		return min(wb.waitRetryAt-now, tick), true
	}
	if wb.hasDirtyIOLocked() {
		return tick, true
	}
	if statsDue {
		return max(at-now, time.Millisecond), true
	}
	return 0, false
}

// doWriteback is wb_do_writeback: queued work first, then kupdate.
func (wb *Writeback) doWriteback() {
	for w := wb.dequeue(); w != nil; w = wb.dequeue() {
		if w.Files != nil {
			wb.syncFiles(w)
			wb.mu.Lock()
			wb.publishPlugStatsLocked()
			wb.mu.Unlock()
		} else {
			wb.wbWriteback(w)
		}
		close(w.done)
	}
	wb.checkOldDataFlush()
}

// checkOldDataFlush is wb_check_old_data_flush: a kupdate pass every
// dirty_writeback_interval, and early once the backoff pause of
// b_more_io_wait has passed.
func (wb *Writeback) checkOldDataFlush() {
	now := wb.now()
	wb.mu.Lock()
	has := wb.hasDirtyIOLocked()
	waiting := !wb.BMoreIOWait.Empty()
	returned := wb.detachReturned
	wb.detachReturned = false
	wb.mu.Unlock()
	if !has {
		return
	}
	due := now >= wb.lastOldFlush+wb.cfg.DirtyWritebackInterval
	early := waiting && (now >= wb.waitRetryAt || returned)
	if !due && !early {
		return
	}
	if due {
		wb.lastOldFlush = now
	}
	wb.wbWriteback(&Work{NrPages: math.MaxInt64, ForKupdate: true, Reason: "periodic"})
}

// wbWriteback is wb_writeback: it refills b_io with queueIO and writes it
// under a plug until the work's pages are used up, other work is queued
// (kupdate and background work yield), or a pass makes no progress. It
// leaves when b_more_io is empty even if b_more_io_wait is not: those wait
// for the backoff pause instead of being busy-retried.
func (wb *Writeback) wbWriteback(w *Work) {
	w.start = wb.now()
	for w.NrPages > 0 {
		if (w.ForKupdate || w.ForBackground) && wb.workQueued() {
			break
		}
		now := wb.now()
		wb.mu.Lock()
		if wb.BIO.Empty() {
			wb.queueIOLocked(w, now)
		}
		empty := wb.BIO.Empty()
		wb.mu.Unlock()
		if empty {
			break
		}
		wb.pass = passCounters{}
		wb.plug.Start()
		wb.writebackSBInodes(w)
		wb.plug.Finish()
		wb.mu.Lock()
		wb.publishPlugStatsLocked()
		wb.mu.Unlock()
		// A work can run for long while files keep expiring: keep the
		// stats file fresh (writeStats is rate-limited).
		wb.writeStats(false)
		if wb.pass.throttled > 0 {
			w.throttled = true
		}
		if wb.pass.progress() {
			w.progress = true
			continue
		}
		wb.mu.Lock()
		moreIO := !wb.BMoreIO.Empty()
		wb.mu.Unlock()
		if !moreIO {
			break
		}
		// No progress although b_more_io is not empty: looping again
		// would spin.
		if now-wb.lastBusyLog >= time.Minute || wb.lastBusyLog == 0 {
			wb.lastBusyLog = now
			wb.log.Warn("possible busy loop: a writeback pass made no progress with b_more_io non-empty", zap.String("reason", w.Reason))
		}
		break
	}
	wb.mu.Lock()
	switch {
	case wb.BMoreIOWait.Empty():
		wb.backoff.Reset()
	case w.waitSpliced || wb.backoff.Pause == 0 || w.throttled:
		// The pause advances only when the waiting inodes were
		// retried (or have just started waiting): a kupdate tick
		// that did not reach them must not postpone them.
		d := wb.backoff.Next(w.progress)
		if w.throttled {
			d = min(d, throttleRetry)
		}
		wb.waitRetryAt = wb.now() + d
	}
	wb.pause = wb.backoff.Pause
	wb.publishPlugStatsLocked()
	wb.gen++
	wb.mu.Unlock()
}

// publishPlugStatsLocked copies the plug's counters, which only the
// writeback goroutine touches, where Snapshot can read them.
// Preconditions: wb.mu held; called on the writeback goroutine.
//
// +checklocks:wb.mu
func (wb *Writeback) publishPlugStatsLocked() {
	wb.plugStats = [3]uint64{wb.plug.Requests, wb.plug.Merges, wb.plug.Batches}
}

// syncFiles runs a sync request (WB_SYNC_ALL for named files, reason
// "sync"): each file is tracked if it was not, taken off whatever list it is
// on and written with fdatasync; the request's files go out as one batch
// of their own (so a large request can use syncfs, see IntegritySyncfs),
// submitted with FlushPlug as soon as they are queued, without waiting for
// background work. A file that a call of background work still holds (one
// left to its worker, see detachAfter) is waited for, up to
// attempt_timeout; one still held then fails with ErrAttemptTimeout.
func (wb *Writeback) syncFiles(w *Work) {
	w.Errs = make([]error, len(w.Files))
	// One attempt per inode: a request may name a file twice (twice by
	// the same path, by two names, or as itself and within a directory).
	first := make(map[inode.Key]int, len(w.Files))
	var dups [][2]int // (index, index of the first request for its inode)
	wb.plug.Start()
	for i, f := range w.Files {
		if j, ok := first[f.Key]; ok {
			dups = append(dups, [2]int{i, j})
			continue
		}
		first[f.Key] = i
		wb.mu.Lock()
		if in := wb.inodes[f.Key]; in != nil && wb.failedLocked(in) {
			// A sync is not a new write: its data stays lost.
			w.Errs[i] = fmt.Errorf("%w: the data was dropped after a failed writeback", errnoError(in.LastErr))
			wb.mu.Unlock()
			continue
		}
		wb.mu.Unlock()
		wb.MarkInodeDirty(f.Key, f.Path, "", f.Tree)
		wb.mu.Lock()
		in := wb.inodes[f.Key]
		if in.Has(inode.Busy) && !wb.waitUnbusyLocked(in) {
			wb.mu.Unlock()
			w.Errs[i] = ErrAttemptTimeout
			continue
		}
		wb.inflight.MoveToBack(in)
		in.State |= inode.Sync
		in.State &^= inode.Redirtied
		path := in.Path()
		wb.mu.Unlock()
		wb.writebackSingleInode(in, path, f.Key, true, &w.Errs[i])
	}
	wb.plug.Flush()
	wb.plug.Finish()
	for _, d := range dups {
		w.Errs[d[0]] = w.Errs[d[1]]
	}
}

// waitUnbusyLocked waits, for a sync request, until no call for in is
// running off the device's goroutine (a detached writeback call or open,
// or a stuck one), for attempt_timeout at most (10 s when that is 0), and
// reports whether in is free. wb.mu is released while it waits.
// Preconditions: wb.mu held; called on the writeback goroutine.
//
// +checklocks:wb.mu
func (wb *Writeback) waitUnbusyLocked(in *inode.Inode) bool {
	limit := wb.cfg.AttemptTimeout
	if limit <= 0 {
		limit = 10 * time.Second
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	for in.Has(inode.Busy) {
		if wb.unbusy == nil {
			wb.unbusy = make(chan struct{})
		}
		ch := wb.unbusy
		wb.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			wb.mu.Lock()
			return !in.Has(inode.Busy)
		}
		wb.alive()
		wb.mu.Lock()
	}
	return true
}

// Refs returns a FileRef for every tracked inode whose path is under dir
// (every one when dir is ""), for a sync request.
func (wb *Writeback) Refs(dir string) []FileRef {
	dir = strings.TrimSuffix(dir, "/")
	wb.mu.Lock()
	defer wb.mu.Unlock()
	var out []FileRef
	for _, in := range wb.inodes {
		if dir != "" && !in.InDir(dir) {
			continue
		}
		out = append(out, FileRef{Key: in.Key, Path: in.Path(),
			Tree: Tree{Expire: wb.bDirty.classes[in.Class].expire, Integrity: in.Has(inode.Integrity)}})
	}
	return out
}

// InodeInfo describes one tracked inode, for `flusherd dirty`.
type InodeInfo struct {
	Path   string
	Key    inode.Key
	Handle inode.Handle
	// List is b_dirty, b_io (including an attempt in flight), b_more_io,
	// b_more_io_wait, or failed (its data was lost; see bFailed).
	List string
	// DirtiedWhen is on the daemon's monotonic clock (see Registry.Now).
	DirtiedWhen         time.Duration
	DirtyPages, WBPages uint32 // as last seen by cachestat
	Retries, Errors     uint16
	LastErr             uint8 // errno; inode.ErrnoOther for an error that is not one
	Busy                bool  // a call for it exceeded attempt_timeout and has not returned
}

// Inodes describes every tracked inode.
func (wb *Writeback) Inodes() []InodeInfo {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	out := make([]InodeInfo, 0, len(wb.inodes))
	add := func(list string, in *inode.Inode) {
		out = append(out, InodeInfo{Path: in.Path(), Key: in.Key, Handle: in.Handle(), List: list,
			DirtiedWhen: in.DirtiedWhen, DirtyPages: in.DirtyPages, WBPages: in.WritebackPages,
			Retries: in.Retries, Errors: in.Errors, LastErr: in.LastErr, Busy: in.Has(inode.Busy)})
	}
	for _, c := range wb.bDirty.classes {
		for in := range c.list.All {
			add("b_dirty", in)
		}
	}
	for _, l := range []struct {
		name string
		list *lists.List[*inode.Inode]
	}{{"b_io", &wb.BIO}, {"b_io", &wb.inflight}, {"b_more_io", &wb.BMoreIO}, {"b_more_io_wait", &wb.BMoreIOWait}, {"failed", &wb.bFailed}} {
		for in := range l.list.All {
			add(l.name, in)
		}
	}
	return out
}

// OpenInode opens a tracked inode as its writeback attempts do (by handle
// when it has one), for a fresh cachestat.
func (wb *Writeback) OpenInode(i InodeInfo) (inode.File, error) {
	f, _, err := wb.openFile(i.Path, i.Key, i.Handle)
	return f, err
}

// queueIOLocked is queue_io: b_more_io, then b_more_io_wait (once per work,
// and only once its pause has passed, or for sync work), then the expired
// part of b_dirty, oldest first, go to b_io. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) queueIOLocked(w *Work, now time.Duration) {
	wb.BIO.SpliceBackInit(&wb.BMoreIO)
	if !w.waitSpliced && (w.All || w.SyncMode == SyncAll || now >= wb.waitRetryAt) {
		wb.BIO.SpliceBackInit(&wb.BMoreIOWait)
		w.waitSpliced = true
	}
	if w.All || w.SyncMode == SyncAll {
		wb.bDirty.moveExpired(&wb.BIO, w.start, true)
	} else {
		wb.bDirty.moveExpired(&wb.BIO, now, false)
	}
}

// writebackSBInodes is writeback_sb_inodes: it takes inodes off b_io one by
// one and queues their writeback in the plug, until b_io is empty, the
// work's pages are used up, or the time slice has passed after some were
// queued.
func (wb *Writeback) writebackSBInodes(w *Work) {
	start := wb.now()
	for {
		wb.alive()
		wb.mu.Lock()
		in := wb.BIO.Front()
		if in == nil {
			wb.mu.Unlock()
			return
		}
		if in.Has(inode.Busy) || (in.NextRetry > 0 && w.SyncMode == SyncNone && !w.All && wb.now() < in.NextRetry) {
			// A call for it is still stuck, or it failed with an I/O
			// error and waits for max_pause: not now.
			wb.BMoreIOWait.MoveToBack(in)
			wb.mu.Unlock()
			continue
		}
		wb.inflight.MoveToBack(in)
		in.State |= inode.Sync
		in.State &^= inode.Redirtied
		integrity := w.SyncMode == SyncAll || in.Has(inode.Integrity)
		path, key := in.Path(), in.Key
		wb.mu.Unlock()

		queued := wb.writebackSingleInode(in, path, key, integrity, nil)
		w.NrPages -= queued
		if w.NrPages <= 0 {
			return
		}
		if (w.ForKupdate || w.ForBackground) && wb.workQueued() {
			// Yield to queued work (a sync) as soon as possible;
			// what is in the plug goes out at Finish.
			return
		}
		if queued > 0 && w.SyncMode == SyncNone && wb.now()-start >= timeSlice {
			return
		}
	}
}

// attempt is one writeback attempt on one inode, from open to requeue.
type attempt struct {
	in                    *inode.Inode
	f                     inode.File
	err                   error
	dirtyBefore, wbBefore uint64
	pre                   policy.Outcome // when nothing was written
	wrote, chunkUsed      bool
	remaining             int // requests not yet finished
	// refs counts holders of f: the attempt itself and each request whose
	// system call is running; the last to let go closes it.
	refs atomic.Int32
	// stuck counts timed-out requests whose call has not returned, and
	// detached the detached ones (see detachAfter). Guarded by the list
	// lock.
	stuck, detached int
	// result, if set, receives the attempt's error (a sync request).
	result *error
	// afterKnown: a whole-file request already read the state after the
	// write (dirtyAfter, wbAfter).
	afterKnown          bool
	dirtyAfter, wbAfter uint64
	sized               bool // a whole-file attempt found it too large
	handle              inode.Handle
	// renewed is the handle of a new file found under the inode's number
	// (openFile); the inode takes it at completion.
	renewed inode.Handle
	// fsErrAt is when a writeback error was last seen on the inode's
	// filesystem (ErrWatch; daemon clock), read when its data had left
	// the page cache without flusherd writing it; 0: none, or not read.
	fsErrAt time.Duration
	fsErrno unix.Errno // the error that check saw
	// wroteBefore: an earlier attempt wrote the inode's data since it
	// became dirty (inode.Wrote), so finding it clean is no surprise.
	wroteBefore bool
	path        string
	wb          *Writeback // closes the file (closeFile); nil in tests
}

// hold takes a reference on the attempt's file.
func (a *attempt) hold() { a.refs.Add(1) }

// release drops a reference and closes the file with the last one, on a
// goroutine of its own when the attempt has a Writeback (closeFile).
func (a *attempt) release() {
	if a.refs.Add(-1) == 0 && a.f != nil {
		if a.wb != nil {
			a.wb.closeFile(a.f)
		} else {
			a.f.Close()
		}
	}
}

// closeFile closes f on a goroutine of its own: close(2) can block for
// long (a FUSE or NFS file's flush writes it back and waits; a stalled
// server holds it), and the device's goroutine, which completes attempts,
// must not. A close still running after attempt_timeout counts in
// StuckCalls (and stuck_calls) until it returns.
func (wb *Writeback) closeFile(f inode.File) {
	wb.mu.Lock()
	id := wb.trackCallLocked(wb.now())
	wb.mu.Unlock()
	go func() {
		f.Close()
		wb.mu.Lock()
		wb.returnedLocked(id)
		wb.mu.Unlock()
	}()
}

// trackCallLocked records a call that runs off the device's goroutine (a
// close, a detached writeback call), begun at since (daemon clock), so that
// it counts in stuck_calls once it runs past attempt_timeout; the caller
// deletes wb.offLoop[id] when it returns. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) trackCallLocked(since time.Duration) uint64 {
	wb.offLoopSeq++
	if wb.offLoop == nil {
		wb.offLoop = map[uint64]time.Duration{}
	}
	wb.offLoop[wb.offLoopSeq] = since
	return wb.offLoopSeq
}

// returnedLocked ends the record of an off-loop call (trackCallLocked)
// that has returned, and says how long it ran (daemon clock) and whether
// that was past attempt_timeout. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) returnedLocked(id uint64) (took time.Duration, overran bool) {
	took = wb.now() - wb.offLoop[id]
	delete(wb.offLoop, id)
	return took, wb.cfg.AttemptTimeout > 0 && took > wb.cfg.AttemptTimeout
}

// stuckOffLoopLocked counts the closes and detached calls running for
// longer than attempt_timeout. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) stuckOffLoopLocked() int {
	if wb.cfg.AttemptTimeout <= 0 || len(wb.offLoop) == 0 {
		return 0
	}
	n, now := 0, wb.now()
	for _, since := range wb.offLoop {
		if now-since > wb.cfg.AttemptTimeout {
			n++
		}
	}
	return n
}

// writebackSingleInode is __writeback_single_inode under an inner plug: it
// opens the file safely, reads its page-cache state with cachestat, and
// queues at most write_chunk of its dirty data (all of it for integrity
// work, which is one fdatasync). It returns the dirty pages queued.
// Attempts that need no write are completed at once.
func (wb *Writeback) writebackSingleInode(in *inode.Inode, path string, key inode.Key, integrity bool, result *error) int64 {
	wb.plug.Start()
	defer wb.plug.Finish()
	att := &attempt{in: in, result: result, path: path, wb: wb}
	wb.mu.Lock()
	att.handle = in.Handle()
	att.wroteBefore = in.Has(inode.Wrote)
	late, failedLate := wb.lateErr[key]
	delete(wb.lateErr, key)
	wb.mu.Unlock()
	att.refs.Store(1)
	if failedLate {
		// A detached call of its last attempt failed: this attempt
		// is that failure's report (classified, counted, logged and
		// requeued as any attempt's error); the next one writes.
		att.err = late
		wb.complete(att)
		return 0
	}
	page := int64(os.Getpagesize())
	if dp := int64(in.DirtyPages) * page; !integrity && dp > wb.cfg.WriteChunk/4 && dp <= wb.cfg.WriteChunk && wb.congested(in, 0) {
		// Known to be biggish (its last attempt saw it) and bound for
		// a worker, and the device has max_inflight under writeback
		// in other files: it waits, small files go. (Its own count is
		// left out: it is as old as its last attempt, and this one
		// would not look again. Bigger files take the chunked path,
		// which decides on a fresh cachestat.)
		wb.assumeUnderWriteback(att)
		wb.complete(att)
		return 0
	}
	if integrity || int64(in.DirtyPages)*page <= wb.cfg.WriteChunk {
		// The usual case: the whole attempt runs on a plug worker, in
		// parallel with the others of the batch.
		att.remaining = 1
		wb.plug.Add(&Request{Dev: key.Dev, Ino: key.Ino, Integrity: integrity, att: att, whole: true, path: path, handle: att.handle})
		return max(1, int64(in.DirtyPages))
	}
	f, renewed, err := wb.openTimed(in, path, key, att.handle)
	if errors.Is(err, errOpenDetached) {
		// Not known to be written: tried again once the open returns.
		wb.assumeUnderWriteback(att)
		wb.complete(att)
		return 0
	}
	if err != nil {
		att.err = err
		wb.complete(att)
		return 0
	}
	att.f, att.renewed = f, renewed
	// cachestat(2) runs on this goroutine, untimed: it cannot wait on a
	// slow or hung filesystem. mm/filemap.c's filemap_cachestat walks
	// the page cache's xarray under rcu_read_lock, taking no folio lock,
	// calling into no filesystem and waiting for no I/O; its cost is the
	// range walked (ranges bisects, so O(log size) calls).
	dirty, wbp, err := f.Cachestat(0, 0)
	if err != nil {
		att.err = err
		wb.complete(att)
		return 0
	}
	att.dirtyBefore, att.wbBefore = dirty, wbp
	o, write := policy.BeforeWrite(dirty, wbp, integrity)
	if write && !integrity && wb.congested(in, wbp) {
		// More than write_chunk to write, and the device has
		// max_inflight under writeback: not now (b_more_io_wait, with
		// backoff), so that a small file written meanwhile does not
		// queue behind this one's stream.
		write, o = false, policy.UnderWriteback
	}
	if !write {
		att.pre = o
		if dirty == 0 && wbp == 0 {
			att.err = checkWriteback(f)
		}
		wb.complete(att)
		return 0
	}
	att.wrote = true
	reqs, queued, err := wb.ranges(att, key)
	if err != nil {
		att.err = err
		wb.complete(att)
		return 0
	}
	att.remaining = len(reqs)
	for _, r := range reqs {
		wb.plug.Add(r)
	}
	return queued
}

// assumeUnderWriteback gives an attempt that did not learn the file's state
// (deferred by max_inflight, or its call left to a worker) the outcome
// UnderWriteback with the inode's last known page counts: unknown means
// still dirty, and it is tried again (b_more_io_wait).
func (wb *Writeback) assumeUnderWriteback(att *attempt) {
	wb.mu.Lock()
	att.pre, att.afterKnown = policy.UnderWriteback, true
	att.dirtyAfter, att.wbAfter = uint64(att.in.DirtyPages), uint64(att.in.WritebackPages)
	wb.mu.Unlock()
}

// openFile opens a tracked file: by handle when it has one and the opener
// can (a rename since it was dirtied does not matter then), else by path.
//
// (st_dev, st_ino) is not an identity over time: ext4 gives a freed inode
// number to the next file at once, and only the handle's generation tells
// the two apart. So when the handle names a deleted inode (ESTALE, or
// inode.ErrUnlinked) and a regular file with the same number is at path, it
// is a new file that took the number: it is opened by its own handle, which
// is returned as renewed for the inode to keep. renewed is "" otherwise.
func (wb *Writeback) openFile(path string, key inode.Key, h inode.Handle) (f inode.File, renewed inode.Handle, err error) {
	ho, ok := wb.open.(inode.HandleOpener)
	if h == "" || !ok {
		f, err = wb.open.Open(path, key)
		return f, "", err
	}
	f, err = ho.OpenHandle(h, key)
	if errors.Is(err, unix.EBADF) && path != "" {
		// No descriptor of the inode's filesystem is registered for
		// opens by handle: a filesystem inside a tree's (a btrfs
		// subvolume has its own st_dev, so does a mount): by path.
		f, err = wb.open.Open(path, key)
		return f, "", err
	}
	if err == nil || path == "" || !errors.Is(err, unix.ESTALE) {
		return f, "", err
	}
	nh, herr := ho.HandleOf(path, key)
	if herr != nil || nh == "" || nh == h {
		return nil, "", err
	}
	nf, nerr := ho.OpenHandle(nh, key)
	if nerr != nil {
		return nil, "", err
	}
	return nf, nh, nil
}

// openJob is an open handed to the opener goroutine.
type openJob struct {
	in    *inode.Inode
	path  string
	key   inode.Key
	h     inode.Handle
	state atomic.Int32 // reqRunning, reqDone or reqDetached
	// began is when the open was handed over (daemon clock); id is its
	// entry in Writeback.offLoop once detached.
	began time.Duration
	id    uint64
}

type openResult struct {
	f       inode.File
	renewed inode.Handle
	err     error
}

// opener is a goroutine that opens files for the writeback goroutine, so
// that an open that is slow or hangs (a frozen or unresponsive filesystem)
// can be left to it. It is replaced when one of its opens is detached.
type opener struct {
	jobs    chan *openJob
	results chan openResult
}

// startOpener starts an opener goroutine; it ends when jobs is closed or
// after a detached open returns.
func (wb *Writeback) startOpener() *opener {
	o := &opener{jobs: make(chan *openJob), results: make(chan openResult)}
	go func() {
		for j := range o.jobs {
			f, renewed, err := wb.openFile(j.path, j.key, j.h)
			wb.mu.Lock()
			inTime := j.state.CompareAndSwap(reqRunning, reqDone)
			var took time.Duration
			overran := false
			if !inTime {
				// Detached: the attempt was completed without it and
				// another opener took over.
				took, overran = wb.returnedLocked(j.id)
				wb.unbusyLocked(j.in)
				wb.gen++
			}
			wb.mu.Unlock()
			if inTime {
				o.results <- openResult{f, renewed, err}
				continue
			}
			if f != nil {
				f.Close()
			}
			if overran {
				wb.errLog.Warn("an open returned after running past attempt_timeout (counted in stuck_calls while it ran)",
					zap.String("path", strconv.Quote(j.path)), zap.Duration("took", took), zap.Error(err))
			} else {
				wb.log.Debug("a detached open returned", zap.String("path", strconv.Quote(j.path)), zap.Error(err))
			}
			wb.kick()
			return
		}
	}()
	return o
}

// errOpenDetached is openTimed's answer for an open left to its opener.
var errOpenDetached = errors.New("open detached")

// openTimed opens the inode's file on the opener goroutine and waits for
// it for detachAfter at most: an open can be as slow as a write, or hang.
// An open still running then is detached (errOpenDetached): the inode is
// Busy until the open(2) returns, the open counts in stuck_calls once it
// runs past attempt_timeout, and the file it then yields is closed at once.
// The opens run on a long-lived opener goroutine, not one goroutine each: a
// blocked file is retried often.
func (wb *Writeback) openTimed(in *inode.Inode, path string, key inode.Key, h inode.Handle) (inode.File, inode.Handle, error) {
	if wb.opener == nil {
		wb.opener = wb.startOpener()
	}
	j := &openJob{in: in, path: path, key: key, h: h, began: wb.now()}
	wb.opener.jobs <- j
	tc := resetTimer(&wb.openTimer, detachAfter)
	defer wb.openTimer.Stop()
	select {
	case r := <-wb.opener.results:
		return r.f, r.renewed, r.err
	case <-tc:
	}
	wb.mu.Lock()
	if j.state.CompareAndSwap(reqRunning, reqDetached) {
		in.State |= inode.Busy
		j.id = wb.trackCallLocked(j.began)
		wb.detached++
		wb.mu.Unlock()
		// The detached opener ends when its open returns.
		close(wb.opener.jobs)
		wb.opener = nil
		return nil, "", errOpenDetached
	}
	wb.mu.Unlock()
	r := <-wb.opener.results
	return r.f, r.renewed, r.err
}

// unbusyLocked clears in's Busy once no call for it is stuck or detached
// (callers have counted theirs down), asks for b_more_io_wait to be
// retried now (the inode waits there for this call only), and wakes a sync
// request waiting for it. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) unbusyLocked(in *inode.Inode) {
	in.State &^= inode.Busy
	wb.detachReturned = true
	if wb.unbusy != nil {
		close(wb.unbusy)
		wb.unbusy = nil
	}
}

// ranges chooses what to write of an attempt's file: everything in one
// request when its dirty data fits in write_chunk (integrity work never gets
// here: it is always a whole-file request),
// else write_chunk-sized windows from the inode's writeback index onwards
// (wrapping at the end, like writeback_index) that cachestat shows dirty,
// until write_chunk of dirty pages are queued.
func (wb *Writeback) ranges(att *attempt, key inode.Key) ([]*Request, int64, error) {
	page := int64(os.Getpagesize())
	chunk := wb.cfg.WriteChunk
	whole := &Request{Dev: key.Dev, Ino: key.Ino, att: att}
	if int64(att.dirtyBefore)*page <= chunk {
		return []*Request{whole}, int64(att.dirtyBefore), nil
	}
	size := att.f.Size()
	start := wb.wbIndex[key]
	if start >= size || start < 0 {
		start = 0
	}
	budget := chunk / page
	var reqs []*Request
	queued := int64(0)
	off, wrapped := start, false
	for budget > 0 {
		regionEnd := size
		if wrapped {
			regionEnd = start
		}
		if off >= regionEnd {
			if wrapped {
				break
			}
			off, wrapped = 0, true
			continue
		}
		// Find the first write_chunk window with dirty pages by
		// bisection, so a sparse file of any size costs O(log size)
		// cachestat calls, not one per window.
		d, _, err := att.f.Cachestat(off, regionEnd-off)
		if err != nil {
			return nil, 0, err
		}
		if d == 0 {
			off = regionEnd
			continue
		}
		lo, hi := off, regionEnd
		for hi-lo > chunk {
			mid := lo + max(page, (hi-lo)/2/page*page)
			dm, _, err := att.f.Cachestat(lo, mid-lo)
			if err != nil {
				return nil, 0, err
			}
			if dm > 0 {
				hi = mid
			} else {
				lo = mid
			}
		}
		n := min(chunk, regionEnd-lo)
		dw, _, err := att.f.Cachestat(lo, n)
		if err != nil {
			return nil, 0, err
		}
		reqs = append(reqs, &Request{Dev: key.Dev, Ino: key.Ino, Off: lo, Len: n, att: att})
		budget -= int64(dw)
		queued += int64(dw)
		off = lo + n
	}
	if off >= size {
		off = 0
	}
	if off == 0 {
		delete(wb.wbIndex, key)
	} else {
		wb.wbIndex[key] = off
	}
	att.chunkUsed = budget <= 0
	if len(reqs) == 0 {
		// Dirty pages beyond the size seen at open (an append): write
		// from the old end onwards.
		reqs = append(reqs, whole)
	}
	return reqs, queued, nil
}

// submit is the plug's Submit: it learns once per filesystem whether
// sync_file_range works, runs the batch with at most QueueDepth requests in
// flight, waits for all of it (a request that exceeds AttemptTimeout is
// given up on as blocked), and completes the attempts whose requests have
// all finished.
func (wb *Writeback) submit(batch []*Request) {
	began := time.Now()
	wb.mu.Lock()
	for dev := range wb.reprobe {
		delete(wb.probed, dev)
	}
	clear(wb.reprobe)
	wb.mu.Unlock()
	rest := batch[:0:0]
	for _, r := range batch {
		if !r.Integrity && !wb.probed[r.Dev] {
			// The first start-writeback request of a new filesystem
			// runs alone and tells whether the rest may use
			// sync_file_range.
			wb.probed[r.Dev] = true
			wb.runTimed([]*Request{r}, true)
			if isUnsupported(r.err) {
				wb.fallback[r.Dev] = true
				wb.log.Warn("sync_file_range is not supported on this filesystem; using fdatasync instead", zap.Uint64("dev", r.Dev), zap.Error(r.err))
				r.state.Store(0)
				wb.runTimed([]*Request{r}, false)
			}
			continue
		}
		rest = append(rest, r)
	}
	rest = wb.startIntegrity(rest)
	wb.runTimed(rest, true)
	var pages uint64
	for _, r := range batch {
		att := r.att
		switch st := r.state.Load(); {
		case r.whole && st == reqDone && r.err == nil:
			adoptWhole(r)
		case r.whole && st == reqDetached:
			// Its worker still runs (and owns r's results): not
			// known to be written, so assumed dirty, and tried again
			// once the call has returned.
			wb.assumeUnderWriteback(att)
		}
		if r.err != nil && att.err == nil {
			att.err = r.err
		}
		att.remaining -= 1 + r.Merged // merged requests of the attempt finish with it
		if att.remaining == 0 {
			before := wb.pass.pages
			wb.complete(att)
			pages += wb.pass.pages - before
		}
	}
	wb.updateBandwidth(pages, time.Since(began))
}

// bandwidthInterval is the shortest period the write bandwidth is measured
// over (the kernel's BANDWIDTH_INTERVAL is 200ms).
const bandwidthInterval = 200 * time.Millisecond

// updateBandwidth adds a batch's pages and submission time to the current
// period and, once the period is long enough, folds its rate into the
// smoothed bandwidth (kB/s), like wb_update_write_bandwidth. With
// sync_file_range the time is that of submission, not of the device's
// completion.
func (wb *Writeback) updateBandwidth(pages uint64, took time.Duration) {
	if pages == 0 {
		return
	}
	wb.bwPages += pages
	wb.bwTime += took
	if wb.bwTime < bandwidthInterval {
		return
	}
	kbps := wb.bwPages * uint64(os.Getpagesize()) / 1024 * uint64(time.Second) / uint64(wb.bwTime)
	wb.bwPages, wb.bwTime = 0, 0
	wb.mu.Lock()
	if wb.bandwidth == 0 {
		wb.bandwidth = kbps
	} else {
		wb.bandwidth = (3*wb.bandwidth + kbps) / 4
	}
	wb.mu.Unlock()
}

// startIntegrity starts writeback of every integrity request of a batch
// (sync_file_range WRITE) before any fdatasync, so the batch's data goes to
// the device together and each fdatasync then mostly waits; it returns the
// requests still to run, without those whose start already failed.
func (wb *Writeback) startIntegrity(rest []*Request) []*Request {
	var integ []*Request
	for _, r := range rest {
		if r.Integrity && !wb.fallback[r.Dev] {
			r.startOnly = true
			integ = append(integ, r)
		}
	}
	if len(integ) < 2 {
		for _, r := range integ {
			r.startOnly = false
		}
		return rest
	}
	wb.runTimed(integ, false)
	wb.syncfsIntegrity(integ)
	out := rest[:0]
	for _, r := range rest {
		if r.startOnly {
			r.startOnly = false
			if r.err != nil {
				continue // failed or timed out: reported as it is
			}
			r.state.Store(reqRunning)
		}
		out = append(out, r)
	}
	return out
}

// syncfsIntegrity makes the started integrity requests of each filesystem
// with at least IntegritySyncfs of them durable with one syncfs(2) on one
// of their files, and marks them synced: their second phase then only
// reads cachestat. syncfs writes and waits on every dirty inode of the
// filesystem and commits it (sync_filesystem), which is what an fdatasync
// of each would give, in one journal commit instead of one each. When
// syncfs fails (a writeback error anywhere in the filesystem since the
// file was opened, or the commit failed) or exceeds attempt_timeout, the
// requests keep their fdatasync, which tells whose data failed.
func (wb *Writeback) syncfsIntegrity(integ []*Request) {
	if wb.cfg.IntegritySyncfs <= 0 {
		return
	}
	byDev := map[uint64][]*Request{}
	for _, r := range integ {
		if r.err == nil && r.f != nil {
			byDev[r.Dev] = append(byDev[r.Dev], r)
		}
	}
	for _, rs := range byDev {
		if len(rs) < wb.cfg.IntegritySyncfs {
			continue
		}
		sf, ok := rs[0].f.(interface{ Syncfs() error })
		if !ok {
			continue
		}
		done := make(chan error, 1)
		go func() { done <- sf.Syncfs() }()
		var err error
		timeout := wb.cfg.AttemptTimeout
		if timeout <= 0 {
			timeout = math.MaxInt64
		}
		t := time.NewTimer(timeout)
		select {
		case err = <-done:
		case <-t.C:
			err = ErrAttemptTimeout
			// rs[0]'s file stays open until syncfs returns.
			rs[0].att.hold()
			go func(a *attempt) { <-done; a.release() }(rs[0].att)
		}
		t.Stop()
		if err != nil {
			wb.errLog.Warn("syncfs of an integrity batch failed; falling back to fdatasync per file", zap.Int("files", len(rs)), zap.Error(err))
			continue
		}
		for _, r := range rs {
			r.synced = true
		}
	}
}

// ErrAttemptTimeout is the error of a writeback system call that did not
// return within writeback.attempt_timeout. It wraps ETIMEDOUT, which
// policy.ClassifyErr counts as blocked.
var ErrAttemptTimeout = fmt.Errorf("writeback call exceeded attempt_timeout: %w", unix.ETIMEDOUT)

// Request states.
const (
	reqRunning = iota
	reqDone
	reqTimedOut
	reqDetached // left to finish on its worker (see detachAfter)
)

type reqResult struct {
	r   *Request
	err error
}

// detachAfter is how long the device's goroutine waits on a writeback call
// that is not integrity work (a whole small file, or a chunk of a big one)
// before leaving it to finish on its worker. On a slow device a call queues
// behind the device's backlog (a full request queue, a loop device over
// slow storage) for as long as that backlog takes to drain; the goroutine
// does not wait on it: it completes the attempt (a chunk as written, a
// whole file as still dirty, retried once the call returns) and goes on to
// other inodes. Integrity calls are waited for: their result is the
// attempt's (a sync request's answer).
const detachAfter = timeSlice

// runTimed runs the requests' system calls, each in its own goroutine, at
// most QueueDepth at a time, and returns when each has returned, has been
// detached or has exceeded AttemptTimeout.
//
// A timed-out call cannot be cancelled: its request gets
// ErrAttemptTimeout, its inode is marked Busy, and when the call finally
// returns its goroutine clears Busy, lets go of the file and wakes the
// writeback goroutine.
//
// With detach set, a call that is not integrity work and still runs after
// detachAfter is detached: its request finishes with no error (the data is
// on its way, as with any sync_file_range), its inode is Busy (not retried)
// until the call returns and is retried then, and the call counts in
// stuck_calls once it runs past attempt_timeout. An error it returns is not
// lost: the inode's next attempt reports it (lateErr).
func (wb *Writeback) runTimed(reqs []*Request, detach bool) {
	if len(reqs) == 0 {
		return
	}
	depth := max(1, wb.cfg.QueueDepth)
	timeout := wb.cfg.AttemptTimeout
	results := make(chan reqResult, len(reqs))
	type running struct {
		r        *Request
		began    time.Time
		deadline time.Time // zero: no attempt_timeout
		detachAt time.Time // zero: waited for
	}
	var inflight []running
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	next, finished := 0, 0
	for finished < len(reqs) {
		for len(inflight) < depth && next < len(reqs) {
			r := reqs[next]
			next++
			r.att.hold()
			x := running{r: r, began: time.Now()}
			if timeout > 0 {
				x.deadline = x.began.Add(timeout)
			}
			if detach && !r.Integrity && !r.startOnly {
				x.detachAt = x.began.Add(detachAfter)
			}
			inflight = append(inflight, x)
			go wb.call(r, results)
		}
		var earliest time.Time
		for _, x := range inflight {
			for _, t := range []time.Time{x.deadline, x.detachAt} {
				if !t.IsZero() && (earliest.IsZero() || t.Before(earliest)) {
					earliest = t
				}
			}
		}
		var tc <-chan time.Time
		if !earliest.IsZero() {
			tc = resetTimer(&timer, time.Until(earliest))
		}
		select {
		case res := <-results:
			wb.alive()
			res.r.err = res.err
			inflight = slices.DeleteFunc(inflight, func(x running) bool { return x.r == res.r })
			finished++
		case <-tc:
			wb.alive()
			now := time.Now()
			keep := inflight[:0]
			for _, x := range inflight {
				detachNow := !x.detachAt.IsZero() && !now.Before(x.detachAt)
				timedOut := !x.deadline.IsZero() && !now.Before(x.deadline)
				if !detachNow && !timedOut {
					keep = append(keep, x)
					continue
				}
				wb.mu.Lock()
				switch {
				case detachNow && x.r.state.CompareAndSwap(reqRunning, reqDetached):
					x.r.att.detached++
					x.r.att.in.State |= inode.Busy
					x.r.detachID = wb.trackCallLocked(wb.now() - time.Since(x.began))
					wb.detached++
					finished++
					wb.mu.Unlock()
					continue
				case timedOut && x.r.state.CompareAndSwap(reqRunning, reqTimedOut):
					x.r.err = ErrAttemptTimeout
					x.r.att.stuck++
					x.r.att.in.State |= inode.Busy
					wb.stuck++
					finished++
					wb.mu.Unlock()
					wb.errLog.Warn("writeback call exceeded attempt_timeout; the file is marked busy until it returns",
						zap.String("path", strconv.Quote(x.r.att.path)), zap.Stringer("attempt_timeout", timeout))
					continue
				}
				wb.mu.Unlock()
				keep = append(keep, x) // its result is on the way
			}
			inflight = keep
		}
	}
}

// call runs one request's system call and reports it (see runTimed).
func (wb *Writeback) call(r *Request, results chan<- reqResult) {
	err := wb.do(r)
	wb.mu.Lock()
	if r.state.CompareAndSwap(reqRunning, reqDone) {
		wb.mu.Unlock()
		results <- reqResult{r, err}
		r.att.release()
		return
	}
	att := r.att
	if r.state.Load() == reqDetached {
		// Left to finish here: the attempt was completed without it.
		took, overran := wb.returnedLocked(r.detachID)
		att.detached--
		in := att.in
		if att.stuck == 0 && att.detached == 0 {
			wb.unbusyLocked(in)
		}
		if isUnsupported(err) && !r.Integrity {
			// A detached first call of a filesystem (the probe)
			// says sync_file_range does not work there: probe
			// again.
			if wb.reprobe == nil {
				wb.reprobe = map[uint64]bool{}
			}
			wb.reprobe[r.Dev] = true
		}
		if err != nil && wb.inodes[in.Key] == in {
			if wb.lateErr == nil {
				wb.lateErr = map[inode.Key]error{}
			}
			wb.lateErr[in.Key] = err
		}
		wb.gen++
		wb.mu.Unlock()
		// A whole-file request's worker may have kept its file open
		// for complete, which did not wait for it.
		wb.closeWhole(r, nil)
		att.release()
		if overran {
			wb.errLog.Warn("a writeback call returned after running past attempt_timeout (counted in stuck_calls while it ran)",
				zap.String("path", strconv.Quote(att.path)), zap.Duration("took", took), zap.Error(err))
		}
		if err != nil {
			wb.log.Info("a detached writeback call failed; the file's next attempt reports it", zap.String("path", strconv.Quote(att.path)), zap.Error(err))
		}
		wb.kick()
		return
	}
	// Timed out earlier: the attempt was already completed as blocked.
	att.stuck--
	wb.stuck--
	if att.stuck == 0 && att.detached == 0 {
		wb.unbusyLocked(att.in)
	}
	wb.gen++
	wb.mu.Unlock()
	// close(2) can block (NFS, FUSE): never under the list lock.
	wb.closeWhole(r, nil)
	att.release()
	wb.log.Info("a timed-out writeback call returned", zap.String("path", strconv.Quote(att.path)), zap.Error(err))
	wb.kick()
}

// resetTimer arms *t to fire after d, making it on first use, and returns
// its channel. (Since Go 1.23 a Reset timer never delivers a stale value.)
func resetTimer(t **time.Timer, d time.Duration) <-chan time.Time {
	if *t == nil {
		*t = time.NewTimer(d)
	} else {
		(*t).Reset(d)
	}
	return (*t).C
}

func isUnsupported(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ESPIPE) || errors.Is(err, unix.EOPNOTSUPP)
}

// do runs one request's system call. It reads wb.fallback, which only the
// writeback goroutine writes, before any request of a batch starts.
func (wb *Writeback) do(r *Request) error {
	if r.whole {
		return wb.doWhole(r)
	}
	f := r.att.f
	if r.startOnly {
		return f.StartWriteback(r.Off, r.Len)
	}
	if r.Integrity || wb.fallback[r.Dev] {
		return f.DataSync()
	}
	return f.StartWriteback(r.Off, r.Len)
}

// doWhole runs a whole-file attempt on a worker: it opens the file safely,
// reads cachestat, writes it if it is dirty and fits in write_chunk (or is
// integrity work), reads cachestat again and closes it. A file found to hold
// more than write_chunk is left alone (tooLarge) for the chunked path. The
// first phase of a two-phase integrity request only opens and starts
// writeback, and leaves the file open for the second.
func (wb *Writeback) doWhole(r *Request) error {
	if r.f == nil {
		f, renewed, err := wb.openFile(r.path, inode.Key{Dev: r.Dev, Ino: r.Ino}, r.handle)
		if err != nil {
			return err
		}
		r.f = f
		if renewed != "" {
			r.att.renewed = renewed
		}
		d, w, err := f.Cachestat(0, 0)
		if err != nil {
			return wb.closeWhole(r, err)
		}
		r.before = [2]uint64{d, w}
		if _, write := policy.BeforeWrite(d, w, r.Integrity); !write {
			if d == 0 && w == 0 {
				return wb.closeWhole(r, checkWriteback(f))
			}
			return wb.closeWhole(r, nil)
		}
		if !r.Integrity && int64(d)*int64(os.Getpagesize()) > wb.cfg.WriteChunk {
			r.tooLarge = true
			return wb.closeWhole(r, nil)
		}
	}
	switch {
	case r.startOnly:
		return r.f.StartWriteback(0, 0) // the file stays open for the fdatasync
	case r.Integrity || wb.fallback[r.Dev]:
		if !r.synced {
			if err := r.f.DataSync(); err != nil {
				return wb.closeWhole(r, err)
			}
		}
		// fdatasync has waited: the state after is final now.
		r.wrote = true
		d, w, err := r.f.Cachestat(0, 0)
		r.after = [2]uint64{d, w}
		r.afterKnown = true
		if r.before == [2]uint64{} && !r.att.wroteBefore && wb.errs != nil {
			// Its data left the page cache before flusherd wrote it:
			// if that writeback failed and someone else's fsync took
			// the report, this fdatasync could not see it. The
			// filesystem's own error cursor can (ErrWatch).
			r.fsErrAt, r.fsErrno, _ = wb.errs.LastError(r.Dev, wb.now())
		}
		return wb.closeWhole(r, err)
	}
	if err := r.f.StartWriteback(0, 0); err != nil {
		return wb.closeWhole(r, err)
	}
	// The file stays open: complete looks at it once the whole batch is
	// out, by when most of its writeback has finished.
	r.wrote = true
	return nil
}

// congested reports whether the device has writeback.max_inflight bytes
// or more under writeback: the writeback pages that cachestat last saw in
// every tracked file, in's own replaced by wbp (just read). It bounds the
// writeback flusherd puts in flight on one device, as the kernel's blk-wbt
// bounds in-flight writes, so that a stream of big files cannot fill a
// slow device's queue (a throttled cgroup's, a USB disk's) ahead of a
// small file. Called on the device's goroutine; O(tracked files), only for
// files with more than write_chunk/4 to write.
func (wb *Writeback) congested(in *inode.Inode, wbp uint64) bool {
	if wb.cfg.MaxInflight <= 0 {
		return false
	}
	limit := uint64(wb.cfg.MaxInflight / int64(os.Getpagesize()))
	wb.mu.Lock()
	defer wb.mu.Unlock()
	sum := wbp
	for _, o := range wb.inodes {
		if sum >= limit {
			break
		}
		if o != in {
			sum += uint64(o.WritebackPages)
		}
	}
	if sum < limit {
		return false
	}
	wb.throttled++
	wb.pass.throttled++
	return true
}

// checkWriteback asks whether the last writeback of f succeeded, whoever
// started it (flusherd with sync_file_range(SYNC_FILE_RANGE_WRITE), which
// does not wait, the kernel's flusher, a FUSE flush on close), once
// cachestat shows the file clean: sync_file_range(SYNC_FILE_RANGE_WAIT_BEFORE)
// waits on nothing then, and returns the error of a failed writeback that
// no one has seen yet (errseq_t: a descriptor opened after an unseen error
// still reports it; file_check_and_advance_wb_err). The kernel marks the
// pages of a failed writeback clean and drops the data, so without this a
// file whose asynchronous writeback failed (EIO from the device, an ext4
// that aborted its journal) would be forgotten as clean. Files that do not
// offer the check (test fakes) report nil.
func checkWriteback(f inode.File) error {
	if c, ok := f.(interface{ CheckWriteback() error }); ok {
		return c.CheckWriteback()
	}
	return nil
}

// closeWhole closes a whole-file request's file and passes err on.
func (wb *Writeback) closeWhole(r *Request, err error) error {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
	return err
}

// adoptWhole moves a finished whole-file request's results, and its open
// file if it kept one, into its attempt, for complete.
func adoptWhole(r *Request) {
	att := r.att
	att.dirtyBefore, att.wbBefore = r.before[0], r.before[1]
	att.fsErrAt, att.fsErrno = r.fsErrAt, r.fsErrno
	switch {
	case r.wrote && r.afterKnown:
		att.wrote, att.afterKnown = true, true
		att.dirtyAfter, att.wbAfter = r.after[0], r.after[1]
	case r.wrote:
		att.wrote = true
		att.f, r.f = r.f, nil // complete reads cachestat and closes it
	case r.tooLarge:
		// Not written: the next attempt takes the chunked path, since
		// the inode's DirtyPages now shows the size.
		att.pre, att.sized, att.afterKnown = policy.ChunkUsed, true, true
		att.dirtyAfter, att.wbAfter = r.before[0], r.before[1]
	default:
		att.pre, _ = policy.BeforeWrite(r.before[0], r.before[1], r.Integrity)
		att.afterKnown = true
		att.dirtyAfter, att.wbAfter = r.before[0], r.before[1]
	}
}

// complete ends an attempt: it reads the file's state after the write,
// closes it, classifies the outcome and requeues the inode
// (requeue_inode).
func (wb *Writeback) complete(att *attempt) {
	var dirty, wbp uint64
	err := att.err
	switch {
	case att.afterKnown:
		dirty, wbp = att.dirtyAfter, att.wbAfter
	case att.f != nil && err == nil && att.wrote:
		dirty, wbp, err = att.f.Cachestat(0, 0)
		if err == nil && dirty == 0 && wbp == 0 {
			// Its writeback ended: did it succeed?
			err = checkWriteback(att.f)
		}
	case att.f != nil:
		dirty, wbp = att.dirtyBefore, att.wbBefore
	}
	att.release()
	now := wb.now()
	in := att.in
	wb.mu.Lock()
	if att.renewed != "" && in.Handle() == att.handle {
		// Its number belongs to a new file now: the inode is that file.
		in.SetHandle(att.renewed)
		in.Errors, in.LastErr = 0, 0
	}
	redirtied := in.Has(inode.Redirtied)
	in.State &^= inode.Sync | inode.Redirtied
	var o policy.Outcome
	switch {
	case err != nil:
		o = classify(err)
	case !att.wrote:
		o = att.pre
		if redirtied {
			o = policy.Redirtied
		}
	default:
		o = policy.AfterWrite(dirty, wbp, redirtied, att.chunkUsed)
	}
	if att.sized {
		wb.pass.sized++
	}
	wb.outcomes[o]++
	if att.wrote && err == nil && att.dirtyBefore > 0 {
		// Its dirty data was written without an error: an earlier
		// failure's pages were among them (a failed writeback that
		// kept its pages dirty), so finding it clean later is this
		// write's doing, not a loss. (A failure of this writeback
		// after it started is still seen: checkWriteback.)
		in.State |= inode.Wrote
		in.State &^= inode.DataError
	}
	if att.wrote && err == nil && att.dirtyBefore > dirty {
		n := att.dirtyBefore - dirty
		wb.pass.pages += n
		wb.written += n
	}
	in.DirtyPages, in.WritebackPages = uint32(min(dirty, math.MaxUint32)), uint32(min(wbp, math.MaxUint32))
	in.Retries = satInc(in.Retries)
	newErr := false
	if err != nil && o != policy.Gone {
		in.Errors = satInc(in.Errors)
		wb.nerrors++
		if e := errnoOf(err); e != in.LastErr {
			in.LastErr = e
			newErr = true
		}
	}
	if o == policy.IOError {
		in.NextRetry = now + wb.cfg.MaxPause
	} else {
		in.NextRetry = 0
	}
	// An I/O error of its own before this attempt, or one on its
	// filesystem since it was dirtied that may have been its own.
	hadIOError := in.Has(inode.DataError) || (att.fsErrAt != 0 && att.fsErrAt >= in.DirtiedWhen)
	if o == policy.IOError {
		in.State |= inode.DataError
	}
	dest := policy.Requeue(o, wb.cfg.Requeue)
	if policy.Lost(o, hadIOError, att.dirtyBefore, att.wbBefore, redirtied) {
		dest = policy.Failed
		if in.LastErr == 0 && att.fsErrno != 0 {
			// Known from the filesystem's error cursor, not from an
			// attempt of its own: flusherd dirty still names it.
			in.LastErr = errnoOf(att.fsErrno)
		}
	}
	if in.Has(inode.Dropped) {
		// Its tree went away during the attempt (DropUnder).
		dest = policy.Drop
	} else if in.Has(inode.Leaving) && dest != policy.Drop {
		// Its tree left the configuration: this was its last attempt.
		dest = policy.Forget
	} else if dest == policy.Drop && in.Handle() != att.handle {
		// A new file took the inode's number while the attempt ran on
		// the old one (MarkInodeDirty renewed the handle): write it.
		dest = policy.MoreIOWait
	} else if other := in.OtherPath(); dest == policy.Drop && other != "" {
		// The name is gone, but the inode may live on under its other
		// name (a hard link): try that before dropping it.
		in.SetOtherPath("")
		in.SetPath(other)
		dest = policy.MoreIOWait
	}
	if wb.shuttingDown && dest != policy.Drop && (o == policy.FSUnavailable || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)) {
		wb.givenUp = append(wb.givenUp, GivenUp{Path: in.Path(), Err: err})
		dest = policy.Forget
	}
	switch dest {
	case policy.Forget, policy.Drop:
		lists.Remove(in)
		delete(wb.inodes, in.Key)
		delete(wb.wbIndex, in.Key)
		delete(wb.lateErr, in.Key)
		wb.bDirty.unref(in.Class)
		in.State = 0
		wb.pass.cleaned++
		if dest == policy.Drop {
			wb.gone++
		}
	case policy.MoreIO:
		wb.BMoreIO.MoveToBack(in)
	case policy.MoreIOWait:
		wb.BMoreIOWait.MoveToBack(in)
	case policy.RedirtyTail:
		lists.Remove(in)
		in.DirtiedWhen = now
		wb.bDirty.pushBack(in)
	case policy.Failed:
		wb.parkFailedLocked(in)
		if err == nil {
			err = fmt.Errorf("%w: the data was dropped after a failed writeback", errnoError(in.LastErr))
		}
	}
	path, retries := in.Path(), in.Retries
	wb.gen++
	wb.mu.Unlock()
	if att.result != nil {
		*att.result = err
	}
	if wb.Trace != nil {
		wb.Trace(path, o, dest, err)
	}
	if dest == policy.Failed {
		wb.errLog.Error("data lost: a writeback of this file failed and the kernel dropped its dirty pages; it stays reported as failed until it is written again",
			zap.String("path", strconv.Quote(path)), zap.Error(err))
	} else if newErr {
		wb.errLog.Warn("writeback failed; the file stays tracked and is retried",
			zap.String("path", strconv.Quote(path)), zap.Stringer("outcome", o), zap.Stringer("requeue", dest), zap.Error(err))
	} else if o == policy.Skipped && retries >= 8 && retries&(retries-1) == 0 {
		// Still dirty after attempts that wrote it and saw no new
		// write: say so at 8, 16, 32... attempts.
		wb.errLog.Warn("file still dirty after repeated writeback; it stays tracked and is retried",
			zap.String("path", strconv.Quote(path)), zap.Uint16("attempts", retries), zap.Uint64("dirty_pages", dirty), zap.Uint64("writeback_pages", wbp))
	} else if o == policy.Gone {
		if errors.Is(err, unix.ENOENT) {
			wb.log.Debug("file gone; dropped", zap.String("path", strconv.Quote(path)), zap.Error(err))
		} else {
			wb.log.Info("the path no longer leads to the tracked file; dropped", zap.String("path", strconv.Quote(path)), zap.Error(err))
		}
	}
}

func classify(err error) policy.Outcome {
	if errors.Is(err, inode.ErrNotRegular) {
		return policy.Gone
	}
	return policy.ClassifyErr(err)
}

func errnoOf(err error) uint8 {
	var e unix.Errno
	if errors.As(err, &e) && e < inode.ErrnoOther {
		return uint8(e)
	}
	return inode.ErrnoOther
}

func satInc(v uint16) uint16 {
	if v == math.MaxUint16 {
		return v
	}
	return v + 1
}
