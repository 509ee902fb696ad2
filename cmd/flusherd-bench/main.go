// Command flusherd-bench runs flusherd's experiments and benchmarks against
// the real daemon binary and prints their results as tables. It needs root
// (it mounts FUSE and loop filesystems).
//
//	flusherd-bench blocked [--flusherd BIN] [--phases abc]
//
// blocked compares requeue_blocked = "io_wait" with "redirty_tail", side by
// side in one run, on FUSE filesystems whose opens fail or stall on demand
// (internal/faultfs):
//
//	(a) unblock latency: 50 files whose opens fail with EAGAIN (--a-error) for 20s;
//	    the time from unblock until cachestat shows each clean.
//	(b) starvation: a file appended every 20ms for 60s whose every
//	    writeback attempt sees a redirty (its open takes 30ms); the longest
//	    time any byte stayed dirty.
//	(c) no busy loop: 1,000 files blocked for 60s (--c-error: their opens
//	    fail with ENOTCONN, a dead FUSE server, or EAGAIN); the daemon's context
//	    switches per second once the pause has saturated, and its CPU time.
//
//	flusherd-bench plug [--fs ext4,xfs] [--small N] [--large N] [--runs N]
//	flusherd-bench watch [--backends inotify,fanotify] [--inodes 100000,1000000] [--idle 60s] ...
//
// watch measures the daemon's cost of watching (watch.go): event ingest
// rate and CPU, RSS per tracked inode, and idle wakeups.
//
//	flusherd-bench storm [--burst 1GiB] [--rate 41943040] [--runs 3] [--methods ktfw] [--png storm.png] ...
//
// storm measures a writeback storm on a slow disk (storm.go): a burst
// written without fsync to a loop device throttled to disk speed, and the
// fdatasync latency of a small probe beside it, under the kernel's
// defaults (k), a lower vm.dirty_background_bytes (t), a wbt latency
// target (w) and flusherd (f).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"flusherd/internal/faultfs"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		out := os.Stdout // asked for: on standard output, as --help of a command
		if len(os.Args) < 2 {
			out = os.Stderr
		}
		fmt.Fprint(out, "Usage:\n  flusherd-bench blocked [--flusherd BIN] [--phases abc]\n  flusherd-bench plug [--fs ext4,xfs] [--small N] [--large N] [--runs N] [--methods abcdei] [--queue-depth 8] [--cpuprofile FILE]\n  flusherd-bench watch [--backends inotify,fanotify] [--inodes 100000,1000000] [--idle 60s] [--writers 8] [--files 10000] [--duration 10s] [--fs ext4] [--modes pwrite,reopen] [--placement shared,service] [--range-bytes 1MiB]\n  flusherd-bench storm [--burst 1GiB] [--rate 41943040] [--runs 3] [--methods ktfw] [--max-wait 180s] [--wbt-lat 75000] [--f-config TOML] [--flusherd BIN] [--png storm.png] [--fs-mib N] [--verbose]\n\nblocked: the blocked-files experiment (io_wait beside redirty_tail).\nplug: time to clean a tree of dirty files with flusherd (plug on, off, integrity) against a per-file fdatasync loop and syncfs.\nwatch: the daemon's cost of watching: event ingest rate and CPU, RSS per tracked inode, idle wakeups.\nstorm: a writeback storm on a throttled loop device: a small fdatasync probe's latency and the burst's time to clean, kernel defaults against tuned sysctls, wbt and flusherd.\nAll need root and print tables. flusherd-bench COMMAND --help lists a command's flags.\n")
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		os.Exit(0)
	}
	switch os.Args[1] {
	case "blocked":
		os.Exit(blocked(os.Args[2:]))
	case "plug":
		os.Exit(plugBench(os.Args[2:]))
	case "watch":
		os.Exit(watchBench(os.Args[2:]))
	case watchWriterCmd: // internal: one writer process of watch
		os.Exit(watchWriter(os.Args[2:]))
	case "storm":
		os.Exit(stormBench(os.Args[2:]))
	case stormWriterCmd: // internal: storm's bulk writer
		os.Exit(stormWriter(os.Args[2:]))
	case stormProbeCmd: // internal: storm's latency probe
		os.Exit(stormProbe(os.Args[2:]))
	}
	fmt.Fprintf(os.Stderr, "flusherd-bench: unknown command %q\n", os.Args[1])
	os.Exit(2)
}

// letters checks a flag of one-letter choices (--methods, --phases):
// each letter one of allowed, at most once, and at least one.
func letters(flagName, value, allowed string) error {
	if value == "" {
		return fmt.Errorf("--%s is empty: want some of %s", flagName, allowed)
	}
	for i, c := range value {
		if !strings.ContainsRune(allowed, c) || strings.ContainsRune(value[:i], c) {
			return fmt.Errorf("--%s %q: each of %s at most once", flagName, value, allowed)
		}
	}
	return nil
}

// needMkfs checks that mkfs.<type> is installed for every filesystem
// type, before a bench spends minutes on the first one.
func needMkfs(fstypes []string) error {
	for _, t := range fstypes {
		if _, err := exec.LookPath("mkfs." + t); err != nil {
			return fmt.Errorf("--fs %s needs mkfs.%s (e2fsprogs for ext4, xfsprogs for xfs): %w", t, t, err)
		}
	}
	return nil
}

// newFlags is a command's flag set, whose --help says what the command
// does and gives an example before the flags.
func newFlags(name, summary, example string) *flag.FlagSet {
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "Usage: flusherd-bench %s [flags]\n\n%s\nNeeds root; prints a table.\n\nExample:\n  %s\n\nFlags:\n", name, summary, example)
		fl.PrintDefaults()
	}
	return fl
}

// parseFlags parses args into fl. It reports false, with the exit code,
// when the command is not to run: 0 after --help, 2 after a bad flag
// (flag has printed why and the usage).
func parseFlags(fl *flag.FlagSet, args []string) (code int, ok bool) {
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

// buildFlusherd builds cmd/flusherd into dir.
func buildFlusherd(dir string) (string, error) {
	bin := filepath.Join(dir, "flusherd")
	out, err := exec.Command("go", "build", "-o", bin, "./cmd/flusherd").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/flusherd (run from the repository root): %v\n%s", err, out)
	}
	return bin, nil
}

// daemon is a running flusherd.
type daemon struct {
	cmd  *exec.Cmd
	log  *bytes.Buffer
	mu   sync.Mutex
	done chan struct{}
}

func (d *daemon) logText() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

type lockedWriter struct{ d *daemon }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.d.log.Write(p)
}

func startDaemon(bin, dir, configText string) (*daemon, error) {
	return startDaemonAttr(bin, dir, configText, nil)
}

// startDaemonAttr is startDaemon with the child's process attributes.
func startDaemonAttr(bin, dir, configText string, attr *syscall.SysProcAttr) (*daemon, error) {
	cfg := filepath.Join(dir, "flusherd.toml")
	if err := os.WriteFile(cfg, []byte(configText), 0o644); err != nil {
		return nil, err
	}
	d := &daemon{log: &bytes.Buffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, "run", "--config", cfg, "--stats-dir", filepath.Join(dir, "run"))
	d.cmd.Stdout = lockedWriter{d}
	d.cmd.Stderr = lockedWriter{d}
	d.cmd.SysProcAttr = attr
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(d.logText(), "ready") {
		select {
		case <-d.done:
			return nil, fmt.Errorf("flusherd exited: %s", d.logText())
		default:
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, fmt.Errorf("flusherd not ready: %s", d.logText())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return d, nil
}

func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// kill sends SIGKILL, if the daemon still runs, and waits for it to exit.
func (d *daemon) kill() {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Kill()
	<-d.done
}

// cpu returns the process's user+system CPU time (procfs: utime + stime
// of /proc/PID/stat, counted in USER_HZ ticks).
func (d *daemon) cpu() time.Duration {
	p, err := procfs.NewProc(d.cmd.Process.Pid)
	if err != nil {
		return 0
	}
	st, err := p.Stat()
	if err != nil {
		return 0
	}
	return time.Duration(st.CPUTime() * float64(time.Second))
}

// switches returns the context switches, voluntary and not, of all the
// process's threads: every wakeup of the writeback goroutine costs at least
// one, so their rate bounds the wakeups from above.
func (d *daemon) switches() uint64 {
	threads, err := procfs.AllThreads(d.cmd.Process.Pid)
	if err != nil {
		return 0
	}
	var n uint64
	for _, t := range threads {
		if s, err := t.NewStatus(); err == nil {
			n += s.VoluntaryCtxtSwitches + s.NonVoluntaryCtxtSwitches
		}
	}
	return n
}

// pages returns cachestat's dirty and writeback pages of [0, n) of f (n 0:
// all).
func pages(f *os.File, n int64) (uint64, uint64) {
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Len: uint64(n)}, &cs, 0); err != nil {
		return ^uint64(0), 0
	}
	return cs.Dirty, cs.Writeback
}

// setup is one policy's FUSE mount and daemon.
type setup struct {
	policy string
	fs     *faultfs.FS
	d      *daemon
	dir    string
}

func newSetup(bin, policy, daemonConfig string) (*setup, error) {
	dir, err := os.MkdirTemp("", "flusherd-bench-"+policy+"-")
	if err != nil {
		return nil, err
	}
	mnt, backing := filepath.Join(dir, "mnt"), filepath.Join(dir, "backing")
	os.Mkdir(mnt, 0o755)
	os.Mkdir(backing, 0o755)
	ffs, err := faultfs.Mount(mnt, backing)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	d, err := startDaemon(bin, dir, fmt.Sprintf("%s\nrequeue_blocked = %q\n[[watch]]\npath = %q\n", daemonConfig, policy, mnt))
	if err != nil {
		ffs.Unmount()
		os.RemoveAll(dir)
		return nil, err
	}
	return &setup{policy: policy, fs: ffs, d: d, dir: dir}, nil
}

func (s *setup) close() {
	s.d.stop()
	if err := s.fs.Unmount(); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench:", err)
	}
	os.RemoveAll(s.dir)
}

// createFiles creates n files and keeps them open: on a FUSE
// writeback-cache mount, closing a file flushes it.
func createFiles(dir string, n int) ([]*os.File, error) {
	var fs []*os.File
	for i := range n {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%04d", i)))
		if err != nil {
			for _, f := range fs {
				f.Close()
			}
			return nil, err
		}
		fs = append(fs, f)
	}
	return fs, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

const baseConfig = `[writeback]
dirty_expire_interval = "5s"
dirty_writeback_interval = "1s"
min_pause = "10ms"
max_pause = "1s"
attempt_timeout = "10s"`

type row struct {
	name string
	vals map[string]string
}

var policies = []string{"io_wait", "redirty_tail"}

func blocked(args []string) int {
	fl := newFlags("blocked", "the blocked-files experiment: requeue_blocked = \"io_wait\" beside \"redirty_tail\", each with its own daemon and FUSE filesystem whose opens fail or stall on demand.", "go run ./cmd/flusherd-bench blocked --phases c")
	bin := fl.String("flusherd", "", "flusherd binary (default: go build ./cmd/flusherd)")
	phases := fl.String("phases", "abc", "which experiments to run")
	blockFor := fl.Duration("block", 20*time.Second, "(a) how long opens fail")
	runFor := fl.Duration("run", 60*time.Second, "(b), (c) run time")
	aErr := fl.String("a-error", "EAGAIN", "(a) the error of every open while blocked: EAGAIN or ENOTCONN")
	cErr := fl.String("c-error", "ENOTCONN", "(c) the error of every open: ENOTCONN (a FUSE server that died: the device is probed) or EAGAIN (a file-level block: each file is retried)")
	if code, ok := parseFlags(fl, args); !ok {
		return code
	}
	if err := letters("phases", *phases, "abc"); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench blocked:", err)
		return 2
	}
	if err := faultfs.Available(); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench:", err)
		return 1
	}
	if *bin == "" {
		tmp, err := os.MkdirTemp("", "flusherd-bench-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		if *bin, err = buildFlusherd(tmp); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	var rows []row
	run := func(name string, f func(s *setup) ([]row, error)) bool {
		results := make([][]row, len(policies))
		errs := make([]error, len(policies))
		var wg sync.WaitGroup
		for i, p := range policies {
			wg.Go(func() {
				s, err := newSetup(*bin, p, baseConfig)
				if err != nil {
					errs[i] = err
					return
				}
				defer s.close()
				results[i], errs[i] = f(s)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				fmt.Fprintf(os.Stderr, "flusherd-bench: %s (%s): %v\n", name, policies[i], err)
				return false
			}
		}
		for j := range results[0] {
			r := row{name: results[0][j].name, vals: map[string]string{}}
			for i, p := range policies {
				r.vals[p] = results[i][j].vals[p]
			}
			rows = append(rows, r)
		}
		return true
	}
	errnos := map[string]syscall.Errno{"ENOTCONN": syscall.ENOTCONN, "EAGAIN": syscall.EAGAIN}
	aErrno, okA := errnos[*aErr]
	cErrno, okC := errnos[*cErr]
	if !okA || !okC {
		fmt.Fprintf(os.Stderr, "flusherd-bench blocked: --a-error %q, --c-error %q: each is ENOTCONN or EAGAIN\n", *aErr, *cErr)
		return 2
	}
	if strings.Contains(*phases, "a") && !run("(a)", func(s *setup) ([]row, error) { return unblockLatency(s, *blockFor, aErrno) }) {
		return 1
	}
	if strings.Contains(*phases, "b") && !run("(b)", func(s *setup) ([]row, error) { return starvation(s, *runFor) }) {
		return 1
	}
	if strings.Contains(*phases, "c") && !run("(c)", func(s *setup) ([]row, error) { return busyLoop(s, *runFor, cErrno) }) {
		return 1
	}
	printTable(os.Stdout, rows)
	return 0
}

func printTable(w io.Writer, rows []row) {
	var cells [][]string
	for _, r := range rows {
		cells = append(cells, []string{r.name, r.vals[policies[0]], r.vals[policies[1]]})
	}
	markdownTable(w, []string{"measure", policies[0], policies[1]}, cells)
}

// markdownTable writes a Markdown table, its columns aligned by
// text/tabwriter.
func markdownTable(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(cells []string) {
		for _, c := range cells {
			fmt.Fprintf(tw, "| %s\t", c)
		}
		fmt.Fprintln(tw, "|")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	tw.Flush()
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// unblockLatency is experiment (a): 50 files whose opens fail with errno
// for blockFor.
func unblockLatency(s *setup, blockFor time.Duration, errno syscall.Errno) ([]row, error) {
	files, err := createFiles(s.fs.Dir, 50)
	if err != nil {
		return nil, err
	}
	defer closeAll(files)
	s.fs.Set(faultfs.Faults{OpenErr: errno})
	for _, f := range files {
		if _, err := f.Write(make([]byte, 64<<10)); err != nil {
			return nil, err
		}
	}
	time.Sleep(blockFor)
	for _, f := range files {
		if d, _ := pages(f, 0); d == 0 {
			return nil, fmt.Errorf("%s was cleaned while blocked", f.Name())
		}
	}
	opensBlocked := s.fs.Count("open")
	s.fs.Set(faultfs.Faults{})
	unblocked := time.Now()
	lat := make([]time.Duration, len(files))
	left := len(files)
	for left > 0 {
		if time.Since(unblocked) > 2*time.Minute {
			return nil, fmt.Errorf("%d files still dirty 2 minutes after unblock", left)
		}
		for i, f := range files {
			if lat[i] != 0 {
				continue
			}
			if d, wb := pages(f, 0); d == 0 && wb == 0 {
				lat[i] = time.Since(unblocked)
				left--
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	p := s.policy
	return []row{
		{fmt.Sprintf("(a) unblock (%s) -> clean, median of 50 files", unix.ErrnoName(errno)), map[string]string{p: secs(median(lat))}},
		{"(a) unblock -> clean, slowest of 50 files", map[string]string{p: secs(slices.Max(lat))}},
		{"(a) failed opens while blocked (20s)", map[string]string{p: strconv.Itoa(opensBlocked)}},
	}, nil
}

// starvation is experiment (b).
func starvation(s *setup, runFor time.Duration) ([]row, error) {
	files, err := createFiles(s.fs.Dir, 1)
	if err != nil {
		return nil, err
	}
	defer closeAll(files)
	f := files[0]
	// Every attempt's open takes 30ms, longer than the 20ms between
	// appends: each attempt sees a redirty.
	s.fs.Set(faultfs.Faults{OpenDelay: 30 * time.Millisecond})
	type checkpoint struct {
		at  time.Time
		end int64
	}
	var (
		mu      sync.Mutex
		pending []checkpoint
		worst   time.Duration
	)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var size int64
		line := []byte(strings.Repeat("x", 99) + "\n")
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-t.C:
			}
			n, err := f.Write(line)
			if err != nil {
				done <- err
				return
			}
			size += int64(n)
			if full := size / 4096 * 4096; full > 0 {
				mu.Lock()
				pending = append(pending, checkpoint{time.Now(), full})
				mu.Unlock()
			}
		}
	}()
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		for len(pending) > 0 {
			c := pending[0]
			if d, wb := pages(f, c.end); d != 0 || wb != 0 {
				return
			}
			worst = max(worst, time.Since(c.at))
			pending = pending[1:]
		}
	}
	end := time.Now().Add(runFor)
	for time.Now().Before(end) {
		check()
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	if err := <-done; err != nil {
		return nil, err
	}
	// What is still dirty at the end counts with its age so far.
	check()
	mu.Lock()
	if len(pending) > 0 {
		worst = max(worst, time.Since(pending[0].at))
	}
	mu.Unlock()
	p := s.policy
	return []row{
		{fmt.Sprintf("(b) longest any byte stayed dirty (%v run)", runFor), map[string]string{p: secs(worst)}},
	}, nil
}

// busyLoop is experiment (c): 1,000 files whose every open fails with
// errno.
func busyLoop(s *setup, runFor time.Duration, errno syscall.Errno) ([]row, error) {
	files, err := createFiles(s.fs.Dir, 1000)
	if err != nil {
		return nil, err
	}
	defer closeAll(files)
	s.fs.Set(faultfs.Faults{OpenErr: errno})
	for _, f := range files {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			return nil, err
		}
	}
	// Expiry (5s) plus the pause's climb to max_pause (10ms..1s, ~2s).
	settle := 10 * time.Second
	time.Sleep(settle)
	cpu0, sw0, opens0, t0 := s.d.cpu(), s.d.switches(), s.fs.Count("open"), time.Now()
	time.Sleep(runFor - settle)
	cpu1, sw1, opens1, t1 := s.d.cpu(), s.d.switches(), s.fs.Count("open"), time.Now()
	el := t1.Sub(t0).Seconds()
	p := s.policy
	return []row{
		{fmt.Sprintf("(c) 1000 blocked (%s): context switches/s (last %.0fs)", unix.ErrnoName(errno), el), map[string]string{p: fmt.Sprintf("%.1f", float64(sw1-sw0)/el)}},
		{"(c) 1000 blocked: retry passes/s (opens/s / 1000)", map[string]string{p: fmt.Sprintf("%.2f", float64(opens1-opens0)/el/1000)}},
		{"(c) 1000 blocked: daemon CPU, % of one core", map[string]string{p: fmt.Sprintf("%.2f%%", 100*(cpu1-cpu0).Seconds()/el)}},
	}, nil
}

// sleepCtx sleeps for d, or until ctx is done (then its error).
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

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
