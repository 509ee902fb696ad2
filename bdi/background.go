package bdi

import (
	"math"
	"os"
	"time"

	"go.uber.org/zap"

	"flusherd/blk"
	"flusherd/inode"
)

// backgroundCheckInterval is how often a device with freshly written files
// looks at them (wbCheckBackgroundFlush): the background threshold and
// range writeback act within it. The kernel checks its background threshold
// from the writers' side (balance_dirty_pages, every few dirtied pages);
// flusherd learns of writes from the watcher, and checks at most this
// often, and only while files are being written.
const backgroundCheckInterval = 100 * time.Millisecond

// maxSample bounds the files one check opens: the rest wait for the next.
// A file costs about 7 µs by handle and 14 µs by path on ext4
// (BenchmarkSampleReal), so a full sample takes 15–30 ms, within the
// check interval, and a copy of 11,000 files is counted within about
// 0.6 s of its writes.
const maxSample = 2048

// shrink empties a list of inodes for reuse, keeping its capacity unless
// a burst made it large.
func shrink(l []*inode.Inode) []*inode.Inode {
	if cap(l) > 4096 {
		return nil
	}
	clear(l)
	return l[:0]
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
	return wb.bg.thresh > 0 && wb.acct.dirtySum > wb.bg.thresh && wb.bg.globalDirty > wb.bg.thresh
}

// readThresholds reads the device's background threshold (bgThreshold,
// with the kernel's when dirty_background_ratio is set) and, when there is
// one, the machine's dirty pages (/proc/vmstat nr_dirty; unknown reads as
// over). Pages. Called on the device's goroutine, without the list lock.
func (wb *Writeback) readThresholds(cfg Config) (thresh, global uint64) {
	var kernelBg uint64
	if cfg.DirtyBackgroundRatio > 0 && wb.loop.thresholds != nil {
		if _, b, err := wb.loop.thresholds(); err == nil {
			kernelBg = b
		}
	}
	thresh = wb.bgThreshold(cfg, kernelBg)
	if thresh > 0 {
		global = math.MaxUint64 // unknown means over: look
		if wb.loop.vmDirty != nil {
			if n, err := wb.loop.vmDirty(); err == nil {
				global = n
			}
		}
	}
	return thresh, global
}

// startSample picks the files to look at (see wbCheckBackgroundFlush) and
// runs the sample on a goroutine of its own, as a call off the device's
// goroutine (counted in stuck_calls past attempt_timeout: an open on a
// stalled filesystem). Its results are taken in by the next check.
func (wb *Writeback) startSample(now time.Duration, consecutive bool) {
	wb.mu.Lock()
	cfg := wb.cfg
	wb.mu.Unlock()
	thresh, global := wb.readThresholds(cfg)
	wb.mu.Lock()
	wb.bg.thresh, wb.bg.globalDirty = thresh, global
	all := thresh > 0 && global >= thresh
	if wb.acct.stuck+wb.calls.running() >= maxStuckCalls {
		// The filesystem holds maxStuckCalls calls already: no sample
		// (its open would be one more) until some return; the written
		// files wait for a later check.
		wb.mu.Unlock()
		return
	}
	// Files the last check took but that were not written since are not
	// streaming any more.
	for _, in := range wb.bg.streaming {
		if !in.Has(inode.Touched) || !consecutive {
			in.State &^= inode.Streaming | inode.Streaming2
		}
	}
	wb.bg.streaming = shrink(wb.bg.streaming)
	// The results are made here, probes filled in, and the last
	// sample's storage is reused: a sample allocates nothing per file.
	probes := wb.bg.spare[:0]
	wb.bg.spare = nil
	for len(probes) < maxSample {
		in, ok := wb.bg.touched.Pop()
		if !ok {
			break
		}
		k := in.Key()
		if wb.inodes.Get(k) != in || !in.Has(inode.Touched) {
			continue // forgotten meanwhile
		}
		in.State &^= inode.Touched
		// Written at the last two checks and since: three in a row.
		streaming := in.Has(inode.Streaming2) && cfg.RangeBytes > 0 && !wb.loop.fallback[k.Dev]
		if in.Has(inode.Streaming) {
			in.State |= inode.Streaming2
		}
		in.State |= inode.Streaming
		wb.bg.streaming = append(wb.bg.streaming, in)
		if in.Has(inode.Sync) || in.Has(inode.Busy) || !in.Has(inode.Dirty) {
			// Not looked at now (an attempt in flight will read it).
			continue
		}
		if !streaming && !all && wb.bg.closeWrites[k.Dev] {
			// Its close would write it back: counted at its attempt.
			continue
		}
		probes = append(probes, sampleResult{sampleProbe: sampleProbe{in: in, key: k, path: in.PathRef(), handle: in.Handle(),
			streaming: streaming, rangeOff: wb.bg.rangeOff[k]}})
	}
	// Files whose writeback was in flight at their last look, and that
	// no attempt looks at now: their count again.
	var probed map[*inode.Inode]bool
	if len(wb.bg.underWB) > 0 && len(probes) < maxSample {
		probed = make(map[*inode.Inode]bool, len(probes))
		for _, p := range probes {
			probed[p.in] = true
		}
	}
	for in := range wb.bg.underWB {
		if len(probes) >= maxSample {
			break
		}
		if probed[in] || in.Has(inode.Sync) || in.Has(inode.Busy) || wb.inodes.Get(in.Key()) != in {
			continue
		}
		probes = append(probes, sampleResult{sampleProbe: sampleProbe{in: in, key: in.Key(), path: in.PathRef(), handle: in.Handle(),
			expire: wb.bDirty.classes[in.Class].expire}})
	}
	if len(probes) == 0 {
		wb.bg.spare = probes
		wb.mu.Unlock()
		return
	}
	wb.bg.sampling = true
	id := wb.calls.track(now)
	wb.mu.Unlock()
	chunk := wb.writeChunk()
	go func() {
		res := wb.runSample(probes, cfg, chunk)
		for _, r := range res {
			if r.closeErr != nil && wb.verifies() {
				wb.closeReturned(closeNote{report: true, key: r.key, path: r.path.String(), handle: r.handle, expire: r.expire}, r.closeErr)
			}
		}
		wb.mu.Lock()
		wb.calls.returned(id, 0)
		wb.bg.sampling = false
		wb.bg.sampled = res
		wb.mu.Unlock()
		wb.live.kick()
	}()
}

// runSample opens each probed file (as attempts do), reads cachestat and,
// for a streaming file that has grown by 2 × range_bytes past its range
// offset, starts writeback (sync_file_range WRITE) of what lies between
// that offset and its last range_bytes, at most chunk bytes of it and no
// more than the room under max_inflight_bytes (a writer faster than that
// per check is followed over several checks, and background work takes
// the rest; with no room it waits for the next check, counted in
// throttled). It fills in each result of res, whose sampleProbe is set,
// and returns res. Runs off the device's goroutine.
func (wb *Writeback) runSample(res []sampleResult, cfg Config, chunk int64) []sampleResult {
	page := int64(os.Getpagesize())
	timed := cfg.TargetLatency <= 0 // one range timed per sample (rangeDrain)
	for i := range res {
		r := &res[i]
		p := &r.sampleProbe
		f, _, err := wb.openFileRef(p.path, p.key, p.handle)
		if err != nil {
			continue // unknown: left as it was
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
		want := min((size-cfg.RangeBytes)/page*page-off, max(chunk, page)/page*page)
		if err == nil && p.streaming && d > 0 && size-off > 2*cfg.RangeBytes {
			var window int64
			room, window = wb.startRoom(p.in, w, wb.window.size(), backgroundCheckInterval)
			switch {
			case room >= want:
			case room == window:
				// Held back by the window (no room, or less than
				// it wanted): counted, so that the window is
				// judged.
				wb.mu.Lock()
				wb.acct.throttled++
				wb.mu.Unlock()
			default:
				wb.pace.held() // by the pace
			}
		}
		end := off + min(want, room)
		if room > 0 && end > off {
			rd, _, cerr := f.Cachestat(off, end-off)
			if cerr == nil {
				start := wb.now()
				if err := f.StartWriteback(off, end-off); err == nil {
					r.rangeEnd, r.ranged = end, rd
					n := uint64((end - off) / page)
					if d2, w2, err := f.Cachestat(0, 0); err == nil {
						r.dirty, r.wbp = d2, w2
						n = max(n, d-min(d, d2))
					}
					wb.charge(n)
					if !timed && rd > 0 {
						timed = true
						r.drain = wb.rangeDrain(f, off, end-off, rd, start, cfg.TargetLatency)
					}
				} else if blk.IsUnsupported(err) {
					r.unsupported = err
				}
			}
		}
		r.closeErr = f.Close()
	}
	return res
}

// rangeDrain measures how long the device takes to write a range that
// was just put under writeback (at start, daemon clock; pages of
// [off, off+n) were dirty): it looks at the range again half the target
// (target_latency) later, and the drain time is the time since start over the part
// of the pages written by then; all written, it is under that time (half
// of it is returned); none, twice the target. It is the wait of another
// program's write queued behind the range, measured rather than taken as
// the bytes over the device's rate, which on a device that flusherd does
// not keep busy is the rate flusherd gave it, not what it can do (as
// blk-wbt times its requests' completions: block/blk-wbt.c,
// wb_timer_fn). 0: not measured (the look failed).
func (wb *Writeback) rangeDrain(f inode.File, off, n int64, pages uint64, start, target time.Duration) time.Duration {
	t := time.NewTimer(target/2 - (wb.now() - start))
	defer t.Stop()
	select {
	case <-t.C:
	case <-wb.live.stopped:
		return 0
	}
	_, left, err := f.Cachestat(off, n)
	el := wb.now() - start
	switch {
	case err != nil || el <= 0:
		return 0
	case left == 0:
		return max(el/2, 1)
	case left >= pages:
		return 2 * target
	}
	return time.Duration(float64(el) * float64(pages) / float64(pages-left))
}

// applySampleLocked takes in, at now (daemon clock), a sample's results:
// the files' page counts, their range offsets and the range writebacks'
// pages (BdiWritten). It returns the results that found sync_file_range
// unsupported, for useFdatasync. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) applySampleLocked(res []sampleResult, now time.Duration) (unsupported []sampleResult) {
	for _, r := range res {
		if r.unsupported != nil {
			unsupported = append(unsupported, r)
		}
		in := r.in
		if _, taken := wb.bg.taken[in]; taken || wb.inodes.Get(r.key) != in || in.Has(inode.Sync) {
			continue // forgotten, or an attempt's count is newer
		}
		switch {
		case r.ok:
			wb.ownSyncfsWroteLocked(in, r.before, r.wbp, now, now)
			wb.setPagesLocked(in, r.before, r.wbp) // the growth before the range writeback counts in BdiDirtied
			wb.setPagesLocked(in, r.dirty, r.wbp)
		case !r.streaming && in.WritebackPages > 0:
			// Its writeback cannot be followed (it cannot be opened
			// now): not counted as in flight any longer, or its last
			// count would hold the room under max_inflight_bytes
			// until its next attempt.
			wb.setPagesLocked(in, uint64(in.DirtyPages), 0)
		}
		wb.bg.drain = max(wb.bg.drain, r.drain)
		if r.rangeEnd > 0 {
			wb.bg.rangeOff[r.key] = r.rangeEnd
			wb.acct.rangeWritebacks++
			wb.startedLocked(in, r.ranged, false, now)
			// (Not inode.Wrote: that writeback's outcome is not known
			// here, and an integrity file found clean later must still
			// have its filesystem's error cursor read.)
		}
	}
	clear(wb.bg.taken)
	wb.gen++
	return unsupported
}

// updateBandwidth gives the device's bandwidth estimator (bw) what it
// measures: whether the device has dirty io, and the bytes flusherd's
// attempts wrote back. Called on the device's goroutine.
func (wb *Writeback) updateBandwidth(now time.Duration) {
	wb.mu.Lock()
	has := wb.hasDirtyIOLocked()
	flusherdWritten := wb.acct.written * uint64(os.Getpagesize())
	wb.mu.Unlock()
	if !wb.bw.update(now, has, flusherdWritten, wb.log) {
		return
	}
	wb.mu.Lock()
	inflight := int64(wb.acct.wbSum) * int64(os.Getpagesize())
	throttled := wb.acct.throttled
	drain := wb.bg.drain
	wb.bg.drain = 0
	wb.mu.Unlock()
	windowLimited := throttled != wb.loop.windowThrottled
	window0, pace0 := wb.window.size(), wb.pace.Rate()
	_, queued := wb.window.update(wb.bw.inst, inflight, drain, windowLimited)
	wb.loop.windowThrottled = throttled
	paceLimited := wb.pace.period(now)
	if wb.window.target > 0 {
		// A period held by a window that drains in under half the
		// target is not the device's limit: its rate says nothing
		// of the device's speed.
		wb.pace.setRate(now, wb.paceCtl.update(wb.bw.elapsed, wb.bw.inst, windowLimited && queued, paceLimited))
	}
	if window0 == wb.window.size() && pace0 == wb.pace.Rate() {
		return
	}
	if ce := wb.log.Check(zap.DebugLevel, "in-flight window or pace changed"); ce != nil {
		ce.Write(zap.Duration("elapsed", wb.bw.elapsed), zap.Uint64("rate", wb.bw.inst), zap.Int64("inflight", inflight),
			zap.Duration("drain", drain), zap.Bool("window_limited", windowLimited), zap.Bool("queued", queued),
			zap.Bool("pace_limited", paceLimited), zap.Int64("window", wb.window.size()), zap.Float64("pace", wb.pace.Rate()))
	}
}
