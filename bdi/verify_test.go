package bdi

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestWritebackModeVerified: a write made in writeback mode
// (sync_file_range) counts in BdiWritten only once the close of the
// attempt's file returned without an error and a read of the
// filesystem's error cursor begun after it found none. A failed close
// (FUSE's flush) or an error on the cursor reports the file as failed
// (b_failed, writeback_errors) though it was forgotten as clean, and
// none of its pages count; the cursor is read once for the files of a
// quiet device, and let go afterwards. Without an ErrWatch, writes count
// when made.
func TestWritebackModeVerified(t *testing.T) {
	for _, c := range []struct {
		name               string
		verify             bool
		closeErr, fsErr    error
		wantFailed         int
		wantWritten, wantE uint64
	}{
		{"clean", true, nil, nil, 0, 12, 0},
		{"close-eio", true, syscall.EIO, nil, 1, 8, 1},
		{"cursor-enospc", true, nil, syscall.ENOSPC, 3, 0, 3},
		{"unverified", false, syscall.EIO, nil, 0, 12, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			withWB(t, cfg, func(h *harness) {
				t := h.t
				time.Sleep(time.Second)
				files := fastFiles(h, 3)
				for _, f := range files {
					h.mark(f, time.Second)
				}
				h.afterSample(files[0].path) // its close is not the attempt's
				files[0].set(func(f *fakeFile) { f.closeErr = c.closeErr })
				h.fs.mu.Lock()
				h.fs.cursorErr = c.fsErr
				h.fs.mu.Unlock()
				time.Sleep(3 * time.Second)
				synctest.Wait()
				s := h.wb.Snapshot()
				if s.BdiWritten != c.wantWritten || s.WritebackErrors != c.wantE || s.FailedFiles != c.wantFailed {
					t.Errorf("BdiWritten %d pages, writeback_errors %d, failed %d; want %d, %d, %d",
						s.BdiWritten, s.WritebackErrors, s.FailedFiles, c.wantWritten, c.wantE, c.wantFailed)
				}
				failed := h.wb.Failed()
				if len(failed) != c.wantFailed {
					t.Errorf("failed files %v, want %d", failed, c.wantFailed)
				}
				want := c.closeErr
				if c.fsErr != nil {
					want = c.fsErr
				}
				for _, fl := range failed {
					if !errors.Is(fl.Err, want) {
						t.Errorf("%s failed with %v, want %v", fl.Path, fl.Err, want)
					}
				}
				checks := len(h.fs.callsOf("cursor_check", ""))
				switch {
				case c.verify && checks != 1:
					t.Errorf("%d reads of the error cursor for one quiet device, want 1", checks)
				case !c.verify && checks != 0:
					t.Errorf("%d reads of the error cursor without an ErrWatch, want 0", checks)
				}
				if n := len(h.wb.Unverified()); n != 0 {
					t.Errorf("%d writes left unverified", n)
				}
				h.fs.mu.Lock()
				held := h.fs.cursors
				h.fs.mu.Unlock()
				if held != 0 {
					t.Errorf("%d error cursors held on a quiet device with nothing to verify", held)
				}
			}, func(h *harness) {
				if c.verify {
					h.wb.errs = NewErrWatch()
				}
			})
		})
	}
}

// TestVerifyUnknown: a read of the error cursor that cannot tell (no
// directory of the filesystem opens; syncfs fails with EROFS, the
// filesystem's state, in place of the cursor's error) neither counts the
// writes nor reports them failed: they stay unverified, and the read is
// tried again verifyBound later, which counts them once it can tell.
func TestVerifyUnknown(t *testing.T) {
	for _, c := range []struct {
		name              string
		openErr, checkErr error
	}{
		{"no-directory", syscall.ENODEV, nil},
		{"syncfs-erofs", nil, syscall.EROFS},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			withWB(t, cfg, func(h *harness) {
				t := h.t
				time.Sleep(time.Second)
				files := fastFiles(h, 3)
				h.fs.mu.Lock()
				h.fs.cursorOpenErr, h.fs.cursorErr = c.openErr, c.checkErr
				h.fs.mu.Unlock()
				for _, f := range files {
					h.mark(f, time.Second)
				}
				time.Sleep(3 * time.Second)
				synctest.Wait()
				s := h.wb.Snapshot()
				if s.BdiWritten != 0 || s.WritebackErrors != 0 || s.FailedFiles != 0 || len(h.wb.Unverified()) != 3 {
					t.Errorf("after a read that cannot tell: BdiWritten %d pages, writeback_errors %d, failed %d, unverified %d; want 0, 0, 0, 3",
						s.BdiWritten, s.WritebackErrors, s.FailedFiles, len(h.wb.Unverified()))
				}
				if n := len(h.fs.callsOf("cursor_open", "")); n != 1 {
					t.Errorf("%d opens of the error cursor, want 1 before verifyBound", n)
				}
				h.fs.mu.Lock()
				h.fs.cursorOpenErr = nil
				h.fs.mu.Unlock()
				time.Sleep(verifyBound)
				synctest.Wait()
				s = h.wb.Snapshot()
				if s.BdiWritten != 12 || s.FailedFiles != 0 || len(h.wb.Unverified()) != 0 {
					t.Errorf("after the read tried again: BdiWritten %d pages, failed %d, unverified %d; want 12, 0, 0",
						s.BdiWritten, s.FailedFiles, len(h.wb.Unverified()))
				}
				if n := len(h.fs.callsOf("cursor_open", "")); n != 2 {
					t.Errorf("%d opens of the error cursor, want 2", n)
				}
			}, func(h *harness) { h.wb.errs = NewErrWatch() })
		})
	}
}

// TestVerifyErrorLogCounts: the log line of an error on the cursor
// counts every file reported failed, not only the 5 it names.
func TestVerifyErrorLogCounts(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		time.Sleep(time.Second)
		h.fs.mu.Lock()
		h.fs.cursorErr = syscall.ENOSPC
		h.fs.mu.Unlock()
		for _, f := range fastFiles(h, 8) {
			h.mark(f, time.Second)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		lines := logs.FilterMessageSnippet("a writeback error on the filesystem").All()
		if len(lines) != 1 {
			h.t.Fatalf("%d lines of the cursor's error, want 1", len(lines))
		}
		if m := lines[0].ContextMap(); m["files"] != uint64(8) || m["files_logged"] != int64(5) {
			h.t.Errorf("the cursor's error line: files %v, files_logged %v; want 8, 5", m["files"], m["files_logged"])
		}
	}, func(h *harness) {
		h.wb.errs = NewErrWatch()
		h.wb.log = zap.New(core)
		h.wb.errLog = newSampledLog(h.wb.log)
	})
}

// TestVerifyBound: on a device that never goes quiet (a file whose pages
// stay dirty), the error cursor of another file's writes is still read,
// verifyBound after the oldest, and the writes it covers count.
func TestVerifyBound(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		t := h.t
		time.Sleep(time.Second)
		stuck := h.fs.add("/stuck", 2, 4*pg, 4)
		stuck.keepDirty = true
		h.mark(stuck, time.Second)
		busy := h.fs.add("/busy", 1, 4*pg, 4)
		busy.fastDevice = true
		for range int(verifyBound/time.Second) - 5 {
			for p := range int64(4) {
				busy.redirty(p)
			}
			h.mark(busy, time.Second)
			time.Sleep(time.Second)
		}
		synctest.Wait()
		if n := len(h.fs.callsOf("cursor_check", "")); n != 0 {
			t.Fatalf("%d reads of the error cursor on a busy device before verifyBound", n)
		}
		if s := h.wb.Snapshot(); s.BdiWritten != 0 {
			t.Errorf("BdiWritten %d pages before any read of the error cursor, want 0", s.BdiWritten)
		}
		for range 10 {
			for p := range int64(4) {
				busy.redirty(p)
			}
			h.mark(busy, time.Second)
			time.Sleep(time.Second)
		}
		synctest.Wait()
		if n := len(h.fs.callsOf("cursor_check", "")); n == 0 {
			t.Errorf("no read of the error cursor %v into a busy device's writes", verifyBound+5*time.Second)
		}
		if s := h.wb.Snapshot(); s.BdiWritten == 0 {
			t.Errorf("BdiWritten 0 after the error cursor was read clean")
		}
	}, func(h *harness) { h.wb.errs = NewErrWatch() })
}

// TestVerifyBoundWaitsForCalm: past verifyBound, the read of the error
// cursor (a syncfs that writes back the whole filesystem) is not made
// while the device's tracked dirty data is more than its in-flight window
// (8 MiB stuck dirty against 1 MiB): that syncfs would put it all under
// writeback at once. Once the data is written, the read is made.
func TestVerifyBoundWaitsForCalm(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.TargetLatency, cfg.MaxInflight = 25*time.Millisecond, 16<<20
	withWB(t, cfg, func(h *harness) {
		t := h.t
		time.Sleep(time.Second)
		big := h.fs.add("/big", 2, 2048*pg, 2048)
		big.keepDirty = true
		h.mark(big, time.Second)
		short := h.fs.add("/short", 1, 4*pg, 4)
		short.fastDevice = true
		h.mark(short, time.Second)
		time.Sleep(verifyBound + 10*time.Second)
		synctest.Wait()
		if n := len(h.fs.callsOf("cursor_check", "")); n != 0 {
			t.Errorf("%d reads of the error cursor with 8 MiB tracked dirty against a %d-byte window", n, h.wb.window.size())
		}
		big.set(func(f *fakeFile) { f.keepDirty = false; f.fastDevice = true })
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := len(h.fs.callsOf("cursor_check", "")); n == 0 {
			t.Errorf("no read of the error cursor once the dirty data was written")
		}
	}, func(h *harness) { h.wb.errs = NewErrWatch() })
}

// TestVerifyBoundSparesLongExpiry: while a file of a tree with an hour's
// expiry is dirty on the device, the read of the error cursor (a syncfs
// that would write it) is not made at verifyBound for another file's
// write: it waits until the file is due within verifyBound, or written.
func TestVerifyBoundSparesLongExpiry(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		t := h.t
		time.Sleep(time.Second)
		long := h.fs.add("/long", 2, 4*pg, 4)
		h.mark(long, time.Hour)
		short := h.fs.add("/short", 1, 4*pg, 4)
		short.fastDevice = true
		h.mark(short, time.Second)
		time.Sleep(verifyBound + 10*time.Second)
		synctest.Wait()
		if n := len(h.fs.callsOf("cursor_check", "")); n != 0 {
			t.Errorf("%d reads of the error cursor with a file an hour from its expiry dirty", n)
		}
		if s := h.wb.Snapshot(); s.BdiWritten != 0 {
			t.Errorf("BdiWritten %d pages before any read of the error cursor, want 0", s.BdiWritten)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := len(h.fs.callsOf("cursor_check", "")); n == 0 {
			t.Errorf("no read of the error cursor once the long file was written")
		}
		if s := h.wb.Snapshot(); s.BdiWritten != 8 {
			t.Errorf("BdiWritten %d pages once verified, want 8", s.BdiWritten)
		}
	}, func(h *harness) { h.wb.errs = NewErrWatch() })
}

// TestVerifyUnnamed: the writes awaiting a read of the error cursor are
// kept file by file up to maxUnverified a filesystem, and counted past
// it; reaching it does not hasten the read on a busy device, and the read
// at verifyBound credits every write, named or not, or reports them all
// failed on an error.
func TestVerifyUnnamed(t *testing.T) {
	const extra = 10
	for _, fsErr := range []error{nil, syscall.EIO} {
		t.Run(fmt.Sprint(fsErr), func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			withWB(t, cfg, func(h *harness) {
				t := h.t
				stuck := h.fs.add("/stuck", 1, 4*pg, 4)
				stuck.keepDirty = true // the device is never idle
				h.mark(stuck, time.Second)
				for i := range maxUnverified + extra {
					f := h.fs.add(fmt.Sprintf("/f%d", i), uint64(i+2), pg, 1)
					f.fastDevice = true
					h.mark(f, time.Second)
				}
				time.Sleep(4 * time.Second)
				synctest.Wait()
				if n := len(h.fs.callsOf("cursor_check", "")); n != 0 {
					t.Errorf("%d reads of the error cursor with %d writes waiting 4 s in, want none before verifyBound %v", n, maxUnverified+extra, verifyBound)
				}
				if n := len(h.wb.Unverified()); n != maxUnverified {
					t.Errorf("%d writes kept file by file, want %d", n, maxUnverified)
				}
				h.fs.mu.Lock()
				h.fs.cursorErr = fsErr
				h.fs.mu.Unlock()
				time.Sleep(verifyBound)
				synctest.Wait()
				s := h.wb.Snapshot()
				want := uint64(maxUnverified + extra)
				switch {
				case fsErr == nil && (s.BdiWritten != want || s.WritebackErrors != 0):
					t.Errorf("BdiWritten %d pages, writeback_errors %d after a clean read; want %d, 0", s.BdiWritten, s.WritebackErrors, want)
				case fsErr != nil && (s.BdiWritten != 0 || s.WritebackErrors != want || s.FailedFiles != maxUnverified):
					t.Errorf("BdiWritten %d pages, writeback_errors %d, failed %d after a read with an error; want 0, %d, %d",
						s.BdiWritten, s.WritebackErrors, s.FailedFiles, want, maxUnverified)
				}
				if n := len(h.wb.Unverified()); n != 0 {
					t.Errorf("%d writes left unverified", n)
				}
			}, func(h *harness) { h.wb.errs = NewErrWatch() })
		})
	}
}

// TestVerifySeenElsewhere: a writeback error that another of the
// daemon's syncfs calls took from the filesystem's cursor (a pass, an
// integrity check: ErrWatch.Record) after a write reports that write
// failed, though the read of the cursor then finds nothing; one seen
// before the write does not.
func TestVerifySeenElsewhere(t *testing.T) {
	for _, after := range []bool{false, true} {
		t.Run(fmt.Sprint("after=", after), func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			withWB(t, cfg, func(h *harness) {
				t := h.t
				time.Sleep(time.Second)
				if !after {
					h.wb.errs.Record(7, h.now(), syscall.EIO)
				}
				time.Sleep(time.Second)
				stuck := h.fs.add("/stuck", 1, 4*pg, 4)
				stuck.keepDirty = true
				h.mark(stuck, time.Second)
				f := h.fs.add("/f", 2, pg, 1)
				f.fastDevice = true
				h.mark(f, time.Second)
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if after {
					h.wb.errs.Record(7, h.now(), syscall.EIO)
				}
				time.Sleep(verifyBound)
				synctest.Wait()
				if n := len(h.fs.callsOf("cursor_check", "")); n == 0 {
					t.Fatalf("no read of the error cursor")
				}
				s := h.wb.Snapshot()
				if after && (s.FailedFiles != 1 || s.BdiWritten != 0) {
					t.Errorf("failed %d, BdiWritten %d after an error seen by another check; want 1, 0", s.FailedFiles, s.BdiWritten)
				}
				if !after && (s.FailedFiles != 0 || s.BdiWritten != 1) {
					t.Errorf("failed %d, BdiWritten %d with an error seen before the write; want 0, 1", s.FailedFiles, s.BdiWritten)
				}
			}, func(h *harness) { h.wb.errs = NewErrWatch() })
		})
	}
}

// TestVerifyAtStop: a stop does not read the error cursor while other
// files are dirty in the system (its syncfs would write them): the
// writes are left unverified, for the shutdown's report. With nothing
// dirty, the read made once the device is quiet is waited for, and its
// outcome counted.
func TestVerifyAtStop(t *testing.T) {
	for _, c := range []struct {
		name     string
		sysDirty uint64
		fsErr    error
	}{
		{"system-dirty", 100, nil},
		{"system-clean", 0, nil},
		{"system-clean-eio", 0, syscall.EIO},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DirtyWritebackInterval = time.Second
			withWB(t, cfg, func(h *harness) {
				t := h.t
				time.Sleep(time.Second)
				stuck := h.fs.add("/stuck", 1, 4*pg, 4)
				stuck.keepDirty = true
				h.mark(stuck, time.Second)
				f := h.fs.add("/f", 2, pg, 1)
				f.fastDevice = true
				h.mark(f, time.Second)
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if n := len(h.fs.callsOf("cursor_check", "")); n != 0 {
					t.Fatalf("%d reads of the error cursor on a busy device 3 s in", n)
				}
				h.fs.mu.Lock()
				h.fs.cursorErr = c.fsErr
				h.fs.cursorDelay = time.Second
				h.fs.mu.Unlock()
				h.wb.loop.vmDirty = func() (uint64, error) { return c.sysDirty, nil }
				stuck.set(func(f *fakeFile) { f.keepDirty = false })
				h.wb.mu.Lock()
				h.wb.stop.on = true
				h.wb.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := h.wb.Drain(ctx, "shutdown"); err != nil {
					t.Fatalf("drain: %v", err)
				}
				s := h.wb.Snapshot()
				checks := len(h.fs.callsOf("cursor_check", ""))
				unv := h.wb.UnverifiedCount()
				switch {
				case c.sysDirty > 0 && (checks != 0 || unv != 2 || s.BdiWritten != 0):
					t.Errorf("system dirty: %d reads of the cursor, %d writes unverified, BdiWritten %d; want 0, 2, 0", checks, unv, s.BdiWritten)
				case c.sysDirty == 0 && unv != 0:
					t.Errorf("system clean: %d writes unverified after the drain, want 0 (%d reads of the cursor)", unv, checks)
				case c.sysDirty == 0 && c.fsErr == nil && s.BdiWritten < 1:
					t.Errorf("BdiWritten %d pages after the stop's read, want the write counted", s.BdiWritten)
				case c.fsErr != nil && s.FailedFiles == 0:
					t.Errorf("no failed file after the stop's read found %v", c.fsErr)
				}
			}, func(h *harness) {
				h.wb.errs = NewErrWatch()
				// Other files are dirty in the system until the stop.
				h.wb.loop.vmDirty = func() (uint64, error) { return 100, nil }
			})
		})
	}
}

// TestVerifyTreeGone: the writes awaiting a read of the cursor under a
// tree that is gone are let go and returned, named, without being
// counted; with all (the device's last tree), every one of the device's,
// unnamed ones included.
func TestVerifyTreeGone(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		t := h.t
		stuck := h.fs.add("/stuck", 1, 4*pg, 4)
		stuck.keepDirty = true // the device is never idle: no read
		h.mark(stuck, time.Second)
		b := h.fs.add("/b/g", 1<<20, pg, 1)
		b.fastDevice = true
		h.mark(b, time.Second)
		time.Sleep(time.Second)
		synctest.Wait()
		for i := range maxUnverified + 5 {
			f := h.fs.add(fmt.Sprintf("/a/f%d", i), uint64(i+2), pg, 1)
			f.fastDevice = true
			h.mark(f, time.Second)
		}
		time.Sleep(4 * time.Second)
		synctest.Wait()
		if n := h.wb.UnverifiedCount(); n < maxUnverified+6 {
			t.Fatalf("%d writes await a read, want %d", n, maxUnverified+6)
		}
		paths, files := h.wb.dropUnverifiedUnder("/b", false)
		if files != 1 || len(paths) != 1 || paths[0] != "/b/g" {
			t.Errorf("dropped under /b: %v (%d files), want /b/g alone", paths, files)
		}
		_, files = h.wb.dropUnverifiedUnder("/a", true)
		if files < maxUnverified+5 {
			t.Errorf("dropped with all: %d files, want at least %d (named and unnamed)", files, maxUnverified+5)
		}
		if n := h.wb.UnverifiedCount(); n != 0 {
			t.Errorf("%d writes still await a read", n)
		}
		time.Sleep(verifyBound)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.BdiWritten != 0 {
			t.Errorf("BdiWritten %d pages for writes whose outcome is not known, want 0", s.BdiWritten)
		}
	}, func(h *harness) { h.wb.errs = NewErrWatch() })
}

// fastFiles adds n files /f0... of 4 dirty pages each on a device that
// finishes writeback at once.
func fastFiles(h *harness, n int) []*fakeFile {
	var files []*fakeFile
	for i := range n {
		f := h.fs.add(fmt.Sprintf("/f%d", i), uint64(i+1), 4*pg, 4)
		f.fastDevice = true
		files = append(files, f)
	}
	return files
}
