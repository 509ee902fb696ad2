// Package watch finds the files of the configured trees that hold dirty
// data and reports them to a Sink, the way the kernel calls
// __mark_inode_dirty. Two backends do the watching:
//
//   - Fanotify: one fanotify(7) filesystem mark per watched filesystem
//     (FAN_CLASS_NOTIF|FAN_REPORT_DFID_NAME|FAN_REPORT_FID, and
//     FAN_REPORT_TARGET_FID from Linux 5.17), events identified by file
//     handle; no per-directory watch, no watch limit.
//     Needs CAP_SYS_ADMIN (and CAP_DAC_READ_SEARCH for the handles).
//   - Watcher: inotify(7) (inotifyFD), one watch per directory, added
//     recursively on a descriptor of the directory.
//
// Both scan the trees with cachestat(2) at start-up and after an event
// queue overflow, and report every file found dirty. No path is resolved
// through a symlink: directories are opened relative to their parent's
// descriptor with O_NOFOLLOW, or with inode.OpenPath (openat2
// RESOLVE_NO_SYMLINKS), and only regular files are reported; FIFOs,
// sockets and device nodes are skipped without being opened.
package watch

import (
	"context"
	"sync/atomic"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

// Sink receives what the watcher finds (bdi.Registry).
type Sink interface {
	// MarkInodeDirty reports a regular file with dirty data; h is its
	// file handle when the backend has one.
	MarkInodeDirty(path string, key inode.Key, h inode.Handle, t tree.Tree) error
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
	// other tree is on that filesystem; unmounted, when it is known that
	// the filesystem was unmounted (which wrote its files back).
	TreeGone(root string, dev uint64, lastOnDev, unmounted bool)
	// MarkInodesDirty takes reports of files with dirty data in a batch
	// (a read of fanotify's events, a scan's look); a report not taken
	// gets its error in its Err.
	MarkInodesDirty(ms []bdi.Mark)
	// TracksKey reports whether the inode key is tracked under any name:
	// a scan reports such a file found under a new name without looking
	// at it, so that the tree's settings reach it.
	TracksKey(key inode.Key) bool
	// InodeUnlinked: a name of the file, or the file, was deleted, with
	// its own handle (fanotify's FAN_DELETE under FAN_REPORT_TARGET_FID,
	// FAN_DELETE_SELF); its attempt is brought forward.
	InodeUnlinked(key inode.Key, h inode.Handle)
	// NameUnlinked: the name path of the file key was deleted (inotify's
	// IN_DELETE, no handle); its attempt is brought forward.
	NameUnlinked(key inode.Key, path string)
	// CheckNames looks, after a rescan of the tree rooted at root (events
	// may have been lost), whether each file tracked under it still has
	// its name; the next pass looks at those that do not.
	CheckNames(root string)
	// Unchecked reports whether device dev makes no background checks
	// of freshly written files, so that fanotify may quiet a file there.
	Unchecked(dev uint64) bool
	// InodesOpened takes reports of opens and closes of the trees'
	// files (Options.Opens), for the sweep of files dirtied without an
	// event (bdi.Registry.InodesOpened).
	InodesOpened(os []bdi.Open)
}

// Backend is a way of watching the trees.
type Backend interface {
	// Name is "fanotify" or "inotify".
	Name() string
	// Observer is what the writeback engine is to tell of its attempts
	// (bdi.Registry.Observe): fanotify's, for its quieted files; nil
	// when the backend needs none.
	Observer() bdi.AttemptObserver
	// Start is WatchRoots, then Scan.
	Start(ctx context.Context) error
	// WatchRoots watches or marks every tree's root: from then on, writes
	// in the trees are seen (or found by Scan). It fails when a root
	// cannot be watched. It stops between two roots, with no error, when
	// ctx ends (a signal during start-up).
	WatchRoots(ctx context.Context) error
	// Scan walks the trees (watching their directories, for inotify) and
	// reports the files cachestat shows dirty; it stops when ctx ends.
	Scan(ctx context.Context)
	// ScannedDirs counts the directories scanned so far, for progress.
	ScannedDirs() uint64
	// AddTree starts watching another tree and scans it.
	AddTree(ctx context.Context, t tree.Tree) error
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
	// Fence returns once every event queued when it was called has been
	// read and handled (its reports have reached the sink), or with ctx's
	// error: a sync request is ordered after the writes made before it.
	// Events that come meanwhile are not waited for, and a rescan that
	// lost events scheduled is not run.
	Fence(ctx context.Context) error
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
	TreeOf(path string) (tree.Tree, bool)
	// Trees says which backend serves each tree, for watch/stats.
	Trees() []TreeUse
	// OnDevice reports whether the root of a served tree, or a
	// filesystem mounted inside one and served, is on st_dev dev.
	OnDevice(dev uint64) bool
}

// TreeUse is one tree of a backend: its root, the backend serving it
// ("fanotify" or "inotify") and whether it is served now (false once its
// root is gone).
type TreeUse struct {
	Root, Backend string
	Served        bool
	Tree          tree.Tree // its settings
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
