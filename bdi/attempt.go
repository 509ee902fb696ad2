package bdi

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/policy"
)

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

// complete ends an attempt, as the end of writeback_single_inode does: it
// reads the file's state after the write (readAfter), classifies the outcome, accounts for it, decides where the inode goes
// (policy.Decide, requeue_inode) and puts it there.
func (wb *Writeback) complete(att *attempt) {
	st := att.readAfter()
	now := wb.now()
	in := att.in
	wb.mu.Lock()
	o, redirtied := wb.outcomeLocked(att, st)
	ac := wb.accountLocked(att, o, st, now)
	d := policy.Decide(wb.factsLocked(att, o, st, redirtied, ac.hadIOError))
	st.err = wb.applyLocked(att, d, st.err, ac.dataErr, now)
	path, retries := in.PathRef(), in.Retries
	wb.gen++
	wb.mu.Unlock()
	att.release() // after accountLocked recorded its write (closeReturned)
	if att.result != nil {
		*att.result = st.err
	}
	if wb.Hooks.Trace != nil {
		wb.Hooks.Trace(path.String(), o, d.Dest, st.err)
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
	if att.res.wrote && att.res.dirtyBefore > 0 && !att.wroteBefore {
		// flusherd began writing its data: how long it stayed dirty.
		if t := wb.trees.of(in); t != nil {
			t.exposure.observe(att.began-in.DirtiedWhen, now)
		}
	}
	if att.res.wrote && err == nil && att.res.dirtyBefore > 0 {
		// Written without an error, an earlier failure's pages among
		// them: finding it clean later is this write's doing.
		in.State |= inode.Wrote
		in.State &^= inode.DataError
	}
	counted := false
	if att.res.wrote && err == nil && att.res.dirtyBefore > st.dirty {
		n := att.res.dirtyBefore - st.dirty
		wb.loop.pass.pages += n
		if att.res.waited {
			wb.wroteLocked(in, n)
		} else {
			counted = att.f != nil && wb.verifies()
			wb.startedLocked(in, n, counted, now)
		}
	}
	if att.res.wrote && !att.res.waited && att.f != nil && wb.verifies() {
		// Its close is part of its writeback (FUSE's flush).
		att.note = closeNote{report: true, key: in.Key(), path: in.Path(), handle: in.Handle(),
			expire: wb.bDirty.classes[in.Class].expire, counted: counted}
	}
	if att.res.read && err == nil {
		wb.ownSyncfsWroteLocked(in, att.res.dirtyBefore, att.res.wbBefore, att.res.looked, now)
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
		wb.attemptFailedLocked(in)
		if e := errnoOf(err); e != in.LastErr {
			in.LastErr = e
			ac.newErr = true
		}
	}
	if o == policy.IOError {
		wb.side.setNextRetry(in.Key(), now+wb.cfg.MaxPause)
	} else {
		wb.side.setNextRetry(in.Key(), 0)
	}
	wb.verifyCleanLocked(att, &ac, err, now)
	ac.hadIOError = in.Has(inode.DataError) || (att.res.fsErrAt != 0 && att.res.fsErrAt >= in.DirtiedWhen)
	if o == policy.IOError && !att.res.unread {
		// (An error of its open or first cachestat is not its data's.)
		in.State |= inode.DataError
	}
	return ac
}

// verifyCleanLocked deals with an attempt in writeback mode that found
// its file clean and wrote nothing: on FUSE, its open or its close may
// have written the file back (fuse_finish_open, fuse_flush), and the
// close reports that writeback's failure, which is then the data's
// (inode.DataError: found clean, it is lost, policy.Lost). A file found
// clean at its first attempt is recorded as a write of no pages, so that
// the next read of its filesystem's error cursor covers it
// (startedLocked). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) verifyCleanLocked(att *attempt, ac *accounted, err error, now time.Duration) {
	in, res := att.in, &att.res
	if !wb.verifies() || in.Has(inode.Integrity) || res.wrote || !res.read {
		return
	}
	if e := res.closeErr; e != nil {
		in.Errors = satInc(in.Errors)
		wb.attemptFailedLocked(in)
		in.LastErr = errnoOf(e)
		in.State |= inode.DataError
		ac.newErr = true
		return
	}
	if err == nil && res.dirtyBefore == 0 && res.wbBefore == 0 && !att.wroteBefore {
		wb.startedLocked(in, 0, false, now)
	}
}

// ownSyncfsWroteLocked counts the pages of in that a syncfs of
// flusherd's own wrote back: its last known dirty pages, when it is found
// clean (dirty and wbp, read by looked, are 0) and was dirtied
// before a successful syncfs of its filesystem began (an integrity
// batch's, or an error check's: sideState.syncfsBetween) that began by
// the look: one begun after found it clean already (another program's
// sync wrote it; an integrity attempt that found it so then checks the
// filesystem's error cursor with a syncfs). They count in BdiWritten and its
// tree's written pages, and that syncfs's start is when flusherd began
// writing its data (its tree's exposure). Call it before setPagesLocked
// records the new counts. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) ownSyncfsWroteLocked(in *inode.Inode, dirty, wbp uint64, looked, now time.Duration) {
	if dirty != 0 || wbp != 0 || in.DirtyPages == 0 {
		return
	}
	began, ok := wb.side.syncfsBetween(in.Key().Dev, in.DirtiedWhen, looked)
	if !ok {
		return
	}
	wb.wroteLocked(in, uint64(in.DirtyPages))
	if t := wb.trees.of(in); t != nil && !in.Has(inode.Wrote) {
		t.exposure.observe(began-in.DirtiedWhen, now)
	}
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
		ShuttingDown: wb.stop.on,
		Denied:       errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM),
		OpenFailed:   policy.OpenFailed(err),
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
		wb.stop.givenUp = append(wb.stop.givenUp, GivenUp{Path: in.Path(), Err: err})
	}
	wb.requeueInodeLocked(in, d.Dest, now)
	if d.Dest == policy.Failed && (err == nil || dataErr != 0 && errnoOf(err) != dataErr) {
		err = fmt.Errorf("%w: the data was dropped after a failed writeback", errnoError(in.LastErr))
	}
	return err
}

// logAttempt logs what an attempt found, when it is news: a loss, a new
// error, a file that stays dirty (at 8, 16, 32... attempts), a file gone.
func (wb *Writeback) logAttempt(path inode.PathRef, o policy.Outcome, d policy.Decision, st afterState, newErr bool, retries uint16) {
	err := st.err
	// Built only for a line that is logged (most attempts log none).
	pathField := func() zap.Field { return logpath.String("path", path.String()) }
	switch {
	case d.Dest == policy.Failed && d.StillLost:
		wb.log.Debug("still failed: reported again, but nothing was written since its data was lost", pathField(), zap.Error(err))
	case d.Dest == policy.Failed:
		wb.errLog.Error("data lost: a writeback of this file failed and the kernel dropped its dirty pages; it stays reported as failed until it is written again",
			pathField(), zap.Error(err))
	case d.GiveUp:
		// The shutdown's report names it, with files of the same error.
		wb.log.Debug("writeback failed at shutdown; the file is given up", pathField(), zap.Stringer("outcome", o), zap.Error(err))
	case newErr:
		wb.errLog.Warn("writeback failed; the file stays tracked and is retried",
			pathField(), zap.Stringer("outcome", o), zap.Stringer("requeue", d.Dest), zap.Error(err))
	case o == policy.Skipped && retries >= 8 && retries&(retries-1) == 0:
		wb.errLog.Warn("file still dirty after repeated writeback; it stays tracked and is retried",
			pathField(), zap.Uint16("attempts", retries), zap.Uint64("dirty_pages", st.dirty), zap.Uint64("writeback_pages", st.wbp))
	case o != policy.Gone:
	case errors.Is(err, unix.ENOENT):
		wb.log.Debug("file gone; dropped", pathField(), zap.Error(err))
	case errors.Is(err, inode.ErrReplaced) || errors.Is(err, inode.ErrNotRegular):
		wb.log.Info("the path no longer leads to the tracked file; dropped", pathField(), zap.Error(err))
	default:
		// ESTALE from its file handle: the inode was deleted.
		wb.log.Debug("file deleted; dropped", pathField(), zap.Error(err))
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
	wb.probe.end(wb.log, err)
}
