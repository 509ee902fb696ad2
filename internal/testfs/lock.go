package testfs

import (
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// A container (package nspawn) gets a copy of every mount that exists when
// it starts, and on a host whose mounts are private (PID 1 is not systemd)
// a later umount on the host does not reach that copy: the filesystem, and
// its loop device, stay alive until the container stops, and the test that
// mounted it fails its teardown. So tests that mount (Mount, faultfs) hold
// a shared flock(2) on one file for as long as their mount exists, and a
// test that boots a container holds it exclusively for as long as the
// container runs: across the test binaries that `go test ./...` runs in
// parallel, no test's mount is ever copied into a container. A test that
// changes a machine-wide budget (an inotify sysctl) excludes the others
// the same way, and the tests that make inotify instances without a mount
// (the daemons, the watch backends) hold the lock shared too.

// exclusive is set while this process holds the lock exclusively; its own
// mounts then need no shared lock.
var exclusive atomic.Bool

func lockFile(t T) int {
	t.Helper()
	p := filepath.Join(os.TempDir(), "flusherd-test-mounts.lock")
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatalf("testfs: open %s: %v", p, err)
	}
	return fd
}

func flock(t T, fd, how int) {
	t.Helper()
	for {
		err := unix.Flock(fd, how)
		if err == nil {
			return
		}
		if err != unix.EINTR {
			unix.Close(fd)
			t.Fatalf("testfs: flock: %v", err)
		}
	}
}

// HoldMounts takes the shared lock until the test ends; call it before
// mounting anything, so that its cleanup runs after the unmount. Mount
// calls it.
func HoldMounts(t T) {
	t.Helper()
	if exclusive.Load() {
		return
	}
	fd := lockFile(t)
	flock(t, fd, unix.LOCK_SH)
	t.Cleanup(func() { unix.Close(fd) })
}

// ExcludeMounts waits until no other test holds a mount (HoldMounts) and
// keeps new ones out until the test ends; this process's own mounts go
// ahead. Call it before anything that the container must not copy.
func ExcludeMounts(t T) {
	t.Helper()
	fd := lockFile(t)
	flock(t, fd, unix.LOCK_EX)
	exclusive.Store(true)
	t.Cleanup(func() {
		exclusive.Store(false)
		unix.Close(fd)
	})
}
