package watch

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"slices"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/policy"
)

// handle handles one event; it reports whether the event concerned a tree.
func (fa *Fanotify) handle(ctx context.Context, ev *event) bool {
	if ev.mask&unix.FAN_ONDIR != 0 {
		return fa.handleDir(ctx, ev)
	}
	if ev.mask&(unix.FAN_DELETE|unix.FAN_DELETE_SELF) != 0 && ev.file != nil {
		// A name deleted, with the file's own handle
		// (FAN_REPORT_TARGET_FID), or the file itself
		// (FAN_DELETE_SELF, with FAN_REPORT_FID: its last name gone
		// and its last opener closed, or replaced by a rename over
		// its name, which makes no FAN_DELETE): after the rest of
		// the event (the kernel may have merged a write into it),
		// the sink brings its attempt forward.
		defer fa.unlinked(ev)
	}
	writes := ev.mask&(unix.FAN_MODIFY|unix.FAN_CLOSE_WRITE|unix.FAN_CREATE|unix.FAN_MOVED_TO) != 0
	// An open or close by another process than the daemon (whose own
	// opens, read-only, map nothing).
	opens := fa.opens && ev.mask&(unix.FAN_OPEN|unix.FAN_CLOSE_WRITE|unix.FAN_CLOSE_NOWRITE) != 0 && ev.pid != fa.pid
	if !writes && !opens {
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
		if !writes {
			return false
		}
		// Directory-entry events (a file made, linked or moved in)
		// without FAN_REPORT_TARGET_FID (fanotifyInit) name the
		// entry, not the object: look at it by name (inode.Stat,
		// no symlink followed; no open for I/O here, which could
		// hang on a sick filesystem and stall every tree); the
		// writeback attempt, which has a timeout, finds out
		// whether it is dirty. The writes read
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
	t := d.tree
	if !tg.named(d.prefix, ev.name) {
		if t = fa.namedBy(tg, d, ev); t == nil {
			return false
		}
	}
	if opens {
		fa.reportOpen(t, tg, ev.mask)
		if !writes {
			return false // (not a change of the trees' state: no stats write)
		}
	}
	if tg.events++; tg.events >= hotEvents {
		// Quieted before it is marked dirty: the engine tracks it
		// from a moment when its writes are no longer reported.
		tg.events = 0
		fa.quietFile(tg)
	}
	// Closed, with no write (nor a directory entry made) with it.
	closed := ev.mask&(unix.FAN_MODIFY|unix.FAN_CREATE|unix.FAN_MOVED_TO) == 0
	return fa.reportTarget(t, tg, closed)
}

// handleDir handles an event of a directory (FAN_ONDIR): one moved in is
// scanned, and a move or deletion has the roots at or below it checked
// (checkRootsUnder). A move or deletion outside every tree, of a
// directory that holds no root, is dismissed after a look-up in the
// directory cache and the tree index. It reports whether the event
// concerned a tree.
func (fa *Fanotify) handleDir(ctx context.Context, ev *event) bool {
	const dirent = unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO | unix.FAN_DELETE
	if ev.mask&dirent == 0 || ev.dir == nil {
		// A directory made: nothing to watch, the mark covers it. A
		// directory's own move or deletion (FAN_MOVE_SELF,
		// FAN_DELETE_SELF) comes with its parent's event too
		// (FAN_MOVED_FROM, FAN_DELETE), which is handled.
		return false
	}
	// What follows may report files (a scan) or drop a tree's:
	// the writes read before it are reported first, in order.
	fa.flushMarks()
	d, ok, err := fa.dirOfErr(ev)
	var p string // the directory moved or deleted ("": unknown)
	if ok {
		p = joinPath(d.path, string(ev.name))
		fa.mu.Lock()
		holds := fa.idx.holdsRoot(p)
		fa.mu.Unlock()
		if d.tree == nil && !holds {
			return false // outside every tree, no root below it
		}
	}
	// A directory moved or deleted: cached paths may be stale.
	fa.cmu.Lock()
	fa.clearDirsLocked()
	fa.cmu.Unlock()
	if ev.mask&unix.FAN_MOVED_TO != 0 && ok {
		// Moved in: its files made no event here; scan them.
		// (The tree of what is in it: in a non-recursive
		// tree's root, that of the tree around it.)
		if t, ok := fa.TreeOf(joinPath(p, "f")); ok && t.Recursive {
			fa.scanDir(ctx, t, p, true, nil)
			return true
		}
	}
	if ev.mask&(unix.FAN_DELETE|unix.FAN_MOVED_FROM) != 0 {
		switch {
		case ok:
			fa.checkRootsUnder(p)
		case err != nil && !errors.Is(err, unix.ESTALE) && !errors.Is(err, unix.ENOENT):
			// Not found for want of resources, or a path too long:
			// any root may be the one moved.
			fa.checkRoots()
		}
		// (Else the parent is deleted too: that comes as an event of
		// its own parent, after this one.)
	}
	return false
}

// named reports whether tg was last reported under name in the
// directory whose path with a trailing slash is prefix.
func (tg *fanotifyTarget) named(prefix string, name []byte) bool {
	p := tg.path
	return len(p) == len(prefix)+len(name) && strings.HasPrefix(p, prefix) && p[len(prefix):] == string(name)
}

// namedBy handles event ev of file tg under a name of directory d other
// than the one tg was last reported under, and returns the tree to report
// it in (nil: none). A directory entry made (a link, a move in) names the
// file. A write or close under a name the file has lost (deleted, or
// leading to another file now, fstatat: the writer opened the file by it
// before) keeps the file's live name (liveTree). Else the event's name
// becomes the file's, and the one before it its other name (alt; not
// after a move, which took the old name away).
func (fa *Fanotify) namedBy(tg *fanotifyTarget, d *fanotifyDir, ev *event) *watchedTree {
	p := d.prefix + string(ev.name)
	if ev.mask&(unix.FAN_CREATE|unix.FAN_MOVED_TO) == 0 && tg.path != "" && (slices.Contains(tg.gone, p) || !fa.leadsTo(p, tg)) {
		tg.lost(p)
		return fa.liveTree(tg)
	}
	tg.alt = tg.path
	if ev.mask&unix.FAN_MOVED_TO != 0 {
		tg.alt = ""
	}
	tg.path, tg.pathGen = p, fa.dirGen.Load()
	tg.gone = slices.DeleteFunc(tg.gone, func(g string) bool { return g == p }) // a name again
	return d.tree
}

// leadsTo reports whether path p leads to file tg (fstatat, no symlink
// followed), or cannot be told (an error other than the name's absence).
func (fa *Fanotify) leadsTo(p string, tg *fanotifyTarget) bool {
	k, _, err := inode.Stat(p)
	if err != nil {
		return policy.ClassifyErr(err) != policy.Gone && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP)
	}
	return k == tg.key
}

// liveTree returns the tree of the directory of tg's live name (nil:
// none holds it). Once a directory has moved or gone since tg.path was
// known (dirGen), the name is looked at again: kept if it still leads to
// the file, else its other name (alt) if that does, else the path of the
// file's handle (/proc/self/fd) if that does; with none, tg.path stays.
func (fa *Fanotify) liveTree(tg *fanotifyTarget) *watchedTree {
	if gen := fa.dirGen.Load(); tg.pathGen != gen {
		switch {
		case fa.leadsTo(tg.path, tg):
		case tg.alt != "" && fa.leadsTo(tg.alt, tg):
			tg.path, tg.alt = tg.alt, ""
		default:
			if p, ok := fa.pathOfFile(tg); ok {
				tg.path = p
			}
		}
		tg.pathGen = gen
	}
	return fa.treeOfDir(filepath.Dir(tg.path))
}

// pathOfFile returns a live name of file tg read from its handle's
// descriptor (/proc/self/fd), if one leads to it: the kernel may give the
// deleted name a writer holds ("... (deleted)"), which is refused.
func (fa *Fanotify) pathOfFile(tg *fanotifyTarget) (string, bool) {
	p, ok, err := fa.handles.PathOfHandle(tg.key.Dev, tg.handle)
	if err != nil || !ok || strings.HasSuffix(p, " (deleted)") || !fa.leadsTo(p, tg) {
		return "", false
	}
	return p, true
}

// reportTarget reports file tg, written (or only closed after writing:
// closed) in tree t: added to the batch of the read, which flushMarks
// hands to the sink. It reports whether the report was made.
func (fa *Fanotify) reportTarget(t *watchedTree, tg *fanotifyTarget, closed bool) bool {
	fa.pending = append(fa.pending, bdi.Mark{Path: tg.path, Key: tg.key, Handle: tg.handle,
		Tree: t.Tree, Closed: closed})
	fa.pendingTrees = append(fa.pendingTrees, t)
	if len(fa.pending) >= pendingMax {
		fa.flushMarks()
	}
	return true
}

// reportOpen reports an open and/or close (mask) of file tg in tree t:
// added to the read's batch of opens, which flushMarks hands to the sink.
func (fa *Fanotify) reportOpen(t *watchedTree, tg *fanotifyTarget, mask uint64) {
	fa.pendingOpens = append(fa.pendingOpens, bdi.Open{Path: tg.path, Key: tg.key, Handle: tg.handle, Tree: t.Tree,
		Open: mask&unix.FAN_OPEN != 0, Closes: closes(mask)})
	fa.pendingOpenTrees = append(fa.pendingOpenTrees, t)
	if len(fa.pendingOpens) >= pendingMax {
		fa.flushMarks()
	}
}

// closes returns the closes an event's mask carries: a close of a
// descriptor open for writing and one of a read-only descriptor, merged
// into one event, are two.
func closes(mask uint64) int {
	n := 0
	if mask&unix.FAN_CLOSE_WRITE != 0 {
		n++
	}
	if mask&unix.FAN_CLOSE_NOWRITE != 0 {
		n++
	}
	return n
}

// flushOpens hands the pending open and close reports to the sink, but
// those of a tree removed or gone since they were made (whose files the
// sink lets go). Preconditions: fa.reportMu held for reading.
func (fa *Fanotify) flushOpens() {
	if len(fa.pendingOpens) == 0 {
		return
	}
	batch := fa.pendingOpens
	fa.mu.Lock()
	n := 0
	for i, t := range fa.pendingOpenTrees {
		if !t.gone {
			batch[n] = batch[i]
			n++
		}
	}
	fa.mu.Unlock()
	if n > 0 {
		fa.sink.InodesOpened(batch[:n])
	}
	clear(fa.pendingOpens)
	clear(fa.pendingOpenTrees)
	fa.pendingOpens, fa.pendingOpenTrees = fa.pendingOpens[:0], fa.pendingOpenTrees[:0]
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
// tracked before it is told of. The cache entry goes, unless the file has
// a name left to report under (nameDeleted): the handle names a deleted
// inode, or a file whose next event looks it up again.
func (fa *Fanotify) unlinked(ev *event) {
	k := string(fa.cacheKey(ev.fileFsid, ev.fileType, ev.file))
	fa.cmu.Lock()
	t := fa.files[k]
	fa.cmu.Unlock()
	if t == nil || !t.regular || !fa.nameDeleted(t, ev) {
		fa.cmu.Lock()
		delete(fa.files, k)
		fa.cmu.Unlock()
	}
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
	fa.sink.InodeUnlinked(key, h)
}

// nameDeleted records that ev (FAN_DELETE) deleted a name of file t, and
// reports whether t keeps a name to report under: its last reported one,
// if that is not the one deleted, else its other name (alt), if fstatat
// finds the file there. The deleted name joins t.gone. A file's own
// deletion (FAN_DELETE_SELF) leaves it no name.
func (fa *Fanotify) nameDeleted(t *fanotifyTarget, ev *event) bool {
	if ev.mask&unix.FAN_DELETE_SELF != 0 || ev.mask&unix.FAN_DELETE == 0 || ev.dir == nil {
		return false
	}
	d, ok := fa.dirOf(ev)
	if !ok || t.path == "" {
		return false
	}
	p := d.prefix + string(ev.name)
	switch {
	case p != t.path:
		if t.alt == p {
			t.alt = ""
		}
	case t.alt != "" && fa.leadsTo(t.alt, t):
		t.path, t.alt = t.alt, ""
	default:
		return false
	}
	t.lost(p)
	return true
}

// pendingMax bounds the reports held before they are handed to the sink.
const pendingMax = 256

// flushMarks hands the pending file reports to the sink and handles
// those it did not take. A report whose tree was removed or went away
// since it was made goes to the tree that holds its file now, or is
// dropped if none does (fence): the sink has let, or is letting, that
// tree's files go.
func (fa *Fanotify) flushMarks() {
	if len(fa.pending) == 0 {
		if len(fa.pendingOpens) > 0 {
			fa.reportMu.RLock()
			fa.flushOpens()
			fa.reportMu.RUnlock()
		}
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
		fa.sink.MarkInodesDirty(ms)
	}
	fa.flushOpens()
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
				m.Tree = nt.Tree
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
		fa.log.Warn("cannot track file", logpath.String("path", path), zap.Error(err))
	}
}
