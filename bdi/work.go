package bdi

import (
	"fmt"
	"syscall"
	"time"

	"flusherd/inode"
)

// SyncMode is the work's writeback_sync_modes.
type SyncMode uint8

const (
	SyncNone SyncMode = iota // WB_SYNC_NONE: start writeback
	SyncAll                  // WB_SYNC_ALL: data integrity, fdatasync
)

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
	Tree Tree
}

// Done is closed when the work has run.
func (w *Work) Done() <-chan struct{} { return w.done }

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
		now := wb.now()
		h := wb.lockWithHandle(f.Key, f.Path, "")
		if in := wb.inodes.Get(f.Key); in != nil && wb.failedLocked(in) {
			// A sync is not a new write: its data stays lost.
			w.Errs[i] = fmt.Errorf("%w: the data was dropped after a failed writeback", errnoError(in.LastErr))
			wb.mu.Unlock()
			continue
		}
		// Tracked from now on, as a write would (no wakeup: this is
		// the device's goroutine); not a write, though: a loss that a
		// close took off the failed list (LostBefore) stands.
		wb.markInodeDirtyLocked(f.Key, f.Path, h, f.Tree, now, markClosed)
		in := wb.inodes.Get(f.Key)
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
	wb.finishPlug()
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
