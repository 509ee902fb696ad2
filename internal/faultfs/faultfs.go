// Package faultfs is a FUSE passthrough filesystem (github.com/hanwen/go-fuse
// loopback) that can make opens and fsyncs fail or stall on demand. It is
// mounted with the kernel's writeback cache (FUSE_WRITEBACK_CACHE), so writes
// through it leave dirty pages in the page cache exactly as on a disk
// filesystem, and flusherd's writeback of them is real: sync_file_range and
// fdatasync turn into FUSE WRITE and FSYNC requests served here.
//
// It is for tests and benchmarks of flusherd's handling of blocked and
// failing files. Mounting needs root (mount(2) of /dev/fuse).
package faultfs

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"flusherd/internal/testfs"
)

// Faults says what to do to the operations that reach the filesystem. The
// zero value injects nothing.
type Faults struct {
	OpenErr   syscall.Errno // returned by OPEN (e.g. EAGAIN, EMFILE)
	OpenDelay time.Duration // OPEN sleeps this long first
	// OpendirDelay: OPENDIR (open(2) of a directory) sleeps this long
	// first: a slow server, seen from whatever opens a tree's root.
	OpendirDelay time.Duration
	FsyncErr     syscall.Errno // returned by FSYNC (e.g. EAGAIN, EIO)
	FsyncDelay   time.Duration // FSYNC sleeps this long first
	// FlushDelay: FLUSH (sent by every close(2) of the file) sleeps this
	// long first: a server that stalls, seen from the closer.
	FlushDelay time.Duration
	// WriteErr is returned by WRITE: with the writeback cache, the
	// kernel's writeback of dirty pages fails (it records the error for
	// fsync and marks the pages clean: the data is lost).
	WriteErr syscall.Errno
	// WriteDelay: WRITE sleeps this long first (a stalled server: the
	// kernel's writeback of the file waits, and so does every close(2)
	// of it, whose flush waits for that writeback).
	WriteDelay time.Duration
	// WriteBPS paces WRITE to this many bytes a second, over all files
	// (a slow disk under whatever sits on the files); 0: no pacing.
	WriteBPS int64
}

// FS is a mounted faultfs.
type FS struct {
	Dir     string // mount point
	Backing string // directory the files really live in
	server  *fuse.Server

	// pace serialises paced writes, so that WriteBPS is the rate of the
	// whole filesystem, as a disk's is.
	pace sync.Mutex

	mu     sync.Mutex
	faults Faults
	// Counts of operations seen, by name.
	counts map[string]int
}

// Set replaces the faults.
func (f *FS) Set(fl Faults) {
	f.mu.Lock()
	f.faults = fl
	f.mu.Unlock()
}

func (f *FS) get(op string) Faults {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[op]++
	return f.faults
}

// Count returns how many operations op ("open", "fsync") were served.
func (f *FS) Count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[op]
}

// Mount mounts a faultfs at dir over the directory backing, with the
// kernel's writeback cache. Unmount it with Unmount.
func Mount(dir, backing string) (*FS, error) { return mount(dir, backing, true) }

func mount(dir, backing string, writebackCache bool) (*FS, error) {
	f := &FS{Dir: dir, Backing: backing, counts: map[string]int{}}
	lroot, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, err
	}
	ln := lroot.(*fs.LoopbackNode)
	rootNode := &node{LoopbackNode: ln, fs: f}
	ln.RootData.RootNode = rootNode
	var caps uint64
	if writebackCache {
		caps = fuse.CAP_WRITEBACK_CACHE
	}
	// libfuse's default entry and attribute timeouts.
	second := time.Second
	server, err := fs.Mount(dir, rootNode, &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:            "faultfs",
			Name:              "faultfs",
			DirectMountStrict: true,
			ExtraCapabilities: caps,
		},
		EntryTimeout: &second,
		AttrTimeout:  &second,
	})
	if err != nil {
		return nil, fmt.Errorf("faultfs: mount %s: %w", dir, err)
	}
	if err := server.WaitMount(); err != nil {
		server.Unmount()
		return nil, err
	}
	f.server = server
	return f, nil
}

// Unmount unmounts the filesystem, retrying briefly while it is busy.
func (f *FS) Unmount() error {
	f.Set(Faults{})
	var err error
	for range 50 {
		if err = f.server.Unmount(); err == nil {
			f.server.Wait()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Last resort: detach lazily so the test run can go on.
	if derr := syscall.Unmount(f.Dir, syscall.MNT_DETACH); derr == nil {
		return fmt.Errorf("faultfs: %s was busy; detached lazily: %w", f.Dir, err)
	}
	return err
}

type node struct {
	*fs.LoopbackNode
	fs *FS
}

// WrapChild makes every node of the tree a faulting one.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fs: n.fs}
}

var (
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeWrapChilder    = (*node)(nil)
)

// file is a loopback file handle whose WRITE can fail (Faults.WriteErr);
// every other operation goes to the loopback handle.
type file struct {
	fs.FileHandle
	fs *FS
}

var (
	_ fs.FileReader    = (*file)(nil)
	_ fs.FileWriter    = (*file)(nil)
	_ fs.FileFlusher   = (*file)(nil)
	_ fs.FileFsyncer   = (*file)(nil)
	_ fs.FileReleaser  = (*file)(nil)
	_ fs.FileGetattrer = (*file)(nil)
	_ fs.FileSetattrer = (*file)(nil)
	_ fs.FileLseeker   = (*file)(nil)
	_ fs.FileAllocater = (*file)(nil)
)

func (f *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return f.FileHandle.(fs.FileReader).Read(ctx, dest, off)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	fl := f.fs.get("write")
	if fl.WriteDelay > 0 {
		time.Sleep(fl.WriteDelay)
	}
	if fl.WriteErr != 0 {
		return 0, fl.WriteErr
	}
	if fl.WriteBPS > 0 {
		f.fs.pace.Lock()
		time.Sleep(time.Duration(int64(len(data)) * int64(time.Second) / fl.WriteBPS))
		f.fs.pace.Unlock()
	}
	return f.FileHandle.(fs.FileWriter).Write(ctx, data, off)
}

func (f *file) Flush(ctx context.Context) syscall.Errno {
	if fl := f.fs.get("flush"); fl.FlushDelay > 0 {
		time.Sleep(fl.FlushDelay)
	}
	return f.FileHandle.(fs.FileFlusher).Flush(ctx)
}

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return f.FileHandle.(fs.FileFsyncer).Fsync(ctx, flags)
}

func (f *file) Release(ctx context.Context) syscall.Errno {
	return f.FileHandle.(fs.FileReleaser).Release(ctx)
}

func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return f.FileHandle.(fs.FileGetattrer).Getattr(ctx, out)
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.FileHandle.(fs.FileSetattrer).Setattr(ctx, in, out)
}

func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return f.FileHandle.(fs.FileLseeker).Lseek(ctx, off, whence)
}

func (f *file) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return f.FileHandle.(fs.FileAllocater).Allocate(ctx, off, size, mode)
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if fh != nil {
		fh = &file{FileHandle: fh, fs: n.fs}
	}
	return in, fh, fl, errno
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fl := n.fs.get("open")
	if fl.OpenDelay > 0 {
		time.Sleep(fl.OpenDelay)
	}
	if fl.OpenErr != 0 {
		return nil, 0, fl.OpenErr
	}
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if fh != nil {
		fh = &file{FileHandle: fh, fs: n.fs}
	}
	return fh, fuseFlags, errno
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if fl := n.fs.get("opendir"); fl.OpendirDelay > 0 {
		time.Sleep(fl.OpendirDelay)
	}
	return n.LoopbackNode.OpendirHandle(ctx, flags)
}

func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	fl := n.fs.get("fsync")
	if fl.FsyncDelay > 0 {
		time.Sleep(fl.FsyncDelay)
	}
	if fl.FsyncErr != 0 {
		return fl.FsyncErr
	}
	if fsy, ok := f.(fs.FileFsyncer); ok {
		return fsy.Fsync(ctx, flags)
	}
	return 0
}

// MountT mounts a faultfs (with the writeback cache) over a fresh backing
// directory for a test, skips the test when FUSE is not available here, and
// unmounts at cleanup.
func MountT(t testing.TB) *FS { t.Helper(); return mountT(t, true) }

// MountWriteThroughT is MountT without the kernel's writeback cache: every
// write(2) to a file is a WRITE request that waits for the server, as a
// slow disk under a loop device makes its writer wait.
func MountWriteThroughT(t testing.TB) *FS { t.Helper(); return mountT(t, false) }

func mountT(t testing.TB, writebackCache bool) *FS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("faultfs needs root")
	}
	if err := Available(); err != nil {
		testfs.Missing(t, "%v", err)
	}
	testfs.HoldMounts(t) // released after the unmount below
	f, err := mount(t.TempDir(), t.TempDir(), writebackCache)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// Available reports whether a faultfs can be mounted here: root and
// /dev/fuse.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("faultfs needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("faultfs needs /dev/fuse: %w", err)
	}
	return nil
}
