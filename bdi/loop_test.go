package bdi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/tree"
)

// TestErrorLogSampled: the rate-limited log keeps the first 5 lines of a
// message per 10 s and drops the rest.
func TestErrorLogSampled(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	wb := New("7:0", testConfig(), func() time.Duration { return 0 }, Files{Opener: newFakeFS(func() time.Duration { return 0 })}, zap.New(core), nil)
	for i := range 8 {
		wb.errLog.Warn("writeback failed", zap.Int("i", i))
		time.Sleep(time.Millisecond)
	}
	if n := logs.Len(); n != 5 {
		t.Errorf("%d of 8 lines within 10 s logged, want 5", n)
	}
}

// TestLoopStall: loop_stall_max_us is the longest time the device's
// goroutine, awake, went without a sign of life: here a chunked attempt's
// 50 ms open, which it waits for.
func TestLoopStall(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.WriteChunk = 4 * pg
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/big", 1, 10*pg, 10)
		f.onOpen = func() { time.Sleep(50 * time.Millisecond) }
		h.mark(f, 0)
		h.wb.mu.Lock()
		h.wb.inodes.Get(f.key).DirtyPages = 10
		h.wb.mu.Unlock()
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if us := h.wb.Snapshot().LoopStallMaxUs; us != 50000 {
			h.t.Errorf("loop_stall_max_us = %d, want 50000", us)
		}
	})
}

// TestSetConfigClampsPause: a reload that lowers max_pause below the
// current backoff pause cuts the pause to it at once, not after the next
// retry.
func TestSetConfigClampsPause(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.MinPause = 100 * time.Millisecond
	cfg.MaxPause = 10 * time.Second
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/a", 1, pg, 1)
		f.writeErr = syscall.EAGAIN
		h.mark(f, 0)
		for h.wb.Snapshot().RetryPauseMs < 3200 {
			time.Sleep(100 * time.Millisecond)
		}
		low := cfg
		low.MaxPause = 500 * time.Millisecond
		h.wb.SetConfig(low)
		time.Sleep(1050 * time.Millisecond) // a kupdate tick, before the retry
		synctest.Wait()
		if ms := h.wb.Snapshot().RetryPauseMs; ms != 500 {
			h.t.Errorf("retry_pause_ms = %d after max_pause became 500ms, want 500", ms)
		}
	})
}

// TestStatsDueWakesLoop: a change not yet in the stats file (held back by
// the rate limit, or by the backoff after a failed write) that the loop
// sees is written when it comes due, not at the next kupdate tick an hour
// away, and the loop sleeps until then instead of spinning.
func TestStatsDueWakesLoop(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Hour
	synctest.Test(t, func(t *testing.T) {
		wb, fs, path := runWithStats(t, cfg)
		bDirty := func() int { return statsBDirty(t, path) }
		synctest.Wait()
		if n := bDirty(); n != 0 {
			t.Fatalf("first write, at start: b_dirty %d, want 0", n)
		}
		time.Sleep(time.Second)
		a, b := fs.add("/a", 1, pg, 1), fs.add("/b", 2, pg, 1)
		wb.MarkInodeDirty(a.key, a.path, "", tree.Tree{Expire: time.Hour})
		synctest.Wait()
		if n := bDirty(); n != 1 {
			t.Fatalf("a change `every` after the first write: b_dirty %d, want 1", n)
		}
		time.Sleep(500 * time.Millisecond)
		// A second file (no wakeup: the device is not idle), then a
		// wakeup for another reason (a reload) within `every`.
		wb.MarkInodeDirty(b.key, b.path, "", tree.Tree{Expire: time.Hour})
		wb.SetConfig(cfg)
		synctest.Wait()
		loops := wb.live.loops.Load()
		time.Sleep(501 * time.Millisecond)
		synctest.Wait()
		if n := bDirty(); n != 2 {
			t.Fatalf("1 s after the first write: b_dirty %d, want 2", n)
		}
		if n := wb.live.loops.Load() - loops; n > 2 {
			t.Errorf("the loop woke %d times waiting 0.5 s for the stats file", n)
		}
		// Idle, and the write fails: retried after the backoff (1 s).
		dir := filepath.Dir(filepath.Dir(filepath.Dir(path)))
		time.Sleep(4 * time.Second)
		if err := os.RemoveAll(filepath.Join(dir, "bdi")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "bdi"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		wb.DropUnder("/")
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		os.Remove(filepath.Join(dir, "bdi"))
		time.Sleep(501 * time.Millisecond)
		synctest.Wait()
		if n := bDirty(); n != 0 {
			t.Fatalf("1 s after the failed write of the idle state: b_dirty %d, want 0", n)
		}
	})
}

// TestWorkPageBudget: a work ends once it has queued its NrPages, even
// with more inodes on b_io; an attempt counts the inode's last known dirty
// pages against it, at most write_chunk: a 16-page work over two 16-page
// files takes one, a 5-page work over two 10-page files with write_chunk 4
// pages takes both.
func TestWorkPageBudget(t *testing.T) {
	for _, c := range []struct {
		pages, chunk, budget int64
		wantB                int
	}{
		{16, 4 << 20, 16, 0},
		{10, 4 * pg, 5, 1},
	} {
		cfg := testConfig()
		cfg.DirtyWritebackInterval = time.Hour
		cfg.WriteChunk = c.chunk
		withWB(t, cfg, func(h *harness) {
			a, b := h.fs.add("/a", 1, c.pages*pg, int(c.pages)), h.fs.add("/b", 2, c.pages*pg, int(c.pages))
			h.mark(a, time.Hour)
			h.mark(b, time.Hour)
			h.wb.mu.Lock()
			h.wb.inodes.Get(a.key).DirtyPages, h.wb.inodes.Get(b.key).DirtyPages = uint32(c.pages), uint32(c.pages) // as last seen
			h.wb.mu.Unlock()
			time.Sleep(time.Millisecond)
			w := &Work{NrPages: c.budget, All: true, Reason: "test"}
			h.wb.Queue(w)
			<-w.Done()
			synctest.Wait()
			if na, nb := len(h.fs.callsOf("sync_file_range", "/a")), len(h.fs.callsOf("sync_file_range", "/b")); na != 1 || nb != c.wantB {
				h.t.Errorf("a %d-page work over two %d-page files (write_chunk %d B) wrote /a %d times, /b %d times; want 1, %d",
					c.budget, c.pages, c.chunk, na, nb, c.wantB)
			}
		})
	}
}

// TestBusyLoopWarning: a pass that makes no progress while b_more_io is
// not empty (a big file whose pages the filesystem keeps skipping) is
// logged, at most once a minute.
func TestBusyLoopWarning(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.WriteChunk = 4 * pg
	var logs *observer.ObservedLogs
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/big", 1, 10*pg, 10)
		f.keepDirty = true
		h.mark(f, 0)
		time.Sleep(150 * time.Second)
		synctest.Wait()
		entries := logs.FilterMessageSnippet("possible busy loop").All()
		if len(entries) != 3 {
			h.t.Fatalf("%d warnings in 150 s, want 3 (once a minute)", len(entries))
		}
		for i := 1; i < len(entries); i++ {
			if gap := entries[i].Time.Sub(entries[i-1].Time); gap != time.Minute {
				h.t.Errorf("warning %d came %v after the previous, want 1m", i, gap)
			}
		}
	}, withLogs(zapcore.InfoLevel, &logs))
}

// TestIOErrorRetryExactlyAtMaxPause: an inode whose writeback failed with
// an I/O error is retried by the first pass at or after max_pause, here
// the b_more_io_wait retry exactly max_pause later (min_pause = max_pause).
func TestIOErrorRetryExactlyAtMaxPause(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 500 * time.Millisecond
	cfg.MinPause = 2 * time.Second
	cfg.MaxPause = 2 * time.Second
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/bad", 1, pg, 1)
		f.writeErr = syscall.EIO
		h.mark(f, 0)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		w := h.fs.callsOf("sync_file_range", "/bad")
		if len(w) < 2 {
			h.t.Fatalf("%d attempts in 5 s", len(w))
		}
		for i := 1; i < len(w); i++ {
			if gap := w[i].at - w[i-1].at; gap != cfg.MaxPause {
				h.t.Fatalf("retry %d came %v after the previous, want max_pause %v", i, gap, cfg.MaxPause)
			}
		}
	})
}

// TestSyncWaitsForBusyCall: with no attempt_timeout, a sync request for a
// file whose detached call is still running waits for it (up to 10 s),
// then writes the file itself.
func TestSyncWaitsForBusyCall(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 500 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/slow", 1, pg, 1)
		release := make(chan struct{})
		first := true
		f.onWrite = func() {
			if first {
				first = false
				<-release
			}
		}
		h.mark(f, 0)
		time.Sleep(time.Second) // the call starts and is detached
		synctest.Wait()
		w := &Work{Reason: "sync", SyncMode: SyncAll, Files: []FileRef{{Key: f.key, Path: f.path}}}
		h.wb.Queue(w)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		select {
		case <-w.Done():
			h.t.Fatalf("the sync did not wait for the running call: %v", w.Errs[0])
		default:
		}
		close(release)
		<-w.Done()
		if w.Errs[0] != nil {
			h.t.Errorf("sync after the call returned: %v", w.Errs[0])
		}
		if n := len(h.fs.callsOf("fdatasync", "/slow")); n != 1 {
			h.t.Errorf("%d fdatasyncs by the sync, want 1", n)
		}
	})
}

// TestExactlyWriteChunk: a file whose dirty data is exactly write_chunk is
// written whole, in one call over the whole file.
func TestExactlyWriteChunk(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.WriteChunk = 4 * pg
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/f", 1, 8*pg, 4)
		h.mark(f, 0)
		time.Sleep(1050 * time.Millisecond)
		synctest.Wait()
		w := h.fs.callsOf("sync_file_range", "/f")
		if len(w) != 1 || w[0].off != 0 || w[0].n != 0 {
			h.t.Errorf("calls %+v, want one over the whole file", w)
		}
	})
}

// TestTimeSlice: a pass whose plug flushes at max_pending, and so waits
// for its batches, ends once 100 ms have passed, and the stats file is
// brought up to date between passes: here 40 files, two per batch, 90 ms
// a batch, with the stats rewritten at most once a second. By the last
// file's write the stats file shows the files taken off b_dirty.
func TestTimeSlice(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.MaxPending = 2
	synctest.Test(t, func(t *testing.T) {
		wb, fs, path := runWithStats(t, cfg)
		seen := -2
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		// Marked at 0.5 s (within `every` of the first stats write at
		// 0), shown on b_dirty by the write at the 1 s tick, due at the
		// 2 s tick.
		for i := range 40 {
			f := fs.add(fmt.Sprintf("/f%02d", i), uint64(i+1), pg, 1)
			f.onWrite = func() {
				time.Sleep(90 * time.Millisecond)
				if i == 39 {
					seen = statsBDirty(t, path)
				}
			}
			wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: time.Second})
		}
		time.Sleep(600 * time.Millisecond)
		synctest.Wait()
		if n := statsBDirty(t, path); n != 40 {
			t.Fatalf("before the pass: b_dirty %d in the stats file, want 40", n)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if seen != 0 {
			t.Errorf("b_dirty in the stats file at the last file's write: %d, want 0 (rewritten during the work)", seen)
		}
		if wb.Tracked() != 0 {
			t.Errorf("%d files still tracked", wb.Tracked())
		}
	})
}

// runWithStats runs a Writeback over a fakeFS with a stats file rewritten
// at most once a second, inside the caller's synctest bubble, until the
// test ends; it returns the stats file's path.
func runWithStats(t *testing.T, cfg Config) (*Writeback, *fakeFS, string) {
	dir := t.TempDir()
	epoch := time.Now()
	now := func() time.Duration { return time.Since(epoch) }
	fs := newFakeFS(now)
	wb := New("7:0", cfg, now, Files{Opener: fs}, nil, NewStatsWriter(dir, "7:0", time.Second, nil, zap.NewNop()))
	ctx, cancel := context.WithCancel(context.Background())
	go wb.Run(ctx)
	t.Cleanup(func() { cancel(); <-wb.Stopped() })
	return wb, fs, filepath.Join(dir, "bdi", "7:0", "stats")
}
