package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/policy"
	"flusherd/sysfs"
	"flusherd/tree"
)

// fileSet is the files of one size in one directory, made by makeSet;
// the plug methods below each write such a set back.
type fileSet struct {
	name  string
	paths []string
	size  int
}

func makeSet(dir, name string, n, size int) (*fileSet, error) {
	s := &fileSet{name: name, size: size}
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for i := range n {
		p := filepath.Join(d, fmt.Sprintf("f%06d", i))
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			return nil, err
		}
		s.paths = append(s.paths, p)
	}
	return s, nil
}

// redirty rewrites every file in full, leaving its pages dirty.
func (s *fileSet) redirty() error {
	buf := make([]byte, s.size)
	for i := range buf {
		buf[i] = byte(i * 13)
	}
	for _, p := range s.paths {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt(buf, 0); err != nil {
			f.Close()
			return err
		}
		f.Close()
	}
	return nil
}

// dirtyPages sums cachestat's dirty+writeback pages over the set.
func (s *fileSet) dirtyPages() uint64 {
	var n uint64
	for _, p := range s.paths {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var cs unix.Cachestat_t
		if unix.Cachestat(uint(fd), &unix.CachestatRange{}, &cs, 0) == nil {
			n += cs.Dirty + cs.Writeback
		}
		unix.Close(fd)
	}
	return n
}

// waitClean sweeps until the set has no dirty or writeback pages.
func (s *fileSet) waitClean() {
	for s.dirtyPages() != 0 {
		time.Sleep(time.Millisecond)
	}
}

// countingOpener counts the system calls flusherd makes on files. It opens
// by file handle, as the daemon does when it runs as root.
type countingOpener struct {
	inner *inode.Handles
	n     atomic.Int64
}

// RemoveMount implements bdi.Handles.
func (c *countingOpener) RemoveMount(dev uint64) { c.inner.RemoveMount(dev) }

func (c *countingOpener) HandleOf(path string, key inode.Key) (inode.Handle, error) {
	return c.inner.HandleOf(path, key) // at marking time, not timed
}

func (c *countingOpener) OpenHandle(h inode.Handle, key inode.Key) (inode.File, error) {
	c.n.Add(1) // open_by_handle_at
	f, err := c.inner.OpenHandle(h, key)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, n: &c.n}, nil
}

func (c *countingOpener) Open(path string, key inode.Key) (inode.File, error) {
	c.n.Add(4) // openat2(O_PATH), fstat, open(/proc/self/fd/N), close(O_PATH)
	f, err := c.inner.Open(path, key)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, n: &c.n}, nil
}

type countingFile struct {
	inode.File
	n *atomic.Int64
}

func (f *countingFile) Cachestat(off, n int64) (uint64, uint64, error) {
	f.n.Add(1)
	return f.File.Cachestat(off, n)
}
func (f *countingFile) StartWriteback(off, n int64) error {
	f.n.Add(1)
	return f.File.StartWriteback(off, n)
}
func (f *countingFile) DataSync() error { f.n.Add(1); return f.File.DataSync() }

// Size counts the fstat a file opened by handle makes on its first call.
func (f *countingFile) Size() (int64, error) { f.n.Add(1); return f.File.Size() }

func (f *countingFile) Close() error { f.n.Add(1); return f.File.Close() }
func (f *countingFile) Syncfs() error {
	f.n.Add(1)
	return f.File.(interface{ Syncfs() error }).Syncfs()
}

type plugStat struct {
	syscalls, requests, merges, batches uint64
}

// flusherd writes the set back with flusherd's engine (the package bdi
// writeback goroutine with real system calls): every file is marked dirty as
// the watcher would, then drained (the shutdown path: all dirty inodes,
// regardless of age) until flusherd itself has seen each clean.
// The marking is done before the timed part; the returned function is
// timed.
func flusherdMethod(s *fileSet, plugOn, integrity bool, depth int, st *plugStat) (func() error, error) {
	sys := sysfs.Default()
	op := &countingOpener{inner: inode.NewHandles()}
	if _, err := op.inner.AddMount(filepath.Dir(s.paths[0])); err != nil {
		return nil, err
	}
	reg := bdi.NewRegistry(bdi.Options{
		Config: bdi.Config{
			DirtyWritebackInterval: time.Hour,
			MinPause:               time.Millisecond,
			MaxPause:               100 * time.Millisecond,
			WriteChunk:             4 << 20,
			Requeue:                policy.IOWait,
			PlugEnabled:            plugOn,
			MaxPending:             256,
			QueueDepth:             depth,
			IntegritySyncfs:        64,
			AttemptTimeout:         time.Minute,
		},
		Resolve: func(dev uint64, path string) (string, error) { return sys.BdiName(dev, -1) },
		Opener:  op,
		Handles: op,
	})
	t := tree.Tree{Mode: tree.ModeWriteback, Expire: time.Hour}
	if integrity {
		t.Mode = tree.ModeIntegrity
	}
	for _, p := range s.paths {
		key, _, err := inode.Stat(p)
		if err != nil {
			reg.Stop()
			return nil, err
		}
		if err := reg.MarkInodeDirty(p, key, "", t); err != nil {
			reg.Stop()
			return nil, err
		}
	}
	return func() error {
		defer reg.Stop()
		op.n.Store(0)
		for _, wb := range reg.Devices() {
			if err := wb.Drain(context.Background(), "bench"); err != nil {
				return err
			}
			snap := wb.Snapshot()
			st.requests, st.merges, st.batches = snap.PlugRequests, snap.PlugMerges, snap.PlugBatches
		}
		st.syscalls = uint64(op.n.Load())
		return nil
	}, nil
}

// perFileFdatasync opens each file, fdatasyncs it and closes it, in order.
func perFileFdatasync(s *fileSet) error {
	for _, p := range s.paths {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		err = unix.Fdatasync(fd)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// perFileStartWriteback opens each file, starts its writeback with
// sync_file_range(SYNC_FILE_RANGE_WRITE) and closes it, in order, on one
// thread: the floor of writing back file by file from user space (three
// system calls per file), whatever else a flusher does.
func perFileStartWriteback(s *fileSet) error {
	for _, p := range s.paths {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		err = unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// engineCalls makes, file by file on one goroutine, the system calls
// flusherd's whole-file attempt makes, with no engine around them:
// open_by_handle_at (the handles are taken before the timed part, as the
// daemon takes them when it marks a file), cachestat, sync_file_range
// (SYNC_FILE_RANGE_WRITE), cachestat, close. Method (h): between (a) and
// (e), it tells what the calls cost from what the engine adds.
func engineCalls(s *fileSet, _ *plugStat) (func() error, error) {
	calls, err := engineTargets(s)
	if err != nil {
		return nil, err
	}
	return func() error {
		for i := range calls.ts {
			if _, err := calls.attempt(i); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// engineCallsUntilClean is engineCalls, then ends as (a) does, with every
// file clean: each file whose second cachestat still showed pages under
// writeback is opened again and looked at (open_by_handle_at, cachestat,
// close) until it shows none, a round over those files at a time.
func engineCallsUntilClean(s *fileSet, _ *plugStat) (func() error, error) {
	calls, err := engineTargets(s)
	if err != nil {
		return nil, err
	}
	return func() error {
		var busy []int
		for i := range calls.ts {
			b, err := calls.attempt(i)
			if err != nil {
				return err
			}
			if b {
				busy = append(busy, i)
			}
		}
		for len(busy) > 0 {
			next := busy[:0]
			for _, i := range busy {
				b, err := calls.look(i)
				if err != nil {
					return err
				}
				if b {
					next = append(next, i)
				}
			}
			busy = next
		}
		return nil
	}, nil
}

// attempt makes the engine's whole-file attempt calls on file i
// (open_by_handle_at, cachestat, sync_file_range, cachestat, close) and
// reports whether its second cachestat still showed pages dirty or under
// writeback.
func (c handleTargets) attempt(i int) (busy bool, err error) {
	f, err := c.h.OpenHandle(c.ts[i].h, c.ts[i].key)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, _, err := f.Cachestat(0, 0); err != nil {
		return false, err
	}
	if err := f.StartWriteback(0, 0); err != nil {
		return false, err
	}
	dirty, wb, err := f.Cachestat(0, 0)
	return dirty+wb > 0, err
}

// look opens file i by handle and reports whether cachestat shows pages
// dirty or under writeback.
func (c handleTargets) look(i int) (busy bool, err error) {
	f, err := c.h.OpenHandle(c.ts[i].h, c.ts[i].key)
	if err != nil {
		return false, err
	}
	defer f.Close()
	dirty, wb, err := f.Cachestat(0, 0)
	return dirty+wb > 0, err
}

// handleTargets are the files of a set as the engine opens them: by
// handle, through h.
type handleTargets struct {
	h  *inode.Handles
	ts []struct {
		h   inode.Handle
		key inode.Key
	}
}

// engineTargets looks up the handle and key of every file of s.
func engineTargets(s *fileSet) (handleTargets, error) {
	out := handleTargets{h: inode.NewHandles()}
	if _, err := out.h.AddMount(filepath.Dir(s.paths[0])); err != nil {
		return out, err
	}
	out.ts = make([]struct {
		h   inode.Handle
		key inode.Key
	}, len(s.paths))
	for i, p := range s.paths {
		key, _, err := inode.Stat(p)
		if err != nil {
			return out, err
		}
		if out.ts[i].h, err = out.h.HandleOf(p, key); err != nil {
			return out, err
		}
		out.ts[i].key = key
	}
	return out, nil
}

// engineSyncfsCalls is (h) with syncfs(2) in place of sync_file_range:
// for each 256 files, each is opened by handle and its pages counted
// (cachestat), one syncfs writes the filesystem back, then each file's
// pages are counted again and it is closed. Method (s): what a writeback
// pass that hands a batch to the kernel's flusher in one call would cost.
func engineSyncfsCalls(s *fileSet, _ *plugStat) (func() error, error) {
	calls, err := engineTargets(s)
	if err != nil {
		return nil, err
	}
	h, ts := calls.h, calls.ts
	return func() error {
		const batch = 256
		fs := make([]inode.File, 0, batch)
		closeAll := func() {
			for _, f := range fs {
				f.Close()
			}
			fs = fs[:0]
		}
		defer closeAll()
		for i := 0; i < len(ts); i += batch {
			for _, t := range ts[i:min(i+batch, len(ts))] {
				f, err := h.OpenHandle(t.h, t.key)
				if err != nil {
					return err
				}
				fs = append(fs, f)
				if _, _, err = f.Cachestat(0, 0); err != nil {
					return err
				}
			}
			if err := fs[0].(interface{ Syncfs() error }).Syncfs(); err != nil {
				return err
			}
			for _, f := range fs {
				if _, _, err := f.Cachestat(0, 0); err != nil {
					return err
				}
			}
			closeAll()
		}
		return nil
	}, nil
}

// parallelStartWriteback is (e) on one thread per CPU, each taking every
// n-th file: method (p), which shows whether the filesystem lets
// file-by-file writeback run in parallel.
func parallelStartWriteback(s *fileSet) error {
	return syncRangeThreads(s, runtime.GOMAXPROCS(0), unix.SYNC_FILE_RANGE_WRITE)
}

// parallelSyncRange writes each file back and waits for it, on 8
// threads: open, sync_file_range(SYNC_FILE_RANGE_WAIT_BEFORE|WRITE|
// WAIT_AFTER) (WB_SYNC_ALL, no journal commit), close. It is what a flusher
// that learns each file's result in its one call would do; method (f),
// not run by default.
func parallelSyncRange(s *fileSet) error {
	return syncRangeThreads(s, 8, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
}

// syncRangeThreads opens each file of the set, calls sync_file_range with
// flags on the whole of it and closes it, on n threads, each taking every
// n-th file; it stops a thread at its first error and returns them all.
func syncRangeThreads(s *fileSet, n int, flags int) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := range n {
		wg.Go(func() {
			for i := w; i < len(s.paths); i += n {
				fd, err := unix.Open(s.paths[i], unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					errs[w] = err
					return
				}
				err = unix.SyncFileRange(fd, 0, 0, flags)
				unix.Close(fd)
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
