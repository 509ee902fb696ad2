package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/faultfs"
)

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

// blocked is the blocked-files experiment (see the package comment).
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
	errnos := map[string]syscall.Errno{"ENOTCONN": syscall.ENOTCONN, "EAGAIN": syscall.EAGAIN}
	aErrno, okA := errnos[*aErr]
	cErrno, okC := errnos[*cErr]
	if !okA || !okC {
		fmt.Fprintf(os.Stderr, "flusherd-bench blocked: --a-error %q, --c-error %q: each is ENOTCONN or EAGAIN\n", *aErr, *cErr)
		return 2
	}
	var rows []row
	for _, e := range []struct {
		phase string
		run   func(s *setup) ([]row, error)
	}{
		{"a", func(s *setup) ([]row, error) { return unblockLatency(s, *blockFor, aErrno) }},
		{"b", func(s *setup) ([]row, error) { return starvation(s, *runFor) }},
		{"c", func(s *setup) ([]row, error) { return busyLoop(s, *runFor, cErrno) }},
	} {
		if !strings.Contains(*phases, e.phase) {
			continue
		}
		r, ok := bothPolicies(*bin, "("+e.phase+")", e.run)
		if !ok {
			return 1
		}
		rows = append(rows, r...)
	}
	printTable(os.Stdout, rows)
	return 0
}

// bothPolicies runs experiment f under each policy at once, each with its
// own daemon and filesystem, and returns its rows with both policies'
// values; false, the error printed, if one failed.
func bothPolicies(bin, name string, f func(s *setup) ([]row, error)) ([]row, bool) {
	results := make([][]row, len(policies))
	errs := make([]error, len(policies))
	var wg sync.WaitGroup
	for i, p := range policies {
		wg.Go(func() {
			s, err := newSetup(bin, p, baseConfig)
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
			return nil, false
		}
	}
	var rows []row
	for j := range results[0] {
		r := row{name: results[0][j].name, vals: map[string]string{}}
		for i, p := range policies {
			r.vals[p] = results[i][j].vals[p]
		}
		rows = append(rows, r)
	}
	return rows, true
}

func printTable(w io.Writer, rows []row) {
	var cells [][]string
	for _, r := range rows {
		cells = append(cells, []string{r.name, r.vals[policies[0]], r.vals[policies[1]]})
	}
	markdownTable(w, []string{"measure", policies[0], policies[1]}, cells)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

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
