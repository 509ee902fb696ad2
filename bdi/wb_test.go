package bdi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/inode"
	"flusherd/policy"
	"flusherd/tree"
)

// TestKupdateExpiry: an inode dirtied at t0 is written at the first kupdate
// tick at or after t0 + expire, and forgotten once cachestat shows it clean.
func TestKupdateExpiry(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		time.Sleep(2 * time.Second) // t0 away from the tick grid
		f := h.fs.add("/a", 1, 64*pg, 16)
		h.mark(f, 30*time.Second)
		time.Sleep(29 * time.Second)
		synctest.Wait()
		if n := len(h.fs.callsOf("sync_file_range", "/a")); n != 0 {
			t.Fatalf("written %d times before it expired", n)
		}
		if got := h.lists()["/a"]; got != "b_dirty" {
			t.Fatalf("before expiry on %q, want b_dirty", got)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		w := h.fs.callsOf("sync_file_range", "/a")
		if len(w) != 1 {
			t.Fatalf("sync_file_range calls = %d, want 1", len(w))
		}
		if at := w[0].at; at < 32*time.Second || at > 32*time.Second+5*time.Second {
			t.Errorf("written at %v, want within [expire, expire+interval] of dirtying at 2s", at)
		}
		if h.inode("/a") != nil {
			t.Errorf("clean inode still tracked on %q", h.lists()["/a"])
		}
	})
}

// TestRedirtyKeepsDirtiedWhen: __mark_inode_dirty on an inode that is
// already dirty does not move dirtiedWhen.
func TestRedirtyKeepsDirtiedWhen(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		f := h.fs.add("/a", 1, pg, 1)
		h.mark(f, 30*time.Second)
		first := h.inode("/a").DirtiedWhen
		time.Sleep(7 * time.Second)
		h.mark(f, 30*time.Second)
		if got := h.inode("/a").DirtiedWhen; got != first {
			t.Fatalf("dirtiedWhen moved from %v to %v", first, got)
		}
	})
}

// TestIdleArmsNoTimer: with nothing dirty the goroutine never wakes.
func TestIdleArmsNoTimer(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		synctest.Wait()
		before := h.wb.live.loops.Load()
		time.Sleep(24 * time.Hour)
		synctest.Wait()
		if after := h.wb.live.loops.Load(); after != before {
			t.Fatalf("idle writeback woke %d times in a day", after-before)
		}
		// And after the last dirty inode is written, it goes idle again.
		f := h.fs.add("/a", 1, pg, 1)
		h.mark(f, time.Second)
		time.Sleep(time.Minute)
		synctest.Wait()
		if h.wb.Tracked() != 0 {
			t.Fatal("inode not written")
		}
		before = h.wb.live.loops.Load()
		time.Sleep(24 * time.Hour)
		synctest.Wait()
		if after := h.wb.live.loops.Load(); after != before {
			t.Fatalf("writeback woke %d times after going idle", after-before)
		}
	})
}

// TestBlockedBackoff: an inode whose writeback fails with EAGAIN goes to
// b_more_io_wait, keeps dirtiedWhen, and is retried after pauses that
// double from min_pause to max_pause, earlier than the kupdate interval;
// progress resets the pause.
func TestBlockedBackoff(t *testing.T) {
	cfg := testConfig()
	cfg.MinPause = 100 * time.Millisecond
	cfg.MaxPause = 800 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/a", 1, pg, 1)
		f.writeErr = syscall.EAGAIN
		h.mark(f, 0)
		dirtied := h.inode("/a").DirtiedWhen
		// The first kupdate tick is at 5s; the retries follow the pause,
		// not the 5s interval.
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if got := h.lists()["/a"]; got != "b_more_io_wait" {
			t.Fatalf("blocked inode on %q, want b_more_io_wait", got)
		}
		if got := h.inode("/a").DirtiedWhen; got != dirtied {
			t.Errorf("dirtiedWhen changed from %v to %v", dirtied, got)
		}
		w := h.fs.callsOf("sync_file_range", "/a")
		if len(w) < 6 {
			t.Fatalf("only %d attempts in 6s", len(w))
		}
		var gaps []time.Duration
		for i := 1; i < len(w); i++ {
			gaps = append(gaps, w[i].at-w[i-1].at)
		}
		want := []time.Duration{100, 200, 400, 800, 800}
		for i, g := range want {
			if gaps[i] != g*time.Millisecond {
				t.Fatalf("retry gaps = %v, want %v ms then 800ms", gaps, want)
			}
		}
		// Unblock: the next retry cleans it, and the pause resets.
		f.set(func(f *fakeFile) { f.writeErr = nil })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if h.inode("/a") != nil {
			t.Fatalf("unblocked inode still tracked on %q", h.lists()["/a"])
		}
		h.wb.mu.Lock()
		pause := h.wb.pause
		h.wb.mu.Unlock()
		if pause != 0 {
			t.Errorf("pause = %v after b_more_io_wait drained, want 0", pause)
		}
	})
}

// TestRedirtiedDuringWriteback: an event during the attempt sends the
// inode to b_more_io_wait with its dirtiedWhen kept.
func TestRedirtiedDuringWriteback(t *testing.T) {
	cfg := testConfig()
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/log", 1, 4*pg, 4)
		h.mark(f, 0)
		dirtied := h.inode("/log").DirtiedWhen
		f.set(func(f *fakeFile) {
			f.onWrite = func() {
				f.redirty(5)
				h.mark(f, 0)
			}
		})
		time.Sleep(5*time.Second + 5*time.Millisecond)
		synctest.Wait()
		in := h.inode("/log")
		if in == nil {
			t.Fatal("redirtied inode was forgotten")
		}
		if got := h.lists()["/log"]; got != "b_more_io_wait" {
			t.Fatalf("on %q, want b_more_io_wait", got)
		}
		if in.DirtiedWhen != dirtied {
			t.Errorf("dirtiedWhen moved from %v to %v", dirtied, in.DirtiedWhen)
		}
	})
}

// TestChunkUsed: an inode with more dirty data than write_chunk gets one
// chunk per attempt, goes to b_more_io, and is written completely within
// the same work.
func TestChunkUsed(t *testing.T) {
	cfg := testConfig()
	cfg.WriteChunk = 16 * pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/big", 1, 70*pg, 70)
		h.mark(f, 0)
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		w := h.fs.callsOf("sync_file_range", "/big")
		// Four write_chunk windows, then the 6 pages left fit in one
		// chunk and go as one whole-file request.
		if len(w) != 5 || w[4].off != 0 || w[4].n != 0 {
			t.Fatalf("sync_file_range calls %v, want 4 chunks then the rest", w)
		}
		for i, c := range w[:4] {
			if c.off != int64(i)*16*pg || c.n != 16*pg {
				t.Errorf("chunk %d = [%d,+%d), want [%d,+%d)", i, c.off, c.n, i*16*pg, 16*pg)
			}
		}
	})
}

// TestRequeueOutcomes checks the list each outcome leads to, with the
// series' policy and with redirty_tail.
func TestRequeueOutcomes(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(f *fakeFile)
		io     string // list with io_wait, "" = forgotten
		legacy string
	}{
		{"clean", func(f *fakeFile) {}, "", ""},
		{"eagain", func(f *fakeFile) { f.writeErr = syscall.EAGAIN }, "b_more_io_wait", "b_dirty"},
		{"open emfile", func(f *fakeFile) { f.openErr = syscall.EMFILE }, "b_more_io_wait", "b_dirty"},
		{"erofs", func(f *fakeFile) { f.writeErr = syscall.EROFS }, "b_more_io_wait", "b_dirty"},
		{"eio", func(f *fakeFile) { f.writeErr = syscall.EIO }, "b_more_io_wait", "b_dirty"},
		{"enospc", func(f *fakeFile) { f.writeErr = syscall.ENOSPC }, "b_more_io_wait", "b_dirty"},
		{"gone", func(f *fakeFile) { f.openErr = syscall.ENOENT }, "", ""},
	}
	for _, tc := range tests {
		for _, legacy := range []bool{false, true} {
			name := tc.name + "/io_wait"
			want := tc.io
			cfg := testConfig()
			if legacy {
				name = tc.name + "/redirty_tail"
				want = tc.legacy
				cfg.Requeue = policy.LegacyRedirtyTail
			}
			t.Run(name, func(t *testing.T) {
				withWB(t, cfg, func(h *harness) {
					t := h.t
					f := h.fs.add("/f", 1, pg, 1)
					tc.setup(f)
					h.mark(f, 0)
					time.Sleep(5*time.Second + 100*time.Millisecond)
					synctest.Wait()
					got := h.lists()["/f"]
					if got != want {
						t.Fatalf("on %q, want %q", got, want)
					}
					if got == "b_dirty" {
						if dw := h.inode("/f").DirtiedWhen; dw == 0 {
							t.Errorf("redirty_tail kept dirtiedWhen 0, want it reset to now")
						}
					}
				})
			})
		}
	}
	// Gone inodes are counted.
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		f := h.fs.add("/g", 1, pg, 1)
		f.openErr = syscall.ESTALE
		h.mark(f, 0)
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if gone := h.wb.Snapshot().InodesGone; gone != 1 {
			t.Fatalf("gone = %d, want 1", gone)
		}
	})
}

// TestIntegrityUsesFdatasync: a tree in integrity mode is written with
// fdatasync, never sync_file_range.
func TestIntegrityUsesFdatasync(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		f := h.fs.add("/db", 1, 8*pg, 8)
		h.wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: 0, Mode: tree.ModeIntegrity})
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if n := len(h.fs.callsOf("fdatasync", "/db")); n != 1 {
			t.Errorf("fdatasync calls = %d, want 1", n)
		}
		if n := len(h.fs.callsOf("sync_file_range", "/db")); n != 0 {
			t.Errorf("sync_file_range calls = %d, want 0", n)
		}
		if h.inode("/db") != nil {
			t.Error("still tracked after fdatasync")
		}
	})
}

// TestPerTreeExpire: inodes of one device with different expire intervals
// are written when each is due, not in dirtying order.
func TestPerTreeExpire(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		t := h.t
		slow := h.fs.add("/slow", 1, pg, 1)
		fast := h.fs.add("/fast", 2, pg, 1)
		h.mark(slow, 30*time.Second)
		time.Sleep(time.Second)
		h.mark(fast, 2*time.Second)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if h.inode("/fast") != nil {
			t.Errorf("/fast (expire 2s) not written after 5s")
		}
		if h.inode("/slow") == nil {
			t.Errorf("/slow (expire 30s) written early")
		}
	})
}

// TestDrain writes everything back regardless of age.
func TestDrain(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		for i := range 10 {
			f := h.fs.add("/f"+string(rune('a'+i)), uint64(i+1), pg, 1)
			h.mark(f, time.Hour)
		}
		if err := h.wb.Drain(t.Context(), "shutdown"); err != nil {
			t.Fatal(err)
		}
		if n := h.wb.Tracked(); n != 0 {
			t.Fatalf("%d inodes still tracked after Drain", n)
		}
	})
}

// TestAttemptTimeout: a writeback call that does not return within
// attempt_timeout makes the attempt blocked (b_more_io_wait, dirtiedWhen
// kept); the inode is Busy and not attempted again until the call returns,
// and then it is written back.
func TestAttemptTimeout(t *testing.T) {
	cfg := testConfig()
	cfg.AttemptTimeout = time.Second
	cfg.MaxPause = 200 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/frozen", 1, pg, 1)
		g := h.fs.add("/ok", 2, pg, 1)
		unfreeze := make(chan struct{})
		var calls atomic.Int32
		f.set(func(f *fakeFile) {
			f.onWrite = func() {
				if calls.Add(1) == 1 {
					<-unfreeze
				}
			}
		})
		h.mark(f, 0)
		h.mark(g, 0)
		dirtied := h.inode("/frozen").DirtiedWhen
		time.Sleep(5*time.Second + 1100*time.Millisecond)
		synctest.Wait()
		in := h.inode("/frozen")
		if in == nil || h.lists()["/frozen"] != "b_more_io_wait" || in.State&inode.Busy == 0 {
			t.Fatalf("timed-out inode: %+v on %q, want Busy on b_more_io_wait", in, h.lists()["/frozen"])
		}
		if in.DirtiedWhen != dirtied {
			t.Errorf("dirtiedWhen moved")
		}
		if h.inode("/ok") != nil {
			t.Errorf("the other file was held up by the stuck call")
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := len(h.fs.callsOf("sync_file_range", "/frozen")); n != 1 {
			t.Fatalf("%d calls while the first was stuck, want 1", n)
		}
		close(unfreeze)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if h.inode("/frozen") != nil {
			t.Fatalf("still tracked after the stuck call returned: on %q", h.lists()["/frozen"])
		}
	})
}

// TestIOErrorRetriedAtMaxPause: a file failing with EIO stays tracked and
// is retried at max_pause even while other files make progress (which
// resets the device's pause to min_pause).
func TestIOErrorRetriedAtMaxPause(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 500 * time.Millisecond
	cfg.MaxPause = 2 * time.Second
	withWB(t, cfg, func(h *harness) {
		t := h.t
		bad := h.fs.add("/bad", 1, pg, 1)
		bad.writeErr = syscall.EIO
		h.mark(bad, 0)
		// A stream of other files keeps the device making progress.
		for i := range 40 {
			f := h.fs.add("/ok"+string(rune('A'+i)), uint64(10+i), pg, 1)
			h.mark(f, 0)
			time.Sleep(250 * time.Millisecond)
		}
		synctest.Wait()
		w := h.fs.callsOf("sync_file_range", "/bad")
		if len(w) < 3 {
			t.Fatalf("only %d attempts in 10s", len(w))
		}
		for i := 1; i < len(w); i++ {
			if gap := w[i].at - w[i-1].at; gap < cfg.MaxPause {
				t.Fatalf("retry %d came %v after the previous, want >= max_pause %v", i, gap, cfg.MaxPause)
			}
		}
		in := h.inode("/bad")
		if in == nil || in.Errors < 3 || in.LastErr != uint8(syscall.EIO) {
			t.Fatalf("failing inode %+v: want tracked, errors counted, last error EIO", in)
		}
	})
}

// TestBackoffWithShortInterval: kupdate ticks more often than the pause
// must not postpone the retry of b_more_io_wait.
func TestBackoffWithShortInterval(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 100 * time.Millisecond
	cfg.MinPause = 20 * time.Millisecond
	cfg.MaxPause = 500 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/a", 1, pg, 1)
		f.writeErr = syscall.EAGAIN
		h.mark(f, 0)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		w := h.fs.callsOf("sync_file_range", "/a")
		// 0.1s, then +20, 40, 80, 160, 320, 500ms...: the pause, not
		// the ticks in between, which leave b_more_io_wait alone.
		if len(w) < 8 {
			t.Fatalf("%d attempts in 5s: the pause never came round", len(w))
		}
		pause := cfg.MinPause
		for i := 1; i < len(w); i++ {
			if gap := w[i].at - w[i-1].at; gap != pause {
				t.Fatalf("gap %v between retries %d and %d, want the pause %v", gap, i-1, i, pause)
			}
			pause = min(2*pause, cfg.MaxPause)
		}
	})
}

// TestSyncFileRangeUnsupported: on a filesystem whose sync_file_range fails
// with EINVAL, the first request finds out, and every request from then on
// uses fdatasync: the batch does not fail request by request.
func TestSyncFileRangeUnsupported(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		var files []*fakeFile
		for i := range 20 {
			f := h.fs.add("/f"+string(rune('a'+i)), uint64(i+1), pg, 1)
			f.sfrErr = syscall.EINVAL
			files = append(files, f)
			h.mark(f, 0)
		}
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if n := len(h.fs.callsOf("sync_file_range", "")); n != 1 {
			t.Errorf("sync_file_range tried %d times, want once", n)
		}
		if n := len(h.fs.callsOf("fdatasync", "")); n != len(files) {
			t.Errorf("fdatasync calls = %d, want %d (one per file)", n, len(files))
		}
		if n := h.wb.Tracked(); n != 0 {
			t.Errorf("%d files still tracked", n)
		}
		if s := h.wb.Snapshot(); s.WritebackErrors != 0 {
			t.Errorf("writeback_errors = %d, want 0: the probe's EINVAL is not a file's error", s.WritebackErrors)
		}
	})
}

// TestSyncDoesNotWaitBehindBackground: a sync request for one file queued
// during a long kupdate pass runs as soon as the pass yields, not after it.
func TestSyncDoesNotWaitBehindBackground(t *testing.T) {
	cfg := testConfig()
	cfg.QueueDepth = 1
	cfg.MaxPending = 16
	withWB(t, cfg, func(h *harness) {
		t := h.t
		for i := range 500 {
			f := h.fs.add(fmt.Sprintf("/bulk/%d", i), uint64(i+1), pg, 1)
			f.onWrite = func() { time.Sleep(10 * time.Millisecond) } // a slow device
			h.mark(f, 0)
		}
		target := h.fs.add("/db", 9999, pg, 1)
		time.Sleep(5*time.Second + 200*time.Millisecond) // kupdate has started on the bulk
		synctest.Wait()
		w := &Work{Reason: "sync", SyncMode: SyncAll, Files: []FileRef{{Key: target.key, Path: target.path}}}
		h.wb.Queue(w)
		<-w.Done()
		if w.Errs[0] != nil {
			t.Fatalf("sync: %v", w.Errs[0])
		}
		if n := len(h.fs.callsOf("fdatasync", "/db")); n != 1 {
			t.Fatalf("fdatasync of the synced file: %d calls", n)
		}
		// Bulk writes submitted before the sync's fdatasync: those
		// queued before it was (about 20 at 10ms each) plus what was in
		// the plug, not all 500.
		h.fs.mu.Lock()
		before := 0
		for _, c := range h.fs.calls {
			if c.path == "/db" {
				break
			}
			if c.op == "sync_file_range" {
				before++
			}
		}
		h.fs.mu.Unlock()
		if before > 100 {
			t.Fatalf("%d background writes went before the sync: it waited behind them", before)
		}
		left := 500 - before
		t.Logf("the sync went out after %d background writes, with %d still to go", before, left)
	})
}

// TestSparseFileChunks: a huge sparse file with dirty clusters near its end
// is written window by window, found by bisection (a scan of every window
// of a 1 PiB file would never finish), and ends clean.
func TestSparseFileChunks(t *testing.T) {
	cfg := testConfig()
	cfg.WriteChunk = 4 * pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		const size = 1 << 50 // 1 PiB
		f := h.fs.add("/sparse", 1, size, 0)
		last := int64(size/pg - 1)
		for _, p := range []int64{last - 100, last - 99, last - 98, last - 50, last - 49, last - 3, last - 2, last - 1, last} {
			f.redirty(p)
		}
		h.mark(f, 0)
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if h.inode("/sparse") != nil {
			t.Fatalf("sparse file still tracked on %q", h.lists()["/sparse"])
		}
		w := h.fs.callsOf("sync_file_range", "/sparse")
		if len(w) == 0 || len(w) > 6 {
			t.Fatalf("writes %v, want a few windows", w)
		}
		for _, c := range w {
			if c.n != 0 && c.off < (last-100)*pg-int64(cfg.WriteChunk) {
				t.Errorf("write %+v before the dirty clusters", c)
			}
		}
	})
}

// TestMergedWindowsComplete: when windows of one attempt are adjacent, the
// plug merges them into one request, and the attempt still completes.
func TestMergedWindowsComplete(t *testing.T) {
	cfg := testConfig()
	cfg.WriteChunk = 4 * pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/f", 1, 64*pg, 0)
		// Dirty pages sparse enough that one attempt needs several
		// adjacent windows to fill its budget of 4 pages.
		for _, p := range []int64{1, 6, 11, 16, 21, 26} {
			f.redirty(p)
		}
		h.mark(f, 0)
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if h.inode("/f") != nil {
			t.Fatalf("attempt with merged windows never completed: on %q", h.lists()["/f"])
		}
		if s := h.wb.Snapshot(); s.PlugMerges == 0 {
			t.Errorf("no merges counted")
		}
	})
}

// TestHealthy: a goroutine that sleeps is healthy however long it sleeps;
// one wedged inside a round of work (BeforePass blocks) stops being
// healthy after the limit, and is healthy again once it moves.
func TestHealthy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		epoch := time.Now()
		now := func() time.Duration { return time.Since(epoch) }
		fs := newFakeFS(now)
		wb := New("7:0", testConfig(), now, Files{Opener: fs}, nil, nil)
		wedge := make(chan struct{})
		var wedged atomic.Bool
		wb.Hooks.BeforePass = func() {
			if wedged.Load() {
				<-wedge
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		go wb.Run(ctx)
		defer func() { cancel(); <-wb.Stopped() }()
		synctest.Wait()
		time.Sleep(time.Hour)
		if !wb.Healthy(time.Second) {
			t.Fatal("an idle goroutine is unhealthy after an hour's sleep")
		}
		wedged.Store(true)
		f := fs.add("/a", 1, pg, 1)
		wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: time.Second})
		synctest.Wait() // blocked in BeforePass
		time.Sleep(500 * time.Millisecond)
		if !wb.Healthy(time.Second) {
			t.Fatal("unhealthy before the limit")
		}
		time.Sleep(500 * time.Millisecond)
		if wb.Healthy(time.Second) {
			t.Fatal("a goroutine wedged for 1s is healthy with a 1s limit")
		}
		wedged.Store(false)
		close(wedge)
		synctest.Wait()
		if !wb.Healthy(time.Second) {
			t.Fatal("unhealthy after it moved again")
		}
	})
}

// TestSetConfig: new tunables reach the running goroutine: with the
// kupdate interval cut from 5s to 100ms, an expired inode is written at
// the next tick instead of up to 5s later.
func TestSetConfig(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		synctest.Wait()
		cfg := testConfig()
		cfg.DirtyWritebackInterval = 100 * time.Millisecond
		h.wb.SetConfig(cfg)
		synctest.Wait()
		f := h.fs.add("/a", 1, pg, 1)
		h.mark(f, 0)
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if n := h.wb.Tracked(); n != 0 {
			h.t.Fatalf("inode still tracked 200ms after it expired with a 100ms interval (lists %v)", h.lists())
		}
	})
}

// TestExpireClassesReused: expire intervals come and go with reloads; a
// class no tracked inode uses is reused, and once 255 are held at once the
// nearest one is shared instead of failing.
func TestExpireClassesReused(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		// 300 intervals one after the other: each file is written back
		// (expire 1ms..) and forgotten before the next comes.
		for i := range 300 {
			f := h.fs.add(fmt.Sprintf("/seq%d", i), uint64(1000+i), pg, 1)
			h.mark(f, time.Duration(i+1)*time.Millisecond)
			time.Sleep(6 * time.Second)
			synctest.Wait()
			if h.wb.Tracked() != 0 {
				h.t.Fatalf("file %d not written back", i)
			}
		}
		h.wb.mu.Lock()
		nClasses := len(h.wb.bDirty.classes)
		h.wb.mu.Unlock()
		if n := nClasses; n > 2 {
			h.t.Errorf("%d classes after intervals that never overlapped, want reuse", n)
		}
		// 300 intervals held at once: no panic; all tracked.
		for i := range 300 {
			f := h.fs.add(fmt.Sprintf("/held%d", i), uint64(5000+i), pg, 1)
			h.mark(f, time.Duration(i+1)*time.Hour)
		}
		synctest.Wait()
		if n := h.wb.Tracked(); n != 300 {
			h.t.Fatalf("%d tracked, want 300", n)
		}
		h.wb.mu.Lock()
		nClasses = len(h.wb.bDirty.classes)
		h.wb.mu.Unlock()
		if n := nClasses; n != 255 {
			h.t.Errorf("%d classes, want the 255 maximum", n)
		}
	})
}

// TestMarkKnownInodeAllocates: marking an inode that is already tracked,
// under the same name, allocates nothing (it runs for every write event).
func TestMarkKnownInodeAllocates(t *testing.T) {
	epoch := time.Now()
	now := func() time.Duration { return time.Since(epoch) }
	fs := newFakeFS(now)
	wb := New("7:0", testConfig(), now, Files{Opener: fs}, nil, nil)
	f := fs.add("/srv/data/dir/file", 1, pg, 1)
	wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: time.Hour})
	if n := testing.AllocsPerRun(100, func() { wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: time.Hour}) }); n != 0 {
		t.Errorf("%v allocations per event on a known inode, want 0", n)
	}
	// A rename is recorded.
	wb.MarkInodeDirty(f.key, "/srv/data/other", "", tree.Tree{Expire: time.Hour})
	wb.mu.Lock()
	in := wb.inodes.Get(f.key)
	got, other := in.Path(), in.OtherPath()
	wb.mu.Unlock()
	if got != "/srv/data/other" || other != f.path {
		t.Errorf("after a rename: path %q, other %q", got, other)
	}
}

// TestStatsWriteFailureBacksOff: a stats file that cannot be written (here
// its directory's parent is a regular file) is retried with backoff, not
// at every wakeup of the loop, and the failure is logged once although
// each try uses a new temporary file.
func TestStatsWriteFailureBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		core, logs := observer.New(zap.InfoLevel)
		epoch := time.Now()
		now := func() time.Duration { return time.Since(epoch) }
		fs := newFakeFS(now)
		sw := NewStatsWriter(dir, "7:0", time.Second, nil, zap.New(core))
		wb := New("7:0", testConfig(), now, Files{Opener: fs}, zap.New(core), sw)
		ctx, cancel := context.WithCancel(context.Background())
		go wb.Run(ctx)
		defer func() { cancel(); <-wb.Stopped() }()
		first := fs.add("/first", 2, 4*pg, 4)
		wb.MarkInodeDirty(first.key, first.path, "", tree.Tree{Expire: time.Second})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if _, err := os.Stat(filepath.Join(dir, "bdi", "7:0", "stats")); err != nil {
			t.Fatalf("the stats file was not written while it could be: %v", err)
		}
		// From now on it cannot: bdi/ is a regular file.
		if err := os.RemoveAll(filepath.Join(dir, "bdi")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "bdi"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		before := wb.live.loops.Load()
		f := fs.add("/a", 1, 4*pg, 4)
		wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: time.Second})
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if wb.Tracked() != 0 {
			t.Fatal("the file was not written back")
		}
		// Backoff 1s, 2s, 4s ... 60s: about 15 tries in 10 minutes.
		if loops := wb.live.loops.Load() - before; loops > 100 {
			t.Errorf("the loop woke %d times in 10 minutes with an unwritable stats file", loops)
		}
		if n := logs.FilterMessageSnippet("cannot write stats file").Len(); n != 1 {
			t.Errorf("the stats failure was logged %d times, want once", n)
		}
	})
}

// TestReloadDuringDrain: a configuration reload (SetConfig, applied by the
// goroutine) while a shutdown drains the device; run under -race, where
// Drain's read of the tunables raced with the goroutine replacing them.
func TestReloadDuringDrain(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		for i := range 50 {
			f := h.fs.add(fmt.Sprintf("/f%d", i), uint64(i+1), 4*pg, 4)
			h.mark(f, time.Hour)
		}
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done <- h.wb.Drain(ctx, "shutdown")
		}()
		for i := range 20 {
			cfg := testConfig()
			cfg.MinPause = time.Duration(i+1) * time.Millisecond
			h.wb.SetConfig(cfg)
			time.Sleep(time.Millisecond)
		}
		if err := <-done; err != nil {
			t.Fatalf("Drain: %v", err)
		}
		if h.wb.Tracked() != 0 {
			t.Errorf("%d inodes left after Drain", h.wb.Tracked())
		}
	})
}

// TestBdiDirtied: BdiDirtied is BdiWritten plus BdiReclaimable (the dirty
// pages still held by tracked files, as last seen), in the stats.
func TestBdiDirtied(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		written := h.fs.add("/w", 1, 16*pg, 16)
		h.mark(written, time.Second)
		// Tracked, not yet due, with 8 dirty pages as last seen.
		held := h.fs.add("/h", 2, 8*pg, 8)
		h.mark(held, time.Hour)
		h.wb.mu.Lock()
		h.wb.setPagesLocked(h.wb.inodes.Get(held.key), 8, 0)
		h.wb.mu.Unlock()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		s := h.wb.Snapshot()
		if s.BdiWritten != 16 || s.BdiReclaimable != 8 {
			t.Fatalf("written %d, reclaimable %d; want 16 and 8", s.BdiWritten, s.BdiReclaimable)
		}
		if s.BdiDirtied != s.BdiWritten+s.BdiReclaimable {
			t.Errorf("BdiDirtied = %d, want BdiWritten + BdiReclaimable = %d + %d", s.BdiDirtied, s.BdiWritten, s.BdiReclaimable)
		}
	})
}

// TestErrWatchOnlyWhenDataLeftUnwritten: in an integrity tree, the
// filesystem's error cursor (a syncfs of the whole filesystem) is read only
// when a file's data left the page cache without flusherd having written
// it: not when a second event for a file flusherd has just written finds it
// clean (FAN_CLOSE_WRITE after FAN_MODIFY made every attempt do a syncfs),
// and once for a file that is clean at its first attempt.
func TestErrWatchOnlyWhenDataLeftUnwritten(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		errs := NewErrWatch()
		defer errs.Close()
		dev, err := errs.Add(dir)
		if err != nil {
			t.Fatal(err)
		}
		epoch := time.Now()
		now := func() time.Duration { return time.Since(epoch) }
		fs := newFakeFS(now)
		wb := New("7:0", testConfig(), now, Files{Opener: fs}, nil, nil)
		wb.errs = errs
		ctx, cancel := context.WithCancel(context.Background())
		go wb.Run(ctx)
		defer func() { cancel(); <-wb.Stopped() }()
		integrity := tree.Tree{Expire: time.Second, Mode: tree.ModeIntegrity}
		for i := range 20 {
			f := fs.add(fmt.Sprintf("/f%d", i), uint64(i+1), 4*pg, 4)
			f.key.Dev = dev
			// The second event for it arrives while it is written
			// (once: it carries no new data).
			var once sync.Once
			f.set(func(ff *fakeFile) {
				ff.onWrite = func() { once.Do(func() { wb.MarkInodeDirty(f.key, f.path, "", integrity) }) }
			})
			wb.MarkInodeDirty(f.key, f.path, "", integrity)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if wb.Tracked() != 0 {
			t.Fatalf("%d files still tracked", wb.Tracked())
		}
		if n := errs.Checks(); n != 0 {
			t.Errorf("%d syncfs checks for files flusherd wrote itself, want 0", n)
		}
		// Clean at its first attempt: its data left without flusherd.
		c := fs.add("/clean", 100, 4*pg, 0)
		c.key.Dev = dev
		wb.MarkInodeDirty(c.key, c.path, "", integrity)
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := errs.Checks(); n != 1 {
			t.Errorf("%d syncfs checks for a file found clean at its first attempt, want 1", n)
		}
	})
}

// TestErrWatchOncePerBatch: in an integrity tree whose batch syncfs
// (plug.integrity_syncfs) writes back the whole filesystem, the files of
// later batches are found clean at their first attempt: their
// filesystem's error cursor is read once per batch, not once per file;
// the pages the syncfs wrote count in BdiWritten, each once; and an error
// on the cursor since they were dirtied still reaches every one of them.
func TestErrWatchOncePerBatch(t *testing.T) {
	for _, fsErr := range []bool{false, true} {
		t.Run(fmt.Sprintf("error %v", fsErr), func(t *testing.T) {
			dir := t.TempDir()
			errs := NewErrWatch()
			defer errs.Close()
			dev, err := errs.Add(dir)
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			cfg.IntegritySyncfs, cfg.MaxPending = 4, 8 // batches of 8, 8 and 4
			withWB(t, cfg, func(h *harness) {
				t := h.t
				time.Sleep(time.Second) // dirtiedWhen away from 0
				integrity := tree.Tree{Expire: time.Second, Mode: tree.ModeIntegrity}
				for i := range 20 {
					f := h.fs.add(fmt.Sprintf("/f%02d", i), uint64(i+1), 4*pg, 4)
					f.key.Dev = dev
					h.wb.MarkInodeDirty(f.key, f.path, "", integrity)
				}
				if fsErr {
					// A writeback error on the filesystem since the
					// files were dirtied, taken by another fsync.
					errs.mu.Lock()
					errs.fses[dev].lastErr, errs.fses[dev].lastErrno = h.now(), syscall.ENOSPC
					errs.mu.Unlock()
				}
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if n := errs.Checks(); n != 2 {
					t.Errorf("%d checks of the filesystem's error cursor for 2 batches found clean, want 2", n)
				}
				if n := len(h.fs.callsOf("syncfs", "")); n != 3 {
					t.Errorf("%d batch syncfs calls for 3 batches, want 3", n)
				}
				s := h.wb.Snapshot()
				if failed := h.wb.Failed(); fsErr && len(failed) != 12 {
					t.Errorf("%d files reported failed, want the 12 of the batches found clean", len(failed))
				} else if !fsErr && (len(failed) != 0 || s.BdiWritten != 80) {
					t.Errorf("failed %d, BdiWritten %d pages; want 0 and 80 (20 files of 4 pages, each once)", len(failed), s.BdiWritten)
				}
				for _, fl := range h.wb.Failed() {
					if !errors.Is(fl.Err, syscall.ENOSPC) {
						t.Errorf("%s failed with %v, want the filesystem's ENOSPC", fl.Path, fl.Err)
					}
				}
				if h.wb.Tracked() != 0 {
					t.Errorf("%d files still tracked", h.wb.Tracked())
				}
			}, func(h *harness) { h.wb.errs = errs })
		})
	}
}

// TestDetachedCall: a writeback call still running after detachAfter (a
// slow device's full queue) is left to its worker: the device's goroutine
// completes the attempt and goes on, so another file is written back at
// once; the slow file is Busy (no second call) until its call returns and
// is written again then; a detached call running past attempt_timeout
// counts in StuckCalls; and an error the detached call returns is reported
// by the file's next attempt, not lost. Both shapes of attempt: a whole
// small file (one request on a worker) and a chunk of a file larger than
// write_chunk.
func TestDetachedCall(t *testing.T) {
	for _, c := range []struct {
		name       string
		size       int64
		dirtyPages int
		err        error // returned by the slow call
		slowOpen   bool  // the open is the slow call, not the write
	}{
		{"whole", pg, 1, nil, false},
		{"whole-error", pg, 1, syscall.EIO, false},
		{"whole-open", pg, 1, nil, true},
		{"chunk", 8 << 20, 2048, nil, false},
		{"chunk-error", 8 << 20, 2048, syscall.EIO, false},
		{"chunk-open", 8 << 20, 2048, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = 500 * time.Millisecond
			cfg.AttemptTimeout = time.Second
			cfg.MaxPause = 200 * time.Millisecond
			withWB(t, cfg, func(h *harness) {
				t := h.t
				slow := h.fs.add("/slow", 1, c.size, c.dirtyPages)
				ok := h.fs.add("/ok", 2, pg, 1)
				release := make(chan struct{})
				var releaseOnce sync.Once
				unblock := func() { releaseOnce.Do(func() { close(release) }) }
				defer unblock()
				h.mark(slow, 0)
				h.afterSample(slow.path) // the background check's count, before the slow call
				var calls atomic.Int32
				const slowCall = 1
				slow.set(func(f *fakeFile) {
					// The fake reads writeErr before the hook: the
					// first call (the slow one) fails with c.err,
					// the next ones succeed.
					f.writeErr = c.err
					hook := func() {
						if calls.Add(1) == slowCall {
							<-release
							f.set(func(f *fakeFile) { f.writeErr = nil })
						}
					}
					if c.slowOpen {
						f.onOpen = hook
					} else {
						f.onWrite = hook
					}
				})
				time.Sleep(490 * time.Millisecond) // the first pass: the slow call starts
				synctest.Wait()
				h.mark(ok, 0)
				time.Sleep(600 * time.Millisecond) // the next pass
				synctest.Wait()
				if h.inode("/ok") != nil {
					t.Logf("calls %+v lists %v", h.fs.calls, h.lists())
					t.Fatalf("/ok waited behind the slow call: on %q", h.lists()["/ok"])
				}
				in := h.inode("/slow")
				if in == nil || in.State&inode.Busy == 0 {
					t.Fatalf("/slow: %+v, want tracked and Busy while its call runs", in)
				}
				if n := h.wb.Snapshot().DetachedCalls; n != 1 {
					t.Errorf("detached_calls = %d, want 1", n)
				}
				time.Sleep(time.Second) // past attempt_timeout
				synctest.Wait()
				if n := h.wb.StuckCalls(); n != 1 {
					t.Errorf("StuckCalls = %d while the detached call runs past attempt_timeout, want 1", n)
				}
				if n := calls.Load(); n != slowCall {
					t.Fatalf("%d calls for /slow while the slow one was running, want %d", n, slowCall)
				}
				// A sync of the file meanwhile waits for the call (up
				// to attempt_timeout), then writes it itself.
				w := &Work{Reason: "sync", SyncMode: SyncAll, Files: []FileRef{{Key: slow.key, Path: slow.path}}}
				h.wb.Queue(w)
				time.Sleep(300 * time.Millisecond)
				synctest.Wait()
				select {
				case <-w.Done():
					t.Fatalf("the sync did not wait for the running call: %v", w.Errs[0])
				default:
				}
				unblock()
				<-w.Done()
				if c.err == nil && w.Errs[0] != nil {
					t.Errorf("sync after the call returned: %v", w.Errs[0])
				}
				if c.err != nil && !errors.Is(w.Errs[0], c.err) {
					t.Errorf("sync after the detached call failed with %v: %v, want that error reported", c.err, w.Errs[0])
				}
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if in := h.inode("/slow"); in != nil {
					t.Fatalf("/slow still tracked after its call returned: on %q, %+v", h.lists()["/slow"], in)
				}
				if n := h.wb.StuckCalls(); n != 0 {
					t.Errorf("StuckCalls = %d after the call returned", n)
				}
				errs := h.wb.Snapshot().WritebackErrors
				if c.err != nil && errs == 0 {
					t.Errorf("the detached call's %v was not reported (writeback_errors 0)", c.err)
				}
				if c.err == nil && errs != 0 {
					t.Errorf("writeback_errors = %d with no error", errs)
				}
				// Every page counted once in BdiWritten, those of the
				// detached call too (when it returns): /slow's and
				// /ok's one.
				if w := h.wb.Snapshot().BdiWritten; c.err == nil && w != uint64(c.dirtyPages)+1 {
					t.Errorf("BdiWritten = %d pages, want %d", w, c.dirtyPages+1)
				}
			})
		})
	}
}

// observerFS is a fakeFS that records the engine's attempts' opens and
// the inodes it forgets (an AttemptObserver).
type observerFS struct {
	*fakeFS
	mu     sync.Mutex
	events []string
}

func (fs *observerFS) Opened(key inode.Key, f inode.File) {
	fs.mu.Lock()
	fs.events = append(fs.events, fmt.Sprintf("opened %d", key.Ino))
	fs.mu.Unlock()
}

func (fs *observerFS) Forgotten(key inode.Key) {
	fs.mu.Lock()
	fs.events = append(fs.events, fmt.Sprintf("forgot %d", key.Ino))
	fs.mu.Unlock()
}

func (fs *observerFS) Checking() {
	fs.mu.Lock()
	fs.events = append(fs.events, "checking")
	fs.mu.Unlock()
}

func (fs *observerFS) all() []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return slices.Clone(fs.events)
}

// TestAttemptObserverTold: the device's AttemptObserver is told of each
// attempt's open, before the attempt decides the file is clean and
// forgets it, and of each inode the engine forgets, whichever
// way: written back clean, its tree dropped (DropUnder, no attempt). The
// fanotify watcher relies on it to report again the writes of a file it
// had quieted.
func TestAttemptObserverTold(t *testing.T) {
	var ob *observerFS
	withWB(t, testConfig(), func(h *harness) {
		clean := h.fs.add("/t/clean", 1, pg, 1)
		h.mark(clean, time.Millisecond)
		time.Sleep(6 * time.Second)
		synctest.Wait()
		kept := h.fs.add("/u/kept", 2, pg, 1)
		h.mark(kept, time.Hour)
		h.wb.DropUnder("/u")
		synctest.Wait()
		ob.mu.Lock()
		got := slices.Compact(slices.Clone(ob.events)) // (attempts: one or more)
		ob.mu.Unlock()
		if diff := cmp.Diff([]string{"opened 1", "forgot 1", "forgot 2"}, got); diff != "" {
			h.t.Errorf("what the opener was told (-want +got):\n%s", diff)
		}
	}, func(h *harness) {
		ob = &observerFS{fakeFS: h.fs}
		h.wb.files.Opener, h.wb.files.Observer = ob, ob
	})
}

// TestAttemptObserverChecking: with range writeback configured, each
// background check tells the observer before it takes the files written
// since the last one, so that their next writes are reported (the
// fanotify watcher un-quiets its files then); without range writeback or
// a background threshold there is no check and nothing is told.
func TestAttemptObserverChecking(t *testing.T) {
	for _, rangeBytes := range []int64{1 << 20, 0} {
		var ob *observerFS
		cfg := testConfig()
		cfg.RangeBytes = rangeBytes
		withWB(t, cfg, func(h *harness) {
			f := h.fs.add("/t/stream", 1, pg, 1)
			for range 3 {
				h.mark(f, time.Hour)
				time.Sleep(150 * time.Millisecond)
				synctest.Wait()
			}
			n := 0
			for _, e := range ob.all() {
				if e == "checking" {
					n++
				}
			}
			if want := rangeBytes > 0; (n >= 3) != want || (!want && n != 0) {
				h.t.Errorf("range_bytes %d: %d checks told, want at least 3: %v", rangeBytes, n, want)
			}
		}, func(h *harness) {
			ob = &observerFS{fakeFS: h.fs}
			h.wb.files.Opener, h.wb.files.Observer = ob, ob
		})
	}
}

// TestStricterTreeHolds: a tracked file reported again from an integrity
// tree with a shorter expiry (moved or hard-linked there from a writeback
// tree whose expiry is an hour) is written back in integrity mode
// (fdatasync) once that shorter expiry has passed, counted from when it
// was first dirtied; one reported again from a laxer tree keeps its own
// settings.
func TestStricterTreeHolds(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 100 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		t := h.t
		moved := h.fs.add("/wb/moved", 1, 2*pg, 2)
		kept := h.fs.add("/int/kept", 2, 2*pg, 2)
		h.wb.MarkInodeDirty(moved.key, moved.path, "", tree.Tree{Expire: time.Hour})
		h.wb.MarkInodeDirty(kept.key, kept.path, "", tree.Tree{Expire: 300 * time.Millisecond, Mode: tree.ModeIntegrity})
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		// Renamed into the integrity tree; kept linked into the
		// writeback tree and written there.
		moved.path = "/int/moved"
		h.wb.MarkInodeDirty(moved.key, "/int/moved", "", tree.Tree{Expire: 300 * time.Millisecond, Mode: tree.ModeIntegrity})
		h.wb.MarkInodeDirty(kept.key, "/wb/kept", "", tree.Tree{Expire: time.Hour})
		time.Sleep(400 * time.Millisecond)
		synctest.Wait()
		if n := moved.dirtyCount(); n != 0 {
			t.Errorf("the file moved into the integrity tree still has %d dirty pages after its expiry there", n)
		}
		if c := h.fs.callsOf("fdatasync", "/int/moved"); len(c) == 0 {
			t.Errorf("the file moved into the integrity tree was not written with fdatasync: %v", h.fs.calls)
		}
		if c := h.fs.callsOf("fdatasync", "/wb/kept"); len(c) == 0 && len(h.fs.callsOf("fdatasync", "/int/kept")) == 0 {
			t.Errorf("the integrity file written through a writeback tree's name lost integrity mode: %v", h.fs.calls)
		}
	})
}
