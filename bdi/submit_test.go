package bdi

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/policy"
	"flusherd/tree"
)

// TestBandwidthOfABatch: the write bandwidth is the pages a batch wrote
// over the time it took: two integrity files of 16 pages, one of whose
// sync_file_range and fdatasync take 250 ms each, are 128 kB in 0.5 s,
// 256 kB/s.
func TestBandwidthOfABatch(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		a := h.fs.add("/a", 1, 16*pg, 16)
		a.onWrite = func() { time.Sleep(250 * time.Millisecond) }
		b := h.fs.add("/b", 2, 16*pg, 16)
		for _, f := range []*fakeFile{a, b} {
			h.wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Mode: tree.ModeIntegrity})
		}
		time.Sleep(1600 * time.Millisecond)
		synctest.Wait()
		s := h.wb.Snapshot()
		if s.BdiWritten != 32 || s.BdiWriteBandwidth != 256 {
			h.t.Errorf("written %d pages, bandwidth %d kB/s; want 32, 256", s.BdiWritten, s.BdiWriteBandwidth)
		}
	})
}

// TestIntegrityBatch: integrity requests of one batch start their
// writeback together (sync_file_range) before any fdatasync, once there are
// two or more; a lone one is one fdatasync. With integrity_syncfs N, a
// filesystem with at least N of them in the batch gets one syncfs instead
// of their fdatasyncs; fewer, or N = 0, keep the fdatasyncs.
func TestIntegrityBatch(t *testing.T) {
	for _, c := range []struct {
		name            string
		files, syncfsAt int
		sfr, fdatasync  int
		syncfs          int
	}{
		{"one file", 1, 0, 0, 1, 0},
		{"two files", 2, 0, 2, 2, 0},
		{"three files, syncfs off", 3, 0, 3, 3, 0},
		{"three files, syncfs at 3", 3, 3, 3, 0, 1},
		{"two files, syncfs at 3", 2, 3, 2, 2, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			cfg.IntegritySyncfs = c.syncfsAt
			withWB(t, cfg, func(h *harness) {
				for i := range c.files {
					f := h.fs.add("/"+string(rune('a'+i)), uint64(i+1), 4*pg, 4)
					h.wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Mode: tree.ModeIntegrity})
				}
				time.Sleep(1100 * time.Millisecond)
				synctest.Wait()
				sfr, fds, sfs := len(h.fs.callsOf("sync_file_range", "")), len(h.fs.callsOf("fdatasync", "")), len(h.fs.callsOf("syncfs", ""))
				if sfr != c.sfr || fds != c.fdatasync || sfs != c.syncfs {
					h.t.Errorf("sync_file_range %d, fdatasync %d, syncfs %d; want %d, %d, %d", sfr, fds, sfs, c.sfr, c.fdatasync, c.syncfs)
				}
				if h.wb.Tracked() != 0 {
					h.t.Errorf("%d files still tracked", h.wb.Tracked())
				}
			})
		})
	}
}

// TestDetachedCallTimes: a detached call counts in stuck_calls from when
// it began, not from when it was detached (detachAfter later); when it
// returns with an error, the error is logged once, and a call that
// returns without one logs nothing.
func TestDetachedCallTimes(t *testing.T) {
	for _, callErr := range []error{nil, syscall.EIO} {
		name := "ok"
		if callErr != nil {
			name = callErr.Error()
		}
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = 500 * time.Millisecond
			cfg.AttemptTimeout = time.Second
			var logs *observer.ObservedLogs
			withWB(t, cfg, func(h *harness) {
				t := h.t
				f := h.fs.add("/slow", 1, pg, 1)
				release := make(chan struct{})
				first := true
				f.writeErr = callErr
				f.onWrite = func() {
					if first {
						first = false
						<-release
						f.set(func(f *fakeFile) { f.writeErr = nil })
					}
				}
				h.mark(f, 0)
				// The call begins at 500 ms (the first tick) and is
				// detached at 600 ms.
				time.Sleep(1500 * time.Millisecond)
				synctest.Wait()
				if n := h.wb.StuckCalls(); n != 0 {
					t.Fatalf("1 s after it began: %d stuck, want 0", n)
				}
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
				if n := h.wb.StuckCalls(); n != 1 {
					t.Fatalf("1.01 s after it began: %d stuck, want 1", n)
				}
				close(release)
				time.Sleep(time.Second)
				synctest.Wait()
				want := 0
				if callErr != nil {
					want = 1
				}
				if n := logs.FilterMessageSnippet("a detached writeback call failed").Len(); n != want {
					t.Errorf("%d lines for the detached call's failure, want %d", n, want)
				}
			}, withLogs(zapcore.InfoLevel, &logs))
		})
	}
}

// TestProbeNeedsACall: on a filesystem without sync_file_range, the probe
// is the first request that calls it. A first request that made no such
// call (its file already clean, or not opened) tells nothing, and the
// next request probes; so the files are written with fdatasync, and
// sync_file_range fails once, whether the first file is big or small.
func TestProbeNeedsACall(t *testing.T) {
	for _, c := range []struct {
		name  string
		first func(f *fakeFile)
	}{
		{"big", func(f *fakeFile) {}},
		{"clean", func(f *fakeFile) { clear(f.dirty) }},
		{"not opened", func(f *fakeFile) { f.openErr = syscall.EACCES }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			cfg.WriteChunk = 4 * pg
			withWB(t, cfg, func(h *harness) {
				first := h.fs.add("/first", 1, 10*pg, 10)
				first.sfrErr = syscall.EINVAL
				c.first(first)
				h.mark(first, 0)
				time.Sleep(1100 * time.Millisecond)
				synctest.Wait()
				first.set(func(f *fakeFile) { f.openErr = nil })
				second := h.fs.add("/second", 2, pg, 1)
				second.sfrErr = syscall.EINVAL
				h.mark(second, 0)
				time.Sleep(5 * time.Second)
				synctest.Wait()
				if n := len(h.fs.callsOf("sync_file_range", "")); n != 1 {
					h.t.Errorf("sync_file_range tried %d times, want once (the probe)", n)
				}
				if h.wb.Tracked() != 0 {
					h.t.Errorf("still tracked: %v", h.lists())
				}
			})
		})
	}
}

// TestReloadWhileCallDetached: a reload (SetConfig) while an attempt's
// call is detached and still running does not change what that call
// writes: the call took its tunables when it was queued (run under -race,
// where the worker's read of the device's config raced with the reload).
func TestReloadWhileCallDetached(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 500 * time.Millisecond
	cfg.WriteChunk = 4 * pg
	cfg.MaxInflight = 1 << 30
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/big", 1, 10*pg, 10)
		h.mark(f, 0)
		h.afterSample(f.path)
		release := make(chan struct{})
		first := true
		f.set(func(f *fakeFile) {
			f.onOpen = func() {
				// The attempt's open stalls.
				if first {
					first = false
					<-release
				}
			}
		})
		time.Sleep(890 * time.Millisecond) // the open is detached
		synctest.Wait()
		big := cfg
		big.WriteChunk = 64 * pg
		h.wb.SetConfig(big)
		synctest.Wait()
		close(release)
		synctest.Wait()
		w := h.fs.callsOf("sync_file_range", "/big")
		if len(w) == 0 || w[0].n != 4*pg {
			h.t.Errorf("the detached call wrote %v, want a window of the write_chunk it was queued with (4 pages)", w)
		}
	})
}

// TestStuckCallsBounded: on a filesystem whose opens all stall, a device
// starts no more than maxStuckCalls calls; once they return, every file is
// written.
func TestStuckCallsBounded(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 500 * time.Millisecond
	cfg.MaxPause = 200 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		release := make(chan struct{})
		var inOpen, most atomic.Int32
		n := maxStuckCalls + 100
		for i := range n {
			f := h.fs.add(fmt.Sprintf("/f%d", i), uint64(i+1), pg, 1)
			f.onOpen = func() {
				c := inOpen.Add(1)
				for m := most.Load(); c > m && !most.CompareAndSwap(m, c); m = most.Load() {
				}
				<-release
				inOpen.Add(-1)
			}
			h.mark(f, 0)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if m := most.Load(); m > maxStuckCalls {
			t.Errorf("%d opens stalled at once, want at most %d", m, maxStuckCalls)
		}
		if m := most.Load(); m < maxStuckCalls {
			t.Errorf("only %d opens started, want %d", m, maxStuckCalls)
		}
		if th := h.wb.Snapshot().Throttled; th == 0 {
			t.Error("the files held back are not counted in throttled")
		}
		close(release)
		time.Sleep(time.Minute)
		synctest.Wait()
		if left := h.wb.Tracked(); left != 0 {
			t.Errorf("%d files still tracked after the opens returned", left)
		}
	})
}

// TestUnsupportedOutsideTheProbe: on a filesystem without sync_file_range
// whose probe call is left to its worker (a slow first file), the other
// requests of the batch that fail with EINVAL switch the filesystem to
// fdatasync and are retried: no file counts an I/O error, none is
// reported lost, and a file already clean is forgotten (its check uses
// fdatasync there).
func TestUnsupportedOutsideTheProbe(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 500 * time.Millisecond
	cfg.MaxPause = 200 * time.Millisecond
	var tr tracer
	withWB(t, cfg, func(h *harness) {
		slow := h.fs.add("/slow", 1, pg, 1)
		slow.sfrErr = syscall.EINVAL
		h.mark(slow, 0)
		h.afterSample(slow.path)
		release := make(chan struct{})
		first := true
		slow.set(func(f *fakeFile) {
			f.onOpen = func() {
				// The probe's open stalls.
				if first {
					first = false
					<-release
				}
			}
		})
		time.Sleep(590 * time.Millisecond) // the probe is detached
		synctest.Wait()
		for i := range 5 {
			f := h.fs.add(fmt.Sprintf("/s%d", i), uint64(i+2), pg, 1)
			f.sfrErr = syscall.EINVAL
			h.mark(f, 0)
		}
		clean := h.fs.add("/clean", 10, pg, 0)
		clean.sfrErr = syscall.EINVAL
		h.mark(clean, 0)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		close(release)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for _, r := range tr.all() {
			if r.O == policy.IOError || r.D == policy.Failed {
				t.Errorf("attempt %+v: an unsupported sync_file_range counted as the file's error", r)
			}
		}
		if left := h.wb.Tracked(); left != 0 {
			t.Errorf("still tracked: %v", h.lists())
		}
		if s := h.wb.Snapshot(); s.FailedFiles != 0 || s.WritebackErrors != 0 {
			t.Errorf("failed_files %d, writeback_errors %d; want 0, 0", s.FailedFiles, s.WritebackErrors)
		}
	}, tr.setup)
}
