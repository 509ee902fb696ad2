// Package watch finds the files of the configured trees that hold dirty
// data and reports them to a Sink, the way the kernel calls
// __mark_inode_dirty. Two backends do the watching:
//
//   - Fanotify: one fanotify(7) filesystem mark per watched filesystem
//     (FAN_CLASS_NOTIF|FAN_REPORT_DFID_NAME|FAN_REPORT_FID, and
//     FAN_REPORT_TARGET_FID from Linux 5.17), events identified by file
//     handle; no per-directory watch, no watch limit.
//     Needs CAP_SYS_ADMIN (and CAP_DAC_READ_SEARCH for the handles).
//   - Watcher: inotify(7) through github.com/fsnotify/fsnotify, one watch
//     per directory, added recursively.
//
// Both scan the trees with cachestat(2) at start-up and after an event
// queue overflow, and report every file found dirty. Symlinks are never
// followed (filepath.WalkDir and lstat do not), and only regular files are
// reported; FIFOs, sockets and device nodes are skipped without being
// opened.
package watch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
)

// Tree is one watched directory tree.
type Tree struct {
	Root      string // absolute, symlink-free directory
	Recursive bool
	bdi.Tree
}

// Sink receives what the watcher finds (bdi.Registry).
type Sink interface {
	// MarkInodeDirty reports a regular file with dirty data; h is its
	// file handle when the backend has one.
	MarkInodeDirty(path string, key inode.Key, h inode.Handle, t bdi.Tree) error
	// Tracks reports whether the inode key is tracked already under the
	// name path: a scan need not open it to look (its writeback attempt
	// reads its state with cachestat, whatever events were lost). A file
	// whose number is tracked under another name may be a new file that
	// took a deleted one's number: it is looked at.
	Tracks(key inode.Key, path string) bool
	// Rescanned counts a cachestat rescan of a tree on filesystem dev.
	Rescanned(dev uint64)
	// TreeGone reports that a tree's root was removed, renamed or
	// unmounted: its inodes are to be dropped; lastOnDev is set when no
	// other tree is on that filesystem.
	TreeGone(root string, dev uint64, lastOnDev bool)
}

// ClosedSink is a Sink that tells a close apart from a write: a backend
// that reports a file only closed after writing (fanotify's
// FAN_CLOSE_WRITE without FAN_MODIFY) calls MarkInodeClosed instead of
// MarkInodeDirty when its sink has it (bdi.Registry does).
type ClosedSink interface {
	MarkInodeClosed(path string, key inode.Key, h inode.Handle, t bdi.Tree) error
}

// BatchSink is a Sink that takes reports of files with dirty data in
// batches (bdi.Registry.MarkInodesDirty): the fanotify backend hands it
// the file reports of each read at once. A report not taken gets its error
// in its Err.
type BatchSink interface {
	MarkInodesDirty(ms []bdi.Mark)
}

// UnlinkSink is a Sink told when a name of a file, or the file itself, is
// deleted, with the file's own handle (fanotify's FAN_DELETE under
// FAN_REPORT_TARGET_FID, FAN_DELETE_SELF): bdi.Registry.InodeUnlinked,
// which has a deleted file's attempt made at the next pass instead of at
// its expiry.
type UnlinkSink interface {
	InodeUnlinked(key inode.Key, h inode.Handle)
}

// NameUnlinkSink is a Sink told when a name of a file is deleted, with the
// file's key as last seen under that name and the name (inotify's
// IN_DELETE, which carries no handle): bdi.Registry.NameUnlinked, which
// has the file's attempt made at the next pass instead of at its expiry.
type NameUnlinkSink interface {
	NameUnlinked(key inode.Key, path string)
}

// NameChecker is a Sink that, after a rescan of a tree (events may have
// been lost: a queue overflow, a resource shortage), looks whether each
// file it tracks under the tree's root still has its name, and has the
// next pass look at those that do not (bdi.Registry.CheckNames): a
// deletion lost with the events is found within a pass, not at the file's
// expiry.
type NameChecker interface {
	CheckNames(root string)
}

// KeyTracker is a Sink that tells whether an inode is tracked under any
// name (bdi.Registry does): a scan reports such a file found under a new
// name (moved or linked into a tree) without looking at it, so that the
// tree's settings reach it even when it is clean by then (its writeback
// attempt, in flight, reads its state).
type KeyTracker interface {
	TracksKey(key inode.Key) bool
}

// Backend is a way of watching the trees.
type Backend interface {
	// Name is "fanotify" or "inotify".
	Name() string
	// Start is WatchRoots, then Scan.
	Start(ctx context.Context) error
	// WatchRoots watches or marks every tree's root: from then on, writes
	// in the trees are seen (or found by Scan). It fails when a root
	// cannot be watched.
	WatchRoots() error
	// Scan walks the trees (watching their directories, for inotify) and
	// reports the files cachestat shows dirty; it stops when ctx ends.
	Scan(ctx context.Context)
	// ScannedDirs counts the directories scanned so far, for progress.
	ScannedDirs() uint64
	// AddTree starts watching another tree and scans it.
	AddTree(ctx context.Context, t Tree) error
	// RemoveTree stops serving the tree rooted at root; it reports
	// whether there was one. When it returns, a report made with that
	// tree (even one read before the call) reaches the sink only as a
	// file of the tree that holds it now or as one of the removed tree's
	// files (bdi.Mark.Leaving: written back once more), so the caller
	// may let the tree's files go (Registry.TreeRemoved).
	RemoveTree(root string) bool
	// Served reports whether the tree rooted at root is watched and its
	// root is not gone.
	Served(root string) bool
	// Run handles events until ctx ends or Close.
	Run(ctx context.Context)
	// Quiesce returns once the events queued when it was called have been
	// handled (or ctx ends): a shutdown calls it before Close, so that a
	// file written just before SIGTERM is tracked, and written back.
	Quiesce(ctx context.Context)
	// Settle runs a rescan that lost events have scheduled now, and
	// returns ErrUnsettled when it cannot complete (see base.Settle).
	Settle(ctx context.Context) error
	// Close stops watching; idempotent.
	Close() error
	// Counters returns the backend's counters.
	Counters() *Counters
	// TreeOf returns the deepest served tree whose root contains path.
	TreeOf(path string) (Tree, bool)
	// Trees says which backend serves each tree, for watch/stats.
	Trees() []TreeUse
}

// TreeUse is one tree of a backend: its root, the backend serving it
// ("fanotify" or "inotify") and whether it is served now (false once its
// root is gone).
type TreeUse struct {
	Root, Backend string
	Served        bool
}

// Counters are a backend's statistics, published in <stats.dir>/watch/stats.
type Counters struct {
	Events    atomic.Uint64 // events read from the kernel
	Overflows atomic.Uint64 // event queue overflows
	Rescans   atomic.Uint64 // tree rescans (overflow, unwatched directories)
	Unwatched atomic.Uint64 // directories inotify could not watch (now)
	// Filesystems mounted inside a recursive tree (below its root) that
	// are served (Nested) or that cannot be and were logged (Unserved).
	Nested, Unserved atomic.Uint64
	// Files quieted: ignore marks set on files written continually
	// (fanotify; see hotEvents).
	Quieted atomic.Uint64
}

// Q quotes a file name for a log line losslessly: invalid UTF-8 and
// control characters become escapes (strconv.Quote).
func Q(path string) zap.Field { return zap.String("path", strconv.Quote(path)) }

// base is what both backends share: the trees, the sink, scanning and the
// roots' identity.
type base struct {
	sink        Sink
	closedSink  ClosedSink     // sink, if it tells a close from a write; else nil
	keyTracker  KeyTracker     // sink, if it tells whether a key is tracked; else nil
	batchSink   BatchSink      // sink, if it takes reports in batches; else nil
	unlinkSink  UnlinkSink     // sink, if it is told of deleted names; else nil
	nameSink    NameUnlinkSink // sink, if it is told of deleted names by name; else nil
	nameChecker NameChecker    // sink, if it checks names after a rescan; else nil
	log         *zap.Logger
	open        inode.Opener
	ctr         *Counters        // shared by the two halves of a Mixed backend
	statsName   func() string    // the backend's name in watch/stats (set by its constructor)
	statsTrees  func() []TreeUse // the trees in watch/stats (the whole backend's, for a Mixed half)
	dirsScanned atomic.Uint64
	// Directory entries looked at with fstatat by scans (readDir).
	entriesStatted atomic.Uint64
	// Batches of events read (readBatches) and handled (doneBatches), for
	// Quiesce.
	readBatches, doneBatches atomic.Uint64
	retry                    retryState
	permWarned               atomic.Bool // a file the daemon may not open was logged
	// devWritesBack holds the st_dev of the filesystems seen to write
	// data back (not noWriteback): uint64 -> true (noWritebackDev).
	devWritesBack  sync.Map
	longPathWarned atomic.Bool // a path longer than PATH_MAX was logged (longPath)

	// An overflow rescan running (overflowRescan), and one more asked
	// for.
	rmu                     sync.Mutex
	rescanning, rescanAgain bool
	// The last overflow warning, and the overflows since (logOverflow).
	overflowLogged    time.Time
	overflowsUnlogged int

	statsDir  string
	statsMu   sync.Mutex
	statsNext *time.Timer // armed while a stats write is due
	statsDue  atomic.Bool // statsNext is armed (read without statsMu)

	mu    sync.Mutex
	trees []*tree // replaced as a whole (AddTree, RemoveTree), never changed in place

	// reportMu orders the reports against a tree's end: a report checks
	// that its tree is served and hands the file to the sink under its
	// read lock (report, Fanotify.flushMarks); fence takes the write
	// lock once a tree is marked gone, so that no report made with that
	// tree reaches the sink after the sink is told to let its files go.
	reportMu sync.RWMutex
	// goneDevs, guarded by mu, holds the st_dev of the filesystems
	// unmounted from inside a tree and mounted nowhere else
	// (forgetUnmounted): a report of a file on one is dropped until it is
	// mounted in a tree again (checkMounts, addTreeIn). Its files could
	// not be opened, and retried for good.
	goneDevs map[uint64]bool
	// removedRoots, guarded by mu, holds the roots of the trees removed
	// by a reload (removeTree) and not added back (addTreeIn).
	removedRoots map[string]bool
	// finalScans counts the scans of removed trees running (finalScan).
	finalScans atomic.Int32
	// recentlyRemoved, guarded by mu, are the trees removed by a reload
	// (removeTree) that no scan has looked at since and whose removal the
	// event queue has not been seen empty after (fanotify; with inotify,
	// at most recentlyRemovedMax are kept), each with its removal's number
	// (removeSeq): writes made in one before its removal may be among the
	// events an overflow lost, so a rescan covers them (rescan).
	recentlyRemoved []removedTree
	removeSeq       uint64

	// nested serves a filesystem mounted at mountpoint, inside tree t
	// (below its root): the backend's own way of seeing its writes.
	// It reports false, having logged why, when it cannot. Set once by the
	// backend's constructor.
	nested    func(ctx context.Context, t Tree, mountpoint string) bool
	mountsMu  sync.Mutex
	mountsMet map[int]*nestedMount // mount IDs seen: handed to nested, or skipped (nil)
}

// tree is a watched tree and its state.
type tree struct {
	Tree
	root inode.Key // the root's identity when first watched
	gone bool      // guarded by base.mu: its root is gone, it is no longer served
	// failing, guarded by base.mu: its root could not be reached at
	// the last checkRoots (logged once).
	failing bool
	// nestedIn is set (once, before the tree is listed) for a
	// filesystem mounted inside another backend's tree and handed to
	// this one (Mixed): the root of that tree. Its unmount is that
	// backend's to report; here the tree is only taken out of the list.
	nestedIn string
}

func (b *base) init(trees []Tree, sink Sink, opt Options) {
	log, open := opt.Log, opt.Opener
	if log == nil {
		log = zap.NewNop()
	}
	if open == nil {
		open = inode.OS{}
	}
	b.sink, b.log, b.open, b.statsDir = sink, log, open, opt.StatsDir
	b.closedSink, _ = sink.(ClosedSink)
	b.keyTracker, _ = sink.(KeyTracker)
	b.batchSink, _ = sink.(BatchSink)
	b.unlinkSink, _ = sink.(UnlinkSink)
	b.nameSink, _ = sink.(NameUnlinkSink)
	b.nameChecker, _ = sink.(NameChecker)
	b.ctr = &Counters{}
	b.retry.min, b.retry.max = cmp.Or(opt.RetryMin, defaultRetryMin), cmp.Or(opt.RetryMax, defaultRetryMax)
	b.retry.max = max(b.retry.max, b.retry.min)
	for _, t := range trees {
		b.trees = append(b.trees, &tree{Tree: t})
	}
}

// treeUses lists the trees, served by kind.
func (b *base) treeUses(kind string) []TreeUse {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]TreeUse, 0, len(b.trees))
	for _, t := range b.trees {
		out = append(out, TreeUse{Root: t.Root, Backend: kind, Served: !t.gone})
	}
	return out
}

// list returns the current trees; the slice must not be changed.
func (b *base) list() []*tree {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.trees
}

// served reports whether t is in the list and its root is not gone.
func (b *base) served(t *tree) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !t.gone && slices.Contains(b.trees, t)
}

// addTree appends t after recording its root's identity.
func (b *base) addTree(t Tree) (*tree, error) { return b.addTreeIn(t, "") }

// addTreeIn is addTree for a tree that is a mount inside the tree rooted
// at nestedIn ("" for a configured tree).
func (b *base) addTreeIn(t Tree, nestedIn string) (*tree, error) {
	nt := &tree{Tree: t, nestedIn: nestedIn}
	if err := nt.record(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.goneDevs, nt.root.Dev) // mounted in a tree again
	delete(b.removedRoots, t.Root)
	for _, o := range b.trees {
		if o.Root == t.Root {
			return nil, fmt.Errorf("%s is already watched", strconv.Quote(t.Root))
		}
	}
	b.trees = append(slices.Clip(b.trees), nt)
	return nt, nil
}

// removeTree takes the tree rooted at root out of the list; it returns it
// and whether another served tree is on the same filesystem.
func (b *base) removeTree(root string) (*tree, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(b.trees, func(t *tree) bool { return t.Root == root })
	if i < 0 {
		return nil, false
	}
	t := b.trees[i]
	t.gone = true // a report made with it in flight is retargeted (fence)
	if b.removedRoots == nil {
		b.removedRoots = map[string]bool{}
	}
	b.removedRoots[root] = true
	// In the same hold of mu as its leaving the list, so that a rescan's
	// list has it either way.
	b.removeSeq++
	if len(b.recentlyRemoved) >= recentlyRemovedMax {
		b.recentlyRemoved = slices.Delete(b.recentlyRemoved, 0, 1)
	}
	b.recentlyRemoved = append(b.recentlyRemoved, removedTree{t, b.removeSeq})
	b.trees = slices.Delete(slices.Clone(b.trees), i, i+1)
	shared := false
	for _, o := range b.trees {
		shared = shared || (!o.gone && o.root.Dev == t.root.Dev)
	}
	return t, shared
}

// fence waits until every report that found its tree served has reached
// the sink. Called after a tree is marked gone (removeTree, checkRoots)
// and before the sink lets its files go (the caller's
// Registry.TreeRemoved, or TreeGone): a report made with the tree while it
// was served, late (a fanotify read's reports are handed over at its end;
// a rescan reports from its own goroutine), would otherwise track one of
// its files again, under the settings of a tree that is no longer there.
// Such a report goes to the tree that holds the file now, if one does, as
// the sink keeps the files another tree holds, else it is made as leaving
// or dropped (retargetLocked). It must not be called with reportMu held.
func (b *base) fence() {
	b.reportMu.Lock()
	//lint:ignore SA2001 the empty critical section is the point: it waits for the readers
	b.reportMu.Unlock()
}

// removedRoot reports whether root is the root of a tree removed by a
// reload and not added back.
func (b *base) removedRoot(root string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.removedRoots[root]
}

// retargetLocked returns where a report of the file on filesystem dev at
// path made with the tree rooted at root goes: to that tree while it is
// served, else to the tree that holds path now (a tree around it, or one
// that replaced it with new settings). Failing both, a tree removed by a
// reload has the report made as leaving (leaving: written back once more
// and forgotten, as the reload does with the files it tracked), and one
// whose root is gone has it dropped (ok false), as has a filesystem
// unmounted from the trees (goneDevs). Preconditions: b.mu held.
func (b *base) retargetLocked(root, path string, dev uint64) (t *tree, leaving, ok bool) {
	if b.goneDevs[dev] {
		return nil, false, false
	}
	for _, t := range b.trees {
		if t.Root == root && !t.gone {
			return t, false, true
		}
	}
	if t := b.treeAtLocked(path); t != nil {
		return t, false, true
	}
	removed := b.removedRoots[root]
	return nil, removed, removed
}

// touched schedules a write of the stats file a second from now, unless
// one is already due: at most one write a second while events come, and
// no timer at all while none do.
func (b *base) touched() {
	if b.statsDir == "" || b.statsDue.Load() {
		return // (one event in a stream of them costs one atomic load)
	}
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	if b.statsNext != nil {
		return
	}
	b.statsDue.Store(true)
	b.statsNext = time.AfterFunc(time.Second, func() {
		b.statsMu.Lock()
		b.statsNext = nil
		b.statsDue.Store(false)
		b.statsMu.Unlock()
		name := ""
		if b.statsName != nil {
			name = b.statsName()
		}
		var trees []TreeUse
		if b.statsTrees != nil {
			trees = b.statsTrees()
		}
		if err := WriteStats(b.statsDir, name, b.ctr, trees); err != nil {
			b.log.Debug("cannot write the watch stats file", zap.Error(err))
		}
	})
}

// Served implements Backend.
func (b *base) Served(root string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.trees {
		if t.Root == root {
			return !t.gone
		}
	}
	return false
}

// ScannedDirs implements Backend.
func (b *base) ScannedDirs() uint64 { return b.dirsScanned.Load() }

// Counters implements Backend.
func (b *base) Counters() *Counters { return b.ctr }

// TreeOf returns the deepest served tree whose root contains path.
func (b *base) TreeOf(path string) (Tree, bool) {
	if t := b.treeAt(path); t != nil {
		return t.Tree, true
	}
	return Tree{}, false
}

func (b *base) treeAt(path string) *tree {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.treeAtLocked(path)
}

// treeAtLocked is treeAt. Preconditions: b.mu held.
func (b *base) treeAtLocked(path string) *tree {
	var best *tree
	for _, t := range b.trees {
		if t.gone {
			continue
		}
		if path == t.Root || t.Root == "/" || (len(path) > len(t.Root) && path[len(t.Root)] == '/' && strings.HasPrefix(path, t.Root)) {
			if !t.Recursive && filepath.Dir(path) != t.Root && path != t.Root {
				continue
			}
			if best == nil || len(t.Root) > len(best.Root) {
				best = t
			}
		}
	}
	return best
}

// rootOf reports whether dir is the root of a tree other than t, and
// whether that tree is recursive. A recursive one holds everything below
// its root, which its own walk and watches cover; a non-recursive one
// holds only the files directly in its root, and the directories below
// belong to t still (the deepest tree that holds a path is its tree).
func (b *base) rootOf(dir string, t Tree) (root, recursive bool) {
	for _, o := range b.list() {
		if o.Root == dir && o.Root != t.Root {
			return true, o.Recursive
		}
	}
	return false, false
}

// record notes the root's identity, for checkRoots.
func (t *tree) record() error {
	var st unix.Stat_t
	if err := unix.Lstat(t.Root, &st); err != nil {
		return &fs.PathError{Op: "lstat", Path: t.Root, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("watch root %s: not a directory", strconv.Quote(t.Root))
	}
	t.root = inode.Key{Dev: st.Dev, Ino: st.Ino}
	return nil
}

// recordRoots notes each tree root's identity, for checkRoots.
func (b *base) recordRoots() error {
	for _, t := range b.list() {
		if err := t.record(); err != nil {
			return err
		}
	}
	return nil
}

// checkRoots looks at every served tree's root: one that is gone, or is now
// another directory (removed and made again, renamed, unmounted), is no
// longer served; the sink drops its inodes. Called after a directory
// removal or rename and after the mount table changed.
func (b *base) checkRoots() {
	for _, t := range b.list() {
		b.mu.Lock()
		gone := t.gone
		b.mu.Unlock()
		if gone {
			continue
		}
		var st unix.Stat_t
		err := unix.Lstat(t.Root, &st)
		if err == nil && st.Dev == t.root.Dev && st.Ino == t.root.Ino {
			b.mu.Lock()
			t.failing = false
			b.mu.Unlock()
			continue
		}
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
			// Not gone: its filesystem fails (ENOTCONN from a FUSE
			// server that died, EIO) or a resource ran out. Its files
			// stay tracked, their attempts fail and say why, and
			// their data, which no umount has written, is not
			// forgotten; an unmount shows as another directory.
			b.mu.Lock()
			first := !t.failing
			t.failing = true
			b.mu.Unlock()
			if first {
				b.log.Error("a watched tree's root cannot be reached; its files stay tracked and their writeback is retried",
					zap.String("root", strconv.Quote(t.Root)), zap.Error(err))
			}
			continue
		}
		b.mu.Lock()
		t.failing = false
		t.gone = true
		if t.nestedIn != "" {
			// A handed-over mount, unmounted: the backend of the
			// tree it was in reports it (forgetUnmounted).
			b.mu.Unlock()
			continue
		}
		last := true
		for _, o := range b.trees {
			if o != t && !o.gone && o.root.Dev == t.root.Dev {
				last = false
			}
		}
		b.mu.Unlock()
		how := "removed, renamed or unmounted"
		if err == nil && st.Dev != t.root.Dev {
			how = "unmounted, or another filesystem mounted over it"
		} else if err == nil {
			how = "replaced by another directory"
		}
		b.log.Error("a watched tree's root is gone; its files are no longer tracked (once it is back, a reload (SIGHUP, systemctl reload flusherd) serves it again)",
			zap.String("root", strconv.Quote(t.Root)), zap.String("how", how))
		b.fence()
		b.sink.TreeGone(t.Root, t.root.Dev, last)
		b.touched() // watch/stats marks it gone
	}
}

// rootMoved reports whether the served tree rooted at root no longer has
// its root at that path (lstat(2) finds another inode, or none): its root,
// or a directory above it, was renamed, removed or mounted over. inotify
// tells nothing of the directories above a root, and its watches go on
// reporting the moved tree's writes under the old path, where another
// file may now be.
func (b *base) rootMoved(root string) bool {
	t := b.treeAt(root)
	if t == nil || t.Root != root {
		return false
	}
	var st unix.Stat_t
	err := unix.Lstat(root, &st)
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
		return false // unreachable, not moved (checkRoots says which)
	}
	return err != nil || st.Dev != t.root.Dev || st.Ino != t.root.Ino
}

// noWriteback holds the statfs(2) f_type of filesystems that never hold
// data to write back: pseudo filesystems, memory-backed ones (tmpfs,
// ramfs: the data has no backing store) and read-only formats. A mount of
// one inside a tree needs nothing from flusherd.
var noWriteback = map[int64]string{
	unix.PROC_SUPER_MAGIC: "proc", unix.SYSFS_MAGIC: "sysfs", unix.CGROUP_SUPER_MAGIC: "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2", unix.DEVPTS_SUPER_MAGIC: "devpts", 0x19800202: "mqueue",
	unix.DEBUGFS_MAGIC: "debugfs", unix.TRACEFS_MAGIC: "tracefs", unix.SECURITYFS_MAGIC: "securityfs",
	unix.PSTOREFS_MAGIC: "pstore", unix.BPF_FS_MAGIC: "bpf", unix.AUTOFS_SUPER_MAGIC: "autofs",
	0x62656570: "configfs", 0x65735543: "fusectl", unix.HUGETLBFS_MAGIC: "hugetlbfs",
	unix.BINFMTFS_MAGIC: "binfmt_misc", unix.EFIVARFS_MAGIC: "efivarfs", unix.NSFS_MAGIC: "nsfs",
	unix.TMPFS_MAGIC: "tmpfs", unix.RAMFS_MAGIC: "ramfs", unix.SQUASHFS_MAGIC: "squashfs",
	unix.EROFS_SUPER_MAGIC_V1: "erofs", unix.ISOFS_SUPER_MAGIC: "iso9660", unix.CRAMFS_MAGIC: "cramfs",
}

// rescan scans every served tree again with cachestat (after an
// overflow). Files already tracked keep their dirtiedWhen.
// The trees removed by a reload recently (recentlyRemoved) are scanned
// too: the writes lost may have been made in one before its removal.
func (b *base) rescan(ctx context.Context, onDir func(t Tree, path string)) {
	b.mu.Lock()
	trees := slices.Clone(b.trees)
	for _, r := range b.recentlyRemoved {
		trees = append(trees, r.t)
	}
	b.mu.Unlock()
	b.rescanTrees(ctx, trees, onDir)
}

// rescanTrees is rescan over trees, the trees served when the rescan was
// asked for and those removed recently: one that a reload has removed is
// scanned all the same (its dirty files are reported as leaving) and is
// then no longer among the recently removed; one whose root is gone is
// not scanned.
func (b *base) rescanTrees(ctx context.Context, trees []*tree, onDir func(t Tree, path string)) {
	for _, t := range trees {
		served := b.served(t)
		if !served && !b.removedRoot(t.Root) {
			continue
		}
		if !served {
			b.scannedRemoved(t) // (found removed: this scan begins after its removal)
		}
		b.ctr.Rescans.Add(1)
		b.sink.Rescanned(t.root.Dev)
		var f func(string)
		if onDir != nil && served { // (a removed tree's directories get no watch)
			f = func(p string) { onDir(t.Tree, p) }
		}
		b.scanDir(ctx, t.Tree, t.Root, true, f)
		if served && b.nameChecker != nil && ctx.Err() == nil {
			// The events lost may have told of deletions, which no
			// scan can find: the tracked names are looked at.
			b.nameChecker.CheckNames(t.Root)
		}
	}
}

// overflowRescan runs rescan (a rescan of the trees after an event queue
// overflow) on a goroutine of its own, so that the backend goes on
// reading its queue meanwhile (the reading stalled by a rescan is what
// makes the next overflow); if one runs already, it runs once more when
// that one is done (the events lost meanwhile may concern parts it has
// scanned). The stats file is rewritten after each.
func (b *base) overflowRescan(ctx context.Context, rescan func()) {
	b.rmu.Lock()
	if b.rescanning {
		b.rescanAgain = true
		b.rmu.Unlock()
		return
	}
	b.rescanning = true
	b.rmu.Unlock()
	go func() {
		for {
			rescan()
			b.touched()
			b.rmu.Lock()
			if !b.rescanAgain || ctx.Err() != nil {
				b.rescanning, b.rescanAgain = false, false
				b.rmu.Unlock()
				return
			}
			b.rescanAgain = false
			b.rmu.Unlock()
		}
	}()
}

// overflowLogEvery is the least time between two warnings of event queue
// overflows; the overflows between are counted in the next one (and each
// is counted in the stats and metrics at once).
const overflowLogEvery = 10 * time.Second

// logOverflow warns of an event queue overflow of backend name, at most
// once per overflowLogEvery, with how many overflowed since the last
// warning.
func (b *base) logOverflow(name string) {
	b.rmu.Lock()
	b.overflowsUnlogged++
	now := time.Now()
	if !b.overflowLogged.IsZero() && now.Sub(b.overflowLogged) < overflowLogEvery {
		b.rmu.Unlock()
		return
	}
	n := b.overflowsUnlogged
	b.overflowsUnlogged, b.overflowLogged = 0, now
	b.rmu.Unlock()
	b.log.Warn(name+" event queue overflowed; rescanning the trees with cachestat",
		zap.Int("overflows", n), zap.Stringer("logged_at_most_every", overflowLogEvery))
}

// rescanBusy reports whether an overflow rescan or a scan of a removed
// tree runs (Quiesce waits for them: the files they find are to be written
// before a shutdown ends).
func (b *base) rescanBusy() bool {
	if b.finalScans.Load() > 0 {
		return true
	}
	b.rmu.Lock()
	defer b.rmu.Unlock()
	return b.rescanning
}

// removedTree is a tree removed by a reload, and its removal's number.
type removedTree struct {
	t   *tree
	seq uint64
}

// recentlyRemovedMax bounds recentlyRemoved (inotify, whose queue is not
// seen to empty, keeps the last removals only).
const recentlyRemovedMax = 64

// removed ends the removal of tree t by a reload (RemoveTree), once it is
// out of the list and marked gone: it waits for the reports made with it
// (fence) and, when events may have been lost already (an overflow's
// rescan running, or a rescan after a shortage due), scans it once more
// (finalScan). Otherwise it stays among the recently removed trees: an
// overflow still in the queue, read later, has it rescanned then.
func (b *base) removed(t *tree) {
	b.fence()
	if b.rescanBusy() || b.retry.due.Load() {
		b.scannedRemoved(t)
		b.finalScan(t.Tree)
	}
}

// scannedRemoved takes t, a removed tree that a scan begun after its
// removal covers, off the recently removed trees.
func (b *base) scannedRemoved(t *tree) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.recentlyRemoved = slices.DeleteFunc(b.recentlyRemoved, func(r removedTree) bool { return r.t == t })
}

// removeSeqNow returns the number of the last removal (removeTree).
func (b *base) removeSeqNow() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.removeSeq
}

// forgetRemovedUpTo drops the recently removed trees whose removal's
// number is at most seq, when no rescan is running or due: the event queue
// was seen empty after their removal (a read that emptied it), so an
// overflow read from now on happened after it, and lost none of their
// writes from before it (and no rescan asked for earlier is yet to list
// the trees).
func (b *base) forgetRemovedUpTo(seq uint64) {
	if b.rescanBusy() || b.retry.due.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.recentlyRemoved) == 0 {
		return
	}
	b.recentlyRemoved = slices.DeleteFunc(b.recentlyRemoved, func(r removedTree) bool { return r.seq <= seq })
}

// finalScan looks for the dirty files of t, a tree a reload removed, that
// are not tracked, on a goroutine of its own: events lost before the
// removal (a queue overflow whose rescan had not reached them, or a
// shortage) left them unknown, and the reload writes back the files of the
// tree it knows of once more. Each file found is reported as leaving
// (retargetLocked), or to the tree that holds it now.
func (b *base) finalScan(t Tree) {
	b.finalScans.Add(1)
	b.log.Info("events were lost before this tree was removed; scanning it once more for dirty files to write back",
		zap.String("root", strconv.Quote(t.Root)))
	go func() {
		defer b.finalScans.Add(-1)
		b.scanDir(context.Background(), t, t.Root, true, nil)
	}()
}

// Options configure New.
type Options struct {
	// Backend is "auto", "fanotify" or "inotify".
	Backend string
	// Opener opens files for the cachestat scans; nil means inode.OS.
	// When it is an *inode.Handles, fanotify events are matched by handle.
	Opener inode.Opener
	// RescanInterval is the period of the rescans of directories inotify
	// could not watch.
	RescanInterval time.Duration
	// RetryMin and RetryMax bound the backoff of the rescans that follow
	// a scan or event left incomplete for want of descriptors or memory
	// (0: 1s and 30s). The daemon passes writeback.min_pause and
	// max_pause, so such files are written within max_pause of the
	// shortage's end, like blocked ones.
	RetryMin, RetryMax time.Duration
	// StatsDir, if set, gets <StatsDir>/watch/stats (WriteStats).
	StatsDir string
	Log      *zap.Logger
	// Progress, if set, is called once per tree as New sets it up (its
	// filesystem offered a fanotify mark and registered for opens by
	// handle: opens that are slow on a slow filesystem), so that a
	// caller can report start-up progress (EXTEND_TIMEOUT_USEC).
	Progress func()

	// noTargetFID makes the fanotify group without FAN_REPORT_TARGET_FID,
	// as on a kernel older than 5.17 (tests of the look-up by name).
	noTargetFID bool
}

func (o *Options) progress() {
	if o.Progress != nil {
		o.Progress()
	}
}

// fanotifyRefused is the log message for a tree that fanotify does not
// serve: a missing privilege (EPERM: filesystem marks need CAP_SYS_ADMIN,
// opens by handle CAP_DAC_READ_SEARCH) is not the filesystem's doing.
func fanotifyRefused(err error) string {
	if errors.Is(err, unix.EPERM) {
		return "fanotify is not permitted (it needs CAP_SYS_ADMIN and CAP_DAC_READ_SEARCH, which the daemon does not have); this tree is served by inotify"
	}
	if errors.Is(err, errSecondMount) {
		return "this tree is on a filesystem that fanotify serves through another mount (a bind mount), where its files have other paths; it is served by inotify"
	}
	if errors.Is(err, ErrSharedFsid) {
		return "this tree's filesystem has the fsid of another marked filesystem, so fanotify cannot tell their events apart; it is served by inotify"
	}
	if errors.Is(err, unix.EACCES) {
		return "the daemon may not read this tree's root (permission denied), so fanotify cannot mark it; it is tried with inotify"
	}
	return "this tree's filesystem refuses fanotify; it is served by inotify"
}

// New returns the backend opt.Backend asks for. "auto" picks fanotify when
// the process may use it (CAP_SYS_ADMIN, and the kernel accepts
// FAN_REPORT_DFID_NAME|FAN_REPORT_FID with a filesystem mark on every
// tree) and inotify otherwise, and logs which and why. An explicit
// "fanotify" that cannot be set up is an error.
func New(trees []Tree, sink Sink, opt Options) (Backend, error) {
	log := opt.Log
	if log == nil {
		log = zap.NewNop()
	}
	switch opt.Backend {
	case "inotify":
		log.Info("watch backend: inotify (configured)")
		return NewInotify(trees, sink, opt)
	case "fanotify":
		f, err := NewFanotify(trees, sink, opt)
		if te := (*TreeError)(nil); errors.As(err, &te) {
			root := strconv.Quote(te.Root)
			switch {
			case errors.Is(te.Err, unix.EPERM):
				return nil, fmt.Errorf("%w: backend = \"fanotify\", but fanotify is not permitted for %s (%v): it needs CAP_SYS_ADMIN and CAP_DAC_READ_SEARCH (run as root, as the shipped unit does); set backend = \"auto\" or \"inotify\" to run without them",
					ErrBackendRefused, root, te.Err)
			case errors.Is(te.Err, unix.EACCES):
				return nil, fmt.Errorf("%w: backend = \"fanotify\", but the daemon may not read the tree %s (%v)",
					ErrBackendRefused, root, te.Err)
			}
			return nil, fmt.Errorf("%w: backend = \"fanotify\", but the filesystem of %s refuses it (%v); set backend = \"auto\" to serve that tree with inotify and the others with fanotify",
				ErrBackendRefused, root, te.Err)
		}
		if err != nil {
			return nil, fmt.Errorf("fanotify backend: %w", err)
		}
		log.Info("watch backend: fanotify (configured)")
		return f, nil
	case "auto", "":
		// Per filesystem: fanotify where the mark is taken, inotify
		// for the trees whose filesystem refuses it.
		f, refused, err := newFanotifyFor(trees, sink, opt)
		if err != nil {
			log.Info("watch backend: inotify (auto: fanotify unavailable)", zap.Error(err))
			return NewInotify(trees, sink, opt)
		}
		var inTrees []Tree
		for _, r := range refused {
			log.Info(fanotifyRefused(r.Err), zap.String("root", strconv.Quote(r.Root)), zap.Error(r.Err))
			for _, t := range trees {
				if t.Root == r.Root {
					inTrees = append(inTrees, t)
				}
			}
		}
		// The inotify half exists even without trees: a reload may add
		// a tree whose filesystem refuses fanotify.
		in, err := NewInotify(inTrees, sink, opt)
		if err != nil {
			f.Close()
			return nil, err
		}
		switch {
		case len(refused) == 0:
			log.Info("watch backend: fanotify (auto: filesystem marks accepted)")
		case len(inTrees) == len(trees):
			why := "no tree's filesystem takes a fanotify mark"
			if len(refused) > 0 && errors.Is(refused[0].Err, unix.EPERM) {
				why = "fanotify needs CAP_SYS_ADMIN and CAP_DAC_READ_SEARCH"
			}
			log.Info("watch backend: inotify (auto: " + why + ")")
		default:
			log.Info("watch backend: fanotify+inotify (auto: per filesystem)",
				zap.Int("fanotify_trees", len(trees)-len(inTrees)), zap.Int("inotify_trees", len(inTrees)))
		}
		return newMixed(f, in), nil
	}
	return nil, fmt.Errorf("unknown watch backend %q", opt.Backend)
}

// ErrBackendRefused is New's error when an explicitly configured backend
// cannot serve a tree (fanotify on a filesystem that refuses a mark, such
// as FUSE or a btrfs subvolume, or without the privileges it needs), and a
// backend's Start error for a tree root the daemon may not read (EACCES,
// EPERM from inotify_add_watch): a configuration error.
var ErrBackendRefused = errors.New("configuration error")

// WriteStats writes c as <dir>/watch/stats, atomically, in the stats files'
// layout (one "name: value" line each), then a "tree:" line for each tree:
// the backend that serves it and its root, quoted (strconv.Quote), with
// " gone" after a root that is no longer served.
func WriteStats(dir, backend string, c *Counters, trees []TreeUse) error {
	text := fmt.Sprintf("%-16s%10s\n%-16s%10d\n%-16s%10d\n%-16s%10d\n%-16s%10d\n%-16s%10d\n%-16s%10d\n%-16s%10d\n",
		"backend:", backend, "events:", c.Events.Load(), "overflows:", c.Overflows.Load(),
		"rescans:", c.Rescans.Load(), "unwatched_dirs:", c.Unwatched.Load(),
		"nested_mounts:", c.Nested.Load(), "unserved_mounts:", c.Unserved.Load(),
		"quieted:", c.Quieted.Load())
	for _, t := range trees {
		gone := ""
		if !t.Served {
			gone = " gone"
		}
		text += fmt.Sprintf("%-16s%10s %s%s\n", "tree:", t.Backend, strconv.Quote(t.Root), gone)
	}
	return bdi.WriteFileAtomic(filepath.Join(dir, "watch", "stats"), func(w io.Writer) error {
		_, err := io.WriteString(w, text)
		return err
	})
}
