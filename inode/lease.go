package inode

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// HeldForWrite reports whether some process holds the regular file path
// (of identity key, as Open checks) open for writing, or mapped shared and
// writable, which keeps a descriptor open for writing until munmap or
// exit. It opens the file as Open does and asks for a read lease
// (F_SETLEASE F_RDLCK), which the kernel grants only while no descriptor
// of the file is open for writing; a lease granted is given back at once.
// The caller must own the file or have CAP_LEASE (else EACCES); a
// filesystem without leases answers EINVAL. Errors are *os.PathError.
// (fs/locks.c: generic_add_lease, check_conflicting_open.)
func HeldForWrite(path string, key Key) (bool, error) {
	f, err := openOS(path, key)
	if err != nil {
		return false, err
	}
	defer f.Close()
	fd := f.Fd()
	switch _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_RDLCK); {
	case errors.Is(err, unix.EAGAIN):
		return true, nil
	case err != nil:
		return false, &os.PathError{Op: "fcntl F_SETLEASE", Path: path, Err: err}
	}
	// The close gives the lease back too.
	unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	return false, nil
}
