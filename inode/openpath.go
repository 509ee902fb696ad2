package inode

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// openat2 is unix.Openat2; tests replace it to act as a seccomp filter that
// refuses the call.
var openat2 = unix.Openat2

// openat2State records what openat2(2) did the first time it was tried:
// 0 not tried, 1 it works, 2 it answered ENOSYS. Once it has answered
// ENOSYS it is not tried again.
var openat2State atomic.Int32

// ProbeOpenat2 reports whether openat2(2) can be used, trying it once (on
// "/") if it has not been tried yet. It returns nil when it works, and
// unix.ENOSYS when the kernel or a seccomp filter refuses it. systemd's
// RestrictSUIDSGID=yes is such a filter: openat2 keeps its mode in a
// struct seccomp cannot inspect, so the filter answers ENOSYS to every
// openat2. OpenPath then walks paths component by component instead.
func ProbeOpenat2() error {
	switch openat2State.Load() {
	case 1:
		return nil
	case 2:
		return unix.ENOSYS
	}
	fd, err := OpenPath("/")
	if err == nil {
		unix.Close(fd)
	}
	if openat2State.Load() == 2 {
		return unix.ENOSYS
	}
	return nil
}

// OpenPath opens path with O_PATH|O_NOFOLLOW|O_CLOEXEC such that no
// directory component of it is a symlink, and returns the descriptor:
// nothing is opened for I/O, so a FIFO or device node cannot block or have
// side effects, and a symlink swapped into the path is never followed. A
// last component that is a symlink is opened itself (O_NOFOLLOW), not
// followed: callers fstat the descriptor and refuse anything but the type
// they expect. A relative path is taken from the working directory.
//
// It uses openat2(2) with RESOLVE_NO_SYMLINKS. Where openat2 answers ENOSYS
// (a kernel before 5.6, or a seccomp filter, see ProbeOpenat2) it walks
// the path one component at a time with openat(2) relative to the
// previous component's descriptor, each O_PATH|O_NOFOLLOW, and fails with
// ELOOP at a symlink in a directory position, as openat2 does. (filepath-securejoin's
// fallback walk resolves symlinks inside a root instead of refusing them,
// which is not what is wanted here.)
//
// Errors are the errno (ENOENT, ELOOP for a symlink, ENOTDIR, EACCES...),
// unwrapped; callers add the path.
func OpenPath(path string) (int, error) {
	if openat2State.Load() != 2 {
		fd, err := openat2(unix.AT_FDCWD, path, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS,
		})
		if !errors.Is(err, unix.ENOSYS) {
			openat2State.CompareAndSwap(0, 1)
			return fd, err
		}
		openat2State.Store(2)
	}
	return walkNoSymlinks(path)
}

// walkNoSymlinks is OpenPath without openat2: one openat(2) per component.
func walkNoSymlinks(path string) (int, error) {
	if path == "" {
		return -1, unix.ENOENT
	}
	if len(path) >= unix.PathMax {
		return -1, unix.ENAMETOOLONG // as openat2 (and open) say
	}
	dir := unix.AT_FDCWD
	if strings.HasPrefix(path, "/") {
		fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		dir = fd
	}
	closeDir := func() {
		if dir != unix.AT_FDCWD {
			unix.Close(dir)
		}
	}
	comps := strings.Split(path, "/")
	// The last non-empty component is opened without O_DIRECTORY; a
	// trailing slash makes it a directory.
	last := len(comps) - 1
	for last >= 0 && comps[last] == "" {
		last--
	}
	if last < 0 { // "/" or "//"
		return dir, nil
	}
	for i, c := range comps[:last+1] {
		if c == "" || c == "." {
			continue
		}
		flags := unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i < last || len(comps)-1 > last {
			flags |= unix.O_DIRECTORY
		}
		fd, err := unix.Openat(dir, c, flags, 0)
		if errors.Is(err, unix.ENOTDIR) {
			// O_DIRECTORY refused it: a symlink is ELOOP, as with
			// RESOLVE_NO_SYMLINKS; anything else stays ENOTDIR.
			var st unix.Stat_t
			if unix.Fstatat(dir, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
		}
		closeDir()
		if err != nil {
			return -1, err
		}
		dir = fd
	}
	if dir == unix.AT_FDCWD {
		// Only "." components: the working directory itself.
		return unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	return dir, nil
}

// OpenDir opens the directory path O_RDONLY|O_DIRECTORY|O_CLOEXEC with no
// symlink in any component, the last one included: OpenPath, then
// openat(2) of "." relative to that descriptor. A symlink is ENOTDIR or
// ELOOP; errors are the errno, unwrapped.
func OpenDir(path string) (int, error) {
	pfd, err := OpenPath(path)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	unix.Close(pfd)
	return fd, err
}

// StatPath is OpenPath followed by fstat(2): the file's status, reached
// without following a symlink, and nothing left open. Errors are
// *os.PathError with Op "open" or "fstat".
func StatPath(path string) (unix.Stat_t, error) {
	fd, st, err := openStat(path)
	if err == nil {
		unix.Close(fd)
	}
	return st, err
}

// openStat opens path with OpenPath and fstats it; the descriptor is the
// caller's to close when err is nil.
func openStat(path string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := OpenPath(path)
	if err != nil {
		return -1, st, &os.PathError{Op: "open", Path: path, Err: err}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	return fd, st, nil
}

// StatPathHandle is StatPath with the inode's file handle
// (name_to_handle_at(2) of the same descriptor), which tells a directory
// from another made with its inode number (ext4 reuses one at once; a
// btrfs subvolume made again gets the deleted one's st_dev and root
// inode): "" where the filesystem gives none.
func StatPathHandle(path string) (unix.Stat_t, Handle, error) {
	fd, st, err := openStat(path)
	if err != nil {
		return st, "", err
	}
	defer unix.Close(fd)
	fh, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return st, "", nil
	}
	return st, MakeHandle(fh.Type(), fh.Bytes()), nil
}
