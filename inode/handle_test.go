package inode

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// TestHandles opens files by handle on a real ext4 filesystem: after a
// rename (even out of the registered directory), while a deleted file is
// still open elsewhere (its size then read by fstat), not once it is freed
// (ESTALE). The
// mount descriptor is closed when idle, so the filesystem can be unmounted.
func TestHandles(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	tree := filepath.Join(mnt.Dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	h := NewHandles()
	h.Idle = 50 * time.Millisecond
	defer h.Close()
	dev, err := h.AddMount(tree)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(tree, "f")
	if err := os.WriteFile(p, make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	k, _, err := Stat(p)
	if err != nil || k.Dev != dev {
		t.Fatalf("Stat: %v %v (dev %d)", k, err, dev)
	}
	hd, err := h.HandleOf(p, k)
	if err != nil || hd == "" {
		t.Fatalf("HandleOf: %q %v", hd, err)
	}
	// Moved out of the registered tree, on the same filesystem.
	moved := filepath.Join(mnt.Dir, "moved")
	if err := os.Rename(p, moved); err != nil {
		t.Fatal(err)
	}
	f, err := h.OpenHandle(hd, k)
	if err != nil {
		t.Fatalf("OpenHandle after rename: %v", err)
	}
	if d, _, err := f.Cachestat(0, 0); err != nil || d != 2 {
		t.Errorf("cachestat through the handle: %d dirty pages, %v; want 2", d, err)
	}
	if got, ok := PathOf(f); !ok || got != moved {
		t.Errorf("PathOf = %q, %v; want %q", got, ok, moved)
	}
	f.Close()

	// Deleted but still open elsewhere: the inode lives on, and opens
	// (its dirty pages are written back, as the kernel's flusher does);
	// its size is read on demand (fstat).
	keep, err := os.Open(moved)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(moved)
	if f, err := h.OpenHandle(hd, k); err != nil {
		t.Errorf("OpenHandle of an unlinked open file: %v, want it open", err)
	} else {
		if size, err := f.Size(); err != nil || size != 2*int64(os.Getpagesize()) {
			t.Errorf("Size of the unlinked file by handle: %d, %v; want %d", size, err, 2*os.Getpagesize())
		}
		f.Close()
	}
	keep.Close()
	mnt.DropCaches(t)
	if _, err := h.OpenHandle(hd, k); !errors.Is(err, unix.ESTALE) {
		t.Errorf("OpenHandle of a deleted file: %v, want ESTALE", err)
	}

	// A FIFO is not a regular file: no handle.
	fifo := filepath.Join(tree, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	fk, _, _ := Stat(fifo)
	if _, err := h.HandleOf(fifo, fk); !errors.Is(err, ErrNotRegular) {
		t.Errorf("HandleOf(fifo) = %v, want ErrNotRegular", err)
	}
	// Identify tells a regular file from the rest.
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	k2, _, _ := Stat(p)
	hd2, err := h.HandleOf(p, k2)
	if err != nil {
		t.Fatal(err)
	}
	if got, reg, err := h.Identify(dev, hd2); err != nil || got != k2 || !reg {
		t.Errorf("Identify = %v %v %v, want %v true", got, reg, err, k2)
	}

	// Once idle, the mount descriptor is closed: nothing of ours keeps
	// the filesystem busy.
	// (Idle is 50 ms; the timer that closes it may run late on a loaded
	// machine.)
	closed := testwait.Poll(5*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.mounts[dev].fd < 0
	})
	if !closed {
		t.Errorf("mount descriptor still open 5 s after the idle time (50 ms)")
	}
}

// TestOpenByHandleAtCreating: ENOMEM from open_by_handle_at (ext4's answer
// for a number being given to a new file at that moment) is tried again,
// and what the retry says stands; a lasting ENOMEM is returned as it is.
func TestOpenByHandleAtCreating(t *testing.T) {
	defer func(f func(int, unix.FileHandle, int) (int, error)) { sysOpenByHandleAt = f }(sysOpenByHandleAt)
	for _, c := range []struct {
		answers []error
		want    error
		calls   int
	}{
		{[]error{unix.ENOMEM, unix.ENOMEM, unix.ESTALE}, unix.ESTALE, 3},
		{[]error{unix.ENOMEM, nil}, nil, 2},
		{[]error{unix.EACCES}, unix.EACCES, 1},
		{[]error{unix.ENOMEM, unix.ENOMEM, unix.ENOMEM, unix.ENOMEM, unix.ENOMEM, unix.ESTALE}, unix.ENOMEM, 1 + creatingRetries},
	} {
		calls := 0
		sysOpenByHandleAt = func(int, unix.FileHandle, int) (int, error) {
			err := c.answers[min(calls, len(c.answers)-1)]
			calls++
			if err != nil {
				return -1, err
			}
			return 7, nil
		}
		fd, err := openByHandleAt(3, unix.FileHandle{}, unix.O_PATH)
		if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) || calls != c.calls || (err == nil && fd != 7) {
			t.Errorf("answers %v: fd %d, err %v after %d calls; want %v after %d", c.answers, fd, err, calls, c.want, c.calls)
		}
	}
}

// TestHandleIno reads the inode number from real handles (name_to_handle_at)
// on ext4 (FILEID_INO32_GEN), xfs (FILEID_INO64_GEN, and FILEID_INO32_GEN
// when mounted inode32) and btrfs (FILEID_BTRFS_WITHOUT_PARENT): it is the
// file's st_ino, also for the handle of a file since deleted. Other types
// and short handles are refused.
func TestHandleIno(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  testfs.Options
		typ  int32
	}{
		{"ext4", testfs.Options{Type: "ext4", SizeMB: 64}, fileIDIno32Gen},
		{"xfs", testfs.Options{Type: "xfs"}, fileIDIno64Gen},
		{"xfs-inode32", testfs.Options{Type: "xfs", Data: "inode32"}, fileIDIno32Gen},
		{"btrfs", testfs.Options{Type: "btrfs"}, fileIDBtrfs},
	} {
		t.Run(c.name, func(t *testing.T) {
			mnt := testfs.Mount(t, c.opt)
			p := filepath.Join(mnt.Dir, "f")
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				t.Fatal(err)
			}
			fh, _, err := unix.NameToHandleAt(unix.AT_FDCWD, p, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if fh.Type() != c.typ {
				t.Errorf("handle type %#x, want %#x", fh.Type(), c.typ)
			}
			if ino, ok := HandleIno(fh.Type(), fh.Bytes()); !ok || ino != st.Ino {
				t.Errorf("HandleIno = %d, %v; want st_ino %d", ino, ok, st.Ino)
			}
		})
	}
	for _, c := range []struct {
		typ int32
		b   []byte
	}{{fileIDIno32Gen, make([]byte, 7)}, {fileIDIno64Gen, make([]byte, 11)}, {fileIDBtrfs, make([]byte, 19)}, {0xff, make([]byte, 32)}, {0, make([]byte, 8)}} {
		if ino, ok := HandleIno(c.typ, c.b); ok {
			t.Errorf("HandleIno(%#x, %d bytes) = %d, true; want refused", c.typ, len(c.b), ino)
		}
	}
}

// TestDemote: with two directories of one filesystem registered, the first
// on its own mount and the second a bind mount of a subdirectory, a file
// under the bind mount opened by handle is named through the first
// directory's mount until Demote moves it back (a reload retired its
// tree); then through the bind mount, also when the descriptor on the
// demoted directory was in use at the Demote.
func TestDemote(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	retired, sub := filepath.Join(mnt.Dir, "retired"), filepath.Join(mnt.Dir, "sub")
	for _, d := range []string{retired, sub} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f := filepath.Join(sub, "f")
	if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	bind := t.TempDir()
	if err := unix.Mount(sub, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() {
		if err := testfs.UnmountRetry(bind); err != nil {
			t.Errorf("unmount %s: %v", bind, err)
		}
	})
	for _, c := range []struct{ inUse, addedAfter bool }{{false, false}, {true, false}, {false, true}} {
		inUse := c.inUse
		h := NewHandles()
		dev, err := h.AddMount(retired)
		if err != nil {
			t.Fatal(err)
		}
		if !c.addedAfter {
			if _, err := h.AddMount(bind); err != nil {
				t.Fatal(err)
			}
		}
		_, hd := handleOf(t, h, f)
		name := func() string {
			t.Helper()
			p, ok, err := h.PathOfHandle(dev, hd)
			if err != nil || !ok {
				t.Fatalf("PathOfHandle: %q, %v, %v", p, ok, err)
			}
			return p
		}
		if got := name(); got != f {
			t.Errorf("before Demote: named %q, want %q (through the first directory's mount)", got, f)
		}
		if c.addedAfter {
			// A reload: the retired root goes first, then the new
			// root is registered.
			h.Demote(retired)
			if _, err := h.AddMount(bind); err != nil {
				t.Fatal(err)
			}
		}
		if inUse {
			if _, err := h.acquire(dev); err != nil {
				t.Fatal(err)
			}
		}
		h.Demote(retired)
		if inUse {
			h.release(dev)
		}
		if got, want := name(), filepath.Join(bind, "f"); got != want {
			t.Errorf("after Demote (descriptor in use: %v, the other directory registered after: %v): named %q, want %q", inUse, c.addedAfter, got, want)
		}
		h.AddMount(retired) // served again
		h.Demote(bind)
		if got := name(); got != f {
			t.Errorf("a demoted directory registered again: named %q, want %q", got, f)
		}
		h.Close()
	}
}

// TestAcquireMountPoint opens files by handle, and error cursors
// (DirCursor), when every registered directory of their filesystem is
// gone from view but the filesystem is still mounted: through a mount
// point from the mount table. Once the filesystem is mounted nowhere, the
// error is ENODEV.
func TestAcquireMountPoint(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	cases := []struct {
		name string
		// hide makes dir lead elsewhere, or nowhere.
		hide func(t *testing.T, dir string)
	}{
		{"renamed", func(t *testing.T, dir string) {
			if err := os.Rename(dir, dir+".moved"); err != nil {
				t.Fatal(err)
			}
		}},
		{"mounted over", func(t *testing.T, dir string) {
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
				testfs.Missing(t, "mount tmpfs: %v", err)
			}
			t.Cleanup(func() {
				if err := testfs.UnmountRetry(dir); err != nil {
					t.Errorf("unmount %s: %v", dir, err)
				}
			})
		}},
		{"bind mount unmounted", func(t *testing.T, dir string) {
			if err := testfs.UnmountRetry(dir); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(mnt.Dir, filepath.Base(t.Name()))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(dir, "f")
			if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			registered := dir
			if c.name == "bind mount unmounted" {
				registered = t.TempDir()
				if err := unix.Mount(dir, registered, "", unix.MS_BIND, ""); err != nil {
					t.Fatalf("bind mount: %v", err)
				}
			}
			h := NewHandles()
			defer h.Close()
			dev, err := h.AddMount(registered)
			if err != nil {
				t.Fatal(err)
			}
			key, hd := handleOf(t, h, f)
			c.hide(t, registered)
			if st, err := StatPath(registered); err == nil && st.Dev == dev {
				t.Fatalf("%s still leads to the filesystem", registered)
			}
			file, err := h.OpenHandle(hd, key)
			if err != nil {
				t.Fatalf("OpenHandle with %s %s: %v, want the file opened through %s", registered, c.name, err, mnt.Dir)
			}
			file.Close()
			h.mu.Lock()
			fdDir := h.mounts[dev].fdDir
			h.mu.Unlock()
			if fdDir != mnt.Dir {
				t.Errorf("opened through %q, want the mount point %q", fdDir, mnt.Dir)
			}
			c2, err := DirCursor(registered, dev)
			if err != nil {
				t.Fatalf("DirCursor with %s %s: %v, want one at the mount point", registered, c.name, err)
			}
			if err := c2.Check(); err != nil {
				t.Errorf("the error cursor's check: %v", err)
			}
			c2.Close()
		})
	}
	t.Run("unmounted", func(t *testing.T) {
		other := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
		f := filepath.Join(other.Dir, "f")
		if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
		h := NewHandles()
		defer h.Close()
		if _, err := h.AddMount(other.Dir); err != nil {
			t.Fatal(err)
		}
		key, hd := handleOf(t, h, f)
		dev := key.Dev
		if err := other.Unmount(); err != nil {
			t.Fatal(err)
		}
		if c, err := DirCursor(other.Dir, dev); !errors.Is(err, unix.ENODEV) {
			if err == nil {
				c.Close()
			}
			t.Errorf("DirCursor on an unmounted filesystem: %v, want ENODEV", err)
		}
		if file, err := h.OpenHandle(hd, key); !errors.Is(err, unix.ENODEV) {
			if err == nil {
				file.Close()
			}
			t.Errorf("OpenHandle on an unmounted filesystem: %v, want ENODEV", err)
		}
	})
}

// handleOf returns the key of file f and its handle from h.
func handleOf(t *testing.T, h *Handles, f string) (Key, Handle) {
	t.Helper()
	key, _, err := Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	hd, err := h.HandleOf(f, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, hd
}
