package main

// flusherd-bench storm: a writeback storm on a slow disk, and what it does
// to a small synchronous writer beside it.
//
// Each run makes a fresh ext4 on a direct-I/O loop device (testfs), with
// its image in a temporary directory on the root filesystem, written
// whole before mkfs as a disk's blocks exist (--image allocated; sparse:
// a thin-provisioned disk), of 2.5 × the burst + 512 MiB (--fs-mib):
// ext4 starts writing back the whole
// filesystem itself, and stops delaying allocation, once dirty data passes
// half of its free space (ext4_nonda_switch, writeback reason
// fs_free_space), and a filesystem only 1.5 × the burst did that at
// 850 MiB of a 1 GiB burst, stalling the writer for seconds and hiding the
// expiry storm this bench is about. It then slows the
// loop device to a disk-like --rate (40 MiB/s) with cgroup v1 blkio
// throttling at the root cgroup (blkio.throttle.write_bps_device; every
// process here, the kernel's flusher threads included, is in that cgroup).
// Then, with the method's setting in force:
//
//   - a latency probe (this binary re-executed as the hidden "storm-probe"
//     command, so that the bench's own allocations and GC do not delay it)
//     does a 4 KiB pwrite at offset 0 of its own preallocated 4 KiB file
//     and an fdatasync, in a closed loop: the next pair starts
//     --probe-interval (10 ms) after the previous fdatasync returned, so a
//     stall delays the probes after it instead of piling them up. It
//     starts 1 s before the burst and runs until the burst file is clean;
//   - 1 s later, a bulk writer (the hidden "storm-writer" command) writes
//     --burst bytes (1 GiB) into one new file in --write-size (1 MiB) write(2) calls as
//     fast as it can and exits, without fsync;
//   - the bench samples the burst file's dirty and writeback pages
//     (cachestat(2) over the whole file) every 100 ms, and the kernel
//     stacks of the probe's threads that are in D state (what it waits
//     on), until the file is clean (dirty + writeback = 0, after the
//     writer finished) or --max-wait (180 s) after the burst began.
//
// Methods (--methods, interleaved: run 1 of every method, then run 2...):
//
//	k  kernel defaults: nothing is changed (the vm.dirty_* settings in force
//	   are printed above the table);
//	t  vm.dirty_background_bytes = 64 MiB for the run;
//	w  the loop device's queue/wbt_lat_usec = --wbt-lat (75000 µs, the
//	   kernel's default for rotational devices: this one says it is
//	   rotational and emulates a disk; the kernel gives loop devices 2000,
//	   the non-rotational default, which k therefore already has);
//	f  the flusherd daemon (built from the checkout, or --flusherd)
//	   watching the mount point, with its defaults and the TOML of
//	   --f-config, whose tables come first in the generated file.
//
// The table gives, per method, the median over the runs of: the probe's
// fdatasync p50, p99 and max; the time the probe spent in calls longer than
// 100 ms; the writer's write(2) p99 and max; the time from the burst's
// first write until the whole file was clean (100 ms resolution); and the
// file's peak dirty, and dirty + writeback, bytes. --png draws run 1 of
// each method: the burst file's dirty bytes and the probe's fdatasync
// latency over time.
//
// The probe's file is inside the tree flusherd watches (the mount point),
// so with f the daemon tracks and writes it back too.
//
// Every change (the throttle, sysctls, wbt, the daemon, the children,
// mounts and loop devices) is undone when a run ends, on error too; on
// SIGINT or SIGTERM the kernel settings are restored at once and the run
// then unwinds.

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/config"
)

const (
	stormWriterCmd = "storm-writer"
	stormProbeCmd  = "storm-probe"

	blkioWriteBPS = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device"

	stallOver   = 100 * time.Millisecond // a probe call longer than this is a stall
	sampleEvery = 100 * time.Millisecond
	// estimateEvery is how often the tree's dirty bytes are summed
	// (a cachestat of every file under the probe's directory) beside
	// flusherd's estimate, whose stats file is rewritten at most once a
	// second; done with every method, so that the bench's own load on
	// the CPU is the same for all.
	estimateEvery   = time.Second
	probeLead       = time.Second // the probe starts this long before the burst
	writeChunk      = 1 << 20     // the default --write-size
	probeSize       = 4096
	tunedBackground = 64 << 20 // method t's vm.dirty_background_bytes
)

const defaultFConfig = `[writeback]
dirty_background_bytes = "32MiB"
range_bytes = "1MiB"`

// notClean stands for "not clean within --max-wait" in a time to clean.
const notClean = time.Duration(math.MaxInt64)

type stormOpts struct {
	burst, rate int64
	writeSize   int64 // the bulk writer's write(2) size: the page cache's folios are made this large, up to 2 MiB
	runs        int
	methods     []byte
	maxWait     time.Duration
	interval    time.Duration
	wbtLat      int
	scheduler   string // the loop device's I/O scheduler; "": as attached
	fConfig     string
	bin, self   string
	png         string
	verbose     bool
	fsMiB       int  // 0: sized from the burst
	allocated   bool // the image written whole before mkfs (--image allocated)
	probes      []string
	pgScale     int
	pgRate      int           // pgbench -R; 0: as fast as it can
	minTime     time.Duration // the probe runs at least this long from the burst's start
	warmup      int64         // method f: bytes written back before the probe starts (warmUp); 0: none
}

func stormBench(args []string) int {
	o, code, ok := stormOptions(args)
	if !ok {
		return code
	}
	// Signals: the kernel settings are restored at once, then ctx is
	// cancelled and the run unwinds (children and daemon killed, the
	// filesystem unmounted, the loop device detached).
	knobs := &knobStack{}
	defer knobs.restoreAll()
	ctx, stop := stormSignals(knobs)
	defer stop()

	base, err := os.MkdirTemp("", "flusherd-bench-storm")
	if err != nil {
		return stormFail(1, "%v", err)
	}
	defer os.RemoveAll(base)
	sizeMB := o.fsMiB
	if sizeMB <= 0 {
		sizeMB = int(o.burst*5/2>>20) + 512
		if slices.Contains(o.probes, probePgbench) {
			sizeMB += 512 // the cluster: about 160 MiB at scale 10, its WAL
		}
	}
	if err := stormRoom(base, o.burst, sizeMB, o.allocated); err != nil {
		return stormFail(1, "%v", err)
	}
	if slices.Contains(o.methods, 'f') && o.bin == "" {
		if o.bin, err = buildFlusherd(base); err != nil {
			return stormFail(1, "%v", err)
		}
	}

	r := &stormRun{o: o, ctx: ctx, knobs: knobs, base: base, sizeMB: sizeMB, vm: readVM()}
	code = 0
	pngDone := o.png == ""
	for _, p := range o.probes {
		if ctx.Err() != nil {
			break
		}
		r.probe = p
		results, errs := r.runAll()
		r.printReport(os.Stdout, results)
		if !pngDone && ctx.Err() == nil {
			// One probe's commits: the first probe's.
			pngDone = true
			if !r.writePlots(results) {
				code = 1
			}
		}
		for _, m := range o.methods {
			if errs[m] != nil {
				fmt.Fprintf(os.Stderr, "flusherd-bench storm: %s, probe %s: %v\n", r.methodName(m), p, errs[m])
				code = 1
			}
		}
	}
	restoreAllOK := knobs.restoreAll()
	if ctx.Err() != nil {
		fmt.Println("interrupted: the table is partial")
	}
	if !restoreAllOK || ctx.Err() != nil {
		code = 1
	}
	return code
}

// stormFail prints a storm error and returns code.
func stormFail(code int, format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "flusherd-bench storm: "+format+"\n", a...)
	return code
}

// because is " (err)", or "" for a nil err.
func because(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// stormOptions parses and checks storm's flags and that it can run here
// (root, blkio throttling). It reports false, with the exit code, when
// the bench is not to run.
func stormOptions(args []string) (stormOpts, int, bool) {
	fl := newFlags("storm", "a writeback storm on a throttled loop device: a small fdatasync probe's latency and the burst's time to clean, kernel defaults against tuned sysctls, wbt and flusherd.", "go run ./cmd/flusherd-bench storm --burst 256MiB --runs 1")
	burst := fl.String("burst", "1GiB", "bytes the bulk writer writes (B, KiB, MiB, GiB)")
	rate := fl.String("rate", "41943040", "the loop device's write rate, bytes per second (blkio throttle)")
	runs := fl.Int("runs", 3, "runs of each method (the table shows medians)")
	methods := fl.String("methods", "ktfw", "methods, in order: k kernel defaults, t dirty_background_bytes=64MiB, w wbt_lat_usec=--wbt-lat, f flusherd")
	maxWait := fl.Duration("max-wait", 180*time.Second, "give up waiting for the burst file to be clean this long after the burst began")
	interval := fl.Duration("probe-interval", 10*time.Millisecond, "pause between one probe fdatasync's return and the next pwrite")
	wbtLat := fl.Int("wbt-lat", 75000, "method w: queue/wbt_lat_usec of the loop device, µs")
	scheduler := fl.String("scheduler", "", "the loop device's I/O scheduler for every method (queue/scheduler: none, mq-deadline, kyber, bfq where built); empty: as attached")
	fConfig := fl.String("f-config", defaultFConfig, `method f: TOML put first in the daemon's configuration (a literal \n is a newline)`)
	bin := fl.String("flusherd", "", "flusherd binary (default: go build ./cmd/flusherd into a temporary directory)")
	png := fl.String("png", "storm.png", "write the plots to this PNG file (empty: none)")
	verbose := fl.Bool("verbose", false, "also print one row per run")
	image := fl.String("image", "allocated", "the loop image: allocated (written whole before mkfs, as a disk's blocks are) or sparse (each first write to a block allocates it in the host filesystem)")
	fsMiB := fl.Int("fs-mib", 0, "filesystem size, MiB (0: 2.5 × the burst + 512 MiB; ext4 writes everything back itself once dirty data passes half its free space)")
	probes := fl.String("probe", probeFdatasync, "probes, comma-separated, each with every method: fdatasync (4 KiB pwrite + fdatasync), sqlite-wal, sqlite-rollback (sqlite: both; Python's sqlite3, synchronous=FULL, a row per commit), pgbench (PostgreSQL on the throttled filesystem, pgbench -c 2 -j 2 -R --pg-rate)")
	pgScale := fl.Int("pg-scale", 10, "pgbench probe: the scale of pgbench -i")
	pgRate := fl.Int("pg-rate", 100, "pgbench probe: transactions per second (pgbench -R); 0: as fast as it can")
	minTime := fl.Duration("min-time", 0, "the probe runs at least this long from the burst's start, clean or not (the same window for every method; with --burst 0, the probe alone, it must be > 0)")
	writeSize := fl.String("write-size", "1MiB", "the bulk writer's write(2) size, 4KiB to 16MiB: the page cache makes its folios this large (up to the filesystem's largest, 2 MiB on ext4), and writeback writes whole folios")
	warmup := fl.String("warmup", "0", "method f: bytes written to a file of their own with the throttle on, and waited for until they are written back, before the probe starts, so that the daemon has learnt its pace as one that has run through an earlier burst has (0: none, the run starts with a fresh daemon)")
	if code, ok := parseFlags(fl, args); !ok {
		return stormOpts{}, code, false
	}
	o := stormOpts{runs: *runs, maxWait: *maxWait, interval: *interval, wbtLat: *wbtLat,
		fConfig: strings.ReplaceAll(*fConfig, `\n`, "\n"), bin: *bin, png: *png, verbose: *verbose, fsMiB: *fsMiB, allocated: *image == "allocated",
		pgScale: *pgScale, pgRate: *pgRate, minTime: *minTime, scheduler: *scheduler}
	var err error
	if o.burst, err = parseBytes(*burst); err != nil || (o.burst != 0 && o.burst < writeChunk) {
		return o, stormFail(2, "--burst %q: want 0 (the probe alone) or at least 1MiB%s", *burst, because(err)), false
	}
	if o.writeSize, err = parseBytes(*writeSize); err != nil || o.writeSize < 4096 || o.writeSize > 16<<20 || o.writeSize%4096 != 0 {
		return o, stormFail(2, "--write-size %q: want a multiple of 4KiB from 4KiB to 16MiB%s", *writeSize, because(err)), false
	}
	if o.warmup, err = parseBytes(*warmup); err != nil {
		return o, stormFail(2, "--warmup %q: %v", *warmup, err), false
	}
	if o.rate, err = parseBytes(*rate); err != nil || (o.rate != 0 && o.rate < 1<<20) {
		return o, stormFail(2, "--rate %q: want 0 (not throttled) or at least 1MiB per second%s", *rate, because(err)), false
	}
	if o.probes, err = parseProbes(*probes); err != nil {
		return o, stormFail(2, "%v", err), false
	}
	if o.pgScale < 1 || o.pgRate < 0 || o.minTime < 0 || (o.burst == 0 && o.minTime == 0) {
		return o, stormFail(2, "need --pg-scale ≥ 1, --pg-rate ≥ 0 and --min-time ≥ 0 (> 0 with --burst 0)"), false
	}
	if *image != "sparse" && *image != "allocated" {
		return o, stormFail(2, "--image %q: want sparse or allocated", *image), false
	}
	if err := letters("methods", *methods, "ktwf"); err != nil {
		return o, stormFail(2, "%v", err), false
	}
	o.methods = []byte(*methods)
	if len(o.methods) == 0 || o.runs < 1 || o.maxWait <= 0 || o.interval < 0 || o.wbtLat < 0 {
		return o, stormFail(2, "need a method, --runs ≥ 1, --max-wait > 0, --probe-interval ≥ 0 and --wbt-lat ≥ 0"), false
	}
	if os.Geteuid() != 0 {
		return o, stormFail(1, "needs root (loop devices, mounts, %s, sysctls, /sys/block)", blkioWriteBPS), false
	}
	if _, err := os.Stat(blkioWriteBPS); err != nil && o.rate != 0 {
		return o, stormFail(1, "%s: %v: the bench slows the loop device with cgroup v1 blkio throttling (CONFIG_BLK_DEV_THROTTLING, the blkio hierarchy mounted at /sys/fs/cgroup/blkio)", blkioWriteBPS, err), false
	}
	if o.self, err = os.Executable(); err != nil {
		return o, stormFail(1, "%v", err), false
	}
	return o, 0, true
}

// stormSignals returns a context that SIGINT and SIGTERM cancel once they
// have restored the kernel settings in knobs, and a function that stops
// listening.
func stormSignals(knobs *knobStack) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			fmt.Fprintf(os.Stderr, "storm: %v: restoring the kernel settings, then cleaning up\n", s)
			knobs.restoreAll()
			cancel()
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel()
	}
}

// runAll runs every method --runs times, interleaved (run 1 of each, then
// run 2...); a method that fails is not run again. It stops early when
// the context is cancelled.
func (r *stormRun) runAll() (map[byte][]*stormResult, map[byte]error) {
	o := r.o
	results := map[byte][]*stormResult{}
	errs := map[byte]error{}
	for run := 1; run <= o.runs && r.ctx.Err() == nil; run++ {
		for _, m := range o.methods {
			if errs[m] != nil || r.ctx.Err() != nil {
				continue
			}
			fmt.Fprintf(os.Stderr, "storm: run %d/%d, %s, probe %s\n", run, o.runs, r.methodName(m), r.probe)
			res, err := r.once(m, run)
			if err != nil {
				errs[m] = fmt.Errorf("run %d: %w", run, err)
				fmt.Fprintf(os.Stderr, "storm: %s: %v\n", r.methodName(m), errs[m])
				continue
			}
			st := res.stats()
			fmt.Fprintf(os.Stderr, "storm: run %d %c: burst written in %.2fs, clean: %s; probe p99 %s ms, max %s ms\n",
				run, m, time.Duration(res.burstEnd-res.burstStart).Seconds(), cleanCell(st.toClean, o.maxWait), fmtMs(st.p99), fmtMs(st.max))
			results[m] = append(results[m], res)
		}
	}
	return results, errs
}

// writePlots draws run 1 of each method to --png; false if that failed.
func (r *stormRun) writePlots(results map[byte][]*stormResult) bool {
	var first []*stormResult
	for _, m := range r.o.methods {
		if len(results[m]) > 0 {
			first = append(first, results[m][0])
		}
	}
	if len(first) == 0 {
		return true
	}
	if err := r.plot(r.o.png, first); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench storm: png:", err)
		return false
	}
	fmt.Printf("plots (run 1 of each method): %s\n", r.o.png)
	return true
}

// stormRoom checks that the loop image (sizeMB allocated, or sparse and
// filled by about the burst) fits the free disk under dir and that the
// burst fits in memory.
func stormRoom(dir string, burst int64, sizeMB int, allocated bool) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if st.Type == unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is on tmpfs: the loop image would be held in memory; set TMPDIR to a directory on a disk", dir)
	}
	free := int64(st.Bavail) * st.Bsize
	need, what := burst+256<<20+1<<30, fmt.Sprintf("a sparse %d MiB image filled by the burst", sizeMB)
	if allocated {
		need, what = int64(sizeMB)<<20+1<<30, fmt.Sprintf("an allocated %d MiB image", sizeMB)
	}
	if free < need {
		return fmt.Errorf("%s: %d MiB free, need %d MiB (%s, and 1 GiB to spare)", dir, free>>20, need>>20, what)
	}
	if avail := int64(meminfoKB().available) << 10; avail > 0 && avail < 2*burst+1<<30 {
		return fmt.Errorf("MemAvailable %d MiB: a %d MiB burst needs at least %d MiB (twice the burst, and 1 GiB)", avail>>20, burst>>20, (2*burst+1<<30)>>20)
	}
	return nil
}

// parseBytes parses a size as the daemon's configuration does
// (config.ParseSize: B, K/KiB, M/MiB, G/GiB).
func parseBytes(s string) (int64, error) {
	n, err := config.ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, err)
	}
	return n, nil
}
