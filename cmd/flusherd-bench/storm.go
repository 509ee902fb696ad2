package main

// flusherd-bench storm: a writeback storm on a slow disk, and what it does
// to a small synchronous writer beside it.
//
// Each run makes a fresh ext4 on a direct-I/O loop device (testfs), with
// its (sparse) image in a temporary directory on the root filesystem, of
// 2.5 × the burst + 512 MiB (--fs-mib): ext4 starts writing back the whole
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
//     --burst bytes (1 GiB) into one new file in 1 MiB write(2) calls as
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
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"flusherd/config"

	"golang.org/x/sys/unix"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"flusherd/internal/testfs"
)

const (
	stormWriterCmd = "storm-writer"
	stormProbeCmd  = "storm-probe"

	blkioWriteBPS = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device"

	stallOver       = 100 * time.Millisecond // a probe call longer than this is a stall
	sampleEvery     = 100 * time.Millisecond
	probeLead       = time.Second // the probe starts this long before the burst
	writeChunk      = 1 << 20
	probeSize       = 4096
	tunedBackground = 64 << 20 // method t's vm.dirty_background_bytes
)

const defaultFConfig = `[writeback]
dirty_background_bytes = "32MiB"
range_bytes = "1MiB"
[plug]
max_inflight_bytes = "1MiB"`

// notClean stands for "not clean within --max-wait" in a time to clean.
const notClean = time.Duration(math.MaxInt64)

type stormOpts struct {
	burst, rate int64
	runs        int
	methods     []byte
	maxWait     time.Duration
	interval    time.Duration
	wbtLat      int
	fConfig     string
	bin, self   string
	png         string
	verbose     bool
}

func stormBench(args []string) int {
	fl := newFlags("storm", "a writeback storm on a throttled loop device: a small fdatasync probe's latency and the burst's time to clean, kernel defaults against tuned sysctls, wbt and flusherd.", "go run ./cmd/flusherd-bench storm --burst 256MiB --runs 1")
	burst := fl.String("burst", "1GiB", "bytes the bulk writer writes (B, KiB, MiB, GiB)")
	rate := fl.String("rate", "41943040", "the loop device's write rate, bytes per second (blkio throttle)")
	runs := fl.Int("runs", 3, "runs of each method (the table shows medians)")
	methods := fl.String("methods", "ktfw", "methods, in order: k kernel defaults, t dirty_background_bytes=64MiB, w wbt_lat_usec=--wbt-lat, f flusherd")
	maxWait := fl.Duration("max-wait", 180*time.Second, "give up waiting for the burst file to be clean this long after the burst began")
	interval := fl.Duration("probe-interval", 10*time.Millisecond, "pause between one probe fdatasync's return and the next pwrite")
	wbtLat := fl.Int("wbt-lat", 75000, "method w: queue/wbt_lat_usec of the loop device, µs")
	fConfig := fl.String("f-config", defaultFConfig, `method f: TOML put first in the daemon's configuration (a literal \n is a newline)`)
	bin := fl.String("flusherd", "", "flusherd binary (default: go build ./cmd/flusherd into a temporary directory)")
	png := fl.String("png", "storm.png", "write the plots to this PNG file (empty: none)")
	verbose := fl.Bool("verbose", false, "also print one row per run")
	fsMiB := fl.Int("fs-mib", 0, "filesystem size, MiB (0: 2.5 × the burst + 512 MiB; ext4 writes everything back itself once dirty data passes half its free space)")
	if code, ok := parseFlags(fl, args); !ok {
		return code
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "flusherd-bench storm: "+format+"\n", a...)
		return code
	}
	o := stormOpts{runs: *runs, maxWait: *maxWait, interval: *interval, wbtLat: *wbtLat,
		fConfig: strings.ReplaceAll(*fConfig, `\n`, "\n"), bin: *bin, png: *png, verbose: *verbose}
	var err error
	if o.burst, err = parseBytes(*burst); err != nil || o.burst < writeChunk {
		return fail(2, "--burst %q: want at least 1MiB (%v)", *burst, err)
	}
	if o.rate, err = parseBytes(*rate); err != nil || o.rate < 1<<20 {
		return fail(2, "--rate %q: want at least 1MiB per second (%v)", *rate, err)
	}
	if err := letters("methods", *methods, "ktwf"); err != nil {
		return fail(2, "%v", err)
	}
	o.methods = []byte(*methods)
	if len(o.methods) == 0 || o.runs < 1 || o.maxWait <= 0 || o.interval < 0 || o.wbtLat < 0 {
		return fail(2, "need a method, --runs ≥ 1, --max-wait > 0, --probe-interval ≥ 0 and --wbt-lat ≥ 0")
	}
	if os.Geteuid() != 0 {
		return fail(1, "needs root (loop devices, mounts, %s, sysctls, /sys/block)", blkioWriteBPS)
	}
	if _, err := os.Stat(blkioWriteBPS); err != nil {
		return fail(1, "%s: %v: the bench slows the loop device with cgroup v1 blkio throttling (CONFIG_BLK_DEV_THROTTLING, the blkio hierarchy mounted at /sys/fs/cgroup/blkio)", blkioWriteBPS, err)
	}
	if o.self, err = os.Executable(); err != nil {
		return fail(1, "%v", err)
	}

	// Signals: the kernel settings are restored at once, then ctx is
	// cancelled and the run unwinds (children and daemon killed, the
	// filesystem unmounted, the loop device detached).
	knobs := &knobStack{}
	defer knobs.restoreAll()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for s := range sigs {
			fmt.Fprintf(os.Stderr, "storm: %v: restoring the kernel settings, then cleaning up\n", s)
			knobs.restoreAll()
			cancel()
		}
	}()

	base, err := os.MkdirTemp("", "flusherd-bench-storm")
	if err != nil {
		return fail(1, "%v", err)
	}
	defer os.RemoveAll(base)
	sizeMB := *fsMiB
	if sizeMB <= 0 {
		sizeMB = int(o.burst*5/2>>20) + 512
	}
	if err := stormRoom(base, o.burst, sizeMB); err != nil {
		return fail(1, "%v", err)
	}
	if slices.Contains(o.methods, 'f') && o.bin == "" {
		if o.bin, err = buildFlusherd(base); err != nil {
			return fail(1, "%v", err)
		}
	}

	r := &stormRun{o: o, ctx: ctx, knobs: knobs, base: base, sizeMB: sizeMB, vm: readVM()}
	results := map[byte][]*stormResult{}
	errs := map[byte]error{}
	for run := 1; run <= o.runs && ctx.Err() == nil; run++ {
		for _, m := range o.methods {
			if errs[m] != nil || ctx.Err() != nil {
				continue
			}
			fmt.Fprintf(os.Stderr, "storm: run %d/%d, %s\n", run, o.runs, r.methodName(m))
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
	restoreAllOK := knobs.restoreAll()

	r.printReport(os.Stdout, results)
	if ctx.Err() != nil {
		fmt.Println("interrupted: the table is partial")
	}
	pngFailed := false
	if o.png != "" && ctx.Err() == nil {
		var first []*stormResult
		for _, m := range o.methods {
			if len(results[m]) > 0 {
				first = append(first, results[m][0])
			}
		}
		if len(first) > 0 {
			if err := r.plot(o.png, first); err != nil {
				fmt.Fprintln(os.Stderr, "flusherd-bench storm: png:", err)
				pngFailed = true
			} else {
				fmt.Printf("plots (run 1 of each method): %s\n", o.png)
			}
		}
	}
	code := 0
	for _, m := range o.methods {
		if errs[m] != nil {
			fmt.Fprintf(os.Stderr, "flusherd-bench storm: %s: %v\n", r.methodName(m), errs[m])
			code = 1
		}
	}
	if pngFailed || !restoreAllOK || ctx.Err() != nil {
		code = 1
	}
	return code
}

// stormRoom checks that the loop image (sparse, filled by about the burst)
// fits the free disk under dir and that the burst fits in memory.
func stormRoom(dir string, burst int64, sizeMB int) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if st.Type == unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is on tmpfs: the loop image would be held in memory; set TMPDIR to a directory on a disk", dir)
	}
	free := int64(st.Bavail) * st.Bsize
	if need := burst + 256<<20 + 1<<30; free < need {
		return fmt.Errorf("%s: %d MiB free, need %d MiB (a %d MiB image filled by the burst, and 1 GiB to spare)", dir, free>>20, need>>20, sizeMB)
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

// ---- kernel settings ----

// knobStack holds the undo functions of the kernel settings the bench
// changed (the blkio throttle, sysctls, wbt_lat_usec). Each runs once:
// from its run's defer, or from restoreAll (a signal, or the end), which
// undoes the outstanding ones newest first.
type knobStack struct {
	mu    sync.Mutex
	items []*knob
}

type knob struct {
	name string
	undo func() error
}

func (s *knobStack) push(name string, undo func() error) *knob {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := &knob{name: name, undo: undo}
	s.items = append(s.items, k)
	return k
}

// restore undoes k if it is still outstanding; false if that failed.
func (s *knobStack) restore(k *knob) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.items, k)
	if i < 0 {
		return true
	}
	s.items = slices.Delete(s.items, i, i+1)
	return runUndo(k)
}

// restoreAll undoes every outstanding setting, newest first; false if one
// failed.
func (s *knobStack) restoreAll() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := true
	for _, k := range slices.Backward(s.items) {
		ok = runUndo(k) && ok
	}
	s.items = nil
	return ok
}

func runUndo(k *knob) bool {
	if err := k.undo(); err != nil {
		fmt.Fprintf(os.Stderr, "flusherd-bench storm: restoring %s: %v\n", k.name, err)
		return false
	}
	return true
}

// throttleOf returns the write_bps rule for majmin in a
// blkio.throttle.write_bps_device file ("0" if there is none).
func throttleOf(data []byte, majmin string) string {
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == majmin {
			return f[1]
		}
	}
	return "0"
}

// setThrottle limits writes to majmin to rate bytes per second in the root
// blkio cgroup; the knob puts back the rule it found (none: "0").
func setThrottle(ks *knobStack, majmin string, rate int64) (*knob, error) {
	old, err := os.ReadFile(blkioWriteBPS)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", blkioWriteBPS, err)
	}
	prev := throttleOf(old, majmin)
	k := ks.push("blkio write_bps_device "+majmin, func() error {
		return os.WriteFile(blkioWriteBPS, []byte(majmin+" "+prev), 0o644)
	})
	if err := os.WriteFile(blkioWriteBPS, fmt.Appendf(nil, "%s %d", majmin, rate), 0o644); err != nil {
		ks.restore(k)
		return nil, fmt.Errorf("%s: %w", blkioWriteBPS, err)
	}
	return k, nil
}

// setSysfs writes value to a sysfs or procfs file; the knob writes back
// what was there.
func setSysfs(ks *knobStack, path, value string) (*knob, error) {
	old, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	old = bytes.TrimSpace(old)
	k := ks.push(path, func() error { return os.WriteFile(path, old, 0o644) })
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		ks.restore(k)
		return nil, err
	}
	return k, nil
}

func wbtPath(device string) string {
	return "/sys/block/" + filepath.Base(device) + "/queue/wbt_lat_usec"
}

var vmNames = []string{"dirty_background_bytes", "dirty_background_ratio", "dirty_bytes", "dirty_ratio", "dirty_expire_centisecs", "dirty_writeback_centisecs"}

func readVM() map[string]string {
	m := map[string]string{}
	for _, n := range vmNames {
		b, err := os.ReadFile("/proc/sys/vm/" + n)
		if err != nil {
			m[n] = "?"
			continue
		}
		m[n] = strings.TrimSpace(string(b))
	}
	return m
}

// ---- one run ----

type stormRun struct {
	o      stormOpts
	ctx    context.Context
	knobs  *knobStack
	base   string
	sizeMB int
	vm     map[string]string
	queue  string // the loop device's queue settings, from the first run
	// statsFile is the running daemon's stats file of the loop device
	// (method f).
	statsFile string
}

func (r *stormRun) methodName(m byte) string {
	switch m {
	case 'k':
		return "k: kernel defaults"
	case 't':
		return "t: dirty_background_bytes=64MiB"
	case 'w':
		return fmt.Sprintf("w: wbt_lat_usec=%d", r.o.wbtLat)
	case 'f':
		return "f: flusherd"
	}
	return string(m)
}

// probeRec is one probe call: its start (CLOCK_MONOTONIC, ns) and the
// pwrite and fdatasync latencies.
type probeRec struct {
	at           int64
	pwrite, sync time.Duration
}

// stormSample is the burst file's page-cache state at a moment.
type stormSample struct {
	at        int64
	dirty, wb uint64 // bytes
}

// estSample is flusherd's estimate of the tree's dirty bytes (the stats
// file's BdiReclaimable, rewritten at most once a second) beside a
// cachestat of every file in the tree, at a moment (method f).
type estSample struct {
	est, truth uint64 // bytes
}

type stormResult struct {
	ests                 []estSample
	method               byte
	run                  int
	burstStart, burstEnd int64 // the writer's first write and its end (monotonic ns)
	writes               []time.Duration
	probes               []probeRec
	samples              []stormSample
	cleanAt              int64 // 0: not clean within --max-wait
	waits                map[string]int
	waitSamples          int
}

func monoNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (r *stormRun) noteQueue(device string) {
	if r.queue != "" {
		return
	}
	q := "/sys/block/" + filepath.Base(device) + "/queue/"
	read := func(n string) string {
		b, err := os.ReadFile(q + n)
		if err != nil {
			return "?"
		}
		s := strings.TrimSpace(string(b))
		if i, j := strings.Index(s, "["), strings.Index(s, "]"); i >= 0 && j > i {
			s = s[i+1 : j]
		}
		return s
	}
	r.queue = fmt.Sprintf("rotational=%s, scheduler=%s, nr_requests=%s, wbt_lat_usec=%s, max_sectors_kb=%s",
		read("rotational"), read("scheduler"), read("nr_requests"), read("wbt_lat_usec"), read("max_sectors_kb"))
}

func (r *stormRun) daemonConfig(root string) string {
	return fmt.Sprintf("%s\n\n[[watch]]\npath = %q\n", strings.TrimSpace(r.o.fConfig), root)
}

// once runs method m once on a fresh filesystem.
func (r *stormRun) once(m byte, run int) (res *stormResult, err error) {
	ctx := r.ctx
	dir, err := os.MkdirTemp(r.base, fmt.Sprintf("run%d-%c-", run, m))
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fs, err := benchFS(testfs.Options{Type: "ext4", SizeMB: r.sizeMB, DirectIO: true, ImageDir: dir})
	if err != nil {
		return nil, err
	}
	defer closeFS(fs, "storm")
	r.noteQueue(fs.Device)
	probePath, burstPath := filepath.Join(fs.Dir, "probe"), filepath.Join(fs.Dir, "burst")
	if err := writeSynced(probePath, probeSize); err != nil {
		return nil, err
	}

	switch m {
	case 't':
		restore, err := sysctl("dirty_background_bytes", strconv.Itoa(tunedBackground))
		if err != nil {
			return nil, fmt.Errorf("vm.dirty_background_bytes: %w", err)
		}
		k := r.knobs.push("vm.dirty_background_bytes", func() error { restore(); return nil })
		defer r.knobs.restore(k)
	case 'w':
		k, err := setSysfs(r.knobs, wbtPath(fs.Device), strconv.Itoa(r.o.wbtLat))
		if err != nil {
			return nil, fmt.Errorf("wbt: %w", err)
		}
		defer r.knobs.restore(k)
	case 'f':
		ddir := filepath.Join(dir, "daemon") // its config, and its stats dir (ddir/run)
		if err := os.Mkdir(ddir, 0o700); err != nil {
			return nil, err
		}
		d, err := startDaemonAttr(r.o.bin, ddir, r.daemonConfig(fs.Dir),
			&syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL})
		if err != nil {
			return nil, err
		}
		defer func() {
			if serr := stopDaemonChecked(ctx, d); serr != nil && err == nil {
				res, err = nil, serr
			}
		}()
		r.statsFile = filepath.Join(ddir, "run", "bdi", fs.MajMin, "stats")
		res, err = r.measure(ctx, m, run, fs, probePath, burstPath, d)
		if err != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w\ndaemon log (last lines):\n%s", err, tail(d.logText(), 20))
		}
		return res, err
	}
	return r.measure(ctx, m, run, fs, probePath, burstPath, nil)
}

// writeSynced creates a file of n bytes and fsyncs it.
func writeSynced(path string, n int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(bytes.Repeat([]byte{'p'}, n))
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// stopDaemonChecked stops the daemon with SIGTERM and checks it exited
// with status 0 within a minute (on Ctrl-C: SIGKILL).
func stopDaemonChecked(ctx context.Context, d *daemon) error {
	if ctx.Err() != nil {
		d.kill()
		return nil
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		d.kill()
		return fmt.Errorf("flusherd still running 60s after SIGTERM (killed); log (last lines):\n%s", tail(d.logText(), 20))
	}
	if st := d.cmd.ProcessState; st == nil || !st.Success() {
		return fmt.Errorf("flusherd exited with %v after SIGTERM; log (last lines):\n%s", st, tail(d.logText(), 20))
	}
	return nil
}

// measure throttles the device, runs the probe and the writer, and
// samples until the burst file is clean.
func (r *stormRun) measure(ctx context.Context, m byte, run int, fs *testfs.FS, probePath, burstPath string, d *daemon) (*stormResult, error) {
	// Nothing else dirty anywhere at the start.
	unix.Sync()
	thr, err := setThrottle(r.knobs, fs.MajMin, r.o.rate)
	if err != nil {
		return nil, err
	}
	defer r.knobs.restore(thr)

	writer, err := startStormChild(r.o.self, stormWriterCmd, "--file", burstPath, "--bytes", strconv.FormatInt(r.o.burst, 10))
	if err != nil {
		return nil, err
	}
	defer writer.kill()
	if err := writer.expect(ctx, "ready", 30*time.Second); err != nil {
		return nil, err
	}
	probe, err := startStormChild(r.o.self, stormProbeCmd, "--file", probePath, "--interval", r.o.interval.String())
	if err != nil {
		return nil, err
	}
	defer probe.kill()
	if err := probe.expect(ctx, "ready", 30*time.Second); err != nil {
		return nil, err
	}
	bf, err := os.Open(burstPath)
	if err != nil {
		return nil, err
	}
	defer bf.Close()

	if err := sleepCtx(ctx, probeLead); err != nil {
		return nil, err
	}
	res := &stormResult{method: m, run: run, waits: map[string]int{}}
	goAt := monoNow()
	if _, err := io.WriteString(writer.stdin, "go\n"); err != nil {
		return nil, fmt.Errorf("writer: %w", err)
	}
	type writerResult struct {
		start, end int64
		writes     []time.Duration
		err        error
	}
	wdone := make(chan writerResult, 1)
	go func() {
		var w writerResult
		for line := range writer.lines {
			f := strings.Fields(line)
			switch {
			case len(f) == 3 && f[0] == "w":
				d, _ := strconv.ParseInt(f[2], 10, 64)
				w.writes = append(w.writes, time.Duration(d))
			case len(f) == 3 && f[0] == "done":
				w.start, _ = strconv.ParseInt(f[1], 10, 64)
				w.end, _ = strconv.ParseInt(f[2], 10, 64)
				wdone <- w
				return
			}
		}
		w.err = fmt.Errorf("writer exited early: %v", writer.wait())
		wdone <- w
	}()
	var daemonDone <-chan struct{}
	if d != nil {
		daemonDone = d.done
	}
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	deadline := goAt + r.o.maxWait.Nanoseconds()
	writerFinished := false
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-daemonDone:
			return nil, errors.New("flusherd exited during the run")
		case w := <-wdone:
			if w.err != nil {
				return nil, w.err
			}
			res.burstStart, res.burstEnd, res.writes = w.start, w.end, w.writes
			writerFinished = true
			continue
		case <-tick.C:
		}
		now := monoNow()
		dirty, wb, err := cachestatBytes(bf)
		if err != nil {
			return nil, err
		}
		res.samples = append(res.samples, stormSample{at: now, dirty: dirty, wb: wb})
		if d != nil {
			if est, ok := reclaimable(r.statsFile); ok {
				pd, _, _ := cachestatPath(probePath)
				res.ests = append(res.ests, estSample{est: est, truth: dirty + pd})
			}
		}
		res.sampleWaits(probe.cmd.Process.Pid)
		if writerFinished && dirty+wb == 0 {
			res.cleanAt = now
			break
		}
		if now > deadline {
			break
		}
	}
	if !writerFinished {
		// Not even the writer finished within --max-wait: its start is
		// the go time, near enough.
		writer.kill()
		res.burstStart, res.burstEnd = goAt, monoNow()
	}
	// Stop the probe and collect its calls. A probe call stuck behind
	// the throttle (not clean) is released by lifting the throttle.
	if _, err := io.WriteString(probe.stdin, "stop\n"); err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	recs, err := probe.collect(ctx, 5*time.Second)
	if errors.Is(err, errChildSlow) {
		r.knobs.restore(thr)
		recs, err = probe.collect(ctx, 60*time.Second)
	}
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	end := res.cleanAt
	if end == 0 {
		end = deadline
	}
	for _, p := range recs {
		if p.at <= end {
			res.probes = append(res.probes, p)
		}
	}
	return res, nil
}

// reclaimable reads BdiReclaimable (kB) from a flusherd stats file, in
// bytes; false when the file is not there yet or has no such line.
func reclaimable(path string) (uint64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for l := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(l, "BdiReclaimable:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return 0, false
			}
			n, err := strconv.ParseUint(f[0], 10, 64)
			return n * 1024, err == nil
		}
	}
	return 0, false
}

// cachestatPath is cachestatBytes of the file at path.
func cachestatPath(path string) (uint64, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	return cachestatBytes(f)
}

// estimateError summarises flusherd's dirty-bytes estimate against the
// cachestat truth over the samples: the median and the largest absolute
// error, in bytes.
func estimateError(es []estSample) (median, worst uint64) {
	var errs []uint64
	for _, e := range es {
		d := e.est - e.truth
		if e.truth > e.est {
			d = e.truth - e.est
		}
		errs = append(errs, d)
		worst = max(worst, d)
	}
	return medianOf(errs), worst
}

// cachestatBytes returns the dirty and writeback bytes of the whole file.
func cachestatBytes(f *os.File) (uint64, uint64, error) {
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
		return 0, 0, fmt.Errorf("cachestat %s: %w", f.Name(), err)
	}
	pg := uint64(os.Getpagesize())
	return cs.Dirty * pg, cs.Writeback * pg, nil
}

// sampleWaits records where the probe's threads in D state wait: the top
// frames of each one's kernel stack (/proc/PID/task/TID/stack).
func (res *stormResult) sampleWaits(pid int) {
	tids, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, t := range tids {
		stat, err := os.ReadFile(t + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'D' {
			continue
		}
		stack, err := os.ReadFile(t + "/stack")
		if err != nil {
			continue
		}
		res.waits[stackTop(string(stack), 3)]++
		res.waitSamples++
	}
}

// stackTop returns the first n function names of a /proc/PID/stack, the
// innermost first, joined by " < ".
func stackTop(stack string, n int) string {
	var fns []string
	for line := range strings.Lines(stack) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		fn, _, _ := strings.Cut(f[1], "+")
		fns = append(fns, fn)
		if len(fns) == n {
			break
		}
	}
	if len(fns) == 0 {
		return "(no stack: it had woken up)"
	}
	return strings.Join(fns, " < ")
}

// ---- children ----

type stormChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	exited chan struct{}
	err    error
}

var errChildSlow = errors.New("no answer in time")

// startStormChild re-executes this binary as a hidden command, in its own
// process group (a Ctrl-C is the bench's to handle) and killed if the
// bench dies.
func startStormChild(self string, args ...string) (*stormChild, error) {
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &stormChild{cmd: cmd, stdin: in, lines: make(chan string, 4096), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		c.err = cmd.Wait()
		close(c.lines)
		close(c.exited)
	}()
	return c, nil
}

// wait waits for the child to exit and returns its status.
func (c *stormChild) wait() error {
	<-c.exited
	return c.err
}

func (c *stormChild) expect(ctx context.Context, want string, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			return fmt.Errorf("%s exited: %v", filepath.Base(c.cmd.Args[1]), c.wait())
		}
		if l != want {
			return fmt.Errorf("%s: %q, want %q", c.cmd.Args[1], l, want)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("%s: %w", c.cmd.Args[1], errChildSlow)
	}
}

// collect reads the probe's records up to its "end" line.
func (c *stormChild) collect(ctx context.Context, limit time.Duration) ([]probeRec, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	var recs []probeRec
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				return nil, fmt.Errorf("exited before its end line: %v", c.wait())
			}
			if l == "end" {
				return recs, nil
			}
			p, err := parseProbeLine(l)
			if err != nil {
				return nil, err
			}
			recs = append(recs, p)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			return nil, errChildSlow
		}
	}
}

func parseProbeLine(l string) (probeRec, error) {
	f := strings.Fields(l)
	if len(f) != 4 || f[0] != "p" {
		return probeRec{}, fmt.Errorf("probe: bad line %q", l)
	}
	var v [3]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return probeRec{}, fmt.Errorf("probe: bad line %q", l)
		}
		v[i] = n
	}
	return probeRec{at: v[0], pwrite: time.Duration(v[1]), sync: time.Duration(v[2])}, nil
}

// kill kills the child if it still runs and waits for it.
func (c *stormChild) kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	c.cmd.Process.Kill()
	go func() {
		for range c.lines {
		}
	}()
	<-c.exited
}

// stormWriter is the bulk writer: it creates --file, says "ready", waits
// for a line on stdin, writes --bytes in 1 MiB write(2) calls, closes the
// file (no fsync), and prints "w START NS" per call and "done FIRST END"
// (CLOCK_MONOTONIC ns).
func stormWriter(args []string) int {
	fl := flag.NewFlagSet(stormWriterCmd, flag.ContinueOnError)
	path := fl.String("file", "", "file to create")
	total := fl.Int64("bytes", 0, "bytes to write")
	if err := fl.Parse(args); err != nil || *path == "" || *total <= 0 {
		return 2
	}
	debug.SetGCPercent(-1)
	fd, err := unix.Open(*path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "storm-writer: %s: %v\n", *path, err)
		return 1
	}
	buf := make([]byte, writeChunk)
	for i := range buf {
		buf[i] = byte(i*31 + 7)
	}
	n := int(*total/writeChunk) + 1
	starts, lats := make([]int64, 0, n), make([]int64, 0, n)
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 1
	}
	first := monoNow()
	for done := int64(0); done < *total; {
		t0 := monoNow()
		k, err := unix.Write(fd, buf[:min(int64(len(buf)), *total-done)])
		t1 := monoNow()
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "storm-writer: write %s: %v\n", *path, err)
			return 1
		}
		starts, lats = append(starts, t0), append(lats, t1-t0)
		done += int64(k)
	}
	end := monoNow()
	unix.Close(fd)
	out := bufio.NewWriter(os.Stdout)
	for i := range starts {
		fmt.Fprintf(out, "w %d %d\n", starts[i], lats[i])
	}
	fmt.Fprintf(out, "done %d %d\n", first, end)
	if out.Flush() != nil {
		return 1
	}
	return 0
}

// stormProbe is the latency probe: a 4 KiB pwrite at offset 0 of --file
// and an fdatasync, then a pause of --interval, until a line (or EOF) on
// stdin; "ready" after the first call, then "p START PWRITE_NS
// FDATASYNC_NS" per call (CLOCK_MONOTONIC) and "end".
func stormProbe(args []string) int {
	fl := flag.NewFlagSet(stormProbeCmd, flag.ContinueOnError)
	path := fl.String("file", "", "probe file")
	interval := fl.Duration("interval", 10*time.Millisecond, "pause between calls")
	if err := fl.Parse(args); err != nil || *path == "" {
		return 2
	}
	debug.SetGCPercent(-1)
	fd, err := unix.Open(*path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "storm-probe: %s: %v\n", *path, err)
		return 1
	}
	defer unix.Close(fd)
	var stop atomic.Bool
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		stop.Store(true)
	}()
	buf := bytes.Repeat([]byte{'q'}, probeSize)
	recs := make([]probeRec, 0, 1<<16)
	for i := 0; !stop.Load(); i++ {
		buf[0] = byte(i)
		t0 := monoNow()
		_, err := unix.Pwrite(fd, buf, 0)
		t1 := monoNow()
		if err == nil {
			err = unix.Fdatasync(fd)
		}
		t2 := monoNow()
		if err != nil && err != unix.EINTR {
			fmt.Fprintf(os.Stderr, "storm-probe: %s: %v\n", *path, err)
			return 1
		}
		recs = append(recs, probeRec{at: t0, pwrite: time.Duration(t1 - t0), sync: time.Duration(t2 - t1)})
		if i == 0 {
			fmt.Println("ready")
		}
		time.Sleep(*interval)
	}
	out := bufio.NewWriter(os.Stdout)
	for _, p := range recs {
		fmt.Fprintf(out, "p %d %d %d\n", p.at, p.pwrite, p.sync)
	}
	fmt.Fprintln(out, "end")
	if out.Flush() != nil {
		return 1
	}
	return 0
}

// ---- results ----

type stormStats struct {
	probes              int
	p50, p99, max       time.Duration // probe fdatasync
	pwriteMax           time.Duration
	stalled             time.Duration // time in probe calls (pwrite+fdatasync) over stallOver
	wP99, wMax          time.Duration // writer's write(2)
	toClean             time.Duration // notClean if not clean
	peakDirty, peakBoth uint64
}

// percentile returns the p-th percentile (0 < p ≤ 100) of ds by nearest
// rank: the smallest value that at least p% of the values do not exceed.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// stalledTime is the total time spent in calls longer than over.
func stalledTime(ds []time.Duration, over time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		if d > over {
			t += d
		}
	}
	return t
}

// peaks returns the largest dirty, and dirty+writeback, of the samples.
func peaks(ss []stormSample) (dirty, both uint64) {
	for _, s := range ss {
		dirty, both = max(dirty, s.dirty), max(both, s.dirty+s.wb)
	}
	return dirty, both
}

func (res *stormResult) stats() stormStats {
	var syncs, calls []time.Duration
	var pw time.Duration
	for _, p := range res.probes {
		syncs = append(syncs, p.sync)
		calls = append(calls, p.pwrite+p.sync)
		pw = max(pw, p.pwrite)
	}
	st := stormStats{
		probes:    len(res.probes),
		p50:       percentile(syncs, 50),
		p99:       percentile(syncs, 99),
		max:       percentile(syncs, 100),
		pwriteMax: pw,
		stalled:   stalledTime(calls, stallOver),
		wP99:      percentile(res.writes, 99),
		wMax:      percentile(res.writes, 100),
		toClean:   notClean,
	}
	if res.cleanAt != 0 {
		st.toClean = time.Duration(res.cleanAt - res.burstStart)
	}
	st.peakDirty, st.peakBoth = peaks(res.samples)
	return st
}

// medianOf returns the median of xs (the upper one of an even count, as
// median does).
func medianOf[T int | uint64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// medianStats is the field-by-field median of runs.
func medianStats(ss []stormStats) stormStats {
	pick := func(f func(stormStats) time.Duration) time.Duration {
		var v []time.Duration
		for _, s := range ss {
			v = append(v, f(s))
		}
		return medianOf(v)
	}
	pickU := func(f func(stormStats) uint64) uint64 {
		var v []uint64
		for _, s := range ss {
			v = append(v, f(s))
		}
		return medianOf(v)
	}
	var n []int
	for _, s := range ss {
		n = append(n, s.probes)
	}
	return stormStats{
		probes:    medianOf(n),
		p50:       pick(func(s stormStats) time.Duration { return s.p50 }),
		p99:       pick(func(s stormStats) time.Duration { return s.p99 }),
		max:       pick(func(s stormStats) time.Duration { return s.max }),
		pwriteMax: pick(func(s stormStats) time.Duration { return s.pwriteMax }),
		stalled:   pick(func(s stormStats) time.Duration { return s.stalled }),
		wP99:      pick(func(s stormStats) time.Duration { return s.wP99 }),
		wMax:      pick(func(s stormStats) time.Duration { return s.wMax }),
		toClean:   pick(func(s stormStats) time.Duration { return s.toClean }),
		peakDirty: pickU(func(s stormStats) uint64 { return s.peakDirty }),
		peakBoth:  pickU(func(s stormStats) uint64 { return s.peakBoth }),
	}
}

func fmtMs(d time.Duration) string {
	ms := float64(d) / 1e6
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f", ms)
	case ms < 1000:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

func cleanCell(d, maxWait time.Duration) string {
	if d == notClean {
		return fmt.Sprintf("not clean (> %v)", maxWait)
	}
	return fmt.Sprintf("%.1f", d.Seconds())
}

func mibOf(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

var stormHeader = []string{"method", "runs", "probe fdatasync p50 (ms)", "p99 (ms)", "max (ms)",
	"probe stalled, in calls > 100 ms (s)", "write() p99 (ms)", "write() max (ms)",
	"burst start -> clean (s)", "peak dirty (MiB)", "peak dirty+writeback (MiB)"}

func (r *stormRun) statsRow(name, runs string, st stormStats) []string {
	return []string{name, runs, fmtMs(st.p50), fmtMs(st.p99), fmtMs(st.max),
		fmt.Sprintf("%.2f", st.stalled.Seconds()), fmtMs(st.wP99), fmtMs(st.wMax),
		cleanCell(st.toClean, r.o.maxWait), mibOf(st.peakDirty), mibOf(st.peakBoth)}
}

func (r *stormRun) printReport(w io.Writer, results map[byte][]*stormResult) {
	var u unix.Utsname
	unix.Uname(&u)
	o := r.o
	fmt.Fprintf(w, "\nstorm: a %s burst (1 MiB write() calls, no fsync) on a %d MiB ext4 on a direct-I/O loop device throttled to %s/s (blkio, root cgroup)\n",
		sizeString(o.burst), r.sizeMB, sizeString(o.rate))
	fmt.Fprintf(w, "machine: Linux %s, %d cores, %.1f GiB RAM; %s\n", unix.ByteSliceToString(u.Release[:]), runtime.NumCPU(),
		float64(meminfoKB().total)/(1<<20), runtime.Version())
	fmt.Fprintf(w, "kernel settings (method k): vm.dirty_background_bytes=%s dirty_background_ratio=%s dirty_bytes=%s dirty_ratio=%s dirty_expire_centisecs=%s dirty_writeback_centisecs=%s\n",
		r.vm["dirty_background_bytes"], r.vm["dirty_background_ratio"], r.vm["dirty_bytes"], r.vm["dirty_ratio"], r.vm["dirty_expire_centisecs"], r.vm["dirty_writeback_centisecs"])
	if r.queue != "" {
		fmt.Fprintf(w, "loop device queue (as attached): %s\n", r.queue)
	}
	fmt.Fprintf(w, "probe: 4 KiB pwrite at offset 0 + fdatasync, closed loop with %v between calls, from %v before the burst until the burst file is clean; stalled = time in calls (pwrite+fdatasync) over %v\n",
		o.interval, probeLead, stallOver)
	if slices.Contains(o.methods, 'f') {
		fmt.Fprintf(w, "f: flusherd %s with its defaults and: %s\n", flusherdVersion(o.bin), strings.Join(strings.Fields(o.fConfig), " "))
	}
	fmt.Fprintf(w, "\nmedian of %d interleaved run(s) per method:\n", o.runs)
	var cells [][]string
	for _, m := range o.methods {
		rs := results[m]
		if len(rs) == 0 {
			continue
		}
		var ss []stormStats
		for _, res := range rs {
			ss = append(ss, res.stats())
		}
		cells = append(cells, r.statsRow(r.methodName(m), strconv.Itoa(len(rs)), medianStats(ss)))
	}
	if len(cells) == 0 {
		fmt.Fprintln(w, "no run finished")
		return
	}
	markdownTable(w, stormHeader, cells)
	if o.verbose {
		fmt.Fprintln(w, "\nper run:")
		cells = nil
		for _, m := range o.methods {
			for _, res := range results[m] {
				cells = append(cells, r.statsRow(r.methodName(m), fmt.Sprintf("run %d", res.run), res.stats()))
			}
		}
		markdownTable(w, stormHeader, cells)
		fmt.Fprintln(w, "\nprobe calls, and the longest pwrite (ms), per run:")
		for _, m := range o.methods {
			for _, res := range results[m] {
				st := res.stats()
				fmt.Fprintf(w, "  %s run %d: %d calls, pwrite max %s ms\n", r.methodName(m), res.run, st.probes, fmtMs(st.pwriteMax))
			}
		}
	}
	for _, res := range results['f'] {
		if len(res.ests) == 0 {
			continue
		}
		med, worst := estimateError(res.ests)
		fmt.Fprintf(w, "\nf run %d: flusherd's dirty bytes (stats file BdiReclaimable, rewritten at most once a second) against cachestat of the tree, %d samples every %v: median error %s MiB, largest %s MiB",
			res.run, len(res.ests), sampleEvery, mibOf(med), mibOf(worst))
	}
	if len(results['f']) > 0 {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nwhere the probe waited (kernel stack tops of its threads in D state, sampled every %v over all runs):\n", sampleEvery)
	for _, m := range o.methods {
		total := 0
		counts := map[string]int{}
		for _, res := range results[m] {
			total += res.waitSamples
			for k, v := range res.waits {
				counts[k] += v
			}
		}
		if len(results[m]) == 0 {
			continue
		}
		if total == 0 {
			fmt.Fprintf(w, "  %s: never seen in D state\n", r.methodName(m))
			continue
		}
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			return counts[keys[i]] > counts[keys[j]] || counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j]
		})
		fmt.Fprintf(w, "  %s: %d samples\n", r.methodName(m), total)
		for _, k := range keys[:min(len(keys), 4)] {
			fmt.Fprintf(w, "    %5.1f%%  %s\n", 100*float64(counts[k])/float64(total), k)
		}
	}
}

func sizeString(n int64) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

func flusherdVersion(bin string) string {
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "flusherd"))
}

// ---- plots ----

// plot draws, one above the other, the burst file's dirty (solid) and
// dirty+writeback (dashed) MiB, and the probe's fdatasync latency (log
// scale), against the seconds since the burst began, one colour per
// method.
func (r *stormRun) plot(path string, runs []*stormResult) error {
	pd := plot.New()
	pd.Title.Text = fmt.Sprintf("burst file page cache (%s burst at %s/s; solid: dirty, dashed: dirty+writeback)", sizeString(r.o.burst), sizeString(r.o.rate))
	pd.X.Label.Text = "seconds since the burst began"
	pd.Y.Label.Text = "MiB"
	pd.Legend.Top = true
	pl := plot.New()
	pl.Title.Text = fmt.Sprintf("probe fdatasync latency (4 KiB pwrite + fdatasync, %v after each; each call drawn over its duration)", r.o.interval)
	pl.X.Label.Text = "seconds since the burst began"
	pl.Y.Label.Text = "ms (log scale)"
	pl.Y.Scale = plot.LogScale{}
	pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	xmax := 0.0
	for i, res := range runs {
		name := r.methodName(res.method)
		secs := func(at int64) float64 { return float64(at-res.burstStart) / 1e9 }
		dirty, both := make(plotter.XYs, len(res.samples)), make(plotter.XYs, len(res.samples))
		for j, s := range res.samples {
			dirty[j] = plotter.XY{X: secs(s.at), Y: float64(s.dirty) / (1 << 20)}
			both[j] = plotter.XY{X: secs(s.at), Y: float64(s.dirty+s.wb) / (1 << 20)}
		}
		// Each call is a flat step over its own duration at the height of
		// its fdatasync latency: a stall shows as the span it covered.
		lat := make(plotter.XYs, 0, 2*len(res.probes))
		for _, p := range res.probes {
			y := max(float64(p.sync)/1e6, 0.01)
			lat = append(lat, plotter.XY{X: secs(p.at), Y: y}, plotter.XY{X: secs(p.at + int64(p.pwrite+p.sync)), Y: y})
		}
		if len(res.samples) > 0 {
			xmax = max(xmax, secs(res.samples[len(res.samples)-1].at))
		}
		col := plotutil.Color(i)
		for _, l := range []struct {
			xy     plotter.XYs
			p      *plot.Plot
			dashed bool
		}{{dirty, pd, false}, {both, pd, true}, {lat, pl, false}} {
			if len(l.xy) == 0 {
				continue
			}
			line, err := plotter.NewLine(l.xy)
			if err != nil {
				return err
			}
			line.Color = col
			line.Width = vg.Points(1.2)
			if l.dashed {
				line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			} else {
				l.p.Legend.Add(name, line)
			}
			l.p.Add(line)
		}
	}
	// Room above the lines for the legend, and a decade below the
	// probe's lines for its legend.
	pd.Y.Min, pd.Y.Max = 0, float64(r.o.burst)/(1<<20)*1.3
	pl.Y.Min = 0.01
	pl.Legend.Top = false
	// The same time axis on both: from the probe's start.
	pd.X.Min, pl.X.Min = -probeLead.Seconds(), -probeLead.Seconds()
	pd.X.Max, pl.X.Max = xmax, xmax
	img := vgimg.New(vg.Points(960), vg.Points(840))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(12), PadY: vg.Points(24)}
	plots := [][]*plot.Plot{{pd}, {pl}}
	canvases := plot.Align(plots, tiles, dc)
	pd.Draw(canvases[0][0])
	pl.Draw(canvases[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
