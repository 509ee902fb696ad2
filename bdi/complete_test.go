package bdi

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/inode"
	"flusherd/policy"
	"flusherd/tree"
)

// attemptRec is one Trace call: an attempt's path, outcome and destination.
type attemptRec struct {
	Path string
	O    policy.Outcome
	D    policy.Dest
	Err  error
}

// tracer records a Writeback's Trace calls.
type tracer struct {
	mu   sync.Mutex
	recs []attemptRec
}

// setup is a withWB setup that installs the tracer.
func (tr *tracer) setup(h *harness) {
	h.wb.Hooks.Trace = func(path string, o policy.Outcome, d policy.Dest, err error) {
		tr.mu.Lock()
		tr.recs = append(tr.recs, attemptRec{path, o, d, err})
		tr.mu.Unlock()
	}
}

func (tr *tracer) all() []attemptRec {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]attemptRec(nil), tr.recs...)
}

// withLogs is a withWB setup that sends the Writeback's logs, unsampled,
// to logs from level on.
func withLogs(level zapcore.Level, logs **observer.ObservedLogs) func(h *harness) {
	return func(h *harness) {
		core, l := observer.New(level)
		*logs = l
		h.wb.log = zap.New(core)
		h.wb.errLog.Logger = h.wb.log
	}
}

// handles is a withWB setup that opens by handle (handleFS).
func handles(ebadf bool) func(h *harness) {
	return func(h *harness) {
		fs := &handleFS{fakeFS: h.fs, ebadf: ebadf}
		h.wb.files.Opener, h.wb.files.Handles = fs, fs
	}
}

// outcomes returns the Trace calls without their errors.
func outcomes(recs []attemptRec) []attemptRec {
	out := make([]attemptRec, len(recs))
	for i, r := range recs {
		out[i] = attemptRec{Path: r.Path, O: r.O, D: r.D}
	}
	return out
}

// TestCompleteRouting: where complete sends an inode after its attempt
// when something besides the outcome decides: its tree left the
// configuration (Leaving), its tree went away during the attempt
// (Dropped), its name is gone but another name of it is known (a hard
// link), the daemon is shutting down (files it can never write are given
// up), and its handle names a deleted inode whose number a new file took.
func TestCompleteRouting(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.MaxPause = 100 * time.Millisecond

	t.Run("leaving: one last attempt at once, then forgotten", func(t *testing.T) {
		var tr tracer
		c := cfg
		c.DirtyWritebackInterval = time.Hour
		withWB(t, c, func(h *harness) {
			f := h.fs.add("/t/a", 1, pg, 1)
			f.writeErr = syscall.EAGAIN
			h.mark(f, time.Hour)
			kept := h.fs.add("/t/kept", 2, pg, 1)
			h.mark(kept, time.Hour)
			if n := h.wb.RetireUnder("/t", func(p string) bool { return p == "/t/kept" }); n != 1 {
				h.t.Fatalf("RetireUnder = %d, want 1", n)
			}
			synctest.Wait()
			want := []attemptRec{{"/t/a", policy.Blocked, policy.Forget, nil}}
			if diff := cmp.Diff(want, outcomes(tr.all())); diff != "" {
				h.t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if h.wb.Tracked() != 1 || h.inode("/t/kept") == nil {
				h.t.Errorf("after the retired file's attempt: %v tracked, want only /t/kept", h.lists())
			}
		}, tr.setup)
	})

	t.Run("leaving with more than write_chunk dirty: written until none is dirty, then forgotten", func(t *testing.T) {
		var tr tracer
		c := cfg
		c.DirtyWritebackInterval = time.Hour
		withWB(t, c, func(h *harness) {
			const pages = 10 << 20 / pg // 10 MiB; write_chunk is 4 MiB
			f := h.fs.add("/t/big", 1, 10<<20, pages)
			h.mark(f, time.Hour)
			h.wb.RetireUnder("/t", func(string) bool { return false })
			time.Sleep(5 * time.Second)
			synctest.Wait()
			want := []attemptRec{
				{"/t/big", policy.ChunkUsed, policy.MoreIO, nil},
				{"/t/big", policy.ChunkUsed, policy.MoreIO, nil},
				// Its last pages are under writeback: all was written.
				{"/t/big", policy.UnderWriteback, policy.Forget, nil},
			}
			if diff := cmp.Diff(want, outcomes(tr.all())); diff != "" {
				h.t.Errorf("attempts (-want +got):\n%s", diff)
			}
			h.fs.mu.Lock()
			d := len(f.dirty)
			h.fs.mu.Unlock()
			if d != 0 || h.wb.Tracked() != 0 {
				h.t.Errorf("after the retired file's attempts: %d dirty pages, %d tracked; want 0, 0", d, h.wb.Tracked())
			}
		}, tr.setup)
	})

	t.Run("leaving, then written again in a tree added back: kept", func(t *testing.T) {
		c := cfg
		c.DirtyWritebackInterval = time.Hour
		withWB(t, c, func(h *harness) {
			f := h.fs.add("/t/a", 1, pg, 1)
			h.mark(f, time.Hour)
			// As RetireUnder leaves it before its attempt runs.
			h.wb.mu.Lock()
			h.wb.inodes.Get(f.key).State |= inode.Leaving
			h.wb.mu.Unlock()
			h.mark(f, time.Hour)
			leaving := h.inode("/t/a").Has(inode.Leaving)
			if leaving {
				h.t.Errorf("a write reported after its tree left still leaves with it")
			}
		})
	})

	t.Run("leaving and gone: dropped", func(t *testing.T) {
		var tr tracer
		withWB(t, cfg, func(h *harness) {
			h.wb.MarkInodeDirty(inode.Key{Dev: 7, Ino: 1}, "/t/gone", "", tree.Tree{Expire: time.Hour})
			h.wb.RetireUnder("/t", func(string) bool { return false })
			time.Sleep(2 * time.Second)
			synctest.Wait()
			want := []attemptRec{{"/t/gone", policy.Gone, policy.Drop, nil}}
			if diff := cmp.Diff(want, outcomes(tr.all())); diff != "" {
				h.t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if s := h.wb.Snapshot(); s.InodesGone != 1 {
				h.t.Errorf("inodes_gone = %d, want 1", s.InodesGone)
			}
		}, tr.setup)
	})

	t.Run("tree dropped during the attempt", func(t *testing.T) {
		var tr tracer
		withWB(t, cfg, func(h *harness) {
			f := h.fs.add("/t/a", 1, pg, 1)
			f.keepDirty = true
			other := h.fs.add("/t/b", 2, pg, 1)
			h.mark(other, time.Hour)
			outside := h.fs.add("/u/c", 3, pg, 1)
			h.mark(outside, time.Hour)
			dropped := 0
			f.onWrite = func() { dropped = h.wb.DropUnder("/t").Files }
			h.mark(f, 0)
			time.Sleep(2 * time.Second)
			synctest.Wait()
			want := []attemptRec{{"/t/a", policy.Skipped, policy.Drop, nil}}
			if diff := cmp.Diff(want, outcomes(tr.all())); diff != "" {
				h.t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if s := h.wb.Snapshot(); s.InodesGone != 2 || s.Tracked() != 1 || dropped != 2 {
				h.t.Errorf("DropUnder = %d, inodes_gone %d, tracked %d; want 2, 2, 1 (/u/c)", dropped, s.InodesGone, s.Tracked())
			}
		}, tr.setup)
	})

	t.Run("name gone: its other name is tried", func(t *testing.T) {
		var tr tracer
		withWB(t, cfg, func(h *harness) {
			f := h.fs.add("/a", 1, pg, 1)
			h.mark(f, 0)
			// A second name of the same inode, since removed.
			h.wb.MarkInodeDirty(f.key, "/b", "", tree.Tree{})
			sampled := h.afterSample("/b")
			time.Sleep(3 * time.Second)
			synctest.Wait()
			// Trace names the path the inode has after the
			// attempt. The fake's writeback pages complete at the
			// next look, so /a is clean at its second attempt.
			want := []attemptRec{
				{"/a", policy.Gone, policy.MoreIOWait, nil},
				{"/a", policy.UnderWriteback, policy.MoreIOWait, nil},
				{"/a", policy.Clean, policy.Forget, nil},
			}
			if diff := cmp.Diff(want, outcomes(tr.all())); diff != "" {
				h.t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if n := len(h.fs.callsOf("open", "/b")) - sampled; n != 1 {
				h.t.Errorf("%d opens of /b by attempts, want 1", n)
			}
			if s := h.wb.Snapshot(); s.InodesGone != 0 || s.WritebackErrors != 0 {
				h.t.Errorf("inodes_gone %d, writeback_errors %d; want 0, 0", s.InodesGone, s.WritebackErrors)
			}
		}, tr.setup)
	})

	for _, c := range []struct {
		err    error
		given  bool
		dest   policy.Dest
		reason string
	}{
		{syscall.EROFS, true, policy.Forget, "its filesystem cannot be written"},
		{syscall.ENOTCONN, true, policy.Forget, "its filesystem is gone"},
		{syscall.EACCES, true, policy.Forget, "the daemon may not open it"},
		{syscall.EPERM, true, policy.Forget, "the daemon may not open it"},
		{syscall.EAGAIN, false, policy.MoreIOWait, "blocked: retried until shutdown_timeout"},
		{syscall.EIO, false, policy.MoreIOWait, "an I/O error: retried until shutdown_timeout"},
		{&os.PathError{Op: "open_by_handle_at", Path: "h", Err: syscall.EIO}, true, policy.Forget, "its filesystem refuses to open it (shut down)"},
		{&os.PathError{Op: "open", Path: "/a", Err: syscall.EUCLEAN}, true, policy.Forget, "its filesystem refuses to open it (corrupted)"},
		{syscall.ENOENT, false, policy.Drop, "gone: not a file given up"},
	} {
		t.Run("shutting down, "+c.err.Error(), func(t *testing.T) {
			var tr tracer
			withWB(t, cfg, func(h *harness) {
				f := h.fs.add("/a", 1, pg, 1)
				f.openErr = c.err
				h.wb.mu.Lock()
				h.wb.stop.on = true
				h.wb.mu.Unlock()
				h.mark(f, 0)
				time.Sleep(1100 * time.Millisecond)
				synctest.Wait()
				recs := tr.all()
				if len(recs) == 0 || recs[0].D != c.dest || !errors.Is(recs[0].Err, c.err) {
					h.t.Fatalf("attempts %+v, want the first to %v with %v (%s)", recs, c.dest, c.err, c.reason)
				}
				h.wb.mu.Lock()
				given := h.wb.stop.givenUp
				h.wb.mu.Unlock()
				if c.given != (len(given) == 1) || c.given && (given[0].Path != "/a" || !errors.Is(given[0].Err, c.err)) {
					h.t.Errorf("given up %+v; want it given up: %v (%s)", given, c.given, c.reason)
				}
			}, tr.setup)
		})
	}

	t.Run("handle of a deleted inode: the new file is written", func(t *testing.T) {
		var tr tracer
		withWB(t, cfg, func(h *harness) {
			old := h.fs.add("/r", 1, pg, 1)
			old.writeErr = syscall.EAGAIN
			h.mark(old, 0)
			if in := h.inode("/r"); in == nil || in.Handle() != old.handle {
				h.t.Fatalf("tracked %+v, want the handle %q taken at dirtying", in, old.handle)
			}
			time.Sleep(1100 * time.Millisecond)
			synctest.Wait()
			// Deleted; a new file takes its number and its name.
			h.fs.remove("/r")
			nf := h.fs.add("/r", 1, pg, 1)
			nf.set(func(f *fakeFile) { f.keepDirty = true })
			time.Sleep(time.Second)
			synctest.Wait()
			in := h.inode("/r")
			if in == nil || in.Handle() != nf.handle || in.Errors != 0 || in.LastErr != 0 {
				h.t.Fatalf("after the new file's attempt: %+v, want its handle %q and the old file's errors gone", in, nf.handle)
			}
			recs := outcomes(tr.all())
			want := attemptRec{"/r", policy.Skipped, policy.MoreIOWait, nil}
			if recs[0].O != policy.Blocked || recs[len(recs)-1] != want {
				h.t.Errorf("attempts %+v, want blocked ones, then %+v", recs, want)
			}
		}, tr.setup, handles(false))
	})

	t.Run("handle of a deleted inode, no file at its path: dropped", func(t *testing.T) {
		var tr tracer
		withWB(t, cfg, func(h *harness) {
			f := h.fs.add("/r", 1, pg, 1)
			h.mark(f, 0)
			h.fs.remove("/r")
			time.Sleep(1100 * time.Millisecond)
			synctest.Wait()
			recs := tr.all()
			if len(recs) != 1 || recs[0].D != policy.Drop || !errors.Is(recs[0].Err, inode.ErrUnlinked) {
				h.t.Fatalf("attempts %+v, want one, dropped with ErrUnlinked", recs)
			}
		}, tr.setup, handles(false))
	})

	t.Run("no filesystem registered for handles: by path", func(t *testing.T) {
		var tr tracer
		withWB(t, cfg, func(h *harness) {
			f := h.fs.add("/p", 1, pg, 1)
			h.mark(f, 0)
			time.Sleep(1100 * time.Millisecond)
			synctest.Wait()
			// Each open, the attempts' and the background checks'
			// counts', tries the handle, then the path.
			var opens []string
			for _, c := range h.fs.callsOf("", "") {
				if c.op == "open" || c.op == "open_by_handle" {
					opens = append(opens, c.op)
				}
			}
			ok := len(opens) >= 4 && len(opens)%2 == 0
			for i, op := range opens {
				ok = ok && op == []string{"open_by_handle", "open"}[i%2]
			}
			if !ok {
				h.t.Errorf("opens %v, want each by path after one by handle (EBADF), at least 2 of each", opens)
			}
			want := []attemptRec{
				{"/p", policy.UnderWriteback, policy.MoreIOWait, nil},
				{"/p", policy.Clean, policy.Forget, nil},
			}
			if diff := cmp.Diff(want, outcomes(tr.all())); diff != "" {
				h.t.Errorf("attempts (-want +got):\n%s", diff)
			}
		}, tr.setup, handles(true))
	})
}

// TestAttemptLogs: an attempt's error is logged when its errno is new for
// the inode, not at every retry; a file that stays dirty after attempts
// that wrote it is reported at 8, 16, 32... attempts; a gone file is
// logged at debug level when it was removed (ENOENT) and at info level
// when its path leads to another file; and writeback_errors counts every
// failed attempt.
func TestAttemptLogs(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.MinPause = 100 * time.Millisecond
	cfg.MaxPause = 100 * time.Millisecond

	t.Run("new errors only", func(t *testing.T) {
		var tr tracer
		var logs *observer.ObservedLogs
		withWB(t, cfg, func(h *harness) {
			f := h.fs.add("/a", 1, pg, 1)
			f.writeErr = syscall.EAGAIN
			h.mark(f, 0)
			for len(tr.all()) < 3 {
				time.Sleep(50 * time.Millisecond)
			}
			f.set(func(f *fakeFile) { f.writeErr = syscall.EIO })
			for len(tr.all()) < 4 {
				time.Sleep(50 * time.Millisecond)
			}
			f.set(func(f *fakeFile) { f.writeErr = nil })
			time.Sleep(3 * time.Second)
			synctest.Wait()
			warned := logs.FilterMessageSnippet("writeback failed").All()
			var errs []string
			for _, e := range warned {
				errs = append(errs, e.ContextMap()["error"].(string))
			}
			if want := []string{syscall.EAGAIN.Error(), syscall.EIO.Error()}; !cmp.Equal(errs, want) {
				h.t.Errorf("logged errors %q, want %q (one per new errno)", errs, want)
			}
			s := h.wb.Snapshot()
			if s.WritebackErrors != 4 || s.Tracked() != 0 {
				h.t.Errorf("writeback_errors %d, tracked %d; want 4, 0", s.WritebackErrors, s.Tracked())
			}
		}, tr.setup, withLogs(zapcore.InfoLevel, &logs))
	})

	t.Run("still dirty after repeated writeback", func(t *testing.T) {
		var tr tracer
		var logs *observer.ObservedLogs
		withWB(t, cfg, func(h *harness) {
			f := h.fs.add("/a", 1, pg, 1)
			f.keepDirty = true
			h.mark(f, 0)
			for len(tr.all()) < 17 {
				time.Sleep(50 * time.Millisecond)
			}
			synctest.Wait()
			var at []int64
			for _, e := range logs.FilterMessageSnippet("still dirty after repeated writeback").All() {
				at = append(at, int64(e.ContextMap()["attempts"].(uint16)))
			}
			if want := []int64{8, 16}; !cmp.Equal(at, want) {
				h.t.Errorf("reported at attempts %v, want %v", at, want)
			}
			for _, r := range tr.all() {
				if r.O != policy.Skipped || r.D != policy.MoreIOWait {
					h.t.Fatalf("attempt %+v, want skipped, b_more_io_wait", r)
				}
			}
			if s := h.wb.Snapshot(); s.WritebackErrors != 0 || s.BdiWritten != 0 {
				h.t.Errorf("writeback_errors %d, written %d; want 0, 0 (nothing failed, nothing left the cache)", s.WritebackErrors, s.BdiWritten)
			}
		}, tr.setup, withLogs(zapcore.InfoLevel, &logs))
	})

	for _, c := range []struct {
		err   error
		level zapcore.Level
		msg   string
	}{
		{syscall.ENOENT, zapcore.DebugLevel, "file gone; dropped"},
		{syscall.ESTALE, zapcore.DebugLevel, "file deleted; dropped"}, // (its handle names a deleted inode)
		{inode.ErrReplaced, zapcore.InfoLevel, "the path no longer leads to the tracked file; dropped"},
		{inode.ErrNotRegular, zapcore.InfoLevel, "the path no longer leads to the tracked file; dropped"},
	} {
		t.Run("gone: "+c.err.Error(), func(t *testing.T) {
			var logs *observer.ObservedLogs
			withWB(t, cfg, func(h *harness) {
				f := h.fs.add("/a", 1, pg, 1)
				f.openErr = c.err
				h.mark(f, 0)
				time.Sleep(1100 * time.Millisecond)
				synctest.Wait()
				got := logs.All()
				if len(got) != 1 || got[0].Level != c.level || got[0].Message != c.msg {
					h.t.Fatalf("logs %+v, want one %v %q", got, c.level, c.msg)
				}
				s := h.wb.Snapshot()
				if s.InodesGone != 1 || s.WritebackErrors != 0 {
					h.t.Errorf("inodes_gone %d, writeback_errors %d; want 1, 0 (a gone file is not a failed writeback)", s.InodesGone, s.WritebackErrors)
				}
			}, withLogs(zapcore.DebugLevel, &logs))
		})
	}
}

// TestDataLost: a file whose writeback failed with an I/O error and whose
// data then left the page cache without flusherd writing it (the kernel
// dropped it) is parked as failed: reported in Failed with its errno and
// failed_files, logged once as lost, and no longer counted as tracked;
// written again, it is tracked as a new dirty file.
func TestDataLost(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.MaxPause = 500 * time.Millisecond
	var tr tracer
	var logs *observer.ObservedLogs
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/a", 1, pg, 1)
		f.writeErr = syscall.EIO
		h.mark(f, 0)
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		in := h.inode("/a")
		h.wb.mu.Lock()
		next := h.wb.side.retryAt[f.key]
		h.wb.mu.Unlock()
		if in == nil || !in.Has(inode.DataError) || next == 0 {
			t.Fatalf("after EIO: %+v, next retry %v, want DataError and a retry at max_pause", in, next)
		}
		// The kernel marks the failed pages clean.
		f.set(func(f *fakeFile) { f.writeErr = nil; clear(f.dirty) })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		want := []attemptRec{
			{"/a", policy.IOError, policy.MoreIOWait, nil},
			{"/a", policy.Clean, policy.Failed, nil},
		}
		if diff := cmp.Diff(want, outcomes(tr.all())); diff != "" {
			t.Fatalf("attempts (-want +got):\n%s", diff)
		}
		if err := tr.all()[1].Err; !errors.Is(err, syscall.EIO) {
			t.Errorf("the loss's error %v, want EIO", err)
		}
		failed := h.wb.Failed()
		if len(failed) != 1 || failed[0].Path != "/a" || !errors.Is(failed[0].Err, syscall.EIO) {
			t.Errorf("Failed() = %+v, want /a with EIO", failed)
		}
		s := h.wb.Snapshot()
		if s.FailedFiles != 1 || s.Tracked() != 0 || h.wb.Tracked() != 0 {
			t.Errorf("failed_files %d, tracked %d/%d; want 1, 0", s.FailedFiles, s.Tracked(), h.wb.Tracked())
		}
		if n := len(logs.FilterMessageSnippet("data lost").All()); n != 1 {
			t.Errorf("%d data-lost lines, want 1", n)
		}
		// Closed by the application, nothing written: tracked, then
		// found clean, and the loss stands (not logged twice). The
		// close wakes the device, whose kupdate pass is due: its
		// attempt is held in open(2) while the test looks.
		gate := make(chan struct{})
		f.set(func(f *fakeFile) { f.onOpen = func() { <-gate } })
		h.wb.MarkInodeClosed(f.key, f.path, "", tree.Tree{Expire: 0})
		synctest.Wait()
		if s := h.wb.Snapshot(); s.FailedFiles != 0 || s.Tracked() != 1 {
			t.Errorf("closed: failed_files %d, tracked %d; want 0, 1 (tracked until an attempt looks)", s.FailedFiles, s.Tracked())
		}
		f.set(func(f *fakeFile) { f.onOpen = nil })
		close(gate)
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if failed := h.wb.Failed(); len(failed) != 1 || !errors.Is(failed[0].Err, syscall.EIO) {
			t.Errorf("closed after its loss: Failed() = %+v, want /a with EIO still", failed)
		}
		if n := len(logs.FilterMessageSnippet("data lost").All()); n != 1 {
			t.Errorf("%d data-lost lines after the close, want 1", n)
		}
		// Closed again, then a sync request before any attempt: a sync
		// is not a write either, and it is answered with the loss.
		h.wb.MarkInodeClosed(f.key, f.path, "", tree.Tree{Expire: time.Hour})
		w := &Work{SyncMode: SyncAll, Reason: "sync", Files: []FileRef{{Key: f.key, Path: f.path, Tree: tree.Tree{Expire: time.Hour}}}}
		h.wb.Queue(w)
		<-w.Done()
		if !errors.Is(w.Errs[0], syscall.EIO) {
			t.Errorf("sync after a close: %v, want the loss (EIO)", w.Errs[0])
		}
		if failed := h.wb.Failed(); len(failed) != 1 {
			t.Errorf("after the sync: Failed() = %+v, want /a", failed)
		}
		// Written again. Its expiry is still the stricter 0 of its
		// first tree, and a kupdate pass is due: the write wakes the
		// device, whose attempt is held in open(2) while the test looks.
		gate = make(chan struct{})
		f.set(func(f *fakeFile) { f.onOpen = func() { <-gate } })
		f.redirty(0)
		h.mark(f, time.Hour)
		synctest.Wait()
		in = h.inode("/a")
		if in == nil || in.Errors != 0 || in.LastErr != 0 || in.Retries != 0 || !in.Has(inode.Dirty) {
			t.Fatalf("written again: %+v, want a fresh dirty inode", in)
		}
		if s := h.wb.Snapshot(); s.FailedFiles != 0 || s.Tracked() != 1 {
			t.Errorf("written again: failed_files %d, tracked %d; want 0, 1", s.FailedFiles, s.Tracked())
		}
		if len(h.wb.Failed()) != 0 {
			t.Errorf("Failed() = %+v after it was written again", h.wb.Failed())
		}
		f.set(func(f *fakeFile) { f.onOpen = nil })
		close(gate)
		time.Sleep(2 * time.Second) // the next kupdate pass at the latest, and its check
		synctest.Wait()
		if in := h.inode("/a"); in != nil || h.wb.Tracked() != 0 || len(h.wb.Failed()) != 0 {
			t.Errorf("after its writeback: %+v, tracked %d, failed %+v; want it written and forgotten", in, h.wb.Tracked(), h.wb.Failed())
		}
	}, tr.setup, withLogs(zapcore.InfoLevel, &logs))
}

// TestSyncAfterLoss: a sync request for a file whose data was lost is
// answered with the loss while nothing was written since, and writes the
// file when data was (through a shared mmap: no event), which ends the
// loss.
func TestSyncAfterLoss(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.MaxPause = 500 * time.Millisecond
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/a", 1, pg, 1)
		f.writeErr = syscall.EIO
		h.mark(f, 0)
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		f.set(func(f *fakeFile) { f.writeErr = nil; clear(f.dirty) }) // the kernel marks the failed pages clean
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if len(h.wb.Failed()) != 1 {
			t.Fatalf("Failed() = %+v, want /a", h.wb.Failed())
		}
		sync := func() error {
			w := &Work{SyncMode: SyncAll, Reason: "sync", Files: []FileRef{{Key: f.key, Path: f.path, Tree: tree.Tree{Expire: time.Hour}}}}
			h.wb.Queue(w)
			<-w.Done()
			return w.Errs[0]
		}
		if err := sync(); !errors.Is(err, syscall.EIO) {
			t.Errorf("sync, nothing written since the loss: %v, want the loss (EIO)", err)
		}
		if len(h.wb.Failed()) != 1 {
			t.Errorf("after it: Failed() = %+v, want /a", h.wb.Failed())
		}
		f.redirty(0)
		if err := sync(); err != nil {
			t.Errorf("sync after data written since the loss: %v, want it written", err)
		}
		f.fs.mu.Lock()
		dirty := len(f.dirty)
		f.fs.mu.Unlock()
		if dirty != 0 || len(h.wb.Failed()) != 0 || h.wb.Tracked() != 0 {
			t.Errorf("after that sync: %d dirty pages, Failed() = %+v, tracked %d; want it written and forgotten", dirty, h.wb.Failed(), h.wb.Tracked())
		}
	})
}

// TestErrorBeforeTheDataIsNoLoss: a file whose attempts fail before they
// reach its data, in the open (EACCES) or the first cachestat (EPERM), and
// that the kernel then writes back once the cause is gone, is found clean
// and forgotten, not reported as lost: nothing of flusherd's failed on its
// data. (Its attempts are still io_error, retried after max_pause.)
func TestErrorBeforeTheDataIsNoLoss(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(f *fakeFile)
	}{
		{"open EACCES", func(f *fakeFile) { f.openErr = &os.PathError{Op: "open", Path: f.path, Err: syscall.EACCES} }},
		{"cachestat EPERM", func(f *fakeFile) { f.cachestatErr = syscall.EPERM }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			cfg.MaxPause = 500 * time.Millisecond
			var tr tracer
			withWB(t, cfg, func(h *harness) {
				t := h.t
				f := h.fs.add("/a", 1, pg, 1)
				f.set(c.set)
				h.mark(f, 0)
				time.Sleep(1100 * time.Millisecond)
				synctest.Wait()
				if in := h.inode("/a"); in == nil || in.Has(inode.DataError) {
					t.Fatalf("after the failed attempt: %+v, want tracked without DataError", in)
				}
				// The cause goes; the kernel writes the page back.
				f.set(func(f *fakeFile) { f.openErr, f.cachestatErr = nil, nil; clear(f.dirty) })
				time.Sleep(2 * time.Second)
				synctest.Wait()
				want := []attemptRec{
					{"/a", policy.IOError, policy.MoreIOWait, nil},
					{"/a", policy.Clean, policy.Forget, nil},
				}
				if diff := cmp.Diff(want, outcomes(tr.all())); diff != "" {
					t.Fatalf("attempts (-want +got):\n%s", diff)
				}
				if failed := h.wb.Failed(); len(failed) != 0 {
					t.Errorf("Failed() = %+v, want none (no data of its failed)", failed)
				}
			}, tr.setup)
		})
	}
}

// TestClosedWithDataAfterLoss: a file parked as failed that is reported
// closed (no write reported: a shared mmap's data) and holds dirty pages
// is written back and forgotten as clean: its new data ended the loss.
func TestClosedWithDataAfterLoss(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.MaxPause = 500 * time.Millisecond
	var tr tracer
	withWB(t, cfg, func(h *harness) {
		t := h.t
		f := h.fs.add("/a", 1, pg, 1)
		f.writeErr = syscall.EIO
		h.mark(f, 0)
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		f.set(func(f *fakeFile) { f.writeErr = nil; clear(f.dirty) })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if len(h.wb.Failed()) != 1 {
			t.Fatalf("Failed() = %+v, want /a: the test shows nothing", h.wb.Failed())
		}
		f.redirty(0) // through the mapping: no write reported
		h.wb.MarkInodeClosed(f.key, f.path, "", tree.Tree{Expire: 0})
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if len(h.wb.Failed()) != 0 || h.wb.Tracked() != 0 || f.dirtyCount() != 0 {
			t.Errorf("Failed() %+v, tracked %d, dirty pages %d; want none, 0, 0 (written, clean)", h.wb.Failed(), h.wb.Tracked(), f.dirtyCount())
		}
	}, tr.setup)
}

// TestWrittenPagesCounted: BdiWritten counts the pages an attempt took from
// dirty to clean, chunk by chunk; attempts that leave the pages dirty add
// nothing; each outcome is counted.
func TestWrittenPagesCounted(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.WriteChunk = 16 * pg
	withWB(t, cfg, func(h *harness) {
		t := h.t
		big := h.fs.add("/big", 1, 40*pg, 40)
		small := h.fs.add("/small", 2, 8*pg, 8)
		stuck := h.fs.add("/stuck", 3, 4*pg, 4)
		stuck.keepDirty = true
		for _, f := range []*fakeFile{big, small, stuck} {
			h.mark(f, 0)
		}
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		s := h.wb.Snapshot()
		if s.BdiWritten != 48 {
			t.Errorf("BdiWritten = %d pages, want 48 (40 + 8; the stuck file's 4 stay dirty)", s.BdiWritten)
		}
		clean, chunk, skipped := s.Outcomes[policy.Clean], s.Outcomes[policy.ChunkUsed], s.Outcomes[policy.Skipped]
		if clean != 2 || chunk != 2 || skipped < 1 {
			t.Errorf("outcomes: clean %d, chunk_used %d, skipped %d; want 2, 2 (two chunks, then the rest), at least 1", clean, chunk, skipped)
		}
		if s.BdiReclaimable != 4 || s.BdiDirtied != 52 {
			t.Errorf("reclaimable %d, dirtied %d; want 4, 52", s.BdiReclaimable, s.BdiDirtied)
		}
	})
}

// TestRenamedFileKeepsBoth: a second name for a tracked inode (a rename or
// a hard link) becomes its path, and the first is kept as the other name.
func TestRenamedFileKeepsBoth(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		f := h.fs.add("/a", 1, pg, 1)
		h.mark(f, time.Hour)
		h.wb.MarkInodeDirty(f.key, "/b", "", tree.Tree{Expire: time.Hour})
		in := h.inode("/b")
		if in == nil || in.OtherPath() != "/a" || !strings.HasSuffix(in.Path(), "/b") {
			h.t.Fatalf("after a second name: %+v, want path /b, other /a", in)
		}
	})
}

// TestUnseenErrorLeftInWritebackMode: in writeback mode a file found clean
// (no dirty and no writeback pages), whether found so before writing or
// after, is forgotten as clean and its unseen writeback error (errseq_t)
// is not read: reading it marks it seen, and the application's fsync on a
// descriptor opened later would not report it. Where sync_file_range is
// not supported (fdatasync instead), fdatasync reports it, as it must.
func TestUnseenErrorLeftInWritebackMode(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.MaxPause = 100 * time.Millisecond

	for _, c := range []struct {
		name  string
		setup func(f *fakeFile)
		pages uint32 // the count last seen before its attempt
	}{
		{"written, then found clean", func(f *fakeFile) {}, 0},
		{"written, and clean at once", func(f *fakeFile) { f.fastDevice = true }, 0},
		{"found clean before writing", func(f *fakeFile) { clear(f.dirty) }, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var tr tracer
			withWB(t, cfg, func(h *harness) {
				f := h.fs.add("/a", 1, pg, 1)
				f.checkErr = syscall.EIO
				c.setup(f)
				h.mark(f, 0)
				if c.pages > 0 {
					h.wb.mu.Lock()
					h.wb.inodes.Get(f.key).DirtyPages = c.pages // as last seen
					h.wb.mu.Unlock()
				}
				time.Sleep(2500 * time.Millisecond)
				synctest.Wait()
				recs := tr.all()
				if len(recs) == 0 {
					h.t.Fatal("no attempt")
				}
				for _, r := range recs {
					if r.Err != nil || r.O == policy.IOError {
						h.t.Errorf("attempt %+v: the unseen error was read", r)
					}
				}
				if last := recs[len(recs)-1]; last.O != policy.Clean || last.D != policy.Forget {
					h.t.Errorf("last attempt %+v, want clean and forgotten", last)
				}
				if len(h.wb.Failed()) != 0 {
					h.t.Errorf("Failed() = %+v, want none", h.wb.Failed())
				}
			}, tr.setup)
		})
	}

	t.Run("chunks with fdatasync", func(t *testing.T) {
		c := cfg
		c.WriteChunk = 4 * pg
		var tr tracer
		withWB(t, c, func(h *harness) {
			// The fallback is learned on a small file first.
			probe := h.fs.add("/probe", 1, pg, 1)
			probe.sfrErr = syscall.EINVAL
			h.mark(probe, 0)
			time.Sleep(1100 * time.Millisecond)
			synctest.Wait()
			f := h.fs.add("/big", 2, 10*pg, 10)
			f.sfrErr = syscall.EINVAL
			f.checkErr = syscall.EIO
			h.mark(f, 0)
			time.Sleep(2 * time.Second)
			synctest.Wait()
			var big []attemptRec
			for _, r := range outcomes(tr.all()) {
				if r.Path == "/big" {
					big = append(big, r)
				}
			}
			// Without sync_file_range, fdatasync writes the whole
			// file and reports the unseen error.
			want := []policy.Outcome{policy.IOError}
			var got []policy.Outcome
			for _, r := range big {
				got = append(got, r.O)
			}
			if len(got) < len(want) || !cmp.Equal(got[:len(want)], want) {
				h.t.Fatalf("/big's attempts %v, want %v first", got, want)
			}
			if n := len(h.fs.callsOf("sync_file_range", "/big")); n != 0 {
				h.t.Errorf("%d sync_file_range calls on a filesystem known not to support it", n)
			}
		}, tr.setup)
	})
}

// TestLostByFilesystemError: in an integrity tree, a file found clean at
// its first attempt, on a filesystem whose error cursor shows a writeback
// error at or after the file was dirtied, is parked as failed with that
// error; an error from before it was dirtied is not its own.
func TestLostByFilesystemError(t *testing.T) {
	for _, c := range []struct {
		name  string
		errAt time.Duration // relative to the file's dirtiedWhen
		lost  bool
	}{
		{"error when it was dirtied", 0, true},
		{"error after", time.Millisecond, true},
		{"error just before", -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			errs := NewErrWatch()
			defer errs.Close()
			dev, err := errs.Add(dir)
			if err != nil {
				t.Fatal(err)
			}
			var tr tracer
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			withWB(t, cfg, func(h *harness) {
				t := h.t
				time.Sleep(2 * time.Second) // dirtiedWhen away from 0
				f := h.fs.add("/a", 1, pg, 0)
				f.key.Dev = dev
				h.wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: 0, Mode: tree.ModeIntegrity})
				dirtied := h.inode("/a").DirtiedWhen
				errs.mu.Lock()
				errs.fses[dev].lastErr, errs.fses[dev].lastErrno = dirtied+c.errAt, syscall.ENOSPC
				errs.mu.Unlock()
				time.Sleep(time.Second)
				synctest.Wait()
				if n := errs.Checks(); n != 1 {
					t.Errorf("%d checks of the filesystem's error cursor, want 1", n)
				}
				recs := outcomes(tr.all())
				want := policy.Forget
				if c.lost {
					want = policy.Failed
				}
				if len(recs) != 1 || recs[0].O != policy.Clean || recs[0].D != want {
					t.Fatalf("attempts %+v, want one, clean, to %v", recs, want)
				}
				failed := h.wb.Failed()
				if c.lost && (len(failed) != 1 || !errors.Is(failed[0].Err, syscall.ENOSPC)) {
					t.Errorf("Failed() = %+v, want /a with the filesystem's ENOSPC", failed)
				}
			}, tr.setup, func(h *harness) { h.wb.errs = errs })
		})
	}
}

// TestNewFileTakesNumberDuringAttempt: when the attempt finds the file gone
// but a new file took the inode's number meanwhile (MarkInodeDirty with
// another handle during the attempt), the inode is not dropped: the new
// file is written.
func TestNewFileTakesNumberDuringAttempt(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	var tr tracer
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/a", 1, pg, 1)
		h.mark(f, 0)
		h.afterSample(f.path)
		opens := 0
		f.set(func(f *fakeFile) {
			f.openErr = syscall.ENOENT
			f.onOpen = func() {
				// The attempt's open fails, and meanwhile the new
				// file is seen; the next opens find it.
				if opens++; opens == 1 {
					h.wb.MarkInodeDirty(f.key, f.path, "h-new", tree.Tree{})
				} else {
					f.set(func(f *fakeFile) { f.openErr = nil })
				}
			}
		})
		time.Sleep(1000 * time.Millisecond)
		synctest.Wait()
		recs := outcomes(tr.all())
		if len(recs) < 1 || recs[0].O != policy.Gone || recs[0].D != policy.MoreIOWait {
			h.t.Fatalf("attempts %+v, want the first gone but kept (b_more_io_wait)", recs)
		}
		if len(recs) < 2 || recs[len(recs)-1].O != policy.Clean {
			h.t.Fatalf("attempts %+v, want the new file written", recs)
		}
		if s := h.wb.Snapshot(); s.InodesGone != 0 {
			h.t.Errorf("inodes_gone = %d, want 0", s.InodesGone)
		}
	}, tr.setup)
}

// TestDetachedOpenReturns: an attempt whose open takes longer than
// detachAfter is detached; when it returns, the file it opened is closed
// (every open is matched by a close), a failed one closes nothing, and one
// that ran past attempt_timeout says so. Meanwhile the stats show the
// call in stuck_calls and detached_calls.
func TestDetachedOpenReturns(t *testing.T) {
	for _, openErr := range []error{nil, syscall.EIO} {
		t.Run(fmt.Sprint(openErr), func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			cfg.WriteChunk = 4 * pg
			cfg.AttemptTimeout = 300 * time.Millisecond
			var logs *observer.ObservedLogs
			withWB(t, cfg, func(h *harness) {
				t := h.t
				f := h.fs.add("/big", 1, 10*pg, 10)
				h.mark(f, 0)
				h.afterSample(f.path) // counts its 10 pages
				if in := h.inode(f.path); in == nil || in.DirtyPages != 10 {
					t.Fatalf("after the background check: %+v, want 10 dirty pages", in)
				}
				release := make(chan struct{})
				slow := true
				f.set(func(f *fakeFile) {
					f.onOpen = func() {
						// The attempt's open stalls.
						if slow {
							slow = false
							<-release
							f.set(func(f *fakeFile) { f.openErr = openErr })
						} else {
							f.set(func(f *fakeFile) { f.openErr = nil })
						}
					}
				})
				time.Sleep(1400 * time.Millisecond)
				synctest.Wait()
				if s := h.wb.Snapshot(); s.StuckCalls != 1 || s.DetachedCalls != 1 {
					t.Errorf("the open stuck 500 ms: stuck_calls %d, detached_calls %d; want 1, 1", s.StuckCalls, s.DetachedCalls)
				}
				close(release)
				time.Sleep(2 * time.Second)
				synctest.Wait()
				opens, closes := 0, len(h.fs.callsOf("close", "/big"))
				for range h.fs.callsOf("open", "/big") {
					opens++
				}
				if openErr != nil {
					opens-- // the slow open failed
				}
				if opens != closes {
					t.Errorf("%d files opened, %d closed", opens, closes)
				}
				if n := logs.FilterMessageSnippet("a writeback call returned after running past attempt_timeout").Len(); n != 1 {
					t.Errorf("%d lines for the late open, want 1", n)
				}
				if h.wb.Tracked() != 0 {
					t.Errorf("still tracked on %q", h.lists()["/big"])
				}
			}, withLogs(zapcore.DebugLevel, &logs))
		})
	}
}

// TestSnapshotDuringAttempt: while an attempt runs, its inode counts in
// b_io, as the kernel's stats count an inode under writeback.
func TestSnapshotDuringAttempt(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		var during Stats
		f := h.fs.add("/a", 1, pg, 1)
		f.onWrite = func() { during = h.wb.Snapshot() }
		h.mark(f, 0)
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if during.BIO != 1 || during.BDirty != 0 || during.State&WBWritebackRunning == 0 {
			h.t.Errorf("during the attempt: b_io %d, b_dirty %d, state %#x; want 1, 0, writeback running", during.BIO, during.BDirty, during.State)
		}
	})
}
