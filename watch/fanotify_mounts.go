package watch

import (
	"context"
	"errors"
	"flusherd/internal/logpath"
	"fmt"
	"strconv"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/tree"
)

// otherMount returns errSecondMount when another tree served here is on
// root's filesystem but reached through another mount of it (a bind
// mount): fanotify names an event's file through one mount, where the
// other tree's files have other paths, outside it.
func (fa *Fanotify) otherMount(root string) error {
	dev, mid, err := mountOf(root)
	if err != nil {
		return nil // (the mark says why)
	}
	for _, t := range fa.list() {
		if t.Root == root {
			continue
		}
		if odev, m, err := mountOf(t.Root); err == nil && odev == dev && m != mid {
			return fmt.Errorf("%w: %s and the tree %s are on one filesystem (device %d:%d) through two mounts", errSecondMount,
				strconv.Quote(root), strconv.Quote(t.Root), unix.Major(dev), unix.Minor(dev))
		}
	}
	return nil
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
