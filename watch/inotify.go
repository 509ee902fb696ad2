package watch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/policy"
	"flusherd/tree"
)

// Watcher is the inotify backend: one inotify watch per directory
// (inotifyFD), added recursively; a new directory is watched, then
// scanned, so a file made in it before its watch existed is still seen.
// A directory is watched through a descriptor opened without following a
// symlink in any component, never by its path.
//
// When the watch limit runs out (ENOSPC from
// inotify_add_watch), the directories that could not be watched are logged
// once, with the limit, and rescanned with cachestat every RescanInterval
// (when their watch is tried again) until all are watched.
type Watcher struct {
	base
	w        *inotifyFD
	interval time.Duration
	// handledEvents counts the events of w.Events handled (Fence).
	handledEvents atomic.Uint64

	dmu       sync.Mutex
	dirs      map[string]inode.Key // watched directories and their identity when watched (zero: unknown), for renames and removals
	unwatched map[string]tree.Tree // directories out of watches, rescanned periodically
	limitLogs int                  // most directories unwatched in this episode (0: none, the next episode is logged)
	kick      chan struct{}

	// keys caches the identity of the regular files that Create and
	// Write events named, by path, so that a stream of writes to a file
	// costs one lstat(2), not one per event, and so that the deletion of
	// a name (Remove) can be told to the sink with the file's key
	// (Sink.NameUnlinked). Only Run's goroutine uses it. An entry
	// goes when an event says the name may now lead elsewhere (Create,
	// Rename, Remove of it), the entries below a directory when it is
	// made, moved or removed (the paths below it change), and the whole
	// cache when it holds maxKeys entries or events were lost (an
	// overflow).
	keys map[string]inode.Key
	// keyNames counts keys' names of each file, so that a file with no
	// other name known costs goneWrite no walk of keys.
	keyNames map[inode.Key]int32
	// gone holds the names the reader saw a file lose (a Remove of a
	// name keys knew, a name made again or renamed over while its file
	// has another name), and that file: a writer that opened the file by
	// that name writes on through it, and its events keep naming it
	// (goneWrite). The same bounds as keys'. A directory renamed within
	// the trees takes the gone names below it along (goneMoving, by the
	// rename's cookie, until the end of the batch after the one of its
	// IN_MOVED_FROM: the reader may split the pair of events).
	gone       map[string]*goneName
	goneMoving map[uint32]*movingGone
	// keysMoving holds the cached names of a file or directory renamed
	// (those below a directory), by the rename's cookie, until its
	// IN_MOVED_TO has looked at the new name (the files not found there
	// are told to the sink as unlinked: keysMovedTo), or the batch after
	// the IN_MOVED_FROM's has ended.
	keysMoving map[uint32]*movingKeys
	// goneLooked holds the gone names looked at in Run's current batch:
	// once a batch.
	goneLooked map[string]bool
	// scannedNames holds the names and files that scans running beside
	// Run (at start, after an overflow, of unwatched directories) left
	// tracked, for keys (takeScanned); at most maxKeys.
	smu sync.Mutex
	// +checklocks:smu
	scannedNames []scannedName
	scannedAny   atomic.Bool   // scannedNames is not empty
	scanKick     chan struct{} // wakes Run for scannedNames
	scannedTaken atomic.Uint64 // takeScanned calls done

	// looked holds the roots whose identity Run's current batch of
	// events has checked (rootMoved), one lstat(2) per tree a batch
	// touches. Only Run's goroutine uses it.
	looked map[string]bool

	// opens counts the opens and closes of the trees' files, for the
	// sweep (Options.Opens). Only Run's goroutine uses it.
	opens inotifyOpens
}

// NewInotify returns an inotify backend for trees. Its inotify instance is
// made now; no watch is added until Start.
func NewInotify(trees []tree.Tree, sink Sink, opt Options) (*Watcher, error) {
	w, err := newInotifyFD(4096, opt.Opens)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", budgetErr(err, inotifyInstances))
	}
	iv := opt.RescanInterval
	if iv <= 0 {
		iv = 30 * time.Second
	}
	iw := &Watcher{w: w, interval: iv, dirs: map[string]inode.Key{}, unwatched: map[string]tree.Tree{}, kick: make(chan struct{}, 1), keys: map[string]inode.Key{}, keyNames: map[inode.Key]int32{}, scanKick: make(chan struct{}, 1), gone: map[string]*goneName{}, goneLooked: map[string]bool{}, looked: map[string]bool{}}
	iw.init(trees, sink, opt)
	iw.nested = iw.nestedMount
	iw.scanned = iw.noteScanned
	iw.statsTrees, iw.statsName = iw.Trees, iw.Name
	return iw, nil
}

// nestedMount serves a filesystem mounted inside tree t: its directories
// are watched and its files scanned with cachestat. A watch made before
// the mount is on the directory it covers, which sees none of its writes.
func (w *Watcher) nestedMount(ctx context.Context, t tree.Tree, mountpoint string) bool {
	// Its files are opened by handle, as a root's are, when the opener
	// can (inode.Handles): through another mount of the filesystem if
	// this one is unmounted while it stays mounted elsewhere.
	if w.handles != nil {
		if _, err := w.handles.AddMount(mountpoint); err != nil {
			w.log.Info("files of this filesystem mounted inside a tree are opened by path, not by file handle", logpath.String("path", mountpoint), zap.Error(err))
		}
	}
	w.addOrNote(t, mountpoint)
	w.scanDir(ctx, t, mountpoint, true, func(p string, fd int) { w.addOrNoteFD(t, p, fd) })
	w.logLimit()
	return true
}

// Name implements Backend.
func (w *Watcher) Name() string { return "inotify" }

// Observer implements Backend: inotify needs none.
func (w *Watcher) Observer() bdi.AttemptObserver { return nil }

// add watches the directory dir, opened with inode.OpenPath (no symlink
// in any component, the last one not followed), and records it.
func (w *Watcher) add(dir string) error {
	fd, err := inode.OpenPath(dir)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return w.addFD(dir, fd)
}

// addFD watches the directory open as fd under the name dir, and records
// it with its identity (fstat of fd: the directory watched). Anything but
// a directory is ENOTDIR.
func (w *Watcher) addFD(dir string, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: dir, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return &fs.PathError{Op: "inotify_add_watch", Path: dir, Err: unix.ENOTDIR}
	}
	if err := w.w.AddFD(dir, fd); err != nil {
		return &fs.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	w.dmu.Lock()
	w.dirs[dir] = inode.Key{Dev: st.Dev, Ino: st.Ino}
	w.dmu.Unlock()
	return nil
}

// gone reports whether err, of add, says the name leads to no directory
// now (removed, or replaced by a file or a symlink).
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// dropMovedWatches runs before a rescan after a queue overflow: a watched
// directory renamed or replaced while the events were lost keeps its
// inotify watch, which names the directory's events by the old name (a
// name that leads to another directory now, or to nothing). So every
// watched directory whose name no longer leads to the directory watched
// (inode.Stat: another inode, or none) loses its watch, with those below
// it, before the rescan watches the trees' directories by their names
// now. It returns the number of names dropped.
func (w *Watcher) dropMovedWatches() int {
	w.dmu.Lock()
	dirs := make(map[string]inode.Key, len(w.dirs))
	maps.Copy(dirs, w.dirs)
	w.dmu.Unlock()
	n := 0
	for dir, was := range dirs {
		if key, _, err := inode.Stat(dir); err == nil && key == was {
			continue
		}
		if w.forget(dir) {
			n++
		}
	}
	return n
}

// addOrNote watches dir; a directory beyond the watch limit is noted for
// the periodic rescans.
func (w *Watcher) addOrNote(t tree.Tree, dir string) { w.note(t, dir, w.add(dir)) }

// addOrNoteFD is addOrNote for the directory open as fd (a walk's).
func (w *Watcher) addOrNoteFD(t tree.Tree, dir string, fd int) { w.note(t, dir, w.addFD(dir, fd)) }

// note handles err, of watching dir in tree t.
func (w *Watcher) note(t tree.Tree, dir string, err error) {
	switch {
	case err == nil:
	case errors.Is(err, unix.ENOSPC):
		w.dmu.Lock()
		if _, ok := w.unwatched[dir]; !ok {
			w.unwatched[dir] = t
			w.ctr.Unwatched.Add(1)
		}
		w.dmu.Unlock()
	case gone(err):
	default:
		w.log.Warn("cannot watch directory", logpath.String("path", dir), zap.Error(err))
	}
}

// logLimit logs that directories are unwatched, once per episode (until
// every directory is watched again: the count, live, is in watch/stats
// and the metrics), and wakes the rescan loop.
func (w *Watcher) logLimit() {
	w.dmu.Lock()
	n := len(w.unwatched)
	first := n > 0 && w.limitLogs == 0
	if n > w.limitLogs {
		w.limitLogs = n
	}
	w.dmu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	if !first {
		return
	}
	name, limit := watchLimit()
	w.log.Error("out of inotify watches ("+name+"): some directories are not watched; "+
		"they are rescanned with cachestat every rescan_interval. Raise the limit (sysctl "+name+"=N) "+
		"or use the fanotify backend ([watcher] backend = \"fanotify\"), which needs no per-directory watch",
		zap.String("sysctl", name), zap.String("limit", limit), zap.Int("unwatched_dirs", n),
		zap.Stringer("rescan_interval", w.interval))
}

// watchLimit names the inotify watch limit that applies to the daemon and
// gives its value: fs.inotify.max_user_watches (the initial user
// namespace's), or user.max_inotify_watches when the daemon's own user
// namespace (a container's) sets a lower one. The value is "unknown" when
// neither file can be read.
func watchLimit() (sysctl, value string) {
	read := func(p string) (string, int64, bool) {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", 0, false
		}
		v := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(v, 10, 64)
		return v, n, err == nil
	}
	fsv, fsn, fsOK := read("/proc/sys/fs/inotify/max_user_watches")
	nsv, nsn, nsOK := read("/proc/sys/user/max_inotify_watches")
	switch {
	case nsOK && (!fsOK || nsn < fsn):
		return "user.max_inotify_watches", nsv
	case fsOK:
		return "fs.inotify.max_user_watches", fsv
	}
	return "fs.inotify.max_user_watches", "unknown"
}

// forget drops the watches of dir and of every directory below it, if dir
// is a watched directory; a file's rename or removal costs a map look-up.
func (w *Watcher) forget(dir string) bool {
	w.dmu.Lock()
	defer w.dmu.Unlock()
	if _, ok := w.dirs[dir]; !ok {
		return false
	}
	prefix := dir + "/"
	for p := range w.dirs {
		if p == dir || strings.HasPrefix(p, prefix) {
			w.removeWatch(p)
			delete(w.dirs, p)
		}
	}
	return true
}

// removeWatch stops watching the directory path.
func (w *Watcher) removeWatch(path string) { w.w.Remove(path) }

// Close implements Backend.
func (w *Watcher) Close() error { return w.w.Close() }

// Start implements Backend: WatchRoots, then Scan.
func (w *Watcher) Start(ctx context.Context) error {
	if err := w.WatchRoots(ctx); err != nil {
		return err
	}
	w.Scan(ctx)
	return nil
}

// WatchRoots implements Backend: it records the roots and watches each.
// A root that cannot be watched is an error.
func (w *Watcher) WatchRoots(ctx context.Context) error {
	if err := w.recordRoots(); err != nil {
		return err
	}
	for _, t := range w.list() {
		if ctx.Err() != nil {
			return nil
		}
		if err := w.watchRoot(t.Root); err != nil {
			return err
		}
	}
	return nil
}

func (w *Watcher) watchRoot(root string) error {
	err := w.add(root)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOSPC):
		name, limit := watchLimit()
		return fmt.Errorf("inotify_add_watch %s: out of inotify watches (%s = %s); raise it or use the fanotify backend",
			strconv.Quote(root), name, limit)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w: the daemon may not read the tree %s (inotify_add_watch: %v); give it read and search permission on the directory, or remove the tree",
			ErrBackendRefused, strconv.Quote(root), err)
	}
	return err
}

// Scan implements Backend: it adds a watch on every directory below the
// roots and scans the files with cachestat. A directory is watched before
// its files are scanned, so a file written meanwhile is seen by one or the
// other. Running out of watches is not an error (see Watcher).
func (w *Watcher) Scan(ctx context.Context) {
	for _, t := range w.list() {
		w.scanDir(ctx, t.Tree, t.Root, true, func(p string, fd int) { w.addOrNoteFD(t.Tree, p, fd) })
	}
	w.logLimit()
	if n := w.w.EnableOpens(inode.OpenDir); n > 0 {
		w.log.Info("the opens and closes of some watched directories' files are not reported until they are watched again (moved or removed during the scan)", zap.Int("directories", n))
	}
}

// AddTree implements Backend: it watches the new tree's root and scans it.
func (w *Watcher) AddTree(ctx context.Context, t tree.Tree) error {
	if _, err := w.addTree(t); err != nil {
		return err
	}
	if err := w.watchRoot(t.Root); err != nil {
		w.removeTree(t.Root)
		return err
	}
	w.scanDir(ctx, t, t.Root, true, func(p string, fd int) { w.addOrNoteFD(t, p, fd) })
	w.logLimit()
	return nil
}

// serveNested serves a filesystem mounted at mountpoint inside parent, a
// tree of another backend that cannot (Mixed: a FUSE filesystem inside a
// fanotify tree): as a tree of this backend rooted at mountpoint, with
// parent's settings. An earlier mount's tree there, gone, is replaced. It
// reports false, having logged why, when the mount cannot be watched.
func (w *Watcher) serveNested(ctx context.Context, parent tree.Tree, mountpoint string) bool {
	w.mu.Lock()
	old := w.idx.at(mountpoint)
	w.mu.Unlock()
	if old != nil {
		if old.nestedIn == "" {
			return true // a configured tree of this backend already
		}
		w.RemoveTree(mountpoint)
	}
	nt := parent
	nt.Root = mountpoint
	if _, err := w.addTreeIn(nt, parent.Root); err != nil {
		w.log.Warn("cannot watch a filesystem mounted inside a tree", logpath.String("mountpoint", mountpoint), zap.Error(err))
		return false
	}
	if err := w.watchRoot(mountpoint); err != nil {
		w.removeTree(mountpoint)
		w.log.Warn("cannot watch a filesystem mounted inside a tree", logpath.String("mountpoint", mountpoint), zap.Error(err))
		return false
	}
	w.scanDir(ctx, nt, mountpoint, true, func(p string, fd int) { w.addOrNoteFD(nt, p, fd) })
	w.logLimit()
	return true
}

// RemoveTree implements Backend: the tree's directories lose their
// watches, except those inside another tree.
func (w *Watcher) RemoveTree(root string) bool {
	t, _ := w.removeTree(root)
	if t == nil {
		return false
	}
	w.removed(t)
	w.dmu.Lock()
	prefix := root + "/"
	for p := range w.dirs {
		if p != root && !strings.HasPrefix(p, prefix) {
			continue
		}
		if o := w.treeAt(p); o != nil {
			continue // still inside a tree
		}
		w.removeWatch(p)
		delete(w.dirs, p)
	}
	for p := range w.unwatched {
		if (p == root || strings.HasPrefix(p, prefix)) && w.treeAt(p) == nil {
			delete(w.unwatched, p)
			w.ctr.Unwatched.Add(^uint64(0))
		}
	}
	if len(w.unwatched) == 0 {
		w.limitLogs = 0
	}
	w.dmu.Unlock()
	return true
}

// Run implements Backend.
func (w *Watcher) Run(ctx context.Context) {
	go w.watchMounts(ctx)
	var tick *time.Timer
	var tc <-chan time.Time
	defer func() {
		if tick != nil {
			tick.Stop()
		}
		w.opens.stop()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
			if tick == nil {
				tick = time.NewTimer(w.interval)
				tc = tick.C
			}
		case now := <-w.opens.C():
			w.reportOpens(now)
		case <-w.scanKick:
			w.takeScanned()
		case <-tc:
			if w.rescanUnwatched(ctx) {
				tick.Reset(w.interval)
			} else {
				tick, tc = nil, nil
			}
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			// Then the events already waiting, without a select each.
			// Each is counted before it is handled: what the sink
			// saw was counted.
			n := 1
			clear(w.looked)
			clear(w.goneLooked)
			if w.scannedAny.Load() {
				w.takeScanned()
			}
			w.ctr.Events.Add(1)
			w.handle(ev)
		drain:
			for n < 1024 {
				select {
				case ev, ok = <-w.w.Events:
					if !ok {
						break drain
					}
					n++
					w.ctr.Events.Add(1)
					w.handle(ev)
				default:
					break drain
				}
			}
			w.endMoves()
			w.endGoneMoves()
			w.endKeyMoves()
			w.touched()
			w.doneBatches.Add(1)
			w.handledEvents.Add(uint64(n))
		case err, ok := <-w.w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, errEventOverflow) {
				w.ctr.Overflows.Add(1)
				w.logOverflow("inotify")
				// The names the lost events changed may lead
				// elsewhere now.
				w.clearKeys()
				w.dropOpens()
				w.overflowRescan(ctx, func() {
					if n := w.dropMovedWatches(); n > 0 {
						w.log.Info("watched directories were moved or replaced while events were lost; they are watched again under their names now",
							zap.Int("directories", n))
					}
					w.rescan(ctx, w.addOrNoteFD)
				})
				continue
			}
			w.log.Warn("watch error", zap.Error(err))
		}
	}
}

// Settle implements Backend: base.Settle, then a scan now of every
// directory out of watches (rescanUnwatched), whose files no event
// reports: without it a shutdown would write back only what the last
// periodic rescan had found, and say every tracked file is clean while
// files written since in those directories are dirty. It returns
// ErrUnsettled when that scan is cut short (by ctx or for want of a
// resource).
func (w *Watcher) Settle(ctx context.Context) error {
	err := w.base.Settle(ctx)
	w.dmu.Lock()
	n := len(w.unwatched)
	w.dmu.Unlock()
	if n == 0 {
		return err
	}
	before := w.retry.failures.Load()
	w.rescanUnwatched(ctx)
	if w.retry.failures.Load() != before || ctx.Err() != nil {
		return errors.Join(err, ErrUnsettled)
	}
	return err
}

// rescanUnwatched tries again to watch each directory that was out of
// watches, and scans it and everything below it with cachestat (what was
// made or moved in below an unwatched directory reported no event), once
// for a directory below another unwatched one. It reports whether any is
// still unwatched. Each tree it scans in counts as one rescan
// (Counters.Rescans, Sink.Rescanned).
func (w *Watcher) rescanUnwatched(ctx context.Context) bool {
	w.dmu.Lock()
	dirs := make(map[string]tree.Tree, len(w.unwatched))
	for d, t := range w.unwatched {
		dirs[d] = t
	}
	w.dmu.Unlock()
	counted := map[string]bool{}
	for d, t := range dirs {
		if !counted[t.Root] {
			counted[t.Root] = true
			w.ctr.Rescans.Add(1)
			if rt := w.treeAt(t.Root); rt != nil {
				w.sink.Rescanned(rt.rootKey().Dev)
			}
		}
		if ctx.Err() != nil {
			return true
		}
		// A directory replaced by a file or a symlink since is
		// dropped, not watched through it (add).
		err := w.add(d)
		if err == nil || gone(err) {
			w.dmu.Lock()
			delete(w.unwatched, d)
			w.ctr.Unwatched.Add(^uint64(0))
			w.dmu.Unlock()
		}
		if gone(err) {
			continue
		}
		if coveredBy(dirs, d) {
			continue // an unwatched ancestor's walk goes through it
		}
		// The whole subtree: a directory made or moved in below an
		// unwatched one since reported no event either. Each directory
		// the walk meets is watched if the limit allows, else noted.
		w.scanDir(ctx, t, d, true, func(p string, fd int) { w.addOrNoteFD(t, p, fd) })
	}
	w.touched()
	w.dmu.Lock()
	left := len(w.unwatched)
	if left == 0 {
		w.limitLogs = 0 // the episode is over: the next is logged
	}
	w.dmu.Unlock()
	if left == 0 && len(dirs) > 0 {
		w.log.Info("every directory is watched again")
	}
	return left > 0
}

// coveredBy reports whether a proper ancestor of dir is in dirs, in the
// same tree (its recursive walk reaches dir).
func coveredBy(dirs map[string]tree.Tree, dir string) bool {
	root := dirs[dir].Root
	if dir == root {
		return false
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if t, ok := dirs[p]; ok && t.Root == root && t.Recursive {
			return true
		}
		if p == root || p == "/" || p == "." {
			return false
		}
	}
}

// handle handles one event, for the deepest served tree that holds its
// name.
func (w *Watcher) handle(ev inotifyEvent) {
	t, ok := w.TreeOf(ev.Name)
	if !ok {
		return
	}
	if ev.Has(opOpen) || ev.Has(opClose) {
		w.openEvent(t, ev)
		if ev.Op&^(opOpen|opClose|opCloseWrite) == 0 {
			return
		}
	}
	switch {
	case ev.Has(opRename):
		w.openMovedFrom(ev)
	case ev.Has(opRemove):
		w.openNameGone(ev.Name)
	case ev.Has(opCreate) && ev.Cookie != 0:
		w.openMovedTo(t, ev)
	}
	if !w.looked[t.Root] {
		// Once per batch and tree: a directory above the root renamed
		// (the watches report the moved files under the old path,
		// where a new file may be made) is the root gone.
		w.looked[t.Root] = true
		if w.rootMoved(t.Root) {
			w.checkRoots()
			if t, ok = w.TreeOf(ev.Name); !ok {
				return
			}
		}
	}
	// The file the name led to, if the cache knows it: a Remove or a
	// Create of the name (a file moved over it: IN_MOVED_TO) says that
	// file lost the name; the sink is told (unlinked), so that a deleted
	// file is forgotten at the next pass, not at its expiry. A name the
	// cache does not know (emptied when full, or deleted before the
	// reader took it from a scan: takeScanned) waits for that.
	old, known := w.keys[ev.Name]
	if ev.Has(opRename) && ev.Cookie != 0 {
		// (Before forgetKey drops them.)
		if ev.Dir {
			w.goneMovedFrom(ev.Name, ev.Cookie)
		}
		w.keysMovedFrom(ev.Name, ev.Dir, ev.Cookie)
	}
	if !ev.Has(opWrite) {
		w.forgetKey(ev.Name, ev.Has(opCreate)) // (a Create of a directory clears all of it below)
	}
	if known && ev.Has(opRemove) {
		w.unlinked(old, ev.Name)
		w.noteGone(ev.Name, old)
	}
	switch {
	case ev.Has(opCreate):
		w.created(t, ev.Name, old, known)
		if ev.Cookie != 0 {
			w.goneMovedTo(ev.Name, ev.Cookie)
			w.keysMovedTo(ev.Name, ev.Cookie)
		}
	case ev.Has(opWrite):
		if g := w.gone[ev.Name]; g != nil {
			// A writer of the file that lost the name: reported
			// under its live name; if the name leads to a file
			// again, that one is reported too (the events of both
			// name it).
			w.goneWrite(ev.Name, g)
			if !g.reborn {
				return
			}
		}
		if known { // (old: the cache's entry, which a Write keeps)
			w.report(t, ev.Name, old, false)
			return
		}
		if key, ok := w.reportPath(t, ev.Name, false); ok {
			w.cacheKey(ev.Name, key)
		}
	case ev.Has(opRename), ev.Has(opRemove):
		// A directory renamed away keeps its watch under the old name:
		// drop the watches below it; its new name, if in a tree, comes
		// as a Create. A directory that has the name still was not
		// (the other side of a renameat2(RENAME_EXCHANGE), whose
		// events for the name come after its own Create).
		if !w.stillNamed(ev.Name) && w.forget(ev.Name) {
			w.checkRootsUnder(ev.Name)
		}
	}
}

// stillNamed reports whether the watched directory name is still there
// under that name (inode.Stat finds the inode watched).
func (w *Watcher) stillNamed(name string) bool {
	w.dmu.Lock()
	was, ok := w.dirs[name]
	w.dmu.Unlock()
	if !ok || was == (inode.Key{}) {
		return false
	}
	key, _, err := inode.Stat(name)
	return err == nil && key == was
}

// created handles a Create of name (made, linked or moved in) in tree t:
// a directory is watched and scanned, a regular file reported. old is the
// file the name led to before, if known.
//
// name is looked at through inode.OpenPath: a name reached through a
// symlink (a directory above it swapped for one) is not looked at, and a
// directory is watched through the descriptor looked at.
func (w *Watcher) created(t tree.Tree, name string, old inode.Key, known bool) {
	var st unix.Stat_t
	fd, err := inode.OpenPath(name)
	if err == nil {
		defer unix.Close(fd)
		err = unix.Fstat(fd, &st)
	}
	if known && (err != nil || (inode.Key{Dev: st.Dev, Ino: st.Ino}) != old) {
		w.unlinked(old, name)
		if w.keyNames[old] > 0 { // (it lives on under another name)
			w.noteGone(name, old)
			w.gone[name].reborn = err == nil
		}
	}
	if err != nil {
		if policy.Shortage(err) {
			w.scanIncomplete(err)
		}
		return
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		w.forgetKeysUnder(name) // a directory moved in: the paths below it are new
		// The tree of what is in it: a directory made in a
		// non-recursive tree's root holds files of the tree
		// around that one, if any.
		ct, ok := w.TreeOf(joinPath(name, "f"))
		if !ok || !ct.Recursive || ct.Root == name {
			return // nothing of a tree in it, or a tree's own root
		}
		w.addOrNoteFD(ct, name, fd)
		// Files made in it before the watch existed sent no event.
		// Their names are cached as a Create's are, so that their
		// Remove, which the watch may well report, is known.
		w.scanDirFiles(context.Background(), ct, name, false, func(p string, fd int) { w.addOrNoteFD(ct, p, fd) }, w.cacheKey)
		w.logLimit()
	case unix.S_IFREG:
		// Made, linked or moved in: tracked without opening it
		// here (an open can hang on a sick filesystem and would
		// stall every tree); the writeback attempt, which has a
		// timeout, finds out whether it is dirty.
		// Reported as made: under a number tracked already, it
		// is the same file (linked, moved) or a new one that took
		// the number of a file deleted unseen (no Remove matched
		// it), and the registry takes its handle to tell them
		// apart, rather than open a new file by a deleted one's
		// handle (ESTALE: forgotten with its data dirty).
		key := inode.Key{Dev: st.Dev, Ino: st.Ino}
		w.reportAs(t, name, key, false, true)
		w.cacheKey(name, key)
	}
}

// Quiesce implements Backend. inotifyFD reads the inotify queue on a
// goroutine of its own, so this waits until no event has been handled for
// 50ms, none waits in its channel, and no name a scan found waits for the
// cache (takeScanned).
func (w *Watcher) Quiesce(ctx context.Context) {
	last, since := w.doneBatches.Load(), time.Now()
	for ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
		if n := w.doneBatches.Load(); n != last || len(w.w.Events) > 0 || w.rescanBusy() || w.scannedAny.Load() {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) >= 50*time.Millisecond {
			return
		}
	}
}

// Fence implements Backend: it returns once every event queued at its
// call has been read, sent on Events and handled by Run, or ctx's error.
func (w *Watcher) Fence(ctx context.Context) error {
	t, err := w.w.cursor.target(ctx, w.w.queued)
	if err != nil {
		return err
	}
	if err := waitUntil(ctx, func() bool { return w.w.sentBytes.Load() >= t }); err != nil {
		return err
	}
	s := w.w.sent.Load()
	return waitUntil(ctx, func() bool { return w.handledEvents.Load() >= s })
}

// Trees implements Backend.
func (w *Watcher) Trees() []TreeUse { return w.treeUses("inotify") }
