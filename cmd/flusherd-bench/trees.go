package main

// flusherd-bench trees: the daemon's costs by the number of [[watch]]
// trees, for each backend and each binary (--flusherd, and --base for a
// side-by-side comparison with another build). For each count, on a fresh
// loop-mounted ext4 filesystem holding the tree roots and a directory
// outside them:
//
//  1. Start: from the daemon's start to its "every root is watched" line
//     (READY=1 under systemd), the wall time and the daemon's CPU.
//  2. Churn: --churn directories made and removed outside every tree
//     (on the trees' filesystem: fanotify's filesystem mark sees them),
//     then one file written in a tree; the daemon's CPU per directory
//     made and removed, and the time from the churn's end until that
//     file is clean (the events are read in order: it is tracked only
//     after the churn's).
//  3. Writes: one file written (64 KiB) in each of --files trees (round
//     robin over the trees); the daemon's CPU per file until every file
//     is clean (its events, its tracking and its writeback).
//
// The daemon runs with dirty_expire_interval = 1s and
// dirty_writeback_interval = 200ms; the kernel's sysctls are left as they
// are (its flusher writes a file flusherd missed after
// vm.dirty_expire_centisecs, 30 s by default). A step that does not
// finish within --timeout is reported as such and the rest of that count
// skipped.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type treesOpts struct {
	bin, base string
	counts    []int
	backends  []string
	churn     int
	files     int
	timeout   time.Duration
}

func treesBench(args []string) int {
	fl := newFlags("trees", "trees: the daemon's start-up time, CPU per directory change outside the trees and CPU per written file, by the number of trees.",
		"flusherd-bench trees --counts 10,1000,10000 --base /tmp/flusherd-old")
	var o treesOpts
	var counts, backends string
	fl.StringVar(&o.bin, "flusherd", "", "flusherd binary (default: built from ./cmd/flusherd)")
	fl.StringVar(&o.base, "base", "", "a second flusherd binary, measured beside the first (optional)")
	fl.StringVar(&counts, "counts", "10,1000,10000", "numbers of trees, comma-separated")
	fl.StringVar(&backends, "backends", "fanotify,inotify", "watcher backends, comma-separated")
	fl.IntVar(&o.churn, "churn", 2000, "directories made and removed outside the trees")
	fl.IntVar(&o.files, "files", 1000, "files written in the trees")
	fl.DurationVar(&o.timeout, "timeout", 5*time.Minute, "limit of each step")
	if code, ok := parseFlags(fl, args); !ok {
		return code
	}
	for _, c := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "flusherd-bench trees: --counts %q: want positive numbers\n", counts)
			return 2
		}
		o.counts = append(o.counts, n)
	}
	o.backends = strings.Split(backends, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "flusherd-bench-trees")
	if err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench trees:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if o.bin == "" {
		if o.bin, err = buildFlusherd(dir); err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench trees:", err)
			return 1
		}
	}
	bins := []string{o.bin}
	if o.base != "" {
		bins = append(bins, o.base)
	}
	var rows [][]string
	for _, backend := range o.backends {
		for _, n := range o.counts {
			for _, bin := range bins {
				if ctx.Err() != nil {
					return 1
				}
				r, err := treesRun(ctx, dir, bin, backend, n, o)
				if err != nil {
					fmt.Fprintf(os.Stderr, "flusherd-bench trees: %s, %d trees, %s: %v\n", backend, n, bin, err)
				}
				row := append([]string{backend, strconv.Itoa(n), filepath.Base(bin)}, r[:]...)
				fmt.Fprintln(os.Stderr, strings.Join(row, "  "))
				rows = append(rows, row)
			}
		}
	}
	markdownTable(os.Stdout, []string{"backend", "trees", "binary", "to READY", "CPU to READY", "CPU per dir made+removed outside", "file after churn clean in", "CPU per written file"}, rows)
	return 0
}

// treesRun measures one binary, backend and count; cells not measured
// are "-", a step that ran out of time "> timeout".
func treesRun(ctx context.Context, base, bin, backend string, n int, o treesOpts) (cells [5]string, err error) {
	for i := range cells {
		cells[i] = "-"
	}
	fs, err := newBenchLoop(base, "ext4", 1024, n+o.churn+o.files+10000)
	if err != nil {
		return cells, err
	}
	defer closeFS(fs, "trees")
	roots := make([]string, n)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[writeback]\ndirty_expire_interval = \"1s\"\ndirty_writeback_interval = \"200ms\"\n[watcher]\nbackend = %q\n", backend)
	for i := range roots {
		roots[i] = filepath.Join(fs.Dir, "trees", fmt.Sprintf("t%05d", i))
		if err := os.MkdirAll(roots[i], 0o755); err != nil {
			return cells, err
		}
		fmt.Fprintf(&cfg, "[[watch]]\npath = %q\n", roots[i])
	}
	outside := filepath.Join(fs.Dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		return cells, err
	}
	run := filepath.Join(base, "run-"+strconv.Itoa(n))
	os.MkdirAll(run, 0o755)
	defer os.RemoveAll(run)
	if err := os.WriteFile(filepath.Join(run, "flusherd.toml"), []byte(cfg.String()), 0o644); err != nil {
		return cells, err
	}
	d := &daemon{log: &bytes.Buffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, "run", "--config", filepath.Join(run, "flusherd.toml"), "--stats-dir", filepath.Join(run, "stats"))
	d.cmd.Stdout, d.cmd.Stderr = lockedWriter{d}, lockedWriter{d}
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := d.cmd.Start(); err != nil {
		return cells, err
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	defer d.kill()
	if !waitFor(ctx, d, o.timeout, func() bool { return strings.Contains(d.logText(), "every root is watched") }) {
		cells[0], cells[1] = "> "+o.timeout.String(), "> "+seconds(d.cpu())
		return cells, fmt.Errorf("not ready: %s", tail(d.logText(), 3))
	}
	cells[0], cells[1] = seconds(time.Since(start)), seconds(d.cpu())
	if !waitFor(ctx, d, o.timeout, func() bool { return strings.Contains(d.logText(), "initial scan done") }) {
		return cells, fmt.Errorf("initial scan not done: %s", tail(d.logText(), 3))
	}
	sleepCtx(ctx, time.Second)

	cpu := d.cpu()
	for i := range o.churn {
		p := filepath.Join(outside, "d"+strconv.Itoa(i))
		if err := os.Mkdir(p, 0o755); err != nil {
			return cells, err
		}
		if err := os.Remove(p); err != nil {
			return cells, err
		}
	}
	after := time.Now()
	probe := filepath.Join(roots[n/2], "probe")
	if err := os.WriteFile(probe, make([]byte, 64<<10), 0o644); err != nil {
		return cells, err
	}
	if !waitFor(ctx, d, o.timeout, func() bool { return clean(probe) }) {
		cells[3] = "> " + o.timeout.String()
		return cells, fmt.Errorf("the file written after the churn not clean")
	}
	cells[3] = seconds(time.Since(after))
	cells[2] = perOp(d.cpu()-cpu, o.churn)

	cpu = d.cpu()
	paths := make([]string, o.files)
	for i := range paths {
		paths[i] = filepath.Join(roots[i%n], "f"+strconv.Itoa(i))
		if err := os.WriteFile(paths[i], make([]byte, 64<<10), 0o644); err != nil {
			return cells, err
		}
	}
	if !waitFor(ctx, d, o.timeout, func() bool {
		for _, p := range paths {
			if !clean(p) {
				return false
			}
		}
		return true
	}) {
		cells[4] = "> " + o.timeout.String()
		return cells, fmt.Errorf("the written files not clean")
	}
	cells[4] = perOp(d.cpu()-cpu, o.files)
	d.stop()
	return cells, nil
}

// waitFor polls cond every 20 ms until it holds (true), the daemon
// exits, limit passes or ctx ends.
func waitFor(ctx context.Context, d *daemon, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		select {
		case <-d.done:
			return false
		default:
		}
		if time.Now().After(deadline) || sleepCtx(ctx, 20*time.Millisecond) != nil {
			return false
		}
	}
	return true
}

// clean reports whether path has no dirty or writeback pages
// (cachestat(2)).
func clean(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var cs unix.Cachestat_t
	err = unix.Cachestat(uint(fd), &unix.CachestatRange{}, &cs, 0)
	return err == nil && cs.Dirty == 0 && cs.Writeback == 0
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// perOp is cpu/n in µs.
func perOp(cpu time.Duration, n int) string {
	return fmt.Sprintf("%.1f µs", float64(cpu.Microseconds())/float64(n))
}
