package container

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// The trees' bound: data written is due after expire and picked up at the
// next interval; bound leaves room for a loaded machine.
const (
	expire   = 500 * time.Millisecond
	interval = 200 * time.Millisecond
	bound    = 10 * time.Second
)

// Capabilities is what the image needs and all it is given (the unit's
// CapabilityBoundingSet=): CAP_SYS_ADMIN for fanotify_init and filesystem
// marks, CAP_DAC_READ_SEARCH for open_by_handle_at, CAP_FOWNER for
// cachestat on files of other owners.
var Capabilities = []string{"CAP_SYS_ADMIN", "CAP_DAC_READ_SEARCH", "CAP_FOWNER"}

// podman runs podman with args and returns its standard output; a failure
// fails the test with its standard error.
func podman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// image is the tag buildImage built, removed by TestMain.
var image string

// buildImage builds the image with build.sh, once for the test binary,
// under a tag of its own.
func buildImage(t *testing.T) string {
	t.Helper()
	if image != "" {
		return image
	}
	tag := fmt.Sprintf("localhost/flusherd-test:%d", os.Getpid())
	cmd := exec.Command("bash", "build.sh", tag)
	cmd.Env = append(os.Environ(), "FLUSHERD_VERSION=0.0.0-test")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	image = tag
	return tag
}

func TestMain(m *testing.M) {
	code := m.Run()
	if image != "" {
		exec.Command("podman", "rmi", "-f", image).Run()
	}
	os.Exit(code)
}

// freePort returns a loopback TCP address that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// cachestat returns the page cache state of the file at path, read from
// the host.
func cachestat(t *testing.T, path string) unix.Cachestat_t {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
		t.Fatalf("cachestat %s: %v", path, err)
	}
	return cs
}

// writeFiles writes n files of size bytes named prefix0... in dir and
// returns their paths.
func writeFiles(t *testing.T, dir, prefix string, n, size int) []string {
	t.Helper()
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	var paths []string
	for i := range n {
		p := filepath.Join(dir, prefix+strconv.Itoa(i))
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// dirtyPages sums the dirty and writeback pages of paths (cachestat).
func dirtyPages(t *testing.T, paths []string) uint64 {
	t.Helper()
	var n uint64
	for _, p := range paths {
		cs := cachestat(t, p)
		n += cs.Dirty + cs.Writeback
	}
	return n
}

// waitClean fails unless every file of paths is clean within limit.
func waitClean(t *testing.T, what string, paths []string, limit time.Duration) {
	t.Helper()
	if n := dirtyPages(t, paths); n == 0 {
		t.Fatalf("%s: clean before any writeback (the test's check cannot fail)", what)
	}
	start := time.Now()
	if !testwait.Poll(limit, func() bool { return dirtyPages(t, paths) == 0 }) {
		t.Fatalf("%s: %d pages still dirty or under writeback after %v", what, dirtyPages(t, paths), limit)
	}
	t.Logf("%s: %d files clean after %v", what, len(paths), time.Since(start).Round(10*time.Millisecond))
}

// get fetches url and returns the status code and the body.
func get(url string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// usage describes the peak RSS and the CPU time of process pid, from
// /proc.
func usage(pid string) string {
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return err.Error()
	}
	var hwm string
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			hwm = strings.TrimSpace(v)
		}
	}
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return err.Error()
	}
	// Fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		return "peak RSS " + hwm
	}
	ut, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	return fmt.Sprintf("peak RSS %s, CPU %v user %v system", hwm, time.Duration(ut)*10*time.Millisecond, time.Duration(st)*10*time.Millisecond)
}

// runtimeArgs picks the OCI runtime: runc when installed, as crun refuses
// a hybrid cgroup hierarchy whose cgroup v2 has a controller.
func runtimeArgs() []string {
	if _, err := exec.LookPath("runc"); err == nil {
		return []string{"--runtime", "runc"}
	}
	return nil
}

// ulimitArgs gives the container this process's open file limit, and a
// process limit below its own: without CAP_SYS_RESOURCE the runtime cannot
// set podman's defaults, which are higher.
func ulimitArgs(t *testing.T) []string {
	var nofile, nproc unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &nproc); err != nil {
		t.Fatal(err)
	}
	n := min(nproc.Cur, 4096)
	return []string{"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile.Cur, nofile.Cur),
		"--ulimit", fmt.Sprintf("nproc=%d:%d", n, n)}
}

// needPodman skips the test in the short lane, or without root; without
// podman it is Missing. It keeps other tests' loop mounts out of the
// containers, which start with a copy of the host's mounts
// (testfs.ExcludeMounts).
func needPodman(t *testing.T) {
	t.Helper()
	testfs.SkipShort(t, "builds the container image and runs it under podman")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts, and podman with fanotify's capabilities")
	}
	if _, err := exec.LookPath("podman"); err != nil {
		testfs.Missing(t, "podman not found (Debian packages podman, buildah, runc): %v", err)
	}
	testfs.ExcludeMounts(t)
}

// startContainer runs the image as the container name-<pid>, as a
// DaemonSet does: the seccomp profile, only Capabilities, no new
// privileges, srv bind-mounted read-only at /srv with rslave propagation,
// and dropIn as the drop-in trees.toml; extra are more podman run
// arguments. It returns a function that reads the daemon's log; the
// container is removed at cleanup, its log shown when the test failed.
func startContainer(t *testing.T, name, srv, dropIn string, extra ...string) (logs func() string) {
	t.Helper()
	img := buildImage(t)
	profile, err := filepath.Abs("../seccomp/flusherd.json")
	if err != nil {
		t.Fatal(err)
	}
	dropIns := t.TempDir()
	if err := os.WriteFile(filepath.Join(dropIns, "trees.toml"), []byte(dropIn), 0o644); err != nil {
		t.Fatal(err)
	}
	name = fmt.Sprintf("%s-%d", name, os.Getpid())
	args := []string{"run", "-d", "--name", name, "--network", "host",
		"--security-opt", "seccomp=" + profile, "--security-opt", "no-new-privileges",
		"--cap-drop", "all", "--cap-add", strings.Join(Capabilities, ","),
		"-v", srv + ":/srv:ro,rslave", "-v", dropIns + ":/etc/flusherd/flusherd.d:ro"}
	args = append(args, runtimeArgs()...)
	args = append(args, ulimitArgs(t)...)
	args = append(args, extra...)
	podman(t, append(args, img)...)
	logs = func() string {
		out, _ := exec.Command("podman", "logs", name).CombinedOutput()
		return string(out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", logs())
		}
		exec.Command("podman", "rm", "-f", "-t", "0", name).Run()
	})
	return logs
}

// TestImage runs the image as a DaemonSet does, under podman: the seccomp
// profile, the exact capabilities, no new privileges, a loop-mounted ext4
// (shared, as under systemd) bind-mounted read-only with rslave
// propagation, and a drop-in naming two trees on it. Files written on the
// host are clean within the bound (cachestat from the host), also on a
// filesystem mounted under the tree after the start; flusherd dirty and stats answer through podman exec;
// /healthz and /readyz answer; podman stop writes every tracked file back
// and the daemon exits 0.
func TestImage(t *testing.T) {
	needPodman(t)
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4"})
	data := filepath.Join(mnt.Dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	// hold's tree has an expiry of an hour: its files wait for the stop.
	hold := filepath.Join(mnt.Dir, "hold")
	if err := os.Mkdir(hold, 0o755); err != nil {
		t.Fatal(err)
	}
	// As under systemd, where / is shared: a mount made under the tree
	// propagates to the container's rslave copy of it.
	if err := unix.Mount("", mnt.Dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("mount --make-shared %s: %v", mnt.Dir, err)
	}
	second := testfs.Mount(t, testfs.Options{Type: "ext4"})
	addr := freePort(t)
	logs := startContainer(t, "flusherd-test", mnt.Dir, fmt.Sprintf(`[writeback]
dirty_writeback_interval = %q
dirty_expire_interval = %q
[metrics]
listen = %q
[[watch]]
path = "/srv/data"
[[watch]]
path = "/srv/hold"
expire = "1h"
`, interval, expire, addr))
	name := fmt.Sprintf("flusherd-test-%d", os.Getpid())

	// Ready: the initial scan is done.
	base := "http://" + addr
	if !testwait.Poll(30*time.Second, func() bool { code, _, _ := get(base + "/readyz"); return code == 200 }) {
		code, body, err := get(base + "/readyz")
		t.Fatalf("/readyz not 200 within 30s: %d %q %v", code, body, err)
	}
	if code, body, err := get(base + "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q %v, want 200 \"ok\"", code, body, err)
	}
	if log := logs(); !strings.Contains(log, "watch backend: fanotify") || strings.Contains(log, "opened by path") {
		t.Errorf("the daemon does not use fanotify with opens by handle under the profile:\n%s", log)
	}

	files := writeFiles(t, data, "f", 20, 256<<10)
	waitClean(t, "files written on the host", files, bound)

	// A filesystem mounted under the tree after the start reaches the
	// container (rslave) and is served.
	sub := filepath.Join(data, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(second.Dir, sub, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(sub, unix.MNT_DETACH) })
	nested := writeFiles(t, sub, "n", 5, 256<<10)
	waitClean(t, "files of a filesystem mounted under the tree after the start", nested, bound)

	// The files of hold's tree are tracked and left dirty (an hour's
	// expiry) until the stop writes them back; meanwhile the clients,
	// through the control socket in the container, show them.
	last := writeFiles(t, hold, "h", 20, 256<<10)
	time.Sleep(2 * (expire + interval))
	if n := dirtyPages(t, last); n == 0 {
		t.Fatal("the files of the tree with an hour's expiry are clean before the stop (the check cannot fail)")
	}
	if out := podman(t, "exec", name, "flusherd", "dirty"); !strings.Contains(out, "PATH") || strings.Count(out, "/srv/hold/h") != len(last) {
		t.Errorf("flusherd dirty does not list the %d files waiting for the stop:\n%s", len(last), out)
	}
	out := podman(t, "exec", name, "flusherd", "stats")
	for _, want := range []string{"==> bdi/" + mnt.MajMin + " <==", "==> bdi/" + second.MajMin + " <==", "BdiWritten:"} {
		if !strings.Contains(out, want) {
			t.Errorf("flusherd stats lacks %q:\n%s", want, out)
		}
	}
	if pid := strings.TrimSpace(podman(t, "inspect", name, "--format", "{{.State.Pid}}")); pid != "0" {
		t.Logf("daemon in the container before the stop: %s", usage(pid))
	}
	podman(t, "stop", "-t", "60", name)
	if code := strings.TrimSpace(podman(t, "inspect", name, "--format", "{{.State.ExitCode}}")); code != "0" {
		t.Errorf("exit code %s after podman stop, want 0", code)
	}
	if n := dirtyPages(t, last); n != 0 {
		t.Errorf("%d pages dirty or under writeback after the stop", n)
	}
	if log := logs(); !strings.Contains(log, "every tracked file is clean; exiting") {
		t.Errorf("no clean exit in the log:\n%s", log)
	}
}

// TestImageMemoryLimit: under a 64 MiB memory limit without swap, 200,000
// files written on the host all become clean within a minute: the daemon
// sets its Go memory limit from the cgroup's, is not OOM-killed, and what
// it tracks or not is written back all the same; the stop exits 0.
func TestImageMemoryLimit(t *testing.T) {
	needPodman(t)
	const dirs, perDir = 200, 1000
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 1400, MkfsArgs: []string{"-N", "250000"}})
	data := filepath.Join(mnt.Dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	logs := startContainer(t, "flusherd-test-mem", mnt.Dir, fmt.Sprintf(`[writeback]
dirty_writeback_interval = %q
dirty_expire_interval = %q
[[watch]]
path = "/srv/data"
`, interval, expire), "--memory", "64m", "--memory-swap", "64m")
	name := fmt.Sprintf("flusherd-test-mem-%d", os.Getpid())
	if !testwait.Poll(30*time.Second, func() bool { return strings.Contains(logs(), "initial scan done") }) {
		t.Fatal("the initial scan did not end within 30s")
	}
	if log := logs(); !strings.Contains(log, "Go memory limit set from the cgroup's memory limit") || !strings.Contains(log, `"cgroup_limit": 67108864`) {
		t.Errorf("no Go memory limit from the cgroup's 64 MiB in the log:\n%s", log)
	}

	start := time.Now()
	var paths []string
	for d := range dirs {
		dir := filepath.Join(data, "d"+strconv.Itoa(d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, writeFiles(t, dir, "f", perDir, 100)...)
	}
	t.Logf("%d files written in %v; the last %d: %d pages dirty or under writeback", len(paths), time.Since(start).Round(time.Millisecond),
		perDir, dirtyPages(t, paths[len(paths)-perDir:]))
	if !testwait.Poll(60*time.Second, func() bool { return dirtyPages(t, paths) == 0 }) {
		t.Fatalf("%d pages still dirty or under writeback 60s after the files were written", dirtyPages(t, paths))
	}
	t.Logf("every file clean %v after the first was written", time.Since(start).Round(time.Millisecond))
	state := strings.TrimSpace(podman(t, "inspect", name, "--format", "{{.State.Status}} {{.State.OOMKilled}} {{.State.Pid}}"))
	f := strings.Fields(state)
	if len(f) != 3 || f[0] != "running" || f[1] != "false" {
		t.Fatalf("container state %q, want running and not OOM-killed", state)
	}
	t.Logf("daemon under 64 MiB after %d files: %s", len(paths), usage(f[2]))
	// The daemon wrote them, not the kernel (whose expiry is 30 s): its
	// device counts a page of each, once verified (up to 30 s after its
	// writes while the system has other dirty pages).
	var written int
	want := len(paths) * os.Getpagesize() / 1024
	testwait.Poll(45*time.Second, func() bool {
		for line := range strings.Lines(podman(t, "exec", name, "flusherd", "stats")) {
			if v, ok := strings.CutPrefix(line, "BdiWritten:"); ok {
				written, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			}
		}
		return written >= want
	})
	if written < want {
		t.Errorf("BdiWritten %d kB, want at least %d (a page of each file)", written, want)
	}
	podman(t, "stop", "-t", "60", name)
	if code := strings.TrimSpace(podman(t, "inspect", name, "--format", "{{.State.ExitCode}} {{.State.OOMKilled}}")); code != "0 false" {
		t.Errorf("exit code and OOM kill %q after podman stop, want 0 false", code)
	}
}
