package systemd_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/faultfs"
	"flusherd/internal/nspawn"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// The trees' bounds in the container: data written under /srv/data is due
// after expire and picked up at the next interval.
const (
	expire   = time.Second
	interval = 500 * time.Millisecond
	// bound is how long a written file may stay dirty: expire + interval +
	// 1.5 s of slack for a loaded machine.
	bound = expire + interval + 1500*time.Millisecond
)

// baseConfig is the container's /etc/flusherd/flusherd.toml for most
// checks. /srv/data/slow is a nested tree whose files stay dirty (60 s), so
// that `flusherd dirty` and `flusherd sync` have something to show.
const baseConfig = `[writeback]
dirty_expire_interval = "1s"
dirty_writeback_interval = "500ms"
attempt_timeout = "2s"

[[watch]]
path = "/srv/data"

[[watch]]
path = "/srv/data/slow"
expire = "60s"
`

// TestUnderSystemd installs the Debian package in a container whose PID 1
// is systemd 252 (Debian 12) and checks, under the shipped unit and its
// sandbox, what an operator relies on. Each check is a subtest; they run in
// order on one container and one daemon, each leaving the service as the
// next one expects it.
func TestUnderSystemd(t *testing.T) {
	testfs.SkipShort(t, "boots a Debian container and builds the package")
	nspawn.Need(t)
	if _, err := exec.LookPath("strace"); err != nil {
		testfs.Missing(t, "strace not found (Debian package strace): %v", err)
	}
	// No other test's mount may exist while the container runs (see
	// testfs.ExcludeMounts); this waits for those running now.
	testfs.ExcludeMounts(t)
	start := time.Now()
	work := t.TempDir()
	// Everything that takes a while is independent: the package, the two
	// filesystems and the root filesystem.
	// The package, and the next build of it (11-upgrade): a later
	// version of the same tree.
	var deb, next string
	var debErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		if deb, debErr = buildDeb(work, ""); debErr == nil {
			next, debErr = buildDeb(filepath.Join(work, "next"), debVersion(deb)+"+1")
		}
	})
	ext4 := testfs.Mount(t, testfs.Options{Type: "ext4"})
	xfs := testfs.Mount(t, testfs.Options{Type: "xfs"})
	// A FUSE filesystem whose writes can be stalled: a hung filesystem
	// for the watchdog's other side (07b).
	ffs := faultfs.MountT(t)
	root := nspawn.Rootfs(t, work)
	wg.Wait()
	if debErr != nil {
		t.Fatal(debErr)
	}
	for _, d := range []string{deb, next} {
		if err := copyFile(d, filepath.Join(root, "root", filepath.Base(d))); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"slow", "many", "user"} {
		if err := os.MkdirAll(filepath.Join(ext4.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("package, filesystems and root filesystem ready after %s", time.Since(start).Round(100*time.Millisecond))
	c := nspawn.Boot(t, root, "flusherd-test",
		nspawn.Bind{Host: ext4.Dir, Container: "/srv/data"}, nspawn.Bind{Host: xfs.Dir, Container: "/srv/xfs"},
		nspawn.Bind{Host: ffs.Dir, Container: "/srv/fuse"})
	t.Logf("container running after %s", time.Since(start).Round(100*time.Millisecond))
	h := &harness{t: t, c: c, hostOf: map[string]string{"/srv/data": ext4.Dir, "/srv/xfs": xfs.Dir, "/srv/fuse": ffs.Dir}}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.Exec(20*time.Second, "journalctl", "-u", "flusherd", "--no-pager", "-n", "80")
			t.Logf("journal of flusherd:\n%s", out)
		}
	})

	ok := t.Run("00-install", func(t *testing.T) {
		h.t = t
		h.must(h.sh("apt-get install -y -q --no-install-recommends /root/" + filepath.Base(deb)))
		h.must(h.sh("test -x /usr/sbin/flusherd && test -f /lib/systemd/system/flusherd.service && test -f /etc/flusherd/flusherd.toml"))
		h.must(h.sh("man -w flusherd 2>/dev/null || test -f /usr/share/man/man8/flusherd.8.gz"))
		h.must(h.sh("test -f /usr/share/man/man5/flusherd.toml.5.gz"))
		if out := h.must(h.sh("systemctl is-enabled flusherd")); strings.TrimSpace(out) != "enabled" {
			t.Errorf("after install: is-enabled = %q, want enabled", out)
		}
		// Installed, it runs idle and says so: no tree is configured.
		h.waitActive()
		if st := h.prop("StatusText"); !strings.Contains(st, "idle") {
			t.Errorf("StatusText = %q, want it to say the daemon is idle", st)
		}
		if out := h.must(h.sh("flusherd check-config /etc/flusherd/flusherd.toml 2>&1")); !strings.Contains(out, "no [[watch]]") {
			t.Errorf("check-config of the packaged configuration: %q, want the note that nothing is watched", out)
		}
	})
	if !ok {
		t.FailNow()
	}
	packaged, err := os.ReadFile(filepath.Join(c.Root, "etc/flusherd/flusherd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	h.writeConfig(baseConfig)

	t.Run("01-start", func(t *testing.T) {
		h.t = t
		h.must(h.sh("systemctl restart flusherd"))
		h.waitActive()
		h.waitJournal("initial scan done", 10*time.Second)
		if out := h.journal(); !strings.Contains(out, "backend: fanotify") {
			t.Errorf("watch backend is not fanotify under the unit; journal:\n%s", out)
		}
		// Under RestrictSUIDSGID=yes openat2 is refused; the daemon says so
		// and walks paths instead (exercised by every check below).
		if out := h.journal(); !strings.Contains(out, "openat2(2) is refused") {
			t.Errorf("the openat2 fallback was not logged under RestrictSUIDSGID=yes; journal:\n%s", out)
		}
	})

	h.t = t // the first trace outlives the subtests below
	tr := h.trace()

	t.Run("02-written-back-within-bound", func(t *testing.T) {
		h.t = t
		h.must(h.sh("head -c 200000 /dev/urandom > /srv/data/f1"))
		h.waitClean("/srv/data/f1", bound)
	})

	t.Run("03-socket-commands", func(t *testing.T) {
		h.t = t
		h.must(h.sh("head -c 50000 /dev/urandom > /srv/data/slow/s1"))
		h.waitListed("/srv/data/slow/s1")
		if !h.dirty("/srv/data/slow/s1") {
			t.Fatal("s1 is not dirty before flusherd sync (cachestat): the check below proves nothing")
		}
		out := h.must(h.sh("flusherd sync /srv/data/slow/s1"))
		if !strings.Contains(out, "1 file written back") {
			t.Errorf("flusherd sync: %q", out)
		}
		if h.dirty("/srv/data/slow/s1") {
			t.Error("s1 still dirty after flusherd sync returned")
		}
		stats := h.must(h.sh("flusherd stats"))
		for _, want := range []string{"BdiWritten:", "b_dirty:", "b_more_io_wait:"} {
			if !strings.Contains(stats, want) {
				t.Errorf("flusherd stats lacks %q:\n%s", want, stats)
			}
		}
		// Integrity batches of at least plug.integrity_syncfs (64) files
		// of one filesystem are made durable with one syncfs(2).
		h.must(h.sh("for i in $(seq 1 70); do head -c 8192 /dev/urandom > /srv/data/slow/many$i; done"))
		h.waitFor("70 files tracked", 10*time.Second, func() bool {
			out, _ := h.sh("flusherd dirty --top 0 | grep -c /srv/data/slow/many")
			n, _ := strconv.Atoi(strings.TrimSpace(out))
			return n == 70
		})
		out = h.must(h.sh("flusherd sync /srv/data/slow"))
		if !strings.Contains(out, "70 files written back") {
			t.Errorf("flusherd sync of the directory: %q", out)
		}
		for i := 1; i <= 70; i++ {
			if p := fmt.Sprintf("/srv/data/slow/many%d", i); h.dirty(p) {
				t.Errorf("%s dirty after flusherd sync", p)
			}
		}
	})

	t.Run("03b-second-daemon-refused", func(t *testing.T) {
		h.t = t
		// A flusherd started by hand (outside the unit's mount and
		// network namespaces, with a stats directory of its own) over
		// the unit's tree, inside it, or around it, is refused, naming
		// the unit's daemon, before it writes anything.
		pid := h.prop("MainPID")
		for _, tc := range []struct{ dir, want string }{
			{"/srv/data", `\"/srv/data\" is served by another flusherd (pid ` + pid + `); stop it first`},
			{"/srv/data/many", `\"/srv/data/many\" is inside \"/srv/data\", which another flusherd (pid ` + pid + `) serves with its subdirectories`},
			{"/srv", `a tree inside \"/srv\" is served by another flusherd (pid ` + pid + `)`},
		} {
			// Its own (empty) configuration: not the unit's file.
			out, _ := h.sh("rm -rf /tmp/second; : > /tmp/second.toml; flusherd run --config /tmp/second.toml --watch " + tc.dir +
				" --stats-dir /tmp/second 2>&1; echo exit=$?; test -e /tmp/second/bdi && echo made-bdi")
			if !strings.Contains(out, tc.want) || !strings.Contains(out, "exit=1\n") || strings.Contains(out, "made-bdi") {
				t.Errorf("a second flusherd over %s (the unit's MainPID is %s):\n%s\nwant exit 1, no bdi/, and %s", tc.dir, pid, out, tc.want)
			}
		}
	})

	t.Run("05-file-of-another-user-0600", func(t *testing.T) {
		h.t = t
		h.must(h.sh("chown 1000:1000 /srv/data/user && setpriv --reuid=1000 --regid=1000 --clear-groups sh -c 'umask 077; head -c 100000 /dev/urandom > /srv/data/user/secret'"))
		host := h.host("/srv/data/user/secret")
		var st unix.Stat_t
		if err := unix.Stat(host, &st); err != nil || st.Uid != 1000 || st.Mode&0o777 != 0o600 {
			t.Fatalf("the test file is not uid 1000 mode 0600: %+v %v", st, err)
		}
		h.waitClean("/srv/data/user/secret", bound)
	})

	t.Run("06-reload", func(t *testing.T) {
		h.t = t
		h.writeConfig(baseConfig + "\n[[watch]]\npath = \"/srv/xfs\"\n")
		h.reload("configuration reloaded")
		h.must(h.sh("head -c 100000 /dev/urandom > /srv/xfs/x1"))
		h.waitClean("/srv/xfs/x1", bound)

		// A bad configuration is rejected with file:line:key; the running
		// one keeps serving both trees.
		bad := baseConfig + "\n[[watch]]\npath = \"/srv/xfs\"\n"
		bad = strings.Replace(bad, `attempt_timeout = "2s"`, `attempt_timeout = "-1s"`, 1)
		h.writeConfig(bad)
		h.reload("configuration reload rejected")
		want := "/etc/flusherd/flusherd.toml:4: writeback.attempt_timeout"
		if out := h.journal(); !strings.Contains(out, want) {
			t.Errorf("the rejected reload does not name %q; journal:\n%s", want, out)
		}
		h.waitActive()
		h.must(h.sh("head -c 100000 /dev/urandom > /srv/xfs/x2; head -c 100000 /dev/urandom > /srv/data/f2"))
		h.waitClean("/srv/xfs/x2", bound)
		h.waitClean("/srv/data/f2", bound)
		h.writeConfig(baseConfig)
		h.reload("configuration reloaded")
	})

	t.Run("06b-background-writeback", func(t *testing.T) {
		h.t = t
		// A 32 MiB file in the tree whose expiry is 60 s, with
		// dirty_background_bytes = 8MiB: written back to under 8 MiB
		// within seconds, reading /proc/vmstat and the device's
		// /sys/dev/block/<dev>/stat under the sandbox.
		h.writeConfig(strings.Replace(baseConfig, "[writeback]\n", "[writeback]\ndirty_background_bytes = \"8MiB\"\n", 1))
		h.reload("configuration reloaded")
		h.must(h.sh("head -c 33554432 /dev/urandom > /srv/data/slow/bg1"))
		h.waitFor("bg1 under dirty_background_bytes (cachestat)", 15*time.Second, func() bool { return h.dirtyBytes("/srv/data/slow/bg1") <= 8<<20 })
		if n := h.dirtyBytes("/srv/data/slow/bg1"); n == 0 {
			t.Errorf("bg1 written back whole: background writeback did not stop at the threshold (expiry 60 s)")
		}
		h.waitFor("background_works in flusherd stats", 5*time.Second, func() bool {
			// One line per device: /srv/data and /srv/xfs are two.
			out, _ := h.sh("flusherd stats | awk '/^background_works:/ {n += $2} END {print n + 0}'")
			n, _ := strconv.Atoi(strings.TrimSpace(out))
			return n > 0
		})
		if out := h.journal(); strings.Contains(out, "no block device statistics") {
			t.Errorf("the device's block statistics could not be read under the unit; journal:\n%s", out)
		}
		h.must(h.sh("flusherd sync /srv/data/slow/bg1"))
		h.writeConfig(baseConfig)
		h.reload("configuration reloaded")
	})

	t.Run("syscalls-under-the-unit", func(t *testing.T) {
		h.t = t
		calls := tr.stop()
		t.Logf("system calls seen (name ok/failed):\n%s", calls)
		calls.require(t, []syscallClass{
			{"handle opens", "open_by_handle_at", ""},
			{"handles made", "name_to_handle_at", ""},
			{"path opens (O_PATH walk)", "openat", "O_PATH"},
			{"cachestat", "cachestat", ""},
			{"sync_file_range", "sync_file_range", ""},
			{"fdatasync", "fdatasync", ""},
			{"syncfs", "syncfs", ""},
			{"fanotify (mark of a filesystem added by reload)", "fanotify_mark", ""},
			{"control socket", "accept4", ""},
			{"stats writes (rename into place)", "renameat", ""},
		})
		calls.allowedBy(t, "../deploy/seccomp/flusherd.json")
	})

	t.Run("04-path-opened-tree", func(t *testing.T) {
		h.t = t
		// Without CAP_DAC_READ_SEARCH there are no opens by handle: every
		// file is opened by path, and auto picks inotify.
		h.dropIn("nodac", "[Service]\nCapabilityBoundingSet=\nCapabilityBoundingSet=CAP_SYS_ADMIN CAP_FOWNER\n")
		defer h.removeDropIn("nodac")
		// Two files for the probe below, made and written back before
		// the daemon starts: clean, so that nothing of the daemon's
		// opens them while they are held (a close of its own, by an
		// attempt, a count of a written file or a look of the sweep,
		// has them probed, and a file only read is let go). The sweep
		// looks every 3 s: a candidate let go lingers until a look
		// finds it clean.
		h.must(h.sh("mkdir -p /srv/data/held && echo r > /srv/data/held/r2 && echo o > /srv/data/held/o2 && sync"))
		h.writeConfig(baseConfig + "\n[watcher]\nsweep_interval = \"3s\"\n")
		defer h.writeConfig(baseConfig) // in force at the next restart
		h.must(h.sh("systemctl restart flusherd"))
		h.waitActive()
		h.waitJournal("initial scan done", 10*time.Second)
		j := h.journal()
		if !strings.Contains(j, "opened by path") || !strings.Contains(j, "backend: inotify") {
			t.Errorf("without CAP_DAC_READ_SEARCH the journal does not say files are opened by path with inotify:\n%s", j)
		}
		tr := h.trace()
		h.must(h.sh("mkdir -p /srv/data/newdir && head -c 100000 /dev/urandom > /srv/data/newdir/p1"))
		h.waitClean("/srv/data/newdir/p1", bound)
		// A file read through two descriptors (an open of another file
		// between their opens) whose closes come back to back, merged
		// into one inotify event: the probe for writers (a read lease)
		// lets it go as a candidate of the sweep under the sandbox.
		const candidates = "flusherd stats | awk '/^sweep_candidates:/ {n += $2} END {print n + 0}'"
		// p1's open and close may have merged into one inotify event:
		// it then lingers as a candidate until a look (every 3 s) finds
		// it clean. The count below is of the held files alone.
		h.waitFor("no sweep candidate before the probe (flusherd stats)", 6*time.Second, func() bool {
			out, _ := h.sh(candidates)
			return strings.TrimSpace(out) == "0"
		})
		// The count is read eight times over 3.5 s while the files are
		// held, and its least is theirs: a file the daemon itself
		// opened meanwhile (p1, when the read of the error cursor
		// counts its write, up to 30 s after it) is a candidate until
		// the next look, at most 3 s later.
		held, err := h.sh("(exec 3</srv/data/held/r2; exec 4</srv/data/held/o2; exec 5</srv/data/held/r2; sleep 5; exec 3<&- 5<&-; exec 4<&-) & " +
			"sleep 1; for i in 1 2 3 4 5 6 7 8; do " + candidates + "; sleep 0.5; done; wait")
		counts := strings.Fields(held)
		least := ""
		for _, c := range counts {
			if n, err := strconv.Atoi(c); err == nil {
				if l, _ := strconv.Atoi(least); least == "" || n < l {
					least = c
				}
			}
		}
		t.Logf("sweep candidates over the hold: %s", strings.Join(counts, " "))
		if err != nil || len(counts) != 8 || least != "2" {
			t.Errorf("sweep candidates while the two files are held: %q (%v), want 2 at least once and never fewer", held, err)
		}
		h.waitFor("no sweep candidate left (flusherd stats)", 6*time.Second, func() bool {
			out, _ := h.sh(candidates)
			return strings.TrimSpace(out) == "0"
		})
		calls := tr.stop()
		calls.require(t, []syscallClass{
			{"inotify", "inotify_add_watch", ""},
			{"path opens (reopen of the O_PATH descriptor)", "openat", "/proc/self/fd/"},
			{"cachestat", "cachestat", ""},
			{"sync_file_range", "sync_file_range", ""},
			{"the probe for writers", "fcntl", "F_SETLEASE, F_RDLCK"},
		})
		if n := calls.ok("open_by_handle_at", ""); n != 0 {
			t.Errorf("%d opens by handle without CAP_DAC_READ_SEARCH", n)
		}
	})

	t.Run("04b-openat2-allowed", func(t *testing.T) {
		h.t = t
		// With RestrictSUIDSGID=no openat2 is not refused: the other
		// branch of the path opens, under the rest of the sandbox.
		h.dropIn("openat2", "[Service]\nRestrictSUIDSGID=no\n")
		defer h.removeDropIn("openat2")
		h.must(h.sh("systemctl restart flusherd"))
		h.waitActive()
		h.waitJournal("initial scan done", 10*time.Second)
		if j := h.journal(); strings.Contains(j, "openat2(2) is refused") {
			t.Errorf("openat2 refused with RestrictSUIDSGID=no:\n%s", j)
		}
		tr := h.trace()
		h.must(h.sh("head -c 100000 /dev/urandom > /srv/data/o1"))
		h.waitClean("/srv/data/o1", bound)
		tr.stop().require(t, []syscallClass{{"openat2", "openat2", ""}})
	})

	t.Run("09-security-score", func(t *testing.T) {
		h.t = t
		h.must(h.sh("systemctl restart flusherd"))
		h.waitActive()
		h.checkExposure("the loaded unit", "")
	})

	t.Run("10-metrics-drop-in", func(t *testing.T) {
		h.t = t
		h.must(h.sh("mkdir -p /etc/systemd/system/flusherd.service.d && cp /usr/share/doc/flusherd/flusherd-metrics.conf /etc/systemd/system/flusherd.service.d/metrics.conf"))
		defer h.removeDropIn("metrics")
		h.writeConfig(baseConfig + "\n[metrics]\nlisten = \"127.0.0.1:9469\"\n")
		defer h.writeConfig(baseConfig)
		h.must(h.sh("systemctl daemon-reload && systemctl restart flusherd"))
		h.waitActive()
		var out string
		h.waitFor("/metrics answers", 5*time.Second, func() bool {
			out, _ = h.c.Exec(5*time.Second, "bash", "-c",
				`exec 3<>/dev/tcp/127.0.0.1/9469 && printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3 && cat <&3`)
			return strings.Contains(out, "200 OK") && strings.Contains(out, "flusherd_")
		})
		h.checkExposure("the loaded unit with the metrics drop-in", "flusherd-metrics.conf")
	})

	t.Run("07-watchdog-restart", func(t *testing.T) {
		h.t = t
		// A shorter watchdog than the shipped 30 s, to keep the test short;
		// attempt_timeout is lowered with it, as the unit's comment asks.
		h.dropIn("watchdog", "[Service]\nWatchdogSec=3s\n")
		defer h.removeDropIn("watchdog")
		h.writeConfig(strings.Replace(baseConfig, `attempt_timeout = "2s"`, `attempt_timeout = "1s"`, 1))
		defer h.writeConfig(baseConfig)
		h.must(h.sh("systemctl restart flusherd"))
		h.waitActive()
		before, _ := strconv.Atoi(h.prop("NRestarts"))
		pid, _ := strconv.Atoi(h.prop("MainPID"))
		hp := h.c.HostPID(pid)
		if hp == 0 {
			t.Fatalf("no host PID for the daemon (container PID %d)", pid)
		}
		// The goroutines wedged: the whole process stopped.
		if err := unix.Kill(hp, unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		h.must(h.sh("for i in 1 2 3 4 5; do head -c 20000 /dev/urandom > /srv/data/w$i; done"))
		var restarted time.Duration
		h.waitFor("NRestarts to grow and the service to be active again", 30*time.Second, func() bool {
			n, _ := strconv.Atoi(h.prop("NRestarts"))
			if n > before && h.prop("ActiveState") == "active" {
				restarted = time.Since(stopped)
				return true
			}
			return false
		})
		t.Logf("watchdog: stopped at 0, active again after %s (WatchdogSec=3s, RestartSec=2s)", restarted.Round(10*time.Millisecond))
		if r := h.prop("Result"); r != "success" && r != "watchdog" {
			t.Logf("Result after the restart: %s", r)
		}
		if j := h.journalAll(); !strings.Contains(j, "Watchdog timeout") {
			t.Errorf("the journal does not show a watchdog timeout:\n%s", j)
		}
		// Dirtied while the old process was stopped: found by the new
		// process's initial scan.
		for i := 1; i <= 5; i++ {
			h.waitClean(fmt.Sprintf("/srv/data/w%d", i), bound)
		}
	})

	t.Run("07b-hung-filesystem-no-restart", func(t *testing.T) {
		h.t = t
		// The watchdog's other side: a filesystem whose opens and writes
		// hang for 12 s is reported, not restarted. attempt_timeout (6 s) is
		// longer than WatchdogSec (3 s; flusherd warns about that):
		// the device's goroutine leaves the hung call to its worker
		// after 100 ms, so the pings go on. (Before calls were
		// detached, it waited attempt_timeout on the call, and systemd
		// killed it.)
		h.dropIn("watchdog", "[Service]\nWatchdogSec=3s\n")
		defer h.removeDropIn("watchdog")
		// /srv/fuse's expiry of 3 s: the daemon's first attempt on the
		// file comes after the faults are set, on a loaded machine too.
		h.writeConfig(strings.Replace(baseConfig, `attempt_timeout = "2s"`, `attempt_timeout = "6s"`, 1) + "\n[[watch]]\npath = \"/srv/fuse\"\nexpire = \"3s\"\n")
		defer h.writeConfig(baseConfig)
		h.must(h.sh("systemctl restart flusherd"))
		h.waitActive()
		h.waitJournal("initial scan done", 10*time.Second)
		before, _ := strconv.Atoi(h.prop("NRestarts"))
		pid := h.prop("MainPID")
		timeouts := strings.Count(h.journalAll(), "Watchdog timeout")
		// The writer keeps its file open: its own close would flush it.
		h.must(h.sh("setsid sh -c 'exec 3>/srv/fuse/hung; head -c 65536 /dev/urandom >&3; sleep 30' </dev/null >/dev/null 2>&1 &"))
		h.waitFor("the writer's data", 5*time.Second, func() bool {
			out, _ := h.sh("stat -c %s /srv/fuse/hung")
			return strings.TrimSpace(out) == "65536"
		})
		// Then the filesystem hangs: opens and writes (the daemon's open
		// of the file, on a worker, is the call the old code waited on).
		ffs.Set(faultfs.Faults{OpenDelay: 12 * time.Second, WriteDelay: 12 * time.Second})
		defer ffs.Set(faultfs.Faults{})
		hung := time.Now()
		var status string
		// The attempt starts 3 to 3.5 s after the write, and its call is
		// stuck once it has run attempt_timeout (6 s).
		h.waitFor("STATUS= to report the stuck call", 15*time.Second, func() bool {
			status = h.prop("StatusText")
			return strings.Contains(status, "stuck")
		})
		t.Logf("STATUS= %.2fs after the faults were set: %q", time.Since(hung).Seconds(), status)
		time.Sleep(time.Until(hung.Add(13 * time.Second))) // over three WatchdogSec while the calls hang
		if n, _ := strconv.Atoi(h.prop("NRestarts")); n != before || h.prop("MainPID") != pid || h.prop("ActiveState") != "active" {
			t.Errorf("a hung filesystem restarted the service: NRestarts %d -> %d, MainPID %s -> %s, %s",
				before, n, pid, h.prop("MainPID"), h.prop("ActiveState"))
		}
		if n := strings.Count(h.journalAll(), "Watchdog timeout"); n != timeouts {
			t.Errorf("a watchdog timeout while the filesystem hung:\n%s", h.journalAll())
		}
		ffs.Set(faultfs.Faults{})
		h.waitClean("/srv/fuse/hung", 20*time.Second)
		h.waitFor("STATUS= to say running again", 10*time.Second, func() bool { return h.prop("StatusText") == "running" })
		h.sh("pkill -f 'exec 3>/srv/fuse/hung'")
	})

	t.Run("08-journal-priorities", func(t *testing.T) {
		h.t = t
		out := h.must(h.c.Exec(20*time.Second, "journalctl", "-u", "flusherd", "-p", "warning", "-o", "cat", "--no-pager"))
		if !strings.Contains(out, "configuration reload rejected") {
			t.Errorf("journalctl -p warning lacks the rejected reload (an error):\n%s", out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "INFO") || strings.HasPrefix(line, "DEBUG") {
				t.Errorf("journalctl -p warning shows an info or debug line: %q", line)
			}
		}
		if all := h.journalAll(); !strings.Contains(all, "initial scan done") {
			t.Errorf("info lines are missing from the journal:\n%s", all)
		}
	})

	t.Run("11-upgrade", func(t *testing.T) {
		h.t = t
		// The operator's trees in a drop-in, the conffile as packaged:
		// the next build installs without a question, and the daemon
		// runs on the new binary with the same trees.
		h.writeConfig(string(packaged))
		h.must(h.sh("mkdir -p /etc/flusherd/flusherd.d"))
		if err := os.WriteFile(filepath.Join(c.Root, "etc/flusherd/flusherd.d/10-trees.toml"), []byte(baseConfig), 0o644); err != nil {
			t.Fatal(err)
		}
		h.must(h.sh("systemctl restart flusherd"))
		h.waitActive()
		before := h.prop("MainPID")
		out, err := h.sh("DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends /root/" + filepath.Base(next) + " </dev/null 2>&1")
		if err != nil {
			t.Fatalf("installing the next build: %v\n%s", err, out)
		}
		want := "install ok installed " + debVersion(next)
		if got := strings.TrimSpace(h.must(h.sh("dpkg-query -W -f='${Status} ${Version}' flusherd"))); got != want {
			t.Errorf("after the upgrade: %q, want %q", got, want)
		}
		if out, err := h.sh("ls /etc/flusherd/*.dpkg-* 2>/dev/null && exit 1 || true"); err != nil {
			t.Errorf("the upgrade left conffile copies: %s", out)
		}
		h.waitActive()
		pid := h.prop("MainPID")
		exe := strings.TrimSpace(h.must(h.sh("readlink /proc/" + pid + "/exe")))
		if pid == before || exe != "/usr/sbin/flusherd" {
			t.Errorf("after the upgrade the daemon is pid %s (was %s) running %q; want a new process of /usr/sbin/flusherd", pid, before, exe)
		}
		if v := strings.TrimSpace(h.must(h.sh("/usr/sbin/flusherd version"))); v != "flusherd "+debVersion(next) {
			t.Errorf("flusherd version = %q, want the next build's", v)
		}
		h.must(h.sh("head -c 100000 /dev/urandom > /srv/data/slow/upgraded"))
		h.waitListed("/srv/data/slow/upgraded")
	})

	t.Run("11-stop", func(t *testing.T) {
		h.t = t
		h.must(h.sh("head -c 100000 /dev/urandom > /srv/data/slow/last1; head -c 100000 /dev/urandom > /srv/data/last2"))
		h.waitListed("/srv/data/slow/last1")
		h.must(h.sh("systemctl stop flusherd"))
		if r := h.prop("Result"); r != "success" {
			t.Errorf("Result after stop = %q, want success", r)
		}
		for _, p := range []string{"/srv/data/slow/last1", "/srv/data/last2"} {
			if h.dirty(p) {
				t.Errorf("%s still dirty after systemctl stop", p)
			}
		}
		if j := h.journalAll(); !strings.Contains(j, "every tracked file is clean") {
			t.Errorf("stop did not report every tracked file clean:\n%s", j)
		}
	})

	t.Run("12-purge", func(t *testing.T) {
		h.t = t
		// The operator's drop-in is the operator's to remove.
		h.must(h.sh("rm -f /etc/flusherd/flusherd.d/10-trees.toml"))
		h.must(h.sh("apt-get purge -y -q flusherd"))
		for _, p := range []string{"/usr/sbin/flusherd", "/lib/systemd/system/flusherd.service", "/etc/flusherd", "/run/flusherd",
			"/etc/systemd/system/multi-user.target.wants/flusherd.service"} {
			if out, err := h.sh("test ! -e " + p); err != nil {
				t.Errorf("%s is left after purge %s", p, out)
			}
		}
	})
	t.Logf("harness run time: %s", time.Since(start).Round(100*time.Millisecond))
}

// harness runs the checks' steps in the container.
type harness struct {
	t      *testing.T
	c      *nspawn.Container
	hostOf map[string]string // container mount point -> host directory
}

func (h *harness) sh(script string) (string, error) { return h.c.Sh(60*time.Second, script) }

// must fails the test on err and returns out.
func (h *harness) must(out string, err error) string {
	h.t.Helper()
	if err != nil {
		h.t.Fatalf("%v\n%s", err, out)
	}
	return out
}

func (h *harness) prop(name string) string {
	h.t.Helper()
	out := h.must(h.c.Exec(20*time.Second, "systemctl", "show", "-P", name, "flusherd"))
	return strings.TrimSpace(out)
}

func (h *harness) waitActive() {
	h.t.Helper()
	h.waitFor("the service to be active", 20*time.Second, func() bool { return h.prop("ActiveState") == "active" })
}

func (h *harness) waitFor(what string, within time.Duration, cond func() bool) {
	h.t.Helper()
	if !testwait.Poll(within, cond) {
		h.t.Fatalf("waited %s for %s", within, what)
	}
}

// waitListed waits until flusherd dirty lists the file p.
func (h *harness) waitListed(p string) {
	h.t.Helper()
	h.waitFor("flusherd dirty to list "+p, 5*time.Second, func() bool {
		out, _ := h.sh("flusherd dirty")
		return strings.Contains(out, p)
	})
}

// journal returns what the daemon logged in its current invocation (the
// service's InvocationID): what earlier runs logged is left out.
func (h *harness) journal() string {
	h.t.Helper()
	out, _ := h.c.Exec(20*time.Second, "journalctl", "-o", "cat", "--no-pager", "_SYSTEMD_INVOCATION_ID="+h.prop("InvocationID"))
	return out
}

// journalAll returns every line about the unit, systemd's own included.
func (h *harness) journalAll() string {
	h.t.Helper()
	out, _ := h.c.Exec(20*time.Second, "journalctl", "-u", "flusherd", "-o", "cat", "--no-pager")
	return out
}

func (h *harness) waitJournal(line string, within time.Duration) {
	h.t.Helper()
	h.waitFor("the journal line "+strconv.Quote(line), within, func() bool {
		return strings.Contains(h.journal(), line)
	})
}

// reload sends systemctl reload and waits for the daemon's answer (reload
// is a signal: systemctl returns before the daemon has read the file).
func (h *harness) reload(answer string) {
	h.t.Helper()
	count := func() int { return strings.Count(h.journal(), answer) }
	n := count()
	h.must(h.sh("systemctl reload flusherd"))
	h.waitFor("the reload's answer "+strconv.Quote(answer), 10*time.Second, func() bool { return count() > n })
}

func (h *harness) writeConfig(cfg string) {
	h.t.Helper()
	if err := os.WriteFile(filepath.Join(h.c.Root, "etc/flusherd/flusherd.toml"), []byte(cfg), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) dropIn(name, body string) {
	h.t.Helper()
	dir := filepath.Join(h.c.Root, "etc/systemd/system/flusherd.service.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".conf"), []byte(body), 0o644); err != nil {
		h.t.Fatal(err)
	}
	h.must(h.sh("systemctl daemon-reload"))
}

func (h *harness) removeDropIn(name string) {
	h.t.Helper()
	os.Remove(filepath.Join(h.c.Root, "etc/systemd/system/flusherd.service.d", name+".conf"))
	h.must(h.sh("systemctl daemon-reload"))
}

// host maps a path in the container to the host's path of the same file.
func (h *harness) host(p string) string {
	for mnt, dir := range h.hostOf {
		if strings.HasPrefix(p, mnt+"/") {
			return dir + strings.TrimPrefix(p, mnt)
		}
	}
	h.t.Fatalf("%s is on no bound filesystem", p)
	return ""
}

// cachestat returns p's page-cache state by cachestat(2) from the host:
// ground truth, outside the daemon.
func (h *harness) cachestat(p string) unix.Cachestat_t {
	h.t.Helper()
	fd, err := unix.Open(h.host(p), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		h.t.Fatalf("open %s: %v", p, err)
	}
	defer unix.Close(fd)
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{}, &cs, 0); err != nil {
		h.t.Fatalf("cachestat %s: %v", p, err)
	}
	return cs
}

// dirty reports whether the file has dirty or writeback pages.
func (h *harness) dirty(p string) bool {
	h.t.Helper()
	cs := h.cachestat(p)
	return cs.Dirty+cs.Writeback > 0
}

// dirtyBytes returns p's dirty bytes.
func (h *harness) dirtyBytes(p string) uint64 {
	h.t.Helper()
	return h.cachestat(p).Dirty * uint64(os.Getpagesize())
}

// waitClean waits until p is clean by cachestat and fails if that takes
// longer than within after the call.
func (h *harness) waitClean(p string, within time.Duration) {
	h.t.Helper()
	start := time.Now()
	h.waitFor(p+" clean (cachestat)", within, func() bool { return !h.dirty(p) })
	h.t.Logf("%s clean after %s", p, time.Since(start).Round(10*time.Millisecond))
}

// checkExposure compares systemd-analyze security's overall exposure of the
// loaded unit, drop-ins included, with the offline score of the committed
// unit (and dropIn, if set): it may not be higher.
func (h *harness) checkExposure(what, dropIn string) {
	h.t.Helper()
	out, _ := h.c.Exec(60*time.Second, "systemd-analyze", "security", "--no-pager", "flusherd.service")
	score := parseExposure(h.t, out)
	offline := exposureOffline(h.t, "flusherd.service", dropIn)
	h.t.Logf("exposure of %s: %.1f (offline, as committed: %.1f)", what, score, offline)
	if score > offline {
		h.t.Errorf("exposure of %s %.1f is above the offline score %.1f", what, score, offline)
	}
}

var exposureRe = regexp.MustCompile(`Overall exposure level for \S+: (\d+\.\d)`)

func parseExposure(t *testing.T, out string) float64 {
	t.Helper()
	m := exposureRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// exposureOffline is systemd-analyze security --offline=yes of the
// committed unit (with the drop-in, if any), on the host.
func exposureOffline(t *testing.T, unit, dropIn string) float64 {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "flusherd")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	u := filepath.Join(dir, "flusherd.service")
	if err := os.WriteFile(u, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/flusherd", bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	if dropIn != "" {
		d := u + ".d"
		os.Mkdir(d, 0o755)
		if err := copyFile(dropIn, filepath.Join(d, "x.conf")); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("systemd-analyze", "security", "--offline=yes", "--no-pager", u).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security --offline: %v\n%s", err, out)
	}
	return parseExposure(t, string(out))
}

// buildDeb builds the package with the script operators use; version, if
// set, is its version (FLUSHERD_VERSION).
func buildDeb(work, version string) (string, error) {
	out := filepath.Join(work, "deb")
	cmd := exec.Command("bash", "../packaging/build-deb.sh", out)
	if version != "" {
		cmd.Env = append(os.Environ(), "FLUSHERD_VERSION="+version)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("packaging/build-deb.sh: %v\n%s", err, b)
	}
	debs, _ := filepath.Glob(filepath.Join(out, "flusherd_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("packaging/build-deb.sh made %d packages: %v", len(debs), debs)
	}
	return debs[0], nil
}

// debVersion is the version in a package's file name
// (flusherd_<version>_<arch>.deb).
func debVersion(deb string) string {
	return strings.Split(filepath.Base(deb), "_")[1]
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// tracer is strace(1) attached from the host to the daemon's threads.
type tracer struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  string
	done chan struct{}
}

// trace attaches strace to the running daemon and returns once it is
// attached. The noisiest calls (futex, sleeps, epoll) are left out.
func (h *harness) trace() *tracer {
	h.t.Helper()
	pid, _ := strconv.Atoi(h.prop("MainPID"))
	hp := h.c.HostPID(pid)
	if hp == 0 {
		h.t.Fatalf("no host PID for the daemon (container PID %d)", pid)
	}
	tr := &tracer{t: h.t, out: filepath.Join(h.t.TempDir(), "strace.out"), done: make(chan struct{})}
	tr.cmd = exec.Command("strace", "-f", "-o", tr.out, "-p", strconv.Itoa(hp),
		"-e", "trace=!futex,nanosleep,clock_nanosleep,epoll_pwait,epoll_wait,sched_yield,rt_sigreturn,rt_sigprocmask,sigaltstack,getpid,gettid,tgkill,madvise,mmap,munmap")
	stderr, err := tr.cmd.StderrPipe()
	if err != nil {
		h.t.Fatal(err)
	}
	if err := tr.cmd.Start(); err != nil {
		h.t.Fatalf("strace: %v", err)
	}
	attached := make(chan struct{})
	go func() {
		defer close(tr.done)
		sc := bufio.NewScanner(stderr)
		once := sync.OnceFunc(func() { close(attached) })
		for sc.Scan() {
			if strings.Contains(sc.Text(), "attached") {
				once()
			}
		}
		once()
		io.Copy(io.Discard, stderr)
	}()
	select {
	case <-attached:
	case <-time.After(10 * time.Second):
		h.t.Fatal("strace did not attach within 10s")
	}
	return tr
}

// stop detaches strace and returns what it saw.
func (tr *tracer) stop() syscalls {
	tr.cmd.Process.Signal(unix.SIGINT)
	<-tr.done
	tr.cmd.Wait()
	b, err := os.ReadFile(tr.out)
	if err != nil {
		tr.t.Fatal(err)
	}
	return parseStrace(string(b))
}

// A call is one system call strace saw finish: its name (cachestat is
// shown as syscall_0x1c3 by strace versions that do not know it), its
// arguments and whether it failed.
type call struct {
	name, text string
	failed     bool
}

type syscalls []call

var (
	straceStart  = regexp.MustCompile(`^(\d+)\s+(\w+)\((.*)$`)
	straceResume = regexp.MustCompile(`^(\d+)\s+<\.\.\. (\w+) resumed>(.*)$`)
	straceResult = regexp.MustCompile(`\)\s+= (-1|\?|[-0-9a-fx]+)(?: (\w+))?`)
)

// parseStrace reads strace -f output, joining calls that other threads
// interrupted (<unfinished ...> / <... resumed>).
func parseStrace(out string) syscalls {
	var cs syscalls
	pending := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		var name, text string
		if m := straceResume.FindStringSubmatch(line); m != nil {
			name, text = m[2], pending[m[1]]+m[3]
			delete(pending, m[1])
		} else if m := straceStart.FindStringSubmatch(line); m != nil {
			name, text = m[2], m[3]
			if strings.HasSuffix(text, "<unfinished ...>") {
				pending[m[1]] = text
				continue
			}
		} else {
			continue
		}
		r := straceResult.FindAllStringSubmatch(text, -1)
		if r == nil {
			continue
		}
		last := r[len(r)-1]
		if name == "syscall_0x1c3" {
			name = "cachestat"
		}
		cs = append(cs, call{name: name, text: text, failed: last[1] == "-1" || last[1] == "?"})
	}
	return cs
}

// ok counts the successful calls of name whose text contains arg.
func (cs syscalls) ok(name, arg string) int {
	n := 0
	for _, c := range cs {
		if c.name == name && !c.failed && strings.Contains(c.text, arg) {
			n++
		}
	}
	return n
}

func (cs syscalls) String() string {
	ok, bad := map[string]int{}, map[string]int{}
	var names []string
	for _, c := range cs {
		if ok[c.name]+bad[c.name] == 0 {
			names = append(names, c.name)
		}
		if c.failed {
			bad[c.name]++
		} else {
			ok[c.name]++
		}
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "  %-20s %6d/%d\n", n, ok[n], bad[n])
	}
	return b.String()
}

// allowedBy fails for each call made that the seccomp profile at path
// (the container image's) does not allow.
func (cs syscalls) allowedBy(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Syscalls []struct {
			Names  []string `json:"names"`
			Action string   `json:"action"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	allowed := map[string]bool{}
	for _, s := range p.Syscalls {
		for _, n := range s.Names {
			allowed[n] = s.Action == "SCMP_ACT_ALLOW"
		}
	}
	missing := map[string]bool{}
	for _, c := range cs {
		if !allowed[c.name] && !missing[c.name] {
			missing[c.name] = true
			t.Errorf("%s: made under the unit, not allowed by %s: %s", c.name, path, c.text)
		}
	}
}

// A syscallClass is what one kind of work flusherd does looks like to
// strace: the call's name and a part of its arguments.
type syscallClass struct{ what, name, arg string }

// require fails for each class no call of which succeeded.
func (cs syscalls) require(t *testing.T, classes []syscallClass) {
	t.Helper()
	for _, c := range classes {
		if n := cs.ok(c.name, c.arg); n == 0 {
			var failed []string
			for _, x := range cs {
				if x.name == c.name && x.failed && len(failed) < 3 {
					failed = append(failed, x.text)
				}
			}
			t.Errorf("%s: no successful %s(%s) under the unit; failed calls: %q", c.what, c.name, c.arg, failed)
		} else {
			t.Logf("%s: %d successful %s calls", c.what, n, c.name)
		}
	}
}
