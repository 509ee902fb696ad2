package service

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// CheckCachestat checks once, at start, that cachestat(2) works: every
// decision flusherd makes reads it, and without it every file would be
// tracked as dirty and fail. It reads the daemon's own executable (any
// regular file does). The error names the call, the errno, the likely
// cause and the fix: ENOSYS, a kernel older than 6.5 or a seccomp filter
// that hides the call; EPERM or EACCES, a seccomp filter (a container
// runtime's default profile, a SystemCallFilter= drop-in).
func CheckCachestat() error {
	exe, err := os.Executable()
	if err != nil {
		exe = "/proc/self/exe"
	}
	f, err := os.Open(exe)
	if err != nil {
		return nil // cannot tell here: each file's attempt says
	}
	defer f.Close()
	var cs unix.Cachestat_t
	err = unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0)
	return cachestatErr(err)
}

// cachestatErr is CheckCachestat's verdict on the probe's error.
func cachestatErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("cachestat(2) is not available (ENOSYS): flusherd reads every file's page-cache state with it. " +
			"The kernel is older than 6.5 (uname -r), or a seccomp filter answers ENOSYS for it: " +
			"run on Linux 6.5 or later, and allow cachestat in the filter (the container's seccomp profile: deploy/seccomp/flusherd.json)")
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("cachestat(2) is refused (%w): flusherd reads every file's page-cache state with it. "+
			"A seccomp filter refuses it: a container runtime's default profile (use deploy/seccomp/flusherd.json), "+
			"or a SystemCallFilter= in a drop-in of flusherd.service (the shipped unit allows it; libseccomp older than 2.5.5 cannot name it)", err)
	}
	return nil // another error is the file's, not the call's
}
