package service

import (
	"testing"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
)

// TestHandleHashFresh: the roots of two new ext4 filesystems have the same
// inode number and the same file handle (as a new filesystem on a device
// number another had would), but not the same claim key: the filesystem's
// id is in it, so a daemon that still holds a gone filesystem's root does
// not refuse a tree on a new one.
func TestHandleHashFresh(t *testing.T) {
	testfs.SkipShort(t, "mounts two ext4 images")
	a := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 16})
	b := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 16})
	ha, _, errA := unix.NameToHandleAt(unix.AT_FDCWD, a.Dir, 0)
	hb, _, errB := unix.NameToHandleAt(unix.AT_FDCWD, b.Dir, 0)
	if errA != nil || errB != nil {
		t.Fatalf("name_to_handle_at: %v, %v", errA, errB)
	}
	if string(ha.Bytes()) != string(hb.Bytes()) {
		t.Logf("the two roots' handles differ already on this kernel")
	}
	if handleHash(a.Dir) == handleHash(b.Dir) {
		t.Errorf("two new ext4 filesystems' roots have the same claim hash %x", handleHash(a.Dir))
	}
}
