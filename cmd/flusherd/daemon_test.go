package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"flusherd/control"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// The daemon harness: every test that runs `flusherd run` runs it through
// runDaemon (startDaemon for the usual case), and every other command of
// the binary through runAs.
//
// The tests whose daemon waits mostly for its expiry, checked against
// bounds several times what it needs, call t.Parallel (go test runs two
// at a time on two CPUs). Those that hold the daemon to a latency of a
// second or two, count its events or CPU time, or change what the whole
// machine shares (sysctls, blk-throttle, the environment) run alone.

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
	if os.Getenv(seccompEnv) != "" {
		seccompExec() // a launcher for TestCachestatRefused
	}
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
		// A race-instrumented program that exits with status 0 first
		// sleeps for GORACE's atexit_sleep_ms, 1 s by default: a
		// second for every daemon stopped and every command run. A
		// race is reported when it happens, not at exit.
		if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
			os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
		}
	}
	errs := make([]error, len(builds))
	var wg sync.WaitGroup
	for i, args := range builds {
		wg.Go(func() {
			if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// flusherdProc is a running flusherd.
type flusherdProc struct {
	cmd      *exec.Cmd
	statsDir string
	cfgPath  string
	log      *syncBuffer
	done     chan struct{} // closed when it has exited
	err      error         // its exit (cmd.Wait), once done is closed
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

// daemonOpts says how runDaemon runs flusherd. The zero value runs
// binary as the test's user, in the test's environment, and waits for
// the end of its initial scan.
type daemonOpts struct {
	// bin is the flusherd to run ("": binary). plainBinary is for the
	// tests that hold the daemon to a latency bound.
	bin string
	// cred runs the daemon as another user (nil: the test's own). The
	// binary and the configuration are made reachable for that user
	// (makeSearchable) and the stats directory is made and given to it;
	// the watched trees are the caller's business.
	cred *syscall.Credential
	// env is added to the test's environment, as "KEY=value" (a fake
	// systemd's NOTIFY_SOCKET, WATCHDOG_USEC).
	env []string
	// readyLine is the log text runDaemon waits for ("": the end of the
	// initial scan, "initial scan done; ready"; "every root is watched"
	// comes before the scan).
	readyLine string
	// mayExit: an exit before readyLine is returned to the caller (see
	// exited and exitCode), not a failure: a start that the test
	// expects to be refused.
	mayExit bool
	// args are added to run's (after --config and --stats-dir: a flag
	// given again there wins).
	args []string
	// readySocket: wait for the control socket instead of readyLine (a
	// log at --log-level warn does not say).
	readySocket bool
	// inotifyWatches, if set, runs the daemon in a user namespace of its
	// own (root mapped to root) whose inotify watch limit
	// (user.max_inotify_watches) is this many watches.
	inotifyWatches int
	// stderr, if set, is the daemon's standard error (a pipe whose
	// reader the test closes) instead of the log; readySocket then
	// applies.
	stderr *os.File
}

// startDaemon runs flusherd with the config text, waits for the end of
// its initial scan, and stops it (SIGTERM) at cleanup if the test did not.
func startDaemon(t *testing.T, configText string) *flusherdProc {
	t.Helper()
	return runDaemon(t, configText, daemonOpts{})
}

// runDaemon runs `flusherd run` with the config text and a stats
// directory of its own, as o says, and waits (30 s at most) for its ready
// line. At cleanup it stops the daemon if it still runs (SIGTERM, SIGKILL
// after 30 s), fails the test if the race detector reported a race in it,
// and logs its output if the test failed.
func runDaemon(t *testing.T, configText string, o daemonOpts) *flusherdProc {
	t.Helper()
	bin := cmp.Or(o.bin, binary)
	testfs.HoldWatchers(t) // see testfs.ExcludeWatchers
	dir := t.TempDir()
	d := &flusherdProc{
		cfgPath:  filepath.Join(dir, "flusherd.toml"),
		statsDir: filepath.Join(dir, "run"),
		log:      &syncBuffer{},
		done:     make(chan struct{}),
	}
	if err := os.WriteFile(d.cfgPath, []byte(configText), 0o644); err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin, append([]string{"run", "--config", d.cfgPath, "--stats-dir", d.statsDir}, o.args...)...)
	if o.inotifyWatches > 0 {
		// The namespace's limit is set from inside it, by a shell that
		// then becomes the daemon.
		d.cmd = exec.Command("/bin/sh", append([]string{"-c", `echo "$0" >/proc/sys/user/max_inotify_watches && exec "$@"`,
			fmt.Sprint(o.inotifyWatches)}, d.cmd.Args...)...)
		d.cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		}
	}
	if o.cred != nil {
		for _, p := range []string{dir, filepath.Dir(bin)} {
			if err := makeSearchable(p); err != nil {
				testfs.Missing(t, "cannot run flusherd as uid %d: %v", o.cred.Uid, err)
			}
		}
		if err := os.Mkdir(d.statsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d.statsDir, int(o.cred.Uid), int(o.cred.Gid)); err != nil {
			t.Fatal(err)
		}
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: o.cred}
	}
	if o.env != nil {
		d.cmd.Env = append(os.Environ(), o.env...)
	}
	d.cmd.Stdout = d.log
	d.cmd.Stderr = d.log
	if o.stderr != nil {
		d.cmd.Stderr = o.stderr
		o.readySocket = true
	}
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
	ready := cmp.Or(o.readyLine, "initial scan done; ready")
	isReady := func() bool { return strings.Contains(d.log.String(), ready) }
	if o.readySocket {
		ready = "its control socket"
		isReady = func() bool {
			_, err := os.Stat(control.SocketPath(d.statsDir))
			return err == nil
		}
	}
	if !testwait.Poll(30*time.Second, func() bool { return d.exited() || isReady() }) {
		t.Fatalf("flusherd did not make %q within 30s:\n%s", ready, d.log.String())
	}
	if d.exited() && !o.mayExit && !isReady() {
		t.Fatalf("flusherd exited early: %v\n%s", d.err, d.log.String())
	}
	return d
}

// exited reports whether the daemon has exited.
func (d *flusherdProc) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// exitCode is the exit status of a daemon that has exited (-1: killed by
// a signal).
func (d *flusherdProc) exitCode() int {
	<-d.done
	return d.cmd.ProcessState.ExitCode()
}

// mustRun fails the test if the daemon has exited.
func (d *flusherdProc) mustRun(t *testing.T) {
	t.Helper()
	if d.exited() {
		t.Fatalf("flusherd exited: %v", d.err)
	}
}

// pid is the daemon's process id.
func (d *flusherdProc) pid() int { return d.cmd.Process.Pid }

// signal sends sig to the daemon.
func (d *flusherdProc) signal(sig os.Signal) { d.cmd.Process.Signal(sig) }

// devStats is the path of the stats file of the device majMin ("7:3").
func (d *flusherdProc) devStats(majMin string) string {
	return filepath.Join(d.statsDir, "bdi", majMin, "stats")
}

// reload writes conf as the daemon's configuration and sends SIGHUP.
func (d *flusherdProc) reload(t *testing.T, conf string) {
	t.Helper()
	if err := os.WriteFile(d.cfgPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	d.signal(syscall.SIGHUP)
}

// term sends SIGTERM and waits for the exit, failing the test if it does
// not come within limit; it returns how long the exit took.
func (d *flusherdProc) term(t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	d.signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(limit):
		t.Fatalf("flusherd did not exit within %v of SIGTERM", limit)
	}
	return time.Since(start)
}

// stop sends SIGTERM and waits (60 s at most) for a successful exit.
func (d *flusherdProc) stop(t *testing.T) {
	t.Helper()
	d.term(t, 60*time.Second)
	if d.err != nil {
		t.Fatalf("flusherd exited with %v", d.err)
	}
}

// kill ends the daemon with SIGKILL and waits for it: for a test done
// with a daemon whose shutdown would only write back what the test no
// longer looks at.
func (d *flusherdProc) kill() {
	d.cmd.Process.Kill()
	<-d.done
}

// halt ends the daemon if it still runs: SIGTERM, and SIGKILL after 30 s.
func (d *flusherdProc) halt() {
	if d.exited() {
		return
	}
	d.signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.kill()
	}
}

// logLineSince returns the first line of the daemon's log written after
// offset from that contains every one of want, or false.
func (d *flusherdProc) logLineSince(from int, want ...string) (string, bool) {
	for line := range strings.SplitSeq(d.log.String()[from:], "\n") {
		found := true
		for _, w := range want {
			found = found && strings.Contains(line, w)
		}
		if found {
			return line, true
		}
	}
	return "", false
}

// runAs runs a command of the flusherd binary other than run (a client
// command, check-config) with args, as cred's user (nil: the test's own;
// the binary's directory is then made searchable), and returns its exit
// status and output.
func runAs(t *testing.T, cred *syscall.Credential, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	if cred != nil {
		if err := makeSearchable(filepath.Dir(binary)); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("flusherd %s: %v", strings.Join(args, " "), err)
	return 0, ""
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
