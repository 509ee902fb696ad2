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
	placements []string
}

func watchBench(args []string) int {
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
		return code
	}
	o := watchOpts{bin: *bin, idle: *idle, writers: *writers, files: *files, duration: *duration, fstype: *fstype, rangeBytes: *rangeBytes}
	o.backends = splitList(*backends)
	o.modes = splitList(*modes)
	o.placements = splitList(*placements)
	for _, p := range o.placements {
		if p != "shared" && p != "service" {
			fmt.Fprintf(os.Stderr, "flusherd-bench watch: --placement: unknown placement %q\n", p)
			return 2
		}
	}
	for _, m := range o.modes {
		if m != "pwrite" && m != "reopen" {
			fmt.Fprintf(os.Stderr, "flusherd-bench watch: --modes: unknown mode %q\n", m)
			return 2
		}
	}
	for _, s := range splitList(*inodes) {
		n, err := strconv.Atoi(strings.ReplaceAll(s, "_", ""))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "flusherd-bench watch: --inodes: bad count %q\n", s)
			return 2
		}
		o.inodes = append(o.inodes, n)
	}
	if o.fstype != "ext4" && o.fstype != "xfs" {
		fmt.Fprintf(os.Stderr, "flusherd-bench watch: --fs: %q is not ext4 or xfs\n", o.fstype)
		return 2
	}
	if o.writers < 1 || o.files < o.writers || len(o.backends) == 0 {
		fmt.Fprintln(os.Stderr, "flusherd-bench watch: need at least one backend, one writer and one file per writer")
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "flusherd-bench watch: needs root (loop devices, sysctls, drop_caches)")
		return 1
	}
	var err error
	if o.self, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench watch:", err)
		return 1
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
		gs, remove, err := newCPUGroups("daemon", "writers")
		if err != nil {
			explicit := false
			fl.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "placement" })
			if explicit {
				fmt.Fprintln(os.Stderr, "flusherd-bench watch: --placement service:", err)
				return 1
			}
			r.o.placements = slices.DeleteFunc(r.o.placements, func(p string) bool { return p == "service" })
			r.notes = append(r.notes, "placement service left out: "+err.Error())
		} else {
			defer remove()
			r.daemonGroup, r.writerGroup = gs[0], gs[1]
		}
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

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// ---- ingest and idle ----

func (r *watchRun) ingestAndIdle(ctx context.Context, backend string) error {
	dir, err := os.MkdirTemp(r.base, "ingest-"+backend+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l, err := newBenchLoop(dir, r.o.fstype, 2048, 0)
	if err != nil {
		return err
	}
	defer closeFS(l, "watch")
	root := filepath.Join(l.Dir, "tree")
	r.progress("%s: creating %d files", backend, r.o.files)
	if err := createTree(ctx, root, r.o.files, 4096); err != nil {
		return err
	}
	if err := syncfs(l.Dir); err != nil {
		return err
	}
	d, statsDir, err := r.startWatchDaemon(filepath.Join(dir, "ingest"), backend, root)
	if err != nil {
		return err
	}
	defer d.kill()
	if err := sleepCtx(ctx, settle); err != nil {
		return err
	}
	// "shared" first: once moved into its own cgroup, the daemon stays
	// there.
	for _, place := range r.o.placements {
		for _, mode := range r.o.modes {
			// Every tracked file written back: none is quiet (see the
			// package comment).
			if out, err := exec.CommandContext(ctx, r.o.bin, "sync", "--stats-dir", statsDir, "--timeout", "60s").CombinedOutput(); err != nil {
				return fmt.Errorf("flusherd sync before ingest %s (%s): %v: %s", mode, place, err, out)
			}
			if err := r.ingest(ctx, backend, mode, place, d, statsDir, root); err != nil {
				if ctx.Err() != nil {
					return err
				}
				return fmt.Errorf("ingest %s (%s): %w (daemon log:\n%s)", mode, place, err, tail(d.logText(), 20))
			}
		}
	}
	if ws, ok := readWatchStats(statsDir); ok && ws.Backend != "" {
		r.t.set(0, "backend in use (daemon's watch/stats)", "", backend, ws.Backend)
	} else {
		r.t.set(0, "backend in use (daemon's watch/stats)", "", backend, "n/a")
	}
	d.kill()

	// Idle: a new daemon on the same tree once it is clean.
	if err := syncfs(l.Dir); err != nil {
		return err
	}
	d, _, err = r.startWatchDaemon(filepath.Join(dir, "idle"), backend, root)
	if err != nil {
		return err
	}
	defer d.kill()
	r.progress("%s: idle, %v after a %v settle", backend, r.o.idle, settle)
	if err := sleepCtx(ctx, settle); err != nil {
		return err
	}
	cpu0, sw0, t0 := d.cpu(), d.switches(), time.Now()
	if err := sleepCtx(ctx, r.o.idle); err != nil {
		return err
	}
	cpu1, sw1, t1 := d.cpu(), d.switches(), time.Now()
	el := t1.Sub(t0).Seconds()
	rate := (float64(sw1) - float64(sw0)) / el
	idleName := fmt.Sprintf("idle (%d clean files, %v): ", r.o.files, r.o.idle.Round(time.Second))
	r.t.set(3, idleName+"wakeups/s (context switches, all threads)", "0", backend,
		fmt.Sprintf("%.2f %s", rate, metIf(rate == 0)))
	r.t.set(3, idleName+"daemon CPU", "", backend, fmt.Sprintf("%.2f s", (cpu1-cpu0).Seconds()))
	return nil
}

func (r *watchRun) ingest(ctx context.Context, backend, mode, place string, d *daemon, statsDir, root string) error {
	r.progress("%s: ingest %s, %d writers, %d files, %v, placement %s", backend, mode, r.o.writers, r.o.files, r.o.duration, place)
	var wg *cpuGroup
	if place == "service" {
		pid := d.cmd.Process.Pid
		if err := r.daemonGroup.add(pid); err != nil {
			return fmt.Errorf("moving the daemon into %s: %w", r.daemonGroup.dir, err)
		}
		if in, all, err := r.daemonGroup.threadsIn(pid); err != nil || in != all || all == 0 {
			return fmt.Errorf("the daemon's threads in %s: %d of %d (%v)", r.daemonGroup.dir, in, all, err)
		}
		wg = r.writerGroup
	}
	ws, err := startWriters(ctx, r.o, root, mode, wg)
	if err != nil {
		return err
	}
	defer ws.kill()
	st0, hasEv := readWatchStats(statsDir)
	ovLog0 := countOverflowLines(d.logText())
	cpu0, t0 := d.cpu(), time.Now()
	if err := ws.start(); err != nil {
		return err
	}
	writes, rate, err := ws.wait(ctx, r.o.duration+30*time.Second)
	if err != nil {
		return err
	}
	tw := time.Now()
	// The daemon may still be reading a backlog: wait until it is idle.
	tEnd, quiet := waitQuiet(ctx, d, 120*time.Second)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	cpu1 := d.cpu()
	st1, hasEv1 := readWatchStats(statsDir)
	hasEv = hasEv && hasEv1
	el := tEnd.Sub(t0).Seconds()
	cpu := (cpu1 - cpu0).Seconds()

	evRate, evPerWrite, cpuPerMEv, perCore := "n/a", "n/a", "n/a", "n/a (no watch/stats)"
	if hasEv {
		ev, _ := st1.get("events")
		e0, _ := st0.get("events")
		events := float64(ev - e0)
		evRate = thousands(uint64(events / el))
		evPerWrite = fmt.Sprintf("%.3f", events/float64(writes))
		perCore = "n/a"
		if events > 0 && cpu > 0 {
			cpuPerMEv = fmt.Sprintf("%.2f", cpu/(events/1e6))
			// events/s divided by the cores used (CPU s / wall s).
			pc := events / cpu
			perCore = fmt.Sprintf("%s %s", thousands(uint64(pc)), metIf(pc >= 100000))
		}
	}
	busy := fmt.Sprintf("%.1f s", tEnd.Sub(tw).Seconds())
	if !quiet {
		busy = fmt.Sprintf("still busy after %.0f s", tEnd.Sub(tw).Seconds())
	}
	// The device's stats file is rewritten when its writeback goroutine
	// runs: with nothing expired, once a dirty_writeback_interval (5s).
	trackedCell := "n/a"
	for wait := time.Now().Add(7 * time.Second); ; {
		n, ok := tracked(statsDir)
		if ok {
			trackedCell = fmt.Sprintf("%s of %s", thousands(n), thousands(uint64(r.o.files)))
		}
		if n >= uint64(r.o.files) || time.Now().After(wait) {
			break
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	name := func(s string) string { return fmt.Sprintf("ingest %s: %s", mode, s) }
	if place == "service" {
		name = func(s string) string { return fmt.Sprintf("ingest %s, own cgroups: %s", mode, s) }
	}
	for _, c := range [][3]string{
		{fmt.Sprintf("writes issued/s (%d procs, %s files)", r.o.writers, thousands(uint64(r.o.files))), "", thousands(uint64(rate))},
		{"events absorbed/s (daemon's events counter)", "", evRate},
		{"events absorbed per write issued", "", evPerWrite},
		{"daemon CPU s (cores used)", "", fmt.Sprintf("%.2f (%.2f)", cpu, cpu/el)},
		{"daemon CPU s per million events", "", cpuPerMEv},
		{"daemon CPU s per million writes", "", fmt.Sprintf("%.2f", cpu/(float64(writes)/1e6))},
		{"events/s per core used", "≥ 100,000", perCore},
		{"queue overflows / rescans", "", overflowCell(st0, st1, hasEv, countOverflowLines(d.logText())-ovLog0)},
		{"files quieted (ignore marks on files written continually)", "", quietedCell(st0, st1, hasEv)},
		{"daemon still busy after the writers stopped", "", busy},
		{"files tracked at the end", "", trackedCell},
	} {
		r.t.set(1, name(c[0]), c[1], backend, c[2])
	}
	return nil
}

// quietedCell is the growth of watch/stats' quieted count ("n/a" for a
// daemon that has none).
func quietedCell(st0, st1 watchStats, has bool) string {
	q1, ok := st1.get("quieted")
	if !has || !ok {
		return "n/a"
	}
	q0, _ := st0.get("quieted")
	return thousands(q1 - q0)
}

func overflowCell(st0, st1 watchStats, has bool, logged int) string {
	ov, rs := "n/a", "n/a"
	if has {
		if a, ok := st1.get("overflows"); ok {
			b, _ := st0.get("overflows")
			ov = thousands(a - b)
		}
		if a, ok := st1.get("rescans"); ok {
			b, _ := st0.get("rescans")
			rs = thousands(a - b)
		}
	}
	if ov == "n/a" {
		ov = fmt.Sprintf("%d (log)", logged)
	}
	return ov + " / " + rs
}

// countOverflowLines counts the daemon's log lines about an overflowed
// event queue (a fallback when the watch/stats file is not there).
func countOverflowLines(log string) int {
	n := 0
	for line := range strings.Lines(log) {
		if strings.Contains(strings.ToLower(line), "overflow") {
			n++
		}
	}
	return n
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitQuiet waits until the daemon has used no more than one clock tick of
// CPU for a whole second, and returns when it was last busy (and false if
// it was still busy at the limit).
func waitQuiet(ctx context.Context, d *daemon, limit time.Duration) (time.Time, bool) {
	const tick = 10 * time.Millisecond // USER_HZ
	start := time.Now()
	last, lastCPU := start, d.cpu()
	quietFrom, quietCPU := start, lastCPU
	for {
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return last, false
		}
		now, c := time.Now(), d.cpu()
		if c-lastCPU > 0 {
			last = now
		}
		lastCPU = c
		if c-quietCPU > tick {
			quietFrom, quietCPU = now, c
		}
		if now.Sub(quietFrom) >= time.Second {
			// The last CPU tick within the quiet second is noise (GC,
			// sysmon); the busy period ended at quietFrom.
			return quietFrom, true
		}
		if now.Sub(start) > limit {
			return last, false
		}
	}
}

// ---- memory ----

// Per file: a 4 KiB data block and page, an inode (up to 512 bytes on
// xfs), a directory entry; per 1,000 files a directory.
const (
	diskPerFile = 4096 + 512 + 64
	// Page cache and slab while the files are dirty, plus the loop image's
	// own page cache once they are written to it.
	memPerFile = 2*4096 + 2048
)

// fitInodes returns the largest count up to n, in thousands, whose
// filesystem fits the free disk under dir and the available memory, and
// why it is smaller if it is.
func fitInodes(dir string, n int) (int, string) {
	var st unix.Statfs_t
	why := ""
	if unix.Statfs(dir, &st) == nil {
		free := int64(st.Bavail) * st.Bsize
		if m := int((free*8/10 - 1<<30) / diskPerFile); m < n {
			n, why = m, "free disk"
		}
	}
	if avail := int64(meminfoKB().available) << 10; avail > 0 {
		if m := int((avail*8/10 - 2<<30) / memPerFile); m < n {
			n, why = m, "available memory"
		}
	}
	return max(n/1000*1000, 0), why
}

func (r *watchRun) memory(ctx context.Context, backend string, want int) error {
	n, why := fitInodes(r.base, want)
	label := thousands(uint64(want))
	if n < want {
		if n < 1000 {
			r.notes = append(r.notes, fmt.Sprintf("memory N=%s not run (%s)", label, why))
			return nil
		}
		r.notes = append(r.notes, fmt.Sprintf("memory N=%s: %s files used instead (%s)", label, thousands(uint64(n)), why))
		label = fmt.Sprintf("%s (asked %s)", thousands(uint64(n)), label)
	}
	dir, err := os.MkdirTemp(r.base, fmt.Sprintf("mem-%s-%d-", backend, n))
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sizeMB := int64(n)*diskPerFile*5/4>>20 + 1024
	l, err := newBenchLoop(dir, r.o.fstype, sizeMB, n+n/1000+4096)
	if err != nil {
		return err
	}
	// Clean-up: SIGKILL the daemon (SIGTERM would make it write every
	// file back first), then syncfs and unmount. The loop device is
	// buffered and the ext4 journal issues no flushes (barrier=0), so the
	// written-back data stays in the image file's page cache and is
	// dropped with the image; finally drop the caches for the next run.
	defer func() {
		t := time.Now()
		syncfs(l.Dir)
		closeFS(l, "watch")
		os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
		r.progress("%s: N=%d: clean-up took %v", backend, n, time.Since(t).Round(time.Millisecond))
	}()
	root := filepath.Join(l.Dir, "tree")
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	d, statsDir, err := r.startWatchDaemon(filepath.Join(dir, "daemon"), backend, root)
	if err != nil {
		return err
	}
	defer d.kill()
	if err := sleepCtx(ctx, settle); err != nil {
		return err
	}
	pid := d.cmd.Process.Pid
	base := procStatusKB(pid).rss
	st0, _ := readWatchStats(statsDir)
	ovLog0 := countOverflowLines(d.logText())
	cpu0, t0 := d.cpu(), time.Now()
	r.progress("%s: memory: baseline RSS %d kB; creating %d dirty files", backend, base, n)
	created := make(chan error, 1)
	go func() { created <- createTree(ctx, root, n, 1) }()
	// Wait for the daemon to track all n, or for its count to stop
	// growing for 10 s once the files exist.
	var got uint64
	grew := time.Now()
	createDone := false
	for got < uint64(n) {
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			if !createDone {
				<-created
			}
			return err
		}
		if !createDone {
			select {
			case err := <-created:
				if err != nil {
					return err
				}
				createDone = true
				grew = time.Now()
				r.progress("%s: memory: %d files created in %v", backend, n, time.Since(t0).Round(time.Millisecond))
			default:
			}
		}
		if c, _ := tracked(statsDir); c > got {
			got, grew = c, time.Now()
		}
		if createDone && time.Since(grew) >= 10*time.Second {
			break
		}
	}
	tTracked := time.Since(t0)
	if got == uint64(n) {
		// The count is there once the last event is handled; the loop
		// above exits with the stats file, at most a second later.
		tTracked = grew.Sub(t0)
	}
	mem := procStatusKB(pid)
	rss, hwm := mem.rss, mem.hwm
	cpu := (d.cpu() - cpu0).Seconds()
	st1, hasEv := readWatchStats(statsDir)
	r.progress("%s: memory: %d tracked in %v, RSS %d kB", backend, got, tTracked.Round(time.Millisecond), rss)

	name := func(s string) string { return fmt.Sprintf("memory N=%s: %s", label, s) }
	r.t.set(2, name("files tracked (time until the stats file showed them)"), "", backend, fmt.Sprintf("%s (%.1f s)", thousands(got), tTracked.Seconds()))
	r.t.set(2, name("RSS baseline -> tracked (peak)"), "", backend, fmt.Sprintf("%s -> %s (%s)", mib(base), mib(rss), mib(hwm)))
	// The target is for 1,000,000 tracked files.
	// Below it, fixed costs (the runtime, caches of up to 65,536
	// entries) weigh on each inode: the cell says so.
	target, perInode := "none below 1M (fixed costs dominate)", "n/a"
	if n >= 1000000 {
		target = "≤ 200 at 1M"
	}
	if got > 0 {
		per := float64(int64(rss)-int64(base)) * 1024 / float64(got)
		perInode = fmt.Sprintf("%.0f", per)
		if n >= 1000000 {
			perInode += " " + metIf(per <= 200)
		}
	}
	r.t.set(2, name("bytes RSS per tracked inode"), target, backend, perInode)
	r.t.set(2, name("daemon CPU while tracking"), "", backend, fmt.Sprintf("%.2f s", cpu))
	r.t.set(2, name("queue overflows / rescans"), "", backend, overflowCell(st0, st1, hasEv, countOverflowLines(d.logText())-ovLog0))
	d.kill()
	return nil
}
