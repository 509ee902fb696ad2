package bdi

import (
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/tree"
)

// verifyBound is how long the writes flusherd started in writeback mode
// wait for their filesystem's error cursor to be read (fsVerify.due)
// while the read, a syncfs(2) that writes back the whole filesystem,
// would write something else: a file flusherd tracks (on a busy device),
// or one it does not (the system has dirty pages: nr_dirty). It is read at
// once when neither holds. Past verifyBound it is read all
// the same, unless a tracked file would then be written more than
// verifyBound before its expiry: a tree's long expiry is not cut short to
// count a write sooner.
const verifyBound = 30 * time.Second

// maxUnverified is the most writes of one filesystem that await a read of
// its cursor file by file, named; the writes past it are only counted
// (fsVerify.more), so that the record (about 200 bytes a file) stays
// within the memory the tracked-inode budget leaves, however many files
// are written and found clean between two reads. Reaching it does not
// hasten the read.
const maxUnverified = 8192

// verifying is a device's writes made in writeback mode (sync_file_range,
// which starts writeback and does not wait for it) whose outcome is not
// known yet, per filesystem (st_dev). A write is verified once the close
// of the attempt's file returned without an error (FUSE's flush writes the
// file back there and reports a failure) and a read of the filesystem's
// error cursor (inode.ErrCursor: syncfs on a directory opened for the
// read, openCursor) begun after it found no writeback error. Only then do its pages
// count in BdiWritten and its tree's written bytes. A failed close, or an
// error on the cursor, reports each write it covers as failed
// (writeFailedLocked). Neither takes anything from the files' own error
// state: an application's fsync still reports its file's failure. Only
// with an ErrWatch (Options.Errs) are writes verified; without one they
// count when made. The list lock guards it.
type verifying struct {
	fs map[uint64]*fsVerify
}

// fsVerify is one filesystem's writes awaiting verification.
type fsVerify struct {
	// dir is a directory of the filesystem (the latest write's), where
	// the cursor is opened for a read.
	dir    string
	writes map[inode.Key]*unverifiedWrite
	// oldest is when the oldest write in writes was recorded (daemon
	// clock); seq numbers the writes recorded.
	oldest  time.Duration
	seq     uint64
	readSeq uint64 // the last write covered by a read of the cursor
	reading bool   // a read of the cursor runs
	// retryAt: a read could not tell (cursorUnknownLocked); none is
	// due before then (daemon clock). unknown: that was logged.
	retryAt time.Duration
	unknown bool
	// more counts the writes past maxUnverified, not kept file by file,
	// in buckets: a read or pass that starts seals the last (seal), so
	// that it covers that bucket whole. A read that covers a bucket
	// credits its pages or, on an error, reports how many files may have
	// lost data, unnamed. There are at most as many buckets as reads and
	// passes running, plus one.
	more []unnamedWrites
}

// unnamedWrites is writes past maxUnverified: their pages, by tree (nil:
// none), their files and the last one's seq; sealed once a read or pass
// has started after them.
type unnamedWrites struct {
	pages, files, seq uint64
	trees             map[*treeCounters]uint64
	sealed            bool
}

// seal closes v's last bucket of unnamed writes: a read or pass starts.
func (v *fsVerify) seal() {
	if n := len(v.more); n > 0 {
		v.more[n-1].sealed = true
	}
}

// unverifiedWrite is the pages flusherd started writing of one file, not
// yet verified.
type unverifiedWrite struct {
	pages uint64
	// closes counts the closes of the attempts' files that wrote these
	// pages and have not returned.
	closes int
	// seq is fsVerify.seq when pages were last added, at the daemon
	// clock's time then; verified: a read of the cursor begun after that
	// found no error.
	seq      uint64
	at       time.Duration
	verified bool
	path     string
	handle   inode.Handle
	expire   time.Duration // its tree's expiry, should it be tracked again
	tc       *treeCounters // its tree's counters; nil for none
}

// closeNote is what the closer reports of an attempt's file once its close
// has returned (closeReturned).
type closeNote struct {
	report  bool
	key     inode.Key
	path    string
	handle  inode.Handle
	expire  time.Duration
	counted bool // the close was counted in its unverifiedWrite's closes
}

// verifies reports whether writes in writeback mode are verified (an
// ErrWatch was given).
func (wb *Writeback) verifies() bool { return wb.errs != nil }

// openCursor opens the error cursor of filesystem dev at dir, or at a
// mount point of dev if dir is gone (Files.DirCursor, or
// inode.DirCursor). A description opened now sees every error no one has
// seen yet (errseq_sample): the cursor need not be held from before the
// writes it covers, so nothing keeps the filesystem busy between reads.
// An error that another syncfs(2) caller saw first is missed.
func (wb *Writeback) openCursor(dir string, dev uint64) (inode.ErrCursor, error) {
	if wb.files.DirCursor != nil {
		return wb.files.DirCursor(dir, dev)
	}
	return inode.DirCursor(dir, dev)
}

// of returns dev's state, made if need be.
func (vs *verifying) of(dev uint64) *fsVerify {
	if vs.fs == nil {
		vs.fs = map[uint64]*fsVerify{}
	}
	v := vs.fs[dev]
	if v == nil {
		v = &fsVerify{writes: map[inode.Key]*unverifiedWrite{}}
		vs.fs[dev] = v
	}
	return v
}

// startedLocked records pages of in that flusherd started writing in
// writeback mode at now (daemon clock): they count in BdiWritten once
// verified, at once without verification (verifies). closing says the
// attempt's file is yet to be closed, and the closer reports it
// (closeReturned with counted set). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) startedLocked(in *inode.Inode, pages uint64, closing bool, now time.Duration) {
	if !wb.verifies() {
		wb.wroteLocked(in, pages)
		return
	}
	v := wb.verify.of(in.Key().Dev)
	if v.seq == v.readSeq && !v.reading {
		v.oldest = now // the first write no read covers
	}
	w := v.writes[in.Key()]
	if w == nil && len(v.writes) >= maxUnverified {
		v.seq++
		if n := len(v.more); n == 0 || v.more[n-1].sealed {
			v.more = append(v.more, unnamedWrites{trees: map[*treeCounters]uint64{}})
		}
		b := &v.more[len(v.more)-1]
		b.pages += pages
		b.files++
		b.seq = v.seq
		b.trees[wb.trees.of(in)] += pages
		v.dir = in.Dir()
		return
	}
	if w == nil {
		w = &unverifiedWrite{tc: wb.trees.of(in)}
		v.writes[in.Key()] = w
	}
	w.pages += pages
	v.seq++
	w.seq, w.at, w.verified = v.seq, now, false
	w.path, w.handle = in.Path(), in.Handle()
	v.dir = in.Dir()
	w.expire = wb.bDirty.classes[in.Class].expire
	if closing {
		w.closes++
	}
}

// creditLocked counts a verified write in BdiWritten and its tree's
// written bytes. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) creditLocked(w *unverifiedWrite) {
	wb.acct.written += w.pages
	if w.tc != nil {
		w.tc.written += w.pages
	}
}

// closeReturned takes the outcome of the close of an attempt's file that
// wrote in writeback mode: a failure is the writeback's (FUSE's flush
// writes the file back and returns its error), reported as such
// (writeFailedLocked); a success may complete its write's verification.
// Called by the closer, without locks held.
func (wb *Writeback) closeReturned(n closeNote, err error) {
	wb.mu.Lock()
	var w *unverifiedWrite
	if v := wb.verify.fs[n.key.Dev]; v != nil {
		w = v.writes[n.key]
		if w != nil && n.counted && w.closes > 0 {
			w.closes--
		}
		switch {
		case w == nil:
		case err != nil:
			delete(v.writes, n.key)
		case w.verified && w.closes == 0:
			wb.creditLocked(w)
			delete(v.writes, n.key)
		}
	}
	var line func()
	if err != nil {
		if w == nil {
			w = &unverifiedWrite{path: n.path, handle: n.handle, expire: n.expire}
		}
		line = wb.writeFailedLocked(n.key, w, fmt.Errorf("close after writeback: %w", err),
			"writeback failed: closing the file after flusherd started its writeback returned an error (the filesystem's flush); its data may be lost; it is reported as failed until it is written again")
	}
	wb.gen++
	wb.mu.Unlock()
	if line != nil {
		line()
	}
	wb.live.kick()
}

// writeFailedLocked reports the file whose write w failed with err: its
// tracked inode, or a new one if it was forgotten as clean (unknown means
// tracked), gets err as its last error and is counted in
// writeback_errors; one not dirty again is put on b_failed (failed,
// flusherd dirty, the shutdown's report), one dirty again keeps its place
// with its data's error recorded (inode.DataError). It returns the log
// line (msg), for after the lock. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) writeFailedLocked(key inode.Key, w *unverifiedWrite, err error, msg string) func() {
	in := wb.inodes.Get(key)
	if in != nil && w.handle != "" && in.Handle() != "" && in.Handle() != w.handle {
		in = nil // another file took the number: not the one written
	}
	if in == nil && wb.inodes.Get(key) == nil {
		in = wb.newInodeLocked(key, w.path, w.handle, tree.Tree{Expire: w.expire})
	}
	if in == nil {
		wb.acct.errors++
		if w.tc != nil {
			w.tc.errors++
		}
	} else {
		in.Errors = satInc(in.Errors)
		in.LastErr = errnoOf(err)
		wb.attemptFailedLocked(in)
		switch {
		case wb.failedLocked(in):
		case in.Has(inode.Dirty):
			in.State |= inode.DataError
		default:
			wb.parkFailedLocked(in)
		}
	}
	path := w.path
	return func() { wb.errLog.Error(msg, logpath.String("path", path), zap.Error(err)) }
}

// startCursorReads starts a read of the error cursor of each filesystem
// whose writes await it (due), each on a goroutine of its own (syncfs
// writes back the whole filesystem and waits), counted among the calls
// off the loop. Called by the device's goroutine.
func (wb *Writeback) startCursorReads() {
	if !wb.verifies() {
		return
	}
	now := wb.now()
	type read struct {
		dev    uint64
		v      *fsVerify
		dir    string
		seq    uint64
		oldest time.Duration
	}
	var reads []read
	clean := wb.othersClean()
	wb.mu.Lock()
	idle := !wb.hasDirtyIOLocked()
	early := wb.bDirty.lastDue()-now > verifyBound
	// Past verifyBound too, not while the device's tracked dirty data
	// is more than its in-flight window: the syncfs would put all of it
	// under writeback at once, the storm flusherd's pace avoids.
	window := wb.window.size()
	calm := window <= 0 || int64(wb.acct.dirtySum)*int64(os.Getpagesize()) <= window
	// The syncfs writes back every dirty file of the filesystem, inside
	// the trees or not: at once only when nothing else is dirty.
	idle = idle && clean
	for dev, v := range wb.verify.fs {
		if len(v.writes) == 0 && len(v.more) == 0 && !v.reading {
			delete(wb.verify.fs, dev)
			continue
		}
		if !v.due(now, idle, early, calm) {
			continue
		}
		v.reading = true
		v.seal()
		reads = append(reads, read{dev, v, v.dir, v.seq, v.oldest})
	}
	wb.mu.Unlock()
	for _, r := range reads {
		id := wb.calls.track(now)
		go func() {
			// unknown: the read cannot tell whether the writes
			// failed: no directory of the filesystem opens (it is
			// shut down or unmounted), or syncfs failed for the
			// filesystem's state (EROFS after ext4's journal
			// aborted), which it returns in place of the cursor's
			// error, consumed unseen.
			var unknown error
			if _, _, watched := wb.errs.LastError(r.dev, now); !watched {
				c, err := wb.openCursor(r.dir, r.dev)
				if err == nil {
					err = c.Check()
					c.Close()
					if errors.Is(err, unix.EROFS) || errors.Is(err, unix.ESHUTDOWN) {
						unknown = err
					} else {
						wb.errs.Record(r.dev, wb.now(), err)
					}
				} else {
					unknown = err
				}
			}
			err := wb.seenSince(r.dev, r.oldest)
			wb.calls.returned(id, 0)
			wb.mu.Lock()
			var lines []func()
			if wb.verify.fs[r.dev] == r.v {
				if unknown != nil && err == nil {
					lines = wb.cursorUnknownLocked(r.dev, r.v, r.dir, unknown)
				} else {
					lines = wb.cursorReadLocked(r.dev, r.v, r.seq, err, true)
				}
			}
			wb.gen++
			wb.mu.Unlock()
			for _, l := range lines {
				l()
			}
			wb.live.kick()
		}()
	}
}

// nextRead is when (daemon clock) a filesystem's writes are due for a
// read of its cursor at the latest (verifyBound after the oldest), and
// whether any awaits one.
func (vs *verifying) nextRead() (at time.Duration, ok bool) {
	for _, v := range vs.fs {
		if v.reading || v.seq <= v.readSeq {
			continue
		}
		if t := max(v.oldest+verifyBound, v.retryAt); !ok || t < at {
			at, ok = t, true
		}
	}
	return at, ok
}

// othersClean reports whether no page is dirty in the whole system
// (/proc/vmstat nr_dirty; Options.NrDirty), so that a syncfs(2) of a
// filesystem writes back nothing flusherd does not track. Read only when
// a device with nothing tracked dirty has writes to verify. Without
// NrDirty, true.
func (wb *Writeback) othersClean() bool {
	if wb.loop.vmDirty == nil {
		return true
	}
	wb.mu.Lock()
	want := !wb.hasDirtyIOLocked()
	if want {
		want = false
		for _, v := range wb.verify.fs {
			want = want || !v.reading && v.seq > v.readSeq
		}
	}
	wb.mu.Unlock()
	if !want {
		return false
	}
	n, err := wb.loop.vmDirty()
	return err == nil && n == 0
}

// due reports whether v's cursor is to be read at now (daemon clock):
// writes not covered by a read await it, none is being read, and the
// device is idle, or the oldest write has waited verifyBound, the read
// would write no tracked file far before its expiry (early) and the
// device's tracked dirty data is within its window (calm). A stop does
// not hasten it: the syncfs would write the files of the filesystem that
// flusherd does not manage.
func (v *fsVerify) due(now time.Duration, idle, early, calm bool) bool {
	return !v.reading && v.seq > v.readSeq && now >= v.retryAt &&
		(idle || !early && calm && now-v.oldest >= verifyBound)
}

// seenSince returns the writeback error that any syncfs(2) of the
// daemon's saw on filesystem dev at or after since (daemon clock; the
// oldest write a read covers), nil for none: ErrWatch.Recorded, which
// every reader of the filesystem's cursor notes what it saw in.
func (wb *Writeback) seenSince(dev uint64, since time.Duration) error {
	at, errno := wb.errs.Recorded(dev)
	if errno == 0 || at < since {
		return nil
	}
	return errno
}

// passCoveredLocked applies a whole-filesystem pass (runPass) of dev
// that began after the write numbered seq was recorded, and after the
// write at oldest: a syncfs like a read of the cursor. Preconditions:
// wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) passCoveredLocked(dev, seq uint64, oldest time.Duration) []func() {
	if !wb.verifies() {
		return nil
	}
	v := wb.verify.fs[dev]
	if v == nil || seq <= v.readSeq {
		return nil
	}
	return wb.cursorReadLocked(dev, v, seq, wb.seenSince(dev, oldest), false)
}

// cursorUnknownLocked applies a read of v's error cursor (dir) that could
// not tell (err): its writes are neither counted as written nor reported
// as failed; they await a read tried again verifyBound later, and are
// named as of unknown outcome at a stop or when their tree goes. It
// returns the log line, the first time since a read told. Preconditions:
// wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) cursorUnknownLocked(dev uint64, v *fsVerify, dir string, err error) []func() {
	v.reading = false
	v.retryAt = wb.now() + verifyBound
	if v.unknown {
		return nil
	}
	v.unknown = true
	files := uint64(len(v.writes))
	for _, b := range v.more {
		files += b.files
	}
	return []func(){func() {
		wb.log.Warn("cannot read the filesystem's writeback error cursor: whether flusherd's writes since it was last read reached the disk is not known; they are not counted as written, and the read is tried again",
			zap.Uint64("dev", dev), logpath.String("dir", dir), zap.Uint64("files", files), zap.Stringer("retry_in", verifyBound), zap.Error(err))
	}}
}

// cursorReadLocked applies a read of v's error cursor begun after the
// write numbered seq was recorded that returned err: each write up to seq
// is verified by it (and counted once its close has returned) or, on an
// error, reported as failed with every write recorded since (the error
// may be theirs, and the read has taken it from the cursor). own says the
// read is v's own (v.reading), not a pass's. It returns the log lines,
// for after the lock. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) cursorReadLocked(dev uint64, v *fsVerify, seq uint64, err error, own bool) []func() {
	if own {
		v.reading = false
	}
	v.unknown, v.retryAt = false, 0
	if err != nil {
		seq = v.seq
	}
	v.readSeq = max(v.readSeq, seq)
	var lines []func()
	if err != nil {
		err = fmt.Errorf("the filesystem's writeback error cursor: %w", err)
	}
	left := time.Duration(-1)
	failed := 0
	for key, w := range v.writes {
		if w.seq > seq {
			if left < 0 || w.at < left {
				left = w.at
			}
			continue
		}
		switch {
		case err != nil:
			delete(v.writes, key)
			failed++
			l := wb.writeFailedLocked(key, w, err,
				"writeback may have failed: the filesystem reported a writeback error since flusherd started writing this file; its data may be lost; it is reported as failed until it is written again")
			if len(lines) < 5 {
				lines = append(lines, l)
			}
		case w.closes == 0:
			wb.creditLocked(w)
			delete(v.writes, key)
		default:
			w.verified = true
		}
	}
	var unnamed uint64
	kept := v.more[:0]
	for _, b := range v.more {
		switch {
		case b.seq > seq:
			kept = append(kept, b)
		case err != nil:
			unnamed += b.files
			wb.acct.errors += b.files
		default:
			wb.acct.written += b.pages
			for tc, pages := range b.trees {
				if tc != nil {
					tc.written += pages
				}
			}
		}
	}
	clear(v.more[len(kept):])
	v.more = kept
	if err != nil {
		n := len(lines)
		lines = append(lines, func() {
			wb.errLog.Error("a writeback error on the filesystem: every file flusherd started writing since its error cursor was last read is reported as failed (flusherd dirty lists them)",
				zap.Uint64("dev", dev), zap.Uint64("files", uint64(failed)+unnamed), zap.Int("files_logged", n), zap.Uint64("files_not_named", unnamed), zap.Error(err))
		})
	}
	if left >= 0 {
		v.oldest = left
	}
	if len(v.writes) == 0 && len(v.more) == 0 {
		delete(wb.verify.fs, dev)
	}
	return lines
}

// Unverified returns the paths of the files whose writes in writeback mode
// await verification.
func (wb *Writeback) Unverified() []string {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	var out []string
	for _, v := range wb.verify.fs {
		for _, w := range v.writes {
			out = append(out, w.path)
		}
	}
	return out
}

// awaitsVerify reports whether the device is shutting down with a read
// of an error cursor under way, or due now that it is quiet (nothing
// tracked dirty, nothing dirty in the system: othersClean): Drain waits
// for it, so that its outcome is in the shutdown's report.
func (wb *Writeback) awaitsVerify() bool {
	clean := wb.othersClean()
	wb.mu.Lock()
	defer wb.mu.Unlock()
	if !wb.stop.on {
		return false
	}
	idle := clean && !wb.hasDirtyIOLocked()
	for _, v := range wb.verify.fs {
		if v.reading || idle && v.seq > v.readSeq {
			return true
		}
	}
	return false
}

// UnverifiedCount returns how many files' writes in writeback mode await
// a read of their filesystem's error cursor, named or not.
func (wb *Writeback) UnverifiedCount() int {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	n := 0
	for _, v := range wb.verify.fs {
		n += len(v.writes)
		for _, b := range v.more {
			n += int(b.files)
		}
	}
	return n
}

// dropUnverifiedUnder forgets the writes in writeback mode awaiting a read
// of the cursor whose files are under root (a tree that is gone: its
// files are no longer tracked, nor their writes verified), and, with all, every write
// of the device's filesystems awaiting one (its last tree), unnamed ones
// included. They are not counted in BdiWritten: whether they failed is
// not known. It returns the paths of the named ones and how many files
// in all.
func (wb *Writeback) dropUnverifiedUnder(root string, all bool) (paths []string, files int) {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	for dev, v := range wb.verify.fs {
		for key, w := range v.writes {
			if all || pathUnder(w.path, root) {
				paths = append(paths, w.path)
				delete(v.writes, key)
			}
		}
		if all {
			for _, b := range v.more {
				files += int(b.files)
			}
			v.more = nil
		}
		if len(v.writes) == 0 && len(v.more) == 0 && !v.reading {
			delete(wb.verify.fs, dev)
		}
	}
	wb.gen++
	return paths, files + len(paths)
}
