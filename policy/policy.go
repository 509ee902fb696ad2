// Package policy holds flusherd's writeback decisions as pure functions of
// their inputs and of the current time: when an inode's dirty data has
// expired, which list an inode goes to after a writeback attempt, and how
// long the writeback goroutine pauses while blocked inodes wait.
//
// Times are durations on the daemon's monotonic clock (time since the
// daemon's epoch), so they order correctly across wall-clock steps.
//
// The requeue table follows fs/fs-writeback.c requeue_inode() as changed by
// the series "writeback: avoid touching dirtied_when on blocked inodes":
// inodes that cannot be written now go to b_more_io_wait (requeue_io_wait)
// and keep their dirtied_when, instead of redirty_tail, which resets it.
package policy

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"time"
)

// Expired reports whether an inode dirtied at dirtiedWhen is due for
// kupdate writeback at now: its data is at least expire old. It is the test
// move_expired_inodes() makes with inode_dirtied_after() against
// older_than_this = now - dirty_expire_interval. All values are nanoseconds on
// the daemon's monotonic clock.
func Expired(now, dirtiedWhen, expire time.Duration) bool {
	// Written as an age so that a huge expire cannot overflow.
	return now-dirtiedWhen >= expire
}

// Outcome is the result of one writeback attempt on one inode.
type Outcome uint8

// The outcomes, one per row of the requeue table in DESIGN.md.
const (
	// Clean: no dirty pages left (writeback pages may still be in flight).
	Clean Outcome = iota
	// ChunkUsed: write_chunk was used up and more is dirty (requeue_io).
	ChunkUsed
	// Redirtied: the inode was dirtied again while it was being written.
	Redirtied
	// Skipped: still dirty afterwards, though not redirtied and not over
	// the chunk (pages locked or skipped by the filesystem).
	Skipped
	// Blocked: EAGAIN, EINTR, EBUSY, EMFILE, ENFILE, or an attempt that
	// exceeded the attempt timeout.
	Blocked
	// FSUnavailable: the filesystem is read-only (EROFS) or going away.
	FSUnavailable
	// UnderWriteback: another attempt holds it (I_SYNC), or only writeback
	// pages remain, for non-integrity work.
	UnderWriteback
	// IOError: EIO, ENOSPC, EDQUOT or another error of the write path.
	IOError
	// Gone: the file no longer exists (ENOENT, ESTALE) or is no longer the
	// inode that was tracked.
	Gone
	// NumOutcomes is the number of outcomes.
	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{"clean", "chunk_used", "redirtied", "skipped", "blocked", "fs_unavailable", "under_writeback", "io_error", "gone"}

func (o Outcome) String() string {
	if o < NumOutcomes {
		return outcomeNames[o]
	}
	return "outcome?"
}

// Dest is where an inode goes after an attempt.
type Dest uint8

const (
	// Forget: off the lists; the inode is no longer tracked.
	Forget Dest = iota
	// MoreIO: b_more_io, retried at the next queueIO (requeue_io).
	MoreIO
	// MoreIOWait: b_more_io_wait, dirtiedWhen kept, retried after the
	// backoff pause (requeue_io_wait).
	MoreIOWait
	// RedirtyTail: b_dirty with dirtiedWhen = now (legacy redirty_tail).
	RedirtyTail
	// Drop: the inode is gone; forget it and count it.
	Drop
	// Failed: its data was lost (Lost): off the writeback lists, kept and
	// reported as failed until it is written again.
	Failed
)

func (d Dest) String() string {
	return [...]string{"forget", "b_more_io", "b_more_io_wait", "redirty_tail", "drop", "failed"}[d]
}

// Lost reports whether an attempt shows that the inode's data was lost:
// a writeback of it failed with an I/O error since it was last written
// (hadIOError), and this attempt read its page counts (read: its open and
// first cachestat succeeded) and found no dirty and no writeback pages, so
// the data is not in the page cache to be written: after a failed
// writeback the kernel marks the pages clean (mapping_set_error; the data
// is dropped). Whatever the attempt then met changes nothing: a retry that
// succeeds (Clean) proves nothing, and one that fails (the filesystem went
// read-only after the error, EROFS; its server died, ENOTCONN; the error
// again) only hides the loss, which would otherwise wait for a clean
// attempt that never comes. A new write since (redirtied) is not lost; a
// file gone (Gone) is dropped, not lost.
func Lost(o Outcome, hadIOError, read bool, dirtyBefore, writebackBefore uint64, redirtied bool) bool {
	return o != Gone && read && hadIOError && dirtyBefore == 0 && writebackBefore == 0 && !redirtied
}

// RequeueBlocked selects what happens to an inode that could not be written
// now: the series' b_more_io_wait, or the legacy redirty_tail.
type RequeueBlocked uint8

const (
	IOWait RequeueBlocked = iota
	LegacyRedirtyTail
)

// Requeue returns the list an inode goes to after an attempt with outcome o,
// as requeue_inode() decides it.
func Requeue(o Outcome, p RequeueBlocked) Dest {
	switch o {
	case Clean:
		return Forget
	case ChunkUsed:
		return MoreIO
	case Gone:
		return Drop
	}
	if p == LegacyRedirtyTail {
		return RedirtyTail
	}
	return MoreIOWait
}

// ClassifyErr maps an error of open(2), cachestat(2), sync_file_range(2) or
// fdatasync(2) to an outcome. nil is Clean. Errors are matched with
// errors.Is on syscall.Errno:
//
//	EAGAIN, EINTR, EBUSY, EMFILE, ENFILE, ENOMEM,
//	ENOBUFS, ETIMEDOUT                              -> Blocked
//	EROFS, ESHUTDOWN, ENODEV, ENXIO, ENOTCONN        -> FSUnavailable
//	                                                    (ENOTCONN: a FUSE
//	                                                    server that died)
//	ENOENT, ESTALE, ENOTDIR, ELOOP                   -> Gone (the path no
//	                                                    longer leads to the file)
//	anything else (EIO, ENOSPC, EDQUOT, ...)         -> IOError
func ClassifyErr(err error) Outcome {
	if err == nil {
		return Clean
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return IOError
	}
	switch errno {
	case syscall.EAGAIN, syscall.EINTR, syscall.EBUSY, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM,
		syscall.ENOBUFS, syscall.ETIMEDOUT:
		return Blocked
	case syscall.EROFS, syscall.ESHUTDOWN, syscall.ENODEV, syscall.ENXIO, syscall.ENOTCONN:
		return FSUnavailable
	case syscall.ENOENT, syscall.ESTALE, syscall.ENOTDIR, syscall.ELOOP:
		return Gone
	}
	return IOError
}

// DeviceLevel reports whether err says that the file's device, not the
// file, failed, and returns its errno: the filesystem is gone or read-only
// (EROFS, ESHUTDOWN, ENODEV, ENXIO, ENOTCONN: a FUSE server that died), a
// call ran past the attempt timeout (ETIMEDOUT), or the open itself failed
// with EIO (an error from opening, an *os.PathError whose Op begins with
// "open", such as open_by_handle_at; EIO from a write is the file's data).
// A device whose every retry fails so is probed with one file at a time
// (bdi's probing state) instead of retrying all of them.
func DeviceLevel(err error) (syscall.Errno, bool) {
	if err == nil {
		return 0, false // (errors.As would allocate for errno)
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return 0, false
	}
	switch errno {
	case syscall.EROFS, syscall.ESHUTDOWN, syscall.ENODEV, syscall.ENXIO, syscall.ENOTCONN, syscall.ETIMEDOUT:
		return errno, true
	case syscall.EIO:
		var pe *os.PathError
		if errors.As(err, &pe) && strings.HasPrefix(pe.Op, "open") {
			return errno, true
		}
	}
	return 0, false
}

// OpenFailed reports whether err is an open (an *os.PathError whose Op
// begins with "open", such as open_by_handle_at) that the filesystem
// refused with an I/O-class error (IOError: EIO from a filesystem shut
// down or failing, EUCLEAN or EBADMSG from a corrupted inode), which a
// retry within the shutdown's wait will not get past.
func OpenFailed(err error) bool {
	if ClassifyErr(err) != IOError {
		return false
	}
	var pe *os.PathError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Op, "open")
}

// Shortage reports whether err says that a resource ran out for a moment
// or the call was interrupted: EMFILE, ENFILE (descriptors), ENOMEM,
// ENOBUFS (memory), EAGAIN, EINTR, matched with errors.Is. Retrying later
// may succeed, so what the failed step knew is kept and the step is
// retried with backoff; nothing is dropped for it. Every step from event to
// tracked inode and every writeback attempt uses this one predicate.
func Shortage(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS, syscall.EAGAIN, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// BeforeWrite decides from cachestat(2) page counts taken before an attempt
// whether there is anything to write: write is false when the inode is clean
// (Clean), or when only writeback pages remain and the work is not for
// integrity (UnderWriteback: the data is in flight; the next pass sees it
// clean). Integrity work (WB_SYNC_ALL) always writes, since fdatasync also
// waits for pages already under writeback.
func BeforeWrite(dirty, writeback uint64, integrity bool) (o Outcome, write bool) {
	switch {
	case integrity:
		return Clean, true
	case dirty > 0:
		return Clean, true
	case writeback > 0:
		return UnderWriteback, false
	}
	return Clean, false
}

// AfterWrite classifies an attempt that returned no error from the state it
// left behind: dirty and writeback are cachestat(2) page counts after the
// attempt, redirtied says an event for the inode arrived during it (it takes
// precedence: the write it reports may have come after the count, so the
// inode must stay tracked), and chunkUsed says the attempt stopped at
// write_chunk with more of the file left to write. An inode is Clean only
// when neither dirty nor writeback pages remain: flusherd forgets an inode
// once its data has reached the device, not when writeback has merely
// started; until then it is UnderWriteback.
func AfterWrite(dirty, writeback uint64, redirtied, chunkUsed bool) Outcome {
	switch {
	case redirtied:
		return Redirtied
	case dirty == 0 && writeback == 0:
		return Clean
	case dirty == 0:
		return UnderWriteback
	case chunkUsed:
		return ChunkUsed
	default:
		return Skipped
	}
}

// Backoff is the pause schedule of a writeback goroutine while b_more_io_wait
// is non-empty: the first pause is Min, each pass that makes no progress
// doubles it up to Max, and progress resets it to Min. The zero Pause means
// "not backing off". Durations are nanoseconds (time.Duration).
type Backoff struct {
	Min, Max time.Duration
	Pause    time.Duration
}

// Next returns the pause to sleep after a pass, and updates b: progress says
// the pass wrote pages or cleaned inodes (wb->last_active was updated).
func (b *Backoff) Next(progress bool) time.Duration {
	switch {
	case progress || b.Pause == 0:
		b.Pause = b.Min
	default:
		b.Pause *= 2
	}
	// Clamped to [Min, Max] (Min wins if they cross).
	b.Pause = max(min(b.Pause, b.Max), b.Min)
	return b.Pause
}

// Reset ends backing off (b_more_io_wait became empty).
func (b *Backoff) Reset() { b.Pause = 0 }
