package service

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStatsDirNotMade: a stats directory that cannot be made for want of
// permission (sysfs refuses mkdir even to root, with EPERM) names what to
// do.
func TestStatsDirNotMade(t *testing.T) {
	_, err := claimStatsDir("/sys/kernel/flusherd-test-stats")
	if err == nil || !strings.Contains(err.Error(), "run as root, or choose another directory with --stats-dir or stats.dir") {
		t.Errorf("claimStatsDir in sysfs: %v, want a refusal that says what to do", err)
	}
}

// TestStatsDirReadOnlyHint: as root, a stats.dir that cannot be made
// because its filesystem is read-only (what ProtectSystem=strict makes of
// everything but /run/flusherd) is refused with the drop-in that would
// allow it.
func TestStatsDirReadOnlyHint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a read-only tmpfs")
	}
	ro := t.TempDir()
	if err := unix.Mount("tmpfs", ro, "tmpfs", unix.MS_RDONLY, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(ro, unix.MNT_DETACH) })
	dir := filepath.Join(ro, "stats")
	_, err := claimStatsDir(dir)
	if err == nil || !strings.Contains(err.Error(), "read-only file system") || !strings.Contains(err.Error(), "ReadWritePaths="+dir) {
		t.Errorf("claimStatsDir(%s) = %v, want the read-only error with ReadWritePaths=%s", dir, err, dir)
	}
}
