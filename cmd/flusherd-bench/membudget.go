package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// memBudget is flusherd-bench membudget: the daemon in a memory cgroup of
// --limit bytes, an hour's expiry, N small dirty files written as fast as
// one process can: its peak memory, whether it was OOM-killed, and how
// long until every file was clean (cachestat).
func memBudget(args []string) int {
	fl := newFlags("membudget",
		"The daemon under a memory cgroup limit with N small dirty files in a tree whose expire is 1h: its peak memory\n"+
			"(the cgroup's, and VmHWM), whether it was OOM-killed, and the time until every file was clean.",
		"flusherd-bench membudget --files 250000,500000,1000000 --backends fanotify,inotify --limit 160MiB")
	files := fl.String("files", "250000,500000,1000000", "file counts, comma-separated")
	backends := fl.String("backends", "fanotify,inotify", "watcher backends, comma-separated")
	limitMiB := fl.Int("limit-mib", 160, "the cgroup's memory limit, MiB")
	budget := fl.String("max-tracked", "auto", `writeback.max_tracked_inodes: "auto", "unlimited" or a count`)
	bin := fl.String("flusherd", "", "flusherd binary (default: built from the checkout)")
	wait := fl.Duration("max-wait", 10*time.Minute, "longest wait for the files to be clean")
	if code, ok := parseFlags(fl, args); !ok {
		return code
	}
	base, err := os.MkdirTemp("", "flusherd-membudget-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(base)
	if *bin == "" {
		if *bin, err = buildFlusherd(base); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	key := strconv.Quote(*budget)
	if _, err := strconv.Atoi(*budget); err == nil {
		key = *budget
	}
	var rows [][]string
	for _, be := range strings.Split(*backends, ",") {
		for _, f := range strings.Split(*files, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				fmt.Fprintf(os.Stderr, "flusherd-bench membudget: bad --files entry %q\n", f)
				return 2
			}
			r, err := memBudgetRun(base, *bin, be, key, n, int64(*limitMiB)<<20, *wait)
			if err != nil {
				fmt.Fprintf(os.Stderr, "flusherd-bench membudget: %s, %d files: %v\n", be, n, err)
				return 1
			}
			rows = append(rows, r)
			fmt.Fprintf(os.Stderr, "%s\n", strings.Join(r, " | "))
		}
	}
	markdownTable(os.Stdout, []string{"backend", "files", "cgroup peak", "daemon VmHWM", "OOM-killed",
		"files written in", "clean after the last write", "untracked_reports", "syncfs_passes", "syncfs_errors", "exit"}, rows)
	return 0
}

// memGroup is a memory cgroup the bench made (v2 memory.max, or v1
// memory.limit_in_bytes).
type memGroup struct {
	dir string
	v2  bool
}

// newMemGroup makes a memory cgroup with limit bytes under the root of
// the memory controller's hierarchy.
func newMemGroup(limit int64) (*memGroup, error) {
	g := &memGroup{}
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && hasWord(string(b), "memory") {
		g.v2 = true
		os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+memory"), 0)
		g.dir = filepath.Join("/sys/fs/cgroup", fmt.Sprintf("flusherd-bench-mem-%d", os.Getpid()))
	} else if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		g.dir = filepath.Join("/sys/fs/cgroup/memory", fmt.Sprintf("flusherd-bench-mem-%d", os.Getpid()))
	} else {
		return nil, errors.New("no memory cgroup controller (v2 /sys/fs/cgroup, v1 /sys/fs/cgroup/memory)")
	}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, err
	}
	name := "memory.limit_in_bytes"
	if g.v2 {
		name = "memory.max"
		os.WriteFile(filepath.Join(g.dir, "memory.swap.max"), []byte("0"), 0)
	}
	if err := os.WriteFile(filepath.Join(g.dir, name), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		g.remove()
		return nil, err
	}
	return g, nil
}

func (g *memGroup) remove() {
	for end := time.Now().Add(5 * time.Second); os.Remove(g.dir) != nil && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
}

// peak returns the cgroup's peak memory (v2 memory.peak, v1
// memory.max_usage_in_bytes) and its OOM kills (memory.events, or v1
// memory.oom_control's oom_kill).
func (g *memGroup) peak() (peak int64, ooms int64) {
	peakFile, evFile := "memory.max_usage_in_bytes", "memory.oom_control"
	if g.v2 {
		peakFile, evFile = "memory.peak", "memory.events"
	}
	if b, err := os.ReadFile(filepath.Join(g.dir, peakFile)); err == nil {
		peak, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	if b, err := os.ReadFile(filepath.Join(g.dir, evFile)); err == nil {
		if v, ok := parseKV([]byte(strings.ReplaceAll(string(b), " ", ": ")))["oom_kill"]; ok {
			ooms, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return peak, ooms
}

// memBudgetRun is one row: a fresh ext4 with room for n files, the daemon
// started inside a new memory cgroup (a shell moves itself in, then execs
// it, so that the daemon reads its limit at start), n files of 100 bytes
// written, then cachestat of every file until each is clean.
func memBudgetRun(base, bin, backend, key string, n int, limit int64, maxWait time.Duration) ([]string, error) {
	dir, err := os.MkdirTemp(base, fmt.Sprintf("%s-%d-", backend, n))
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	l, err := newBenchLoop(dir, "ext4", int64(n)*diskPerFile*5/4>>20+1024, n+n/1000+4096)
	if err != nil {
		return nil, err
	}
	defer func() {
		syncfs(l.Dir)
		closeFS(l, "membudget")
		os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
	}()
	root := filepath.Join(l.Dir, "tree")
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, err
	}
	g, err := newMemGroup(limit)
	if err != nil {
		return nil, err
	}
	defer g.remove()
	cfg := fmt.Sprintf("[writeback]\nmax_tracked_inodes = %s\n[watcher]\nbackend = %q\n[[watch]]\npath = %q\nexpire = \"1h\"\n", key, backend, root)
	if err := os.WriteFile(filepath.Join(dir, "flusherd.toml"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(g.dir, "cgroup.procs"),
		bin, "run", "--config", filepath.Join(dir, "flusherd.toml"), "--stats-dir", filepath.Join(dir, "run"))
	d, err := launchDaemon(cmd)
	if err != nil {
		return nil, err
	}
	defer d.kill()
	for line := range strings.Lines(d.logText()) {
		if strings.Contains(line, "memory limit") || strings.Contains(line, "tracked-inode budget") {
			fmt.Fprint(os.Stderr, line)
		}
	}
	t0 := time.Now()
	if err := createTree(context.Background(), root, n, 100); err != nil {
		return nil, err
	}
	wrote := time.Now()
	fmt.Fprintf(os.Stderr, "%s, %d files: written in %v\n", backend, n, wrote.Sub(t0).Round(time.Millisecond))
	cleanIn := "not within " + maxWait.String()
	if i, err := waitAllClean(root, n, maxWait); err != nil {
		return nil, err
	} else if i == n {
		cleanIn = fmt.Sprintf("%.1f s", time.Since(wrote).Seconds())
	}
	hwm := procStatusKB(d.cmd.Process.Pid).hwm
	st := readBdiStats(filepath.Join(dir, "run"))
	d.stop()
	peak, ooms := g.peak()
	exit := "0"
	if ws, ok := d.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		exit = ws.Signal().String()
	} else if c := d.cmd.ProcessState.ExitCode(); c != 0 {
		exit = strconv.Itoa(c)
	}
	oom := "no"
	if ooms > 0 {
		oom = fmt.Sprintf("yes (%d)", ooms)
	}
	hwmCell := mib(hwm)
	if hwm == 0 {
		hwmCell = "(exited)"
	}
	return []string{backend, thousands(uint64(n)), mib(uint64(peak) >> 10), hwmCell, oom,
		fmt.Sprintf("%.1f s", wrote.Sub(t0).Seconds()), cleanIn,
		st["untracked_reports"], st["syncfs_passes"], st["syncfs_errors"], exit}, nil
}

// launchDaemon starts cmd, a flusherd run, and waits for its ready line.
func launchDaemon(cmd *exec.Cmd) (*daemon, error) {
	d := &daemon{cmd: cmd, log: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = lockedWriter{d}, lockedWriter{d}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { cmd.Wait(); close(d.done) }()
	for end := time.Now().Add(30 * time.Second); !strings.Contains(d.logText(), "ready"); time.Sleep(10 * time.Millisecond) {
		select {
		case <-d.done:
			return nil, fmt.Errorf("flusherd exited: %s", d.logText())
		default:
		}
		if time.Now().After(end) {
			d.kill()
			return nil, fmt.Errorf("flusherd not ready: %s", d.logText())
		}
	}
	return d, nil
}

// waitAllClean looks at the n files of root (treePath) in order with
// cachestat, moving on past each clean one, until all are or maxWait
// passes; it returns how many were seen clean.
func waitAllClean(root string, n int, maxWait time.Duration) (int, error) {
	end := time.Now().Add(maxWait)
	i := 0
	for i < n && time.Now().Before(end) {
		fd, err := unix.Open(treePath(root, i), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return i, err
		}
		var cs unix.Cachestat_t
		err = unix.Cachestat(uint(fd), &unix.CachestatRange{}, &cs, 0)
		unix.Close(fd)
		if err != nil {
			return i, err
		}
		if cs.Dirty+cs.Writeback > 0 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		i++
	}
	return i, nil
}

// readBdiStats sums the devices' stats lines under statsDir, as text.
func readBdiStats(statsDir string) map[string]string {
	paths, _ := filepath.Glob(filepath.Join(statsDir, "bdi", "*", "stats"))
	sum := map[string]int64{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for k, v := range parseKV(b) {
			x, _ := strconv.ParseInt(v, 10, 64)
			sum[k] += x
		}
	}
	out := map[string]string{}
	for k, v := range sum {
		out[k] = thousands(uint64(v))
	}
	return out
}
