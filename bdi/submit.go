package bdi

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/policy"
)

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
