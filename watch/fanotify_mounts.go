package watch

import (
	"context"
	"errors"
	"flusherd/internal/logpath"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/tree"
)

// otherMount returns errSecondMount when another tree served here is on
// root's filesystem but reached through another mount of it (a bind
// mount): fanotify names an event's file through one mount, where the
// other tree's files have other paths, outside it. The trees are looked
// up by st_dev and mount ID (rootMounts), and a tree found is looked at
// again (its root may have changed since it was listed).
func (fa *Fanotify) otherMount(root string) error {
	dev, mid, ok := rootMountOf(root)
	if !ok {
		return nil // (the mark says why)
	}
	for _, r := range fa.rootMounts.others(dev, mid, root) {
		if odev, m, ok := rootMountOf(r); ok && odev == dev && m != mid {
			return fmt.Errorf("%w: %s and the tree %s are on one filesystem (device %d:%d) through two mounts", errSecondMount,
				strconv.Quote(root), strconv.Quote(r), unix.Major(dev), unix.Minor(dev))
		}
	}
	return nil
}

// rootMountOf is mountOf, with ok false if it fails.
func rootMountOf(root string) (dev uint64, mountID int, ok bool) {
	dev, mountID, err := mountOf(root)
	return dev, mountID, err == nil
}

// rootMounts lists the trees' roots by where each was found when listed:
// st_dev and mount ID.
type rootMounts struct {
	mu sync.Mutex
	// byDev holds the roots by st_dev, then mount ID.
	// +checklocks:mu
	byDev map[uint64]map[int]map[string]struct{}
	// at says where each root is listed.
	// +checklocks:mu
	at map[string]rootMount
}

// rootMount is a root's st_dev and mount ID.
type rootMount struct {
	dev     uint64
	mountID int
}

// others returns, sorted, the roots other than root listed on st_dev dev
// through a mount other than mountID.
func (rm *rootMounts) others(dev uint64, mountID int, root string) []string {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	var out []string
	for m, roots := range rm.byDev[dev] {
		if m == mountID {
			continue
		}
		for r := range roots {
			if r != root {
				out = append(out, r)
			}
		}
	}
	slices.Sort(out)
	return out
}

// note lists root under its st_dev and mount ID (nothing if either cannot
// be read: otherMount skips such a root too).
func (rm *rootMounts) note(root string) {
	dev, mid, ok := rootMountOf(root)
	if !ok {
		return
	}
	rm.mu.Lock()
	defer rm.mu.Unlock()
	rm.forgetLocked(root)
	if rm.byDev == nil {
		rm.byDev, rm.at = map[uint64]map[int]map[string]struct{}{}, map[string]rootMount{}
	}
	byMount := rm.byDev[dev]
	if byMount == nil {
		byMount = map[int]map[string]struct{}{}
		rm.byDev[dev] = byMount
	}
	if byMount[mid] == nil {
		byMount[mid] = map[string]struct{}{}
	}
	byMount[mid][root] = struct{}{}
	rm.at[root] = rootMount{dev, mid}
}

// forget takes root out of the list.
func (rm *rootMounts) forget(root string) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	rm.forgetLocked(root)
}

// forgetLocked is forget.
//
// +checklocks:rm.mu
func (rm *rootMounts) forgetLocked(root string) {
	at, ok := rm.at[root]
	if !ok {
		return
	}
	delete(rm.at, root)
	byMount := rm.byDev[at.dev]
	delete(byMount[at.mountID], root)
	if len(byMount[at.mountID]) == 0 {
		delete(byMount, at.mountID)
	}
	if len(byMount) == 0 {
		delete(rm.byDev, at.dev)
	}
}

// mountOf returns the st_dev of the directory dir and the ID of the mount
// it is reached through (name_to_handle_at(2)), looked at through
// inode.OpenPath: no symlink followed.
func mountOf(dir string) (dev uint64, mountID int, err error) {
	fd, err := inode.OpenPath(dir)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, err
	}
	_, mountID, err = unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	return st.Dev, mountID, err
}

// errSecondMount is nestedMount's error for a mount of a filesystem that
// fanotify reaches through another mount already.
var errSecondMount = errors.New("fanotify names this mount's files through another mount of its filesystem")

// nestedMount serves a filesystem mounted inside tree t: it is marked
// (mark: a filesystem mark, or a mount mark where that is refused) and
// registered for opens by handle, then scanned. It reports false, having
// logged why, when the filesystem can be neither marked nor opened by
// handle (a FUSE server without handles, for one): its writes are then
// not seen, and the log says to watch it as a tree of its own with the
// inotify backend.
func (fa *Fanotify) nestedMount(ctx context.Context, t tree.Tree, mountpoint string) bool {
	var err error
	if st, serr := inode.StatPath(mountpoint); serr == nil && fa.handles.Has(st.Dev) {
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
			logpath.String("mountpoint", mountpoint), logpath.String("tree", t.Root), zap.Error(err))
		return fa.nestedFallback(ctx, t, mountpoint)
	}
	if err != nil {
		fa.log.Warn("a filesystem mounted inside a tree cannot be marked by fanotify; its writes are not seen (watch it as a tree of its own, with backend = \"inotify\")",
			logpath.String("mountpoint", mountpoint), logpath.String("tree", t.Root), zap.Error(err))
		return false
	}
	fa.clearCaches()
	fa.scanDir(ctx, t, mountpoint, true, nil)
	return true
}
