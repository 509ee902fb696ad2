package watch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moby/sys/mountinfo"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/policy"
)

// fanotifyMask is what a filesystem mark asks for: data writes, creations
// (a hard link is one), and the directory-entry changes that can move a
// tree's content or its roots. FAN_ONDIR brings those of directories too.
const fanotifyMask = unix.FAN_MODIFY | unix.FAN_CLOSE_WRITE | unix.FAN_CREATE |
	unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO | unix.FAN_DELETE | unix.FAN_DELETE_SELF |
	unix.FAN_MOVE_SELF | unix.FAN_ONDIR

// mountMask is what a mount mark can carry with FID reporting: no
// directory-entry events (the kernel refuses them with EINVAL).
const mountMask = unix.FAN_MODIFY | unix.FAN_CLOSE_WRITE

// cacheMax bounds the directory and file caches (entries); a full cache is
// emptied and refilled.
const cacheMax = 1 << 16

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
// (open_by_handle_at), and an *inode.Handles opener on which every tree's
// filesystem can be registered.
type Fanotify struct {
	base
	// nestedFallback serves a mount inside a tree that fanotify cannot
	// mark (Mixed: the inotify half); nil: such a mount is not served.
	nestedFallback func(ctx context.Context, t Tree, mountpoint string) bool
	handles        *inode.Handles
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

	longWarned atomic.Bool

	quiet quietMarks // files written continually (see hotEvents)

	cmu   sync.Mutex
	dirs  map[string]*fanotifyDir    // fsid+handle -> directory
	files map[string]*fanotifyTarget // fsid+handle -> file
	buf   []byte
	kbuf  []byte

	// pending are the file reports of the batch being read, for
	// batchSink, and pendingTrees the tree each was made with (Run's
	// goroutine only).
	pending      []bdi.Mark
	pendingTrees []*tree

	// dirGen counts the clearings of dirs; lastDir is the directory of
	// the last event dirOf resolved, under the cache key lastDirKey, valid
	// while dirGen is lastDirGen (Run's goroutine only): consecutive
	// events in one directory skip the cache's lock and map look-up.
	dirGen     atomic.Uint64
	lastDir    *fanotifyDir
	lastDirKey []byte
	lastDirGen uint64
}

// pendingMax bounds the reports held before they are handed to the sink.
const pendingMax = 256

type fanotifyDir struct {
	path   string
	prefix string // path with a trailing slash
	tree   *tree  // the tree whose files it holds, or nil
}

type fanotifyTarget struct {
	key     inode.Key
	regular bool
	handle  inode.Handle
	path    string // as last reported
	events  int    // reported since it was last quieted (Run's goroutine only)
}

// NewFanotify sets up fanotify and marks the filesystem of every tree. It
// fails (and auto picks inotify) without CAP_SYS_ADMIN, on a kernel that
// refuses the flags, when opt.Opener is not an *inode.Handles, or when a
// tree's filesystem cannot be opened by handle.
func NewFanotify(trees []Tree, sink Sink, opt Options) (*Fanotify, error) {
	h, ok := opt.Opener.(*inode.Handles)
	if !ok {
		return nil, errors.New("file handles are not in use (the opener is not an inode.Handles)")
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
	fa := &Fanotify{handles: h, fd: fd, stop: stop, targetFID: targetFID, fsids: map[[8]byte]uint64{}, mounts: map[uint64]bool{},
		dirs: map[string]*fanotifyDir{}, files: map[string]*fanotifyTarget{}, buf: make([]byte, 64<<10),
		quiet: quietMarks{fd: fd, keys: map[inode.Key]struct{}{}}}
	fa.init(trees, sink, opt)
	h.SetWritebackHook(fa)
	fa.nested = fa.nestedMount
	fa.statsTrees, fa.statsName = fa.Trees, fa.Name
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

// TreeError is a tree that a backend cannot serve, and why.
type TreeError struct {
	Root string
	Err  error
}

func (e *TreeError) Error() string {
	return fmt.Sprintf("tree %s: %v", strconv.Quote(e.Root), e.Err)
}

func (e *TreeError) Unwrap() error { return e.Err }

// newFanotifyFor sets up fanotify and marks the filesystems of the trees
// it can: it returns the backend serving those, and the trees whose
// filesystem refused the mark or opens by handle (a FUSE server without
// handles, for one) with their errors. It fails as NewFanotify does when
// fanotify itself is unavailable.
func newFanotifyFor(trees []Tree, sink Sink, opt Options) (*Fanotify, []*TreeError, error) {
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
		fa.trees = append(fa.trees, &tree{Tree: t})
	}
	return fa, refused, nil
}

// mark marks root's filesystem once (again if force: a filesystem
// unmounted and mounted again has a new superblock with the same fsid, and
// its old mark died with the old one; adding a mark that exists only adds
// its mask again), and registers it for opens by handle.
//
// A filesystem that never writes back (noWriteback: tmpfs, proc...) is not
// marked: nothing there is to be tracked, and no event of it is wanted.
func (fa *Fanotify) mark(fd int, root string, force bool) error {
	var sfs unix.Statfs_t
	if err := unix.Statfs(root, &sfs); err != nil {
		return &fs.PathError{Op: "statfs", Path: root, Err: err}
	}
	if _, no := noWriteback[int64(sfs.Type)]; no {
		return nil
	}
	dev, err := fa.handles.AddMount(root)
	if err != nil {
		return fmt.Errorf("file handles on %s: %w", root, err)
	}
	var fsid [8]byte
	binary.NativeEndian.PutUint32(fsid[0:], uint32(sfs.Fsid.Val[0]))
	binary.NativeEndian.PutUint32(fsid[4:], uint32(sfs.Fsid.Val[1]))
	fa.fsidsMu.RLock()
	known, ok := fa.fsids[fsid]
	fa.fsidsMu.RUnlock()
	if ok && known != dev && devMounted(known) {
		// Events name a filesystem by its fsid only: two with one fsid
		// (a copied image, mounted beside its original) cannot be told
		// apart, and the writes of one would be taken for the other's.
		return fmt.Errorf("%w: %s (device %d:%d) has the fsid of the marked filesystem on device %d:%d, as a copy of a filesystem image does (change one's UUID, e.g. tune2fs -U random or xfs_admin -U generate)",
			ErrSharedFsid, root, unix.Major(dev), unix.Minor(dev), unix.Major(known), unix.Minor(known))
	}
	if ok && !force {
		return nil
	}
	err = unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, fanotifyMask, unix.AT_FDCWD, root)
	if err != nil {
		ferr := err
		if err = unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_MOUNT, mountMask, unix.AT_FDCWD, root); err != nil {
			return fmt.Errorf("fanotify_mark %s: filesystem mark: %v; mount mark: %w", root, ferr, err)
		}
		fa.fsidsMu.Lock()
		fa.mounts[dev] = true
		fa.fsidsMu.Unlock()
		fa.log.Warn("fanotify: filesystem mark refused; using a mount mark, which reports writes but not renames or deletions",
			zap.String("root", strconv.Quote(root)), zap.NamedError("filesystem_mark", ferr))
	}
	fa.setFsid(fsid, dev)
	return nil
}

// setFsid records that events naming fsid are of the filesystem on st_dev
// dev (devOf).
func (fa *Fanotify) setFsid(fsid [8]byte, dev uint64) {
	fa.fsidsMu.Lock()
	fa.fsids[fsid] = dev
	fa.fsidGen.Add(1)
	fa.fsidsMu.Unlock()
}

// otherMount returns errSecondMount when another tree served here is on
// root's filesystem but reached through another mount of it (a bind
// mount): fanotify names an event's file through one mount, where the
// other tree's files have other paths, outside it.
func (fa *Fanotify) otherMount(root string) error {
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return nil // (the mark says why)
	}
	_, mid, err := unix.NameToHandleAt(unix.AT_FDCWD, root, 0)
	if err != nil {
		return nil
	}
	for _, t := range fa.list() {
		var ot unix.Stat_t
		if t.Root == root || unix.Stat(t.Root, &ot) != nil || ot.Dev != st.Dev {
			continue
		}
		if _, m, err := unix.NameToHandleAt(unix.AT_FDCWD, t.Root, 0); err == nil && m != mid {
			return fmt.Errorf("%w: %s and the tree %s are on one filesystem (device %d:%d) through two mounts", errSecondMount,
				strconv.Quote(root), strconv.Quote(t.Root), unix.Major(st.Dev), unix.Minor(st.Dev))
		}
	}
	return nil
}

// errSecondMount is nestedMount's error for a mount of a filesystem that
// fanotify reaches through another mount already.
var errSecondMount = errors.New("fanotify names this mount's files through another mount of its filesystem")

// ErrSharedFsid is the error of a fanotify mark on a filesystem whose fsid
// another marked filesystem has: fanotify cannot serve it (auto serves it
// with inotify).
var ErrSharedFsid = errors.New("fanotify cannot tell this filesystem's events from another's")

// devMounted reports whether a filesystem of device dev is mounted (the
// mount table; true when it cannot be read: assumed there).
func devMounted(dev uint64) bool {
	infos, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return uint64(unix.Mkdev(uint32(i.Major), uint32(i.Minor))) != dev, false
	})
	return err != nil || len(infos) > 0
}

// nestedMount serves a filesystem mounted inside tree t: it is marked
// (mark: a filesystem mark, or a mount mark where that is refused) and
// registered for opens by handle, then scanned. It reports false, having
// logged why, when the filesystem can be neither marked nor opened by
// handle (a FUSE server without handles, for one): its writes are then
// not seen, and the log says to watch it as a tree of its own with the
// inotify backend.
func (fa *Fanotify) nestedMount(ctx context.Context, t Tree, mountpoint string) bool {
	var err error
	var st unix.Stat_t
	if serr := unix.Stat(mountpoint, &st); serr == nil && fa.handles.Has(st.Dev) {
		// Another view of a filesystem reached already (a bind mount
		// of a directory of a tree's filesystem): an event names a
		// file by handle, whose path is found through the mount seen
		// first, so writes made here would be taken for writes
		// there, outside this tree.
		err = fmt.Errorf("%w: %s is a second mount of device %d:%d, whose events are named through its first", errSecondMount, mountpoint, unix.Major(st.Dev), unix.Minor(st.Dev))
	} else {
		fa.markMu.Lock()
		err = fa.mark(fa.fd, mountpoint, true)
		fa.markMu.Unlock()
	}
	if err != nil && fa.nestedFallback != nil {
		fa.log.Info("a filesystem mounted inside a tree cannot be marked by fanotify; it is served by inotify",
			zap.String("mountpoint", strconv.Quote(mountpoint)), zap.String("tree", strconv.Quote(t.Root)), zap.Error(err))
		return fa.nestedFallback(ctx, t, mountpoint)
	}
	if err != nil {
		fa.log.Warn("a filesystem mounted inside a tree cannot be marked by fanotify; its writes are not seen (watch it as a tree of its own, with backend = \"inotify\")",
			zap.String("mountpoint", strconv.Quote(mountpoint)), zap.String("tree", strconv.Quote(t.Root)), zap.Error(err))
		return false
	}
	fa.clearCaches()
	fa.scanDir(ctx, t, mountpoint, true, nil)
	return true
}

// Name implements Backend.
func (fa *Fanotify) Name() string { return "fanotify" }

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
	if fa.handles != nil {
		fa.handles.ClearWritebackHook(fa)
	}
	fa.quiet.closed()
	fa.fdsClosed = true
	err := unix.Close(fa.fd)
	unix.Close(fa.stop)
	return err
}

// Start implements Backend: WatchRoots, then Scan.
func (fa *Fanotify) Start(ctx context.Context) error {
	if err := fa.WatchRoots(); err != nil {
		return err
	}
	fa.Scan(ctx)
	return nil
}

// WatchRoots implements Backend: the marks exist since NewFanotify; it
// records the roots' identity.
func (fa *Fanotify) WatchRoots() error { return fa.recordRoots() }

// Scan implements Backend.
func (fa *Fanotify) Scan(ctx context.Context) {
	for _, t := range fa.list() {
		fa.scanDir(ctx, t.Tree, t.Root, true, nil)
	}
}

// AddTree implements Backend: it marks the tree's filesystem (again, if
// it was marked before) and scans the tree.
func (fa *Fanotify) AddTree(ctx context.Context, t Tree) error {
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
	fa.removed(t)
	return true
}

// coalesce is how long Run waits, after a batch that did not fill half its
// buffer, before it reads again: the events that come meanwhile are read in
// one batch (and fanotify merges repeated events on one file while they
// are queued), instead of one read and one wake-up for every few events.
// At fanotify's default queue of 16,384 events, the queue could only
// overflow in that time at more than 16 million events a second. Idle, Run
// sleeps in poll(2) and nothing wakes it.
const coalesce = time.Millisecond

// Run implements Backend: it reads events until ctx ends or Close. It
// waits in poll(2) on the group and the stop eventfd, on a thread of its
// own, and reads the group when it is readable.
func (fa *Fanotify) Run(ctx context.Context) {
	fa.fdMu.Lock()
	if fa.closed || fa.running {
		fa.fdMu.Unlock()
		return
	}
	fa.running = true
	fa.fdMu.Unlock()
	defer func() {
		fa.fdMu.Lock()
		fa.running = false
		if fa.closed {
			fa.closeFDs()
		}
		fa.fdMu.Unlock()
	}()
	go fa.watchMounts(ctx)
	stop := context.AfterFunc(ctx, fa.wake)
	defer stop()
	fds := []unix.PollFd{{Fd: int32(fa.fd), Events: unix.POLLIN}, {Fd: int32(fa.stop), Events: unix.POLLIN}}
	for {
		if ctx.Err() != nil {
			return
		}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			fa.log.Error("fanotify poll failed; no more events", zap.Error(err))
			return
		}
		if fds[1].Revents != 0 {
			return // Close, or ctx ended
		}
		n, err := unix.Read(fa.fd, fa.buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			fa.log.Error("fanotify read failed; no more events", zap.Error(err))
			return
		}
		fa.readBatches.Add(1)
		// A read that did not fill half the buffer emptied the queue:
		// an overflow read later happened after it.
		drained := n < len(fa.buf)/2
		var seq uint64
		if drained {
			seq = fa.removeSeqNow()
		}
		// The stats file is rewritten only for events that concern
		// the trees: the filesystem mark also reports everything
		// else on the filesystem, the daemon's own stats writes
		// included, which must not keep it awake.
		if fa.events(ctx, fa.buf[:n]) {
			fa.touched()
		}
		if drained {
			fa.forgetRemovedUpTo(seq)
		}
		fa.doneBatches.Add(1)
		if drained {
			time.Sleep(coalesce)
		}
	}
}

// queued returns the bytes of events waiting in the group (FIONREAD).
func (fa *Fanotify) queued() (int, error) {
	fa.fdMu.Lock()
	defer fa.fdMu.Unlock()
	if fa.fdsClosed {
		return 0, os.ErrClosed
	}
	return unix.IoctlGetInt(fa.fd, unix.TIOCINQ)
}

// Quiesce implements Backend: it waits until the fanotify queue is empty
// (FIONREAD) and every batch read from it has been handled, twice in a row
// a moment apart (Run may have just read a batch it has not yet counted).
func (fa *Fanotify) Quiesce(ctx context.Context) {
	quiet := 0
	for quiet < 2 && ctx.Err() == nil {
		n, err := fa.queued()
		if err != nil {
			return
		}
		if n == 0 && fa.readBatches.Load() == fa.doneBatches.Load() && !fa.rescanBusy() {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// event is one parsed fanotify event. Its byte slices point into the read
// buffer: handling an event for a known file allocates nothing.
type event struct {
	mask     uint64
	dirFsid  []byte // 8 bytes
	dirType  []byte // 4 bytes, handle_type
	dir      []byte // f_handle of the parent directory (DFID_NAME)
	name     []byte
	fileFsid []byte
	fileType []byte
	file     []byte // f_handle of the object itself (FID)
}

// events parses and handles a buffer of events (fanotify_event_metadata
// followed by fanotify_event_info_fid records). It reports whether any
// concerned a tree (or was an overflow).
func (fa *Fanotify) events(ctx context.Context, b []byte) (relevant bool) {
	for len(b) >= unix.FAN_EVENT_METADATA_LEN {
		var ev event
		evLen, ok := parseEvent(b, &ev)
		if !ok {
			fa.log.Error("malformed fanotify event; rest of the buffer dropped", zap.Int("len", evLen))
			break
		}
		b = b[evLen:]
		fa.ctr.Events.Add(1)
		if ev.mask&unix.FAN_Q_OVERFLOW != 0 {
			fa.flushMarks()
			fa.ctr.Overflows.Add(1)
			fa.logOverflow("fanotify")
			fa.clearCaches()
			fa.overflowRescan(ctx, func() { fa.rescan(ctx, nil) })
			relevant = true
			continue
		}
		if fa.handle(ctx, &ev) {
			relevant = true
		}
	}
	fa.flushMarks()
	return relevant
}

// parseEvent parses the first event of b (fanotify_event_metadata followed
// by fanotify_event_info_fid records) into ev, a zero event; it returns
// the event's length (the metadata's event_len), and false if the
// metadata is malformed.
func parseEvent(b []byte, ev *event) (evLen int, ok bool) {
	evLen = int(binary.NativeEndian.Uint32(b[0:]))
	metaLen := int(binary.NativeEndian.Uint16(b[6:]))
	if evLen < metaLen || evLen > len(b) || metaLen < unix.FAN_EVENT_METADATA_LEN {
		return evLen, false
	}
	ev.mask = binary.NativeEndian.Uint64(b[8:])
	info := b[metaLen:evLen]
	for len(info) >= 4 {
		typ, recLen := info[0], int(binary.NativeEndian.Uint16(info[2:]))
		if recLen < 4 || recLen > len(info) {
			break
		}
		rec := info[4:recLen]
		info = info[recLen:]
		if len(rec) < 16 {
			continue
		}
		hBytes := int(binary.NativeEndian.Uint32(rec[8:]))
		if 16+hBytes > len(rec) {
			continue
		}
		switch typ {
		case unix.FAN_EVENT_INFO_TYPE_DFID_NAME:
			ev.dirFsid, ev.dirType, ev.dir = rec[:8], rec[12:16], rec[16:16+hBytes]
			name := rec[16+hBytes:]
			if i := indexNUL(name); i >= 0 {
				name = name[:i]
			}
			ev.name = name
		case unix.FAN_EVENT_INFO_TYPE_FID:
			ev.fileFsid, ev.fileType, ev.file = rec[:8], rec[12:16], rec[16:16+hBytes]
		}
	}
	return evLen, true
}

// flushMarks hands the pending file reports to the sink and handles
// those it did not take. A report whose tree was removed or went away
// since it was made goes to the tree that holds its file now, or is
// dropped if none does (fence): the sink has let, or is letting, that
// tree's files go.
func (fa *Fanotify) flushMarks() {
	if len(fa.pending) == 0 {
		return
	}
	fa.reportMu.RLock()
	ms := fa.pending
	var dropped []inode.Key
	fa.mu.Lock()
	devGone := len(fa.goneDevs) > 0
	for i, t := range fa.pendingTrees {
		if t.gone || (devGone && fa.goneDevs[fa.pending[i].Key.Dev]) {
			ms, dropped = fa.retargetMarksLocked(i)
			break
		}
	}
	fa.mu.Unlock()
	for _, k := range dropped {
		fa.unquiet(k) // (not tracked: its writes must be seen if a tree serves it again)
	}
	if len(ms) > 0 {
		fa.batchSink.MarkInodesDirty(ms)
	}
	fa.reportMu.RUnlock()
	for i := range ms {
		if m := &ms[i]; m.Err != nil {
			fa.markFailed(m.Key, m.Path, m.Err)
		}
	}
	clear(fa.pending) // no names kept alive
	clear(fa.pendingTrees)
	fa.pending, fa.pendingTrees = fa.pending[:0], fa.pendingTrees[:0]
}

// retargetMarksLocked gives the reports of pending from index i (the
// first whose tree or filesystem is gone) the tree that holds their file
// now (retargetLocked), makes those of a removed tree that no other holds
// leaving, drops those of a tree whose root is gone and those of a
// filesystem unmounted from the trees, and returns the reports left, in
// their order, and the keys of those dropped. Preconditions: fa.mu held.
func (fa *Fanotify) retargetMarksLocked(i int) (ms []bdi.Mark, dropped []inode.Key) {
	n := i
	for j := i; j < len(fa.pending); j++ {
		m, t := fa.pending[j], fa.pendingTrees[j]
		if t.gone || fa.goneDevs[m.Key.Dev] {
			nt, leaving, ok := fa.retargetLocked(t.Root, m.Path, m.Key.Dev)
			if !ok {
				dropped = append(dropped, m.Key)
				continue
			}
			if nt != nil {
				m.Tree = nt.Tree.Tree
			}
			m.Leaving = leaving
		}
		fa.pending[n] = m
		n++
	}
	return fa.pending[:n], dropped
}

// markFailed handles a report the sink did not take: the file is
// untracked, so its writes must be reported (not quieted), and a write not
// taken for want of resources is not forgotten: the trees are rescanned
// until a rescan completes.
func (fa *Fanotify) markFailed(key inode.Key, path string, err error) {
	fa.unquiet(key)
	if policy.Shortage(err) {
		fa.scanIncomplete(err)
	} else {
		fa.log.Warn("cannot track file", Q(path), zap.Error(err))
	}
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

func (fa *Fanotify) clearCaches() {
	fa.cmu.Lock()
	fa.clearDirsLocked()
	clear(fa.files)
	fa.cmu.Unlock()
}

// clearDirsLocked empties the directory cache (and so invalidates
// lastDir). Preconditions: fa.cmu held.
func (fa *Fanotify) clearDirsLocked() {
	clear(fa.dirs)
	fa.dirGen.Add(1)
}

// cacheKey builds fsid+handle_type+f_handle in fa.kbuf; m[string(key)]
// look-ups with it do not allocate.
func (fa *Fanotify) cacheKey(fsid, typ, h []byte) []byte {
	fa.kbuf = append(append(append(fa.kbuf[:0], fsid...), typ...), h...)
	return fa.kbuf
}

// devOf returns the st_dev of the marked filesystem fsid. Run's goroutine
// only (it keeps the last answer).
func (fa *Fanotify) devOf(fsid []byte) (uint64, bool) {
	var k [8]byte
	copy(k[:], fsid)
	gen := fa.fsidGen.Load()
	if fa.lastFsidOK && gen == fa.lastFsidGen && k == fa.lastFsid {
		return fa.lastDev, true
	}
	fa.fsidsMu.RLock()
	dev, ok := fa.fsids[k]
	fa.fsidsMu.RUnlock()
	if ok {
		fa.lastFsid, fa.lastDev, fa.lastFsidGen, fa.lastFsidOK = k, dev, gen, true
	}
	return dev, ok
}

// dirOf returns the cached path and tree of the event's parent directory.
func (fa *Fanotify) dirOf(ev *event) (*fanotifyDir, bool) {
	dev, ok := fa.devOf(ev.dirFsid)
	if !ok {
		return nil, false
	}
	k := fa.cacheKey(ev.dirFsid, ev.dirType, ev.dir)
	gen := fa.dirGen.Load()
	if fa.lastDir != nil && fa.lastDirGen == gen && string(k) == string(fa.lastDirKey) {
		return fa.lastDir, fa.lastDir.path != ""
	}
	fa.cmu.Lock()
	d, hit := fa.dirs[string(k)]
	fa.cmu.Unlock()
	if hit {
		fa.setLastDir(d, k, gen)
		return d, d.path != ""
	}
	h := inode.MakeHandle(int32(binary.NativeEndian.Uint32(ev.dirType)), ev.dir)
	p, ok, err := fa.handles.PathOfHandle(dev, h)
	if err != nil {
		fa.lost(err)
	}
	if err != nil || !ok {
		// Deleted meanwhile, or its filesystem is going: not cached.
		return nil, false
	}
	d = &fanotifyDir{path: p, prefix: strings.TrimSuffix(p, "/") + "/", tree: fa.treeOfDir(p)}
	fa.cmu.Lock()
	if len(fa.dirs) >= cacheMax {
		fa.clearDirsLocked()
	}
	fa.dirs[string(k)] = d
	fa.setLastDir(d, k, fa.dirGen.Load())
	fa.cmu.Unlock()
	return d, true
}

// setLastDir makes d, under cache key k (copied), the last directory,
// valid while the directory cache's generation is gen.
func (fa *Fanotify) setLastDir(d *fanotifyDir, k []byte, gen uint64) {
	fa.lastDir, fa.lastDirKey, fa.lastDirGen = d, append(fa.lastDirKey[:0], k...), gen
}

// lost handles an event that could not be resolved: gone files and
// directories are nothing to worry about, but an event lost for want of
// resources (out of file descriptors or memory) may have been a write, so
// the trees are rescanned with cachestat, with backoff until a rescan
// completes (scanIncomplete).
func (fa *Fanotify) lost(err error) {
	if errors.Is(err, unix.ENAMETOOLONG) {
		if !fa.longWarned.Swap(true) {
			fa.log.Warn("fanotify: a write on a marked filesystem was in a directory whose path is longer than PATH_MAX (maybe outside the trees: the mark covers the whole filesystem); writes in such directories are not tracked (logged once)", zap.Error(err))
		}
		return
	}
	if !policy.Shortage(err) {
		return
	}
	fa.scanIncomplete(err)
}

// treeOfDir returns the deepest tree that holds the files of directory
// dir, or nil.
func (fa *Fanotify) treeOfDir(dir string) *tree {
	var best *tree
	for _, t := range fa.list() {
		in := dir == t.Root || (t.Recursive && (t.Root == "/" || strings.HasPrefix(dir, t.Root+"/")))
		if in && (best == nil || len(t.Root) > len(best.Root)) {
			best = t
		}
	}
	return best
}

// target identifies the event's file, cached by handle.
func (fa *Fanotify) target(ev *event) (*fanotifyTarget, bool) {
	dev, ok := fa.devOf(ev.fileFsid)
	if !ok {
		return nil, false
	}
	k := fa.cacheKey(ev.fileFsid, ev.fileType, ev.file)
	fa.cmu.Lock()
	t, hit := fa.files[string(k)]
	fa.cmu.Unlock()
	if hit {
		return t, true
	}
	h := inode.MakeHandle(int32(binary.NativeEndian.Uint32(ev.fileType)), ev.file)
	key, regular, err := fa.handles.Identify(dev, h)
	if err != nil {
		fa.lost(err)
		return nil, false
	}
	t = &fanotifyTarget{key: key, regular: regular, handle: h}
	fa.cmu.Lock()
	if len(fa.files) >= cacheMax {
		clear(fa.files)
	}
	fa.files[string(k)] = t
	fa.cmu.Unlock()
	return t, true
}

// handle handles one event; it reports whether the event concerned a tree.
func (fa *Fanotify) handle(ctx context.Context, ev *event) bool {
	const dirent = unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO | unix.FAN_DELETE | unix.FAN_DELETE_SELF | unix.FAN_MOVE_SELF
	if ev.mask&unix.FAN_ONDIR != 0 {
		if ev.mask&dirent == 0 {
			return false // a directory made: nothing to watch, the mark covers it
		}
		// What follows may report files (a scan) or drop a tree's:
		// the writes read before it are reported first, in order.
		fa.flushMarks()
		// A directory moved or deleted: cached paths may be stale.
		fa.cmu.Lock()
		fa.clearDirsLocked()
		fa.cmu.Unlock()
		if ev.mask&unix.FAN_MOVED_TO != 0 && ev.dir != nil {
			// Moved in: its files made no event here; scan them.
			if d, ok := fa.dirOf(ev); ok {
				p := filepath.Join(d.path, string(ev.name))
				// (The tree of what is in it: in a non-recursive
				// tree's root, that of the tree around it.)
				if t, ok := fa.TreeOf(joinPath(p, "f")); ok && t.Recursive {
					fa.scanDir(ctx, t, p, true, nil)
					return true
				}
			}
		}
		if ev.mask&(unix.FAN_DELETE|unix.FAN_DELETE_SELF|unix.FAN_MOVED_FROM|unix.FAN_MOVE_SELF) != 0 {
			fa.checkRoots()
		}
		return false
	}
	if ev.mask&(unix.FAN_DELETE|unix.FAN_DELETE_SELF) != 0 && ev.file != nil && fa.unlinkSink != nil {
		// A name deleted, with the file's own handle
		// (FAN_REPORT_TARGET_FID), or the file itself
		// (FAN_DELETE_SELF, with FAN_REPORT_FID: its last name gone
		// and its last opener closed, or replaced by a rename over
		// its name, which makes no FAN_DELETE): after the rest of
		// the event (the kernel may have merged a write into it),
		// the sink brings its attempt forward.
		defer fa.unlinked(ev)
	}
	if ev.mask&(unix.FAN_MODIFY|unix.FAN_CLOSE_WRITE|unix.FAN_CREATE|unix.FAN_MOVED_TO) == 0 {
		// Moves away need nothing: a tracked file is opened by
		// handle, and its names are not needed.
		return false
	}
	if ev.dir == nil {
		return false
	}
	d, ok := fa.dirOf(ev)
	if !ok || d.tree == nil {
		return false
	}
	if ev.file == nil {
		// Directory-entry events (a file made, linked or moved in)
		// without FAN_REPORT_TARGET_FID (fanotifyInit) name the
		// entry, not the object: look at it by name (lstat;
		// no open here, which could hang on a sick filesystem and
		// stall every tree); the writeback attempt, which has a
		// timeout, finds out whether it is dirty. The writes read
		// before it are reported first: a file written, then renamed
		// (or its number given to a new file) must end with the name
		// and handle of the later event, not those of the write.
		fa.flushMarks()
		fa.reportPath(d.tree.Tree, d.prefix+string(ev.name), false)
		return true
	}
	tg, ok := fa.target(ev)
	if !ok || !tg.regular {
		return false
	}
	// The path as last seen, rebuilt only when the name changed.
	if p := tg.path; len(p) != len(d.prefix)+len(ev.name) || !strings.HasPrefix(p, d.prefix) || p[len(d.prefix):] != string(ev.name) {
		tg.path = d.prefix + string(ev.name)
	}
	if tg.events++; tg.events >= hotEvents {
		// Quieted before it is marked dirty: the engine tracks it
		// from a moment when its writes are no longer reported.
		tg.events = 0
		fa.quietFile(tg)
	}
	// Closed, with no write (nor a directory entry made) with it.
	closed := ev.mask&(unix.FAN_MODIFY|unix.FAN_CREATE|unix.FAN_MOVED_TO) == 0 && fa.closedSink != nil
	if fa.batchSink != nil {
		// Marked with the rest of the read (flushMarks).
		fa.pending = append(fa.pending, bdi.Mark{Path: tg.path, Key: tg.key, Handle: tg.handle,
			Tree: d.tree.Tree.Tree, Closed: closed})
		fa.pendingTrees = append(fa.pendingTrees, d.tree)
		if len(fa.pending) >= pendingMax {
			fa.flushMarks()
		}
		return true
	}
	// One by one: a tree that has ended takes no more reports (a batch
	// is checked as a whole when it is handed over: flushMarks).
	fa.mu.Lock()
	gone := d.tree.gone
	fa.mu.Unlock()
	if gone {
		return false
	}
	mark := fa.sink.MarkInodeDirty
	if closed {
		mark = fa.closedSink.MarkInodeClosed
	}
	if err := mark(tg.path, tg.key, tg.handle, d.tree.Tree.Tree); err != nil {
		fa.markFailed(tg.key, tg.path, err)
	}
	return true
}

// unlinked tells the sink of a deleted name of a file (or of the file's
// deletion, FAN_DELETE_SELF), by the file's key
// and handle: from the handle cache when events reported the file, else
// read from the handle itself (inode.HandleIno: a file reported by a scan
// only, or since the cache was emptied at its bound, an overflow or a
// reload), with the device of the event's filesystem id; Identify cannot
// be asked, the inode may be gone (ESTALE). A handle of another layout is
// not told of (the file waits for its attempt). The reports read before it
// are handed over first, so that a file written and deleted in one read is
// tracked before it is told of. The cache entry goes: the handle names a
// deleted inode, or a file whose next event looks it up again.
func (fa *Fanotify) unlinked(ev *event) {
	k := fa.cacheKey(ev.fileFsid, ev.fileType, ev.file)
	fa.cmu.Lock()
	t := fa.files[string(k)]
	delete(fa.files, string(k))
	fa.cmu.Unlock()
	var key inode.Key
	var h inode.Handle
	switch {
	case t != nil && !t.regular:
		return
	case t != nil:
		key, h = t.key, t.handle
	default:
		typ := int32(binary.NativeEndian.Uint32(ev.fileType))
		dev, ok := fa.devOf(ev.fileFsid)
		ino, iok := inode.HandleIno(typ, ev.file)
		if !ok || !iok {
			return
		}
		key, h = inode.Key{Dev: dev, Ino: ino}, inode.MakeHandle(typ, ev.file)
	}
	fa.flushMarks()
	fa.unlinkSink.InodeUnlinked(key, h)
}

// Trees implements Backend.
func (fa *Fanotify) Trees() []TreeUse { return fa.treeUses("fanotify") }
