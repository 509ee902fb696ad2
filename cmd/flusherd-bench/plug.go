package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
)

// plugOpts are plug's flags.
type plugOpts struct {
	fstypes      []string
	small, large int
	runs, depth  int
	only         string
	cpuProfile   string
}

// plugSpec is one set of files: n files of size bytes.
type plugSpec struct {
	name    string
	n, size int
}

func plugBench(args []string) int {
	o, code, ok := plugOptions(args)
	if !ok {
		return code
	}
	// Keep the kernel's own flusher out of the way while files are
	// dirty: no background writeback below 4 GiB, no expiry for an hour.
	restore, err := holdKernelFlusher(4<<30, 8<<30)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
		return 1
	}
	defer restore()
	methods := plugMethods(o.only, o.depth)
	base, err := os.MkdirTemp("", "flusherd-bench-plug")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(base)
	prof := &lazyProfile{path: o.cpuProfile}
	defer prof.stop()
	for _, fstype := range o.fstypes {
		l, err := benchFS(testfs.Options{Type: fstype, SizeMB: 4096, DirectIO: true, ImageDir: base})
		if err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
			return 1
		}
		for _, spec := range []plugSpec{{"small", o.small, 16 << 10}, {"large", o.large, 8 << 20}} {
			if spec.n == 0 {
				continue
			}
			if err := plugSet(l, fstype, spec, o.runs, methods, prof); err != nil {
				fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
				closeFS(l, "plug")
				return 1
			}
		}
		closeFS(l, "plug")
	}
	return 0
}

// plugOptions parses and checks plug's flags and that it can run here. It
// reports false, with the exit code, when the bench is not to run.
func plugOptions(args []string) (plugOpts, int, bool) {
	fl := newFlags("plug", "time to clean a tree of dirty files with flusherd (plug on, off, integrity) against per-file loops and syncfs(2), on loop-mounted ext4 and xfs.", "go run ./cmd/flusherd-bench plug --fs ext4,xfs --large 0 --runs 3 --methods aep")
	fstypes := fl.String("fs", "ext4,xfs", "filesystems to run on")
	small := fl.Int("small", 20000, "number of 16 KiB files")
	large := fl.Int("large", 200, "number of 8 MiB files")
	runs := fl.Int("runs", 3, "runs of each method (the table shows medians)")
	only := fl.String("methods", "abcdei", "methods to run, of abcdefghipsu (d, syncfs, is always run: the ratios need it)")
	depth := fl.Int("queue-depth", 8, "flusherd's plug.queue_depth")
	cpuProfile := fl.String("cpuprofile", "", "write a CPU profile to this file, from the first timed run to the end (the re-dirtying between runs is in it)")
	if code, ok := parseFlags(fl, args); !ok {
		return plugOpts{}, code, false
	}
	o := plugOpts{fstypes: strings.Split(*fstypes, ","), small: *small, large: *large, runs: *runs, depth: *depth, only: *only, cpuProfile: *cpuProfile}
	if err := letters("methods", o.only, "abcdefghipsu"); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
		return o, 2, false
	}
	if err := needMkfs(o.fstypes); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench plug:", err)
		return o, 1, false
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "flusherd-bench plug: needs root (loop devices, drop_caches)")
		return o, 1, false
	}
	return o, 0, true
}

// plugMethods returns the methods of only, and (d) syncfs always, in the
// order they run; depth is flusherd's plug.queue_depth.
func plugMethods(only string, depth int) []method {
	methods := []method{
		{"a", "(a) flusherd, plug on", func(s *fileSet, st *plugStat) (func() error, error) {
			return flusherdMethod(s, true, false, depth, st)
		}},
		{"b", "(b) flusherd, plug.enabled = false", func(s *fileSet, st *plugStat) (func() error, error) {
			return flusherdMethod(s, false, false, depth, st)
		}},
		{"c", "(c) per-file fdatasync loop", plain(perFileFdatasync)},
		{"d", "(d) syncfs(2)", nil},
		{"e", "(e) per-file sync_file_range loop", plain(perFileStartWriteback)},
		{"f", "(f) per-file write and wait, 8 threads", plain(parallelSyncRange)},
		{"h", "(h) flusherd's system calls in a loop", engineCalls},
		{"g", "(g) (h), then each file looked at until clean, as (a) ends", engineCallsUntilClean},
		{"s", "(s) (h) with one syncfs per 256 files", engineSyncfsCalls},
		{"p", "(p) (e) on one thread per CPU", plain(parallelStartWriteback)},
		{"u", "(u) (e) with io_uring, 256 per submit", plain(uringStartWriteback)},
		{"i", "(i) flusherd, integrity mode", func(s *fileSet, st *plugStat) (func() error, error) { return flusherdMethod(s, true, true, depth, st) }},
	}
	return slices.DeleteFunc(methods, func(m method) bool { return m.key != "d" && !strings.Contains(only, m.key) })
}

type method struct {
	key, name string
	// prepare does the untimed set-up and returns the timed part.
	prepare func(s *fileSet, st *plugStat) (func() error, error)
}

func plain(run func(s *fileSet) error) func(*fileSet, *plugStat) (func() error, error) {
	return func(s *fileSet, _ *plugStat) (func() error, error) { return func() error { return run(s) }, nil }
}

// lazyProfile is --cpuprofile: started at the first timed run, stopped
// when the bench ends.
type lazyProfile struct {
	path string
	f    *os.File
}

func (p *lazyProfile) start() {
	if p.path == "" || p.f != nil {
		return
	}
	f, err := os.Create(p.path)
	if err == nil {
		p.f = f
		pprof.StartCPUProfile(f)
	}
}

func (p *lazyProfile) stop() {
	if p.f != nil {
		pprof.StopCPUProfile()
		p.f.Close()
	}
}

// plugTimes are a set's measures, per method key: the time to clean, the
// part of it the bench's own check took (checks), the bench's CPU and the
// machine's busy CPU of each run, and the plug counters of the last run.
type plugTimes struct {
	times, checks, cpus, busy map[string][]time.Duration
	stats                     map[string]plugStat
}

// plugSet makes spec's files on the filesystem l, times every method on
// them runs times (interleaved), prints the set's table, and removes the
// files.
func plugSet(l *testfs.FS, fstype string, spec plugSpec, runs int, methods []method, prof *lazyProfile) error {
	set, err := makeSet(l.Dir, spec.name, spec.n, spec.size)
	if err != nil {
		return err
	}
	t := plugTimes{times: map[string][]time.Duration{}, checks: map[string][]time.Duration{}, cpus: map[string][]time.Duration{},
		busy: map[string][]time.Duration{}, stats: map[string]plugStat{}}
	for r := range runs {
		for _, m := range methods {
			el, err := t.timeOne(l.Dir, set, m, prof)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "%s %s run %d %s: %v\n", fstype, spec.name, r+1, m.key, el.Round(time.Millisecond))
		}
	}
	fmt.Printf("\n%s, %d files of %d KiB, direct-io loop device, median of %d interleaved runs\n", fstype, spec.n, spec.size>>10, runs)
	t.print(spec.n, methods)
	os.RemoveAll(filepath.Join(l.Dir, spec.name))
	return nil
}

// timeOne cleans and re-dirties the set, then times method m and then
// the bench's check (waitClean) until the set is clean, and records both.
// An error of the method itself is printed and its time still recorded;
// an error returned stops the bench.
func (t plugTimes) timeOne(dir string, set *fileSet, m method, prof *lazyProfile) (time.Duration, error) {
	if err := syncAndDrop(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	if err := set.redirty(); err != nil {
		return 0, err
	}
	var st plugStat
	runIt := func() error { return syncfs(dir) }
	if m.prepare != nil {
		var err error
		if runIt, err = m.prepare(set, &st); err != nil {
			return 0, fmt.Errorf("%s: %w", m.name, err)
		}
	}
	prof.start()
	start, cpu0, busy0 := time.Now(), processCPU(), machineBusy()
	err := runIt()
	t.cpus[m.key] = append(t.cpus[m.key], processCPU()-cpu0)
	ran := time.Since(start)
	set.waitClean()
	el := time.Since(start)
	t.checks[m.key] = append(t.checks[m.key], el-ran)
	t.busy[m.key] = append(t.busy[m.key], machineBusy()-busy0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "flusherd-bench plug: %s: %v\n", m.name, err)
	}
	t.times[m.key] = append(t.times[m.key], el)
	t.stats[m.key] = st
	return el, nil
}

// print writes the table of a set of n files, the ratios between methods
// and the plug counters of flusherd's methods.
func (t plugTimes) print(n int, methods []method) {
	med := func(k string) time.Duration { return median(t.times[k]) }
	var cells [][]string
	for _, m := range methods {
		if len(t.times[m.key]) == 0 {
			continue
		}
		var all []string
		for _, d := range t.times[m.key] {
			all = append(all, fmt.Sprintf("%.2f", d.Seconds()))
		}
		cells = append(cells, []string{m.name, fmt.Sprintf("%.2fs", med(m.key).Seconds()),
			fmt.Sprintf("%.0f ms", float64(median(t.checks[m.key]).Microseconds())/1000),
			fmt.Sprintf("%.2f", med(m.key).Seconds()/med("d").Seconds()),
			fmt.Sprintf("%.1f", float64(median(t.cpus[m.key]).Microseconds())/float64(n)),
			fmt.Sprintf("%.1f", float64(median(t.busy[m.key]).Microseconds())/float64(n)), strings.Join(all, " ")})
	}
	markdownTable(os.Stdout, []string{"method", "time", "of which the final check", "x syncfs", "process CPU µs/file", "machine CPU µs/file", "all runs"}, cells)
	var ratios []string
	for _, r := range [][2]string{{"a", "d"}, {"a", "e"}, {"a", "h"}, {"a", "g"}, {"b", "a"}, {"c", "a"}, {"i", "d"}, {"c", "i"}} {
		if len(t.times[r[0]]) > 0 && len(t.times[r[1]]) > 0 {
			ratios = append(ratios, fmt.Sprintf("(%s)/(%s) %.2f", r[0], r[1], med(r[0]).Seconds()/med(r[1]).Seconds()))
		}
	}
	fmt.Printf("ratios: %s\n", strings.Join(ratios, ", "))
	for _, k := range []string{"a", "b", "i"} {
		st, ok := t.stats[k]
		if !ok {
			continue
		}
		mpb := 0.0
		if st.batches > 0 {
			mpb = float64(st.merges) / float64(st.batches)
		}
		fmt.Printf("(%s) last run: %.1f syscalls per file (through inode.File), %d requests, %d merges, %d batches, %.2f merges per batch\n",
			k, float64(st.syscalls)/float64(n), st.requests, st.merges, st.batches, mpb)
	}
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
