package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// binary is the flusherd built for the end-to-end tests.
var binary string

// daemonRace: build binary with the race detector (set when the tests
// themselves run with -race, race_on_test.go). Each daemon's output is
// then checked for a race report when it ends.
var daemonRace bool

// plainBinary is binary without the race detector (the same file when
// daemonRace is off), for the tests that measure latency against a bound:
// a race-instrumented daemon handles events several times slower.
var plainBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "flusherd-e2e-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "flusherd")
	plainBinary = binary
	builds := [][]string{{"build", "-o", binary, "."}}
	if daemonRace {
		builds[0] = []string{"build", "-race", "-o", binary, "."}
		plainBinary = filepath.Join(dir, "flusherd-plain")
		builds = append(builds, []string{"build", "-o", plainBinary, "."})
	}
	for _, args := range builds {
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go %s: %v\n%s", strings.Join(args, " "), err, out)
			os.Exit(2)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// flusherdProc is a running flusherd.
type flusherdProc struct {
	cmd      *exec.Cmd
	statsDir string
	log      *syncBuffer
	done     chan struct{}
	err      error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDaemon runs flusherd with the config text, waits for it to log
// that it is ready, and stops it (SIGTERM) at cleanup if the test did not.
func startDaemon(t *testing.T, configText string) *flusherdProc {
	t.Helper()
	return startDaemonAs(t, configText, nil)
}

// startDaemonAs is startDaemon with the daemon running as cred's user and
// group (nil: the test's own). For another user, the binary and the
// config file are made reachable for it (search permission for others on
// their temporary directories) and the stats directory is made and given
// to it; the test is skipped if that cannot be done. The watched trees are
// the caller's business (makeSearchable).
func startDaemonAs(t *testing.T, configText string, cred *syscall.Credential) *flusherdProc {
	t.Helper()
	return startDaemonWith(t, binary, configText, cred)
}

// startDaemonWith is startDaemonAs running the flusherd binary bin.
func startDaemonWith(t *testing.T, bin, configText string, cred *syscall.Credential) *flusherdProc {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "flusherd.toml")
	statsDir := filepath.Join(dir, "run")
	if err := os.WriteFile(cfgPath, []byte(configText), 0o644); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		for _, p := range []string{dir, filepath.Dir(bin)} {
			if err := makeSearchable(p); err != nil {
				testfs.Missing(t, "cannot run flusherd as uid %d: %v", cred.Uid, err)
			}
		}
		if err := os.Mkdir(statsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(statsDir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	d := &flusherdProc{statsDir: statsDir, log: &syncBuffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, "run", "--config", cfgPath, "--stats-dir", statsDir)
	if cred != nil {
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	d.cmd.Stdout = d.log
	d.cmd.Stderr = d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		d.halt()
		if strings.Contains(d.log.String(), "WARNING: DATA RACE") {
			t.Errorf("the race detector reported a data race in the daemon")
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	exited := false
	ready := testwait.Poll(30*time.Second, func() bool {
		if strings.Contains(d.log.String(), "ready") {
			return true
		}
		select {
		case <-d.done:
			exited = true
			return true
		default:
			return false
		}
	})
	if exited {
		t.Fatalf("flusherd exited early: %v\n%s", d.err, d.log.String())
	}
	if !ready {
		t.Fatalf("flusherd not ready after 30s:\n%s", d.log.String())
	}
	return d
}

// devStats is the path of the stats file of the device majMin ("7:3").
func (d *flusherdProc) devStats(majMin string) string {
	return filepath.Join(d.statsDir, "bdi", majMin, "stats")
}

// halt ends the daemon if it still runs: SIGTERM, and SIGKILL after 30 s.
func (d *flusherdProc) halt() {
	select {
	case <-d.done:
	default:
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			d.cmd.Process.Kill()
			<-d.done
		}
	}
}

// mountTree mounts a test filesystem of type typ and makes the directory
// "w" in it, for a tree.
func mountTree(t *testing.T, typ string) (*testfs.FS, string) {
	t.Helper()
	mnt := testfs.Mount(t, testfs.Options{Type: typ})
	tree := filepath.Join(mnt.Dir, "w")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	return mnt, tree
}

// makeSearchable gives others search (x) permission on dir and on each of
// its ancestors inside os.TempDir() that lacks it (t.TempDir makes them
// 0700), so that a daemon running as another user can reach dir. An
// ancestor outside os.TempDir() that others cannot search is an error: it
// is not changed.
func makeSearchable(dir string) error {
	tmp := filepath.Clean(os.TempDir())
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			if p != tmp && !strings.HasPrefix(p, tmp+"/") {
				return fmt.Errorf("%s (mode %v) is not searchable by others and lies outside %s", p, st.Mode().Perm(), tmp)
			}
			keep := st.Mode() & (os.ModePerm | os.ModeSticky | os.ModeSetuid | os.ModeSetgid)
			if err := os.Chmod(p, keep|0o001); err != nil {
				return err
			}
		}
		if p == "/" {
			return nil
		}
	}
}

// stop sends SIGTERM and waits for the exit status.
func (d *flusherdProc) stop(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		t.Fatal("flusherd did not exit within 60s of SIGTERM")
	}
	if d.err != nil {
		t.Fatalf("flusherd exited with %v", d.err)
	}
}

// readStats parses the device's stats file.
// statsWhen reads the stats file at path until ok holds of it or limit
// passes, and returns the last reading. A stats file is rewritten on the
// daemon's schedule (the watch file a second after the activity it
// counts, a device's file at its writeback ticks): a figure that the
// daemon already holds may reach the file a moment after a test sees its
// effect.
func statsWhen(t *testing.T, path string, limit time.Duration, ok func(map[string]int64) bool) map[string]int64 {
	t.Helper()
	var s map[string]int64
	poll(limit, func() bool { s = readStats(t, path); return ok(s) })
	return s
}

func readStats(t *testing.T, path string) map[string]int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			t.Fatalf("malformed stats line %q", sc.Text())
		}
		f := strings.Fields(v)
		if k == "backend" || k == "tree" {
			continue // watch/stats: values that are names
		}
		base := 10
		if k == "state" {
			base = 16
		}
		n, err := strconv.ParseInt(f[0], base, 64)
		if err != nil {
			t.Fatalf("stats line %q: %v", sc.Text(), err)
		}
		out[k] = n
	}
	return out
}

// cachestat returns the dirty and writeback pages of [off, off+n) of path.
func cachestat(path string, off, n int64) (dirty, wb uint64, err error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	return cachestatFd(fd, off, n)
}

// cachestatFd is cachestat(2) of [off, off+n) of the open file fd.
func cachestatFd(fd int, off, n int64) (dirty, wb uint64, err error) {
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: uint64(off), Len: uint64(n)}, &cs, 0); err != nil {
		return 0, 0, err
	}
	return cs.Dirty, cs.Writeback, nil
}

// written is data written at a time, to be seen clean by a deadline.
type written struct {
	path string
	at   time.Time
	end  int64 // bytes [0, end) of the file; 0 = the whole file
}

// copyTree copies src into dst, recording when each file's data was
// written.
func copyTree(t *testing.T, src, dst string, rec func(written)) {
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
		rec(written{path: target, at: time.Now()})
		return nil
	})
	if err != nil {
		t.Errorf("copying %s: %v", src, err)
	}
}

// TestEndToEnd runs the daemon on a loop-mounted ext4, and on xfs, with
// dirty_expire_interval=1s and dirty_writeback_interval=500ms while a tree
// is copied in and a log is appended every 100 ms, and checks with cachestat
// that data written at t is clean by t + expire + interval + 1.5s. The
// kernel's own flusher would take 30s (vm.dirty_expire_centisecs), so the
// bound holds only if flusherd does the work. FLUSHERD_E2E_SRC replaces the
// copied tree (default $GOROOT/src/net).
func TestEndToEnd(t *testing.T) {
	testfs.SkipShort(t, "a source tree copied onto loop-mounted ext4 and xfs under the daemon")
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) { endToEnd(t, fstype) })
	}
}

func endToEnd(t *testing.T, fstype string) {
	src := os.Getenv("FLUSHERD_E2E_SRC")
	if src == "" {
		out, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			t.Fatalf("go env GOROOT: %v", err)
		}
		src = filepath.Join(strings.TrimSpace(string(out)), "src", "net")
	}
	if _, err := os.Stat(src); err != nil {
		testfs.Missing(t, "no source tree to copy (FLUSHERD_E2E_SRC, or Go's src/net): %v", err)
	}
	mnt := testfs.Mount(t, testfs.Options{Type: fstype, SizeMB: 1024, DirectIO: true})
	data := filepath.Join(mnt.Dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	const (
		expire   = time.Second
		interval = 500 * time.Millisecond
		slack    = 1500 * time.Millisecond
	)
	bound := expire + interval + slack
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "500ms"
dirty_expire_interval = "1s"
[[watch]]
path = %q
`, data))
	statsPath := d.devStats(mnt.MajMin)

	var mu sync.Mutex
	var pending []written
	rec := func(w written) { mu.Lock(); pending = append(pending, w); mu.Unlock() }

	stop := make(chan struct{})
	copyDone := make(chan struct{})
	logDone := make(chan struct{})
	go func() {
		defer close(copyDone)
		copyTree(t, src, filepath.Join(data, "tree"), rec)
	}()
	go func() {
		defer close(logDone)
		logPath := filepath.Join(data, "app.log")
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var size int64
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			// About 512 bytes a line: a page fills every 0.8s.
			line := fmt.Sprintf("%s request served in %dus %s\n", time.Now().Format(time.RFC3339Nano), size%997, strings.Repeat("x", 450))
			n, err := f.WriteString(line)
			if err != nil {
				t.Error(err)
				return
			}
			size += int64(n)
			// Whole pages only: the partial last page is dirtied
			// again by the next line.
			if full := size / 4096 * 4096; full > 0 {
				rec(written{path: logPath, at: time.Now(), end: full})
			}
		}
	}()

	// The checker: every pending write must be seen clean by its deadline.
	var worst time.Duration
	var midStats, midKernel []byte
	checked := 0
	check := func() {
		mu.Lock()
		ws := pending
		pending = nil
		mu.Unlock()
		var keep []written
		now := time.Now()
		for _, w := range ws {
			dirty, wb, err := cachestat(w.path, 0, w.end)
			if err != nil {
				t.Errorf("cachestat %s: %v", w.path, err)
				continue
			}
			age := now.Sub(w.at)
			if dirty == 0 && wb == 0 {
				worst = max(worst, age)
				checked++
				continue
			}
			if age > bound {
				t.Errorf("%s [0,%d): %d dirty + %d writeback pages %v after the write (bound %v)", w.path, w.end, dirty, wb, age.Round(time.Millisecond), bound)
				continue
			}
			keep = append(keep, w)
		}
		mu.Lock()
		pending = append(keep, pending...)
		mu.Unlock()
	}
	start := time.Now()
	go func() {
		// One stats file from mid-run, next to the kernel's own.
		time.Sleep(2500 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		midStats, _ = os.ReadFile(statsPath)
		midKernel, _ = os.ReadFile(filepath.Join("/sys/kernel/debug/bdi", mnt.MajMin, "stats"))
	}()
	var stopLogAt time.Time
	stopped := false
	for {
		check()
		select {
		case <-copyDone:
			if stopLogAt.IsZero() {
				// The log goes on for 3s after the copy.
				stopLogAt = time.Now().Add(3 * time.Second)
			}
		default:
		}
		if !stopped && !stopLogAt.IsZero() && time.Now().After(stopLogAt) {
			close(stop)
			<-logDone
			stopped = true
		}
		if stopped {
			mu.Lock()
			n := len(pending)
			mu.Unlock()
			if n == 0 {
				break
			}
		}
		if time.Since(start) > 15*time.Minute {
			t.Fatal("workload did not finish in 15 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d writes checked; the longest any stayed dirty, as seen by a 100 ms cachestat poll: %v (bound %v)", checked, worst.Round(time.Millisecond), bound)
	if checked == 0 {
		t.Fatal("nothing was checked")
	}

	// The lists drain to zero after the writers stop.
	deadline := time.Now().Add(bound + 5*time.Second)
	for {
		s := readStats(t, statsPath)
		if s != nil && s["b_dirty"]+s["b_io"]+s["b_more_io"]+s["b_more_io_wait"] == 0 {
			if s["BdiWritten"] == 0 || s["plug_requests"] == 0 {
				t.Errorf("stats show no writeback by flusherd: %v", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lists did not drain: %v", s)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if midStats != nil {
		t.Logf("mid-run flusherd stats (%s):\n%s\nkernel debugfs stats, same moment:\n%s", statsPath, midStats, midKernel)
	}
	d.stop(t)
	if ru, ok := d.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		t.Logf("daemon: peak RSS %d KiB, CPU %v (user %v, sys %v), wall %v", ru.Maxrss, cpu.Round(time.Millisecond),
			time.Duration(ru.Utime.Nano()).Round(time.Millisecond), time.Duration(ru.Stime.Nano()).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	}
}
