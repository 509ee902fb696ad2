package watch

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
)

// A file written continually makes an event for every write (FAN_MODIFY,
// and FAN_CLOSE_WRITE for every close), though after the first one that
// makes it dirty the engine has nothing to do with them: an inode that is
// dirty already keeps its dirtiedWhen and its place (__mark_inode_dirty
// returns early when the inode's state has the flags). The kernel makes,
// queues and copies each one all the same, and the daemon reads and looks
// each one up.
//
// So a file that has made hotEvents events since it was last quieted is
// quieted: an ignore mark on its inode (FAN_MARK_IGNORED_MASK with
// FAN_MARK_IGNORED_SURV_MODIFY, fanotify_mark(2)) makes the kernel drop its
// FAN_MODIFY and FAN_CLOSE_WRITE events before they are made, until the
// mark is removed. The mark is FAN_MARK_EVICTABLE: it does not pin the
// inode in memory, and if the inode is evicted (it can only be once it is
// clean and unused) the mark goes with it and its events come back.
//
// Nothing is lost, by two rules:
//   - quietFile puts the ignore mark in place before the event that made the
//     file hot is reported to the engine (MarkInodeDirty), so the engine
//     tracks the file from a moment when its writes are no longer reported:
//     if a writeback attempt is under way, it is flagged redirtied and
//     requeued;
//   - the engine tells fa of every writeback attempt's open
//     (bdi.AttemptObserver, subscribed by the daemon's wiring with
//     bdi.Registry.Observe), before the attempt reads the file's state
//     with cachestat, and Opened removes the mark: a write after the
//     removal makes an event again, one before it left its pages dirty
//     for the attempt to see. (Only an attempt can find a file clean and
//     forget it; the background sampler's opens leave the mark.) An
//     inode the engine forgets without an attempt (its tree removed, a
//     failure given up) or parks as failed (only a new write revives it)
//     is told of through Forgotten, which removes all
//     the group's ignore marks (FAN_MARK_FLUSH): those are rare, and an
//     ignore mark too few costs only events.
//
// A device with range writeback or a background threshold (range_bytes
// is 1 MiB by default) checks every 100 ms, while files are written, the
// files written since its last check: a streaming writer is one written at
// consecutive checks. A file there is not quieted (Sink.Unchecked says
// which devices make no checks). Quieting there and removing the marks
// at each check was tried: it took a quarter of the events but more CPU
// per write than the events it saved (each quiet costs an
// open_by_handle_at, a fanotify_mark through /proc and a close). Should a
// device start checking while files are quiet (a reload), its first check
// removes every ignore mark (Checking).
//
// The marks are a group's: they go when the group is closed (a reload to
// another backend, the daemon's exit).
const (
	hotEvents = 16

	// quietMax bounds the files quieted at once: each is an inode mark
	// in the kernel (about 150 bytes, counted in fanotify's
	// max_user_marks) and a key here. At the bound no other file is
	// quieted until some are written back. A quieted file is a tracked
	// one (quietFile comes with a MarkInodeDirty, and the engine's
	// forgetting it takes it out, Opened or Forgotten), so the set does
	// not outgrow the tracked files.
	quietMax = 1 << 16
	// quietMask is what an ignore mark drops; quietMaskOpens, while
	// opens are counted (Options.Opens): a close dropped would leave its
	// file's open count too high for good.
	quietMask      = unix.FAN_MODIFY | unix.FAN_CLOSE_WRITE
	quietMaskOpens = unix.FAN_MODIFY
)

// quietMarks are a group's ignore marks on quieted files.
type quietMarks struct {
	n   atomic.Int64 // len(keys), read without mu
	off atomic.Bool  // ignore marks refused (no /proc, old kernel): not tried again
	// mask is what the marks drop (quietMask or quietMaskOpens), set
	// before the group reads events.
	mask uint64

	mu sync.Mutex
	// fd is the fanotify group while it is open, -1 after.
	// +checklocks:mu
	fd int
	// keys are the inodes with an ignore mark.
	// +checklocks:mu
	keys map[inode.Key]struct{}
}

// closed forgets the marks when the group is closed (they go with it).
func (q *quietMarks) closed() {
	q.mu.Lock()
	q.fd = -1
	clear(q.keys)
	q.n.Store(0)
	q.mu.Unlock()
}

// flushLocked removes all the group's inode marks, which are all ignore
// marks (the trees' marks are filesystem or mount marks). With mu held.
//
// +checklocks:q.mu
func (q *quietMarks) flushLocked(log *zap.Logger) {
	if q.fd >= 0 && len(q.keys) > 0 {
		if err := unix.FanotifyMark(q.fd, unix.FAN_MARK_FLUSH, 0, unix.AT_FDCWD, ""); err != nil {
			log.Error("fanotify: cannot remove the ignore marks of quieted files; their writes may go unreported", zap.Error(err))
		}
	}
	clear(q.keys)
	q.n.Store(0)
}

// quietFile puts an ignore mark on tg's inode (see hotEvents). It makes
// no difference to what is tracked when it fails: the file's events keep
// coming.
func (fa *Fanotify) quietFile(tg *fanotifyTarget) {
	q := &fa.quiet
	if fa.handles == nil || q.off.Load() {
		return
	}
	if !fa.sink.Unchecked(tg.key.Dev) {
		return // its device's background checks need its writes
	}
	if q.n.Load() >= quietMax {
		return
	}
	// fanotify_mark(2) takes no O_PATH descriptor by itself (EBADF), but
	// a path through it: /proc/self/fd/N names exactly the inode that
	// the handle opened, whatever its name is now.
	fd, err := fa.handles.OpenPath(tg.key.Dev, tg.handle)
	if err != nil {
		return // gone, or its filesystem going: its events keep coming
	}
	defer unix.Close(fd)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.fd < 0 {
		return
	}
	err = unix.FanotifyMark(q.fd, unix.FAN_MARK_ADD|unix.FAN_MARK_IGNORED_MASK|unix.FAN_MARK_IGNORED_SURV_MODIFY|unix.FAN_MARK_EVICTABLE,
		q.mask, unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		// ENOSPC at fanotify's max_user_marks (the user's marks in
		// all groups): this file stays loud. ENOENT without /proc,
		// EINVAL before Linux 5.19 (evictable marks): every file
		// does.
		if errors.Is(err, unix.ENOSPC) {
			return
		}
		if !q.off.Swap(true) {
			fa.log.Info("fanotify: files written continually cannot be quieted (ignore marks refused); every write makes an event", zap.Error(err))
		}
		return
	}
	q.keys[tg.key] = struct{}{}
	q.n.Store(int64(len(q.keys)))
	fa.ctr.Quieted.Add(1)
}

// unquiet removes key's ignore mark, if it has one (with every other: see
// Forgotten).
func (fa *Fanotify) unquiet(key inode.Key) {
	q := &fa.quiet
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.keys[key]; ok {
		q.flushLocked(fa.log)
	}
}

// Opened implements bdi.AttemptObserver: the ignore mark of a file
// opened for writeback is removed (fanotify_mark FAN_MARK_REMOVE on its
// descriptor) before the attempt reads its state. When the removal fails
// for another reason than the mark being gone already (ENOENT: its inode
// was evicted and came back), or the file has no descriptor, every mark
// is removed.
func (fa *Fanotify) Opened(key inode.Key, f inode.File) {
	q := &fa.quiet
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.keys[key]; !ok || q.fd < 0 {
		return
	}
	of, ok := f.(interface{ Fd() int })
	if !ok {
		q.flushLocked(fa.log) // (key is among q.keys: the flush is made)
		return
	}
	err := unix.FanotifyMark(q.fd, unix.FAN_MARK_REMOVE|unix.FAN_MARK_IGNORED_MASK, q.mask, of.Fd(), "")
	if err != nil && !errors.Is(err, unix.ENOENT) {
		q.flushLocked(fa.log)
		return
	}
	delete(q.keys, key)
	q.n.Store(int64(len(q.keys)))
}

// Checking implements bdi.AttemptObserver: a device's background check
// (every 100 ms while files are written, with range writeback or a
// background threshold configured) needs every file written since the
// last check reported, to tell a streaming writer: every ignore mark is
// removed (FAN_MARK_FLUSH). Files on such a device are not quieted, so
// this finds marks only after a reload turned the checks on.
func (fa *Fanotify) Checking() {
	q := &fa.quiet
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	q.flushLocked(fa.log)
	q.mu.Unlock()
}

// Forgotten implements bdi.AttemptObserver: an inode forgotten while
// quieted (without an attempt that removed its mark) has every ignore mark
// removed (FAN_MARK_FLUSH: the engine holds no descriptor of it, and
// opening one under its list lock could block).
func (fa *Fanotify) Forgotten(key inode.Key) { fa.unquiet(key) }
