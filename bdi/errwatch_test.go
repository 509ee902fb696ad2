package bdi

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestErrWatchLastError: a device not watched says so; a watched one with
// no writeback error reports none; and when the check cannot be made (no
// descriptor left to duplicate the filesystem's), the answer is an error
// now (EIO): unknown is not clean.
func TestErrWatchLastError(t *testing.T) {
	errs := NewErrWatch()
	defer errs.Close()
	dev, err := errs.Add(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if at, errno, watched := errs.LastError(dev+1, 5); watched || at != 0 || errno != 0 {
		t.Errorf("an unwatched device: %v, %v, watched %v; want 0, 0, false", at, errno, watched)
	}
	if at, errno, watched := errs.LastError(dev, 7); !watched || at != 0 || errno != 0 {
		t.Errorf("a watched device without errors: %v, %v, watched %v; want 0, 0, true", at, errno, watched)
	}
	checks := errs.Checks()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lowest, err := unix.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(lowest)
	low := lim
	low.Cur = uint64(lowest)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	at, errno, watched := errs.LastError(dev, 9)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if !watched || at != 9 || errno != unix.EIO {
		t.Errorf("no descriptor to check with: %v, %v, watched %v; want 9, EIO, true", at, errno, watched)
	}
	if n := errs.Checks(); n != checks {
		t.Errorf("a check that could not be made counted: %d, want %d", n, checks)
	}
}
