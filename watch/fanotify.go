package watch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

// Fanotify is the fanotify(7) backend: one mark per watched filesystem
// (FAN_MARK_FILESYSTEM, or FAN_MARK_MOUNT where the filesystem mark is
// refused), events reported with file handles
// (FAN_CLASS_NOTIF|FAN_REPORT_DFID_NAME|FAN_REPORT_FID, and
// FAN_REPORT_TARGET_FID where the kernel has it: fanotifyInit). Each event
// names its parent directory by handle and its file by name and handle: the
// directory's path (cached by handle) tells whether the event is inside a
// tree, and the file's handle identifies it (cached) and is what it is
// later opened by (open_by_handle_at), so a file renamed while queued is
// still written back. Events outside the trees are dropped after a cache
// look-up.
//
// It needs CAP_SYS_ADMIN (fanotify_init) and CAP_DAC_READ_SEARCH
// (open_by_handle_at), and an *inode.Handles (Options.Handles) on which
// every tree's filesystem can be registered.
type Fanotify struct {
	base
	// cursor counts the bytes Run read from the group; handledBytes,
	// those whose events were handled (Fence).
	cursor       queueCursor
	handledBytes atomic.Uint64
	// nestedFallback serves a mount inside a tree that fanotify cannot
	// mark (Mixed: the inotify half); nil: such a mount is not served.
	nestedFallback func(ctx context.Context, t tree.Tree, mountpoint string) bool
	// targetFID: the group reports the handle of a file whose directory
	// entry was made (FAN_REPORT_TARGET_FID; fanotifyInit).
	targetFID bool
	// fd is the fanotify group (FAN_NONBLOCK), read by Run after
	// poll(2) says it is readable; stop is an eventfd that Close and
	// Run's context write to end Run's poll. Neither is in the Go
	// runtime's netpoller: there, every event the kernel queued woke
	// the netpoller (an edge-triggered epoll reports each wake-up of
	// the group's wait queue), one wake-up per event while Run was
	// handling the previous batch.
	fd, stop  int
	fdMu      sync.Mutex // guards the three below: the fds are closed once Close was called and Run is not running
	running   bool       // Run is reading fd
	closed    bool       // Close was called
	fdsClosed bool       // fd and stop are closed (their numbers may be another file's)

	markMu  sync.Mutex         // serializes mark
	fsidsMu sync.RWMutex       // guards fsids and mounts
	fsids   map[[8]byte]uint64 // fsid -> st_dev of the marked filesystem
	// fsidGen counts the changes of fsids; devOf's last answer (lastFsid
	// -> lastDev, at lastFsidGen; Run's goroutine only) stands until it
	// changes.
	fsidGen     atomic.Uint64
	lastFsid    [8]byte
	lastDev     uint64
	lastFsidGen uint64
	lastFsidOK  bool
	mounts      map[uint64]bool // st_dev -> mount mark (no dirent events)

	rootMounts rootMounts // the trees' roots by st_dev and mount ID (otherMount)

	longWarned atomic.Bool

	// opens: the marks ask for FAN_OPEN and FAN_CLOSE_NOWRITE, and the
	// opens and closes of the trees' files, but the daemon's own (pid),
	// are reported to Sink.InodesOpened (Options.Opens).
	opens bool
	pid   int32
	// pendingOpens are the open and close reports of the batch being
	// read, and pendingOpenTrees the tree each was made with (Run's
	// goroutine only).
	pendingOpens     []bdi.Open
	pendingOpenTrees []*watchedTree

	quiet quietMarks // files written continually (see hotEvents)

	cmu   sync.Mutex
	dirs  map[string]*fanotifyDir    // fsid+handle -> directory
	files map[string]*fanotifyTarget // fsid+handle -> file
	buf   []byte
	kbuf  []byte

	// pending are the file reports of the batch being read (for
	// Sink.MarkInodesDirty), and pendingTrees the tree each was made
	// with (Run's goroutine only).
	pending      []bdi.Mark
	pendingTrees []*watchedTree

	// dirGen counts the clearings of dirs; lastDir is the directory of
	// the last event dirOf resolved, under the cache key lastDirKey, valid
	// while dirGen is lastDirGen (Run's goroutine only): consecutive
	// events in one directory skip the cache's lock and map look-up.
	dirGen     atomic.Uint64
	lastDir    *fanotifyDir
	lastDirKey []byte
	lastDirGen uint64
}

// NewFanotify sets up fanotify and marks the filesystem of every tree. It
// fails (and auto picks inotify) without CAP_SYS_ADMIN, on a kernel that
// refuses the flags, without opt.Handles, or when a
// tree's filesystem cannot be opened by handle.
func NewFanotify(trees []tree.Tree, sink Sink, opt Options) (*Fanotify, error) {
	if opt.Handles == nil {
		return nil, errors.New("file handles are not in use (no inode.Handles given)")
	}
	fd, targetFID, err := fanotifyInit(!opt.noTargetFID)
	if err != nil {
		return nil, fmt.Errorf("fanotify_init: %w", err)
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	fa := &Fanotify{fd: fd, stop: stop, targetFID: targetFID, fsids: map[[8]byte]uint64{}, mounts: map[uint64]bool{},
		dirs: map[string]*fanotifyDir{}, files: map[string]*fanotifyTarget{}, buf: make([]byte, 64<<10),
		quiet: quietMarks{fd: fd, keys: map[inode.Key]struct{}{}, mask: quietMask},
		opens: opt.Opens, pid: int32(os.Getpid())}
	if fa.opens {
		fa.quiet.mask = quietMaskOpens
	}
	fa.init(trees, sink, opt)
	fa.nested = fa.nestedMount
	fa.statsTrees, fa.statsName = fa.Trees, fa.Name
	for _, t := range trees {
		fa.rootMounts.note(t.Root)
	}
	for _, t := range trees {
		err := fa.otherMount(t.Root)
		if err == nil {
			err = fa.mark(fd, t.Root, false)
		}
		opt.progress()
		if err != nil {
			fa.Close()
			return nil, &TreeError{Root: t.Root, Err: err}
		}
	}
	return fa, nil
}

// fanotifyInit makes the fanotify group: FAN_CLASS_NOTIF, events with
// file handles (FAN_REPORT_DFID_NAME|FAN_REPORT_FID) and, where the kernel
// has it (Linux 5.17), FAN_REPORT_TARGET_FID, with which an event of a
// directory entry made (a file created, linked or moved in) also carries
// the file's own handle (targetFID): such a file is then reported like a
// write, by handle and batched with the read's other reports, instead of
// being looked up by name (lstat(2) and name_to_handle_at(2)) one by one.
// A kernel that refuses the flag (EINVAL) gets the group without it, as
// does a caller that does not ask for it (target false).
func fanotifyInit(target bool) (fd int, targetFID bool, err error) {
	const flags = unix.FAN_CLASS_NOTIF | unix.FAN_CLOEXEC | unix.FAN_NONBLOCK | unix.FAN_REPORT_DFID_NAME | unix.FAN_REPORT_FID
	err = unix.EINVAL
	if target {
		fd, err = unix.FanotifyInit(flags|unix.FAN_REPORT_TARGET_FID, unix.O_RDONLY|unix.O_LARGEFILE)
	}
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.FanotifyInit(flags, unix.O_RDONLY|unix.O_LARGEFILE)
		return fd, false, err
	}
	return fd, err == nil, err
}

// newFanotifyFor sets up fanotify and marks the filesystems of the trees
// it can: it returns the backend serving those, and the trees whose
// filesystem refused the mark or opens by handle (a FUSE server without
// handles, for one) with their errors. It fails as NewFanotify does when
// fanotify itself is unavailable.
func newFanotifyFor(trees []tree.Tree, sink Sink, opt Options) (*Fanotify, []*TreeError, error) {
	fa, err := NewFanotify(nil, sink, opt)
	if err != nil {
		return nil, nil, err
	}
	var refused []*TreeError
	for _, t := range trees {
		err := fa.otherMount(t.Root)
		if err == nil {
			err = fa.mark(fa.fd, t.Root, false)
		}
		opt.progress()
		if err != nil {
			refused = append(refused, &TreeError{Root: t.Root, Err: err})
			continue
		}
		fa.mu.Lock()
		fa.listTreeLocked(&watchedTree{Tree: t})
		fa.mu.Unlock()
		fa.rootMounts.note(t.Root)
	}
	return fa, refused, nil
}

// Name implements Backend.
func (fa *Fanotify) Name() string { return "fanotify" }

// Observer implements Backend: fa, whose quieted files the writeback
// engine's attempts un-quiet. Once fa is closed its methods do nothing.
func (fa *Fanotify) Observer() bdi.AttemptObserver { return fa }

// Close implements Backend: it ends Run, and the fanotify group is
// closed once Run has returned (at once if it is not running), so that
// Run never reads a descriptor number that was closed and reused.
func (fa *Fanotify) Close() error {
	fa.fdMu.Lock()
	defer fa.fdMu.Unlock()
	if fa.closed {
		return nil
	}
	fa.closed = true
	if fa.running {
		fa.wakeLocked()
		return nil
	}
	return fa.closeFDs()
}

// wake ends Run's wait: it makes the stop eventfd readable. It may come
// after Run has returned (ctx's AfterFunc), and then writes nothing once
// the descriptors are closed.
func (fa *Fanotify) wake() {
	fa.fdMu.Lock()
	defer fa.fdMu.Unlock()
	fa.wakeLocked()
}

// wakeLocked is wake with fdMu held.
func (fa *Fanotify) wakeLocked() {
	if fa.fdsClosed {
		return
	}
	var one [8]byte // an eventfd counter is a uint64 in host order
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(fa.stop, one[:])
}

// closeFDs closes the group and the eventfd; fdMu is held. The group's
// ignore marks go with it.
func (fa *Fanotify) closeFDs() error {
	fa.quiet.closed()
	fa.fdsClosed = true
	err := unix.Close(fa.fd)
	unix.Close(fa.stop)
	return err
}

// Start implements Backend: WatchRoots, then Scan.
func (fa *Fanotify) Start(ctx context.Context) error {
	if err := fa.WatchRoots(ctx); err != nil {
		return err
	}
	fa.Scan(ctx)
	return nil
}

// WatchRoots implements Backend: the marks exist since NewFanotify; it
// records the roots' identity (a stat each, done whole).
func (fa *Fanotify) WatchRoots(context.Context) error { return fa.recordRoots() }

// Scan implements Backend.
func (fa *Fanotify) Scan(ctx context.Context) {
	for _, t := range fa.list() {
		fa.scanDir(ctx, t.Tree, t.Root, true, nil)
	}
}

// AddTree implements Backend: it marks the tree's filesystem (again, if
// it was marked before) and scans the tree.
func (fa *Fanotify) AddTree(ctx context.Context, t tree.Tree) error {
	fa.markMu.Lock()
	// Marked again even when its fsid is known: a tree added by a
	// reload may be one whose filesystem was unmounted and mounted
	// again (a new superblock with the same fsid, whose old mark died).
	err := fa.otherMount(t.Root)
	if err == nil {
		err = fa.mark(fa.fd, t.Root, true)
	}
	fa.markMu.Unlock()
	if err != nil {
		return err
	}
	if _, err := fa.addTree(t); err != nil {
		return err
	}
	fa.rootMounts.note(t.Root)
	fa.clearCaches() // cached directories name their tree
	fa.scanDir(ctx, t, t.Root, true, nil)
	return nil
}

// RemoveTree implements Backend. The filesystem mark stays (another tree
// may come back to it); events under the root are no longer served.
func (fa *Fanotify) RemoveTree(root string) bool {
	t, _ := fa.removeTree(root)
	fa.clearCaches()
	if t == nil {
		return false
	}
	fa.rootMounts.forget(root)
	fa.removed(t)
	return true
}

// Trees implements Backend.
func (fa *Fanotify) Trees() []TreeUse { return fa.treeUses("fanotify") }
