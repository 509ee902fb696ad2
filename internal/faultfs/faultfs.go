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
	"flag"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

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

	// closing ends every delay (Unmount, Abort).
	closing   chan struct{}
	closeOnce sync.Once
}

// delay sleeps d, or until the filesystem is being unmounted or aborted.
func (f *FS) delay(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-f.closing:
	}
}

// endDelays ends the delays under way and those to come.
func (f *FS) endDelays() { f.closeOnce.Do(func() { close(f.closing) }) }

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
	f := &FS{Dir: dir, Backing: backing, counts: map[string]int{}, closing: make(chan struct{})}
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
	f.endDelays()
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
		f.fs.delay(fl.WriteDelay)
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
		f.fs.delay(fl.FlushDelay)
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
		n.fs.delay(fl.OpenDelay)
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
		n.fs.delay(fl.OpendirDelay)
	}
	return n.LoopbackNode.OpendirHandle(ctx, flags)
}

func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	fl := n.fs.get("fsync")
	if fl.FsyncDelay > 0 {
		n.fs.delay(fl.FsyncDelay)
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
	// The server runs in the test's own process: a request it never
	// answers (a descriptor of the filesystem closed by a child between
	// fork and exec flushes its dirty pages) holds that thread in D
	// state, and the process cannot exit, not even at the test binary's
	// -timeout. Near that deadline the connection is aborted, so that
	// the waiting calls fail and the run ends.
	limit := 10 * time.Minute
	if fl := flag.Lookup("test.timeout"); fl != nil {
		if d, err := time.ParseDuration(fl.Value.String()); err == nil && d > 0 {
			limit = time.Until(loaded.Add(d)) - 20*time.Second
		}
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-time.After(limit):
			err := f.Abort()
			fmt.Fprintf(os.Stderr, "faultfs: %s was still mounted %s after its mount, near the test binary's deadline: its FUSE connection was aborted (error: %v)\n", f.Dir, limit.Round(time.Second), err)
		}
	}()
	t.Cleanup(func() {
		defer close(stop)
		if err := f.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// loaded is about when the test binary started (its -timeout counts from
// then).
var loaded = time.Now()

// fusectlDir is where the fusectl filesystem shows FUSE connections.
const fusectlDir = "/sys/fs/fuse/connections"

// Abort aborts the filesystem's FUSE connection (fusectl's abort file,
// mounting fusectl if it is not): every request waiting on the server
// fails (ECONNABORTED), and later calls on the filesystem fail.
func (f *FS) Abort() error {
	var st syscall.Stat_t
	if err := syscall.Stat(f.Dir, &st); err != nil {
		return err
	}
	// The connection's name is the superblock's dev_t as the kernel
	// encodes it (MKDEV: major << 20 | minor).
	dev := uint64(unix.Major(st.Dev))<<20 | uint64(unix.Minor(st.Dev))
	abort := fmt.Sprintf("%s/%d/abort", fusectlDir, dev)
	if _, err := os.Stat(abort); err != nil {
		if merr := unix.Mount("fusectl", fusectlDir, "fusectl", 0, ""); merr != nil {
			return fmt.Errorf("faultfs: no %s (%v), and fusectl could not be mounted: %w", abort, err, merr)
		}
	}
	err := os.WriteFile(abort, []byte("1"), 0)
	f.endDelays() // the server's handlers return (their replies go nowhere)
	return err
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
