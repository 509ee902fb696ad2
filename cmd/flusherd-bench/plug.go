package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/internal/testfs"
	"flusherd/policy"
	"flusherd/sysfs"
)

// benchFS makes and mounts a filesystem for the bench with testfs (the
// tests' own loop-mount helper); Close undoes it.
func benchFS(opt testfs.Options) (*testfs.FS, error) { return testfs.New(opt) }

// closeFS unmounts a bench filesystem and reports what went wrong.
func closeFS(fs *testfs.FS, who string) {
	if err := fs.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "flusherd-bench %s: %v\n", who, err)
	}
}

// syncAndDrop cleans the filesystem and drops the page cache.
func syncAndDrop(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	unix.Syncfs(fd)
	unix.Close(fd)
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}

// sysctl sets a vm sysctl and returns a function that restores it. The
// *_bytes knobs and their *_ratio twins exclude each other (writing one
// zeroes the other, and 0 is not a valid *_bytes), so for those the one
// that was in force is what is written back.
// holdKernelFlusher raises vm.dirty_background_bytes and vm.dirty_bytes to
// the given byte counts and vm.dirty_expire_centisecs to an hour, so that
// the kernel's own flusher leaves dirty files alone during a run; restore
// puts back the values it found (also on error).
func holdKernelFlusher(background, dirty int64) (restore func(), err error) {
	var undo []func()
	restore = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for _, sc := range [][2]string{{"dirty_background_bytes", fmt.Sprint(background)}, {"dirty_bytes", fmt.Sprint(dirty)}, {"dirty_expire_centisecs", "360000"}} {
		r, err := sysctl(sc[0], sc[1])
		if err != nil {
			restore()
			return nil, err
		}
		undo = append(undo, r)
	}
	return restore, nil
}

func sysctl(name, value string) (func(), error) {
	p := "/proc/sys/vm/" + name
	old, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	restoreName, restoreValue := name, old
	if twin, ok := strings.CutSuffix(name, "_bytes"); ok && strings.TrimSpace(string(old)) == "0" {
		restoreName = twin + "_ratio"
		if restoreValue, err = os.ReadFile("/proc/sys/vm/" + restoreName); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return nil, err
	}
	return func() {
		if err := os.WriteFile("/proc/sys/vm/"+restoreName, restoreValue, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "flusherd-bench: restoring vm.%s: %v\n", restoreName, err)
		}
	}, nil
}

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
	})
	for _, p := range s.paths {
		key, _, err := inode.Stat(p)
		if err != nil {
			reg.Stop()
			return nil, err
		}
		if err := reg.MarkInodeDirty(p, key, "", bdi.Tree{Expire: time.Hour, Integrity: integrity}); err != nil {
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
	h, ts := calls.h, calls.ts
	return func() error {
		for _, t := range ts {
			f, err := h.OpenHandle(t.h, t.key)
			if err != nil {
				return err
			}
			_, _, err = f.Cachestat(0, 0)
			if err == nil {
				err = f.StartWriteback(0, 0)
			}
			if err == nil {
				_, _, err = f.Cachestat(0, 0)
			}
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}, nil
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

// processCPU returns the CPU time (user and system) the bench process has
// used so far (getrusage(RUSAGE_SELF)): the engine's goroutines and the
// system calls they make, not the kernel's flusher threads.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineBusy returns the CPU time all CPUs of the machine have spent
// busy so far (/proc/stat's first line: every field but idle and
// iowait, in USER_HZ ticks, 100 per second on Linux): with processCPU, it
// tells the bench's own CPU from the kernel threads' (the loop device's
// workers, the filesystem's) and shows whether the machine was the limit.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var busy int64
	for i, f := range strings.Fields(line)[1:] {
		var v int64
		fmt.Sscan(f, &v)
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

func syncfs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

type method struct {
	key, name string
	// prepare does the untimed set-up and returns the timed part.
	prepare func(s *fileSet, st *plugStat) (func() error, error)
}

func plain(run func(s *fileSet) error) func(*fileSet, *plugStat) (func() error, error) {
	return func(s *fileSet, _ *plugStat) (func() error, error) { return func() error { return run(s) }, nil }
}

func plugBench(args []string) int {
	fl := newFlags("plug", "time to clean a tree of dirty files with flusherd (plug on, off, integrity) against per-file loops and syncfs(2), on loop-mounted ext4 and xfs.", "go run ./cmd/flusherd-bench plug --fs ext4,xfs --large 0 --runs 3 --methods aep")
	fstypes := fl.String("fs", "ext4,xfs", "filesystems to run on")
	small := fl.Int("small", 20000, "number of 16 KiB files")
	large := fl.Int("large", 200, "number of 8 MiB files")
	runs := fl.Int("runs", 3, "runs of each method (the table shows medians)")
	only := fl.String("methods", "abcdei", "methods to run, of abcdefhipsu (d, syncfs, is always run: the ratios need it)")
	depth := fl.Int("queue-depth", 8, "flusherd's plug.queue_depth")
	cpuProfile := fl.String("cpuprofile", "", "write a CPU profile to this file, from the first timed run to the end (the re-dirtying between runs is in it)")
	if code, ok := parseFlags(fl, args); !ok {
		return code
	}
	if err := letters("methods", *only, "abcdefhipsu"); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
		return 2
	}
	if err := needMkfs(strings.Split(*fstypes, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "flusherd-bench plug: needs root (loop devices, drop_caches)")
		return 1
	}
	// Keep the kernel's own flusher out of the way while files are
	// dirty: no background writeback below 4 GiB, no expiry for an hour.
	restore, err := holdKernelFlusher(4<<30, 8<<30)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
		return 1
	}
	defer restore()
	methods := []method{
		{"a", "(a) flusherd, plug on", func(s *fileSet, st *plugStat) (func() error, error) {
			return flusherdMethod(s, true, false, *depth, st)
		}},
		{"b", "(b) flusherd, plug.enabled = false", func(s *fileSet, st *plugStat) (func() error, error) {
			return flusherdMethod(s, false, false, *depth, st)
		}},
		{"c", "(c) per-file fdatasync loop", plain(perFileFdatasync)},
		{"d", "(d) syncfs(2)", nil},
		{"e", "(e) per-file sync_file_range loop", plain(perFileStartWriteback)},
		{"f", "(f) per-file write and wait, 8 threads", plain(parallelSyncRange)},
		{"h", "(h) flusherd's system calls in a loop", engineCalls},
		{"s", "(s) (h) with one syncfs per 256 files", engineSyncfsCalls},
		{"p", "(p) (e) on one thread per CPU", plain(parallelStartWriteback)},
		{"u", "(u) (e) with io_uring, 256 per submit", plain(uringStartWriteback)},
		{"i", "(i) flusherd, integrity mode", func(s *fileSet, st *plugStat) (func() error, error) { return flusherdMethod(s, true, true, *depth, st) }},
	}
	methods = slices.DeleteFunc(methods, func(m method) bool { return m.key != "d" && !strings.Contains(*only, m.key) })
	base, err := os.MkdirTemp("", "flusherd-bench-plug")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(base)
	var profile *os.File
	defer func() {
		if profile != nil {
			pprof.StopCPUProfile()
			profile.Close()
		}
	}()
	for _, fstype := range strings.Split(*fstypes, ",") {
		l, err := benchFS(testfs.Options{Type: fstype, SizeMB: 4096, DirectIO: true, ImageDir: base})
		if err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
			return 1
		}
		for _, spec := range []struct {
			name    string
			n, size int
		}{{"small", *small, 16 << 10}, {"large", *large, 8 << 20}} {
			if spec.n == 0 {
				continue
			}
			set, err := makeSet(l.Dir, spec.name, spec.n, spec.size)
			if err != nil {
				fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
				closeFS(l, "plug")
				return 1
			}
			times := map[string][]time.Duration{}
			cpus := map[string][]time.Duration{}
			busy := map[string][]time.Duration{}
			stats := map[string]plugStat{}
			for r := range *runs {
				for _, m := range methods {
					if err := syncAndDrop(l.Dir); err != nil {
						fmt.Fprintln(os.Stderr, err)
					}
					if err := set.redirty(); err != nil {
						fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
						closeFS(l, "plug")
						return 1
					}
					var st plugStat
					runIt := func() error { return syncfs(l.Dir) }
					if m.prepare != nil {
						if runIt, err = m.prepare(set, &st); err != nil {
							fmt.Fprintf(os.Stderr, "flusherd-bench plug: %s: %v\n", m.name, err)
							closeFS(l, "plug")
							return 1
						}
					}
					if *cpuProfile != "" && profile == nil {
						if profile, err = os.Create(*cpuProfile); err == nil {
							pprof.StartCPUProfile(profile)
						}
					}
					start, cpu0, busy0 := time.Now(), processCPU(), machineBusy()
					err = runIt()
					cpus[m.key] = append(cpus[m.key], processCPU()-cpu0)
					set.waitClean()
					el := time.Since(start)
					busy[m.key] = append(busy[m.key], machineBusy()-busy0)
					if err != nil {
						fmt.Fprintf(os.Stderr, "flusherd-bench plug: %s: %v\n", m.name, err)
					}
					times[m.key] = append(times[m.key], el)
					stats[m.key] = st
					fmt.Fprintf(os.Stderr, "%s %s run %d %s: %v\n", fstype, spec.name, r+1, m.key, el.Round(time.Millisecond))
				}
			}
			med := func(k string) time.Duration { return median(times[k]) }
			fmt.Printf("\n%s, %d files of %d KiB, direct-io loop device, median of %d interleaved runs\n", fstype, spec.n, spec.size>>10, *runs)
			var cells [][]string
			for _, m := range methods {
				if len(times[m.key]) == 0 {
					continue
				}
				var all []string
				for _, d := range times[m.key] {
					all = append(all, fmt.Sprintf("%.2f", d.Seconds()))
				}
				cells = append(cells, []string{m.name, fmt.Sprintf("%.2fs", med(m.key).Seconds()),
					fmt.Sprintf("%.2f", med(m.key).Seconds()/med("d").Seconds()),
					fmt.Sprintf("%.1f", float64(median(cpus[m.key]).Microseconds())/float64(spec.n)),
					fmt.Sprintf("%.1f", float64(median(busy[m.key]).Microseconds())/float64(spec.n)), strings.Join(all, " ")})
			}
			markdownTable(os.Stdout, []string{"method", "time", "x syncfs", "process CPU µs/file", "machine CPU µs/file", "all runs"}, cells)
			var ratios []string
			for _, r := range [][2]string{{"a", "d"}, {"a", "e"}, {"a", "h"}, {"b", "a"}, {"c", "a"}, {"i", "d"}, {"c", "i"}} {
				if len(times[r[0]]) > 0 && len(times[r[1]]) > 0 {
					ratios = append(ratios, fmt.Sprintf("(%s)/(%s) %.2f", r[0], r[1], med(r[0]).Seconds()/med(r[1]).Seconds()))
				}
			}
			fmt.Printf("ratios: %s\n", strings.Join(ratios, ", "))
			for _, k := range []string{"a", "b", "i"} {
				st, ok := stats[k]
				if !ok {
					continue
				}
				mpb := 0.0
				if st.batches > 0 {
					mpb = float64(st.merges) / float64(st.batches)
				}
				fmt.Printf("(%s) last run: %.1f syscalls per file (through inode.File), %d requests, %d merges, %d batches, %.2f merges per batch\n",
					k, float64(st.syscalls)/float64(spec.n), st.requests, st.merges, st.batches, mpb)
			}
			os.RemoveAll(filepath.Join(l.Dir, spec.name))
		}
		closeFS(l, "plug")
	}
	return 0
}
