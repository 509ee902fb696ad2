package bdi

import (
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/blk"
	"flusherd/inode"
	"flusherd/lists"
	"flusherd/policy"
	"flusherd/tree"
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

	cfg    Config
	now    func() time.Duration
	files  Files // Handles nil: by path only; Observer nil: none
	log    *zap.Logger
	errLog *sampledLog // per-file error lines, rate-limited
	stats  *statsWriter
	errs   *ErrWatch // the integrity trees' filesystems' error cursors; may be nil

	mu holdMutex // the list lock (its longest hold is in the stats)
	// inodes holds every tracked inode, by key (the package doc's inode
	// map).
	// +checklocks:mu
	inodes inode.Table
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
	// bFailed holds inodes whose data was lost: a writeback of theirs
	// failed and the kernel then dropped their dirty pages, so nothing
	// is left to retry. They stay tracked, reported as failed (stats,
	// flusherd dirty, shutdown) until written again (MarkInodeDirty);
	// they are not Dirty, which is how an inode on it is told from one on
	// a writeback list (every one of those is Dirty). acct.failed is its
	// length.
	// +checklocks:mu
	bFailed lists.List[*inode.Inode]
	// +checklocks:mu
	work lists.FIFO[*Work]
	// +checklocks:mu
	gen uint64 // bumped on every change, for the stats writer
	// +checklocks:mu
	newCfg *Config // a reload's tunables, taken by the goroutine
	// +checklocks:mu
	pause time.Duration
	// +checklocks:mu
	running bool
	// +checklocks:mu
	classWarned bool // the expire-class limit was logged

	// +checklocks:mu
	side sideState
	// +checklocks:mu
	unbusy chan struct{} // closed when a Busy inode's call returns (unbusyLocked); nil until asked for

	// acct is the device's counters, the source of every figure shown;
	// trees, those of each tree.
	// +checklocks:mu
	acct counters
	// +checklocks:mu
	trees treeAcct
	// bg is the background checks' and range writeback's state.
	// +checklocks:mu
	bg sampling
	// probe is the device's probing state.
	// +checklocks:mu
	probe probing
	// +checklocks:mu
	stop shutdown
	// sweep is the candidates dirtied without events, and their sweep.
	// +checklocks:mu
	sweep sweepState
	// over is the device's over-budget state; budget, every device's
	// tracked-inode budget (the Registry's).
	// +checklocks:mu
	over   overBudget
	budget *trackBudget
	syncfs syncfsFS // the whole-filesystem pass: syncfsOS, or a test's
	// verify holds the writes made in writeback mode that are not yet
	// verified.
	// +checklocks:mu
	verify verifying

	calls offLoop   // calls off the goroutine, and the closer; own lock
	bw    bandwidth // the write bandwidth estimator; the goroutine's
	// roomGate orders the big files waiting for room (roomTurn).
	// +checklocks:mu
	roomGate roomGate
	// window is what may be under writeback on the device (the
	// goroutine's; its size is read anywhere).
	window inflightWindow
	pace   pacer
	// paceCtl sets pace; the device's goroutine owns it.
	paceCtl paceControl
	live    liveness  // the goroutine's signs of life and its wake-up
	loop    loopState // the goroutine's own
	plug    blk.Plug[*attempt]

	// Hooks are set before Run, or not at all.
	Hooks Hooks
}

// Hooks are a device's observation points, for tests and tracing.
type Hooks struct {
	// BeforePass, if set, is called by the goroutine before each round
	// of work (a hook that blocks wedges the loop, which Healthy must
	// notice).
	BeforePass func()
	// Trace, if set, is called after each attempt with the file's path,
	// the attempt's outcome and where the inode went (like the kernel's
	// writeback_single_inode tracepoint). It runs on the writeback
	// goroutine, without locks held.
	Trace func(path string, o policy.Outcome, d policy.Dest, err error)
}

// sampling is a device's background checks (wb_check_background_flush),
// its range writeback behind streaming writers and its cachestat samples
// of written files. The list lock guards it.
type sampling struct {
	// touched holds the inodes marked dirty since the last background
	// check (each has inode.Touched), in order; a check takes them from
	// the front, at most maxSample probes' worth, so that a backlog (a
	// burst of new files) costs each check what it takes, not its
	// length.
	touched lists.FIFO[*inode.Inode]
	// streaming holds those the last check took (each has
	// inode.Streaming until a check finds it untouched).
	streaming []*inode.Inode
	// rangeOff is each streaming file's range writeback offset: the
	// byte up to which its range behind the tail was written.
	rangeOff map[inode.Key]int64
	// underWB holds the tracked inodes whose last count had pages under
	// writeback (setPagesLocked keeps it): the background checks read
	// them again until their writeback is done, so that inflight_bytes
	// and the room under max_inflight_bytes do not keep a file's count
	// from the moment after its write while it waits on b_dirty.
	underWB map[*inode.Inode]struct{}
	// drain is the longest drain time a range writeback measured since
	// the window's last update (rangeDrain); 0: none measured.
	drain   time.Duration
	sampled []sampleResult // a finished sample, for the goroutine
	// spare is the storage of the last sample taken in, cleared, for the
	// next (startSample).
	spare    []sampleResult
	sampling bool // a sample call runs
	// taken holds the inodes an attempt took while a sample was running
	// or not yet applied (attemptBegins): that sample's counts of them
	// are older than the attempt's.
	taken map[*inode.Inode]struct{}
	// thresh is the device's background threshold in pages as of the
	// last check (0: off); globalDirty is /proc/vmstat nr_dirty in pages
	// then (only read with a threshold).
	thresh, globalDirty uint64
	// closeWrites holds the filesystems (st_dev) where a close writes a
	// file back (FUSE: Registry's closeWrites): a check counts a file
	// there only when it would open it anyway, streaming or over the
	// background threshold.
	closeWrites map[uint64]bool
}

// attemptBegins records that an attempt takes in (sets inode.Sync), so
// that a sample read before it does not replace the attempt's counts.
func (s *sampling) attemptBegins(in *inode.Inode) {
	if !s.sampling && s.sampled == nil {
		return
	}
	if s.taken == nil {
		s.taken = map[*inode.Inode]struct{}{}
	}
	s.taken[in] = struct{}{}
}

// sideState is per-inode state that only some inodes have, by key, kept
// here rather than in every Inode. retryAt is the earliest time (daemon
// clock) of the next attempt of an inode whose last attempt failed with an
// I/O error (setNextRetryLocked); wbIndex is a chunked file's writeback
// index, the byte offset its next attempt starts at
// (mapping->writeback_index); lateErr is the error of a detached call, for
// the inode's next attempt. Beside them, syncfsBegan holds per
// filesystem (st_dev) when flusherd's last successful syncfs calls of it
// began (an integrity batch's, or an error check's; daemon clock), the
// latest maxSyncfsBegan, oldest first. The list lock guards it.
type sideState struct {
	retryAt     map[inode.Key]time.Duration
	wbIndex     map[inode.Key]int64
	lateErr     map[inode.Key]error
	syncfsBegan map[uint64][]time.Duration
}

// maxSyncfsBegan is how many syncfs starts sideState keeps a filesystem.
const maxSyncfsBegan = 8

// syncfsDone records that a syncfs of filesystem dev, begun at began,
// succeeded.
func (s *sideState) syncfsDone(dev uint64, began time.Duration) {
	if s.syncfsBegan == nil {
		s.syncfsBegan = map[uint64][]time.Duration{}
	}
	b := s.syncfsBegan[dev]
	i, _ := slices.BinarySearch(b, began)
	b = slices.Insert(b, i, began)
	if len(b) > maxSyncfsBegan {
		b = slices.Delete(b, 0, len(b)-maxSyncfsBegan)
	}
	s.syncfsBegan[dev] = b
}

// syncfsBetween returns the earliest start of a syncfs of filesystem dev
// that succeeded and began after after and at or before upTo.
func (s *sideState) syncfsBetween(dev uint64, after, upTo time.Duration) (time.Duration, bool) {
	for _, b := range s.syncfsBegan[dev] {
		if b > after && b <= upTo {
			return b, true
		}
	}
	return 0, false
}

// nextRetry is the earliest time (daemon clock) of k's next attempt, 0
// for none.
func (s *sideState) nextRetry(k inode.Key) time.Duration { return s.retryAt[k] }

// setNextRetry records at (daemon clock) as the earliest time of k's next
// attempt; 0 clears it.
func (s *sideState) setNextRetry(k inode.Key, at time.Duration) {
	if at == 0 {
		delete(s.retryAt, k)
		return
	}
	if s.retryAt == nil {
		s.retryAt = make(map[inode.Key]time.Duration)
	}
	s.retryAt[k] = at
}

// shutdown: the daemon is exiting (Registry.Shutdown, on); a file whose
// filesystem cannot be written (FSUnavailable: EROFS, ESHUTDOWN, ENODEV,
// ENXIO), whose open the filesystem refuses (policy.OpenFailed: EIO from
// one shut down, EUCLEAN, EBADMSG), or that the daemon may not open
// (EACCES, EPERM), is given up at once and recorded in givenUp instead of being retried until
// shutdown_timeout. The list lock guards it.
type shutdown struct {
	on      bool
	givenUp []GivenUp
}

// probing: every retry of a kupdate or background work failed with one
// device-level error (policy.DeviceLevel: err), so until an attempt gets
// past it, those works retry one inode per pause instead of every waiting
// one (a dead FUSE server, a vanished disk). An attempt that succeeds, or
// fails otherwise, ends it, and every waiting inode is retried at once
// (detachReturned, also set when a detached call returns). The list lock
// guards it.
type probing struct {
	on             bool
	err            syscall.Errno
	detachReturned bool            // retry b_more_io_wait now
	reprobe        map[uint64]bool // devs whose detached probe said sync_file_range is unsupported
}

// end ends probing, if on, after a call that got through with err (nil or
// an error of another kind): every waiting file is retried.
func (p *probing) end(log *zap.Logger, err error) {
	if !p.on {
		return
	}
	p.on, p.err = false, 0
	p.detachReturned = true
	log.Info("a writeback call got through on a probing device: every waiting file is retried", zap.Error(err))
}

// liveness is the device goroutine's signs of life, read by Healthy and
// Snapshot. beat is the daemon clock (nanoseconds) at the last one;
// sleeping is set while it waits for work or a timer; stallMax is the
// longest time (nanoseconds) between two while it was awake: how long
// one wait (a batch's call, an open) kept it from its loop; loops
// counts its iterations (wakeups). wake (buffered, one) wakes it (kick);
// stopped is closed when Run returns. Set by New; atomics and channels.
type liveness struct {
	beat     atomic.Int64
	sleeping atomic.Bool
	stallMax atomic.Int64
	loops    atomic.Uint64
	wake     chan struct{}
	stopped  chan struct{}
}

// kick wakes the goroutine, or leaves the wake-up already pending.
func (l *liveness) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// alive records a sign of life at now (daemon clock, nanoseconds): the
// beat, and the gap since the last one if it is the longest.
func (l *liveness) alive(now int64) {
	gap := now - l.beat.Swap(now)
	for {
		// (The plug's workers call it too, concurrently: the largest
		// gap wins.)
		m := l.stallMax.Load()
		if gap <= m || l.stallMax.CompareAndSwap(m, gap) {
			return
		}
	}
}

// loopState is the device goroutine's own: no lock guards it.
type loopState struct {
	// deferred are the attempts of the last batch whose completion waits
	// for the next batch's calls (deferComplete).
	deferred lists.FIFO[*attempt]
	backoff  policy.Backoff
	// windowThrottled is acct.throttled at the window's last update.
	windowThrottled uint64
	lastOldFlush    time.Duration
	waitRetryAt     time.Duration
	pass            passCounters
	probed          map[uint64]bool // dev -> sync_file_range probed
	fallback        map[uint64]bool // dev -> use fdatasync for start-writeback
	lastBusyLog     time.Duration
	lastCheck       time.Duration // the last background check (daemon clock)
	thresholds      func() (dirty, background uint64, err error)
	vmDirty         func() (uint64, error)
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
// drains, and a slow device is not polled more than it needs. While
// paced, at most half the pace's bucket (paceBurst): the tokens a wait
// longer than the bucket would bring are lost. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) throttleRetryLocked() time.Duration {
	bw := int64(wb.bw.avgKBps.Load()) * 1024 // bytes/s
	window := wb.window.size()
	d := throttleRetry
	if bw > 0 && window > 0 {
		d = time.Duration(float64(window/2) / float64(bw) * float64(time.Second))
		d = min(max(d, minThrottleRetry), throttleRetry)
	}
	if wb.pace.Rate() > 0 {
		d = min(d, paceBurst/2)
	}
	return d
}

func (p passCounters) progress() bool { return p.pages > 0 || p.cleaned > 0 }

// resetPass starts a pass's counters, and passDone returns them. Called
// on the device's goroutine, which alone counts them (complete and
// forgetLocked run there, under the list lock).
//
// +checklocksignore: the pass counters are the device goroutine's.
func (wb *Writeback) resetPass() { wb.loop.pass = passCounters{} }

// +checklocksignore: the pass counters are the device goroutine's.
func (wb *Writeback) passDone() passCounters { return wb.loop.pass }

// hasDirtyIOLocked is wb_has_dirty_io. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) hasDirtyIOLocked() bool {
	return !wb.bDirty.empty() || !wb.BIO.Empty() || !wb.BMoreIO.Empty() || !wb.BMoreIOWait.Empty() || !wb.inflight.Empty()
}

// attempt is one writeback attempt on one inode, from open to requeue.
// Its system calls run on a plug worker (doAttempt), which fills its
// call's result; the device's goroutine takes that result (res) once the
// call has returned in time (adoptCall) and completes the attempt
// (complete).
type attempt struct {
	in     *inode.Inode
	f      inode.File
	err    error
	res    callResult
	pre    policy.Outcome // when nothing was written
	handle inode.Handle
	path   string
	// wroteBefore: an earlier attempt wrote the inode's data since it
	// became dirty (inode.Wrote), so finding it clean is no surprise.
	wroteBefore bool
	began       time.Duration // when it was queued (daemon clock)
	// counted: its page counts before and as the write left them were
	// accounted when its completion was deferred (deferComplete).
	counted bool
	// refs counts holders of f: the attempt itself and each request whose
	// system call is running; the last to let go closes it.
	refs atomic.Int32
	// stuck counts timed-out requests whose call has not returned, and
	// detached the detached ones (see detachAfter). Guarded by the list
	// lock.
	stuck, detached int
	// result, if set, receives the attempt's error (a sync request).
	result *error
	// note, when note.report is set, is what the closer reports of f's
	// close (closeReturned): the attempt wrote in writeback mode.
	note closeNote
	// call is the worker side of the attempt's request.
	call *attemptCall
	wb   *Writeback // closes the file (calls.close); nil in tests
	// callMem and reqMem hold the attempt's call and request, so that an
	// attempt is one allocation; call and the plug point to them.
	callMem attemptCall
	reqMem  request
}

// callResult is what an attempt's system calls found. Its worker writes
// the call's copy; the attempt takes it once the call has returned in
// time (adoptCall). A detached call keeps writing its own, then unread.
type callResult struct {
	// renewed is the handle of a new file found under the inode's number
	// (openFile); the inode takes it at completion.
	renewed inode.Handle
	// Page counts (cachestat) before the write, and after it once
	// afterKnown (read by the worker, or nothing was written).
	dirtyBefore, wbBefore, dirtyAfter, wbAfter uint64
	wrote, afterKnown                          bool
	// looked is when (daemon clock) the worker had read dirtyBefore and
	// wbBefore, both 0 (ownSyncfsWroteLocked); else 0.
	looked time.Duration
	// chunkUsed: write_chunk was used up with more dirty (a file holding
	// more than write_chunk); merged counts the windows folded into
	// their neighbours (plug_merges).
	chunkUsed bool
	merged    uint64
	// deferred: not written because the device had max_inflight under
	// writeback (counted in throttled).
	deferred bool
	// queued is the dirty pages the call started writing back: the
	// whole file's, or those in its windows.
	queued uint64
	// fsCheck: its data had left the page cache without flusherd writing
	// it (an integrity file found clean at its first attempt): submit
	// reads its filesystem's error cursor once the batch has returned
	// (checkFSErrors). fsErrAt is when that cursor last showed a
	// writeback error (ErrWatch; daemon clock), 0: none, or not read.
	fsCheck bool
	fsErrAt time.Duration
	fsErrno unix.Errno // the error that check saw
	// waited: the write was fdatasync, which waited for its outcome.
	waited bool
	// closeErr is the error of its file's close when the worker closed
	// it, having nothing to write (on FUSE, an open or a close may write
	// the file back, and the close reports that writeback's failure).
	closeErr error
	// unread: the call failed before it reached the file's data, in its
	// open or its first cachestat (EACCES, EPERM, an open's EIO): nothing
	// was written, so its error is not one of the data's. read: its first
	// cachestat succeeded, so the counts before are the file's
	// (policy.Lost trusts no other zeros).
	unread, read bool
}

// hold takes a reference on the attempt's file.
func (a *attempt) hold() { a.refs.Add(1) }

// release drops a reference and closes the file with the last one, on a
// goroutine of its own when the attempt has a Writeback (offLoop.close).
func (a *attempt) release() {
	if a.refs.Add(-1) == 0 && a.f != nil {
		if a.wb != nil {
			a.wb.closeFile(a.f, a.note)
		} else {
			a.f.Close()
		}
	}
}

// request is the writeback request of an attempt: a blk.Request whose
// owner is the attempt. Each attempt has exactly one; its worker-side
// state is the attempt's call (attemptCall).
type request = blk.Request[*attempt]

// attemptCall is the worker side of an attempt (doAttempt): its file,
// the tunables taken when it was queued, the phase of its calls and what
// they found (res), read by the device's goroutine only once the call has
// returned in time (adoptCall).
type attemptCall struct {
	f   inode.File
	res callResult
	// chunk and maxInflight are write_chunk and max_inflight (bytes) when
	// the attempt was queued, and fallback whether its filesystem was
	// known then to lack sync_file_range (fdatasync instead): wb.loop.fallback
	// is the device goroutine's, and a detached worker runs on.
	chunk, maxInflight int64
	fallback           bool
	// startOnly: the first phase of an integrity request (see
	// startIntegrity).
	startOnly bool
	// synced: a syncfs made its data durable (syncfsIntegrity); the
	// second phase skips the fdatasync.
	synced bool
	// started: sync_file_range(SYNC_FILE_RANGE_WRITE) was called, so the
	// request's error tells whether the filesystem supports it (submit's
	// probe). A request that found its file clean, deferred it, or could
	// not open it made no such call and tells nothing.
	started bool
	// unsupported: sync_file_range failed as not supported (EINVAL,
	// ESPIPE, EOPNOTSUPP) outside the probe (which was detached).
	unsupported bool
}

// SyncMode is the work's writeback_sync_modes.
type SyncMode uint8

// Work is a writeback work item, struct wb_writeback_work. The caller
// makes it and hands it over with Queue; from then on the device's
// goroutine owns it until Done is closed, after which the caller may read
// Errs.
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
	// foreignMoreIO: a pass without progress left b_more_io filled by
	// others than its attempts, and another pass was made (wbWriteback).
	foreignMoreIO bool
	// The work's attempts, as passCounters counts them: they decide
	// whether the device goes probing.
	attempts, devFails int
	devErr             syscall.Errno
	devMixed           bool
	done               chan struct{}
}

// FileRef names one file of a sync request.
type FileRef struct {
	Key  inode.Key
	Path string
	Tree tree.Tree // what it is tracked with: its Mode and Expire
}

// Done is closed when the work has run.
func (w *Work) Done() <-chan struct{} { return w.done }

// Config holds a device's tunables. Durations are time.Duration
// (nanoseconds); WriteChunk is in bytes.
type Config struct {
	DirtyWritebackInterval time.Duration // kupdate period
	MinPause, MaxPause     time.Duration // b_more_io_wait backoff
	WriteChunk             int64         // most bytes written per inode per attempt
	// WriteChunkAuto: the chunk follows the device's write bandwidth
	// (writeChunk), WriteChunk is ignored.
	WriteChunkAuto bool
	MaxInflight    int64 // bytes under writeback on the device before big files, ranges and background work wait; 0: no bound
	// TargetLatency sizes the window of writeback in flight
	// (inflightWindow), MaxInflight its ceiling; 0: the window is
	// MaxInflight.
	TargetLatency time.Duration
	// DirtyBackgroundBytes and DirtyBackgroundRatio (a percentage of the
	// kernel's nr_dirty_background_threshold) set the device's background
	// threshold (the lower one when both are set); 0: off.
	DirtyBackgroundBytes int64
	DirtyBackgroundRatio int
	// RangeBytes is the hot tail of a streaming file left to its writer;
	// what lies behind it is written back once the file has grown by
	// 2 × RangeBytes past the last range writeback. 0: off.
	RangeBytes  int64
	Requeue     policy.RequeueBlocked
	PlugEnabled bool
	MaxPending  int // plug requests before a forced flush
	QueueDepth  int // requests in flight during a flush
	// IntegritySyncfs: a batch holding at least this many integrity
	// requests for one filesystem makes them durable with one syncfs(2)
	// (sync_inodes_sb plus sync_fs, as the kernel's syncfs does) instead
	// of an fdatasync each; 0: never.
	IntegritySyncfs int
	// AttemptTimeout bounds one writeback system call; one that takes
	// longer counts as blocked (ETIMEDOUT) and its inode stays Busy until
	// the call returns. 0: no bound.
	AttemptTimeout time.Duration
	// SweepInterval is how often the files open or mapped in the trees
	// are looked at for data dirtied without an event
	// (watcher.sweep_interval): policy.SweepAuto for half each tree's
	// expire, 0 for never.
	SweepInterval time.Duration
}

// statsWriter keeps a device's stats file, <dir>/bdi/<name>/stats.
type statsWriter struct {
	path       string
	thresholds func() (dirty, background uint64, err error) // pages
	log        *zap.Logger
	every      time.Duration
	lastGen    uint64
	last       time.Duration
	written    bool
	lastErr    string // the last write error logged, so each is logged once
	// After a failed write (a full or read-only stats.dir) the next try
	// waits retry, which doubles from statsRetryMin up to statsRetryMax;
	// a successful write resets it. nextTry is on the daemon clock.
	retry, nextTry time.Duration
}

// sampleProbe is one file a background check looks at; sampleResult is
// what its worker saw and did.
type sampleProbe struct {
	in        *inode.Inode
	key       inode.Key
	path      inode.PathRef // built only to open by path or to report
	handle    inode.Handle
	streaming bool          // range writeback may apply
	rangeOff  int64         // bytes already range-written
	expire    time.Duration // its tree's expiry
}

type sampleResult struct {
	sampleProbe
	ok         bool   // dirty, wbp were read
	before     uint64 // dirty pages before the range writeback
	dirty, wbp uint64 // after the range writeback, if any
	// rangeEnd > 0: the range [rangeOff, rangeEnd) was written back,
	// ranged pages of it dirty.
	rangeEnd    int64
	ranged      uint64
	unsupported error // sync_file_range is not supported there
	closeErr    error // its close's (FUSE's flush writes the file back)
	// drain is its range writeback's measured drain time (rangeDrain);
	// 0: not measured.
	drain time.Duration
}

// GivenUp is a file the shutdown gave up on: its filesystem cannot be
// written (read-only, shut down, gone), so waiting would not help.
type GivenUp struct {
	Path string
	Err  error
}

// Queue adds work for the goroutine (wb_queue_work) and wakes it.
func (wb *Writeback) Queue(w *Work) {
	w.done = make(chan struct{})
	wb.mu.Lock()
	wb.work.Push(w)
	wb.mu.Unlock()
	wb.live.kick()
}

func (wb *Writeback) dequeue() *Work {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	w, _ := wb.work.Pop()
	return w
}

func (wb *Writeback) workQueued() bool {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return wb.work.Len() > 0
}

// Files are how a device reaches its files (New).
type Files struct {
	// Opener opens files by path.
	Opener inode.Opener
	// Handles, if set, makes file handles and opens files by handle.
	Handles inode.HandleOpener
	// Observer, if set, is told of the attempts' opens, the background
	// checks and the forgotten inodes.
	Observer AttemptObserver
	// DirCursor opens a directory as an error cursor of filesystem dev;
	// nil: inode.DirCursor.
	DirCursor func(dir string, dev uint64) (inode.ErrCursor, error)
}

// Handles opens files by handle on the filesystems registered with it
// (inode.Handles).
type Handles interface {
	inode.HandleOpener
	// RemoveMount lets the filesystem dev go: no tree is on it any more.
	RemoveMount(dev uint64)
}
