package bdi

import (
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/blk"
	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/policy"
)

// submit is the plug's Submit: it learns once per filesystem whether
// sync_file_range works, runs the batch with at most QueueDepth requests in
// flight (runTimed), waits for all of it (a request that exceeds
// AttemptTimeout is given up on as blocked; one that is not integrity
// work is left to its worker after detachAfter), and completes the
// attempts whose requests have all finished.
func (wb *Writeback) submit(batch []*request) {
	wb.mu.Lock()
	for dev := range wb.probe.reprobe {
		delete(wb.loop.probed, dev)
	}
	clear(wb.probe.reprobe)
	wb.mu.Unlock()
	rest := batch[:0:0]
	for _, r := range batch {
		if !r.Integrity && !wb.loop.probed[r.Dev] {
			// The first start-writeback request of a new filesystem
			// runs alone and tells whether the rest may use
			// sync_file_range.
			wb.loop.probed[r.Dev] = true
			wb.runTimed([]*request{r}, true)
			switch {
			case blk.IsUnsupported(r.Err):
				wb.useFdatasync(r.Dev, r.Err)
				r.Owner.call.unsupported, r.Owner.call.fallback = false, true
				r.Rearm()
				wb.runTimed([]*request{r}, false)
			case r.State() == blk.Done && !r.Owner.call.started:
				// No sync_file_range was called (the file was clean,
				// deferred by max_inflight, or not opened):
				// the next request of the filesystem probes. (A
				// detached one is looked at when it returns.)
				delete(wb.loop.probed, r.Dev)
			}
			continue
		}
		// What the probe found holds for the rest of the batch.
		r.Owner.call.fallback = wb.loop.fallback[r.Dev]
		rest = append(rest, r)
	}
	rest = wb.startIntegrity(rest)
	// The previous batch's attempts are completed while this one's calls
	// run (its writeback has had that long to end), the rest once they
	// have returned.
	wb.runTimedIdle(rest, true, wb.completeDeferred)
	for wb.completeDeferred() {
	}
	wb.checkFSErrors(batch)
	// This batch's attempts are completed now at the plug's end, else
	// during the next batch (deferComplete).
	later := wb.plug.Depth() > 0
	for _, r := range batch {
		att := r.Owner
		switch st := r.State(); {
		case st == blk.Done && att.call.unsupported:
			// The filesystem's probe was left to its worker, and this
			// request found sync_file_range unsupported: fdatasync
			// from now on, and the file is tried again (not an I/O
			// error of its own).
			wb.useFdatasync(r.Dev, r.Err)
			r.Err = nil
			wb.assumeUnderWriteback(att)
		case st == blk.Done && r.Err == nil:
			adoptCall(r)
		case st == blk.Done:
			// Failed after reading the file's state (a write that
			// returned EROFS): what it read stands (BdiReclaimable).
			c := &att.call.res
			att.res = callResult{dirtyBefore: c.dirtyBefore, wbBefore: c.wbBefore, unread: c.unread, read: c.read}
		case st == blk.Detached:
			// Its worker still runs (and owns the attemptCall): not
			// known to be written, so assumed dirty, and tried again
			// once the call has returned.
			wb.assumeUnderWriteback(att)
		}
		att.err = r.Err
		// One request per attempt (distinct owners never merge): it
		// completes the attempt.
		if later && att.f != nil && att.err == nil {
			wb.deferComplete(att)
		} else {
			wb.complete(att)
		}
	}
}

// deferComplete leaves the completion of an attempt whose writeback was
// started (sync_file_range WRITE, under way) to the next batch's submit,
// which completes it while its own calls run (blk.Queue.Idle): its state
// after the write is read then, when most of its writeback has ended,
// rather than at once. Meanwhile its pages count as under writeback
// (max_inflight_bytes' room), as the write left them. Called on the
// device's goroutine inside a plug; finishPlug completes what is left.
func (wb *Writeback) deferComplete(att *attempt) {
	if att.res.dirtyBefore != 0 || att.res.wbBefore != 0 {
		q := min(att.res.queued, att.res.dirtyBefore)
		wb.mu.Lock()
		wb.setPagesLocked(att.in, att.res.dirtyBefore, att.res.wbBefore) // (the growth since its last look)
		wb.setPagesLocked(att.in, att.res.dirtyBefore-q, att.res.wbBefore+q)
		wb.mu.Unlock()
		att.counted = true
	}
	wb.loop.deferred.Push(att)
}

// completeDeferred completes the oldest attempt left by deferComplete,
// and reports whether there was one.
func (wb *Writeback) completeDeferred() bool {
	att, ok := wb.loop.deferred.Pop()
	if !ok {
		return false
	}
	wb.complete(att)
	return true
}

// finishPlug ends a plug (blk.Plug.Finish); at the outermost, once its
// last batch is submitted, it completes the attempts left by
// deferComplete, so that a pass or a sync request ends with every attempt
// completed.
func (wb *Writeback) finishPlug() {
	wb.plug.Finish()
	if wb.plug.Depth() == 0 {
		for wb.completeDeferred() {
		}
	}
}

// useFdatasync records that filesystem dev does not support
// sync_file_range (err said so): its start-writeback requests use
// fdatasync from now on. Logged once per filesystem. Called on the
// device's goroutine.
func (wb *Writeback) useFdatasync(dev uint64, err error) {
	if wb.loop.fallback[dev] {
		return
	}
	wb.loop.fallback[dev] = true
	wb.log.Warn("sync_file_range is not supported on this filesystem; using fdatasync instead", zap.Uint64("dev", dev), zap.Error(err))
}

// startIntegrity starts writeback of every integrity request of a batch
// (sync_file_range WRITE) before any fdatasync, so the batch's data goes to
// the device together and each fdatasync then mostly waits; it returns the
// requests still to run, without those whose start already failed.
func (wb *Writeback) startIntegrity(rest []*request) []*request {
	var integ []*request
	for _, r := range rest {
		if r.Integrity && !wb.loop.fallback[r.Dev] {
			r.Owner.call.startOnly = true
			integ = append(integ, r)
		}
	}
	if len(integ) < 2 {
		for _, r := range integ {
			r.Owner.call.startOnly = false
		}
		return rest
	}
	wb.runTimed(integ, false)
	wb.syncfsIntegrity(integ)
	out := rest[:0]
	for _, r := range rest {
		if r.Integrity && r.Owner.call.startOnly {
			if r.Err != nil {
				// Failed or timed out: reported as it is. (A timed-out
				// call's worker may still read its attemptCall.)
				continue
			}
			r.Owner.call.startOnly = false
			r.Rearm()
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
func (wb *Writeback) syncfsIntegrity(integ []*request) {
	if wb.cfg.IntegritySyncfs <= 0 {
		return
	}
	byDev := map[uint64][]*request{}
	for _, r := range integ {
		if r.Err == nil && r.Owner.call.f != nil {
			byDev[r.Dev] = append(byDev[r.Dev], r)
		}
	}
	for _, rs := range byDev {
		if len(rs) < wb.cfg.IntegritySyncfs {
			continue
		}
		sf, ok := rs[0].Owner.call.f.(interface{ Syncfs() error })
		if !ok {
			continue
		}
		// rs[0]'s file stays open until syncfs returns.
		att := rs[0].Owner
		att.hold()
		began := wb.now()
		_, err, inTime := blk.Timed(wb.cfg.AttemptTimeout, func() (struct{}, error) { return struct{}{}, sf.Syncfs() },
			func(struct{}, error) { att.release() })
		if inTime {
			att.release()
		} else {
			err = ErrAttemptTimeout
		}
		if err != nil {
			wb.errLog.Warn("syncfs of an integrity batch failed; falling back to fdatasync per file", zap.Int("files", len(rs)), zap.Error(err))
			continue
		}
		wb.mu.Lock()
		wb.side.syncfsDone(rs[0].Dev, began)
		wb.mu.Unlock()
		for _, r := range rs {
			r.Owner.call.synced = true
		}
	}
}

// checkFSErrors reads the writeback error cursor of each filesystem
// (ErrWatch.LastError: one syncfs) once for the requests of a batch that
// found a file's data gone from the page cache without flusherd writing it
// (fsCheck), and gives each the answer. It runs once every call of the
// batch has returned, so the check began after each of those files'
// cachestat and covers its data. A check that exceeds attempt_timeout
// fails its requests with ErrAttemptTimeout: unknown is not clean, and
// their next attempt looks again.
func (wb *Writeback) checkFSErrors(batch []*request) {
	if wb.errs == nil {
		return
	}
	var byDev map[uint64][]*request
	for _, r := range batch {
		if r.State() == blk.Done && r.Err == nil && r.Owner.call.res.fsCheck {
			if byDev == nil {
				byDev = map[uint64][]*request{}
			}
			byDev[r.Dev] = append(byDev[r.Dev], r)
		}
	}
	type answer struct {
		at      time.Duration
		errno   unix.Errno
		watched bool
	}
	for dev, rs := range byDev {
		began := wb.now()
		id := wb.calls.track(began)
		a, _, inTime := blk.Timed(wb.cfg.AttemptTimeout, func() (answer, error) {
			at, errno, watched := wb.errs.LastError(dev, began)
			return answer{at, errno, watched}, nil
		}, func(answer, error) { wb.calls.returned(id, 0) })
		if !inTime {
			for _, r := range rs {
				r.Err = ErrAttemptTimeout
			}
			continue
		}
		wb.calls.returned(id, 0)
		if a.watched && a.at != began {
			wb.mu.Lock()
			wb.side.syncfsDone(dev, began)
			wb.mu.Unlock()
		}
		for _, r := range rs {
			r.Owner.call.res.fsErrAt, r.Owner.call.res.fsErrno = a.at, a.errno
		}
	}
}

// ErrAttemptTimeout is the error of a writeback system call that did not
// return within writeback.attempt_timeout. It wraps ETIMEDOUT, which
// policy.ClassifyErr counts as blocked.
var ErrAttemptTimeout = fmt.Errorf("writeback call exceeded attempt_timeout: %w", unix.ETIMEDOUT)

// runTimed runs the requests' system calls on a blk.Queue: each on its own
// worker, at most QueueDepth at a time, returning when each has returned,
// has been detached or has exceeded AttemptTimeout (queueHooks says what
// each of those does to the attempt and its inode).
//
// A timed-out call cannot be cancelled: its request gets
// ErrAttemptTimeout, its inode is marked Busy, and when the call finally
// returns its worker clears Busy, lets go of the file and wakes the
// writeback goroutine.
//
// With detach set, a call that is not integrity work and still runs after
// detachAfter is detached: its request finishes with no error (the data is
// on its way, as with any sync_file_range), its inode is Busy (not retried)
// until the call returns and is retried then, and the call counts in
// stuck_calls once it runs past attempt_timeout. An error it returns is not
// lost: the inode's next attempt reports it (lateErr).
func (wb *Writeback) runTimed(reqs []*request, detach bool) {
	wb.runTimedIdle(reqs, detach, nil)
}

// runTimedIdle is runTimed with work to do on the device's goroutine while
// the calls run (blk.Queue.Idle).
func (wb *Writeback) runTimedIdle(reqs []*request, detach bool, idle func() bool) {
	q := blk.Queue[*attempt]{Depth: wb.cfg.QueueDepth, Timeout: wb.cfg.AttemptTimeout, DetachAfter: detachAfter,
		Hooks: &queueHooks{wb}, Idle: idle}
	q.Run(reqs, detach)
}

// queueHooks are the blk.Hooks of a device's writeback requests.
type queueHooks struct{ wb *Writeback }

// Start takes a reference on the attempt's file for the call.
func (h *queueHooks) Start(r *request) { r.Owner.hold() }

// Finished lets go of Start's reference.
func (h *queueHooks) Finished(r *request) { r.Owner.release() }

// Alive is a sign of life of the device's goroutine (loop_stall_max_us).
func (h *queueHooks) Alive() { h.wb.live.alive(int64(h.wb.now())) }

// Do runs the request's system call.
func (h *queueHooks) Do(r *request) error { return h.wb.doAttempt(r) }

// Detached is reqDetachedLocked, on the device's goroutine.
func (h *queueHooks) Detached(r *request, began time.Time) {
	h.wb.mu.Lock()
	h.wb.reqDetachedLocked(r, began)
	h.wb.mu.Unlock()
}

// TimedOut is reqTimedOutLocked, on the device's goroutine.
func (h *queueHooks) TimedOut(r *request) {
	h.wb.mu.Lock()
	after := h.wb.reqTimedOutLocked(r)
	h.wb.mu.Unlock()
	after()
}

// Returned is reqReturnedLocked, on the call's worker.
func (h *queueHooks) Returned(r *request, err error) {
	h.wb.mu.Lock()
	after := h.wb.reqReturnedLocked(r, err)
	h.wb.mu.Unlock()
	after()
}

// reqDetachedLocked marks the inode of a detached call Busy until the
// call returns, and records the call in calls (stuck_calls once past
// attempt_timeout). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) reqDetachedLocked(r *request, began time.Time) {
	r.Owner.detached++
	r.Owner.in.State |= inode.Busy
	r.Tag = wb.calls.track(wb.now() - time.Since(began))
	wb.acct.detached++
}

// reqTimedOutLocked gives a request whose call ran past attempt_timeout
// ErrAttemptTimeout and marks the inode Busy until the call returns.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) reqTimedOutLocked(r *request) func() {
	r.Err = ErrAttemptTimeout
	r.Owner.stuck++
	r.Owner.in.State |= inode.Busy
	wb.acct.stuck++
	return func() {
		wb.errLog.Warn("writeback call exceeded attempt_timeout; the file is marked busy until it returns",
			logpath.String("path", r.Owner.path), zap.Stringer("attempt_timeout", wb.cfg.AttemptTimeout))
	}
}

// reqReturnedLocked ends a detached or timed-out call: the attempt was
// completed without it. The inode stops being Busy once none of its calls
// runs; a detached call's error is kept for the inode's next attempt
// (lateErr), and a detached probe that says sync_file_range is not
// supported asks for the probe again (reprobe). Preconditions: wb.mu
// held.
//
// +checklocks:wb.mu
func (wb *Writeback) reqReturnedLocked(r *request, err error) func() {
	att := r.Owner
	in := att.in
	if _, dev := policy.DeviceLevel(err); !dev {
		// A call left to its worker (slow, or past attempt_timeout)
		// came back past the device's error: the device serves again.
		wb.probe.end(wb.log, err)
	}
	if r.State() == blk.TimedOut {
		att.stuck--
		wb.acct.stuck--
		if att.stuck == 0 && att.detached == 0 {
			wb.unbusyLocked(in)
		}
		wb.gen++
		return func() {
			// close(2) can block (NFS, FUSE): never under the list lock.
			wb.closeCall(r, nil)
			wb.log.Info("a timed-out writeback call returned", logpath.String("path", att.path), zap.Error(err))
			wb.live.kick()
		}
	}
	took, overran := wb.calls.returned(r.Tag, wb.cfg.AttemptTimeout)
	var note closeNote
	if w := &att.call.res; err == nil && w.wrote && !w.afterKnown {
		// Its attempt was completed without it (as still dirty): the
		// pages it started writing back count in BdiWritten now, or
		// once verified. (An fdatasync's afterKnown call is integrity
		// work, never detached.)
		closing := att.call.f != nil && wb.verifies()
		wb.startedLocked(in, w.queued, closing, wb.now())
		if closing {
			note = closeNote{report: true, key: in.Key(), path: in.Path(), handle: in.Handle(),
				expire: wb.bDirty.classes[in.Class].expire, counted: true}
		}
	}
	att.detached--
	if att.stuck == 0 && att.detached == 0 {
		wb.unbusyLocked(in)
	}
	if !r.Integrity && (blk.IsUnsupported(err) || !att.call.started) {
		// A detached first call of a filesystem (the probe) says
		// sync_file_range does not work there, or made no such call:
		// probe again. (Any other detached call of a probed
		// filesystem only probes it once more.)
		if wb.probe.reprobe == nil {
			wb.probe.reprobe = map[uint64]bool{}
		}
		wb.probe.reprobe[r.Dev] = true
	}
	if err != nil && !att.call.unsupported && wb.inodes.Get(in.Key()) == in {
		// (An unsupported sync_file_range is the filesystem's, not
		// the file's: the probe again, and the file is retried.)
		if wb.side.lateErr == nil {
			wb.side.lateErr = map[inode.Key]error{}
		}
		wb.side.lateErr[in.Key()] = err
	}
	wb.gen++
	return func() {
		// An attempt's worker may have kept its file open
		// for complete, which did not wait for it.
		if note.report {
			wb.closeReturned(note, wb.closeCallErr(r))
		} else {
			wb.closeCall(r, nil)
		}
		if overran {
			wb.errLog.Warn("a writeback call returned after running past attempt_timeout (counted in stuck_calls while it ran)",
				logpath.String("path", att.path), zap.Duration("took", took), zap.Error(err))
		}
		if err != nil {
			wb.log.Info("a detached writeback call failed; the file's next attempt reports it", logpath.String("path", att.path), zap.Error(err))
		}
		wb.live.kick()
	}
}

// newAttemptLocked begins an attempt on in, tracked under key
// (writeback_single_inode's start, under the list lock): it takes what
// the attempt needs of the inode's state (its path and handle, whether an
// earlier attempt wrote it) and write_chunk, at now (daemon clock). An
// attempt begun with err set is the report of a detached call of the
// inode's last attempt that failed (writebackSingleInode). result, if set,
// receives the attempt's error. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) newAttemptLocked(in *inode.Inode, key inode.Key, result *error, now time.Duration) *attempt {
	att := &attempt{in: in, result: result, path: in.Path(), wb: wb,
		handle: in.Handle(), wroteBefore: in.Has(inode.Wrote), began: now}
	att.callMem.chunk = wb.writeChunkLocked()
	if len(wb.side.lateErr) > 0 {
		if late, ok := wb.side.lateErr[key]; ok {
			att.err = late
			delete(wb.side.lateErr, key)
		}
	}
	return att
}

// writebackSingleInode is __writeback_single_inode under an inner plug,
// for an attempt begun by newAttemptLocked: it queues one request for the
// inode, whose worker (doAttempt) opens the
// file safely, reads its page-cache state with cachestat, and writes at
// most write_chunk of its dirty data (all of it for integrity work, which
// is one fdatasync). It returns the pages it expects to be written, for
// the work's budget: the inode's last known dirty count, at most
// write_chunk. Attempts that need no call are completed at once.
func (wb *Writeback) writebackSingleInode(att *attempt, key inode.Key, integrity bool) int64 {
	wb.plug.Start()
	defer wb.finishPlug()
	in := att.in
	att.refs.Store(1)
	if att.err != nil {
		// A detached call of its last attempt failed: this attempt
		// is that failure's report (classified, counted, logged and
		// requeued as any attempt's error); the next one writes.
		wb.complete(att)
		return 0
	}
	page := int64(os.Getpagesize())
	chunk := att.callMem.chunk
	if dp := int64(in.DirtyPages) * page; !integrity && dp > smallFile(chunk, wb.window.size()) && dp <= chunk && wb.congested(in, 0, wb.window.size()) {
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
	att.callMem = attemptCall{chunk: chunk, maxInflight: wb.window.size(), fallback: wb.loop.fallback[key.Dev]}
	att.call = &att.callMem
	att.reqMem = request{Dev: key.Dev, Ino: key.Ino, Integrity: integrity, Owner: att}
	wb.plug.Add(&att.reqMem)
	return min(max(1, int64(in.DirtyPages)), max(1, chunk/page))
}
