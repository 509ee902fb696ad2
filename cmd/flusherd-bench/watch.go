package main

// flusherd-bench watch: the daemon's cost of watching, measured black-box
// on the real flusherd binary, per watcher backend ([watcher] backend):
//
//  1. Event ingest. --writers separate processes (this binary re-executed
//     as the hidden "watch-writer" command) write 64 bytes at a time to
//     --files files (split between them; in directories of 1,000) for
//     --duration, in each --modes:
//     pwrite: every file is opened once and kept open; each write is a
//     pwrite(2) of 64 bytes at an offset that rotates through the first
//     4 KiB, files taken round-robin;
//     reopen: the same, but each write is open(O_WRONLY), pwrite, close.
//     Reported: the writes issued per second, the events the daemon read
//     per second (its <stats.dir>/watch/stats "events:" counter, from the
//     writers' start until the daemon is idle again), and the daemon's
//     CPU (utime+stime) per million events and per million writes.
//     fanotify merges identical queued events, so events can be fewer than
//     writes, and quiets a file written continually (an ignore mark, until
//     its next writeback attempt): each mode and placement starts after
//     `flusherd sync` has written every tracked file back, as a writeback
//     pass would, so that each begins with no file quiet.
//  2. Memory. On an empty tree the daemon settles and its VmRSS is read;
//     N one-byte files (dirty, in directories of 1,000) are then created
//     while it runs, and once its device's lists (b_dirty + b_io +
//     b_more_io + b_more_io_wait in <stats.dir>/bdi/<dev>/stats) hold N
//     files, or have not grown for 10 s, VmRSS is read again:
//     (RSS - baseline) / files tracked.
//  3. Idle. On a tree with nothing dirty, after a 5 s settle: the daemon's
//     context switches per second (all threads, voluntary or not: an upper
//     bound on its wakeups) and CPU seconds over --idle.
//
// The daemon runs with dirty_expire_interval = 1h, so it writes nothing
// back while it is measured, and the kernel's own flusher is kept away by
// raising vm.dirty_background_bytes, vm.dirty_bytes and
// vm.dirty_expire_centisecs for the run (restored on exit, error or
// SIGINT). Each phase has its own loop-mounted filesystem, released (and
// its image deleted) when the phase ends, on error or on SIGINT; the
// daemon and the writers run in their own process groups, so a Ctrl-C
// reaches only the bench, which kills them.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const watchWriterCmd = "watch-writer"

// settle is how long the daemon is left alone after it is ready, before
// a baseline is taken.
const settle = 5 * time.Second

type watchOpts struct {
	bin        string
	rangeBytes string // writeback.range_bytes
	self       string
	backends   []string
	inodes     []int
	modes      []string
	idle       time.Duration
	writers    int
	files      int
	duration   time.Duration
	fstype     string
	// placements of the daemon and the writers in the ingest phase:
	// "shared" (the bench's own cgroup, where the scheduler shares the
	// CPU between threads) and "service" (two sibling cgroups of equal
	// CPU weight, as systemd puts the daemon's service and the writing
	// application).
	placements   []string
	placementSet bool // --placement was given
}

func watchBench(args []string) int {
	o, code, ok := watchOptions(args)
	if !ok {
		return code
	}
	// SIGINT/SIGTERM cancel ctx; every wait below watches it, and the
	// deferred clean-ups (daemon, writers, mounts, loop devices, sysctls)
	// run as the functions return.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	base, err := os.MkdirTemp("", "flusherd-bench-watch")
	if err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench watch:", err)
		return 1
	}
	defer os.RemoveAll(base)
	if o.bin == "" {
		if o.bin, err = buildFlusherd(base); err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench watch:", err)
			return 1
		}
	}
	// The kernel's flusher must not clean the files the daemon tracks:
	// no background writeback below 8 GiB of dirty data (1,000,000 dirty
	// one-byte files are about 4 GiB of page cache, and their metadata),
	// and no expiry for an hour.
	restore, err := holdKernelFlusher(8<<30, 12<<30)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench watch:", err)
		return 1
	}
	defer restore()

	r := &watchRun{o: o, base: base}
	if slices.Contains(o.placements, "service") {
		remove, err := r.serviceGroups()
		if err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench watch: --placement service:", err)
			return 1
		}
		defer remove()
	}
	failed := false
	for _, b := range o.backends {
		if err := r.backend(ctx, b); err != nil {
			fmt.Fprintf(os.Stderr, "flusherd-bench watch: %s: %v\n", b, err)
			failed = true
			if ctx.Err() != nil {
				break
			}
		}
	}
	fmt.Println(machineFacts(o))
	for _, n := range r.notes {
		fmt.Println(n)
	}
	if ctx.Err() != nil {
		fmt.Println("interrupted: the table is partial")
	}
	r.t.print(os.Stdout, o.backends)
	if failed {
		return 1
	}
	return 0
}

// watchOptions parses and checks watch's flags and that it can run here.
// It reports false, with the exit code, when the bench is not to run.
func watchOptions(args []string) (watchOpts, int, bool) {
	fl := newFlags("watch", "the daemon's cost of watching: event ingest rate and CPU (with the daemon and writers in one cgroup, and in sibling cgroups as under systemd), RSS per tracked inode, idle wakeups.", "go run ./cmd/flusherd-bench watch --inodes 100000 --idle 10s")
	bin := fl.String("flusherd", "", "flusherd binary (default: go build ./cmd/flusherd into a temporary directory)")
	backends := fl.String("backends", "inotify,fanotify", "watcher backends to measure ([watcher] backend), one column each")
	inodes := fl.String("inodes", "100000,1000000", "tracked-file counts for the memory phase")
	idle := fl.Duration("idle", 60*time.Second, "idle phase length")
	writers := fl.Int("writers", 8, "writer processes in the ingest phase")
	files := fl.Int("files", 10000, "files written in the ingest phase (split between the writers)")
	duration := fl.Duration("duration", 10*time.Second, "ingest phase length (per mode)")
	fstype := fl.String("fs", "ext4", "filesystem: ext4 or xfs")
	modes := fl.String("modes", "pwrite,reopen", "ingest write patterns: pwrite (files kept open), reopen (open, pwrite, close each time)")
	rangeBytes := fl.String("range-bytes", "1MiB", "the daemon's writeback.range_bytes (1MiB, its default, makes it look at freshly written files every 100 ms; \"0\" turns range writeback off, and fanotify then quiets files written continually)")
	placements := fl.String("placement", "shared,service", "where the ingest phase runs the daemon and the writers: shared (all in the bench's cgroup), service (daemon and writers in two sibling cgroups of equal CPU weight, as under systemd; needs the cpu cgroup controller)")
	if code, ok := parseFlags(fl, args); !ok {
		return watchOpts{}, code, false
	}
	o := watchOpts{bin: *bin, idle: *idle, writers: *writers, files: *files, duration: *duration, fstype: *fstype, rangeBytes: *rangeBytes}
	o.backends = splitList(*backends)
	o.modes = splitList(*modes)
	o.placements = splitList(*placements)
	fl.Visit(func(f *flag.Flag) { o.placementSet = o.placementSet || f.Name == "placement" })
	if code, ok := o.check(*inodes); !ok {
		return o, code, false
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "flusherd-bench watch: needs root (loop devices, sysctls, drop_caches)")
		return o, 1, false
	}
	var err error
	if o.self, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench watch:", err)
		return o, 1, false
	}
	return o, 0, true
}

// check checks the options' values and parses --inodes into o.inodes; it
// prints what is wrong and reports false, with the exit code 2.
func (o *watchOpts) check(inodes string) (int, bool) {
	for _, p := range o.placements {
		if p != "shared" && p != "service" {
			fmt.Fprintf(os.Stderr, "flusherd-bench watch: --placement: unknown placement %q\n", p)
			return 2, false
		}
	}
	for _, m := range o.modes {
		if m != "pwrite" && m != "reopen" {
			fmt.Fprintf(os.Stderr, "flusherd-bench watch: --modes: unknown mode %q\n", m)
			return 2, false
		}
	}
	for _, s := range splitList(inodes) {
		n, err := strconv.Atoi(strings.ReplaceAll(s, "_", ""))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "flusherd-bench watch: --inodes: bad count %q\n", s)
			return 2, false
		}
		o.inodes = append(o.inodes, n)
	}
	if o.fstype != "ext4" && o.fstype != "xfs" {
		fmt.Fprintf(os.Stderr, "flusherd-bench watch: --fs: %q is not ext4 or xfs\n", o.fstype)
		return 2, false
	}
	if o.writers < 1 || o.files < o.writers || len(o.backends) == 0 {
		fmt.Fprintln(os.Stderr, "flusherd-bench watch: need at least one backend, one writer and one file per writer")
		return 2, false
	}
	return 0, true
}

// serviceGroups makes the cgroups of placement "service" and returns the
// function that removes them. If they cannot be made, the placement is
// left out with a note, unless --placement asked for it: then the error.
func (r *watchRun) serviceGroups() (func(), error) {
	gs, remove, err := newCPUGroups("daemon", "writers")
	if err != nil {
		if r.o.placementSet {
			return nil, err
		}
		r.o.placements = slices.DeleteFunc(r.o.placements, func(p string) bool { return p == "service" })
		r.notes = append(r.notes, "placement service left out: "+err.Error())
		return func() {}, nil
	}
	r.daemonGroup, r.writerGroup = gs[0], gs[1]
	return remove, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func machineFacts(o watchOpts) string {
	var u unix.Utsname
	unix.Uname(&u)
	mem := ""
	if m := meminfoKB().total; m > 0 {
		mem = fmt.Sprintf(", %.0f GiB RAM", float64(m)/(1<<20))
	}
	ver := "?"
	if out, err := exec.Command(o.bin, "version").Output(); err == nil {
		ver = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "flusherd"))
	}
	return fmt.Sprintf("machine: Linux %s, %d cores%s; fs: %s on a loop device (buffered); flusherd %s (range_bytes %s); %s",
		unix.ByteSliceToString(u.Release[:]), runtime.NumCPU(), mem, o.fstype, ver, o.rangeBytes, runtime.Version())
}

// watchRun holds one run's results.
type watchRun struct {
	o     watchOpts
	base  string
	t     wtable
	notes []string
	// The cgroups of placement "service" (nil without it).
	daemonGroup, writerGroup *cpuGroup
}

func (r *watchRun) progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "watch: "+format+"\n", args...)
}

// backend runs the three phases for one backend.
func (r *watchRun) backend(ctx context.Context, backend string) error {
	if err := r.ingestAndIdle(ctx, backend); err != nil {
		return err
	}
	for _, n := range r.o.inodes {
		if err := r.memory(ctx, backend, n); err != nil {
			return err
		}
	}
	return nil
}

func watchConfigText(backend, statsDir, root, rangeBytes string) string {
	return fmt.Sprintf(`[writeback]
dirty_writeback_interval = "5s"
dirty_expire_interval = "1h"
range_bytes = %q
[watcher]
backend = %q
[stats]
dir = %q
[[watch]]
path = %q
`, rangeBytes, backend, statsDir, root)
}

// startWatchDaemon starts flusherd on root with its files in dir (config,
// stats in dir/run), in its own process group (a Ctrl-C is the bench's to
// handle) and killed if the bench dies.
func (r *watchRun) startWatchDaemon(dir, backend, root string) (*daemon, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	statsDir := filepath.Join(dir, "run")
	d, err := startDaemonAttr(r.o.bin, dir, watchConfigText(backend, statsDir, root, r.o.rangeBytes),
		&syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL})
	return d, statsDir, err
}
