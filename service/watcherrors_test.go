package service

import (
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/internal/testfs"
	"flusherd/tree"
)

// TestWatchErrorsNoWriteback: an integrity tree's filesystem is held for
// its writeback errors; one without writeback (a tmpfs) is not, so that
// it can still be unmounted.
func TestWatchErrorsNoWriteback(t *testing.T) {
	ext4 := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 16})
	shm := t.TempDir()
	if err := unix.Mount("tmpfs", shm, "tmpfs", 0, "size=1m"); err != nil {
		testfs.Missing(t, "mount tmpfs: %v", err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			unix.Unmount(shm, unix.MNT_DETACH)
		}
	})
	errs := bdi.NewErrWatch()
	defer errs.Close()
	for _, root := range []string{ext4.Dir, shm} {
		WatchErrors(errs, tree.Tree{Root: root, Recursive: true, Mode: tree.ModeIntegrity}, zap.NewNop())
	}
	dev := func(p string) uint64 {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Dev
	}
	if _, _, watched := errs.LastError(dev(ext4.Dir), 0); !watched {
		t.Error("the ext4 integrity tree's filesystem is not held for its errors")
	}
	if _, _, watched := errs.LastError(dev(shm), 0); watched {
		t.Error("the tmpfs integrity tree's filesystem is held for its errors")
	}
	if err := unix.Unmount(shm, 0); err != nil {
		t.Errorf("unmount of the tmpfs an integrity tree is on: %v, want it not held", err)
	} else {
		mounted = false
	}
}
