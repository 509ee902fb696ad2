package bdi

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/lists"
	"flusherd/policy"
)

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
	// fsErrAt is when a writeback error was last seen on the inode's
	// filesystem (ErrWatch; daemon clock), read when its data had left
	// the page cache without flusherd writing it; 0: none, or not read.
	fsErrAt time.Duration
	fsErrno unix.Errno // the error that check saw
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
			a.wb.calls.close(a.f)
		} else {
			a.f.Close()
		}
	}
}

// writebackSingleInode is __writeback_single_inode under an inner plug: it
// queues one request for the inode, whose worker (doAttempt) opens the
// file safely, reads its page-cache state with cachestat, and writes at
// most write_chunk of its dirty data (all of it for integrity work, which
// is one fdatasync). It returns the pages it expects to be written, for
// the work's budget: the inode's last known dirty count, at most
// write_chunk. Attempts that need no call are completed at once.
func (wb *Writeback) writebackSingleInode(in *inode.Inode, path string, key inode.Key, integrity bool, result *error) int64 {
	wb.plug.Start()
	defer wb.finishPlug()
	att := &attempt{in: in, result: result, path: path, wb: wb}
	wb.mu.Lock()
	att.handle = in.Handle()
	att.wroteBefore = in.Has(inode.Wrote)
	var late error
	failedLate := false
	if len(wb.lateErr) > 0 {
		late, failedLate = wb.lateErr[key]
		delete(wb.lateErr, key)
	}
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
	chunk := wb.writeChunk()
	if dp := int64(in.DirtyPages) * page; !integrity && dp > smallFile(chunk, wb.cfg.MaxInflight) && dp <= chunk && wb.congested(in, 0, wb.cfg.MaxInflight) {
		// Known to be biggish (its last attempt saw it), and the
		// device has max_inflight under writeback in other files: it
		// waits, small files go, and no open is spent on it. (Its own
		// count is left out: it is as old as its last attempt. Bigger
		// files are looked at by their worker, on a fresh cachestat.)
		att.res.deferred = true
		wb.assumeUnderWriteback(att)
		wb.complete(att)
		return 0
	}
	// The worker takes the tunables it needs now: a reload replaces
	// wb.cfg while a detached call may still run.
	att.callMem = attemptCall{chunk: chunk, maxInflight: wb.cfg.MaxInflight, fallback: wb.loop.fallback[key.Dev]}
	att.call = &att.callMem
	att.reqMem = request{Dev: key.Dev, Ino: key.Ino, Integrity: integrity, Owner: att}
	wb.plug.Add(&att.reqMem)
	return min(max(1, int64(in.DirtyPages)), max(1, chunk/page))
}

// smallFile is the most dirty bytes a file may have to be written whole
// whatever the writeback in flight: a quarter of write_chunk, or of
// max_inflight_bytes when that is smaller (0: no bound), so that the
// bound holds for every file bigger than a quarter of it.
func smallFile(chunk, maxInflight int64) int64 {
	if maxInflight > 0 {
		chunk = min(chunk, maxInflight)
	}
	return chunk / 4
}

// assumeUnderWriteback gives an attempt that did not learn the file's state
// (deferred by max_inflight, or its call left to a worker) the outcome
// UnderWriteback with the inode's last known page counts: unknown means
// still dirty, and it is tried again (b_more_io_wait).
func (wb *Writeback) assumeUnderWriteback(att *attempt) {
	wb.mu.Lock()
	att.pre, att.res.afterKnown = policy.UnderWriteback, true
	att.res.dirtyAfter, att.res.wbAfter = uint64(att.in.DirtyPages), uint64(att.in.WritebackPages)
	wb.mu.Unlock()
}

// maxRangeWindows is how many write_chunk windows ranges looks for one by
// one in an attempt before it takes the rest of the budget as one range.
const maxRangeWindows = 16

// window is a byte range of a file to write back; Len 0 is to the end.
type window struct{ Off, Len int64 }

// ranges chooses what to write of a file with dirty pages, more than
// write_chunk (chunk, in bytes) of them (its worker calls it, writeback_chunk_size's side):
// write_chunk-sized windows from the inode's writeback index onwards
// (wrapping at the end, like writeback_index) that cachestat shows dirty,
// until write_chunk of dirty pages are found. It returns the windows in
// file order of writing, the dirty pages in them, and whether write_chunk
// was used up (chunkUsed). Adjacent windows are folded into one; merged
// counts the folds.
func (wb *Writeback) ranges(f inode.File, key inode.Key, chunk int64) (wins []window, queued int64, chunkUsed bool, merged uint64, err error) {
	page := int64(os.Getpagesize())
	size, err := f.Size()
	if err != nil {
		return nil, 0, false, 0, err
	}
	wb.mu.Lock()
	start := wb.wbIndex[key]
	wb.mu.Unlock()
	if start >= size || start < 0 {
		start = 0
	}
	budget := chunk / page
	off, wrapped := start, false
	found := 0 // windows taken
	// take adds the window [lo, lo+n) holding dirty dirty pages, folded
	// into the last one when adjacent, and goes on after it.
	take := func(lo, n, dirty int64) {
		if last := len(wins) - 1; last >= 0 && wins[last].Off+wins[last].Len == lo {
			wins[last].Len += n
			merged++
		} else {
			wins = append(wins, window{lo, n})
		}
		found++
		budget -= dirty
		queued += dirty
		off = lo + n
	}
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
		d, _, err := f.Cachestat(off, regionEnd-off)
		if err != nil {
			return nil, 0, false, 0, err
		}
		if d == 0 {
			off = regionEnd
			continue
		}
		if found >= maxRangeWindows {
			// The rest of the budget in one range from off: all the
			// region when its dirty pages fit, or else the longest
			// prefix holding budget of them (bisection on its end).
			// Past maxRangeWindows windows a file's dirty pages are
			// scattered (a sparse image, a database written at
			// random): a window each would cost a bisection over the
			// whole region per dirty page, and each cachestat is
			// linear in the pages it covers.
			end, n := regionEnd, int64(d)
			if n > budget {
				lo, hi := off, regionEnd // dirty(off, lo) <= budget < dirty(off, hi)
				n = 0
				for hi-lo > page {
					mid := lo + max(page, (hi-lo)/2/page*page)
					dm, _, err := f.Cachestat(off, mid-off)
					if err != nil {
						return nil, 0, false, 0, err
					}
					if int64(dm) <= budget {
						lo, n = mid, int64(dm)
					} else {
						hi = mid
					}
				}
				end = lo
			}
			if n == 0 {
				break // (cannot happen: one page is at most one dirty page)
			}
			take(off, end-off, n)
			continue
		}
		lo, hi := off, regionEnd
		for hi-lo > chunk {
			mid := lo + max(page, (hi-lo)/2/page*page)
			dm, _, err := f.Cachestat(lo, mid-lo)
			if err != nil {
				return nil, 0, false, 0, err
			}
			if dm > 0 {
				hi = mid
			} else {
				lo = mid
			}
		}
		n := min(chunk, regionEnd-lo)
		dw, _, err := f.Cachestat(lo, n)
		if err != nil {
			return nil, 0, false, 0, err
		}
		take(lo, n, int64(dw))
	}
	if off >= size {
		off = 0
	}
	wb.mu.Lock()
	if off == 0 {
		delete(wb.wbIndex, key)
	} else {
		wb.wbIndex[key] = off
	}
	wb.mu.Unlock()
	if len(wins) == 0 {
		// Dirty pages beyond the size seen at open (an append): write
		// from the old end onwards.
		wins = append(wins, window{})
	}
	return wins, queued, budget <= 0, merged, nil
}

// inflightRoom returns how many more bytes may go under writeback on the
// device before maxInflight (plug.max_inflight_bytes; 0: no bound, room
// math.MaxInt64) is reached: maxInflight less the writeback pages that
// cachestat last saw in every tracked file (wbSum, kept by
// setPagesLocked), in's own replaced by wbp (just read); 0 or less when the
// device is at or over the bound. It bounds the writeback flusherd puts in
// flight on one device, as the kernel's blk-wbt bounds in-flight writes,
// so that a stream of big files, a range writeback or background work
// cannot fill a slow device's queue (a throttled cgroup's, a USB disk's)
// ahead of a small file or another program's write. O(1). Safe on a
// worker.
func (wb *Writeback) inflightRoom(in *inode.Inode, wbp uint64, maxInflight int64) int64 {
	if maxInflight <= 0 {
		return math.MaxInt64
	}
	wb.mu.Lock()
	sum := wb.acct.wbSum + wbp
	if in != nil && wb.inodes.Get(in.Key) == in {
		sum -= min(sum, uint64(in.WritebackPages))
	}
	wb.mu.Unlock()
	page := int64(os.Getpagesize())
	return maxInflight - int64(min(sum, uint64(maxInflight/page)))*page
}

// congested reports whether the device has no room for a page more under
// writeback (inflightRoom), and counts that deferral in throttled.
func (wb *Writeback) congested(in *inode.Inode, wbp uint64, maxInflight int64) bool {
	if wb.inflightRoom(in, wbp, maxInflight) >= int64(os.Getpagesize()) {
		return false
	}
	wb.mu.Lock()
	wb.acct.throttled++
	wb.mu.Unlock()
	return true
}

// complete ends an attempt, as the end of writeback_single_inode does: it
// reads the file's state after the write and closes it (readAfter),
// classifies the outcome, accounts for it, decides where the inode goes
// (policy.Decide, requeue_inode) and puts it there.
func (wb *Writeback) complete(att *attempt) {
	st := att.readAfter()
	att.release()
	now := wb.now()
	in := att.in
	wb.mu.Lock()
	o, redirtied := wb.outcomeLocked(att, st)
	ac := wb.accountLocked(att, o, st, now)
	d := policy.Decide(wb.factsLocked(att, o, st, redirtied, ac.hadIOError))
	st.err = wb.applyLocked(att, d, st.err, ac.dataErr, now)
	path, retries := in.Path(), in.Retries
	wb.gen++
	wb.mu.Unlock()
	if att.result != nil {
		*att.result = st.err
	}
	if wb.Trace != nil {
		wb.Trace(path, o, d.Dest, st.err)
	}
	wb.logAttempt(path, o, d, st, ac.newErr, retries)
}

// afterState is what an attempt left: the file's page counts after its
// write (known: read, not the last known), and the error it ends with.
type afterState struct {
	dirty, wbp uint64
	err        error
	known      bool
}

// readAfter reads the file's state after the attempt's write with
// cachestat, unless its worker did (afterKnown) or it failed before
// reading (the last known counts stand). Whether the writeback succeeded
// is not asked (writeback mode): the calls that tell (sync_file_range
// WAIT_BEFORE, fsync) mark the file's error seen, and a descriptor the
// application opens after would not report it (errseq_sample).
func (att *attempt) readAfter() afterState {
	st := afterState{err: att.err, known: true}
	switch {
	case att.res.afterKnown:
		st.dirty, st.wbp = att.res.dirtyAfter, att.res.wbAfter
	case att.f != nil && st.err == nil && att.res.wrote:
		st.dirty, st.wbp, st.err = att.f.Cachestat(0, 0)
		st.known = st.err == nil
	default:
		st.known = false
	}
	return st
}

// outcomeLocked gives the inode the handle of a new file found under its
// number, ends its attempt state (Sync, Redirtied) and classifies the
// attempt; redirtied says an event came during it. Preconditions: wb.mu
// held.
//
// +checklocks:wb.mu
func (wb *Writeback) outcomeLocked(att *attempt, st afterState) (o policy.Outcome, redirtied bool) {
	in := att.in
	if att.res.renewed != "" && in.Handle() == att.handle {
		in.SetHandle(att.res.renewed)
		in.Errors, in.LastErr = 0, 0
	}
	redirtied = in.Has(inode.Redirtied)
	in.State &^= inode.Sync | inode.Redirtied
	switch {
	case st.err != nil:
		o = classify(st.err)
	case !att.res.wrote:
		o = att.pre
		if redirtied {
			o = policy.Redirtied
		}
	default:
		o = policy.AfterWrite(st.dirty, st.wbp, redirtied, att.res.chunkUsed)
	}
	return o, redirtied
}

// accounted is what accountLocked learned for the decision and the log.
type accounted struct {
	dataErr    uint8 // the error its data was lost to, if it was
	newErr     bool  // an error other than its last one
	hadIOError bool  // see policy.Facts.HadIOError
}

// accountLocked counts an attempt with outcome o (pass, outcomes, pages
// written, page counts, retries, errors) and updates the inode's error
// state and next retry time. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) accountLocked(att *attempt, o policy.Outcome, st afterState, now time.Duration) (ac accounted) {
	in, err := att.in, st.err
	switch {
	case att.res.deferred:
		wb.loop.pass.throttled++
	case att.detached == 0:
		// (A detached call has not returned: it tells nothing of the
		// device yet.)
		wb.countAttemptLocked(err)
	}
	wb.plug.Merges += att.res.merged
	wb.acct.outcomes[o]++
	if att.res.wrote && err == nil && att.res.dirtyBefore > 0 {
		// Written without an error, an earlier failure's pages among
		// them: finding it clean later is this write's doing.
		in.State |= inode.Wrote
		in.State &^= inode.DataError
	}
	if att.res.wrote && err == nil && att.res.dirtyBefore > st.dirty {
		n := att.res.dirtyBefore - st.dirty
		wb.loop.pass.pages += n
		wb.acct.written += n
	}
	if (att.res.dirtyBefore != 0 || att.res.wbBefore != 0) && !att.counted {
		// What its worker saw before writing: the growth since it was
		// last looked at counts in BdiDirtied.
		wb.setPagesLocked(in, att.res.dirtyBefore, att.res.wbBefore)
	}
	if st.known {
		wb.setPagesLocked(in, st.dirty, st.wbp)
	}
	in.Retries = satInc(in.Retries)
	if in.Has(inode.DataError) {
		ac.dataErr = in.LastErr
	}
	if err != nil && o != policy.Gone {
		in.Errors = satInc(in.Errors)
		wb.acct.errors++
		if e := errnoOf(err); e != in.LastErr {
			in.LastErr = e
			ac.newErr = true
		}
	}
	if o == policy.IOError {
		wb.setNextRetryLocked(in, now+wb.cfg.MaxPause)
	} else {
		wb.setNextRetryLocked(in, 0)
	}
	ac.hadIOError = in.Has(inode.DataError) || (att.res.fsErrAt != 0 && att.res.fsErrAt >= in.DirtiedWhen)
	if o == policy.IOError && !att.res.unread {
		// (An error of its open or first cachestat is not its data's.)
		in.State |= inode.DataError
	}
	return ac
}

// factsLocked gathers what policy.Decide needs of an attempt and its
// inode. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) factsLocked(att *attempt, o policy.Outcome, st afterState, redirtied, hadIOError bool) policy.Facts {
	in, err := att.in, st.err
	return policy.Facts{
		Outcome: o, Blocked: wb.cfg.Requeue, Err: err != nil,
		Read: att.res.read, DirtyBefore: att.res.dirtyBefore, WritebackBefore: att.res.wbBefore,
		Redirtied: redirtied, HadIOError: hadIOError, LostBefore: in.Has(inode.LostBefore),
		Dropped: in.Has(inode.Dropped), Leaving: in.Has(inode.Leaving),
		Headway:      att.res.deferred || o == policy.ChunkUsed && att.res.wrote && st.known && st.dirty < att.res.dirtyBefore,
		Renewed:      in.Handle() != att.handle,
		HadHandle:    att.handle != "",
		OtherPath:    in.OtherPath() != "",
		ShuttingDown: wb.shuttingDown,
		Denied:       errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM),
	}
}

// applyLocked carries out decision d for an attempt's inode and returns
// the error the attempt reports: err, or the loss of its data.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) applyLocked(att *attempt, d policy.Decision, err error, dataErr uint8, now time.Duration) error {
	in := att.in
	if d.Lost {
		if err != nil && dataErr != 0 {
			// Lost to the earlier error; this attempt's own only hid it.
			in.LastErr = dataErr
		}
		if in.LastErr == 0 && att.res.fsErrno != 0 {
			// Known from the filesystem's error cursor.
			in.LastErr = errnoOf(att.res.fsErrno)
		}
	}
	if d.Rewritten {
		in.State &^= inode.LostBefore
		if err == nil {
			in.Errors, in.LastErr = 0, 0
		}
	}
	if d.CountGone {
		wb.acct.gone++
		wb.loop.pass.cleaned++
	}
	if d.TakeOtherPath {
		other := in.OtherPath()
		in.SetOtherPath("")
		in.SetPath(other)
	}
	if d.GiveUp {
		wb.givenUp = append(wb.givenUp, GivenUp{Path: in.Path(), Err: err})
	}
	wb.requeueInodeLocked(in, d.Dest, now)
	if d.Dest == policy.Failed && (err == nil || dataErr != 0 && errnoOf(err) != dataErr) {
		err = fmt.Errorf("%w: the data was dropped after a failed writeback", errnoError(in.LastErr))
	}
	return err
}

// logAttempt logs what an attempt found, when it is news: a loss, a new
// error, a file that stays dirty (at 8, 16, 32... attempts), a file gone.
func (wb *Writeback) logAttempt(path string, o policy.Outcome, d policy.Decision, st afterState, newErr bool, retries uint16) {
	qpath, err := zap.String("path", strconv.Quote(path)), st.err
	switch {
	case d.Dest == policy.Failed && d.StillLost:
		wb.log.Debug("still failed: reported again, but nothing was written since its data was lost", qpath, zap.Error(err))
	case d.Dest == policy.Failed:
		wb.errLog.Error("data lost: a writeback of this file failed and the kernel dropped its dirty pages; it stays reported as failed until it is written again",
			qpath, zap.Error(err))
	case newErr:
		wb.errLog.Warn("writeback failed; the file stays tracked and is retried",
			qpath, zap.Stringer("outcome", o), zap.Stringer("requeue", d.Dest), zap.Error(err))
	case o == policy.Skipped && retries >= 8 && retries&(retries-1) == 0:
		wb.errLog.Warn("file still dirty after repeated writeback; it stays tracked and is retried",
			qpath, zap.Uint16("attempts", retries), zap.Uint64("dirty_pages", st.dirty), zap.Uint64("writeback_pages", st.wbp))
	case o != policy.Gone:
	case errors.Is(err, unix.ENOENT):
		wb.log.Debug("file gone; dropped", qpath, zap.Error(err))
	case errors.Is(err, inode.ErrReplaced) || errors.Is(err, inode.ErrNotRegular):
		wb.log.Info("the path no longer leads to the tracked file; dropped", qpath, zap.Error(err))
	default:
		// ESTALE from its file handle: the inode was deleted.
		wb.log.Debug("file deleted; dropped", qpath, zap.Error(err))
	}
}

// countAttemptLocked counts an attempt that made a call in the pass's
// counters (the device goes probing when every one of a work's fails with
// one device-level error), and ends probing when it got past such an
// error: every waiting inode is retried at once (detachReturned).
// Preconditions: wb.mu held; on the device's goroutine.
//
// +checklocks:wb.mu
func (wb *Writeback) countAttemptLocked(err error) {
	wb.loop.pass.attempts++
	errno, dev := policy.DeviceLevel(err)
	if dev {
		wb.loop.pass.devFails++
		if wb.loop.pass.devErr == 0 {
			wb.loop.pass.devErr = errno
		} else if wb.loop.pass.devErr != errno {
			wb.loop.pass.devMixed = true
		}
		return
	}
	wb.endProbingLocked(err)
}

// endProbingLocked ends the device's probing, if it is probing, because a
// call got past its device-level error (err: nil, or the file's own
// error): every waiting inode is retried at once (detachReturned).
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) endProbingLocked(err error) {
	if !wb.probe.on {
		return
	}
	wb.probe.on, wb.probe.err = false, 0
	wb.probe.detachReturned = true
	wb.log.Info("a writeback call got through on a probing device: every waiting file is retried", zap.Error(err))
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

// requeueInodeLocked is requeue_inode: it puts in where dest says, after
// an attempt (see policy.Requeue for the table). Preconditions: wb.mu
// held.
//
// +checklocks:wb.mu
func (wb *Writeback) requeueInodeLocked(in *inode.Inode, dest policy.Dest, now time.Duration) {
	switch dest {
	case policy.Forget, policy.Drop:
		wb.forgetLocked(in, dest == policy.Drop)
	case policy.MoreIO:
		wb.requeueIOLocked(in)
		wb.loop.pass.moreIO++
	case policy.MoreIOWait:
		wb.requeueIOWaitLocked(in)
	case policy.RedirtyTail:
		wb.redirtyTailLocked(in, now)
	case policy.Failed:
		wb.parkFailedLocked(in)
	}
}

// forgetLocked forgets a clean inode, or one whose file is gone (counted
// in inodes_gone). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) forgetLocked(in *inode.Inode, gone bool) {
	lists.Remove(in)
	wb.dropInodeLocked(in)
	wb.loop.pass.cleaned++
	if gone {
		wb.acct.gone++
	}
}

// requeueIOLocked is requeue_io: in goes to the tail of b_more_io, for
// the next queue_io (its write_chunk was used up, or it was redirtied).
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) requeueIOLocked(in *inode.Inode) { wb.BMoreIO.MoveToBack(in) }

// requeueIOWaitLocked is requeue_io_wait, from the series "writeback:
// avoid touching dirtied_when on blocked inodes": a blocked inode goes to
// b_more_io_wait, keeping its dirtiedWhen, and is retried after the
// backoff pause. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) requeueIOWaitLocked(in *inode.Inode) { wb.BMoreIOWait.MoveToBack(in) }

// redirtyTailLocked is redirty_tail: in goes back to b_dirty with
// dirtiedWhen = now, as if newly dirtied. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) redirtyTailLocked(in *inode.Inode, now time.Duration) {
	lists.Remove(in)
	in.DirtiedWhen = now
	wb.bDirty.pushBack(in)
}
