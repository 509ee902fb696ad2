package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// TestShutdownReadOnly: with 200 dirty tracked files and 20 clean ones on
// an ext4 that an error turned read-only (errors=remount-ro, then
// trigger_fs_error), SIGTERM does not wait out shutdown_timeout: the files
// whose writeback fails with EROFS are given up at once and named with the
// reason, the clean ones are not waited on, and the last line says what was
// left and why instead of "every tracked file is clean".
func TestShutdownReadOnly(t *testing.T) {
	t.Parallel()
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4"})
	if err := unix.Mount(mnt.Device, mnt.Dir, "ext4", unix.MS_REMOUNT, "errors=remount-ro"); err != nil {
		t.Fatalf("remount %s errors=remount-ro: %v", mnt.Dir, err)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(mnt.Device), "trigger_fs_error")
	if _, err := os.Stat(trigger); err != nil {
		testfs.Missing(t, "ext4 error trigger %s: %v", trigger, err)
	}
	tree := filepath.Join(mnt.Dir, "w")
	mkdirs(t, tree)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
shutdown_timeout = "30s"
[[watch]]
path = %q
expire = "1h"
`, tree))
	var dirty []string
	for i := range 200 {
		p := filepath.Join(tree, fmt.Sprintf("d%03d", i))
		writeDirty(t, p, 4096)
		dirty = append(dirty, p)
	}
	for i := range 20 {
		p := filepath.Join(tree, fmt.Sprintf("c%02d", i))
		writeDirty(t, p, 4096)
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	stats := d.devStats(mnt.MajMin)
	if !poll(10*time.Second, func() bool { return tracked(readStats(t, stats)) >= 220 }) {
		t.Fatalf("the 220 files were not all tracked: %v", readStats(t, stats))
	}
	mustBeDirty(t, dirty[0])
	if err := os.WriteFile(trigger, []byte("1"), 0); err != nil {
		t.Fatalf("trigger_fs_error: %v", err)
	}
	from := len(d.log.String())
	took := d.term(t, 60*time.Second)
	log := d.log.String()[from:]
	t.Logf("exit %s after SIGTERM", took.Round(10*time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("shutdown took %s: it waited for files that cannot be written (shutdown_timeout is 30s)", took)
	}
	if !strings.Contains(log, "files given up, their filesystem cannot be written") || !strings.Contains(log, "read-only file system") {
		t.Errorf("the given-up files and their reason are not logged:\n%s", log)
	}
	if !strings.Contains(log, `"given_up": 200`) {
		t.Errorf("the last line does not count the 200 unwritable files:\n%s", log)
	}
	if strings.Contains(log, "every tracked file is clean") {
		t.Errorf("shutdown claims every tracked file is clean on a read-only filesystem:\n%s", log)
	}
}

// TestShutdownShutDownFS: with 50 dirty tracked files on an xfs or ext4
// that was shut down (XFS_IOC_GOINGDOWN, EXT4_IOC_SHUTDOWN: the same
// ioctl, as after a metadata I/O error; every open fails with EIO), SIGTERM
// does not wait out shutdown_timeout: the files are given up at once,
// named with EIO and the reason in one line, and none is also counted
// still dirty.
func TestShutdownShutDownFS(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "shuts down loop-mounted xfs and ext4")
	for _, typ := range []string{"xfs", "ext4"} {
		t.Run(typ, func(t *testing.T) {
			t.Parallel()
			mnt, tree := mountTree(t, typ)
			d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
shutdown_timeout = "30s"
[[watch]]
path = %q
expire = "1h"
`, tree))
			for i := range 50 {
				writeDirty(t, filepath.Join(tree, fmt.Sprintf("d%02d", i)), 4096)
			}
			stats := d.devStats(mnt.MajMin)
			if !poll(10*time.Second, func() bool { return tracked(readStats(t, stats)) >= 50 }) {
				t.Fatalf("the 50 files were not all tracked: %v", readStats(t, stats))
			}
			mustBeDirty(t, filepath.Join(tree, "d00"))
			shutDownFS(t, mnt.Dir)
			// The daemon's handles to the tree idle out (200 ms), so
			// that each attempt opens the filesystem anew.
			time.Sleep(time.Second)
			from := len(d.log.String())
			took := d.term(t, 60*time.Second)
			log := d.log.String()[from:]
			t.Logf("exit %s after SIGTERM", took.Round(10*time.Millisecond))
			if took > 15*time.Second {
				t.Errorf("shutdown took %s: it waited for files on a shut-down filesystem (shutdown_timeout is 30s)", took)
			}
			if !strings.Contains(log, "files given up, their filesystem refuses to open them") || !strings.Contains(log, `"given_up": 50`) {
				t.Errorf("the 50 files are not given up with EIO and the reason:\n%s", log)
			}
			if n := strings.Count(log, "files given up"); n != 1 || !strings.Contains(log, `"files": 50`) {
				t.Errorf("%d lines name the files given up, want one for the 50:\n%s", n, log)
			}
			if strings.Contains(log, "still dirty") || !strings.Contains(log, `"still_dirty": 0`) || strings.Contains(log, "every tracked file is clean") {
				t.Errorf("files on the shut-down filesystem also reported still dirty, or all clean:\n%s", log)
			}
		})
	}
}

// shutDownFS shuts down the xfs or ext4 mounted at dir without flushing
// its log (XFS_IOC_GOINGDOWN and EXT4_IOC_SHUTDOWN share the number, and
// their NOLOGFLUSH flag, 2); opens on it then fail with EIO.
func shutDownFS(t *testing.T, dir string) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	flags := uint32(2)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), 0x8004587d, uintptr(unsafe.Pointer(&flags)))
	unix.Close(fd)
	if errno != 0 {
		t.Fatalf("shut down %s: %v", dir, errno)
	}
}

// TestShutdownDuringInitialScan: SIGTERM while the initial scan of a large
// tree (30,000 directories) is still running stops the scan, and the last
// line says that files the scan had not reached may be dirty and
// untracked, not that every tracked file is clean.
func TestShutdownDuringInitialScan(t *testing.T) {
	testfs.SkipShort(t, "30,000 directories made and scanned")
	// As root, on a filesystem of its own: its unmount is its cleanup,
	// where the removal of 30,000 directories took seconds.
	tree := t.TempDir()
	if os.Geteuid() == 0 {
		tree = testfs.Mount(t, testfs.Options{Type: "ext4"}).Dir
	}
	for i := range 30 {
		dir := filepath.Join(tree, fmt.Sprintf("d%02d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range 1000 {
			if err := os.Mkdir(filepath.Join(dir, fmt.Sprintf("e%04d", j)), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	// READY=1 comes once the roots are watched; the scan goes on after.
	d := runDaemon(t, fmt.Sprintf("[watcher]\nbackend = \"inotify\"\n[[watch]]\npath = %q\n", tree),
		daemonOpts{readyLine: "every root is watched"})
	d.term(t, 60*time.Second)
	out := d.log.String()
	if !strings.Contains(out, "signal received during the initial scan") {
		t.Fatalf("the scan of 30,000 directories had ended before the signal; the case is not reached")
	}
	if strings.Contains(out, "every tracked file is clean; exiting") {
		t.Errorf("the last line says every tracked file is clean after a cut scan")
	}
	if !strings.Contains(out, "files in the trees may be dirty and untracked") || !strings.Contains(out, "the initial scan was stopped by the signal") {
		t.Errorf("no last line saying the cut scan may have left dirty files untracked")
	}
}

// TestSecondSignalEndsShutdown: a file whose opens fail (EAGAIN, on a
// FUSE filesystem) holds the writeback before exit until
// shutdown_timeout (30 s); a second SIGTERM, as an operator's second
// Ctrl-C, ends it at once, and the log says that the second signal, not
// the timeout, ended it and which files were left.
func TestSecondSignalEndsShutdown(t *testing.T) {
	t.Parallel()
	ffs := faultfs.MountT(t)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
shutdown_timeout = "30s"
min_pause = "50ms"
max_pause = "200ms"
[[watch]]
path = %q
expire = "100ms"
`, ffs.Dir))
	ffs.Set(faultfs.Faults{OpenErr: syscall.EAGAIN})
	blocked := filepath.Join(ffs.Dir, "blocked")
	writeDirty(t, blocked, 4<<10)
	if !poll(10*time.Second, func() bool { return strings.Contains(dirtyList(t, d), "b_more_io_wait EAGAIN") }) {
		t.Fatalf("the blocked file is not retried: %s", dirtyList(t, d))
	}
	d.signal(syscall.SIGTERM)
	if !poll(10*time.Second, func() bool { return strings.Contains(d.log.String(), "writing back every tracked file before exit") }) {
		t.Fatalf("no shutdown writeback began; log:\n%s", d.log.String())
	}
	time.Sleep(300 * time.Millisecond)
	took := d.term(t, 15*time.Second) // shutdown_timeout is 30s
	t.Logf("exited %v after the second SIGTERM", took.Round(time.Millisecond))
	log := d.log.String()
	if !strings.Contains(log, "second signal: ending the writeback before exit now") {
		t.Errorf("the log does not say that the second signal was taken")
	}
	left := ""
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "when a second signal ended the shutdown") {
			left = l
		}
	}
	if !strings.Contains(left, "blocked") {
		t.Errorf("no line names the file left when the second signal ended the shutdown (%q)", left)
	}
	last := ""
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "exiting with files not written back") {
			last = l
		}
	}
	if !strings.Contains(last, `"still_dirty": 1`) || !strings.Contains(last, `"ended_by": "a second signal ended the shutdown"`) {
		t.Errorf("the last line does not count the file left and say that a second signal ended the shutdown: %q", last)
	}
	if strings.Contains(log, "shutdown_timeout (30s) ended") {
		t.Errorf("the log blames shutdown_timeout")
	}
}

// TestTermDuringSlowStart: a SIGTERM while start-up is slow (three trees
// whose roots are on a FUSE filesystem that takes 3 s to open a
// directory, each root opened twice: 18 s), before any file is tracked,
// ends the daemon once the open under way returns, with status 0 and a
// line saying why, instead of after the whole start-up. (No process can
// exit sooner: a thread waiting for a FUSE request the server has taken
// waits it out, SIGKILL or not; fuse's request_wait_answer.)
func TestTermDuringSlowStart(t *testing.T) {
	testfs.SkipShort(t, "a start-up slowed to 18 s on FUSE")
	const roots, delay = 3, 3 * time.Second
	ffs := faultfs.MountT(t)
	var conf strings.Builder
	for i := range roots {
		r := filepath.Join(ffs.Dir, fmt.Sprint("t", i))
		if err := os.Mkdir(r, 0o755); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&conf, "[[watch]]\npath = %q\n", r)
	}
	ffs.Set(faultfs.Faults{OpendirDelay: delay})
	t.Cleanup(func() { ffs.Set(faultfs.Faults{}) })
	opens := ffs.Count("opendir")
	d := runDaemon(t, conf.String(), daemonOpts{readyLine: "watching\t", mayExit: true})
	testwait.For(t, "the daemon in its first OPENDIR", 5*time.Second, func() bool { return ffs.Count("opendir") > opens })
	took := d.term(t, delay+2*time.Second)
	t.Logf("exit %d, %s after SIGTERM, %d OPENDIR", d.exitCode(), took.Round(time.Millisecond), ffs.Count("opendir")-opens)
	if c := d.exitCode(); c != 0 {
		t.Errorf("exit status %d, want 0", c)
	}
	if !strings.Contains(d.log.String(), "signal received during start-up, before any file was tracked") {
		t.Errorf("the log does not say why it exited:\n%s", d.log.String())
	}
}
