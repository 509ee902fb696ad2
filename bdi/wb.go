// Package bdi is flusherd's per-device writeback: one goroutine per backing
// device ("bdi", named as in /sys/class/bdi) owns that device's lists of
// dirty inodes, b_dirty, b_io, b_more_io and b_more_io_wait, takes work
// items, runs kupdate-style passes and issues writeback through a plug.
//
// It models fs/fs-writeback.c (wb_workfn, wb_do_writeback,
// wb_check_old_data_flush, wb_writeback, queue_io, move_expired_inodes,
// writeback_sb_inodes, __writeback_single_inode, requeue_inode,
// __mark_inode_dirty) as changed by the series "writeback: avoid touching
// dirtied_when on blocked inodes". The block layer's side (the plug, the
// request queue) is package blk.
//
// The files, each above the ones it uses:
//
//	registry.go    Registry: one Writeback per device
//	wb.go          the loop: Run, wbDoWriteback, wbCheckOldDataFlush,
//	               wbCheckBackgroundFlush, wbWriteback, queueIO,
//	               writebackSBInodes
//	background.go  background checks' samples, range writeback, bandwidth
//	work.go        sync requests (syncFiles)
//	submit.go      writebackSingleInode ─► blk.Plug ─► submit ─► blk.Queue
//	               (runTimed), integrity batches, the queue's hooks
//	attempt.go     complete: readAfter, account, policy.Decide, apply
//	mark.go        MarkInodeDirty ─► b_dirty; deletions told, names checked
//	views.go       the tracked inodes' views; trees restricted, retired,
//	               dropped
//	call.go        an attempt's system calls on a worker (doAttempt):
//	               open, cachestat, sync_file_range of the file or of its
//	               write_chunk windows (ranges), or fdatasync
//	moves.go       the named moves (requeueIO, requeueIOWait, redirtyTail,
//	               forget, park as failed) and page accounting
//	budget.go      the tracked-inode budget: a device over it tracks no
//	               new file and runs whole-filesystem (syncfs) passes
//	stats.go, tunables.go   Snapshot and the stats file; SetConfig
//	writeback.go   the types: Writeback and its parts, attempt, Work, Config
//	dirty.go, accounting.go, offloop.go, bandwidth.go, errwatch.go,
//	holdmutex.go   parts that own their state: b_dirty's classes, the
//	               counters, the calls off the goroutine and the closer,
//	               the bandwidth estimator, the error cursors, the list lock
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
//     the plug is the device goroutine's own. It is a leaf:
//     no other lock is taken under it, and no system call that can block
//     (open, close, cachestat, writeback, syncfs) is made under it.
//   - ErrWatch: a filesystem's check mutex (held across its syncfs), then
//     ErrWatch.mu (brief); never under Writeback.mu.
//   - inode.Handles.mu is a leaf of its own package; opens are made
//     outside it.
//   - blk's Queue takes none of these: its hooks (queueHooks) take
//     Writeback.mu themselves, on the device's goroutine or the call's
//     worker, with no lock of blk's held.
//
// So no two of these locks are ever held in an order that could deadlock:
// each is a leaf but ErrWatch's check mutex, whose only inner lock is
// ErrWatch.mu.
package bdi

import (
	"context"
	"math"
	"os"
	"time"

	"go.uber.org/zap"

	"flusherd/blk"
	"flusherd/inode"
	"flusherd/policy"
)

// New returns a device's writeback state; Run starts its goroutine. now is
// the daemon's monotonic clock; stats may be nil (no stats file).
func New(name string, cfg Config, now func() time.Duration, files Files, log *zap.Logger, stats *statsWriter) *Writeback {
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("bdi", name))
	wb := &Writeback{
		Name:  name,
		cfg:   cfg,
		now:   now,
		files: files,
		log:   log,
		stats: stats,
		calls: offLoop{now: now},
		live:  liveness{wake: make(chan struct{}, 1), stopped: make(chan struct{})},
		side:  sideState{wbIndex: make(map[inode.Key]int64)},
		bg:    sampling{rangeOff: make(map[inode.Key]int64), underWB: make(map[*inode.Inode]struct{}), closeWrites: map[uint64]bool{}},
		loop: loopState{backoff: policy.Backoff{Min: cfg.MinPause, Max: cfg.MaxPause},
			probed: make(map[uint64]bool), fallback: make(map[uint64]bool)},
	}
	wb.errLog = newSampledLog(log)
	wb.window.set(cfg.TargetLatency, cfg.MaxInflight)
	if cfg.TargetLatency > 0 {
		wb.pace.setRate(0, wb.paceCtl.pace()) // (its first refill is at the bucket's depth)
	}
	wb.budget = &trackBudget{}
	wb.syncfs = wb.syncfsOS
	wb.plug = blk.Plug[*attempt]{Enabled: cfg.PlugEnabled, MaxPending: cfg.MaxPending, Submit: wb.submit}
	return wb
}

// Run is the writeback goroutine, wb_workfn: it runs queued work and
// kupdate passes, then sleeps. Sleep rules: while b_more_io_wait is
// non-empty, the backoff pause (kupdate then runs early); with other dirty
// io, until the next dirty_writeback_interval tick; with nothing dirty, no
// timer at all until MarkInodeDirty or Queue wakes it. Run returns when ctx
// is done.
func (wb *Writeback) Run(ctx context.Context) {
	defer close(wb.live.stopped)
	wb.mu.Lock()
	wb.running = true
	wb.mu.Unlock()
	wb.live.beat.Store(int64(wb.now()))
	var timer *time.Timer
	for ctx.Err() == nil {
		wb.live.loops.Add(1)
		wb.live.alive(int64(wb.now()))
		if wb.Hooks.BeforePass != nil {
			wb.Hooks.BeforePass()
		}
		wb.applyConfig()
		wb.wbDoWriteback()
		wb.budgetStep()
		wb.startCursorReads()
		wb.writeStats(false)
		wb.logSuppressed(false)
		d, arm := wb.sleepFor()
		if arm && d <= 0 {
			continue // more to do now; the loop checks ctx first
		}
		var tc <-chan time.Time
		if arm {
			tc = blk.ResetTimer(&timer, d)
		}
		wb.live.sleeping.Store(true)
		select {
		case <-wb.live.wake:
		case <-tc:
		case <-ctx.Done():
		}
		wb.live.sleeping.Store(false)
		wb.live.beat.Store(int64(wb.now())) // the sleep is not a stall
		if timer != nil {
			timer.Stop()
		}
	}
	wb.mu.Lock()
	wb.running = false
	wb.mu.Unlock()
	wb.writeStats(true)
	wb.logSuppressed(true)
}

// logSuppressed says how many per-file error lines errLog's sampling has
// left out since it last said so (at most 5 of one message per 10 s are
// logged), and where every file is listed: at most once per sampleTick,
// unless final (the goroutine ends). Called at the end of each pass.
func (wb *Writeback) logSuppressed(final bool) {
	now := wb.now()
	if !final && wb.errLog.said && now-wb.errLog.saidAt < sampleTick {
		return
	}
	if n := wb.errLog.suppressed.Swap(0); n > 0 {
		wb.errLog.saidAt, wb.errLog.said = now, true
		wb.log.Warn("more per-file error lines of the same kind were left out of the log (at most 5 of one kind per 10 s are written); flusherd dirty lists every failing file, with its error, and the stats count them",
			zap.Uint64("lines_left_out", n))
	}
}

// Healthy reports whether the writeback goroutine is sleeping (nothing to
// do until a timer or a wakeup) or has shown a sign of life within limit:
// an iteration of its loop, an inode taken off b_io, or a request of a
// batch finished or given up on (attempt_timeout). A goroutine stuck for
// longer is wedged; the watchdog stops pinging for it. Calls stuck in the
// kernel (a frozen filesystem) do not make it unhealthy: they are given up
// on after attempt_timeout, and counted in StuckCalls.
func (wb *Writeback) Healthy(limit time.Duration) bool { return wb.HealthySince(limit, 0) }

// HealthySince is Healthy with the silence counted from resumed at the
// earliest (daemon clock; Registry.Resumed): a process stopped as a whole
// (the cgroup freezer) stopped the goroutine too, and its thaw is not a
// wedge.
func (wb *Writeback) HealthySince(limit, resumed time.Duration) bool {
	if wb.live.sleeping.Load() {
		return true
	}
	select {
	case <-wb.live.stopped:
		return true // stopped on purpose
	default:
	}
	return wb.now()-max(time.Duration(wb.live.beat.Load()), resumed) < limit
}

// StuckCalls returns the number of writeback system calls (opens
// included) that exceeded attempt_timeout and have not returned.
func (wb *Writeback) StuckCalls() int {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return wb.acct.stuck + wb.calls.stuck(wb.cfg.AttemptTimeout)
}

// Stopped is closed when Run has returned.
func (wb *Writeback) Stopped() <-chan struct{} { return wb.live.stopped }

// sleepFor returns how long to sleep, and whether to arm a timer at all.
func (wb *Writeback) sleepFor() (time.Duration, bool) {
	now := wb.now()
	wb.mu.Lock()
	defer wb.mu.Unlock()
	d, arm := wb.sleepForLocked(now)
	if bd, ok := wb.budgetWakeLocked(now); ok && (!arm || bd < d) {
		return bd, true
	}
	return d, arm
}

// sleepForLocked is sleepFor but for the over-budget state.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) sleepForLocked(now time.Duration) (time.Duration, bool) {
	if wb.work.Len() > 0 {
		return 0, true
	}
	tick := wb.loop.lastOldFlush + wb.cfg.DirtyWritebackInterval - now
	// A change not yet in the stats file (rate-limited, or backing off
	// after a failed write) is written when its turn comes, not at the
	// next tick, which may be far off.
	at, statsDue := wb.stats.due(wb.gen)
	if statsDue {
		tick = min(tick, max(at-now, time.Millisecond))
	}
	if wb.bg.sampled != nil || wb.sweep.swept != nil {
		return 0, true
	}
	sweep, sweepDue := wb.sweepWaitLocked(now)
	if sweepDue {
		tick = min(tick, sweep)
	}
	if (wb.bg.touched.Len() > 0 || len(wb.bg.underWB) > 0) && !wb.bg.sampling {
		// Freshly written files, or writeback to follow: the next
		// background check.
		tick = min(tick, max(wb.loop.lastCheck+backgroundCheckInterval-now, time.Millisecond))
		if !wb.hasDirtyIOLocked() {
			return tick, true
		}
	}
	if !wb.BMoreIOWait.Empty() {
		return min(wb.loop.waitRetryAt-now, tick), true
	}
	if wb.hasDirtyIOLocked() {
		return tick, true
	}
	// The nearest of the stats file's turn, the sweep and the next read
	// of the error cursor.
	d, due := time.Duration(0), false
	if statsDue {
		d, due = max(at-now, time.Millisecond), true
	}
	if sweepDue && (!due || sweep < d) {
		d, due = sweep, true
	}
	if verifyAt, verify := wb.verify.nextRead(); verify {
		if v := max(verifyAt-now, time.Millisecond); !due || v < d {
			d, due = v, true
		}
	}
	return d, due
}

// wbDoWriteback is wb_do_writeback: queued work (sync requests) first,
// then background writeback over the threshold, then kupdate. (The kernel
// checks kupdate before background; here a device over its background
// threshold writes its oldest files first, which includes the expired
// ones, and kupdate follows when it is under.)
func (wb *Writeback) wbDoWriteback() {
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
	wb.wbCheckBackgroundFlush()
	wb.wbSweep()
	wb.wbCheckOldDataFlush()
}

// wbCheckOldDataFlush is wb_check_old_data_flush: a kupdate pass every
// dirty_writeback_interval, and early once the backoff pause of
// b_more_io_wait has passed.
func (wb *Writeback) wbCheckOldDataFlush() {
	now := wb.now()
	wb.mu.Lock()
	has := wb.hasDirtyIOLocked()
	waiting := !wb.BMoreIOWait.Empty()
	returned := wb.probe.detachReturned
	wb.probe.detachReturned = false
	wb.mu.Unlock()
	if !has {
		return
	}
	due := now >= wb.loop.lastOldFlush+wb.cfg.DirtyWritebackInterval
	early := waiting && (now >= wb.loop.waitRetryAt || returned)
	if !due && !early {
		return
	}
	if due {
		wb.loop.lastOldFlush = now
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
		if w.ForBackground {
			wb.mu.Lock()
			over := wb.wbOverBgThreshLocked()
			w.NrPages = int64(wb.acct.dirtySum) - int64(wb.bg.thresh)
			wb.mu.Unlock()
			if !over {
				break
			}
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
		wb.resetPass()
		wb.plug.Start()
		wb.writebackSBInodes(w)
		wb.finishPlug()
		wb.mu.Lock()
		wb.publishPlugStatsLocked()
		wb.mu.Unlock()
		wb.updateBandwidth(wb.now())
		// A work can run for long while files keep expiring: keep the
		// stats file fresh (writeStats is rate-limited).
		wb.writeStats(false)
		pass := wb.passDone()
		w.attempts += pass.attempts
		w.devFails += pass.devFails
		w.devMixed = w.devMixed || pass.devMixed || (w.devErr != 0 && pass.devErr != 0 && pass.devErr != w.devErr)
		if w.devErr == 0 {
			w.devErr = pass.devErr
		}
		if pass.throttled > 0 {
			w.throttled = true
		}
		if pass.progress() {
			w.progress = true
			continue
		}
		wb.mu.Lock()
		moreIO := !wb.BMoreIO.Empty()
		wb.mu.Unlock()
		if !moreIO {
			break
		}
		if pass.moreIO == 0 && !w.foreignMoreIO {
			// b_more_io was filled during the pass by others (a
			// deletion told, a tree removed), not by its attempts:
			// another pass takes those now, once per work.
			w.foreignMoreIO = true
			continue
		}
		// No progress although b_more_io is not empty: looping again
		// would spin.
		if now-wb.loop.lastBusyLog >= time.Minute || wb.loop.lastBusyLog == 0 {
			wb.loop.lastBusyLog = now
			wb.log.Warn("possible busy loop: a writeback pass made no progress with b_more_io non-empty", zap.String("reason", w.Reason))
		}
		break
	}
	wb.mu.Lock()
	if (w.ForKupdate || w.ForBackground) && !wb.probe.on && w.attempts >= 2 && w.devFails == w.attempts && !w.devMixed {
		wb.probe.on, wb.probe.err = true, w.devErr
		wb.errLog.Warn("every writeback retry on this device failed with the same device-level error: probing it with one file per pause until one gets through",
			zap.Int("attempts", w.attempts), zap.Error(w.devErr))
	}
	switch {
	case wb.BMoreIOWait.Empty():
		wb.loop.backoff.Reset()
	case w.waitSpliced || wb.loop.backoff.Pause == 0 || w.throttled:
		// The pause advances only when the waiting inodes were
		// retried (or have just started waiting): a kupdate tick
		// that did not reach them must not postpone them.
		d := wb.loop.backoff.Next(w.progress)
		if w.throttled {
			d = min(d, wb.throttleRetryLocked())
		}
		wb.loop.waitRetryAt = wb.now() + d
	}
	wb.pause = wb.loop.backoff.Pause
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
	wb.acct.plug = [3]uint64{wb.plug.Requests, wb.plug.Merges, wb.plug.Batches}
}

// queueIOLocked is queue_io: b_more_io (for background work, back on
// b_dirty by age first: returnMoreIOLocked), then b_more_io_wait (once per work,
// and only once its pause has passed, or for sync work), then the expired
// part of b_dirty (all of it for sync work, the oldest NrPages' worth for
// background work), oldest first, go to b_io. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) queueIOLocked(w *Work, now time.Duration) {
	if w.ForBackground {
		wb.returnMoreIOLocked()
	}
	wb.BIO.SpliceBackInit(&wb.BMoreIO)
	integrity := w.All || w.SyncMode == SyncAll
	probe := wb.probe.on && !integrity
	if !w.waitSpliced && (integrity || now >= wb.loop.waitRetryAt) {
		if probe {
			// The device is probing: one inode is tried, the rest
			// wait for it to get through. An expired one not tried
			// since goes first (a newer write, perhaps to a file
			// the device can still serve), then the waiting ones in
			// turn.
			if wb.bDirty.moveExpiredN(&wb.BIO, now, 1) == 0 {
				if in := wb.BMoreIOWait.Front(); in != nil {
					wb.BIO.MoveToBack(in)
				}
			}
		} else {
			wb.BIO.SpliceBackInit(&wb.BMoreIOWait)
		}
		w.waitSpliced = true
	}
	if probe {
		return // expired inodes would fail as the probe does: they wait for it
	}
	switch {
	case w.All || w.SyncMode == SyncAll:
		wb.bDirty.moveExpired(&wb.BIO, w.start, true)
	case w.ForBackground:
		// The expired inodes (kupdate's, which a long background work
		// must not hold back), then the oldest, whatever their age
		// (wb_writeback's dirtied_before = jiffies for background
		// work), as many as the work's pages.
		wb.bDirty.moveExpired(&wb.BIO, now, false)
		wb.bDirty.moveOldest(&wb.BIO, w.NrPages, wb.writeChunkLocked()/int64(os.Getpagesize()))
	default:
		wb.bDirty.moveExpired(&wb.BIO, now, false)
	}
}

// writebackSBInodes is writeback_sb_inodes: it takes inodes off b_io one by
// one and queues their writeback in the plug, until b_io is empty, the
// work's pages are used up, kupdate work yields to queued work, or the time
// slice has passed after some were queued. The calls run on the plug's
// workers, but a plug that reaches max_pending flushes within the pass and
// waits for its batch: on a slow device a pass over thousands of files
// would otherwise run for many seconds without a stats write between
// passes.
func (wb *Writeback) writebackSBInodes(w *Work) {
	start := wb.now()
	for {
		now := wb.now()
		wb.live.alive(int64(now))
		wb.mu.Lock()
		in := wb.BIO.Front()
		if in == nil {
			wb.mu.Unlock()
			return
		}
		if in.Has(inode.Background) && !w.ForBackground {
			if w.ForKupdate && !policy.Expired(wb.now(), in.DirtiedWhen, wb.bDirty.classes[in.Class].expire) {
				// Background work took it before it was due, and
				// left it on b_more_io or b_more_io_wait (a chunk
				// written, a redirty during its attempt): kupdate
				// writes expired data only, so it goes back to
				// b_dirty, at its age, until it expires or
				// background work takes it again.
				wb.bDirty.insertByAge(in)
				wb.mu.Unlock()
				continue
			}
			in.State &^= inode.Background
		}
		if w.ForBackground {
			in.State |= inode.Background
		}
		if next := wb.side.nextRetry(in.Key()); in.Has(inode.Busy) || (next > 0 && w.SyncMode == SyncNone && !w.All && wb.now() < next) {
			// A call for it is still stuck, or it failed with an I/O
			// error and waits for max_pause: not now.
			wb.requeueIOWaitLocked(in)
			wb.mu.Unlock()
			continue
		}
		if wb.acct.stuck+wb.calls.running()+wb.plug.Pending() >= maxStuckCalls {
			// The device's filesystem holds this many calls already
			// (stalled), the plug's queued ones counted as such: no
			// new one until some return. (Not a
			// max_inflight deferral: the wait follows the backoff,
			// and a returning call retries b_more_io_wait at once.)
			wb.acct.throttled++
			wb.requeueIOWaitLocked(in)
			wb.mu.Unlock()
			continue
		}
		wb.inflight.MoveToBack(in)
		in.State |= inode.Sync
		in.State &^= inode.Redirtied
		wb.bg.attemptBegins(in)
		integrity := w.SyncMode == SyncAll || in.Has(inode.Integrity)
		key := in.Key()
		att := wb.newAttemptLocked(in, key, nil, now)
		wb.mu.Unlock()

		queued := wb.writebackSingleInode(att, key, integrity)
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

// wbCheckBackgroundFlush is wb_check_background_flush, with flusherd's
// range writeback: it takes in what the last sample saw, writes the
// device's oldest files first while the tracked files' dirty data is over
// the background threshold (wbOverBgThreshLocked), and starts the next
// sample of freshly written files when one is due. Called on the device's
// goroutine, after queued (sync) work and before kupdate.
//
// How the dirty bytes are learned: from cachestat, which is exact for a
// file at the time it is read, at every attempt and at these samples. A
// sample opens every file written since the last check (at most maxSample
// of them, the rest at the next), and those whose writeback was in flight
// at their last look, so that BdiReclaimable, BdiWriteback and the dirty
// bytes follow the page cache from a file's first write, as the kernel's
// per-bdi counts do, not from its first attempt. Streaming files (written
// at three consecutive checks) get range writeback from the same look.
func (wb *Writeback) wbCheckBackgroundFlush() {
	now := wb.now()
	wb.mu.Lock()
	var unsupported []sampleResult
	if res := wb.bg.sampled; res != nil {
		wb.bg.sampled = nil
		unsupported = wb.applySampleLocked(res, now)
		clear(res) // (its inodes and errors are not held)
		wb.bg.spare = res[:0]
	}
	due := !wb.bg.sampling && (wb.bg.touched.Len() > 0 || len(wb.bg.underWB) > 0) &&
		now-wb.loop.lastCheck >= backgroundCheckInterval
	wb.mu.Unlock()
	for _, r := range unsupported {
		wb.useFdatasync(r.key.Dev, r.unsupported)
	}
	wb.updateBandwidth(now)
	if due {
		// Streaming means written in consecutive checks: after a pause
		// of more than one interval without writes, nothing is.
		consecutive := now-wb.loop.lastCheck <= 2*backgroundCheckInterval
		wb.loop.lastCheck = now
		wb.mu.Lock()
		wanted := wb.checksWantedLocked()
		wb.mu.Unlock()
		if wanted && wb.files.Observer != nil {
			// The next check must see every file written until then
			// (to tell a streaming writer). Without range writeback
			// or a background threshold the check only counts pages,
			// and the watcher's quieted files stay quiet.
			wb.files.Observer.Checking()
		}
		wb.startSample(now, consecutive)
	}
	wb.mu.Lock()
	over := wb.wbOverBgThreshLocked()
	excess := int64(wb.acct.dirtySum) - int64(wb.bg.thresh)
	if over {
		wb.acct.backgroundWorks++
	}
	wb.mu.Unlock()
	if over {
		// The kernel's background work has no page budget and checks
		// wb_over_bg_thresh after each writeback_sb_inodes round; the
		// counts here are learned when a batch completes, so a pass
		// queues the excess over the threshold, and the next pass
		// checks again.
		wb.wbWriteback(&Work{NrPages: excess, ForBackground: true, Reason: "background"})
		wb.mu.Lock()
		wb.returnMoreIOLocked()
		wb.mu.Unlock()
	}
}
