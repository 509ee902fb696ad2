package watch

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/tree"
)

// base is what both backends share: the trees, the sink, scanning and the
// roots' identity.
type base struct {
	sink        Sink
	log         *zap.Logger
	open        inode.Opener
	handles     *inode.Handles   // opens by handle; nil: by path only
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
	// rootCheckEvery is the period of watchMounts' checks of every root
	// (Options.RescanInterval, at least 1 s; defaultRootCheck).
	rootCheckEvery time.Duration

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

	mu sync.Mutex
	// trees are replaced as a whole or appended to (listTreeLocked),
	// never changed in place below their length: list's callers keep
	// the slice. idx indexes them by root.
	trees []*watchedTree
	idx   treeIndex

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
	nested func(ctx context.Context, t tree.Tree, mountpoint string) bool
	// scanned, if set, is told of each regular file a scan (scanDir)
	// leaves tracked under its name, from the scan's goroutine. Set once
	// by the backend's constructor.
	scanned   func(path string, key inode.Key)
	mountsMu  sync.Mutex
	mountsMet map[int]*nestedMount // mount IDs seen: handed to nested, or skipped (nil)
}

// rootKey returns the root's (st_dev, st_ino) as last recorded (zero
// before).
func (t *watchedTree) rootKey() inode.Key {
	if id := t.rootID.Load(); id != nil {
		return id.key
	}
	return inode.Key{}
}

// rootIdentity is a root directory's identity: its key and, where the
// filesystem gives one, its file handle.
type rootIdentity struct {
	key    inode.Key
	handle inode.Handle
}

// isRoot reports whether st and h (inode.StatPathHandle) are of the
// directory recorded as t's root: the same key, and the same handle where
// both are known (a directory removed and made again can have the same
// key).
func (t *watchedTree) isRoot(st unix.Stat_t, h inode.Handle) bool {
	id := t.rootID.Load()
	if id == nil || st.Dev != id.key.Dev || st.Ino != id.key.Ino {
		return false
	}
	return h == "" || id.handle == "" || h == id.handle
}

// watchedTree is a watched tree and its state.
type watchedTree struct {
	tree.Tree
	// rootID is the root's identity when watched (record), read by the
	// event readers while WatchRoots records it again: an atomic.
	rootID atomic.Pointer[rootIdentity]
	gone   bool // guarded by base.mu: its root is gone, it is no longer served
	// failing, guarded by base.mu: its root could not be reached at
	// the last checkRoots (logged once).
	failing bool
	// nestedIn is set (once, before the tree is listed) for a
	// filesystem mounted inside another backend's tree and handed to
	// this one (Mixed): the root of that tree. Its unmount is that
	// backend's to report; here the tree is only taken out of the list.
	nestedIn string
}

func (b *base) init(trees []tree.Tree, sink Sink, opt Options) {
	log, open := opt.Log, opt.Opener
	if log == nil {
		log = zap.NewNop()
	}
	if open == nil && opt.Handles != nil {
		open = opt.Handles
	}
	if open == nil {
		open = inode.OS{}
	}
	b.sink, b.log, b.open, b.handles, b.statsDir = sink, log, open, opt.Handles, opt.StatsDir
	b.ctr = &Counters{}
	b.retry.min, b.retry.max = cmp.Or(opt.RetryMin, defaultRetryMin), cmp.Or(opt.RetryMax, defaultRetryMax)
	b.retry.max = max(b.retry.max, b.retry.min)
	b.rootCheckEvery = max(cmp.Or(opt.RescanInterval, defaultRootCheck), time.Second)
	b.mu.Lock()
	for _, t := range trees {
		b.listTreeLocked(&watchedTree{Tree: t})
	}
	b.mu.Unlock()
}

// listTreeLocked appends t to the trees and indexes it. An append never
// writes below the slice's length, so that list's callers' slices stay
// as they were. Preconditions: b.mu held.
func (b *base) listTreeLocked(t *watchedTree) {
	b.trees = append(b.trees, t)
	b.idx.add(t)
}

// ScannedDirs implements Backend.
func (b *base) ScannedDirs() uint64 { return b.dirsScanned.Load() }

// Counters implements Backend.
func (b *base) Counters() *Counters { return b.ctr }
