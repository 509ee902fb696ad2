package bdi

import (
	"cmp"
	"errors"
	"math"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/lists"
	"flusherd/policy"
	"flusherd/tree"
)

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
	if c := wb.sweep.cands[in.Key()]; c != nil {
		c.clean = max(c.clean, wb.now()) // clean now, or gone
	}
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

// setPagesLocked records cachestat's counts for in (pages), keeping the
// device's sums (BdiReclaimable, BdiWriteback, the background threshold's
// input) and BdiDirtied, which grows by what in gained since it was last
// looked at. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) setPagesLocked(in *inode.Inode, dirty, wbp uint64) {
	d, w := uint32(min(dirty, math.MaxUint32)), uint32(min(wbp, math.MaxUint32))
	if d > in.DirtyPages {
		wb.acct.dirtied += uint64(d - in.DirtyPages)
	}
	wb.acct.dirtySum += uint64(d) - uint64(in.DirtyPages)
	wb.acct.wbSum += uint64(w) - uint64(in.WritebackPages)
	in.DirtyPages, in.WritebackPages = d, w
	if w > 0 {
		wb.bg.underWB[in] = struct{}{}
	} else {
		delete(wb.bg.underWB, in)
	}
}

// dropInodeLocked removes what the device keeps of an inode besides its
// list entry: its map entries and its share of the page sums. Every path
// that forgets an inode calls it, and it tells the opener
// (AttemptObserver). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) dropInodeLocked(in *inode.Inode) {
	k := in.Key()
	if wb.files.Observer != nil {
		wb.files.Observer.Forgotten(k)
	}
	wb.setPagesLocked(in, 0, 0)
	wb.inodes.Delete(k)
	wb.budget.n.Add(-1)
	delete(wb.side.wbIndex, k)
	delete(wb.bg.rangeOff, k)
	delete(wb.side.lateErr, k)
	delete(wb.side.retryAt, k)
	wb.bDirty.unref(in.Class)
	in.State = 0
}

// checksWantedLocked reports whether the device acts on freshly written
// files besides counting their pages: range writeback or a background
// threshold is configured. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) checksWantedLocked() bool {
	return wb.cfg.RangeBytes > 0 || wb.cfg.DirtyBackgroundBytes > 0 || wb.cfg.DirtyBackgroundRatio > 0
}

// touchLocked records that in was written, for the next background check,
// which counts its pages (so BdiReclaimable holds a file's dirty pages
// before its first attempt, as the kernel's per-bdi counts do), and
// reports whether it is the first file since the last check, when the
// goroutine must be woken to schedule the check. Preconditions: wb.mu
// held.
//
// +checklocks:wb.mu
func (wb *Writeback) touchLocked(in *inode.Inode) bool {
	if in.Has(inode.Touched) {
		return false
	}
	in.State |= inode.Touched
	wb.bg.touched.Push(in)
	return wb.bg.touched.Len() == 1
}

// writeChunk is the most bytes one attempt writes of a file: write_chunk,
// or with write_chunk = "auto" writeback_chunk_size's rule: half a second
// of the device's average write bandwidth (avg_write_bandwidth), rounded
// down to 4 MiB after adding 4 MiB (so at least 4 MiB), at most 128 MiB
// and at most max_inflight. Called on the device's goroutine.
func (wb *Writeback) writeChunk() int64 {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return wb.writeChunkLocked()
}

// writeChunkLocked is writeChunk. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) writeChunkLocked() int64 {
	if !wb.cfg.WriteChunkAuto {
		return wb.cfg.WriteChunk
	}
	bw := int64(wb.bw.avgKBps.Load()) * 1024 // bytes/s
	c := min((bw/2+minAutoChunk)/minAutoChunk*minAutoChunk, maxAutoChunk)
	if window := wb.window.size(); window > 0 {
		c = min(c, max(window, 4096))
	}
	return c
}

// parkFailedLocked moves in to bFailed. Only a new write takes it off (as
// dirty again), so the opener is told, as of a forgotten inode
// (AttemptObserver), that its writes must be reported. Preconditions:
// wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) parkFailedLocked(in *inode.Inode) {
	if wb.files.Observer != nil {
		wb.files.Observer.Forgotten(in.Key())
	}
	in.State &^= inode.Dirty | inode.Sync | inode.Redirtied | inode.DataError | inode.Wrote | inode.LostBefore
	wb.bFailed.MoveToBack(in)
	wb.acct.failed++
}

// forgetFailedLocked forgets an inode on bFailed. Preconditions: wb.mu
// held.
//
// +checklocks:wb.mu
func (wb *Writeback) forgetFailedLocked(in *inode.Inode) {
	lists.Remove(in)
	wb.acct.failed--
	wb.dropInodeLocked(in)
}

// failedLocked reports whether in is on bFailed. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) failedLocked(in *inode.Inode) bool {
	return in.Link().Linked() && !in.Has(inode.Dirty)
}

// errnoError turns a LastErr back into an error.
func errnoError(e uint8) error {
	if e == 0 || e == inode.ErrnoOther {
		return errors.New("writeback failed")
	}
	return unix.Errno(e)
}

// unbusyLocked clears in's Busy once no call for it is stuck or detached
// (callers have counted theirs down), asks for b_more_io_wait to be
// retried now (the inode waits there for this call only), and wakes a sync
// request waiting for it. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) unbusyLocked(in *inode.Inode) {
	in.State &^= inode.Busy
	wb.probe.detachReturned = true
	if wb.unbusy != nil {
		close(wb.unbusy)
		wb.unbusy = nil
	}
}

// Auto write_chunk bounds (writeback_chunk_size rounds to
// MIN_WRITEBACK_PAGES, 4 MiB).
const (
	minAutoChunk = 4 << 20
	maxAutoChunk = 128 << 20
)

// stricterTreeLocked applies to a tracked inode reported from tree t
// (moved or hard-linked into it, or written through a name there) what t
// asks for beyond its own settings: integrity mode, and a shorter expiry,
// which moves it to that expiry's class at its age (dirtiedWhen kept). The
// stricter of its trees holds, so that a file renamed from a writeback
// tree into an integrity tree (a temporary file renamed into place) is
// made durable within that tree's bound, not only started. Preconditions:
// wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) stricterTreeLocked(in *inode.Inode, t tree.Tree) {
	c, move := wb.stricterClassLocked(in, t)
	if !move {
		return
	}
	onDirty := false
	for x := range wb.bDirty.classes[in.Class].list.All {
		if x == in {
			onDirty = true
			break
		}
	}
	wb.moveClassLocked(in, c, onDirty)
}

// stricterTreesLocked is stricterTreeLocked for many inodes (a reload's),
// with one walk of b_dirty to find which are on it, not one walk each,
// taken oldest first, so that each one moved goes in at its new class's
// newest end (insertByAge) rather than after a search. It reorders ins.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) stricterTreesLocked(ins []*inode.Inode, t tree.Tree) {
	if len(ins) == 0 {
		return
	}
	slices.SortFunc(ins, func(a, b *inode.Inode) int { return cmp.Compare(a.DirtiedWhen, b.DirtiedWhen) })
	onDirty := make(map[*inode.Inode]bool, len(ins))
	for _, in := range ins {
		onDirty[in] = false
	}
	for _, c := range wb.bDirty.classes {
		for x := range c.list.All {
			if _, ok := onDirty[x]; ok {
				onDirty[x] = true
			}
		}
	}
	for _, in := range ins {
		if c, move := wb.stricterClassLocked(in, t); move {
			wb.moveClassLocked(in, c, onDirty[in])
		}
	}
}

// stricterClassLocked gives in tree t's integrity mode, and returns the
// class of t's expiry when it is shorter than in's own (move; the class
// is then referenced). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) stricterClassLocked(in *inode.Inode, t tree.Tree) (c uint8, move bool) {
	if t.Integrity() && !in.Has(inode.Integrity) {
		in.State |= inode.Integrity
	}
	old := in.Class
	if t.Expire >= wb.bDirty.classes[old].expire {
		return 0, false
	}
	c, exact := wb.bDirty.class(t.Expire)
	if !exact && wb.bDirty.classes[c].expire >= wb.bDirty.classes[old].expire {
		wb.bDirty.unref(c) // no class closer to t's expiry than its own
		return 0, false
	}
	return c, true
}

// moveClassLocked moves in to class c: on its class's FIFO (onDirty:
// b_dirty) it moves to the new one, by age; on another list it goes back
// to b_dirty by its class later. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) moveClassLocked(in *inode.Inode, c uint8, onDirty bool) {
	old := in.Class
	if onDirty {
		lists.Remove(in)
	}
	in.Class = c
	wb.bDirty.unref(old)
	if onDirty {
		wb.bDirty.insertByAge(in)
	}
}
