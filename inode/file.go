package inode

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is returned by Open for anything but a regular file: a
// directory, FIFO, socket, device node or symlink is never opened for I/O.
var ErrNotRegular = errors.New("inode: not a regular file")

// ErrReplaced is returned by Open when the path now names a different inode
// than the one tracked (the file was replaced, e.g. by an atomic save). It
// wraps unix.ESTALE, so policy.ClassifyErr treats it as gone.
var ErrReplaced = fmt.Errorf("inode: path names another inode: %w", unix.ESTALE)

// File is an open tracked file: what a writeback attempt needs. The real one
// is *OSFile; tests of the writeback loop use fakes.
type File interface {
	// Cachestat returns the file's dirty and writeback page counts for
	// [off, off+n), n == 0 meaning to the end (cachestat(2)).
	Cachestat(off, n int64) (dirty, writeback uint64, err error)
	// StartWriteback starts writeback of [off, off+n) without waiting
	// (sync_file_range(SYNC_FILE_RANGE_WRITE), WB_SYNC_NONE); n == 0 means
	// to the end of the file.
	StartWriteback(off, n int64) error
	// DataSync writes the file's data and waits for it (fdatasync(2),
	// WB_SYNC_ALL).
	DataSync() error
	// Size is st_size in bytes, read once (fstat(2) on the first call,
	// unless the open already did); errors are fstat's, wrapped.
	Size() (int64, error)
	Close() error
}

// ErrCursor is a filesystem's writeback error cursor (s_wb_err) held by
// one open file description (f_sb_err, sampled at open: an error no one
// has seen yet counts as new). Check is syncfs(2): it writes back and
// waits on the whole filesystem and reports a writeback error of any of
// its files since the cursor was sampled or last checked. It takes
// nothing from the files' own error state (their mappings' errseq), which
// their fsync reports. Close lets the description go.
type ErrCursor interface {
	Check() error
	Close() error
}

// Opener opens a tracked inode for writeback.
type Opener interface {
	Open(path string, key Key) (File, error)
}

// OSFile is a File on a real file descriptor.
type OSFile struct {
	fd   int
	size int64 // -1 until read
}

// OS opens real files. Its zero value is ready to use.
type OS struct{}

// Open opens path for writeback without following symlinks and without
// blocking, and only if it is a regular file with the given identity:
//
//  1. OpenPath: O_PATH|O_NOFOLLOW with no symlink in any component
//     (openat2 RESOLVE_NO_SYMLINKS, or a walk where openat2 is refused),
//     so nothing is opened for I/O yet;
//  2. fstat: ErrNotRegular unless S_IFREG; ErrReplaced unless (dev, ino)
//     match key;
//  3. reopen /proc/self/fd/N with O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_NOATIME
//     (O_NOATIME dropped on EPERM, for files the caller does not own).
//
// A FIFO, socket or device node is therefore never opened for reading, and a
// symlink swapped in after the path was checked is not followed. Errors are
// *os.PathError wrapping the errno (ENOENT, ELOOP for a symlink, EACCES...).
func (OS) Open(path string, key Key) (File, error) {
	f, err := openOS(path, key)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// openOS is OS.Open.
func openOS(path string, key Key) (*OSFile, error) {
	pfd, err := OpenPath(path)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w: %s", ErrNotRegular, path)
	}
	if key != (Key{}) && (st.Dev != key.Dev || st.Ino != key.Ino) {
		return nil, fmt.Errorf("%w: %s", ErrReplaced, path)
	}
	proc := "/proc/self/fd/" + strconv.Itoa(pfd)
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC
	fd, err := unix.Open(proc, flags|unix.O_NOATIME, 0)
	if err == unix.EPERM {
		fd, err = unix.Open(proc, flags, 0)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &OSFile{fd: fd, size: st.Size}, nil
}

// Fd returns the descriptor.
func (f *OSFile) Fd() int { return f.fd }

// Size implements File: the st_size seen at open (by path), or one
// fstat(2) on the first call (opened by handle). Not safe for concurrent
// first calls.
func (f *OSFile) Size() (int64, error) {
	if f.size < 0 {
		var st unix.Stat_t
		if err := unix.Fstat(f.fd, &st); err != nil {
			return 0, fmt.Errorf("fstat: %w", err)
		}
		f.size = st.Size
	}
	return f.size, nil
}

// Cachestat implements File with cachestat(2) (Linux 6.5+).
func (f *OSFile) Cachestat(off, n int64) (dirty, writeback uint64, err error) {
	var cs unix.Cachestat_t
	r := unix.CachestatRange{Off: uint64(off), Len: uint64(n)}
	if err := unix.Cachestat(uint(f.fd), &r, &cs, 0); err != nil {
		return 0, 0, fmt.Errorf("cachestat: %w", err)
	}
	return cs.Dirty, cs.Writeback, nil
}

// StartWriteback implements File with sync_file_range(SYNC_FILE_RANGE_WRITE).
func (f *OSFile) StartWriteback(off, n int64) error {
	if err := unix.SyncFileRange(f.fd, off, n, unix.SYNC_FILE_RANGE_WRITE); err != nil {
		return fmt.Errorf("sync_file_range: %w", err)
	}
	return nil
}

// DataSync implements File with fdatasync(2).
func (f *OSFile) DataSync() error {
	if err := unix.Fdatasync(f.fd); err != nil {
		return fmt.Errorf("fdatasync: %w", err)
	}
	return nil
}

// Syncfs writes back and commits the whole filesystem the file is on
// (syncfs(2)). Since Linux 5.8 it returns a writeback error that happened
// anywhere in that filesystem since the file was opened.
func (f *OSFile) Syncfs() error {
	if err := unix.Syncfs(f.fd); err != nil {
		return fmt.Errorf("syncfs: %w", err)
	}
	return nil
}

// Close implements File.
func (f *OSFile) Close() error { return unix.Close(f.fd) }

// DirCursor opens the directory dir (no symlink in any component) as an
// error cursor of filesystem dev (st_dev). When dir is gone from view
// (ENOENT, ENOTDIR, ELOOP) or is on another filesystem, a mount point of
// dev is opened instead (Handles.acquire's fallback). Errors are
// *os.PathError: the open's (dir's own when it is on dev), or ENODEV when
// no directory on dev opens.
func DirCursor(dir string, dev uint64) (ErrCursor, error) {
	fd, _, shortage, failing := openOnMounted(dev, []string{dir})
	if fd >= 0 {
		return fdCursor(fd), nil
	}
	return nil, &os.PathError{Op: "open", Path: dir, Err: cmp.Or(shortage, failing, error(unix.ENODEV))}
}

// fdCursor is an ErrCursor on a descriptor.
type fdCursor int

func (c fdCursor) Check() error {
	if err := unix.Syncfs(int(c)); err != nil {
		return fmt.Errorf("syncfs: %w", err)
	}
	return nil
}

func (c fdCursor) Close() error { return unix.Close(int(c)) }

// Stat is StatPath of path: its key and whether it is a regular file,
// with no symlink followed in any component (ELOOP where a directory
// above it is one; a last component that is a symlink is the symlink's).
func Stat(path string) (key Key, regular bool, err error) {
	st, err := StatPath(path)
	if err != nil {
		return Key{}, false, err
	}
	return Key{Dev: st.Dev, Ino: st.Ino}, st.Mode&unix.S_IFMT == unix.S_IFREG, nil
}
