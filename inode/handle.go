package inode

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"flusherd/policy"
)

// Handle is a file handle, as name_to_handle_at(2) and fanotify's
// FAN_REPORT_FID give it: 4 bytes of handle_type (host byte order), then
// the f_handle bytes. It names an inode, not a path: it stays valid across
// renames and becomes ESTALE once the inode is deleted. The empty Handle is
// none.
type Handle string

// MakeHandle encodes a handle from its type and bytes.
func MakeHandle(typ int32, b []byte) Handle {
	buf := make([]byte, 4+len(b))
	binary.NativeEndian.PutUint32(buf, uint32(typ))
	copy(buf[4:], b)
	return Handle(buf)
}

// SameLayout reports whether h and o are handles of one type and length:
// two such handles of one inode number name two inodes (their generations
// differ), where handles of two layouts may be two encodings of one.
func (h Handle) SameLayout(o Handle) bool {
	return len(h) >= 4 && len(h) == len(o) && h[:4] == o[:4]
}

// The handle types whose bytes begin with the inode number (include/
// linux/exportfs.h, fs/xfs/xfs_export.h, fs/btrfs/export.h).
const (
	fileIDIno32Gen       = 1    // FILEID_INO32_GEN: u32 ino, u32 gen (ext4, f2fs, ...)
	fileIDIno32GenParent = 2    // FILEID_INO32_GEN_PARENT: and the parent's
	fileIDIno64Gen       = 0x81 // FILEID_INO64_GEN (xfs): u64 ino, u32 gen
	fileIDIno64GenParent = 0x82 // FILEID_INO64_GEN_PARENT (xfs): and the parent's
	fileIDBtrfs          = 0x4d // FILEID_BTRFS_WITHOUT_PARENT: u64 objectid, u64 root, u32 gen
	fileIDBtrfsParent    = 0x4e // FILEID_BTRFS_WITH_PARENT
	fileIDBtrfsParentRt  = 0x4f // FILEID_BTRFS_WITH_PARENT_ROOT
)

// HandleIno returns the inode number that a handle of type typ with bytes b
// begins with, for the types whose layout the kernel fixes: the generic
// 32-bit ones (ext4, f2fs), xfs's 64-bit ones and btrfs's (host byte
// order, as exportfs encodes them). ok is false for any other type or a
// handle too short. It reads bytes and opens nothing: a handle of a
// deleted inode (fanotify's FAN_DELETE) has its number read, where
// Identify would fail with ESTALE. The number is that of st_ino on these
// filesystems; a caller that matches it against a tracked inode compares
// the whole handle too.
func HandleIno(typ int32, b []byte) (ino uint64, ok bool) {
	switch typ {
	case fileIDIno32Gen, fileIDIno32GenParent:
		if len(b) >= 8 {
			return uint64(binary.NativeEndian.Uint32(b)), true
		}
	case fileIDIno64Gen, fileIDIno64GenParent:
		if len(b) >= 12 {
			return binary.NativeEndian.Uint64(b), true
		}
	case fileIDBtrfs, fileIDBtrfsParent, fileIDBtrfsParentRt:
		if len(b) >= 20 {
			return binary.NativeEndian.Uint64(b), true
		}
	}
	return 0, false
}

func (h Handle) unix() (unix.FileHandle, bool) {
	if len(h) < 4 {
		return unix.FileHandle{}, false
	}
	return unix.NewFileHandle(int32(binary.NativeEndian.Uint32([]byte(h[:4]))), []byte(h[4:])), true
}

// ErrUnlinked is returned by PathOfHandle for an inode that has no name
// left (st_nlink 0: deleted, or replaced by a rename, while still open
// somewhere). It wraps unix.ESTALE, so policy.ClassifyErr treats it as
// gone.
var ErrUnlinked = fmt.Errorf("inode: file has been deleted: %w", unix.ESTALE)

// HandleOpener is an Opener that also works with file handles.
type HandleOpener interface {
	Opener
	// HandleOf returns the handle of the regular file key at path. It
	// returns "" and no error when handles cannot be used on key's
	// filesystem.
	HandleOf(path string, key Key) (Handle, error)
	// OpenHandle opens the inode key by its handle for writeback.
	OpenHandle(h Handle, key Key) (File, error)
}

// Handles is an Opener that opens tracked files by file handle
// (open_by_handle_at(2)) on the filesystems registered with AddMount, and
// by path (OS.Open) elsewhere. Opening by handle costs one system call
// instead of a path walk, and reaches a file renamed since it was dirtied,
// wherever in its filesystem it now is. It needs CAP_DAC_READ_SEARCH;
// AddMount finds out.
//
// open_by_handle_at needs a descriptor on the filesystem (mount_fd). Handles
// opens the registered directory when one is needed and closes it after
// Idle without use, so that flusherd does not keep an idle watched
// filesystem busy: an administrator's umount(8) fails with EBUSY because of
// it only within Idle of a writeback.
// Safe for concurrent use.
type Handles struct {
	OS
	// Idle is how long an unused mount descriptor stays open; 0 means
	// 200ms.
	Idle time.Duration

	mu sync.Mutex
	// +checklocks:mu
	mounts map[uint64]*mount
	// +checklocks:mu
	timer *time.Timer
}

type mount struct {
	dirs []string // directories on the filesystem, tried in order
	// retired are directories Demote took out of dirs, tried after them.
	retired []string
	fd      int    // -1 when closed
	fdDir   string // the directory fd is open on
	refs    int
	lastUse time.Time
	// demoted: fd is open on a directory Demote moved back; it is
	// closed at its last release, so that the next open takes the
	// first directory.
	demoted bool
}

// NewHandles returns a Handles with no filesystem registered.
func NewHandles() *Handles { return &Handles{mounts: map[uint64]*mount{}} }

// AddMount registers the filesystem of dir, an absolute directory path, for
// opens by handle, and returns its st_dev; dir is opened with OpenDir (no
// symlink followed). It checks once that a handle can be made and opened
// there: the error is EPERM without CAP_DAC_READ_SEARCH, EOPNOTSUPP on a
// filesystem that cannot export handles. A filesystem already registered is left as it is.
func (h *Handles) AddMount(dir string) (dev uint64, err error) {
	fd, err := OpenDir(dir)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	h.mu.Lock()
	if m := h.mounts[st.Dev]; m != nil {
		m.add(dir)
		h.mu.Unlock()
		return st.Dev, nil
	}
	h.mu.Unlock()
	fh, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return st.Dev, &os.PathError{Op: "name_to_handle_at", Path: dir, Err: err}
	}
	probe, err := unix.OpenByHandleAt(fd, fh, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return st.Dev, &os.PathError{Op: "open_by_handle_at", Path: dir, Err: err}
	}
	unix.Close(probe)
	h.mu.Lock()
	if m := h.mounts[st.Dev]; m == nil {
		h.mounts[st.Dev] = &mount{dirs: []string{dir}, fd: -1}
	} else {
		m.add(dir)
	}
	h.mu.Unlock()
	return st.Dev, nil
}

// add registers dir after the other served directories (one Demote
// retired is served again).
func (m *mount) add(dir string) {
	if i := slices.Index(m.retired, dir); i >= 0 {
		m.retired = slices.Delete(m.retired, i, i+1)
	}
	if !slices.Contains(m.dirs, dir) {
		m.dirs = append(m.dirs, dir)
	}
}

// Has reports whether filesystem dev is registered.
func (h *Handles) Has(dev uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mounts[dev] != nil
}

// acquire returns a descriptor on filesystem dev, opening one of its
// registered directories if needed; release it with h.release(dev).
// Errors: EBADF when dev is not registered; the open's own error when one
// failed for want of a resource (policy.Shortage: EMFILE, ENFILE, ENOMEM,
// ...), so that the caller retries rather than drops; the open's own error
// when the filesystem itself fails (ENOTCONN from a FUSE server that died,
// EIO); ENODEV when neither its directories nor its mount points open on
// dev any more (unmounted): the filesystem is unavailable, which says
// nothing of the file itself. A filesystem whose directories are all gone
// from view but which is still mounted is opened at a mount point, read
// from /proc/self/mountinfo, its root first. The
// directories are opened without h.mu held: an open can hang on a sick
// filesystem, and must not stall the opens of the others.
func (h *Handles) acquire(dev uint64) (int, error) {
	h.mu.Lock()
	m := h.mounts[dev]
	if m == nil {
		h.mu.Unlock()
		return -1, unix.EBADF
	}
	if m.fd >= 0 {
		m.refs++
		h.mu.Unlock()
		return m.fd, nil
	}
	dirs := slices.Concat(m.dirs, m.retired)
	h.mu.Unlock()
	fd, fdDir, shortage, failing := openOnMounted(dev, dirs)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mounts[dev] != m {
		// Removed (or replaced) meanwhile.
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, unix.EBADF
	}
	if m.fd >= 0 {
		// Another caller opened one meanwhile: use it.
		if fd >= 0 {
			unix.Close(fd)
		}
	} else {
		if fd < 0 {
			if shortage != nil {
				return -1, shortage
			}
			if failing != nil {
				return -1, failing
			}
			return -1, unix.ENODEV
		}
		m.fd, m.fdDir = fd, fdDir
		if h.timer == nil {
			h.timer = time.AfterFunc(h.idle(), h.closeIdle)
		} else {
			h.timer.Reset(h.idle())
		}
	}
	m.refs++
	return m.fd, nil
}

// openOn opens the first of dirs that opens as a directory on filesystem
// dev. When none does, shortage is the last failure for want of a resource
// (policy.Shortage) and failing the last of the filesystem's own (not
// ENOENT, ENOTDIR or ELOOP, which say the directory is gone from view).
func openOn(dev uint64, dirs []string) (fd int, dir string, shortage, failing error) {
	for _, dir := range dirs {
		d, err := OpenDir(dir)
		if err != nil {
			switch {
			case policy.Shortage(err):
				shortage = err
			case !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP):
				failing = err
			}
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(d, &st); err != nil || st.Dev != dev {
			if policy.Shortage(err) {
				shortage = err
			}
			unix.Close(d)
			continue
		}
		return d, dir, nil, nil
	}
	return -1, "", shortage, failing
}

// openOnMounted is openOn of dirs, then, when none leads to the
// filesystem any more and none failed otherwise (removed, renamed,
// mounted over; after ext4 aborted its journal, one not yet on disk is
// not found once its dentry is evicted), of dev's mount points
// (mountPoints): the filesystem may still be mounted. Their failures
// other than a shortage are not reported.
func openOnMounted(dev uint64, dirs []string) (fd int, dir string, shortage, failing error) {
	fd, dir, shortage, failing = openOn(dev, dirs)
	if fd >= 0 || shortage != nil || failing != nil {
		return fd, dir, shortage, failing
	}
	mps, err := mountPoints(dev)
	if err != nil {
		return -1, "", err, nil
	}
	fd, dir, shortage, _ = openOn(dev, slices.DeleteFunc(mps, func(mp string) bool { return slices.Contains(dirs, mp) }))
	return fd, dir, shortage, nil
}

// mountPoints returns the mount points of filesystem dev in this mount
// namespace, those of its root directory first. The error is the mount
// table's only when it is a shortage (policy.Shortage); otherwise none
// are returned.
func mountPoints(dev uint64) ([]string, error) {
	infos, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return unix.Mkdev(uint32(i.Major), uint32(i.Minor)) != dev, false
	})
	if err != nil {
		if policy.Shortage(err) {
			return nil, err
		}
		return nil, nil
	}
	slices.SortStableFunc(infos, func(a, b *mountinfo.Info) int {
		return cmpBool(a.Root != "/", b.Root != "/")
	})
	mps := make([]string, 0, len(infos))
	for _, i := range infos {
		if !slices.Contains(mps, i.Mountpoint) {
			mps = append(mps, i.Mountpoint)
		}
	}
	return mps, nil
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

func (h *Handles) release(dev uint64) {
	h.mu.Lock()
	if m := h.mounts[dev]; m != nil {
		m.refs--
		m.lastUse = time.Now()
		if m.refs == 0 && m.demoted {
			unix.Close(m.fd)
			m.fd, m.demoted = -1, false
		}
	}
	h.mu.Unlock()
}

// Demote moves dir, a directory AddMount registered, behind the others of
// its filesystem, those registered later included (until AddMount
// registers it again): it roots no tree any more (a reload retired it),
// but stays for the opens of its last files if the filesystem has no
// other.
// A file opened by handle is named (its /proc/self/fd link) through the
// mount of the directory its open went through, so a tree on another
// mount of the same filesystem (a bind mount) is otherwise named through
// the retired root's mount, outside the tree. The descriptor open on dir
// is closed at once, or at its last release if in use.
func (h *Handles) Demote(dir string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.mounts {
		i := slices.Index(m.dirs, dir)
		if i < 0 {
			continue
		}
		m.dirs = slices.Delete(m.dirs, i, i+1)
		m.retired = append(m.retired, dir)
		if m.fd >= 0 && m.fdDir == dir {
			if m.refs == 0 {
				unix.Close(m.fd)
				m.fd = -1
			} else {
				m.demoted = true
			}
		}
	}
}

func (h *Handles) idle() time.Duration {
	if h.Idle > 0 {
		return h.Idle
	}
	return 200 * time.Millisecond
}

// closeIdle closes the descriptors unused for Idle, and rearms itself while
// any stays open; with none open, no timer runs.
func (h *Handles) closeIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	next := time.Duration(-1)
	for _, m := range h.mounts {
		if m.fd < 0 {
			continue
		}
		left := h.idle() - time.Since(m.lastUse)
		if m.refs == 0 && left <= 0 {
			unix.Close(m.fd)
			m.fd = -1
			continue
		}
		left = max(left, time.Millisecond)
		if next < 0 || left < next {
			next = left
		}
	}
	if next >= 0 {
		h.timer.Reset(next)
	}
}

// RemoveMount forgets filesystem dev (unmounted, or its last tree gone).
func (h *Handles) RemoveMount(dev uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.mounts[dev]; m != nil {
		if m.fd >= 0 && m.refs == 0 {
			unix.Close(m.fd)
		}
		delete(h.mounts, dev)
	}
}

// Close closes every open descriptor and forgets every filesystem.
func (h *Handles) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timer != nil {
		h.timer.Stop()
	}
	for dev, m := range h.mounts {
		if m.fd >= 0 {
			unix.Close(m.fd)
		}
		delete(h.mounts, dev)
	}
}

// HandleOf implements HandleOpener: it opens path with OpenPath (as OS.Open
// does), checks that it is the regular file key, and
// returns name_to_handle_at(2) of that descriptor, so the handle is of
// exactly the inode checked. Errors are *os.PathError, ErrNotRegular or
// ErrReplaced.
func (h *Handles) HandleOf(path string, key Key) (Handle, error) {
	if !h.Has(key.Dev) {
		return "", nil
	}
	pfd, err := OpenPath(path)
	if err != nil {
		return "", &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return "", &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", fmt.Errorf("%w: %s", ErrNotRegular, path)
	}
	if st.Dev != key.Dev || st.Ino != key.Ino {
		return "", fmt.Errorf("%w: %s", ErrReplaced, path)
	}
	fh, _, err := unix.NameToHandleAt(pfd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return "", &os.PathError{Op: "name_to_handle_at", Path: path, Err: err}
	}
	return MakeHandle(fh.Type(), fh.Bytes()), nil
}

// Identify opens handle hd of filesystem dev O_PATH (nothing is opened for
// I/O) and returns its key and whether it is a regular file. It is how an
// event that carries only a handle (fanotify) is matched to a tracked
// inode. Errors: ESTALE when the inode is gone, EPERM without
// CAP_DAC_READ_SEARCH, EBADF when dev is not registered.
func (h *Handles) Identify(dev uint64, hd Handle) (key Key, regular bool, err error) {
	fd, err := h.OpenPath(dev, hd)
	if err != nil {
		return Key{}, false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Key{}, false, err
	}
	return Key{Dev: st.Dev, Ino: st.Ino}, st.Mode&unix.S_IFMT == unix.S_IFREG, nil
}

// OpenHandle implements HandleOpener: open_by_handle_at(2) with
// O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_NOATIME (O_NOATIME dropped on EPERM), one
// system call. A handle names one inode for good, and it was made of a
// regular file with the identity key (HandleOf, or Identify's check) on the
// filesystem whose registered directory it is opened on (key.Dev): so no
// fstat checks type or identity, and the size is read only if asked for
// (File.Size). An inode deleted while open elsewhere (st_nlink 0) still
// opens, and its dirty pages are written back, as the kernel's flusher
// writes them. Errors: *os.PathError wrapping ESTALE once the inode is
// freed, EBADF when no directory of key.Dev is registered, the errno of a
// filesystem that cannot be opened (acquire), or open_by_handle_at's.
func (h *Handles) OpenHandle(hd Handle, key Key) (File, error) {
	fh, ok := hd.unix()
	if !ok {
		return nil, handleError(hd, unix.EINVAL)
	}
	mfd, err := h.acquire(key.Dev)
	if err != nil {
		return nil, handleError(hd, err)
	}
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC
	fd, err := openByHandleAt(mfd, fh, flags|unix.O_NOATIME)
	if errors.Is(err, unix.EPERM) {
		fd, err = openByHandleAt(mfd, fh, flags)
	}
	h.release(key.Dev)
	if err != nil {
		return nil, handleError(hd, err)
	}
	return &OSFile{fd: fd, size: -1}, nil
}

// OpenPath opens handle hd of filesystem dev O_PATH|O_CLOEXEC (nothing is
// opened for I/O) and returns the descriptor, which the caller closes.
// Errors as Identify's.
func (h *Handles) OpenPath(dev uint64, hd Handle) (int, error) {
	fh, ok := hd.unix()
	if !ok {
		return -1, unix.EINVAL
	}
	mfd, err := h.acquire(dev)
	if err != nil {
		return -1, err
	}
	fd, err := openByHandleAt(mfd, fh, unix.O_PATH|unix.O_CLOEXEC)
	h.release(dev)
	return fd, err
}

// sysOpenByHandleAt is open_by_handle_at(2); tests replace it.
var sysOpenByHandleAt = unix.OpenByHandleAt

// openByHandleAt is open_by_handle_at(2), tried again up to creatingRetries
// times, a little later each time, while it fails with ENOMEM. ext4 says
// ENOMEM for a handle whose inode number is being given to a new file at
// that moment, not for a want of memory: find_inode_fast (fs/inode.c)
// returns -ESTALE for an I_CREATING inode, iget_locked turns that into
// NULL, and __ext4_iget turns NULL into -ENOMEM. ext4 reuses a deleted
// file's number at once, so under a stream of creations and deletions an
// event's handle meets this often; once the creation is done the handle
// says ESTALE. A real shortage stays ENOMEM (about 0.4 ms later).
func openByHandleAt(mountFD int, h unix.FileHandle, flags int) (int, error) {
	fd, err := sysOpenByHandleAt(mountFD, h, flags)
	for i := 1; i <= creatingRetries && err == unix.ENOMEM; i++ {
		time.Sleep(time.Duration(i) * 40 * time.Microsecond)
		fd, err = sysOpenByHandleAt(mountFD, h, flags)
	}
	return fd, err
}

// creatingRetries bounds openByHandleAt's retries after ENOMEM.
const creatingRetries = 4

// handleError is open_by_handle_at's error for handle hd, named after the
// handle in hexadecimal ("file handle 01000000..."), made only when there
// is an error to report.
func handleError(hd Handle, err error) error {
	return &os.PathError{Op: "open_by_handle_at", Path: "file handle " + hex.EncodeToString([]byte(hd)), Err: err}
}

// PathOf returns the current path of the open file f (readlink of
// /proc/self/fd/N), for logs: a file opened by handle may have been renamed.
func PathOf(f File) (string, bool) {
	of, ok := f.(*OSFile)
	if !ok {
		return "", false
	}
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(of.fd))
	return p, err == nil
}

// PathOfHandle returns the current path of the inode handle hd of
// filesystem dev (open_by_handle_at O_PATH, then readlink of
// /proc/self/fd/N). It is meant for directories, whose handles always
// resolve to a connected path; ok is false for an inode that has no path
// any more (st_nlink 0: deleted). Errors: ESTALE when it is gone,
// ENAMETOOLONG when its path is longer than PATH_MAX.
func (h *Handles) PathOfHandle(dev uint64, hd Handle) (path string, ok bool, err error) {
	fh, valid := hd.unix()
	if !valid {
		return "", false, unix.EINVAL
	}
	mfd, err := h.acquire(dev)
	if err != nil {
		return "", false, err
	}
	fd, err := openByHandleAt(mfd, fh, unix.O_PATH|unix.O_CLOEXEC)
	h.release(dev)
	if err != nil {
		return "", false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", false, err
	}
	if st.Nlink == 0 {
		return "", false, nil
	}
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", false, err
	}
	return p, strings.HasPrefix(p, "/"), nil
}
