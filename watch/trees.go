package watch

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/tree"
)

// treeUses lists the trees, served by kind.
func (b *base) treeUses(kind string) []TreeUse {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]TreeUse, 0, len(b.trees))
	for _, t := range b.trees {
		out = append(out, TreeUse{Root: t.Root, Backend: kind, Served: !t.gone, Tree: t.Tree})
	}
	return out
}

// OnDevice implements Backend.
func (b *base) OnDevice(dev uint64) bool {
	b.mu.Lock()
	on := slices.ContainsFunc(b.trees, func(t *watchedTree) bool { return !t.gone && t.rootKey().Dev == dev })
	b.mu.Unlock()
	if on {
		return true
	}
	b.mountsMu.Lock()
	defer b.mountsMu.Unlock()
	for _, nm := range b.mountsMet {
		if nm != nil && nm.dev == dev {
			return true
		}
	}
	return false
}

// list returns the current trees; the slice must not be changed. Its
// capacity is its length: an append to it copies it.
func (b *base) list() []*watchedTree {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clip(b.trees)
}

// served reports whether t is in the list and its root is not gone.
func (b *base) served(t *watchedTree) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !t.gone && b.idx.at(t.Root) == t
}

// Served implements Backend.
func (b *base) Served(root string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.idx.at(root)
	return t != nil && !t.gone
}

// addTree appends t after recording its root's identity.
func (b *base) addTree(t tree.Tree) (*watchedTree, error) { return b.addTreeIn(t, "") }

// addTreeIn is addTree for a tree that is a mount inside the tree rooted
// at nestedIn ("" for a configured tree).
func (b *base) addTreeIn(t tree.Tree, nestedIn string) (*watchedTree, error) {
	nt := &watchedTree{Tree: t, nestedIn: nestedIn}
	if err := nt.record(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.goneDevs, nt.rootKey().Dev) // mounted in a tree again
	delete(b.removedRoots, t.Root)
	if b.idx.at(t.Root) != nil {
		return nil, fmt.Errorf("%s is already watched", strconv.Quote(t.Root))
	}
	b.listTreeLocked(nt)
	return nt, nil
}

// removeTree takes the tree rooted at root out of the list; it returns it
// and whether another served tree is on the same filesystem.
func (b *base) removeTree(root string) (*watchedTree, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(b.trees, func(t *watchedTree) bool { return t.Root == root })
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
	b.idx.remove(t)
	shared := false
	for _, o := range b.trees {
		shared = shared || (!o.gone && o.rootKey().Dev == t.rootKey().Dev)
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
func (b *base) retargetLocked(root, path string, dev uint64) (t *watchedTree, leaving, ok bool) {
	if b.goneDevs[dev] {
		return nil, false, false
	}
	if t := b.idx.at(root); t != nil && !t.gone {
		return t, false, true
	}
	if t := b.treeAtLocked(path); t != nil {
		return t, false, true
	}
	removed := b.removedRoots[root]
	return nil, removed, removed
}

// TreeOf returns the deepest served tree whose root contains path.
func (b *base) TreeOf(path string) (tree.Tree, bool) {
	if t := b.treeAt(path); t != nil {
		return t.Tree, true
	}
	return tree.Tree{}, false
}

func (b *base) treeAt(path string) *watchedTree {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.treeAtLocked(path)
}

// treeAtLocked is treeAt. Preconditions: b.mu held.
func (b *base) treeAtLocked(path string) *watchedTree {
	return b.idx.deepest(path, func(t *watchedTree, self bool) bool {
		return !t.gone && (self || t.Recursive || filepath.Dir(path) == t.Root)
	})
}

// rootOf reports whether dir is the root of a tree other than t, and
// whether that tree is recursive. A recursive one holds everything below
// its root, which its own walk and watches cover; a non-recursive one
// holds only the files directly in its root, and the directories below
// belong to t still (the deepest tree that holds a path is its tree).
func (b *base) rootOf(dir string, t tree.Tree) (root, recursive bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if o := b.idx.at(dir); o != nil && o.Root != t.Root {
		return true, o.Recursive
	}
	return false, false
}

// record notes the root's identity, for checkRoots.
func (t *watchedTree) record() error {
	st, h, err := inode.StatPathHandle(t.Root)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("watch root %s: not a directory", strconv.Quote(t.Root))
	}
	t.rootID.Store(&rootIdentity{key: inode.Key{Dev: st.Dev, Ino: st.Ino}, handle: h})
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
// longer served; the sink drops its inodes. Called after the mount table
// changed, and after a directory removal or rename that could not be
// placed.
func (b *base) checkRoots() { b.checkRootsUnder("") }

// checkRootsUnder is checkRoots for the roots at dir or below it ("": all):
// called after dir was removed or renamed. A dir that holds no root
// (treeIndex.holdsRoot) costs O(depth).
func (b *base) checkRootsUnder(dir string) {
	b.mu.Lock()
	trees, holds := b.trees, dir == "" || b.idx.holdsRoot(dir)
	b.mu.Unlock()
	if !holds {
		return
	}
	for _, t := range trees {
		if dir != "" && dir != "/" && t.Root != dir && !strings.HasPrefix(t.Root, dir+"/") {
			continue
		}
		b.mu.Lock()
		gone := t.gone
		b.mu.Unlock()
		if gone {
			continue
		}
		st, h, err := inode.StatPathHandle(t.Root)
		if err == nil && t.isRoot(st, h) {
			b.mu.Lock()
			t.failing = false
			b.mu.Unlock()
			continue
		}
		if err != nil && !rootGone(err) {
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
					logpath.String("root", t.Root), zap.Error(err))
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
			if o != t && !o.gone && o.rootKey().Dev == t.rootKey().Dev {
				last = false
			}
		}
		b.mu.Unlock()
		how := "removed, renamed or unmounted"
		if err == nil && st.Dev != t.rootKey().Dev {
			how = "unmounted, or another filesystem mounted over it"
		} else if err == nil {
			how = "replaced by another directory"
		}
		b.log.Error("a watched tree's root is gone; its files are no longer tracked (once it is back, a reload (SIGHUP, systemctl reload flusherd) serves it again)",
			logpath.String("root", t.Root), zap.String("how", how))
		b.fence()
		b.sink.TreeGone(t.Root, t.rootKey().Dev, last, false)
		b.touched() // watch/stats marks it gone
	}
}

// rootGone reports whether err, of inode.StatPath of a root, says the root
// is gone: removed, or a directory on its path replaced by a file or a
// symlink (ELOOP: a path through a symlink does not lead to the tree).
func rootGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// rootMoved reports whether the served tree rooted at root no longer has
// its root at that path (inode.StatPath finds another inode, or none): its root,
// or a directory above it, was renamed, removed or mounted over. inotify
// tells nothing of the directories above a root, and its watches go on
// reporting the moved tree's writes under the old path, where another
// file may now be.
func (b *base) rootMoved(root string) bool {
	t := b.treeAt(root)
	if t == nil || t.Root != root {
		return false
	}
	st, h, err := inode.StatPathHandle(root)
	if err != nil && !rootGone(err) {
		return false // unreachable, not moved (checkRoots says which)
	}
	return err != nil || !t.isRoot(st, h)
}
