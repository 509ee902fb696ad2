// Package nspawn boots a real systemd as PID 1 of a container, for tests
// that run flusherd the way it is deployed: installed from its Debian
// package and started by systemd under the shipped unit and its sandbox.
//
// The root filesystem is a minimal Debian made by mmdebstrap(1); the
// container is started with systemd-nspawn(1) and commands run inside it
// with nsenter(1). Everything a test makes (the root filesystem, a tmpfs on
// /run/systemd/nspawn, the container) is undone by t.Cleanup, in reverse
// order, even when the test fails. It needs root; under CI (CI=true) a
// missing tool fails the test, elsewhere it skips (testfs.Missing).
package nspawn

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
)

// Packages is what Rootfs installs besides the minbase variant: systemd as
// init, and the tools the tests call inside the container.
var Packages = []string{"systemd", "systemd-sysv", "dbus", "libseccomp2", "util-linux", "procps"}

// SystemCallFilter is the seccomp allow-list addition that systemd-nspawn
// needs here: its own filter (systemd 252) answers ENOSYS or EPERM to
// cachestat, which it does not know, and to the handle and fanotify calls,
// which it allows only with CAP_SYS_ADMIN-level settings.
const SystemCallFilter = "open_by_handle_at name_to_handle_at fanotify_init fanotify_mark cachestat openat2"

// Need checks that the tools the package uses are installed, and that the
// caller is root.
func Need(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nspawn: needs root (mmdebstrap, systemd-nspawn, loop mounts)")
	}
	for _, tool := range []string{"mmdebstrap", "systemd-nspawn", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			testfs.Missing(t, "nspawn: %s not found (Debian packages mmdebstrap, systemd-container, util-linux): %v", tool, err)
		}
	}
}

// Rootfs makes a minimal Debian bookworm root filesystem with Packages and
// extra in a new directory under dir and returns its path. It takes about
// 20 s with a warm package cache.
func Rootfs(t testing.TB, dir string, extra ...string) string {
	t.Helper()
	root := filepath.Join(dir, "rootfs")
	include := strings.Join(append(append([]string{}, Packages...), extra...), ",")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mmdebstrap", "--variant=minbase", "--include="+include, "bookworm", root)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nspawn: mmdebstrap: %v\n%s", err, tail(out, 40))
	}
	return root
}

// Bind is a host directory made visible inside the container.
type Bind struct{ Host, Container string }

// Container is a booted container.
type Container struct {
	// PID is the host PID of the container's PID 1 (systemd).
	PID   int
	Root  string
	cmd   *exec.Cmd
	log   string
	exit  chan error
	mntNS string // readlink of /proc/PID/ns/mnt: the container's mount namespace
}

// Boot starts systemd-nspawn on root with the binds and waits until the
// container's systemd reports the system running (or degraded). The
// flags are those this machine needs: --register=no and --keep-unit (no
// host system bus, no host systemd), --capability=all, SystemCallFilter,
// and a tmpfs on /run/systemd/nspawn when /run is not one (nspawn keeps
// its propagation directory there). The container is powered off, or
// killed, at cleanup.
func Boot(t testing.TB, root, name string, binds ...Bind) *Container {
	t.Helper()
	mountNspawnRun(t)
	logPath := filepath.Join(filepath.Dir(root), "nspawn.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-D", root, "-b", "--console=pipe", "--register=no", "--keep-unit",
		"--capability=all", "--system-call-filter=" + SystemCallFilter, "-M", name}
	for _, b := range binds {
		args = append(args, "--bind="+b.Host+":"+b.Container)
	}
	cmd := exec.Command("systemd-nspawn", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("nspawn: systemd-nspawn: %v", err)
	}
	c := &Container{Root: root, cmd: cmd, log: logPath, exit: make(chan error, 1)}
	go func() { c.exit <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() { c.poweroff(t) })

	deadline := time.Now().Add(30 * time.Second)
	for c.PID == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("nspawn: no container init after 30s; nspawn log:\n%s", c.Log())
		}
		select {
		case err := <-c.exit:
			c.exit <- err
			t.Fatalf("nspawn: systemd-nspawn exited: %v; log:\n%s", err, c.Log())
		case <-time.After(50 * time.Millisecond):
		}
		c.PID = childOf(cmd.Process.Pid, "systemd")
	}
	c.mntNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", c.PID))
	// Early in boot systemctl cannot reach systemd yet: it says "Failed
	// to connect to bus", or "offline". Ask again until it answers
	// running (or degraded), or the deadline passes.
	for {
		out, err := c.Exec(60*time.Second, "systemctl", "is-system-running", "--wait")
		s := strings.TrimSpace(out)
		if s == "running" || s == "degraded" {
			return c
		}
		early := strings.Contains(s, "Failed to connect to bus") || strings.HasPrefix(s, "offline")
		if !early || time.Now().After(deadline) {
			failed, _ := c.Exec(10*time.Second, "systemctl", "--failed", "--no-pager")
			t.Fatalf("nspawn: container did not come up: %q %v\n%s", s, err, failed)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Exec runs a command inside the container (all of its namespaces) and
// returns its combined output; it is killed after timeout.
func (c *Container) Exec(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := append([]string{"-t", strconv.Itoa(c.PID), "-a", "--", "/usr/bin/env",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", name}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s %s: timed out after %s: %w", name, strings.Join(args, " "), timeout, err)
	} else if err != nil {
		err = fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), err
}

// Sh runs script with sh -c inside the container.
func (c *Container) Sh(timeout time.Duration, script string) (string, error) {
	return c.Exec(timeout, "sh", "-c", script)
}

// HostPID returns the host PID of the container's process pid (its PID as
// the container sees it), found through NSpid in /proc/*/status among the
// descendants of the container's PID 1. It returns 0 if there is none.
func (c *Container) HostPID(pid int) int {
	ents, _ := os.ReadDir("/proc")
	want := strconv.Itoa(pid)
	for _, e := range ents {
		hp, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && f[0] == "NSpid:" && f[1] == e.Name() && f[2] == want && c.descends(hp) {
				return hp
			}
		}
	}
	return 0
}

func (c *Container) descends(pid int) bool {
	for pid > 1 {
		if pid == c.PID {
			return true
		}
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut after ')'.
		f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		if len(f) < 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[1])
	}
	return false
}

// Log returns the end of systemd-nspawn's own output.
func (c *Container) Log() string {
	b, _ := os.ReadFile(c.log)
	return string(tail(b, 60))
}

// poweroff stops the container and waits until no process is left in its
// mount namespace, so that the filesystems bound into it are released
// before the test's cleanup unmounts and detaches them.
func (c *Container) poweroff(t testing.TB) {
	if c.PID != 0 {
		// SIGRTMIN+4 (glibc's SIGRTMIN is 34): systemd(1) starts
		// poweroff.target, and nspawn exits when the container is down.
		unix.Kill(c.PID, unix.Signal(34+4))
	}
	select {
	case <-c.exit:
	case <-time.After(20 * time.Second):
		t.Logf("nspawn: container did not power off within 20s; killing systemd-nspawn")
		c.cmd.Process.Kill()
		<-c.exit
	}
	if c.mntNS == "" {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := c.inNamespace()
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("nspawn: %d processes still in the container's mount namespace 10s after it stopped", left)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inNamespace counts the host's processes in the container's mount
// namespace.
func (c *Container) inNamespace() int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if ns, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && ns == c.mntNS {
			n++
		}
	}
	return n
}

// childOf returns the PID of a child of parent whose command name is comm,
// or 0.
func childOf(parent int, comm string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", parent, parent))
	if err != nil {
		return 0
	}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		if c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(c)) == comm {
			return pid
		}
	}
	return 0
}

// mountNspawnRun mounts a tmpfs on /run/systemd/nspawn unless /run is a
// tmpfs already, and undoes exactly that at cleanup (the mount, and the
// directory if it made it).
func mountNspawnRun(t testing.TB) {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs("/run", &fs); err == nil && fs.Type == unix.TMPFS_MAGIC {
		return
	}
	dir := "/run/systemd/nspawn"
	if err := unix.Statfs(dir, &fs); err == nil && fs.Type == unix.TMPFS_MAGIC {
		return // mounted already (by an earlier run, or by hand)
	}
	made := ""
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		made = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("nspawn: mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
		if made != "" {
			os.RemoveAll(made)
		}
	})
}

func tail(b []byte, lines int) []byte {
	b = bytes.TrimRight(b, "\n")
	for i, n := len(b)-1, 0; i >= 0; i-- {
		if b[i] == '\n' {
			if n++; n == lines {
				return b[i+1:]
			}
		}
	}
	return b
}
