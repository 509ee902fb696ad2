package inode

import (
	"errors"

	"golang.org/x/sys/unix"
)

// OpenTracked opens a tracked file for a writeback attempt: by handle h
// when it has one and handles is set (a rename since it was dirtied does
// not matter then), else by path with open.
//
// (st_dev, st_ino) is not an identity over time: ext4 gives a freed inode
// number to the next file at once, and only the handle's generation tells
// the two apart. So when h names a deleted inode (ESTALE) and a regular
// file with the same number is at path, it is a new file that took the
// number: it is opened by its own handle, returned as renewed for the
// inode to keep; renewed is "" otherwise. A filesystem not registered for
// opens by handle (EBADF: one inside a tree's, a btrfs subvolume) is
// opened by path; so is one none of whose directories opens (ENODEV: a
// deleted subvolume, an unmounted filesystem), and a file no longer at its
// path is gone (ENOENT, ESTALE), not its filesystem unavailable.
func OpenTracked(open Opener, handles HandleOpener, path string, key Key, h Handle) (f File, renewed Handle, err error) {
	return openTracked(open, handles, func() string { return path }, key, h)
}

// OpenTrackedRef is OpenTracked of the path ref names, built only when it
// is used: with no handle, or when the handle cannot be opened.
func OpenTrackedRef(open Opener, handles HandleOpener, ref PathRef, key Key, h Handle) (f File, renewed Handle, err error) {
	return openTracked(open, handles, ref.String, key, h)
}

func openTracked(open Opener, handles HandleOpener, pathOf func() string, key Key, h Handle) (f File, renewed Handle, err error) {
	if h == "" || handles == nil {
		f, err = open.Open(pathOf(), key)
		return f, "", err
	}
	f, err = handles.OpenHandle(h, key)
	if err == nil {
		return f, "", nil
	}
	path := pathOf()
	if errors.Is(err, unix.EBADF) && path != "" {
		f, err = open.Open(path, key)
		return f, "", err
	}
	if errors.Is(err, unix.ENODEV) && path != "" {
		// No directory of the handle's filesystem opens (a btrfs
		// subvolume deleted, a filesystem unmounted): the path says
		// whether the file is still there. Gone from it, the file is
		// gone (ENOENT, ESTALE: another file there); found, it is
		// written by path.
		f, perr := open.Open(path, key)
		if perr == nil || errors.Is(perr, unix.ENOENT) || errors.Is(perr, unix.ESTALE) || errors.Is(perr, unix.ENOTDIR) {
			return f, "", perr
		}
		return nil, "", err
	}
	if path == "" || !errors.Is(err, unix.ESTALE) {
		return f, "", err
	}
	nh, herr := handles.HandleOf(path, key)
	if herr != nil || nh == "" || nh == h {
		return nil, "", err
	}
	nf, nerr := handles.OpenHandle(nh, key)
	if nerr != nil {
		return nil, "", err
	}
	return nf, nh, nil
}

// Window is a byte range of a file to write back; Len 0 is to the end.
type Window struct{ Off, Len int64 }

// Write is the write step of a writeback attempt on an open file, the
// kernel's do_writepages for one inode: with Sync, fdatasync(2)
// (WB_SYNC_ALL; skipped when Synced says a syncfs already made the data
// durable) and then the file's page counts, final since it waited; else
// sync_file_range(SYNC_FILE_RANGE_WRITE) of each window in order (none:
// the whole file), which starts writeback and waits for nothing.
type Write struct {
	Sync, Synced bool
	Windows      []Window
}

// Written is what a Write left: with Sync, the dirty and writeback pages
// after it (After read, AfterKnown); with windows, Started says
// sync_file_range was called (its error then tells whether the
// filesystem supports it).
type Written struct {
	Dirty, Writeback uint64
	AfterKnown       bool
	Started          bool
}

// Do runs w on f. An error of fdatasync or sync_file_range is returned
// as is; with Sync, an error of the cachestat after it too, AfterKnown
// then false.
func (w Write) Do(f File) (Written, error) {
	if w.Sync {
		if !w.Synced {
			if err := f.DataSync(); err != nil {
				return Written{}, err
			}
		}
		d, wbp, err := f.Cachestat(0, 0)
		if err != nil {
			return Written{}, err
		}
		return Written{Dirty: d, Writeback: wbp, AfterKnown: true}, nil
	}
	wins := w.Windows
	if len(wins) == 0 {
		wins = []Window{{}}
	}
	for _, win := range wins {
		if err := f.StartWriteback(win.Off, win.Len); err != nil {
			return Written{Started: true}, err
		}
	}
	return Written{Started: true}, nil
}
