package bdi

import (
	"time"

	"flusherd/inode"
)

const (
	SyncNone SyncMode = iota // WB_SYNC_NONE: start writeback
	SyncAll                  // WB_SYNC_ALL: data integrity, fdatasync
)

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
		h := wb.lockWithHandle(f.Key, f.Path, "", 0)
		// Tracked from now on, as a write would (no wakeup: this is
		// the device's goroutine); not a write, though: a file whose
		// data was lost keeps that loss (LostBefore) unless its
		// attempt finds data written since (through a shared mmap,
		// which makes no event), which it then writes.
		wb.markInodeDirtyLocked(f.Key, f.Path, h, f.Tree, now, markClosed|markSync)
		in := wb.inodes.Get(f.Key)
		if in.Has(inode.Busy) && !wb.waitUnbusyLocked(in) {
			wb.mu.Unlock()
			w.Errs[i] = ErrAttemptTimeout
			continue
		}
		wb.inflight.MoveToBack(in)
		in.State |= inode.Sync
		in.State &^= inode.Redirtied
		wb.bg.attemptBegins(in)
		att := wb.newAttemptLocked(in, f.Key, &w.Errs[i], wb.now())
		wb.mu.Unlock()
		wb.writebackSingleInode(att, f.Key, true)
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
		wb.live.alive(int64(wb.now()))
		wb.mu.Lock()
	}
	return true
}
