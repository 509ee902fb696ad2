package policy

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestExpired(t *testing.T) {
	s := time.Second
	tests := []struct {
		now, dirtied, expire time.Duration
		want                 bool
	}{
		{10 * s, 0, 30 * s, false},
		{30 * s, 0, 30 * s, true},
		{31 * s, 0, 30 * s, true},
		{31 * s, 2 * s, 30 * s, false},
		{5 * s, 4 * s, time.Second, true},
		{5 * s, 4*s + 1, time.Second, false},
		{5 * s, 4 * s, time.Duration(1<<63 - 1), false}, // no overflow
	}
	for _, tc := range tests {
		if got := Expired(tc.now, tc.dirtied, tc.expire); got != tc.want {
			t.Errorf("Expired(now=%v, dirtied=%v, expire=%v) = %v, want %v", tc.now, tc.dirtied, tc.expire, got, tc.want)
		}
	}
}

func TestRequeue(t *testing.T) {
	tests := []struct {
		o            Outcome
		ioWait, tail Dest
	}{
		{Clean, Forget, Forget},
		{ChunkUsed, MoreIO, MoreIO},
		{Redirtied, MoreIOWait, RedirtyTail},
		{Skipped, MoreIOWait, RedirtyTail},
		{Blocked, MoreIOWait, RedirtyTail},
		{FSUnavailable, MoreIOWait, RedirtyTail},
		{UnderWriteback, MoreIOWait, RedirtyTail},
		{IOError, MoreIOWait, RedirtyTail},
		{Gone, Drop, Drop},
	}
	if len(tests) != int(NumOutcomes) {
		t.Fatalf("table covers %d outcomes, want %d", len(tests), NumOutcomes)
	}
	for _, tc := range tests {
		if got := Requeue(tc.o, IOWait); got != tc.ioWait {
			t.Errorf("Requeue(%v, io_wait) = %v, want %v", tc.o, got, tc.ioWait)
		}
		if got := Requeue(tc.o, LegacyRedirtyTail); got != tc.tail {
			t.Errorf("Requeue(%v, redirty_tail) = %v, want %v", tc.o, got, tc.tail)
		}
	}
}

func TestClassifyErr(t *testing.T) {
	tests := []struct {
		err  error
		want Outcome
	}{
		{nil, Clean},
		{syscall.EAGAIN, Blocked},
		{syscall.EINTR, Blocked},
		{syscall.EBUSY, Blocked},
		{syscall.EMFILE, Blocked},
		{syscall.ENFILE, Blocked},
		{syscall.ENOMEM, Blocked},
		{syscall.ENOBUFS, Blocked},
		{syscall.EROFS, FSUnavailable},
		{syscall.ESHUTDOWN, FSUnavailable},
		{syscall.ENODEV, FSUnavailable},
		{syscall.ENXIO, FSUnavailable},
		{syscall.ENOTCONN, FSUnavailable},
		{syscall.ETIMEDOUT, Blocked},
		{syscall.ENOENT, Gone},
		{syscall.ESTALE, Gone},
		{syscall.ENOTDIR, Gone},
		{syscall.ELOOP, Gone},
		{syscall.EIO, IOError},
		{syscall.ENOSPC, IOError},
		{syscall.EDQUOT, IOError},
		{fmt.Errorf("sync_file_range /x: %w", syscall.EAGAIN), Blocked},
		{fmt.Errorf("plain"), IOError},
	}
	for _, tc := range tests {
		if got := ClassifyErr(tc.err); got != tc.want {
			t.Errorf("ClassifyErr(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestShortage: the errors that say a resource ran out for a moment, and
// none of those that say something of the file or the filesystem.
func TestShortage(t *testing.T) {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS, syscall.EAGAIN, syscall.EINTR} {
		if !Shortage(e) || !Shortage(&os.PathError{Op: "open", Path: "/x", Err: e}) {
			t.Errorf("Shortage(%v) = false, want true (bare and wrapped)", e)
		}
		if ClassifyErr(e) != Blocked {
			t.Errorf("ClassifyErr(%v) = %v, want Blocked: a shortage is retried", e, ClassifyErr(e))
		}
	}
	for _, e := range []error{nil, syscall.ENODEV, syscall.EBADF, syscall.ESTALE, syscall.ENOENT, syscall.EIO, syscall.EACCES, errors.New("plain")} {
		if Shortage(e) {
			t.Errorf("Shortage(%v) = true, want false", e)
		}
	}
}

func TestBeforeAfterWrite(t *testing.T) {
	before := []struct {
		dirty, wb uint64
		integrity bool
		o         Outcome
		write     bool
	}{
		{0, 0, false, Clean, false},
		{3, 0, false, Clean, true},
		{0, 2, false, UnderWriteback, false},
		{0, 2, true, Clean, true},
		{0, 0, true, Clean, true},
	}
	for _, tc := range before {
		o, w := BeforeWrite(tc.dirty, tc.wb, tc.integrity)
		if o != tc.o || w != tc.write {
			t.Errorf("BeforeWrite(%d,%d,%v) = %v,%v want %v,%v", tc.dirty, tc.wb, tc.integrity, o, w, tc.o, tc.write)
		}
	}
	after := []struct {
		dirty, wb      uint64
		redirty, chunk bool
		want           Outcome
	}{
		{0, 0, false, false, Clean},
		{0, 4, false, false, UnderWriteback},
		{0, 0, true, true, Redirtied},
		{1, 0, true, false, Redirtied},
		{1, 0, true, true, Redirtied},
		{1, 0, false, true, ChunkUsed},
		{1, 0, false, false, Skipped},
		{1, 3, false, false, Skipped},
	}
	for _, tc := range after {
		if got := AfterWrite(tc.dirty, tc.wb, tc.redirty, tc.chunk); got != tc.want {
			t.Errorf("AfterWrite(%d,%d,%v,%v) = %v want %v", tc.dirty, tc.wb, tc.redirty, tc.chunk, got, tc.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	ms := time.Millisecond
	b := Backoff{Min: 10 * ms, Max: 80 * ms}
	steps := []struct {
		progress bool
		want     time.Duration
	}{
		{false, 10 * ms}, // first pause is Min
		{false, 20 * ms},
		{false, 40 * ms},
		{false, 80 * ms},
		{false, 80 * ms}, // clamped
		{true, 10 * ms},  // progress resets
		{false, 20 * ms},
	}
	for i, s := range steps {
		if got := b.Next(s.progress); got != s.want {
			t.Fatalf("step %d: Next(%v) = %v, want %v", i, s.progress, got, s.want)
		}
	}
	b.Reset()
	if b.Pause != 0 {
		t.Fatalf("Reset left pause %v", b.Pause)
	}
	if got := b.Next(false); got != 10*ms {
		t.Fatalf("after Reset, Next = %v want %v", got, 10*ms)
	}
}

// TestLost: data is lost only when an I/O error came first and the file
// is then clean without flusherd having written anything, and no new write
// came since.
func TestLost(t *testing.T) {
	for _, c := range []struct {
		o                    Outcome
		hadIOError, read     bool
		dirtyBefore, wbefore uint64
		redirtied            bool
		want                 bool
	}{
		{Clean, true, true, 0, 0, false, true},
		{Clean, false, true, 0, 0, false, false}, // no error: clean is clean
		{Clean, true, true, 4, 0, false, false},  // flusherd wrote the data again
		{Clean, true, true, 0, 2, false, false},  // it was under writeback: written by someone
		{Clean, true, true, 0, 0, true, false},   // written again meanwhile
		// Failures after the loss hide it, whatever they are: the
		// filesystem went read-only, its server died, the error again,
		// a busy filesystem.
		{FSUnavailable, true, true, 0, 0, false, true},
		{IOError, true, true, 0, 0, false, true},
		{Blocked, true, true, 0, 0, false, true},
		{FSUnavailable, true, true, 3, 0, false, false}, // the data is still in the page cache
		{FSUnavailable, false, true, 0, 0, false, false},
		// Unknown is tracked: the open or the first cachestat failed,
		// so the counts are not the file's.
		{FSUnavailable, true, false, 0, 0, false, false},
		{IOError, true, false, 0, 0, false, false},
		{Gone, true, true, 0, 0, false, false}, // deleted: dropped, not lost
	} {
		if got := Lost(c.o, c.hadIOError, c.read, c.dirtyBefore, c.wbefore, c.redirtied); got != c.want {
			t.Errorf("Lost(%v, %v, %v, %d, %d, %v) = %v, want %v", c.o, c.hadIOError, c.read, c.dirtyBefore, c.wbefore, c.redirtied, got, c.want)
		}
	}
	if Failed.String() != "failed" {
		t.Errorf("Failed.String() = %q", Failed.String())
	}
}

func TestOpenFailed(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&os.PathError{Op: "open_by_handle_at", Path: "h", Err: syscall.EIO}, true},
		{&os.PathError{Op: "open", Path: "/f", Err: syscall.EUCLEAN}, true},
		{fmt.Errorf("attempt: %w", &os.PathError{Op: "open", Path: "/f", Err: syscall.EBADMSG}), true},
		{&os.PathError{Op: "open", Path: "/f", Err: syscall.EAGAIN}, false},
		{&os.PathError{Op: "open", Path: "/f", Err: syscall.EROFS}, false},
		{&os.PathError{Op: "open", Path: "/f", Err: syscall.ENOENT}, false},
		{&os.PathError{Op: "sync_file_range", Path: "/f", Err: syscall.EIO}, false},
		{syscall.EIO, false},
		{nil, false},
	} {
		if got := OpenFailed(tc.err); got != tc.want {
			t.Errorf("OpenFailed(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestDeviceLevel(t *testing.T) {
	for _, tc := range []struct {
		err   error
		errno syscall.Errno
		ok    bool
	}{
		{syscall.ENOTCONN, syscall.ENOTCONN, true},
		{&os.PathError{Op: "open_by_handle_at", Path: "h", Err: syscall.ENODEV}, syscall.ENODEV, true},
		{fmt.Errorf("x: %w", syscall.ETIMEDOUT), syscall.ETIMEDOUT, true},
		{syscall.EROFS, syscall.EROFS, true},
		{&os.PathError{Op: "open", Path: "/f", Err: syscall.EIO}, syscall.EIO, true},
		{&os.PathError{Op: "sync_file_range", Path: "/f", Err: syscall.EIO}, 0, false},
		{syscall.EIO, 0, false},
		{syscall.EAGAIN, 0, false},
		{syscall.ENOENT, 0, false},
		{errors.New("not an errno"), 0, false},
		{nil, 0, false},
	} {
		errno, ok := DeviceLevel(tc.err)
		if errno != tc.errno || ok != tc.ok {
			t.Errorf("DeviceLevel(%v) = %v, %v; want %v, %v", tc.err, errno, ok, tc.errno, tc.ok)
		}
	}
}
