package watch

import (
	"encoding/binary"
	"errors"
	"flusherd/internal/logpath"
	"fmt"
	"io/fs"

	"github.com/moby/sys/mountinfo"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
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

// opensMask is what marks ask for besides, when opens are counted
// (Options.Opens): with FAN_CLOSE_WRITE, every open and close.
const opensMask = unix.FAN_OPEN | unix.FAN_CLOSE_NOWRITE

// masks returns the filesystem and mount marks' masks.
func (fa *Fanotify) masks() (fsMask, mntMask uint64) {
	if fa.opens {
		return fanotifyMask | opensMask, mountMask | opensMask
	}
	return fanotifyMask, mountMask
}

// mark marks root's filesystem once (again if force: a filesystem
// unmounted and mounted again has a new superblock with the same fsid, and
// its old mark died with the old one; adding a mark that exists only adds
// its mask again), and registers it for opens by handle.
//
// A filesystem that never writes back (noWriteback: tmpfs, proc...) is not
// marked: nothing there is to be tracked, and no event of it is wanted.
// root is opened with inode.OpenPath (O_PATH, no symlink followed; no
// opendir, which FUSE would serve), and the mark is made on "." relative to
// that descriptor (fanotify_mark refuses an O_PATH descriptor itself).
func (fa *Fanotify) mark(fd int, root string, force bool) error {
	rfd, err := inode.OpenPath(root)
	if err != nil {
		return &fs.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rfd)
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(rfd, &sfs); err != nil {
		return &fs.PathError{Op: "fstatfs", Path: root, Err: err}
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
	fsMask, mntMask := fa.masks()
	const here = unix.FAN_MARK_ADD | unix.FAN_MARK_DONT_FOLLOW | unix.FAN_MARK_ONLYDIR
	err = unix.FanotifyMark(fd, here|unix.FAN_MARK_FILESYSTEM, fsMask, rfd, ".")
	if err != nil {
		ferr := err
		if err = unix.FanotifyMark(fd, here|unix.FAN_MARK_MOUNT, mntMask, rfd, "."); err != nil {
			return fmt.Errorf("fanotify_mark %s: filesystem mark: %v; mount mark: %w", root, ferr, err)
		}
		fa.fsidsMu.Lock()
		fa.mounts[dev] = true
		fa.fsidsMu.Unlock()
		fa.log.Warn("fanotify: filesystem mark refused; using a mount mark, which reports writes but not renames or deletions",
			logpath.String("root", root), zap.NamedError("filesystem_mark", ferr))
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
