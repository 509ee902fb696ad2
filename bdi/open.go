package bdi

import (
	"errors"

	"golang.org/x/sys/unix"

	"flusherd/inode"
)

// Files are how a device reaches its files (New).
type Files struct {
	// Opener opens files by path.
	Opener inode.Opener
	// Handles, if set, makes file handles and opens files by handle.
	Handles inode.HandleOpener
	// Observer, if set, is told of the attempts' opens, the background
	// checks and the forgotten inodes.
	Observer AttemptObserver
}

// Handles opens files by handle on the filesystems registered with it
// (inode.Handles).
type Handles interface {
	inode.HandleOpener
	// RemoveMount lets the filesystem dev go: no tree is on it any more.
	RemoveMount(dev uint64)
}

// openFile opens a tracked file: by handle when it has one and the opener
// can (a rename since it was dirtied does not matter then), else by path.
//
// (st_dev, st_ino) is not an identity over time: ext4 gives a freed inode
// number to the next file at once, and only the handle's generation tells
// the two apart. So when the handle names a deleted inode (ESTALE, or
// inode.ErrUnlinked) and a regular file with the same number is at path, it
// is a new file that took the number: it is opened by its own handle, which
// is returned as renewed for the inode to keep. renewed is "" otherwise.
func (wb *Writeback) openFile(path string, key inode.Key, h inode.Handle) (f inode.File, renewed inode.Handle, err error) {
	ho := wb.handles
	if h == "" || ho == nil {
		f, err = wb.open.Open(path, key)
		return f, "", err
	}
	f, err = ho.OpenHandle(h, key)
	if errors.Is(err, unix.EBADF) && path != "" {
		// No descriptor of the inode's filesystem is registered for
		// opens by handle: a filesystem inside a tree's (a btrfs
		// subvolume has its own st_dev, so does a mount): by path.
		f, err = wb.open.Open(path, key)
		return f, "", err
	}
	if err == nil || path == "" || !errors.Is(err, unix.ESTALE) {
		return f, "", err
	}
	nh, herr := ho.HandleOf(path, key)
	if herr != nil || nh == "" || nh == h {
		return nil, "", err
	}
	nf, nerr := ho.OpenHandle(nh, key)
	if nerr != nil {
		return nil, "", err
	}
	return nf, nh, nil
}

// unbusyLocked clears in's Busy once no call for it is stuck or detached
// (callers have counted theirs down), asks for b_more_io_wait to be
// retried now (the inode waits there for this call only), and wakes a sync
// request waiting for it. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) unbusyLocked(in *inode.Inode) {
	in.State &^= inode.Busy
	wb.detachReturned = true
	if wb.unbusy != nil {
		close(wb.unbusy)
		wb.unbusy = nil
	}
}
