package watch

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/policy"
	"flusherd/tree"
)

// scanDir walks dir (the whole subtree when the tree is recursive),
// calling onDir with each subdirectory's path and open descriptor before
// its entries are read (inotify adds its watch there, on that
// descriptor), then reports its regular files. With onlyDirty,
// only files cachestat shows dirty are reported (start-up, overflow);
// otherwise every file is (a directory that just appeared: its files may
// have been written before the watch existed).
//
// The walk never leaves the tree, even while the tree changes under it
// (a directory swapped with a symlink by renameat2(RENAME_EXCHANGE)):
// dir itself is opened with inode.OpenPath (no symlink in any component),
// and every directory below it relative to its parent's descriptor with
// O_DIRECTORY|O_NOFOLLOW, entries read with getdents64 and classified with
// fstatat(AT_SYMLINK_NOFOLLOW) relative to that descriptor: a symlink is
// never followed, opened or listed. What could not be read for want of a
// resource (EMFILE, ENFILE, ENOMEM, EAGAIN, EINTR) makes the scan
// incomplete, and a rescan is scheduled with backoff (scanIncomplete).
func (b *base) scanDir(ctx context.Context, t tree.Tree, dir string, onlyDirty bool, onDir func(path string, fd int)) {
	b.scanDirFiles(ctx, t, dir, onlyDirty, onDir, b.scanned)
}

// scanDirFiles is scanDir that calls onFile, if set, in place of
// b.scanned: with each regular file it leaves tracked under its name
// (reported, or found tracked already), and the file's key, on the
// calling goroutine.
func (b *base) scanDirFiles(ctx context.Context, t tree.Tree, dir string, onlyDirty bool, onDir func(path string, fd int), onFile func(path string, key inode.Key)) {
	pfd, err := inode.OpenPath(dir)
	if err == nil {
		var fd int
		fd, err = unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(pfd)
		if err == nil && noWritebackFd(fd) {
			// Nothing there is ever written back: no file is opened
			// or tracked (the filesystems mounted below, if any, are
			// found by checkMounts).
			unix.Close(fd)
			return
		}
		if err == nil {
			var ids dirIdentity
			if onlyDirty {
				ids.mounts, ids.mountsKnown = mountPointsUnder(dir)
			}
			b.walk(ctx, t, dir, fd, onlyDirty, onDir, onFile, &ids)
			if ids.mountsKnown && ctx.Err() == nil {
				b.lookAtNewMounts(t, dir, ids.mounts)
			}
			return
		}
	}
	b.dirError(dir, err)
}

// mountPointsUnder returns the mount points strictly below dir, from
// /proc/self/mountinfo; ok is false when the table cannot be read.
func mountPointsUnder(dir string) (mps map[string]bool, ok bool) {
	infos, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return !(dir == "/" && m.Mountpoint != "/" || strings.HasPrefix(m.Mountpoint, dir+"/")), false
	})
	if err != nil {
		return nil, false
	}
	mps = make(map[string]bool, len(infos))
	for _, m := range infos {
		mps[m.Mountpoint] = true
	}
	return mps, true
}

// lookAtNewMounts looks, after a walk of dir in tree t that knew the mount
// points in before, at the regular files mounted below dir since (a bind
// mount of a file made while the walk ran): the walk may have known such
// an entry by the number of the file it hides. Each is looked at with
// fstatat from its parent opened without following symlinks, and reported
// as the walk would have.
func (b *base) lookAtNewMounts(t tree.Tree, dir string, before map[string]bool) {
	after, ok := mountPointsUnder(dir)
	if !ok {
		return
	}
	for p := range after {
		if before[p] || len(p) >= unix.PathMax || !t.Recursive && filepath.Dir(p) != dir {
			continue
		}
		pfd, err := inode.OpenPath(filepath.Dir(p))
		if err != nil {
			continue // gone, or reached through a symlink: not in the tree
		}
		var st unix.Stat_t
		err = unix.Fstatat(pfd, filepath.Base(p), &st, unix.AT_SYMLINK_NOFOLLOW)
		unix.Close(pfd)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			b.report(t, p, inode.Key{Dev: st.Dev, Ino: st.Ino}, true)
		}
	}
}

// dirError handles a directory that could not be opened or read: gone is
// nothing to say, a resource shortage schedules a rescan, anything else is
// logged.
func (b *base) dirError(dir string, err error) {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		// Gone, or replaced by a file or a symlink: nothing to scan.
	case errors.Is(err, unix.ENAMETOOLONG):
		b.longPath(dir)
	case policy.Shortage(err):
		b.scanIncomplete(err)
	default:
		b.log.Warn("cannot read directory", logpath.String("path", dir), zap.Error(err))
	}
}

// walk scans the directory open as fd (which it closes), whose path is
// dir, and (in a recursive tree) the directories below it, depth first.
// The walk is iterative: a frame per directory level holds the names of
// the subdirectories left to visit and, for the first heldLevels levels
// and every heldLevels-th after, the level's descriptor. A subdirectory is
// opened relative to its parent's descriptor, or, where the parent's was
// let go, by walking the names down from the deepest descriptor held, one
// openat(O_NOFOLLOW) per level: never by a path that could meet a
// swapped-in symlink, and with at most about heldLevels+32 descriptors
// held however deep the tree (a hard RLIMIT_NOFILE of 1,024 still lets a
// scan finish). One getdents buffer serves every level. A directory whose
// path would reach PATH_MAX is neither entered nor reported (logged once,
// longPath): its files could not be opened by path, inotify cannot watch
// it, and fanotify cannot name its tree; that bounds the depth at about
// 2,048 levels.
func (b *base) walk(ctx context.Context, t tree.Tree, dir string, fd int, onlyDirty bool, onDir func(string, int), onFile func(string, inode.Key), ids *dirIdentity) {
	buf := make([]byte, 32<<10)
	stack := walkStack{{fd: fd, path: dir}}
	defer func() { stack.closeAll() }()
	stack[0].subdirs = b.readDir(ctx, t, dir, fd, buf, onlyDirty, onFile, ids)
	for len(stack) > 0 {
		if ctx.Err() != nil {
			return
		}
		top := &stack[len(stack)-1]
		if len(top.subdirs) == 0 {
			if top.fd >= 0 {
				unix.Close(top.fd)
			}
			stack = stack[:len(stack)-1]
			continue
		}
		name := top.subdirs[len(top.subdirs)-1]
		top.subdirs = top.subdirs[:len(top.subdirs)-1]
		path := joinPath(top.path, name)
		pfd, temp, err := stack.parentFD()
		if err != nil {
			// The parent went away (or was replaced) since it was read.
			b.dirError(top.path, err)
			top.subdirs = nil
			continue
		}
		cfd, err := unix.Openat(pfd, name, walkFlags, 0)
		if temp {
			unix.Close(pfd)
		}
		if err != nil {
			b.dirError(path, err)
			continue
		}
		if ids.mounts[path] && noWritebackFd(cfd) {
			// A mount point of a filesystem that never writes back
			// (proc, sysfs, tmpfs...): not walked, not watched.
			unix.Close(cfd)
			continue
		}
		if onDir != nil {
			onDir(path, cfd)
		}
		subdirs := b.readDir(ctx, t, path, cfd, buf, onlyDirty, onFile, ids)
		if len(subdirs) == 0 {
			unix.Close(cfd) // a leaf: nothing below to open
			continue
		}
		if depth := len(stack); depth >= heldLevels && depth%heldLevels != 0 {
			unix.Close(cfd)
			cfd = -1
		}
		stack = append(stack, walkFrame{fd: cfd, name: name, path: path, subdirs: subdirs})
	}
}

// walkFlags open a directory of a walk, relative to its parent.
const walkFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// walkFrame is one directory level of a walk.
type walkFrame struct {
	fd      int // -1: let go (reopened from an ancestor when needed)
	name    string
	path    string
	subdirs []string // names of subdirectories not yet visited
}

// walkStack is a walk's directory levels, outermost first.
type walkStack []walkFrame

// parentFD returns a descriptor of the top frame's directory: its own,
// or one reached from the deepest held ancestor by name; temp says the
// caller closes it.
func (stack walkStack) parentFD() (fd int, temp bool, err error) {
	top := len(stack) - 1
	if stack[top].fd >= 0 {
		return stack[top].fd, false, nil
	}
	a := top - 1
	for stack[a].fd < 0 {
		a--
	}
	fd = stack[a].fd
	for j := a + 1; j <= top; j++ {
		next, err := unix.Openat(fd, stack[j].name, walkFlags, 0)
		if j > a+1 {
			unix.Close(fd)
		}
		if err != nil {
			return -1, false, err
		}
		fd = next
	}
	return fd, true, nil
}

// closeAll closes the descriptors the levels hold.
func (stack walkStack) closeAll() {
	for _, f := range stack {
		if f.fd >= 0 {
			unix.Close(f.fd)
		}
	}
}

// heldLevels is how many directory levels of a walk keep their descriptor
// (and, below them, one level in heldLevels does).
const heldLevels = 64

// readDir reads the entries of the directory open as fd (path dir) with
// getdents64 into buf, reports its regular files and returns the names of
// the subdirectories to walk: none when the tree is not recursive, and
// never another recursive tree's root (scanned with its own settings); a
// non-recursive tree's root is walked for its subdirectories, which are
// t's, and its own files are left to that tree. Symlinks, FIFOs, sockets
// and device nodes are never opened.
//
// In a scan for dirty files (onlyDirty), a regular file's entry on a
// filesystem whose entries carry the file's own inode number (dirIdentity)
// is first looked up by that number: a file tracked already under its name
// costs no fstatat. An overflow rescan of a tree whose files are all
// tracked thus reads directories only.
func (b *base) readDir(ctx context.Context, t tree.Tree, dir string, fd int, buf []byte, onlyDirty bool, onFile func(string, inode.Key), ids *dirIdentity) (subdirs []string) {
	b.dirsScanned.Add(1)
	looked := false // ids describes fd's filesystem
	// The root of a non-recursive tree nested in t: its files are that
	// tree's (its own scan reports them), its subdirectories t's.
	othersFiles, _ := b.rootOf(dir, t)
	for {
		if ctx.Err() != nil {
			return subdirs
		}
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			b.dirError(dir, err)
			return subdirs
		}
		if n <= 0 {
			return subdirs
		}
		for off := 0; off < n; {
			reclen := int(buf[off+16]) | int(buf[off+17])<<8
			typ := buf[off+18]
			ino := binary.NativeEndian.Uint64(buf[off:])
			name := direntName(buf[off+19 : off+reclen])
			off += reclen
			if name == "." || name == ".." || name == "" {
				continue
			}
			path := joinPath(dir, name)
			if len(path) >= unix.PathMax {
				b.longPath(path)
				continue
			}
			if typ == unix.DT_REG && othersFiles {
				continue
			}
			if typ == unix.DT_REG && onlyDirty {
				if !looked {
					looked = true
					ids.look(fd)
				}
				if key := (inode.Key{Dev: ids.dev, Ino: ino}); ids.direct && !ids.mounts[path] && b.sink.Tracks(key, path) {
					if onFile != nil {
						onFile(path, key)
					}
					continue
				}
			}
			if typ == unix.DT_REG || typ == unix.DT_UNKNOWN {
				b.entriesStatted.Add(1)
				var st unix.Stat_t
				if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					if policy.Shortage(err) {
						b.scanIncomplete(err)
					}
					continue
				}
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFREG:
					if !othersFiles {
						key := inode.Key{Dev: st.Dev, Ino: st.Ino}
						if b.report(t, path, key, onlyDirty) && onFile != nil {
							onFile(path, key)
						}
					}
					continue
				case unix.S_IFDIR:
					typ = unix.DT_DIR
				}
			}
			if typ == unix.DT_DIR && t.Recursive {
				if root, recursive := b.rootOf(path, t); !root || !recursive {
					subdirs = append(subdirs, name)
				}
			}
		}
	}
}

// dirIdentity is what a walk knows of the filesystem of the directory it
// reads: its st_dev, and whether a directory entry's d_ino there is the
// st_ino of the regular file it names (direct). That holds on the local
// filesystems in inoDirect, which store the inode number in the entry. It
// is not assumed elsewhere: a FUSE server chooses its d_ino (libfuse
// sends an unknown number by default), overlayfs may report a merged
// directory's entries with the lower layer's, and network filesystems are
// the server's word. On every filesystem, an entry that a file is mounted
// over (a bind mount of a file) carries the number of the file it hides:
// the mount points below the walked directory (mounts, from the mount
// table before the walk; mountsKnown when it could be read) are looked at
// with fstatat, and so is every entry when the table could not be read.
// A file mounted while the walk runs is looked at after it
// (lookAtNewMounts).
type dirIdentity struct {
	dev         uint64
	direct      bool
	mounts      map[string]bool
	mountsKnown bool
	// The filesystem last looked at by statfs(2), which is asked again
	// only when a directory's st_dev changes (a mount point).
	fsDev    uint64
	fsDirect bool
	fsKnown  bool
}

// inoDirect holds the statfs(2) f_type of the filesystems whose directory
// entries give a regular file's inode number as d_ino (getdents64(2)).
var inoDirect = map[int64]bool{
	unix.EXT4_SUPER_MAGIC: true, unix.XFS_SUPER_MAGIC: true, unix.BTRFS_SUPER_MAGIC: true,
	unix.F2FS_SUPER_MAGIC: true, unix.TMPFS_MAGIC: true,
}

// look sets ids for the directory open as fd: fstat(2), and statfs(2)
// when its st_dev is not the last one's. What cannot be told is not
// direct: every entry is then looked at with fstatat.
func (ids *dirIdentity) look(fd int) {
	ids.direct = false
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return
	}
	ids.dev = st.Dev
	if !ids.fsKnown || ids.fsDev != st.Dev {
		var fs unix.Statfs_t
		if unix.Fstatfs(fd, &fs) != nil {
			return
		}
		ids.fsDev, ids.fsDirect, ids.fsKnown = st.Dev, inoDirect[int64(fs.Type)], true
	}
	ids.direct = ids.fsDirect && ids.mountsKnown
}

// joinPath is dir + "/" + name, for a dir that may be "/".
func joinPath(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

// longPath logs, once per backend, that an entry whose path reaches
// PATH_MAX (4,096 bytes) is left out of the scan.
func (b *base) longPath(path string) {
	if !b.longPathWarned.Swap(true) {
		b.log.Warn("a path in a tree is longer than PATH_MAX; such directories are not scanned or watched, and their files are not tracked (logged once)",
			zap.Int("bytes", len(path)), logpath.String("start", path[:min(len(path), 200)]))
	}
}

// namesFile reports whether path leads to the regular file key now
// (fstatat, no symlink followed in any component); an error says no.
func namesFile(path string, key inode.Key) bool {
	k, regular, err := inode.Stat(path)
	return err == nil && regular && k == key
}

// direntName returns the NUL-terminated name at the start of b.
func direntName(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// report hands the regular file key at path to the sink; with onlyDirty
// (a scan) only if it is not tracked yet and cachestat shows dirty or
// writeback pages. A file whose state
// cannot be told (it cannot be opened or cachestat fails, other than
// because it is gone) is reported as dirty: unknown means tracked, and the
// writeback attempt finds out. Once t is no longer served (removed by a
// reload, or its root gone), the file is reported with the tree that
// holds it now, if any, else as leaving (t removed) or not at all (see
// fence and retargetLocked). It reports whether the file is tracked under
// path: found so, or reported and taken in a tree served.
func (b *base) report(t tree.Tree, path string, key inode.Key, onlyDirty bool) (tracked bool) {
	return b.reportAs(t, path, key, onlyDirty, false)
}

// reportAs is report; made says the report is of a directory entry made
// for the file (bdi.Mark.Made).
func (b *base) reportAs(t tree.Tree, path string, key inode.Key, onlyDirty, made bool) (tracked bool) {
	if b.noWritebackDev(key.Dev, path) {
		return false // (proc, sysfs, tmpfs...: nothing to write, ever)
	}
	if onlyDirty && b.sink.Tracks(key, path) {
		// Tracked already: a rescan after lost events has nothing to
		// add, and opens only the files it does not know.
		return true
	}
	if onlyDirty && b.sink.TracksKey(key) {
		// Tracked under another name: moved or linked here (a directory
		// renamed into an integrity tree), its attempt perhaps in
		// flight in another tree's mode. Reported without a look at its
		// pages, so that this tree's settings reach it even if it is
		// clean now, but only if the name is still its own: a scan
		// reads a directory's entries before it reports them, and one
		// that runs beside the event reader (an overflow's rescan)
		// may hold a name the file has been renamed from since, whose
		// report would put back a name the reader has replaced.
		if !namesFile(path, key) {
			return false
		}
		onlyDirty = false
	}
	if onlyDirty {
		f, err := b.open.Open(path, key)
		if err == nil {
			dirty, wb, cerr := f.Cachestat(0, 0)
			f.Close()
			if cerr == nil && dirty+wb == 0 {
				return false
			}
		} else if policy.ClassifyErr(err) == policy.Gone || errors.Is(err, inode.ErrNotRegular) {
			return false
		} else if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			// Not unknown: the daemon may not open it, now or at any
			// attempt, so tracking it could not help (and a shutdown
			// would wait for it). Said once.
			if !b.permWarned.Swap(true) {
				b.log.Warn("some files cannot be opened by the daemon (permission denied) and are not served; the shipped unit keeps CAP_DAC_READ_SEARCH and CAP_FOWNER for them",
					logpath.String("path", path), zap.Error(err))
			}
			return false
		}
	}
	b.reportMu.RLock()
	b.mu.Lock()
	holder, leaving, served := b.retargetLocked(t.Root, path, key.Dev)
	b.mu.Unlock()
	settings := t
	if holder != nil {
		settings = holder.Tree
	}
	var err error
	switch {
	case !served:
	case onlyDirty || leaving || made:
		// A scan's look at a file not tracked when it looked: were it
		// tracked since (an event, under a name newer than the one this
		// scan read from its directory), it keeps its name. A report
		// made with a tree a reload removed: written once more.
		ms := [1]bdi.Mark{{Path: path, Key: key, Tree: settings, KeepName: onlyDirty, Leaving: leaving, Made: made}}
		b.sink.MarkInodesDirty(ms[:])
		err = ms[0].Err
	default:
		err = b.sink.MarkInodeDirty(path, key, "", settings)
	}
	b.reportMu.RUnlock()
	if !served {
		return false // its root or filesystem is gone, and no other tree holds it (fence)
	}
	if err != nil {
		if policy.Shortage(err) {
			b.scanIncomplete(err)
			return false
		}
		b.log.Warn("cannot track file", logpath.String("path", path), zap.Error(err))
		return false
	}
	return true
}

// reportPath is report for a path an event named: inode.Stat classifies it
// without following a symlink in any component (only a regular file is
// reported; the writeback attempt opens it with inode.OpenPath, which
// refuses symlinks in any component too). It returns the file's key and
// whether it was a regular file, reported.
func (b *base) reportPath(t tree.Tree, path string, onlyDirty bool) (inode.Key, bool) {
	key, regular, err := inode.Stat(path)
	if err != nil {
		if policy.Shortage(err) {
			b.scanIncomplete(err)
		}
		return inode.Key{}, false
	}
	if regular {
		b.report(t, path, key, onlyDirty)
	}
	return key, regular
}

// noWritebackFd reports whether the directory open as fd is on a
// filesystem that never writes data back (noWriteback), from fstatfs(2);
// false when that fails.
func noWritebackFd(fd int) bool {
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) != nil {
		return false
	}
	_, no := noWriteback[int64(sfs.Type)]
	return no
}

// noWritebackDev reports whether dev, the filesystem of the regular file
// at path, never writes data back (noWriteback: proc, sysfs, tmpfs...),
// from fstatfs(2) of path's directory (opened with inode.OpenPath: no
// symlink followed). A file there is never tracked: its
// "dirty" pages have no backing store (or it is no file at all, as
// /proc/<pid>/mem), so it would never be found clean. When the directory
// is not on dev (path is a file mounted on another filesystem's name) or
// cannot be looked at, the answer is false: unknown means tracked. Only
// that answer is kept, by dev (the common case costs one map look-up): a
// pseudo filesystem's anonymous device number may be handed to a FUSE or
// NFS mount after it is unmounted, and a kept "no writeback" would then
// leave that mount's files untracked.
func (b *base) noWritebackDev(dev uint64, path string) bool {
	if _, ok := b.devWritesBack.Load(dev); ok {
		return false
	}
	fd, err := inode.OpenPath(filepath.Dir(path))
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Dev != dev {
		return false
	}
	if noWritebackFd(fd) {
		return true
	}
	b.devWritesBack.Store(dev, true)
	return false
}
