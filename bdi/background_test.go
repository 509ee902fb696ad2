package bdi

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"flusherd/inode"
	"flusherd/tree"
)

// bgConfig is testConfig with a background threshold of thresh pages and
// range writeback off.
func bgConfig(thresh int64) Config {
	cfg := testConfig()
	cfg.DirtyBackgroundBytes = thresh * pg
	return cfg
}

// machineDirty makes the device read /proc/vmstat nr_dirty as n pages.
func machineDirty(n uint64) func(h *harness) {
	return func(h *harness) { h.wb.loop.vmDirty = func() (uint64, error) { return n, nil } }
}

// writeOrder returns the paths of the fake's writes (sync_file_range,
// fdatasync), in order, each once.
func writeOrder(fs *fakeFS) []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []string
	for _, c := range fs.calls {
		if (c.op == "sync_file_range" || c.op == "fdatasync") && !slices.Contains(out, c.path) {
			out = append(out, c.path)
		}
	}
	return out
}

// appendPages grows the file by n dirty pages (a writer appending).
func (f *fakeFile) appendPages(n int) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	first := (f.size + pg - 1) / pg
	for i := range int64(n) {
		f.dirty[first+i] = true
	}
	f.size = (first + int64(n)) * pg
}

// dirtyCount returns the file's dirty pages now.
func (f *fakeFile) dirtyCount() int {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return len(f.dirty)
}

// TestBackgroundThreshold: over dirty_background_bytes, the background
// check writes files that are not due, oldest first, and stops once the
// tracked files are under the threshold: of three files of 40 pages
// against 64, the two oldest are written (120 → 80 → 40), the newest is
// not. Nothing is written before the first check (100 ms), and the work
// is counted in background_works.
func TestBackgroundThreshold(t *testing.T) {
	withWB(t, bgConfig(64), func(h *harness) {
		t := h.t
		// Marked in an order that is neither path nor inode order.
		c := h.fs.add("/c", 3, 40*pg, 40)
		h.mark(c, time.Hour)
		time.Sleep(10 * time.Millisecond)
		a := h.fs.add("/a", 1, 40*pg, 40)
		h.mark(a, time.Hour)
		time.Sleep(10 * time.Millisecond)
		b := h.fs.add("/b", 2, 40*pg, 40)
		h.mark(b, time.Hour)
		synctest.Wait()
		if got := writeOrder(h.fs); len(got) != 0 {
			t.Fatalf("written before the background check: %v", got)
		}
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		got := writeOrder(h.fs)
		slices.Sort(got) // a batch's calls run in parallel
		if want := []string{"/a", "/c"}; !slices.Equal(got, want) {
			t.Errorf("background writes %v, want %v (oldest first, until under the threshold)", got, want)
		}
		if n := b.dirtyCount(); n != 40 {
			t.Errorf("the newest file has %d dirty pages, want 40 (the device is under the threshold without it)", n)
		}
		s := h.wb.Snapshot()
		if s.BackgroundWorks == 0 || s.BdiReclaimable != 40 {
			t.Errorf("background_works %d, BdiReclaimable %d; want > 0 and 40", s.BackgroundWorks, s.BdiReclaimable)
		}
		// Under the threshold from now on: no more background work.
		works := s.BackgroundWorks
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.BackgroundWorks != works || b.dirtyCount() != 40 {
			t.Errorf("under the threshold: background_works %d → %d, newest file %d dirty pages; want no change", works, s.BackgroundWorks, b.dirtyCount())
		}
	}, machineDirty(1<<20))
}

// TestBackgroundGate: while the whole machine's dirty pages (nr_dirty) are
// under the threshold, the tracked files cannot be over it: the check
// counts the files written (one open each) but starts no background work,
// however much they hold. Once nr_dirty is over, the same files are
// written.
func TestBackgroundGate(t *testing.T) {
	var global uint64 = 10
	withWB(t, bgConfig(64), func(h *harness) {
		t := h.t
		for i := range 4 {
			f := h.fs.add("/f"+string(rune('0'+i)), uint64(i+1), 40*pg, 40)
			h.mark(f, time.Hour)
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if opens := h.fs.callsOf("open", ""); len(opens) != 4 {
			t.Errorf("%d opens while nr_dirty was under the threshold, want 4 (one count of each file)", len(opens))
		}
		if s := h.wb.Snapshot(); s.BdiReclaimable != 160 || s.BackgroundWorks != 0 || len(writeOrder(h.fs)) != 0 {
			t.Fatalf("under nr_dirty: BdiReclaimable %d, background_works %d, writes %v; want 160, 0, none",
				s.BdiReclaimable, s.BackgroundWorks, writeOrder(h.fs))
		}
		h.wb.mu.Lock()
		global = 1 << 20
		h.wb.mu.Unlock()
		for i := range 4 { // written again
			h.wb.MarkInodeDirty(inode.Key{Dev: 7, Ino: uint64(i + 1)}, "/f"+string(rune('0'+i)), "", tree.Tree{Expire: time.Hour})
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if got := writeOrder(h.fs); len(got) != 3 {
			t.Errorf("over nr_dirty: background writes %v, want 3 files (160 → 40 pages, under 64)", got)
		}
	}, func(h *harness) {
		h.wb.loop.vmDirty = func() (uint64, error) {
			h.wb.mu.Lock()
			defer h.wb.mu.Unlock()
			return global, nil
		}
	})
}

// TestBackgroundYieldsToSync: a sync request queued while background work
// runs is served before the background work's next file: background work
// yields between inodes (writeback_sb_inodes' check of the work list).
func TestBackgroundYieldsToSync(t *testing.T) {
	cfg := bgConfig(8)
	cfg.MaxPending = 1 // each attempt is its own batch
	withWB(t, cfg, func(h *harness) {
		t := h.t
		var bg []*fakeFile
		for i := range 5 {
			f := h.fs.add("/bg"+string(rune('0'+i)), uint64(i+1), 16*pg, 16)
			f.onWrite = func() { time.Sleep(20 * time.Millisecond) }
			h.mark(f, time.Hour)
			time.Sleep(time.Millisecond)
			bg = append(bg, f)
		}
		urgent := h.fs.add("/urgent", 99, pg, 1)
		var w *Work
		bg[0].set(func(f *fakeFile) {
			f.onWrite = func() {
				time.Sleep(20 * time.Millisecond)
				w = &Work{SyncMode: SyncAll, Reason: "sync", Files: []FileRef{{Key: urgent.key, Path: urgent.path, Tree: tree.Tree{Expire: time.Hour}}}}
				h.wb.Queue(w)
			}
		})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		got := writeOrder(h.fs)
		i := slices.Index(got, "/urgent")
		if w == nil || i < 0 {
			t.Fatalf("writes %v: the sync request was not served", got)
		}
		// /bg0 was being written when it was queued; the plug's batch
		// of one may hold /bg1 as well, no more.
		if i > 2 {
			t.Errorf("writes %v: the sync request waited behind %d background files, want at most 2", got, i)
		}
		if len(got) < 5 {
			t.Errorf("writes %v: the background work did not go on after the sync", got)
		}
	}, machineDirty(1<<20))
}

// TestKupdateDuringBackground: a file that expires while a long background
// work writes a big file (16-page chunks, one per pass) is written before
// that work ends: each pass's queue_io takes the dirty list again.
func TestKupdateDuringBackground(t *testing.T) {
	cfg := bgConfig(64)
	cfg.WriteChunk = 16 * pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		big := h.fs.add("/big", 1, 4000*pg, 4000)
		big.onWrite = func() { time.Sleep(10 * time.Millisecond) }
		h.mark(big, time.Hour)
		time.Sleep(300 * time.Millisecond) // the background work runs
		synctest.Wait()
		small := h.fs.add("/small", 2, pg, 1)
		h.mark(small, 50*time.Millisecond)
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if n := small.dirtyCount(); n != 0 {
			t.Errorf("the expired file still has %d dirty pages during the background work", n)
		}
		if n := big.dirtyCount(); n < 64 {
			t.Fatalf("the big file is down to %d pages: the background work is over, the test shows nothing", n)
		}
	}, machineDirty(1<<20))
}

// TestRangeWriteback: a file appended 8 pages every 50 ms has what lies
// behind its last range_bytes (16 pages) written back once it has grown by
// 32 pages past the last range writeback: the ranges follow the writer
// (each starts where the last ended), never reach into the hot tail, and
// its dirty pages stay within 2 × range_bytes plus a check interval's
// growth, long before its expiry (an hour).
func TestRangeWriteback(t *testing.T) {
	cfg := testConfig()
	cfg.RangeBytes = 16 * pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/log", 1, 0, 0)
		maxDirty := 0
		type rng struct{ off, end, size int64 }
		var ranges []rng
		f.onWrite = func() {}
		for range 60 {
			f.appendPages(8)
			h.mark(f, time.Hour)
			time.Sleep(50 * time.Millisecond)
			synctest.Wait()
			maxDirty = max(maxDirty, f.dirtyCount())
		}
		f.fs.mu.Lock()
		size := f.size
		for _, c := range f.fs.calls {
			if c.op == "sync_file_range" {
				ranges = append(ranges, rng{c.off, c.off + c.n, 0})
			}
		}
		f.fs.mu.Unlock()
		if len(ranges) < 10 {
			t.Fatalf("%d range writebacks of a file grown to %d pages, want at least 10", len(ranges), size/pg)
		}
		for i, r := range ranges {
			if r.end > size-cfg.RangeBytes {
				t.Errorf("range %d [%d, %d) reaches into the last range_bytes of the file (size %d)", i, r.off, r.end, size)
			}
			if i > 0 && r.off != ranges[i-1].end {
				t.Errorf("range %d starts at %d, want %d (where the last ended)", i, r.off, ranges[i-1].end)
			}
		}
		if bound := 2*16 + 16; maxDirty > bound {
			t.Errorf("dirty pages peaked at %d, want at most %d (2 × range_bytes + 100 ms of writes)", maxDirty, bound)
		}
		if s := h.wb.Snapshot(); s.RangeWritebacks != uint64(len(ranges)) || s.BdiWritten == 0 {
			t.Errorf("range_writebacks %d (want %d), BdiWritten %d (want > 0)", s.RangeWritebacks, len(ranges), s.BdiWritten)
		}
	})
}

// TestRangeWritebackSkipsTheTail: a file written once, in one burst, is
// not streaming: counted once, no range writeback, whatever its size;
// neither is a file that stops growing (its tail is written at expiry,
// not before).
func TestRangeWritebackSkipsTheTail(t *testing.T) {
	cfg := testConfig()
	cfg.RangeBytes = 16 * pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		once := h.fs.add("/once", 1, 1000*pg, 1000)
		h.mark(once, time.Hour)
		time.Sleep(time.Second)
		synctest.Wait()
		if c := h.fs.callsOf("sync_file_range", "/once"); len(c) != 0 {
			t.Errorf("a file written once had %d range writebacks, want 0", len(c))
		}
		if opens := h.fs.callsOf("open", "/once"); len(opens) != 1 {
			t.Errorf("a file written once was opened %d times by background checks, want 1 (its count)", len(opens))
		}
		// Written in two checks, then no more: one range writeback,
		// leaving the last 16 pages, and nothing after.
		s := h.fs.add("/stops", 2, 0, 0)
		for range 3 {
			s.appendPages(40)
			h.mark(s, time.Hour)
			time.Sleep(60 * time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		calls := h.fs.callsOf("sync_file_range", "/stops")
		if len(calls) == 0 {
			t.Fatalf("no range writeback of a file written across checks")
		}
		last := calls[len(calls)-1]
		if end := last.off + last.n; end != 120*pg-cfg.RangeBytes {
			t.Errorf("the last range ends at page %d, want %d (all but the last range_bytes)", end/pg, 120-16)
		}
		if n := s.dirtyCount(); n != 16 {
			t.Errorf("%d dirty pages left, want the 16 of the tail (written at expiry)", n)
		}
	})
}

// TestCountsKeptOnFailure: an attempt that fails after reading the file's
// state (its write returns EROFS: an ext4 remounted read-only after an
// error) leaves BdiReclaimable at what it read, not 0; one that fails at
// open leaves the last known count.
func TestCountsKeptOnFailure(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 100 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/ro", 1, 8*pg, 8)
		f.writeErr = syscall.EROFS
		h.mark(f, 50*time.Millisecond)
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.BdiReclaimable != 8 || s.WritebackErrors == 0 {
			t.Fatalf("after a failed write: BdiReclaimable %d, errors %d; want 8, > 0", s.BdiReclaimable, s.WritebackErrors)
		}
		f.set(func(f *fakeFile) { f.openErr = syscall.EIO })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.BdiReclaimable != 8 {
			t.Errorf("after failed opens: BdiReclaimable %d, want the last known 8", s.BdiReclaimable)
		}
	})
}

// TestAutoWriteChunk: write_chunk = "auto" is writeback_chunk_size's rule:
// 4 MiB until the bandwidth is known, then half a second of it rounded
// down to 4 MiB after adding 4 MiB, at most 128 MiB and at most
// max_inflight.
func TestAutoWriteChunk(t *testing.T) {
	for _, tc := range []struct {
		avgKBps     uint64
		maxInflight int64
		want        int64
	}{
		{0, 0, 4 << 20},
		{40 * 1024, 0, 24 << 20},          // 20 MiB + 4 MiB
		{10 * 1024, 0, 8 << 20},           // 5 MiB + 4 → 9 → 8 MiB
		{1024 * 1024, 0, 128 << 20},       // 512 MiB: clamped
		{1024 * 1024, 16 << 20, 16 << 20}, // max_inflight
	} {
		cfg := testConfig()
		cfg.WriteChunkAuto, cfg.WriteChunk, cfg.MaxInflight = true, 1, tc.maxInflight
		wb := New("7:0", cfg, func() time.Duration { return 0 }, Files{Opener: newFakeFS(nil)}, nil, nil)
		wb.mu.Lock()
		wb.bw.avgKBps.Store(tc.avgKBps)
		wb.mu.Unlock()
		if got := wb.writeChunk(); got != tc.want {
			t.Errorf("avg %d kB/s, max_inflight %d: chunk %d, want %d", tc.avgKBps, tc.maxInflight, got, tc.want)
		}
	}
	cfg := testConfig()
	cfg.WriteChunk = 12345
	if got := New("7:0", cfg, nil, Files{Opener: newFakeFS(nil)}, nil, nil).writeChunk(); got != 12345 {
		t.Errorf("fixed write_chunk: %d, want 12345", got)
	}
}

// TestCountOnlyWhenChecksOff: with range writeback and the background
// threshold off, the check after files are written only counts them (one
// open and cachestat each, no write), and once they are counted the
// device wakes no more before the kupdate tick.
func TestCountOnlyWhenChecksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		epoch := time.Now()
		now := func() time.Duration { return time.Since(epoch) }
		fs := newFakeFS(now)
		wb := New("7:0", testConfig(), now, Files{Opener: fs}, nil, nil)
		ctx, cancel := context.WithCancel(context.Background())
		go wb.Run(ctx)
		defer func() { cancel(); <-wb.Stopped() }()
		for i := range 10 {
			f := fs.add("/f"+string(rune('0'+i)), uint64(i+1), 4*pg, 4)
			wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: time.Hour})
		}
		time.Sleep(time.Second)
		synctest.Wait()
		wb.mu.Lock()
		n := wb.bg.touched.Len()
		wb.mu.Unlock()
		if s := wb.Snapshot(); n != 0 || s.BdiReclaimable != 40 || len(fs.callsOf("open", "")) != 10 || len(writeOrder(fs)) != 0 {
			t.Errorf("touched %d, BdiReclaimable %d, %d opens, writes %v; want 0, 40, 10 and none",
				n, s.BdiReclaimable, len(fs.callsOf("open", "")), writeOrder(fs))
		}
		loops := wb.live.loops.Load()
		time.Sleep(time.Second)
		synctest.Wait()
		if wb.live.loops.Load() != loops {
			t.Errorf("loops %d → %d once the files were counted; want no wakeup before the kupdate tick", loops, wb.live.loops.Load())
		}
	})
}

// TestTouchedBacklog: a burst of more written files than one check
// samples is counted over several checks, maxSample at most each, in the
// order they were written, each once; what a check leaves waits in
// touched for the next.
func TestTouchedBacklog(t *testing.T) {
	const n = 2*maxSample + 100
	paths := make([]string, n)
	marked := func(h *harness) { // before the device's goroutine runs
		for i := range n {
			paths[i] = fmt.Sprintf("/f%05d", i)
			h.mark(h.fs.add(paths[i], uint64(i+1), pg, 1), time.Hour)
		}
	}
	withWB(t, testConfig(), func(h *harness) {
		var perCheck []int
		for range 10 {
			before := len(h.fs.callsOf("open", ""))
			time.Sleep(backgroundCheckInterval)
			synctest.Wait()
			if d := len(h.fs.callsOf("open", "")) - before; d > 0 {
				perCheck = append(perCheck, d)
			}
		}
		h.wb.mu.Lock()
		left := h.wb.bg.touched.Len()
		h.wb.mu.Unlock()
		if want := []int{maxSample, maxSample, 100}; !slices.Equal(perCheck, want) || left != 0 {
			t.Errorf("files counted per check %v, %d left; want %v, 0", perCheck, left, want)
		}
		var order []string
		for _, c := range h.fs.callsOf("open", "") {
			order = append(order, c.path)
		}
		if !slices.Equal(order, paths) {
			t.Errorf("files counted out of the order written (or not once each): %d opens", len(order))
		}
		if s := h.wb.Snapshot(); s.BdiReclaimable != n {
			t.Errorf("BdiReclaimable %d pages, want %d", s.BdiReclaimable, n)
		}
	}, marked)
}

// TestNoCountWhereCloseWrites: on a filesystem where a close writes the
// file back (FUSE), a check does not open a file written once to count
// it (its count waits for its attempt); it does open it over the
// background threshold, where background work needs the counts.
func TestNoCountWhereCloseWrites(t *testing.T) {
	for _, over := range []bool{false, true} {
		cfg := testConfig()
		if over {
			cfg = bgConfig(64)
		}
		withWB(t, cfg, func(h *harness) {
			f := h.fs.add("/f", 1, 4*pg, 4)
			h.mark(f, time.Hour)
			time.Sleep(time.Second)
			synctest.Wait()
			opens, s := len(h.fs.callsOf("open", "/f")), h.wb.Snapshot()
			if over && (opens != 1 || s.BdiReclaimable != 4) {
				h.t.Errorf("over the threshold: %d opens, BdiReclaimable %d; want 1 and 4", opens, s.BdiReclaimable)
			}
			if !over && (opens != 0 || s.BdiReclaimable != 0) {
				h.t.Errorf("%d opens, BdiReclaimable %d; want none before its attempt", opens, s.BdiReclaimable)
			}
		}, machineDirty(1<<20), func(h *harness) { h.wb.bg.closeWrites[7] = true })
	}
}

// TestRangeWritebackAtMostAChunk: a writer faster than write_chunk per
// check (64 pages per 50 ms, with write_chunk 16 pages) gets range
// writebacks of at most write_chunk each, one after the other, so one
// range writeback never puts a whole burst in flight.
func TestRangeWritebackAtMostAChunk(t *testing.T) {
	cfg := testConfig()
	cfg.RangeBytes, cfg.WriteChunk = 4*pg, 16*pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/fast", 1, 0, 0)
		for range 20 {
			f.appendPages(64)
			h.mark(f, time.Hour)
			time.Sleep(50 * time.Millisecond)
		}
		synctest.Wait()
		calls := h.fs.callsOf("sync_file_range", "/fast")
		if len(calls) < 5 {
			t.Fatalf("%d range writebacks, want at least 5", len(calls))
		}
		for i, c := range calls {
			if c.n <= 0 || c.n > cfg.WriteChunk {
				t.Errorf("range writeback %d writes %d bytes, want 1 to %d (write_chunk)", i, c.n, cfg.WriteChunk)
			}
			if i > 0 && c.off != calls[i-1].off+calls[i-1].n {
				t.Errorf("range writeback %d starts at %d, want %d", i, c.off, calls[i-1].off+calls[i-1].n)
			}
		}
	})
}

// TestStreamingNeedsConsecutiveChecks: a file written, then again a second
// later, is not streaming (no check saw it written in between), nor after
// one more write within the next check (a one-off write that spans a check
// boundary looks like that); written at a third check in a row, it is.
func TestStreamingNeedsConsecutiveChecks(t *testing.T) {
	cfg := testConfig()
	cfg.RangeBytes = 16 * pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/f", 1, 0, 0)
		f.appendPages(100)
		h.mark(f, time.Hour)
		time.Sleep(time.Second)
		f.appendPages(100)
		h.mark(f, time.Hour)
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if c := h.fs.callsOf("sync_file_range", "/f"); len(c) != 0 {
			t.Fatalf("range writeback of a file written twice a second apart: %v", c)
		}
		f.appendPages(100)
		h.mark(f, time.Hour)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if c := h.fs.callsOf("sync_file_range", "/f"); len(c) != 0 {
			t.Fatalf("written at two checks in a row: %d range writebacks, want 0", len(c))
		}
		f.appendPages(100)
		h.mark(f, time.Hour)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if c := h.fs.callsOf("sync_file_range", "/f"); len(c) != 1 {
			t.Errorf("written at three checks in a row: %d range writebacks, want 1", len(c))
		}
	})
}

// TestThrottleRetry: files deferred by max_inflight_bytes are retried after
// the time half the bound takes to drain at the device's bandwidth, within
// [5 ms, 50 ms]; 50 ms while the bandwidth is not known.
func TestThrottleRetry(t *testing.T) {
	for _, tc := range []struct {
		kBps     uint64
		inflight int64
		target   time.Duration
		want     time.Duration
	}{
		{0, 16 << 20, 0, 50 * time.Millisecond},
		{40 * 1024, 2 << 20, 0, 25 * time.Millisecond},      // 1 MiB at 40 MiB/s
		{40 * 1024, 16 << 20, 0, 50 * time.Millisecond},     // 200 ms: capped
		{4 << 20, 2 << 20, 0, 5 * time.Millisecond},         // 4 GiB/s: floor
		{40 * 1024, 0, 0, 50 * time.Millisecond},            // no bound
		{0, 16 << 20, 25 * time.Millisecond, paceBurst / 2}, // paced: half the bucket
	} {
		cfg := testConfig()
		cfg.MaxInflight = tc.inflight
		cfg.TargetLatency = tc.target
		wb := New("7:0", cfg, nil, Files{Opener: newFakeFS(nil)}, nil, nil)
		wb.mu.Lock()
		wb.bw.avgKBps.Store(tc.kBps)
		got := wb.throttleRetryLocked()
		wb.mu.Unlock()
		if got != tc.want {
			t.Errorf("%d kB/s, max_inflight %d: retry after %v, want %v", tc.kBps, tc.inflight, got, tc.want)
		}
	}
}

// TestBackgroundLeavesTheRestToExpiry: a big file written in chunks by
// background work keeps what is left under the threshold once the work
// stops: kupdate, which takes b_more_io whatever its age, does not go on
// with it (the work put it back on b_dirty, at its age).
func TestBackgroundLeavesTheRestToExpiry(t *testing.T) {
	cfg := bgConfig(64)
	cfg.WriteChunk = 16 * pg
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		t := h.t
		big := h.fs.add("/big", 1, 200*pg, 200)
		h.mark(big, time.Hour)
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		left := big.dirtyCount()
		if left == 0 || left > 64 {
			t.Fatalf("after the background work: %d dirty pages, want 1 to 64", left)
		}
		time.Sleep(5 * time.Second) // five kupdate ticks
		synctest.Wait()
		if n := big.dirtyCount(); n != left {
			t.Errorf("kupdate went on with a file that is not due: %d dirty pages, then %d", left, n)
		}
		if l := h.lists()["/big"]; l != "b_dirty" {
			t.Errorf("the file is on %s, want b_dirty (waiting for its expiry)", l)
		}
	}, machineDirty(1<<20))
}

// TestKupdateLeavesRedirtiedBackgroundFiles: files that background work
// took before they were due and that were written during their attempts
// (redirtied: b_more_io_wait, retried early by kupdate) are not written to
// the end by kupdate once the device is under its threshold: kupdate puts
// them back on b_dirty, at their age.
func TestKupdateLeavesRedirtiedBackgroundFiles(t *testing.T) {
	cfg := bgConfig(64)
	cfg.WriteChunk = 16 * pg
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		t := h.t
		var files []*fakeFile
		for i := range 3 {
			f := h.fs.add("/f"+string(rune('0'+i)), uint64(i+1), 60*pg, 60)
			f.onWrite = func() { h.mark(f, time.Hour) } // a write during each attempt
			h.mark(f, time.Hour)
			time.Sleep(time.Millisecond)
			files = append(files, f)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		total := func() int {
			n := 0
			for _, f := range files {
				n += f.dirtyCount()
			}
			return n
		}
		left := total()
		if left == 0 || left > 64 {
			t.Fatalf("after the background work: %d dirty pages, want 1 to 64", left)
		}
		time.Sleep(5 * time.Second) // kupdate ticks, and early retries of b_more_io_wait
		synctest.Wait()
		if n := total(); n != left {
			t.Errorf("kupdate went on with files that are not due: %d dirty pages, then %d", left, n)
		}
	}, machineDirty(1<<20))
}

// TestInflightCountsFollowed: a file left on b_dirty by background work
// right after its last chunk was written (pages under writeback then) has
// its count read again by the background checks until its writeback is
// done: inflight_bytes and BdiWriteback go back to 0, and its stale count
// does not hold the room under max_inflight_bytes.
func TestInflightCountsFollowed(t *testing.T) {
	cfg := bgConfig(64)
	cfg.WriteChunk = 16 * pg
	cfg.MaxInflight = 16 * pg
	cfg.RangeBytes = 1 << 20 // checks on, as by default
	withWB(t, cfg, func(h *harness) {
		t := h.t
		big := h.fs.add("/big", 1, 200*pg, 200)
		h.mark(big, time.Hour)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := big.dirtyCount(); n == 0 || n > 64 {
			t.Fatalf("after the background work: %d dirty pages, want 1 to 64", n)
		}
		s := h.wb.Snapshot()
		if s.InflightBytes != 0 || s.BdiWriteback != 0 {
			t.Errorf("inflight_bytes %d, BdiWriteback %d pages after the writeback ended; want 0 and 0", s.InflightBytes, s.BdiWriteback)
		}
		if room := h.wb.inflightRoom(nil, 0, cfg.MaxInflight); room != cfg.MaxInflight {
			t.Errorf("room under max_inflight_bytes %d, want all of it (%d)", room, cfg.MaxInflight)
		}
	}, machineDirty(1<<20))
}

// probingConfig is testConfig with a 200 ms kupdate period and a 1 s
// longest pause, for the probing tests.
func probingConfig() Config {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 200 * time.Millisecond
	cfg.MaxPause = time.Second
	return cfg
}

// deadDevice adds n files whose opens fail with ENOTCONN (a FUSE server
// that died), marks them, and waits until the device is probing.
func deadDevice(h *harness, n int) []*fakeFile {
	h.t.Helper()
	var files []*fakeFile
	for i := range n {
		f := h.fs.add(fmt.Sprintf("/f%02d", i), uint64(i+1), pg, 1)
		f.openErr = syscall.ENOTCONN
		h.mark(f, 100*time.Millisecond)
		files = append(files, f)
	}
	time.Sleep(2 * time.Second)
	synctest.Wait()
	if s := h.wb.Snapshot(); s.Probing != 1 {
		h.t.Fatalf("probing = %d after every retry failed with ENOTCONN, want 1", s.Probing)
	}
	return files
}

// revive makes the files' device answer again, each write taking delay.
func revive(files []*fakeFile, delay time.Duration) {
	for _, f := range files {
		f.set(func(f *fakeFile) {
			f.openErr = nil
			f.onWrite = func() { time.Sleep(delay) }
		})
	}
}

// TestProbingDeadDevice: when every retry of a work fails with one
// device-level error (20 files whose opens fail with ENOTCONN: a FUSE
// server that died), the device goes probing: each pause retries one file,
// not 20 (a file dirtied meanwhile is one of the probes). When the probe
// gets through, every waiting file is retried at once, and probing ends.
func TestProbingDeadDevice(t *testing.T) {
	withWB(t, probingConfig(), func(h *harness) {
		t := h.t
		files := deadDevice(h, 20)
		if infos := h.wb.Inodes(); len(infos) == 0 || !infos[0].Probing {
			t.Errorf("flusherd dirty's view does not say the device is probing: %+v", infos)
		}
		late := h.fs.add("/late", 99, pg, 1) // dirtied while probing
		late.openErr = syscall.ENOTCONN
		h.mark(late, 100*time.Millisecond)
		before := len(h.fs.callsOf("open", ""))
		time.Sleep(5 * time.Second) // at max_pause: about 5 retries
		synctest.Wait()
		if n := len(h.fs.callsOf("open", "")) - before; n == 0 || n > 7 {
			t.Errorf("%d opens in 5 s of probing, want one per pause (1 to 7)", n)
		}
		for _, f := range files {
			f.set(func(f *fakeFile) { f.openErr = nil })
		}
		late.set(func(f *fakeFile) { f.openErr = nil })
		time.Sleep(1500 * time.Millisecond) // one pause for the probe, then all
		synctest.Wait()
		if n := h.wb.Tracked(); n != 0 {
			t.Errorf("%d files still tracked 1.5 s after the device came back, want 0", n)
		}
		if s := h.wb.Snapshot(); s.Probing != 0 {
			t.Errorf("probing = %d after the device came back, want 0", s.Probing)
		}
	})
}

// TestProbingNeedsOneDeviceError: failures that are the files' own, or
// device-level errors of two kinds, or a single file, do not make a device
// probe: each waiting file keeps being retried.
func TestProbingNeedsOneDeviceError(t *testing.T) {
	for _, tc := range []struct {
		name string
		errs []error
	}{
		{"EAGAIN", []error{syscall.EAGAIN, syscall.EAGAIN, syscall.EAGAIN}},
		{"mixed", []error{syscall.ENOTCONN, syscall.EAGAIN, syscall.ENOTCONN}},
		{"two device errors", []error{syscall.ENOTCONN, syscall.ENODEV, syscall.ENOTCONN}},
		{"one file", []error{syscall.ENOTCONN}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withWB(t, probingConfig(), func(h *harness) {
				for i, err := range tc.errs {
					f := h.fs.add(fmt.Sprintf("/f%d", i), uint64(i+1), pg, 1)
					f.openErr = err
					h.mark(f, 100*time.Millisecond)
				}
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if s := h.wb.Snapshot(); s.Probing != 0 {
					h.t.Errorf("probing = %d, want 0", s.Probing)
				}
			})
		})
	}
}

// TestProbingDetachedCallTellsNothing: on a probing device, a probe whose
// call is left to its worker (detached after 100 ms: the device is slow
// or stalled) does not end probing; its return, and the retry that gets
// through, do.
func TestProbingDetachedCallTellsNothing(t *testing.T) {
	withWB(t, probingConfig(), func(h *harness) {
		t := h.t
		files := deadDevice(h, 3)
		revive(files, 3*time.Second)
		time.Sleep(1500 * time.Millisecond) // a probe was made and detached
		synctest.Wait()
		if h.wb.Snapshot().DetachedCalls == 0 {
			t.Fatalf("no call was detached: the test shows nothing")
		}
		if s := h.wb.Snapshot(); s.Probing != 1 {
			t.Errorf("probing = %d while the probe's call is detached, want 1", s.Probing)
		}
		for _, f := range files {
			f.set(func(f *fakeFile) { f.onWrite = nil })
		}
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.Probing != 0 || h.wb.Tracked() != 0 {
			t.Errorf("after the call returned: probing %d, %d files tracked; want 0, 0", s.Probing, h.wb.Tracked())
		}
	})
}

// TestProbingLetsHealthyFilesThrough: two files that fail with EIO on
// open (a FUSE server that cannot serve those two objects) make the device
// probe; files written afterwards, which the device serves, are probed
// first once expired, get through, and end probing: they are not held
// behind the two failing ones.
func TestProbingLetsHealthyFilesThrough(t *testing.T) {
	withWB(t, probingConfig(), func(h *harness) {
		t := h.t
		for i := range 2 {
			f := h.fs.add(fmt.Sprintf("/bad%d", i), uint64(i+1), pg, 1)
			f.openErr = &os.PathError{Op: "open_by_handle_at", Path: "h", Err: syscall.EIO}
			h.mark(f, 100*time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.Probing != 1 {
			t.Fatalf("probing = %d after two EIO opens, want 1", s.Probing)
		}
		var good []*fakeFile
		for i := range 10 {
			f := h.fs.add(fmt.Sprintf("/good%d", i), uint64(10+i), pg, 1)
			h.mark(f, 100*time.Millisecond)
			good = append(good, f)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		for _, f := range good {
			if n := f.dirtyCount(); n != 0 {
				t.Errorf("%s still has %d dirty pages 3 s after its write: held behind the probing", f.path, n)
			}
		}
	})
}

// TestProbingEndsOnASlowReturn: a probe that is left to its worker (the
// device answers, but slower than 100 ms) ends probing when its call
// returns without a device-level error.
func TestProbingEndsOnASlowReturn(t *testing.T) {
	withWB(t, probingConfig(), func(h *harness) {
		t := h.t
		files := deadDevice(h, 5)
		revive(files, 150*time.Millisecond)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.Probing != 0 || s.DetachedCalls == 0 {
			t.Errorf("probing = %d, detached_calls %d after slow calls returned; want 0 and some", s.Probing, s.DetachedCalls)
		}
	})
}

// TestKupdateLeavesWhatBackgroundWorkLeftOnBIO: files that background
// work's queue_io took onto b_io, before they were due, and that the work
// ended without attempting (its pages went on files spliced from
// b_more_io_wait, which its budget does not count), are not written by
// kupdate, which finds them on b_io: they go back to b_dirty, at their
// age, until they expire or background work takes them again. (A burst on
// a busy machine had the newest of four files written by kupdate an hour
// before its expiry.)
func TestKupdateLeavesWhatBackgroundWorkLeftOnBIO(t *testing.T) {
	cfg := bgConfig(40)
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		t := h.t
		a := h.fs.add("/a", 1, 20*pg, 20)
		b := h.fs.add("/b", 2, 30*pg, 30)
		h.mark(a, time.Hour)
		time.Sleep(time.Millisecond)
		h.mark(b, time.Hour)
		synctest.Wait()
		// The state such a work leaves: both on b_io, not attempted.
		h.wb.mu.Lock()
		h.wb.queueIOLocked(&Work{ForBackground: true, NrPages: 1 << 20, Reason: "background"}, h.now())
		n := h.wb.BIO.Len()
		h.wb.mu.Unlock()
		if n != 2 {
			t.Fatalf("background queue_io took %d files onto b_io, want 2", n)
		}
		time.Sleep(3 * time.Second) // three kupdate ticks
		synctest.Wait()
		for _, f := range []*fakeFile{a, b} {
			if n := f.dirtyCount(); n != int(f.size/pg) {
				t.Errorf("%s has %d dirty pages, want %d: written an hour before its expiry", f.path, n, f.size/pg)
			}
			if l := h.lists()[f.path]; l != "b_dirty" {
				t.Errorf("%s is on %s, want b_dirty (waiting for its expiry)", f.path, l)
			}
		}
	}, machineDirty(0))
}

// TestRangeWritebackWindowGrowsOnAFastDevice: a writer faster than one
// window per check, on a device that finishes each range at once: the
// ranges cut short by the window count as held back, the drain the ranges
// measure is short, so the window grows to its ceiling and the ranges keep
// up with the writer. On a device that has not finished a range half the
// target later, the window does not grow.
func TestRangeWritebackWindowGrowsOnAFastDevice(t *testing.T) {
	for _, fast := range []bool{true, false} {
		cfg := testConfig()
		cfg.RangeBytes, cfg.WriteChunk = 256*pg, 64<<20
		cfg.TargetLatency, cfg.MaxInflight = 25*time.Millisecond, 16<<20
		withWB(t, cfg, func(h *harness) {
			t := h.t
			f := h.fs.add("/stream", 1, 0, 0)
			// Slow: what is under writeback completes only at the
			// writer's next step, 100 ms on.
			f.fastDevice, f.holdWriteback = fast, !fast
			for range 30 {
				f.appendPages(2048) // 8 MiB per 100 ms
				h.mark(f, time.Hour)
				time.Sleep(100 * time.Millisecond)
				f.set(func(f *fakeFile) { f.writeback = 0 })
			}
			synctest.Wait()
			calls := h.fs.callsOf("sync_file_range", "/stream")
			if len(calls) < 10 {
				t.Fatalf("fast %v: %d range writebacks, want at least 10", fast, len(calls))
			}
			last := calls[len(calls)-1].n
			window := h.wb.window.size()
			if fast && (window != 16<<20 || last < 4<<20) {
				t.Errorf("fast device: window %d, last range %d bytes; want the ceiling (%d) and ranges of the writer's 8 MiB a check", window, last, 16<<20)
			}
			if !fast && (window > windowStart || last > windowStart) {
				t.Errorf("a device that has not finished: window %d, last range %d bytes; want at most %d", window, last, windowStart)
			}
		})
	}
}
