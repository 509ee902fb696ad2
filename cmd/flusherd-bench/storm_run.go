package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
)

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
	probe     string // the probe of the runs (probeKinds)
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
	estAt                int64 // the last sum of the tree's dirty bytes (monotonic ns)
	method               byte
	run                  int
	burstStart, burstEnd int64 // the writer's first write and its end (monotonic ns)
	writes               []time.Duration
	probes               []probeRec
	samples              []stormSample
	cleanAt              int64 // 0: not clean within --max-wait
	endAt                int64 // the run's last sample: the probe's commits up to it count
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
	fs, err := benchFS(testfs.Options{Type: "ext4", SizeMB: r.sizeMB, DirectIO: true, ImageDir: dir, Allocated: r.o.allocated})
	if err != nil {
		return nil, err
	}
	defer closeFS(fs, "storm")
	if r.o.scheduler != "" {
		// The loop device is this run's: detached with it, nothing to restore.
		if err := os.WriteFile("/sys/block/"+filepath.Base(fs.Device)+"/queue/scheduler", []byte(r.o.scheduler), 0o644); err != nil {
			return nil, fmt.Errorf("--scheduler %q on %s: %w", r.o.scheduler, fs.Device, err)
		}
	}
	r.noteQueue(fs.Device)
	burstPath := filepath.Join(fs.Dir, "burst")
	probeDir := filepath.Join(fs.Dir, "probe")
	if err := os.Mkdir(probeDir, 0o755); err != nil {
		return nil, err
	}
	probe := r.newProber(r.probe)
	defer probe.tearDown()
	if err := probe.setUp(ctx, probeDir); err != nil {
		return nil, fmt.Errorf("probe %s: %w", r.probe, err)
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
		res, err = r.measure(ctx, m, run, fs, probe, probeDir, burstPath, d)
		if err != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w\ndaemon log (last lines):\n%s", err, tail(d.logText(), 20))
		}
		return res, err
	}
	return r.measure(ctx, m, run, fs, probe, probeDir, burstPath, nil)
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
// samples until the burst file is clean and --min-time has passed.
func (r *stormRun) measure(ctx context.Context, m byte, run int, fs *testfs.FS, probe prober, probeDir, burstPath string, d *daemon) (*stormResult, error) {
	// Nothing else dirty anywhere at the start.
	unix.Sync()
	release := func() {}
	if r.o.rate > 0 {
		thr, err := setThrottle(r.knobs, fs.MajMin, r.o.rate)
		if err != nil {
			return nil, err
		}
		defer r.knobs.restore(thr)
		release = func() { r.knobs.restore(thr) }
	}
	if d != nil && r.o.warmup > 0 {
		if err := warmUp(ctx, d, filepath.Join(filepath.Dir(burstPath), "warmup"), r.o.warmup, r.o.maxWait); err != nil {
			return nil, fmt.Errorf("--warmup: %w", err)
		}
	}
	writer, err := r.startWriter(ctx, burstPath)
	if err != nil {
		return nil, err
	}
	if writer != nil {
		defer writer.kill()
	}
	if err := probe.start(ctx); err != nil {
		return nil, fmt.Errorf("probe %s: %w", r.probe, err)
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
	s := stormSampler{bf: bf, probeDir: probeDir, probePid: probe.waitPid(), d: d, statsFile: r.statsFile}
	var wdone <-chan stormWrites
	if writer != nil {
		if _, err := io.WriteString(writer.stdin, "go\n"); err != nil {
			return nil, fmt.Errorf("writer: %w", err)
		}
		wdone = readWrites(writer)
	} else {
		// The probe alone: a burst of nothing, at once.
		c := make(chan stormWrites, 1)
		c <- stormWrites{start: goAt, end: goAt}
		wdone = c
	}
	s.notBefore = goAt + r.o.minTime.Nanoseconds()
	deadline := goAt + r.o.maxWait.Nanoseconds()
	writerFinished, err := s.untilClean(ctx, res, wdone, deadline)
	if err != nil {
		return nil, err
	}
	if !writerFinished {
		// Not even the writer finished within --max-wait: its start is
		// the go time, near enough.
		writer.kill()
		res.burstStart, res.burstEnd = goAt, monoNow()
	}
	recs, err := probe.stop(ctx, release)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", r.probe, err)
	}
	for _, p := range recs {
		if p.at <= res.endAt {
			res.probes = append(res.probes, p)
		}
	}
	return res, nil
}

// warmUp writes n bytes to path (1 MiB writes, no sync), waits until
// cachestat shows none of them dirty or under writeback (daemon d has
// written them back), at most wait and while d runs, then removes the
// file and syncs.
func warmUp(ctx context.Context, d *daemon, path string, n int64, wait time.Duration) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	defer f.Close()
	buf := bytes.Repeat([]byte{'w'}, writeChunk)
	for left := n; left > 0; left -= int64(len(buf)) {
		if _, err := f.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			return err
		}
	}
	var dirty, wb uint64
	if !waitFor(ctx, d, wait, func() bool {
		dirty, wb, err = cachestatBytes(f)
		return err == nil && dirty+wb == 0
	}) {
		if err == nil {
			err = fmt.Errorf("%s: %d bytes dirty and %d under writeback after %v (or the daemon exited)", path, dirty, wb, wait)
		}
		return err
	}
	if err := os.Remove(path); err != nil {
		return err
	}
	unix.Sync()
	return nil
}

// startWriter starts the bulk writer and waits for it to say it is
// ready; with no burst (--burst 0) it makes the burst file empty and
// returns nil.
func (r *stormRun) startWriter(ctx context.Context, burstPath string) (*stormChild, error) {
	if r.o.burst == 0 {
		return nil, writeSynced(burstPath, 0)
	}
	writer, err := startStormChild(r.o.self, stormWriterCmd, "--file", burstPath, "--bytes", strconv.FormatInt(r.o.burst, 10), "--size", strconv.FormatInt(r.o.writeSize, 10))
	if err != nil {
		return nil, err
	}
	if err := writer.expect(ctx, "ready", 30*time.Second); err != nil {
		writer.kill()
		return nil, err
	}
	return writer, nil
}
