package bdi

import (
	"errors"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/lists"
	"flusherd/tree"
)

// Unlinked is told that a name of the inode key, whose file handle is h,
// or the inode itself was deleted. The kernel takes an inode off its writeback lists when the
// inode is evicted (evict, inode_io_list_del in fs/fs-writeback.c), at
// once; here a deleted file would wait for its next attempt, up to its
// expiry (an hour with dirty_expire_interval = "1h"), listed by `flusherd
// dirty` and held in memory. So a tracked inode with that handle goes to
// b_more_io (requeue_io), and the next pass, within
// dirty_writeback_interval, tries it: a file gone for good is found so
// (open_by_handle_at: ESTALE, counted in inodes_gone) and forgotten; one
// that keeps another name, or that a process still holds open, is written
// back early and stays tracked as any file written back. An inode not
// tracked, tracked with another handle (a new file given its number), in
// an attempt or held by a call left to its worker (it is looked at when
// that ends), or whose data was lost (kept to be reported) is left as it
// is. It reports whether the inode was requeued.
func (wb *Writeback) Unlinked(key inode.Key, h inode.Handle) bool {
	if h == "" {
		return false
	}
	return wb.unlinked(key, func(in *inode.Inode) bool {
		old := in.Handle()
		return old == "" || old == h
	})
}

// NameUnlinked is Unlinked for a watcher that knows the deleted name, not
// the file's handle (inotify's IN_DELETE names a directory entry; the
// inode may be gone): a tracked inode key is requeued only if path is one
// of its names (inode.Inode.HasPath), so that a number given to another
// file meanwhile, tracked under its own name, is left alone. The same
// cases as Unlinked's are left as they are. It reports whether the inode
// was requeued.
func (wb *Writeback) NameUnlinked(key inode.Key, path string) bool {
	if path == "" {
		return false
	}
	return wb.unlinked(key, func(in *inode.Inode) bool { return in.HasPath(path) })
}

// CheckNames looks whether each file tracked under root still has its
// name, after a rescan of root's tree (events may have been lost with the
// deletions they told of). When its directory's entry of that name is
// missing (fstatat(2): ENOENT), or is another inode, or the directory is
// gone (ENOENT, ENOTDIR) or a symlink now (ELOOP from the open, ENOTDIR
// from fstatat through the link's O_PATH descriptor), the file is requeued
// as NameUnlinked requeues it, so that the next pass forgets it if it is gone
// (or writes it back early if it was renamed and its new name was not
// seen). Any other error tells nothing: the file stays as it is. Each
// directory is opened once (inode.OpenPath, O_PATH, no symlink followed)
// and its files looked at by name in it. The list lock is held while the
// names are gathered, not during the system calls. It returns the number
// of files requeued.
func (wb *Writeback) CheckNames(root string) int {
	// By directory, each file's key and last component: no path is
	// built (a million tracked files cost 32 bytes each here).
	type named struct {
		key  inode.Key
		name string
	}
	root = strings.TrimSuffix(root, "/")
	byDir := map[string][]named{}
	wb.mu.Lock()
	for in := range wb.inodes.All {
		if name := in.Name(); name != "" && (root == "" || in.InDir(root)) {
			dir := in.Dir()
			byDir[dir] = append(byDir[dir], named{in.Key(), name})
		}
	}
	wb.mu.Unlock()
	n := 0
	for dir, files := range byDir {
		dfd, derr := inode.OpenPath(dir)
		for _, f := range files {
			gone := false
			switch {
			case derr == nil:
				var st unix.Stat_t
				err := unix.Fstatat(dfd, f.name, &st, unix.AT_SYMLINK_NOFOLLOW)
				gone = errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || (err == nil && (inode.Key{Dev: st.Dev, Ino: st.Ino}) != f.key)
			default:
				gone = errors.Is(derr, unix.ENOENT) || errors.Is(derr, unix.ENOTDIR) || errors.Is(derr, unix.ELOOP)
			}
			if gone && wb.NameUnlinked(f.key, filepath.Join(dir, f.name)) {
				n++
			}
		}
		if derr == nil {
			unix.Close(dfd)
		}
	}
	return n
}

// unlinked requeues the tracked inode key (requeue_io) for Unlinked and
// NameUnlinked when same says the deletion was of that inode.
func (wb *Writeback) unlinked(key inode.Key, same func(*inode.Inode) bool) bool {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	in := wb.inodes.Get(key)
	if in == nil || in.Has(inode.Sync) || in.Has(inode.Busy) || wb.failedLocked(in) || !same(in) {
		return false
	}
	wb.requeueIOLocked(in)
	in.State |= inode.Unlinked
	wb.gen++
	return true
}

// MarkInodeDirty is __mark_inode_dirty for a write seen on the file key at
// path: the first time an inode is dirtied it gets dirtiedWhen = now and
// goes onto b_dirty; an inode that is already dirty keeps its dirtiedWhen
// and its place; one under a writeback attempt is flagged redirtied and the
// attempt's requeue decides its list. path replaces the recorded path (a
// rename). h is the file's handle if the caller has it (fanotify); for a
// new inode without one, it is asked of the opener when that is an
// inode.HandleOpener. Safe for concurrent use.
func (wb *Writeback) MarkInodeDirty(key inode.Key, path string, h inode.Handle, t tree.Tree) {
	wb.mark(key, path, h, t, 0)
}

// MarkInodeClosed is MarkInodeDirty for the close of a descriptor the
// file was open for writing with (FAN_CLOSE_WRITE) when no write was
// reported with it: the file is tracked all the same (data written
// through a shared mmap makes no other report), but a file whose data was
// lost (on the failed list) keeps that loss until an attempt finds dirty
// data in it (inode.LostBefore): an application that closes the file after
// its writeback failed has written nothing new.
func (wb *Writeback) MarkInodeClosed(key inode.Key, path string, h inode.Handle, t tree.Tree) {
	wb.mark(key, path, h, t, markClosed)
}

// markHow qualifies a report: markClosed, markKeepName.
type markHow uint8

const (
	// markClosed: a close with no write (MarkInodeClosed), or a sync
	// request's file; it does not end a loss.
	markClosed markHow = 1 << iota
	// markKeepName: an inode tracked already keeps its name (Mark.KeepName).
	markKeepName
	// markLeaving: the file's tree was removed (Mark.Leaving).
	markLeaving
	// markSync: a sync request's file, tracked whatever the budget.
	markSync
	// markMade: a directory entry made for the file (Mark.Made).
	markMade
)

func (wb *Writeback) mark(key inode.Key, path string, h inode.Handle, t tree.Tree, how markHow) {
	now := wb.now()
	h = wb.lockWithHandle(key, path, h, how)
	wasIdle := wb.markInodeDirtyLocked(key, path, h, t, now, how)
	wb.mu.Unlock()
	if wasIdle {
		wb.live.kick()
	}
}

// Mark is one report of a batch (Registry.MarkInodesDirty): a write seen
// on the file Key at Path (MarkInodeDirty), or with Closed a close with no
// write (MarkInodeClosed); Handle is its file handle, "" if unknown. With
// KeepName, an inode that is tracked already keeps the name it has: the
// report of a scan, which read Path from its directory some time before,
// while events may have given the file a newer name meanwhile. Err is set
// by MarkInodesDirty when the report was not taken: the device could not
// be named (Registry.Device's error, a shortage among them). With
// Leaving, the report was made with a tree that a reload has removed since
// (no other tree holds the file): the file is tracked as RetireUnder
// leaves the removed tree's files, written back once more at the next
// pass and then forgotten. With Made, the report is of a directory entry
// made for the file (created, linked or moved in): a tracked inode of that
// number may be a file deleted unseen, so a report without a handle asks
// the opener for one (wantsHandleLocked), which tells them apart.
type Mark struct {
	Path     string
	Key      inode.Key
	Handle   inode.Handle
	Tree     tree.Tree // its tree: its Mode and Expire are what bdi reads
	Closed   bool
	KeepName bool
	Leaving  bool
	Made     bool
	Err      error
}

// how returns m's qualifiers.
func (m *Mark) how() markHow {
	var how markHow
	if m.Closed {
		how |= markClosed
	}
	if m.KeepName {
		how |= markKeepName
	}
	if m.Leaving {
		how |= markLeaving
	}
	if m.Made {
		how |= markMade
	}
	return how
}

// markBatchMax bounds the reports marked in one hold of the list lock
// (about 0.2 µs each): a burst of events does not hold the lock long
// enough to show in list_lock_max_us or stall the writeback loop.
const markBatchMax = 64

// markBatch is mark for the reports ms, all on this device, in their
// order: one clock read for the whole batch and one acquisition of the
// list lock per markBatchMax reports, which per event were three monotonic
// clock reads and a lock (about a fifth of the fanotify watcher's CPU
// under a steady stream of writes). A report without a handle that wants
// one (wantsHandleLocked) ends the lock hold and is marked alone (mark:
// lockWithHandle asks the opener for the handle without the lock).
func (wb *Writeback) markBatch(ms []Mark) {
	opens := wb.files.Handles != nil
	now := wb.now()
	wasIdle := false
	for i := 0; i < len(ms); {
		alone := false
		wb.mu.Lock()
		for end := min(i+markBatchMax, len(ms)); i < end; i++ {
			m := &ms[i]
			if alone = opens && wb.wantsHandleLocked(m.Key, m.Handle, m.how()); alone {
				break
			}
			if wb.markInodeDirtyLocked(m.Key, m.Path, m.Handle, m.Tree, now, m.how()) {
				wasIdle = true
			}
		}
		wb.mu.Unlock()
		if alone {
			m := &ms[i]
			wb.mark(m.Key, m.Path, m.Handle, m.Tree, m.how())
			i++
		}
	}
	if wasIdle {
		wb.live.kick()
	}
}

// lockWithHandle takes the list lock and returns h, or, for a report
// without h that wants one (wantsHandleLocked: how), the handle the opener
// gives for path
// (inode.HandleOpener; "" when it has none). The opener is asked with the
// lock released (HandleOf is a system call), so a tracked inode, the usual
// case, costs one lock acquisition.
//
// +checklocksacquire:wb.mu
func (wb *Writeback) lockWithHandle(key inode.Key, path string, h inode.Handle, how markHow) inode.Handle {
	wb.mu.Lock()
	if !wb.wantsHandleLocked(key, h, how) {
		return h
	}
	if wb.files.Handles == nil {
		return h
	}
	wb.mu.Unlock()
	h, _ = wb.files.Handles.HandleOf(path, key)
	wb.mu.Lock()
	return h
}

// wantsHandleLocked reports whether a report of key without a handle (h
// "") is to ask the opener for one: the inode is not tracked, or the
// report may be of a new file that took its number: a deletion was told
// since its last report (inode.Unlinked), or the report is of a directory
// entry made (markMade: the deletion may have gone unseen). Preconditions:
// wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) wantsHandleLocked(key inode.Key, h inode.Handle, how markHow) bool {
	if h != "" {
		return false
	}
	in := wb.inodes.Get(key)
	return in == nil || in.Has(inode.Unlinked) || how&markMade != 0
}

// markInodeDirtyLocked is MarkInodeDirty's work under the list lock, at
// now (daemon clock); how: with markClosed the report is not a write (a
// close with no write, MarkInodeClosed; a sync request), which does not
// end a loss; with markKeepName an inode tracked already keeps its name;
// with markLeaving it is written once more and forgotten (Mark.Leaving).
// It reports whether the device had nothing dirty before (the caller wakes
// its goroutine then). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) markInodeDirtyLocked(key inode.Key, path string, h inode.Handle, t tree.Tree, now time.Duration, how markHow) (wasIdle bool) {
	wb.trees.see(t.Root)
	in := wb.inodes.Get(key)
	if in == nil && how&markSync == 0 && (wb.over.on || wb.budget.full()) {
		// Not tracked: a whole-filesystem pass writes it (overBudget).
		return wb.untrackedLocked(key, path, t)
	}
	if in == nil {
		in = wb.newInodeLocked(key, path, h, t)
	} else if !wb.reportedAgainLocked(in, path, h, t, how) {
		// A new file took the number: the old inode was dropped.
		return wb.markInodeDirtyLocked(key, path, h, t, now, how)
	}
	switch {
	case in.Has(inode.Sync):
		in.State |= inode.Dirty | inode.Redirtied
	case in.Has(inode.Dirty):
		// Already dirty: dirtiedWhen is not changed.
	default:
		wasIdle = !wb.hasDirtyIOLocked()
		in.State |= inode.Dirty
		in.DirtiedWhen = now
		wb.bDirty.pushBack(in)
	}
	if how&markLeaving != 0 {
		// As RetireUnder leaves a removed tree's files: taken by the
		// next queue_io (the next pass, within
		// dirty_writeback_interval), written once more, forgotten.
		in.State |= inode.Leaving
		if !in.Has(inode.Sync) {
			wb.requeueIOLocked(in)
		}
	}
	if wb.touchLocked(in) {
		wasIdle = true // the goroutine schedules the background check
	}
	wb.gen++
	return wasIdle
}

// newInodeLocked tracks a new inode from tree t, not yet dirty.
// Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) newInodeLocked(key inode.Key, path string, h inode.Handle, t tree.Tree) *inode.Inode {
	class, exact := wb.bDirty.class(t.Expire)
	if !exact && !wb.classWarned {
		wb.classWarned = true
		wb.log.Warn("more than 255 distinct expire intervals hold files on this device (reloads); new files share the nearest one",
			zap.Stringer("expire", t.Expire), zap.Stringer("used", wb.bDirty.classes[class].expire))
	}
	in := inode.New(key)
	in.Class = class
	in.SetPath(path)
	in.SetHandle(h)
	if t.Integrity() {
		in.State |= inode.Integrity
	}
	wb.inodes.Set(in)
	wb.budget.n.Add(1)
	return in
}

// reportedAgainLocked updates a tracked inode reported again (with handle
// h, under path, from tree t): its handle and name, its loss, its tree's
// settings. It returns false when h shows a new file with the inode's
// number: the old inode is dropped as gone, and the caller tracks the new
// one afresh. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) reportedAgainLocked(in *inode.Inode, path string, h inode.Handle, t tree.Tree, how markHow) bool {
	closed := how&markClosed != 0
	if h != "" {
		// Reported with a handle: whether the same file or a new
		// one, a deletion told before is dealt with below.
		in.State &^= inode.Unlinked
	}
	switch old := in.Handle(); {
	case h == "" || h == old:
	case old == "":
		in.SetHandle(h)
	case h.SameLayout(old) && !in.Has(inode.Sync) && !in.Has(inode.Busy) && !wb.failedLocked(in):
		// The same (dev, ino) with another handle of the same
		// layout (its generation differs): the tracked inode was
		// deleted and a new file took its number (ext4 reuses
		// numbers at once). The kernel evicted the old inode (off
		// its lists: evict, inode_io_list_del) and dirties the new
		// one afresh: the old is forgotten as gone, and the new
		// file tracked from now, with its own tree's settings, not
		// at the deleted file's age or place (which a deletion may
		// have brought forward to the next pass: Unlinked). (A
		// handle of another type or length is not taken for a new
		// file: were two encodings of one inode to reach here, its
		// age would be reset by each, and its writeback put off.)
		lists.Remove(in)
		wb.dropInodeLocked(in)
		wb.acct.gone++
		return false
	default:
		// The same, while an attempt (or a call left to its
		// worker) holds the old inode, or its loss is kept to be
		// reported, or a handle of another layout: the inode is
		// the new file now, its place kept.
		in.SetHandle(h)
		in.SetPath(path)
		in.Errors, in.LastErr = 0, 0
	}
	if how&markKeepName == 0 && !in.HasPath(path) {
		in.SetOtherPath(in.Path())
		in.SetPath(path)
	}
	switch {
	case wb.failedLocked(in) && closed:
		// Closed, not written: tracked, but its loss stands until
		// an attempt finds data written since (LostBefore).
		lists.Remove(in)
		wb.acct.failed--
		in.Retries = 0
		in.State |= inode.LostBefore
	case wb.failedLocked(in):
		// Written again: its earlier loss is no longer the
		// state of its data. It is dirty like a new file.
		lists.Remove(in)
		wb.acct.failed--
		in.Errors, in.LastErr, in.Retries = 0, 0, 0
	case in.Has(inode.LostBefore) && !closed:
		// Written again after a close took it off the failed
		// list.
		in.State &^= inode.LostBefore
		in.Errors, in.LastErr = 0, 0
	}
	// Reported by the watcher: a tree holds it again (its tree
	// was added back by a reload before its leaving attempt), and
	// this write must not be forgotten with it.
	in.State &^= inode.Leaving
	wb.stricterTreeLocked(in, t)
	return true
}
