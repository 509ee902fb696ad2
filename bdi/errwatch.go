package bdi

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/inode"
)

// ErrWatch sees the writeback errors of whole filesystems, for integrity
// trees. A file's writeback error is reported once per descriptor that was
// open when it happened, and to a descriptor opened later only while no
// one has seen it (errseq_t, "report once to a later opener", Linux 4.17):
// once another process's fsync has taken it, flusherd's own fdatasync on a
// descriptor it opened afterwards returns 0. The filesystem keeps its own
// error cursor too (s_wb_err, reported by syncfs(2) since Linux 5.8), and a
// descriptor held from the time a tree is added sees every error of the
// filesystem from then on, whoever saw it first. That cursor is separate
// from the files': checking it takes nothing from an application's fsync.
//
// Holding the descriptor keeps the filesystem busy: umount(8) fails with
// EBUSY while an integrity tree is on it (remove the tree, or stop the
// daemon, first).
//
// Safe for concurrent use.
type ErrWatch struct {
	mu sync.Mutex
	// +checklocks:mu
	fses map[uint64]*fsErrs
	// seen is the last error each filesystem's syncfs(2) returned to a
	// caller other than LastError (Record), by st_dev.
	// +checklocks:mu
	seen map[uint64]seenErr
	// checks counts the syncfs(2) calls of LastError.
	checks atomic.Uint64
}

// Checks returns how many times LastError ran syncfs(2).
func (e *ErrWatch) Checks() uint64 { return e.checks.Load() }

type fsErrs struct {
	// check is held across a syncfs and the update of lastErr: two
	// concurrent checks share one error cursor, so the second could
	// otherwise return before the first has recorded the error it took.
	check sync.Mutex
	fd    int
	roots map[string]bool
	// lastErr is when a check last saw an error (daemon clock), 0 for
	// never.
	lastErr time.Duration
	// lastErrno is the error that check saw (EIO when the check itself
	// could not be made).
	lastErrno unix.Errno
}

// seenErr is when (daemon clock) an error was seen, and which.
type seenErr struct {
	at    time.Duration
	errno unix.Errno
}

// NewErrWatch returns an ErrWatch that watches no filesystem.
func NewErrWatch() *ErrWatch {
	return &ErrWatch{fses: map[uint64]*fsErrs{}, seen: map[uint64]seenErr{}}
}

// Add starts watching the filesystem of the directory root (an integrity
// tree's root) and returns its st_dev. Errors are *os.PathError.
func (e *ErrWatch) Add(root string) (uint64, error) {
	fd, err := inode.OpenDir(root)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: root, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, &os.PathError{Op: "fstat", Path: root, Err: err}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.fses[st.Dev]; f != nil {
		unix.Close(fd) // the older descriptor has seen more
		f.roots[root] = true
		return st.Dev, nil
	}
	e.fses[st.Dev] = &fsErrs{fd: fd, roots: map[string]bool{root: true}}
	return st.Dev, nil
}

// Remove stops watching for root; the descriptor is closed with the last
// root of its filesystem.
func (e *ErrWatch) Remove(root string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for dev, f := range e.fses {
		if !f.roots[root] {
			continue
		}
		delete(f.roots, root)
		if len(f.roots) == 0 {
			unix.Close(f.fd)
			delete(e.fses, dev)
		}
	}
}

// Close closes every descriptor.
func (e *ErrWatch) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for dev, f := range e.fses {
		unix.Close(f.fd)
		delete(e.fses, dev)
	}
}

// LastError checks filesystem dev for writeback errors with syncfs(2) on
// the held descriptor and returns when an error was last seen (now, if
// this check saw one; the daemon clock), 0 if never, and whether dev is
// watched at all. syncfs also writes back and commits the whole
// filesystem, so it is called only when a file's data left the page cache
// without flusherd writing it, once per batch and filesystem (bdi's
// checkFSErrors). A syncfs that fails otherwise than with a
// writeback error is taken as one: unknown is not clean. errno is the
// error the last check that saw one got (EIO when the check could not be
// made).
func (e *ErrWatch) LastError(dev uint64, now time.Duration) (at time.Duration, errno unix.Errno, watched bool) {
	e.mu.Lock()
	f := e.fses[dev]
	fd := -1
	if f != nil {
		// Duplicated (the same open file, so the same error cursor),
		// so that a Remove during the call cannot close it under
		// syncfs.
		if d, err := unix.FcntlInt(uintptr(f.fd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			fd = d
		}
	}
	e.mu.Unlock()
	if f == nil {
		return 0, 0, false
	}
	if fd < 0 {
		return now, unix.EIO, true // cannot check: assume the worst
	}
	e.checks.Add(1)
	f.check.Lock()
	defer f.check.Unlock()
	err := unix.Syncfs(fd)
	unix.Close(fd)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		f.lastErr = now
		if !errors.As(err, &f.lastErrno) {
			f.lastErrno = unix.EIO
		}
	}
	return f.lastErr, f.lastErrno, true
}

// Record notes err, returned at now (daemon clock) by a syncfs(2) of
// filesystem dev made outside LastError (a whole-filesystem pass, a read
// of a writeback tree's cursor); nil is nothing to note. The filesystem's
// cursor reports an error once to each descriptor, and to one opened
// later only while no one has seen it: every syncfs the daemon makes
// notes what it saw here, so that no reader of the daemon's hides an
// error from another (Recorded).
func (e *ErrWatch) Record(dev uint64, now time.Duration, err error) {
	if err == nil {
		return
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		errno = unix.EIO
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.seen == nil {
		e.seen = map[uint64]seenErr{}
	}
	if s, ok := e.seen[dev]; !ok || now >= s.at {
		e.seen[dev] = seenErr{now, errno}
	}
}

// Recorded returns when (daemon clock) any syncfs(2) of the daemon's on
// filesystem dev last saw a writeback error (LastError or Record), and
// the error; 0 and 0 for never.
func (e *ErrWatch) Recorded(dev uint64) (at time.Duration, errno unix.Errno) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.seen[dev]; ok {
		at, errno = s.at, s.errno
	}
	if f := e.fses[dev]; f != nil && f.lastErr != 0 && f.lastErr >= at {
		at, errno = f.lastErr, f.lastErrno
	}
	return at, errno
}
