package bdi

import (
	"math"
	"os"
	"time"

	"go.uber.org/zap"

	"flusherd/blk"
	"flusherd/inode"
	"flusherd/policy"
)

// backgroundCheckInterval is how often a device with freshly written files
// looks at them (wbCheckBackgroundFlush): the background threshold and
// range writeback act within it. The kernel checks its background threshold
// from the writers' side (balance_dirty_pages, every few dirtied pages);
// flusherd learns of writes from the watcher, and checks at most this
// often, and only while files are being written.
const backgroundCheckInterval = 100 * time.Millisecond

// maxSample bounds the files one check opens: the rest wait for the next.
const maxSample = 256

// Auto write_chunk bounds (writeback_chunk_size rounds to
// MIN_WRITEBACK_PAGES, 4 MiB).
const (
	minAutoChunk = 4 << 20
	maxAutoChunk = 128 << 20
)

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
		wb.underWB[in] = struct{}{}
	} else {
		delete(wb.underWB, in)
	}
}

// dropInodeLocked removes what the device keeps of an inode besides its
// list entry: its map entries and its share of the page sums. Every path
// that forgets an inode calls it, and it tells the opener
// (AttemptObserver). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) dropInodeLocked(in *inode.Inode) {
	if wb.observer != nil {
		wb.observer.Forgotten(in.Key)
	}
	wb.setPagesLocked(in, 0, 0)
	wb.inodes.Delete(in.Key)
	delete(wb.wbIndex, in.Key)
	delete(wb.rangeOff, in.Key)
	delete(wb.lateErr, in.Key)
	delete(wb.retryAt, in.Key)
	wb.bDirty.unref(in.Class)
	in.State = 0
}

// nextRetryLocked returns the earliest time (daemon clock, nanoseconds) of
// in's next attempt after an I/O error, 0 for none (see retryAt).
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) nextRetryLocked(in *inode.Inode) time.Duration {
	return wb.retryAt[in.Key]
}

// setNextRetryLocked records at (daemon clock, nanoseconds) as the
// earliest time of in's next attempt; 0 clears it. Preconditions: wb.mu
// held.
//
// +checklocks:wb.mu
func (wb *Writeback) setNextRetryLocked(in *inode.Inode, at time.Duration) {
	if at == 0 {
		delete(wb.retryAt, in.Key)
		return
	}
	if wb.retryAt == nil {
		wb.retryAt = make(map[inode.Key]time.Duration)
	}
	wb.retryAt[in.Key] = at
}

// checksWantedLocked reports whether the device looks at freshly written
// files: with range writeback or a background threshold configured.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) checksWantedLocked() bool {
	return wb.cfg.RangeBytes > 0 || wb.cfg.DirtyBackgroundBytes > 0 || wb.cfg.DirtyBackgroundRatio > 0
}

// followWBLocked reports whether the device follows the counts of files
// whose writeback was in flight at their last look (wb.underWB) with
// background checks: their pages under writeback are what
// max_inflight_bytes bounds and what the background threshold counts.
// Without range writeback or a background threshold, nothing else looks
// at such a file again before its next attempt, which may be an hour
// away (a file on b_dirty), or never come (files deferred by
// max_inflight_bytes without being opened, on those very counts): stale,
// its count would hold the room under max_inflight_bytes for good.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) followWBLocked() bool {
	return wb.checksWantedLocked() || wb.cfg.MaxInflight > 0
}

// touchLocked records that in was written (for the next background check)
// and reports whether it is the first file since the last check, when the
// goroutine must be woken to schedule the check. Preconditions: wb.mu
// held.
//
// +checklocks:wb.mu
func (wb *Writeback) touchLocked(in *inode.Inode) bool {
	if in.Has(inode.Touched) || !wb.checksWantedLocked() {
		return false
	}
	in.State |= inode.Touched
	wb.touched = append(wb.touched, in)
	return len(wb.touched) == 1
}

// shrink empties a list of inodes for reuse, keeping its capacity unless
// a burst made it large.
func shrink(l []*inode.Inode) []*inode.Inode {
	if cap(l) > 4096 {
		return nil
	}
	clear(l)
	return l[:0]
}

// sampleProbe is one file a background check looks at; sampleResult is
// what its worker saw and did.
type sampleProbe struct {
	in        *inode.Inode
	key       inode.Key
	path      string
	handle    inode.Handle
	streaming bool  // range writeback may apply
	rangeOff  int64 // bytes already range-written
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
}

// wbCheckBackgroundFlush is wb_check_background_flush, with flusherd's
// range writeback: it takes in what the last sample saw, writes the
// device's oldest files first while the tracked files' dirty data is over
// the background threshold (wbOverBgThreshLocked), and starts the next
// sample of freshly written files when one is due. Called on the device's
// goroutine, after queued (sync) work and before kupdate.
//
// How the dirty bytes are learned: from cachestat, which is exact for a
// file at the time it is read, at every attempt and at these samples. A
// sample opens only files written since the last check that are streaming
// (written at three consecutive checks: range writeback needs their
// size), files whose writeback was in flight at their last look, and,
// with a background threshold, every freshly written file, but only while
// /proc/vmstat nr_dirty, the whole machine's dirty pages, is at or over the
// threshold: the tracked files cannot be over it before the machine is,
// so a device under it costs one read of /proc/vmstat per check and no
// open at all.
func (wb *Writeback) wbCheckBackgroundFlush() {
	now := wb.now()
	wb.mu.Lock()
	var unsupported []sampleResult
	if res := wb.sampled; res != nil {
		wb.sampled = nil
		unsupported = wb.applySampleLocked(res)
	}
	due := !wb.sampling && (len(wb.touched) > 0 || len(wb.underWB) > 0 && wb.followWBLocked()) &&
		now-wb.lastCheck >= backgroundCheckInterval
	wb.mu.Unlock()
	for _, r := range unsupported {
		wb.useFdatasync(r.key.Dev, r.unsupported)
	}
	wb.updateBandwidth(now)
	if due {
		// Streaming means written in consecutive checks: after a pause
		// of more than one interval without writes, nothing is.
		consecutive := now-wb.lastCheck <= 2*backgroundCheckInterval
		wb.lastCheck = now
		if wb.observer != nil {
			// The next check must see every file written until then.
			wb.observer.Checking()
		}
		wb.startSample(now, consecutive)
	}
	wb.mu.Lock()
	over := wb.wbOverBgThreshLocked()
	excess := int64(wb.acct.dirtySum) - int64(wb.bgThresh)
	if over {
		wb.acct.backgroundWorks++
	}
	wb.mu.Unlock()
	if over {
		// The kernel's background work has no page budget and checks
		// wb_over_bg_thresh after each writeback_sb_inodes round; the
		// counts here are learned when a batch completes, so a pass
		// queues the excess over the threshold, and the next pass
		// checks again.
		wb.wbWriteback(&Work{NrPages: excess, ForBackground: true, Reason: "background"})
		wb.mu.Lock()
		wb.returnMoreIOLocked()
		wb.mu.Unlock()
	}
}

// returnMoreIOLocked puts the files on b_more_io (a big file with more
// chunks to write) back on b_dirty, where their dirtiedWhen places them.
// Background work does so before each queue_io, so that it takes the
// oldest data first, partly written files included (the kernel's queue_io
// takes b_more_io first, whatever its age), and when it stops under its
// threshold, so that those files wait for their expiry as the rest of
// b_dirty does, instead of being written to the end by the next kupdate
// pass. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) returnMoreIOLocked() {
	for in := wb.BMoreIO.Front(); in != nil; in = wb.BMoreIO.Front() {
		wb.bDirty.insertByAge(in)
	}
}

// bgThreshold computes the device's background threshold in pages from
// the configuration and the kernel's (ratio), 0 when off.
func (wb *Writeback) bgThreshold(cfg Config, kernelBg uint64) uint64 {
	page := uint64(os.Getpagesize())
	var t uint64
	if cfg.DirtyBackgroundBytes > 0 {
		t = max(1, uint64(cfg.DirtyBackgroundBytes)/page)
	}
	if cfg.DirtyBackgroundRatio > 0 && kernelBg > 0 {
		r := max(1, kernelBg*uint64(cfg.DirtyBackgroundRatio)/100)
		if t == 0 || r < t {
			t = r
		}
	}
	return t
}

// wbOverBgThreshLocked is wb_over_bg_thresh for the tracked files: their
// dirty pages, as last seen, are over the device's background threshold,
// and so is the whole machine's dirty count (nr_dirty, read at the last
// check; a file's count may be older than its writeback by the kernel).
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) wbOverBgThreshLocked() bool {
	return wb.bgThresh > 0 && wb.acct.dirtySum > wb.bgThresh && wb.globalDirty > wb.bgThresh
}

// startSample picks the files to look at (see wbCheckBackgroundFlush) and
// runs the sample on a goroutine of its own, as a call off the device's
// goroutine (counted in stuck_calls past attempt_timeout: an open on a
// stalled filesystem). Its results are taken in by the next check.
func (wb *Writeback) startSample(now time.Duration, consecutive bool) {
	wb.mu.Lock()
	cfg := wb.cfg
	wb.mu.Unlock()
	var kernelBg, global uint64
	if cfg.DirtyBackgroundRatio > 0 && wb.thresholds != nil {
		if _, b, err := wb.thresholds(); err == nil {
			kernelBg = b
		}
	}
	thresh := wb.bgThreshold(cfg, kernelBg)
	if thresh > 0 {
		global = math.MaxUint64 // unknown means over: look
		if wb.vmDirty != nil {
			if n, err := wb.vmDirty(); err == nil {
				global = n
			}
		}
	}
	wb.mu.Lock()
	wb.bgThresh, wb.globalDirty = thresh, global
	all := thresh > 0 && global >= thresh
	// Files the last check took but that were not written since are not
	// streaming any more.
	for _, in := range wb.streaming {
		if !in.Has(inode.Touched) || !consecutive {
			in.State &^= inode.Streaming | inode.Streaming2
		}
	}
	wb.streaming = shrink(wb.streaming)
	var probes []sampleProbe
	probed := map[*inode.Inode]bool{}
	rest := wb.touched[:0]
	for _, in := range wb.touched {
		if wb.inodes.Get(in.Key) != in || !in.Has(inode.Touched) {
			continue // forgotten meanwhile
		}
		if len(probes) >= maxSample {
			rest = append(rest, in)
			continue
		}
		in.State &^= inode.Touched
		// Written at the last two checks and since: three in a row.
		streaming := in.Has(inode.Streaming2) && cfg.RangeBytes > 0 && !wb.fallback[in.Key.Dev]
		if in.Has(inode.Streaming) {
			in.State |= inode.Streaming2
		}
		in.State |= inode.Streaming
		wb.streaming = append(wb.streaming, in)
		if (!streaming && !all) || in.Has(inode.Sync) || in.Has(inode.Busy) || !in.Has(inode.Dirty) {
			// Not looked at now (an attempt in flight will read it).
			continue
		}
		probed[in] = true
		probes = append(probes, sampleProbe{in: in, key: in.Key, path: in.Path(), handle: in.Handle(), streaming: streaming, rangeOff: wb.rangeOff[in.Key]})
	}
	// Files whose writeback was in flight at their last look, and that
	// no attempt looks at now: their count again.
	for in := range wb.underWB {
		if len(probes) >= maxSample {
			break
		}
		if probed[in] || in.Has(inode.Sync) || in.Has(inode.Busy) || wb.inodes.Get(in.Key) != in {
			continue
		}
		probes = append(probes, sampleProbe{in: in, key: in.Key, path: in.Path(), handle: in.Handle()})
	}
	clear(wb.touched[len(rest):])
	wb.touched = rest
	if cap(wb.touched) > 4096 && len(rest) < cap(wb.touched)/4 {
		wb.touched = append([]*inode.Inode(nil), rest...) // a burst's capacity is not kept
	}
	if len(probes) == 0 {
		wb.mu.Unlock()
		return
	}
	wb.sampling = true
	id := wb.calls.track(now)
	wb.mu.Unlock()
	chunk := wb.writeChunk()
	go func() {
		res := wb.runSample(probes, cfg, chunk)
		wb.mu.Lock()
		wb.calls.returned(id, 0)
		wb.sampling = false
		wb.sampled = res
		wb.mu.Unlock()
		wb.kick()
	}()
}

// runSample opens each probed file (as attempts do), reads cachestat and,
// for a streaming file that has grown by 2 × range_bytes past its range
// offset, starts writeback (sync_file_range WRITE) of what lies between
// that offset and its last range_bytes, at most chunk bytes of it and no
// more than the room under max_inflight_bytes (a writer faster than that
// per check is followed over several checks, and background work takes
// the rest; with no room it waits for the next check, counted in
// throttled). Runs off the
// device's goroutine.
func (wb *Writeback) runSample(probes []sampleProbe, cfg Config, chunk int64) []sampleResult {
	page := int64(os.Getpagesize())
	out := make([]sampleResult, 0, len(probes))
	for _, p := range probes {
		r := sampleResult{sampleProbe: p}
		f, _, err := wb.openFile(p.path, p.key, p.handle)
		if err != nil {
			out = append(out, r) // unknown: left as it was
			continue
		}
		d, w, err := f.Cachestat(0, 0)
		if err == nil {
			r.ok, r.before, r.dirty, r.wbp = true, d, d, w
		}
		// Only a streaming file needs its size (one fstat, when opened
		// by handle).
		size, off := int64(0), p.rangeOff
		if err == nil && p.streaming && d > 0 {
			if size, err = f.Size(); err != nil {
				size, err = 0, nil // its counts stand; no range writeback
			}
		}
		if off > size {
			off = 0 // truncated
		}
		room := int64(0)
		if err == nil && p.streaming && d > 0 && size-off > 2*cfg.RangeBytes {
			room = wb.inflightRoom(p.in, w, cfg.MaxInflight) / page * page
			if room <= 0 {
				wb.mu.Lock()
				wb.acct.throttled++
				wb.mu.Unlock()
			}
		}
		end := min((size-cfg.RangeBytes)/page*page, off+min(max(chunk, page)/page*page, room))
		if room > 0 && end > off {
			rd, _, cerr := f.Cachestat(off, end-off)
			if cerr == nil {
				if err := f.StartWriteback(off, end-off); err == nil {
					r.rangeEnd, r.ranged = end, rd
					if d2, w2, err := f.Cachestat(0, 0); err == nil {
						r.dirty, r.wbp = d2, w2
					}
				} else if blk.IsUnsupported(err) {
					r.unsupported = err
				}
			}
		}
		f.Close()
		out = append(out, r)
	}
	return out
}

// applySampleLocked takes in a sample's results: the files' page counts,
// their range offsets and the range writebacks' pages (BdiWritten). It
// returns the results that found sync_file_range unsupported, for
// useFdatasync. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) applySampleLocked(res []sampleResult) (unsupported []sampleResult) {
	for _, r := range res {
		if r.unsupported != nil {
			unsupported = append(unsupported, r)
		}
		in := r.in
		if wb.inodes.Get(r.key) != in || in.Has(inode.Sync) {
			continue // forgotten, or an attempt's count is newer
		}
		switch {
		case r.ok:
			wb.setPagesLocked(in, r.before, r.wbp) // the growth before the range writeback counts in BdiDirtied
			wb.setPagesLocked(in, r.dirty, r.wbp)
		case !r.streaming && in.WritebackPages > 0:
			// Its writeback cannot be followed (it cannot be opened
			// now): not counted as in flight any longer, or its last
			// count would hold the room under max_inflight_bytes
			// until its next attempt.
			wb.setPagesLocked(in, uint64(in.DirtyPages), 0)
		}
		if r.rangeEnd > 0 {
			wb.rangeOff[r.key] = r.rangeEnd
			wb.acct.rangeWritebacks++
			wb.acct.written += r.ranged
			// (Not inode.Wrote: that writeback's outcome is not known
			// here, and an integrity file found clean later must still
			// have its filesystem's error cursor read.)
		}
	}
	wb.gen++
	return unsupported
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
	bw := int64(wb.avgBandwidth) * 1024 // bytes/s
	c := min((bw/2+minAutoChunk)/minAutoChunk*minAutoChunk, maxAutoChunk)
	if wb.cfg.MaxInflight > 0 {
		c = min(c, max(wb.cfg.MaxInflight, 4096))
	}
	return c
}

// bandwidthInterval is the shortest period the write bandwidth is measured
// over (the kernel's BANDWIDTH_INTERVAL is 200ms), and bandwidthPeriod the
// smoothing period (roundup_pow_of_two(3 * HZ) jiffies at HZ=1000).
const (
	bandwidthInterval = 200 * time.Millisecond
	bandwidthPeriod   = 4096 * time.Millisecond
)

// updateBandwidth is __wb_update_bandwidth and wb_update_write_bandwidth:
// every bandwidthInterval or more while the device has dirty io, the bytes
// written since the last update, over the time since, are folded into
// write_bandwidth (BdiWriteBandwidth) with weight elapsed/period, and that
// into avg_write_bandwidth (auto write_chunk) with the kernel's extra
// smoothing. What is written is the device's completed writes, from
// /sys/dev/block/<bdi>/stat, for a block device; for another bdi (FUSE,
// NFS, btrfs), the pages flusherd's attempts wrote back. A period in which
// nothing was written is not counted, nor a long one that began so (the
// kernel skips such a period too): a file waiting on b_dirty does not
// wear the figure down to 0. Called on the device's goroutine.
func (wb *Writeback) updateBandwidth(now time.Duration) {
	wb.mu.Lock()
	has := wb.hasDirtyIOLocked()
	flusherdWritten := wb.acct.written * uint64(os.Getpagesize())
	wb.mu.Unlock()
	written := flusherdWritten
	if wb.diskWritten != nil {
		if n, err := wb.diskWritten(); err == nil {
			written = n
		} else if policy.Shortage(err) {
			// Out of descriptors or memory for a moment: this update
			// is skipped, the stat file read again at the next.
			return
		} else {
			wb.diskWritten = nil // not a block device: no stat file to read
			wb.log.Info("no block device statistics for this device: its write bandwidth (BdiWriteBandwidth, write_chunk = \"auto\") is measured from flusherd's own writeback", zap.Error(err))
			wb.bwStarted = false
		}
	}
	elapsed := now - wb.bwStamp
	idle := written == wb.bwWritten
	switch {
	case !wb.bwStarted:
		wb.bwStarted = true
	case elapsed < bandwidthInterval:
		return
	case idle, elapsed > time.Second && wb.bwIdle, !has && elapsed > time.Second:
		// Nothing written since the last stamp, or a period that
		// began idle and ran long (the kernel skips such a period:
		// its writes began somewhere in it): a new stamp, no rate. A
		// device that writes nothing has no bandwidth to measure,
		// not one of 0.
	default:
		wb.mu.Lock()
		wb.bandwidth, wb.avgBandwidth = writeBandwidth(wb.bandwidth, wb.avgBandwidth, written-min(written, wb.bwWritten), elapsed)
		wb.mu.Unlock()
	}
	wb.bwStamp, wb.bwWritten, wb.bwIdle = now, written, idle
}

// writeBandwidth is wb_update_write_bandwidth's arithmetic: given the
// old write_bandwidth and avg_write_bandwidth (kB/s) and the bytes
// written over elapsed, it returns the new ones.
func writeBandwidth(old, avg, written uint64, elapsed time.Duration) (bw, newAvg uint64) {
	rate := written * uint64(time.Second) / uint64(elapsed) / 1024 // kB/s
	if elapsed > bandwidthPeriod || (old == 0 && avg == 0) {
		// A period's worth, or the first figure (the kernel starts
		// from a guess, INIT_BW; flusherd from its first measurement).
		return rate, rate
	}
	bw = (rate*uint64(elapsed) + old*uint64(bandwidthPeriod-elapsed)) / uint64(bandwidthPeriod)
	newAvg = avg
	if newAvg > old && old >= bw {
		newAvg -= (newAvg - old) >> 3
	}
	if newAvg < old && old <= bw {
		newAvg += (old - newAvg) >> 3
	}
	return bw, newAvg
}
