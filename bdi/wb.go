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
// The data flow, and the file that holds each stage:
//
//	watcher ─► MarkInodeDirty ─► b_dirty            mark.go, dirty.go
//	     (MarkInodesDirty: a batch, one lock hold)
//	Queue(Work), sync requests ─► work list          work.go
//	Run: wbDoWriteback, wbCheckOldDataFlush,
//	     wbWriteback, queueIO ─► b_io,
//	     writebackSBInodes                           wb.go
//	wbCheckBackgroundFlush: the background
//	     threshold, range writeback, the checks'
//	     cachestat samples, bandwidth, auto chunk     background.go
//	Config, SetConfig (a reload)                     tunables.go
//	writebackSingleInode ─► blk.Plug.Add ─► Finish   attempt.go
//	submit ─► runTimed (a blk.Queue): each attempt
//	     on a worker (doAttempt): open, cachestat,
//	     sync_file_range of the file or of its
//	     write_chunk windows (ranges), or fdatasync;
//	     syncfs for integrity batches (blk.Timed)     submit.go, open.go
//	complete ─► requeueInodeLocked ─► b_more_io,
//	     b_more_io_wait, b_dirty, forgotten, failed  attempt.go
//
// Registry (registry.go) owns one Writeback per device; the stats file is
// stats.go; ErrWatch (errwatch.go) holds integrity trees' filesystems open
// for their error cursors.
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
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"flusherd/blk"
	"flusherd/inode"
	"flusherd/lists"
	"flusherd/policy"
)

// timeSlice bounds a pass once something was queued (writeback_sb_inodes
// stops after HZ/10).
const timeSlice = 100 * time.Millisecond

// maxStuckCalls bounds the calls of one device that run on after its
// goroutine stopped waiting for them (detached, timed out, closes). Each
// holds an OS thread while the kernel blocks it (a stalled FUSE server, a
// frozen filesystem), and the Go runtime ends the process at 10,000
// threads. While a device has this many, no attempt starts there: its files
// wait on b_more_io_wait (counted in throttled) until calls return.
const maxStuckCalls = 1024

// Writeback is one device's writeback state and goroutine, struct
// bdi_writeback. A Registry makes and owns it (Registry.Device); its
// exported methods are safe for concurrent use; its lists and inodes are
// its goroutine's and the list lock's (see the package doc).
type Writeback struct {
	Name string

	cfg  Config
	now  func() time.Duration
	open inode.Opener
	// handles opens by handle (nil: by path only); observer is told of
	// the attempts' opens and of forgotten inodes (nil: none).
	handles  inode.HandleOpener
	observer AttemptObserver
	log      *zap.Logger
	errLog   *zap.Logger // rate-limited
	// suppressed counts the errLog lines its sampling left out since
	// logSuppressed last said so.
	suppressed atomic.Uint64
	stats      *statsWriter

	mu holdMutex // the list lock (its longest hold is in the stats)
	// inodes holds every tracked inode, by key (the package doc's inode
	// map).
	// +checklocks:mu
	inodes inode.Table
	// retryAt is the earliest time (daemon clock, nanoseconds) of the
	// next attempt of each inode whose last attempt failed with an I/O
	// error (policy.IOError): such a file is retried at max_pause, not at
	// every pass. Only such inodes have one, so it is kept here, not in
	// every Inode (setNextRetryLocked, nextRetryLocked).
	// +checklocks:mu
	retryAt map[inode.Key]time.Duration
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
	// a writeback list (every one of those is Dirty). acct.failed is its length.
	// +checklocks:mu
	bFailed lists.List[*inode.Inode]
	// +checklocks:mu
	work []*Work
	// acct is the device's counters, the source of every figure shown.
	// +checklocks:mu
	acct counters
	// calls records the calls that run off the goroutine, and closes
	// files; it has its own lock.
	calls offLoop
	// +checklocks:mu
	gen uint64 // bumped on every change, for the stats writer
	// +checklocks:mu
	detachReturned bool // a detached call returned: retry b_more_io_wait now
	// +checklocks:mu
	lateErr map[inode.Key]error // errors of detached calls, for the inode's next attempt
	// +checklocks:mu
	unbusy chan struct{} // closed when a Busy inode's call returns (unbusyLocked); nil until asked for
	// +checklocks:mu
	reprobe map[uint64]bool // devs whose detached probe said sync_file_range is unsupported
	// +checklocks:mu
	classWarned bool // the expire-class limit was logged
	// +checklocks:mu
	newCfg *Config // a reload's tunables, taken by the goroutine
	// +checklocks:mu
	bandwidth uint64 // kB/s, smoothed
	// +checklocks:mu
	pause time.Duration
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

	// touched holds the inodes marked dirty since the last background
	// check (each has inode.Touched), and streaming those the last check
	// took (each has inode.Streaming until a check finds it untouched).
	// +checklocks:mu
	touched []*inode.Inode
	// +checklocks:mu
	streaming []*inode.Inode
	// rangeOff is each streaming file's range writeback offset: the
	// byte up to which its range behind the tail was written.
	// +checklocks:mu
	rangeOff map[inode.Key]int64
	// underWB holds the tracked inodes whose last count had pages under
	// writeback (setPagesLocked keeps it): the background checks read
	// them again until their writeback is done, so that inflight_bytes
	// and the room under max_inflight_bytes do not keep a file's count
	// from the moment after its write while it waits on b_dirty.
	// +checklocks:mu
	underWB map[*inode.Inode]struct{}
	// +checklocks:mu
	sampled []sampleResult // a finished sample, for the goroutine
	// +checklocks:mu
	sampling bool // a sample call runs
	// bgThresh is the device's background threshold in pages as of the
	// last check (0: off).
	// +checklocks:mu
	bgThresh uint64
	// globalDirty is /proc/vmstat nr_dirty in pages at the last check
	// (only read with a background threshold).
	// +checklocks:mu
	globalDirty uint64
	// +checklocks:mu
	avgBandwidth uint64 // kB/s, avg_write_bandwidth
	// probing: every retry of a kupdate or background work failed with
	// one device-level error (policy.DeviceLevel: probeErr), so until an
	// attempt gets past it, those works retry one inode per pause instead
	// of every waiting one (a dead FUSE server, a vanished disk). An
	// attempt that succeeds, or fails otherwise, ends it, and every
	// waiting inode is retried at once.
	// +checklocks:mu
	probing bool
	// +checklocks:mu
	probeErr syscall.Errno

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
	plug blk.Plug[*attempt]
	// deferred are the attempts of the last batch whose completion waits
	// for the next batch's calls (deferComplete). The device goroutine's
	// own.
	deferred     []*attempt
	backoff      policy.Backoff
	lastOldFlush time.Duration
	waitRetryAt  time.Duration
	pass         passCounters
	probed       map[uint64]bool // dev -> sync_file_range probed
	// wbIndex is each chunked file's writeback index: the byte offset its
	// next attempt starts at (mapping->writeback_index). Only files larger
	// than write_chunk have one, so it is kept here, not in every Inode.
	// Guarded by the list lock: inodes are forgotten off the goroutine
	// too (RetireUnder, DropUnder).
	// +checklocks:mu
	wbIndex     map[inode.Key]int64
	fallback    map[uint64]bool // dev -> use fdatasync for start-writeback
	lastBusyLog time.Duration
	// The bandwidth estimator (updateBandwidth): the written count and
	// daemon time at the last update; bwStarted: the stamp is set.
	bwStamp     time.Duration
	bwWritten   uint64
	bwStarted   bool
	bwIdle      bool          // the device had no dirty io at the stamp
	lastCheck   time.Duration // the last background check (daemon clock)
	thresholds  func() (dirty, background uint64, err error)
	vmDirty     func() (uint64, error)
	diskWritten func() (uint64, error)
}

type passCounters struct {
	pages, cleaned uint64
	// attempts counts the pass's attempts that made a call (not
	// deferred), devFails those that failed with a device-level error,
	// devErr the first such error, and devMixed whether another differed.
	attempts, devFails int
	devErr             syscall.Errno
	devMixed           bool
	// throttled counts attempts deferred by max_inflight: they are
	// retried after at most throttleRetry, not after the growing
	// backoff, or the device would sit idle between them.
	throttled uint64
	// moreIO counts the pass's attempts that requeued their inode on
	// b_more_io (requeue_io).
	moreIO int
}

// throttleRetry is the longest wait before the files deferred by
// max_inflight are tried again (b_more_io_wait's pause is cut to it), and
// minThrottleRetry the shortest (throttleRetryLocked).
const (
	throttleRetry    = 50 * time.Millisecond
	minThrottleRetry = 5 * time.Millisecond
)

// throttleRetryLocked is the wait before files deferred by
// max_inflight_bytes are tried again: the time the device takes to write
// half of max_inflight_bytes at its average write bandwidth, between
// minThrottleRetry and throttleRetry (throttleRetry while the bandwidth is
// unknown). A small bound on a fast device is then refilled before it
// drains, and a slow device is not polled more than it needs.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) throttleRetryLocked() time.Duration {
	bw := int64(wb.avgBandwidth) * 1024 // bytes/s
	if bw <= 0 || wb.cfg.MaxInflight <= 0 {
		return throttleRetry
	}
	d := time.Duration(float64(wb.cfg.MaxInflight/2) / float64(bw) * float64(time.Second))
	return min(max(d, minThrottleRetry), throttleRetry)
}

func (p passCounters) progress() bool { return p.pages > 0 || p.cleaned > 0 }

// resetPass starts a pass's counters, and passDone returns them. Called
// on the device's goroutine, which alone counts them (complete and
// forgetLocked run there, under the list lock).
//
// +checklocksignore: the pass counters are the device goroutine's.
func (wb *Writeback) resetPass() { wb.pass = passCounters{} }

// +checklocksignore: the pass counters are the device goroutine's.
func (wb *Writeback) passDone() passCounters { return wb.pass }

// New returns a device's writeback state; Run starts its goroutine. now is
// the daemon's monotonic clock; stats may be nil (no stats file).
func New(name string, cfg Config, now func() time.Duration, files Files, log *zap.Logger, stats *statsWriter) *Writeback {
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("bdi", name))
	wb := &Writeback{
		Name:     name,
		cfg:      cfg,
		now:      now,
		open:     files.Opener,
		handles:  files.Handles,
		observer: files.Observer,
		log:      log,
		stats:    stats,
		calls:    offLoop{now: now},
		wake:     make(chan struct{}, 1),
		stopped:  make(chan struct{}),
		backoff:  policy.Backoff{Min: cfg.MinPause, Max: cfg.MaxPause},
		probed:   make(map[uint64]bool),
		wbIndex:  make(map[inode.Key]int64),
		rangeOff: make(map[inode.Key]int64),
		underWB:  make(map[*inode.Inode]struct{}),
		fallback: make(map[uint64]bool),
	}
	wb.errLog = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 5, 0, zapcore.SamplerHook(func(_ zapcore.Entry, d zapcore.SamplingDecision) {
			if d&zapcore.LogDropped != 0 {
				wb.suppressed.Add(1)
			}
		}))
	}))
	wb.plug = blk.Plug[*attempt]{Enabled: cfg.PlugEnabled, MaxPending: cfg.MaxPending, Submit: wb.submit}
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

// Run is the writeback goroutine, wb_workfn: it runs queued work and
// kupdate passes, then sleeps. Sleep rules: while b_more_io_wait is
// non-empty, the backoff pause (kupdate then runs early); with other dirty
// io, until the next dirty_writeback_interval tick; with nothing dirty, no
// timer at all until MarkInodeDirty or Queue wakes it. Run returns when ctx
// is done.
func (wb *Writeback) Run(ctx context.Context) {
	defer close(wb.stopped)
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
		wb.wbDoWriteback()
		wb.writeStats(false)
		wb.logSuppressed()
		d, arm := wb.sleepFor()
		if arm && d <= 0 {
			continue // more to do now; the loop checks ctx first
		}
		var tc <-chan time.Time
		if arm {
			tc = blk.ResetTimer(&timer, d)
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
	wb.logSuppressed()
}

// logSuppressed says how many per-file error lines errLog's sampling has
// left out since it last said so (at most 5 of one message per 10 s are
// logged), and where every file is listed. Called at the end of each pass.
func (wb *Writeback) logSuppressed() {
	if n := wb.suppressed.Swap(0); n > 0 {
		wb.log.Warn("more per-file error lines of the same kind were left out of the log (at most 5 of one kind per 10 s are written); flusherd dirty lists every failing file, with its error, and the stats count them",
			zap.Uint64("lines_left_out", n))
	}
}

// alive records a sign of life of the goroutine (or of the calls it waits
// on, see blk.Hooks.Alive), and the time since the last one when it is the
// longest yet (loop_stall_max_us). Safe for concurrent use.
func (wb *Writeback) alive() {
	now := int64(wb.now())
	gap := now - wb.beat.Swap(now)
	for {
		// (The plug's workers call it too, concurrently: the largest
		// gap wins.)
		m := wb.stallMax.Load()
		if gap <= m || wb.stallMax.CompareAndSwap(m, gap) {
			return
		}
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
	return wb.acct.stuck + wb.calls.stuck(wb.cfg.AttemptTimeout)
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
	if wb.sampled != nil {
		return 0, true
	}
	if (len(wb.touched) > 0 || len(wb.underWB) > 0 && wb.followWBLocked()) && !wb.sampling {
		// Freshly written files, or writeback to follow: the next
		// background check.
		tick = min(tick, max(wb.lastCheck+backgroundCheckInterval-now, time.Millisecond))
		if !wb.hasDirtyIOLocked() {
			return tick, true
		}
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
		if w.ForBackground {
			wb.mu.Lock()
			over := wb.wbOverBgThreshLocked()
			w.NrPages = int64(wb.acct.dirtySum) - int64(wb.bgThresh)
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
		if now-wb.lastBusyLog >= time.Minute || wb.lastBusyLog == 0 {
			wb.lastBusyLog = now
			wb.log.Warn("possible busy loop: a writeback pass made no progress with b_more_io non-empty", zap.String("reason", w.Reason))
		}
		break
	}
	wb.mu.Lock()
	if (w.ForKupdate || w.ForBackground) && !wb.probing && w.attempts >= 2 && w.devFails == w.attempts && !w.devMixed {
		wb.probing, wb.probeErr = true, w.devErr
		wb.errLog.Warn("every writeback retry on this device failed with the same device-level error: probing it with one file per pause until one gets through",
			zap.Int("attempts", w.attempts), zap.Error(w.devErr))
	}
	switch {
	case wb.BMoreIOWait.Empty():
		wb.backoff.Reset()
	case w.waitSpliced || wb.backoff.Pause == 0 || w.throttled:
		// The pause advances only when the waiting inodes were
		// retried (or have just started waiting): a kupdate tick
		// that did not reach them must not postpone them.
		d := wb.backoff.Next(w.progress)
		if w.throttled {
			d = min(d, wb.throttleRetryLocked())
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
	probe := wb.probing && !integrity
	if !w.waitSpliced && (integrity || now >= wb.waitRetryAt) {
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
		wb.alive()
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
		if next := wb.nextRetryLocked(in); in.Has(inode.Busy) || (next > 0 && w.SyncMode == SyncNone && !w.All && wb.now() < next) {
			// A call for it is still stuck, or it failed with an I/O
			// error and waits for max_pause: not now.
			wb.requeueIOWaitLocked(in)
			wb.mu.Unlock()
			continue
		}
		if wb.acct.stuck+wb.calls.running() >= maxStuckCalls {
			// The device's filesystem holds this many calls already
			// (stalled): no new one until some return. (Not a
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
