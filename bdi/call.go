package bdi

import (
	"math"
	"os"
	"time"

	"flusherd/blk"
	"flusherd/inode"
	"flusherd/policy"
)

// openFile opens a tracked file for an attempt (inode.OpenTracked).
func (wb *Writeback) openFile(path string, key inode.Key, h inode.Handle) (f inode.File, renewed inode.Handle, err error) {
	return inode.OpenTracked(wb.files.Opener, wb.files.Handles, path, key, h)
}

// openFileRef is openFile of the path ref names (inode.OpenTrackedRef).
func (wb *Writeback) openFileRef(ref inode.PathRef, key inode.Key, h inode.Handle) (f inode.File, renewed inode.Handle, err error) {
	return inode.OpenTrackedRef(wb.files.Opener, wb.files.Handles, ref, key, h)
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

// maxRangeWindows is how many write_chunk windows ranges looks for one by
// one in an attempt before it takes the rest of the budget as one range.
const maxRangeWindows = 16

// window is a byte range of a file to write back; Len 0 is to the end.
type window = inode.Window

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
	start := wb.side.wbIndex[key]
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
			wins = append(wins, window{Off: lo, Len: n})
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
			// prefix holding budget of them. Past maxRangeWindows
			// windows a file's dirty pages are scattered (a sparse
			// image, a database written at random): a window each
			// would cost a bisection over the region per dirty page.
			end, n := regionEnd, int64(d)
			if n > budget {
				if end, n, err = dirtyPrefix(f, off, regionEnd, budget); err != nil {
					return nil, 0, false, 0, err
				}
			}
			if n == 0 {
				break // (cannot happen: one page is at most one dirty page)
			}
			take(off, end-off, n)
			continue
		}
		lo, err := firstDirtyWindow(f, off, regionEnd, chunk)
		if err != nil {
			return nil, 0, false, 0, err
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
		delete(wb.side.wbIndex, key)
	} else {
		wb.side.wbIndex[key] = off
	}
	wb.mu.Unlock()
	if len(wins) == 0 {
		// Dirty pages beyond the size seen at open (an append): write
		// from the old end onwards.
		wins = append(wins, window{})
	}
	return wins, queued, budget <= 0, merged, nil
}

// dirtyPrefix returns the end of the longest range from off (at most to
// end) that holds at most budget dirty pages, and the dirty pages in it,
// found by bisection on the end; the range from off to end holds more.
func dirtyPrefix(f inode.File, off, end, budget int64) (prefixEnd, n int64, err error) {
	page := int64(os.Getpagesize())
	lo, hi := off, end // dirty(off, lo) <= budget < dirty(off, hi)
	for hi-lo > page {
		mid := lo + max(page, (hi-lo)/2/page*page)
		dm, _, err := f.Cachestat(off, mid-off)
		if err != nil {
			return 0, 0, err
		}
		if int64(dm) <= budget {
			lo, n = mid, int64(dm)
		} else {
			hi = mid
		}
	}
	return lo, n, nil
}

// firstDirtyWindow returns the start of the first write_chunk (chunk
// bytes) window of [lo, hi) that holds dirty pages, given that the range
// holds some, by bisection: O(log size) cachestat calls, not one per
// window, however sparse the file.
func firstDirtyWindow(f inode.File, lo, hi, chunk int64) (int64, error) {
	page := int64(os.Getpagesize())
	for hi-lo > chunk {
		mid := lo + max(page, (hi-lo)/2/page*page)
		dm, _, err := f.Cachestat(lo, mid-lo)
		if err != nil {
			return 0, err
		}
		if dm > 0 {
			hi = mid
		} else {
			lo = mid
		}
	}
	return lo, nil
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
	if in != nil && wb.inodes.Get(in.Key()) == in {
		sum -= min(sum, uint64(in.WritebackPages))
	}
	wb.mu.Unlock()
	page := int64(os.Getpagesize())
	return maxInflight - int64(min(sum, uint64(maxInflight/page)))*page
}

// startRoom is how many bytes of in's writeback (wbp pages under
// writeback as last read) may start now, in whole pages: the room under
// the window (maxInflight), which it also returns (window), and the
// pace's (pacer.room, for a caller back every span).
func (wb *Writeback) startRoom(in *inode.Inode, wbp uint64, maxInflight int64, span time.Duration) (room, window int64) {
	page := int64(os.Getpagesize())
	window = wb.inflightRoom(in, wbp, maxInflight) / page * page
	if window <= 0 {
		return 0, window
	}
	pace := wb.pace.room(wb.now(), span) / page * page
	return min(window, pace), window
}

// charge charges the pace with pages put under writeback.
func (wb *Writeback) charge(pages uint64) {
	wb.pace.take(wb.now(), int64(pages)*int64(os.Getpagesize()))
}

// roomGate is the oldest big file deferred for want of room under the
// in-flight window and still waiting: younger big files wait behind it,
// so that room goes to the oldest data first (the kernel's single flusher
// thread waits for a request slot on the inode it is writing and does not
// pass it). A holder not seen back within roomGateStale is let go (its
// file forgotten, or taken by other work). The list lock guards it.
type roomGate struct {
	key   inode.Key
	when  time.Duration // its DirtiedWhen
	at    time.Duration // when it was deferred (daemon clock)
	valid bool
}

// roomGateStale is how long a deferred big file keeps its turn without
// trying again: a few retries' pauses (throttleRetry).
const roomGateStale = 4 * throttleRetry

// roomTurn reports whether the big file in may take room now: it is the
// oldest waiting for it, or older than the gate's holder, or no one
// waits. hasRoom says the window has room for it; a big file that gets
// none (or whose turn it is not) and is older than the holder becomes
// the holder. Called by attempts on workers.
func (wb *Writeback) roomTurn(in *inode.Inode, hasRoom bool) bool {
	now := wb.now()
	wb.mu.Lock()
	defer wb.mu.Unlock()
	g := &wb.roomGate
	if g.valid && now-g.at > roomGateStale {
		g.valid = false
	}
	turn := !g.valid || g.key == in.Key() || in.DirtiedWhen < g.when
	if turn && hasRoom {
		if g.valid && g.key == in.Key() {
			g.valid = false
		}
		return true
	}
	if !g.valid || g.key == in.Key() || in.DirtiedWhen < g.when {
		*g = roomGate{key: in.Key(), when: in.DirtiedWhen, at: now, valid: true}
	}
	return false
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

// doAttempt runs an attempt on a worker: it opens the file safely, reads
// cachestat and, if it is dirty (or the work is for integrity), writes it:
// the whole file when its dirty data fits in write_chunk (or for
// integrity, with fdatasync, or where sync_file_range is not supported),
// else at most write_chunk of it in windows (writeChunks), unless the
// device has max_inflight under writeback (deferred). It reads no state of
// the device's goroutine: the tunables and whether to use fdatasync were
// taken into its attemptCall, since a detached call outlives its batch. A
// file that was written stays open for complete's cachestat,
// except after fdatasync, which waited: its state after is read here. The
// first phase of a two-phase integrity request only opens and starts
// writeback, and leaves the file open for the second.
func (wb *Writeback) doAttempt(r *request) error {
	att := r.Owner
	w := att.call
	if w.f == nil {
		key := inode.Key{Dev: r.Dev, Ino: r.Ino}
		f, renewed, err := wb.openFile(att.path, key, att.handle)
		if err != nil {
			w.res.unread = true
			return err
		}
		if wb.files.Observer != nil {
			wb.files.Observer.Opened(key, f) // before its state is read
		}
		w.f, w.res.renewed = f, renewed
		d, wbp, err := f.Cachestat(0, 0)
		if err != nil {
			w.res.unread = true
			return wb.closeCall(r, err)
		}
		if d == 0 && wbp == 0 {
			w.res.looked = wb.now() // (a clock read only where it is used)
		}
		w.res.dirtyBefore, w.res.wbBefore, w.res.read = d, wbp, true
		if _, write := policy.BeforeWrite(d, wbp, r.Integrity); !write {
			w.res.closeErr = wb.closeCallErr(r)
			return nil
		}
		page := int64(os.Getpagesize())
		if dirty := int64(d) * page; !r.Integrity && dirty > smallFile(w.chunk, w.maxInflight) {
			room, window := wb.startRoom(att.in, wbp, w.maxInflight, 0)
			paced := window > 0 // (when room is 0: the pace alone had none)
			if !wb.roomTurn(att.in, room > 0) && room > 0 {
				room = 0 // a younger big file waits for the older's turn
			}
			if room <= 0 {
				// More than a small file's share to write, and the
				// device has max_inflight_bytes under writeback: not now
				// (b_more_io_wait, retried soon), so that a small file
				// written meanwhile does not queue behind this one's
				// stream.
				w.res.deferred = true
				if !paced {
					wb.mu.Lock()
					wb.acct.throttled++
					wb.mu.Unlock()
				}
				return wb.closeCall(r, nil)
			}
			if dirty > room && room < min(w.chunk, window) {
				wb.pace.held() // cut short by the pace
			}
			if limit := min(w.chunk, room); dirty > limit && !w.fallback {
				// At most write_chunk, and no more than the room left
				// under max_inflight_bytes.
				w.chunk = limit
				return wb.writeChunks(r)
			}
		}
	}
	switch {
	case w.startOnly:
		return w.f.StartWriteback(0, 0) // the file stays open for the fdatasync
	case r.Integrity || w.fallback:
		// fdatasync waits: the state after is final.
		out, err := inode.Write{Sync: true, Synced: w.synced}.Do(w.f)
		if err != nil {
			return wb.closeCall(r, err)
		}
		w.res.wrote, w.res.waited = true, true
		w.res.dirtyAfter, w.res.wbAfter, w.res.afterKnown = out.Dirty, out.Writeback, true
		// Its data left the page cache before flusherd wrote it: if
		// that writeback failed and someone else's fsync took the
		// report, this fdatasync could not see it. The filesystem's
		// own error cursor can (ErrWatch), read once for the batch.
		w.res.fsCheck = w.res.dirtyBefore == 0 && w.res.wbBefore == 0 && !att.wroteBefore && wb.errs != nil
		return wb.closeCall(r, nil)
	}
	w.res.queued = w.res.dirtyBefore
	return wb.startWriteback(r, nil)
}

// startWriteback starts writeback of wins (none: the whole file) of the
// attempt's file (inode.Write); the file stays open: complete looks at it
// once the whole batch is out, by when most of its writeback has
// finished.
func (wb *Writeback) startWriteback(r *request, wins []inode.Window) error {
	w := r.Owner.call
	out, err := inode.Write{Windows: wins}.Do(w.f)
	w.started = out.Started
	if wb.pace.Rate() > 0 {
		// What went under writeback: the pages asked for, or for
		// ranges the fall in dirty pages if more (a filesystem with
		// large folios writes whole folios, past the range asked for).
		n := w.res.queued
		if len(wins) > 0 {
			if d, _, err := w.f.Cachestat(0, 0); err == nil {
				n = max(n, w.res.dirtyBefore-min(w.res.dirtyBefore, d))
			}
		}
		wb.charge(n)
	}
	if err != nil {
		w.unsupported = blk.IsUnsupported(err)
		return wb.closeCall(r, err)
	}
	w.res.wrote = true
	return nil
}

// writeChunks writes at most write_chunk of the dirty data of a file that
// holds more: ranges' windows, each started with sync_file_range WRITE.
func (wb *Writeback) writeChunks(r *request) error {
	w := r.Owner.call
	wins, queued, used, merged, err := wb.ranges(w.f, inode.Key{Dev: r.Dev, Ino: r.Ino}, w.chunk)
	if err != nil {
		return wb.closeCall(r, err)
	}
	w.res.chunkUsed, w.res.merged, w.res.queued = used, merged, uint64(queued)
	return wb.startWriteback(r, wins)
}

// closeCall closes an attempt's file, if it holds one, and
// passes err on.
func (wb *Writeback) closeCall(r *request, err error) error {
	wb.closeCallErr(r)
	return err
}

// closeCallErr closes an attempt's file, if it holds one, and returns
// close's error.
func (wb *Writeback) closeCallErr(r *request) error {
	if w := r.Owner.call; w != nil && w.f != nil {
		err := w.f.Close()
		w.f = nil
		return err
	}
	return nil
}

// adoptCall gives a finished attempt its call's result, and its open
// file if it kept one, for complete; with nothing written, the counts
// before are the counts after.
func adoptCall(r *request) {
	att := r.Owner
	att.res = att.call.res
	res := &att.res
	switch {
	case res.wrote:
		att.f, att.call.f = att.call.f, nil // complete reads cachestat and closes it (nil after fdatasync)
		return
	case res.deferred:
		att.pre = policy.UnderWriteback
	default:
		att.pre, _ = policy.BeforeWrite(res.dirtyBefore, res.wbBefore, r.Integrity)
	}
	res.afterKnown, res.dirtyAfter, res.wbAfter = true, res.dirtyBefore, res.wbBefore
}
