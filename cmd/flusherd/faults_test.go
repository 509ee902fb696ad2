package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/control"
	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

var (
	faultsLong = flag.Bool("faults.long", false, "TestFaultSuite: 200 files a cell and faults that last 10 s (default: 20 files, 1.5 s)")
	faultsAll  = flag.Bool("faults.all", false, "TestFaultSuite: each fault kind at every step (default: at the step writeback, or its only step)")
)

// The "nothing lost" fault suite: each fault kind × each step of the
// daemon's work at which it strikes, on real filesystems.
//
// Steps:
//   - tracking: the files are written and tracked, not yet expired;
//   - writeback: the daemon has begun writing the files back;
//   - rescan: the files lie in a directory that a reload adds as a tree
//     while the fault lasts, so the tree's scan meets it;
//   - shutdown: SIGTERM comes while the fault lasts; after recovery the
//     daemon is started again.
//
// Without -faults.all, each kind strikes at one step: writeback (the
// daemon in the middle of the files' writeback), or its only step. The
// other steps' handling is the same outcome met at another moment (and
// kill-9 at any step ends in the restarted daemon's initial scan), which
// the engine's tests check in virtual time and a few end-to-end tests on
// real filesystems:
//   - tracking (a file's first attempt meets the fault):
//     bdi.TestRealOutcomes (EMFILE, EROFS on a real filesystem),
//     TestBlockedBackoff (the retries), TestAttemptTimeout (a call that
//     does not return: frozen), TestProbingDeadDevice (fuse-killed),
//     TestDataLost and TestLostByFilesystemError (eio-consumed, enospc);
//     end to end, TestDescriptorExhaustion and
//     TestLostDataConsumedElsewhere;
//   - rescan: watch.TestScanRetriedAfterShortage (a scan out of
//     descriptors), and for the kinds that lose data the reload comes
//     before the fault, which is then the tracking step's;
//   - shutdown: bdi.TestCompleteRouting (shutting down, EROFS and
//     ENOTCONN are given up, EAGAIN and EIO retried), TestRegistryShutdown
//     and TestDrainPolls (the drain retries, reports what was given up,
//     lost, and left at the timeout), service.TestStop and
//     TestLogShutdownWording (the last line); end to end,
//     TestShutdownReadOnly, TestLostThenReadOnly and
//     TestSecondSignalEndsShutdown.
//
// Each cell asserts, for the files dirty when the fault struck (cachestat)
// and those written while it lasted: each is clean within the bound
// (expire + interval + max_pause + 1.5 s) after recovery, or, where the
// data cannot survive the fault, is named with its reason (flusherd dirty
// lists it with its error, or the shutdown log names it); a shutdown never
// claims that every file is clean while one of them is dirty; the stats
// agree with the list; and the daemon's CPU time stays under a quarter of
// the fault's duration.

// faultEnv is one cell's world.
type faultEnv struct {
	t     *testing.T
	conf  func(extra ...string) string // the daemon's configuration, with extra trees
	tree  string                       // the tree watched from the start
	side  string                       // the directory the rescan step adds
	d     *flusherdProc
	mnt   *testfs.FS // ext4 kinds
	ffs   *faultfs.FS
	files []string            // files written during the fault (during), to check too
	held  map[string]*os.File // FUSE kinds: the writers' open files
	wg    sync.WaitGroup
	state map[string]any
}

// faultKind is a kind of fault.
type faultKind struct {
	name string
	fuse bool     // on a faultfs (FUSE with writeback cache), not ext4
	mode string   // the tree's mode ("" is writeback)
	skip []string // steps that do not apply, with reasons in the table
	// lost: the fault destroys the dirty data (the kernel drops or
	// cannot write the pages); the files must be named, with reason.
	lost   bool
	reason string // what the log says of a lost file ("read-only file system")
	// ready prepares the filesystem before the daemon starts (optional).
	ready func(e *faultEnv)
	// inject starts the fault; during (optional) writes files while it
	// lasts; recover ends it (nil: it does not end).
	inject, during, recover func(e *faultEnv)
}

// fuseScanFlushes: a scan's cachestat opens and closes each file, and the
// close of a FUSE file writes its dirty pages back (its flush): a scan
// leaves nothing dirty for a fault that strikes after it, so the rescan
// step has nothing to check on FUSE.
var fuseScanFlushes = []string{"rescan"}

func TestFaultSuite(t *testing.T) {
	testfs.SkipShort(t, "the daemon through each fault, each stage, on loop devices and FUSE")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts, FUSE, fsfreeze")
	}
	nFiles, faultFor := 20, 1500*time.Millisecond
	if *faultsLong {
		nFiles, faultFor = 200, 10*time.Second
	}
	kinds := []faultKind{
		{
			name: "fd-exhaustion",
			inject: func(e *faultEnv) {
				pid := e.d.pid()
				ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
				if err != nil {
					e.t.Fatal(err)
				}
				var old unix.Rlimit
				if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
					e.t.Fatal(err)
				}
				e.state["rlimit"] = old
				// One below what it holds: not one descriptor can be
				// opened, whatever it had closed meanwhile.
				lim := unix.Rlimit{Cur: uint64(len(ents) - 1), Max: old.Max}
				if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
					e.t.Fatal(err)
				}
			},
			during: func(e *faultEnv) {
				for i := range 5 {
					p := filepath.Join(e.tree, fmt.Sprintf("during%02d", i))
					writeDirty(e.t, p, 64<<10)
					e.files = append(e.files, p)
				}
			},
			recover: func(e *faultEnv) {
				old := e.state["rlimit"].(unix.Rlimit)
				if err := unix.Prlimit(e.d.pid(), unix.RLIMIT_NOFILE, &old, nil); err != nil && !e.d.exited() {
					e.t.Fatal(err)
				}
			},
		},
		{
			name: "frozen",
			inject: func(e *faultEnv) {
				// FIFREEZE syncs the filesystem first: what was dirty
				// is clean; the writes made while it lasts block and
				// are the files to check.
				freeze(e.t, e.mnt.Dir, true)
				e.t.Cleanup(func() { freeze(e.t, e.mnt.Dir, false) })
			},
			during: func(e *faultEnv) {
				for i := range 3 {
					p := filepath.Join(e.tree, fmt.Sprintf("during%02d", i))
					e.files = append(e.files, p)
					e.wg.Add(1)
					go func() {
						defer e.wg.Done()
						os.WriteFile(p, make([]byte, 64<<10), 0o644) // blocks until the thaw
					}()
				}
			},
			recover: func(e *faultEnv) {
				freeze(e.t, e.mnt.Dir, false)
				e.wg.Wait()
			},
		},
		{
			name: "eio-consumed", fuse: true, mode: "integrity", lost: true, reason: "EIO", skip: fuseScanFlushes,
			inject: func(e *faultEnv) {
				e.ffs.Set(faultfs.Faults{WriteErr: syscall.EIO})
				// Another process's fsync meets the error first and
				// consumes it; the kernel drops the pages.
				var all []string
				for _, dir := range []string{e.tree, e.side} {
					m, _ := filepath.Glob(filepath.Join(dir, "*"))
					all = append(all, m...)
				}
				exec.Command("sync", all...).Run()
			},
			recover: func(e *faultEnv) { e.ffs.Set(faultfs.Faults{}) },
		},
		{
			// In an integrity tree, where fdatasync reports the failed
			// writeback; in a writeback tree the error is left to the
			// application (TestWritebackModeLeavesErrorsToTheApplication).
			name: "enospc", fuse: true, mode: "integrity", lost: true, reason: "ENOSPC", skip: fuseScanFlushes,
			inject:  func(e *faultEnv) { e.ffs.Set(faultfs.Faults{WriteErr: syscall.ENOSPC}) },
			recover: func(e *faultEnv) { e.ffs.Set(faultfs.Faults{}) },
		},
		{
			name: "fuse-killed", fuse: true, lost: true, reason: "ENOTCONN", skip: fuseScanFlushes,
			inject: func(e *faultEnv) {
				// The FUSE server's death, as the kernel sees it: the
				// connection aborted; every request fails ENOTCONN.
				abortFuse(e.t, e.ffs.Dir)
			},
		},
		{
			name: "remount-ro", lost: true, reason: "EROFS",
			ready: func(e *faultEnv) {
				if err := unix.Mount(e.mnt.Device, e.mnt.Dir, "ext4", unix.MS_REMOUNT, "errors=remount-ro,commit=60"); err != nil {
					e.t.Fatalf("remount errors=remount-ro: %v", err)
				}
			},
			inject: func(e *faultEnv) {
				trigger := filepath.Join("/sys/fs/ext4", filepath.Base(e.mnt.Device), "trigger_fs_error")
				if err := os.WriteFile(trigger, []byte("1"), 0); err != nil {
					testfs.Missing(e.t, "ext4 error trigger %s: %v", trigger, err)
				}
			},
			during: func(e *faultEnv) {
				// Memory pressure after the error (drop_caches, as
				// another program may run): the journal aborted before
				// it committed the tree's directory (commit=60), so
				// once its dentry and block are dropped, while the
				// daemon's idle mount descriptor is closed, its path
				// leads nowhere. The filesystem is still mounted: its
				// files are still opened by handle, and fail EROFS.
				gone := poll(3*time.Second, func() bool {
					if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
						testfs.Missing(e.t, "drop_caches: %v", err)
					}
					_, err := os.Stat(e.tree)
					return errors.Is(err, fs.ErrNotExist)
				})
				if !gone {
					e.t.Fatalf("%s is still found after the error and drop_caches", e.tree)
				}
				var out bytes.Buffer
				code := Main([]string{"sync", "--stats-dir", e.d.statsDir, "--timeout", "10s"}, &out, &out)
				if code != 1 || !strings.Contains(out.String(), "read-only file system") || strings.Contains(out.String(), "no such device") {
					e.t.Errorf("flusherd sync with the tree's directory gone from view: exit %d, want 1 naming EROFS for each file:\n%s", code, out.String())
				}
			},
		},
		{
			name: "kill-9",
			inject: func(e *faultEnv) {
				e.d.kill()
			},
			recover: func(e *faultEnv) { e.d = startDaemon(e.t, e.conf(e.side)) },
		},
		{
			name: "inode-reuse", skip: []string{"writeback", "rescan", "shutdown"},
			inject: func(e *faultEnv) {
				// ext4 hands a freed inode number to the next file at
				// once: new files under the numbers of deleted ones.
				for i := range 5 {
					os.Remove(filepath.Join(e.tree, fmt.Sprintf("f%03d", i)))
					p := filepath.Join(e.tree, fmt.Sprintf("reused%02d", i))
					writeDirty(e.t, p, 64<<10)
					e.files = append(e.files, p)
				}
			},
		},
		{
			name: "symlink-swap", skip: []string{"tracking", "writeback", "shutdown"},
			inject: func(e *faultEnv) {
				// A directory of the scanned tree and a symlink to /etc
				// swapped over and over while the tree is scanned.
				x, y := filepath.Join(e.side, "x"), filepath.Join(e.side, "y")
				mkdirs(e.t, x)
				if err := os.Symlink("/etc", y); err != nil {
					e.t.Fatal(err)
				}
				stop := make(chan struct{})
				e.state["stop"] = stop
				e.wg.Add(1)
				go func() {
					defer e.wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						unix.Renameat2(unix.AT_FDCWD, x, unix.AT_FDCWD, y, unix.RENAME_EXCHANGE)
					}
				}()
			},
			recover: func(e *faultEnv) {
				close(e.state["stop"].(chan struct{}))
				e.wg.Wait()
				if out := dirtyList(e.t, e.d); strings.Contains(out, `"/etc/`) {
					e.t.Errorf("files outside the trees are tracked:\n%s", out)
				}
			},
		},
	}
	steps := []string{"tracking", "writeback", "rescan", "shutdown"}
	for _, k := range kinds {
		var run []string
		for _, step := range steps {
			if !slices.Contains(k.skip, step) {
				run = append(run, step)
			}
		}
		if !*faultsAll && len(run) > 1 {
			run = []string{"writeback"}
		}
		for _, step := range run {
			t.Run(k.name+"/"+step, func(t *testing.T) {
				runFaultCell(t, k, step, nFiles, faultFor)
			})
		}
	}
}

// runFaultCell runs kind k at step.
func runFaultCell(t *testing.T, k faultKind, step string, nFiles int, faultFor time.Duration) {
	e := &faultEnv{t: t, state: map[string]any{}, held: map[string]*os.File{}}
	var root string
	if k.fuse {
		e.ffs = faultfs.MountT(t)
		root = e.ffs.Dir
	} else {
		e.mnt = testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
		root = e.mnt.Dir
	}
	e.tree, e.side = filepath.Join(root, "w"), filepath.Join(root, "side")
	mkdirs(t, e.tree, e.side)
	mode := ""
	if k.mode != "" {
		mode = fmt.Sprintf("mode = %q\n", k.mode)
	}
	tree0 := e.tree
	e.conf = func(extra ...string) string {
		c := `
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "1s"
min_pause = "10ms"
max_pause = "1s"
attempt_timeout = "1s"
shutdown_timeout = "3s"
`
		for _, p := range append([]string{tree0}, extra...) {
			c += fmt.Sprintf("[[watch]]\npath = %q\n%s", p, mode)
		}
		return c
	}
	if k.ready != nil {
		k.ready(e)
	}
	// The plain build also under -race: each cell stops the daemon at a
	// chosen moment and counts what is dirty then, a race-instrumented
	// daemon is several times slower, and some cells then had nothing
	// dirty left to check (the race detector runs on the daemons of the
	// other end-to-end tests).
	e.d = runDaemon(t, e.conf(), daemonOpts{bin: plainBinary})
	dir := e.tree
	if step == "rescan" {
		dir = e.side
	}
	var files []string
	write := func(name string) {
		p := filepath.Join(dir, name)
		if k.fuse {
			// FUSE writes a file's dirty pages back when it is closed
			// (its flush): the writer keeps it open, as a log or a
			// database would.
			e.held[p] = writeHeld(t, p, 64<<10)
		} else {
			writeDirty(t, p, 64<<10)
		}
		files = append(files, p)
	}
	for i := range nFiles {
		write(fmt.Sprintf("f%03d", i))
	}
	switch step {
	case "tracking":
		// Tracked (the events are handled at once), not yet expired.
		settleEvents()
	case "writeback":
		// The daemon is writing the set back: the first half has
		// expired and the first of it is clean; the second half,
		// written then, waits for the next passes.
		if !poll(5*time.Second, func() bool { return isClean(e, files[0]) }) {
			t.Fatalf("the daemon did not begin writing back; log:\n%s", e.d.log.String())
		}
		for i := range nFiles / 2 {
			write(fmt.Sprintf("g%03d", i))
		}
		settleEvents()
	}
	if step == "rescan" && k.name == "symlink-swap" {
		e.tree = e.side // the swap happens in the directory the reload adds
	}
	if step == "rescan" && k.lost {
		// Data lost before its tree was watched is not the daemon's
		// to know: the reload comes first, its scan meets the fault.
		e.d.reload(t, e.conf(e.side))
		if !poll(5*time.Second, func() bool { return strings.Contains(e.d.log.String(), "configuration reloaded") }) {
			t.Fatalf("the reload did not complete; log:\n%s", e.d.log.String())
		}
	}
	// The files dirty when the fault strikes, with the daemon stopped
	// (SIGSTOP) from before they are looked at until the fault is in
	// place: a file it wrote between the two would be counted as hit by
	// the fault. Writeback already submitted ends meanwhile.
	var check []string
	for try := 1; ; try++ {
		e.d.signal(syscall.SIGSTOP)
		if !poll(2*time.Second, func() bool { return procState(e.d) == "T" }) {
			t.Fatalf("the daemon did not stop on SIGSTOP (state %q)", procState(e.d))
		}
		time.Sleep(50 * time.Millisecond)
		check = check[:0]
		for _, p := range files {
			if f := e.held[p]; f != nil {
				// Looked at through the writer's own descriptor: an open
				// and close of a FUSE file would write it back.
				if n, err := fdDirty(f); err != nil || n > 0 {
					check = append(check, p)
				}
			} else if d, wb, err := cachestat(p, 0, 0); err != nil || d+wb > 0 {
				check = append(check, p)
			}
		}
		if len(check) > 0 || step != "writeback" || try == 3 {
			break
		}
		// The kernel wrote the second half back first (a FUSE
		// filesystem's dirty limit is small: its own background
		// writeback starts early): once more, with new files.
		t.Logf("nothing dirty when the daemon stopped (try %d); writing another half", try)
		e.d.signal(syscall.SIGCONT)
		for i := range nFiles / 2 {
			write(fmt.Sprintf("h%d%03d", try, i))
		}
		settleEvents()
	}
	t.Logf("%d of %d files dirty when the fault strikes", len(check), len(files))
	if len(check) == 0 && k.during == nil && k.name != "inode-reuse" {
		t.Fatalf("no file was dirty when the fault struck: the cell would check nothing")
	}
	cpu0 := cpuTicks(e.d)
	k.inject(e)
	if !e.d.exited() {
		e.d.signal(syscall.SIGCONT)
	}
	if k.during != nil {
		k.during(e)
	}
	if step == "rescan" && !k.lost && !e.d.exited() {
		e.d.reload(t, e.conf(e.side))
	}
	var exitLog string
	exitDirty := map[string]bool{}
	if step == "shutdown" && !e.d.exited() {
		from := len(e.d.log.String())
		took := e.d.term(t, 20*time.Second) // shutdown_timeout is 3s
		t.Logf("exit %s after SIGTERM", took.Round(10*time.Millisecond))
		exitLog = e.d.log.String()[from:]
		for _, p := range append(check, e.files...) {
			if d, wb, err := cachestat(p, 0, 0); err == nil && d+wb > 0 {
				exitDirty[p] = true
			}
		}
	}
	time.Sleep(faultFor)
	// The swap loop is an event storm (tens of thousands of renames a
	// second), which the watcher has to read: its CPU is the attack's.
	if !e.d.exited() && k.name != "symlink-swap" {
		if cpu := cpuTicks(e.d) - cpu0; time.Duration(cpu)*10*time.Millisecond > faultFor/4 {
			t.Errorf("the daemon used %d ms of CPU while the fault lasted %s", cpu*10, faultFor)
		}
	}
	check = append(check, e.files...)
	if k.name == "inode-reuse" {
		// The files the fault itself deleted have nothing to write.
		var left []string
		for _, p := range check {
			if _, err := os.Lstat(p); err == nil {
				left = append(left, p)
			}
		}
		check = left
	}
	if step == "shutdown" {
		if len(exitDirty) > 0 && strings.Contains(exitLog, "every tracked file is clean") {
			t.Errorf("shutdown claims every tracked file is clean, but %d files were dirty at exit:\n%s", len(exitDirty), exitLog)
		}
		if k.lost {
			for p := range exitDirty {
				if !strings.Contains(exitLog, `"`+p+`"`) {
					t.Errorf("%s was dirty at exit, but the shutdown log does not name it:\n%s", p, exitLog)
					break
				}
			}
		}
	}
	if k.recover != nil {
		k.recover(e)
	}
	if step == "shutdown" && k.recover != nil && k.name != "kill-9" {
		// Started again, as systemd would, once the fault is over.
		e.d = startDaemon(t, e.conf(e.side))
	}
	if !k.lost {
		waitAllClean(t, time.Second+200*time.Millisecond+time.Second+1500*time.Millisecond, check...)
		// The stats agree: nothing is left on the lists.
		var n int64
		if !poll(3*time.Second, func() bool { n = statsTracked(t, e.d); return n == 0 }) {
			t.Errorf("every file is clean, but the stats still count %d tracked or failed files", n)
		}
		return
	}
	if step == "shutdown" {
		return // named at exit, above; the restarted daemon finds them again or they were dropped
	}
	// Lost: each is named with its reason by flusherd dirty, and the
	// stats count them.
	var out string
	named := func() bool {
		out = dirtyList(t, e.d)
		lines := strings.Split(out, "\n")
		for _, p := range check {
			i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, strconv.Quote(p)+" ") })
			if i < 0 || !strings.Contains(lines[i], k.reason) {
				return false
			}
		}
		return true
	}
	if !poll(5*time.Second, named) {
		t.Fatalf("not every file hit by the fault is named with %s by flusherd dirty:\n%s\nlog:\n%s", k.reason, out, e.d.log.String())
	}
	// The stats count what flusherd dirty lists (the stats files are
	// rewritten at most once a second).
	var n int64
	if !poll(3*time.Second, func() bool {
		n, out = statsTracked(t, e.d), dirtyList(t, e.d)
		return n == int64(strings.Count(out, "\n"))
	}) {
		t.Errorf("the stats count %d tracked or failed files, flusherd dirty lists:\n%s", n, out)
	}
	// And the log says so: its lines are rate-limited (a few files of a
	// kind), and may name other files of the same filesystem first (an
	// error seen on the filesystem's cursor is not tied to one file), so
	// it must say it of at least one file; flusherd dirty names them all.
	log := e.d.log.String()
	if !strings.Contains(log, "data lost") && !strings.Contains(log, "writeback failed") {
		t.Errorf("the log says nothing of the files hit by the fault:\n%s", log)
	}
}

// procState is the daemon's state letter in /proc/PID/stat ("T" when
// stopped).
func procState(d *flusherdProc) string {
	if f := procStat(d); len(f) > 0 {
		return f[0]
	}
	return ""
}

// statsTracked sums the files on every device's lists, failed included,
// from the stats files.
func statsTracked(t *testing.T, d *flusherdProc) int64 {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(d.statsDir, "bdi", "*", "stats"))
	var n int64
	for _, p := range paths {
		s := readStats(t, p)
		n += tracked(s) + s["failed_files"]
	}
	return n
}

// isClean reports whether path holds no dirty or writeback pages, looked
// at through the writer's descriptor when the cell holds one.
func isClean(e *faultEnv, path string) bool {
	if f := e.held[path]; f != nil {
		n, err := fdDirty(f)
		return err == nil && n == 0
	}
	d, wb, err := cachestat(path, 0, 0)
	return err == nil && d == 0 && wb == 0
}

// writeHeld writes n bytes to a new file at path and keeps it open until
// the test ends.
func writeHeld(t *testing.T, path string, n int) *os.File {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	return f
}

// fdDirty is cachestat on an open file: dirty plus writeback pages.
func fdDirty(f *os.File) (uint64, error) {
	d, wb, err := cachestatFd(int(f.Fd()), 0, 0)
	return d + wb, err
}

// dirtyList is flusherd dirty --json's list: one line a file, its path
// (quoted), list and last error.
// settleEvents gives the daemon time to handle the write events of files
// just written (its watcher reads them within milliseconds) before it is
// stopped and a fault strikes: a file whose event it has not handled yet
// is not known to it, and when another process consumes the error of its
// lost data before the event is read, the daemon cannot tell the loss from
// a clean file (a limitation, not what the fault cells check). (It does
// not ask flusherd dirty: its cachestat opens the files, and an open and
// close of a FUSE file writes it back.) 300 ms: a loaded machine's
// scheduling delay, well below the 1 s expiry that the step "tracking"
// must stay within.
func settleEvents() { time.Sleep(300 * time.Millisecond) }

// waitListedFailed waits up to 45 s (bdi's verifyBound, and slack) for
// `flusherd dirty` to list path as failed, and returns its line then (or
// the last seen; "" when not listed).
func waitListedFailed(t *testing.T, d *flusherdProc, path string) string {
	t.Helper()
	listed := ""
	testwait.For(t, "the file reported as failed", 45*time.Second, func() bool {
		var out, errb bytes.Buffer
		Main([]string{"dirty", "--top", "0", "--stats-dir", d.statsDir}, &out, &errb)
		listed = ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.Contains(l, strconv.Quote(path)) {
				listed = l
			}
		}
		return strings.Contains(listed, " failed ")
	})
	return listed
}

func dirtyList(t *testing.T, d *flusherdProc) string {
	t.Helper()
	var b strings.Builder
	for _, f := range dirtyFiles(t, d) {
		fmt.Fprintf(&b, "%s %s %s\n", strconv.Quote(string(f.Path)), f.List, f.LastError)
	}
	return b.String()
}

// dirtyFiles is `flusherd dirty --json --top 0`: every tracked file.
func dirtyFiles(t *testing.T, d *flusherdProc) []control.DirtyFile {
	t.Helper()
	var o, errb bytes.Buffer
	if code := Main([]string{"dirty", "--json", "--top", "0", "--stats-dir", d.statsDir}, &o, &errb); code != 0 {
		t.Fatalf("flusherd dirty: %s", errb.String())
	}
	var files []control.DirtyFile
	if err := json.Unmarshal(o.Bytes(), &files); err != nil {
		t.Fatal(err)
	}
	return files
}

// procStat returns the fields of /proc/PID/stat of the daemon after its
// command name (field 3, the state, first), or nil.
func procStat(d *flusherdProc) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.pid()))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return nil
	}
	return strings.Fields(s[i+2:])
}

// cpuTicks is the daemon's user+system CPU time, in clock ticks (10 ms).
func cpuTicks(d *flusherdProc) int64 {
	f := procStat(d)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// freeze freezes (FIFREEZE) or thaws (FITHAW) the filesystem at dir;
// thawing one that is not frozen is not an error.
func freeze(t *testing.T, dir string, on bool) {
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const fifreeze, fithaw = 0xC0045877, 0xC0045878 // _IOWR('X', 119 and 120, int), linux/fs.h
	req := uint(fifreeze)
	if !on {
		req = fithaw
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), 0); e != 0 && (on || e != unix.EINVAL) {
		t.Fatalf("freeze %s %v: %v", dir, on, e)
	}
}

// abortFuse aborts the FUSE connection of the filesystem at dir
// (/sys/fs/fuse/connections/<minor>/abort), mounting fusectl for it if
// needed (and unmounting it at cleanup).
func abortFuse(t *testing.T, dir string) {
	const conns = "/sys/fs/fuse/connections"
	var st unix.Statfs_t
	if err := unix.Statfs(conns, &st); err != nil {
		testfs.Missing(t, "%s: %v", conns, err)
	}
	if st.Type != 0x65735543 { // FUSECTL_SUPER_MAGIC
		if err := unix.Mount("fusectl", conns, "fusectl", 0, ""); err != nil {
			testfs.Missing(t, "mount fusectl on %s: %v", conns, err)
		}
		t.Cleanup(func() { unix.Unmount(conns, 0) })
	}
	p := filepath.Join(conns, strconv.Itoa(int(minorOf(t, dir))), "abort")
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		t.Fatalf("abort the FUSE connection: %v", err)
	}
}

// TestWritebackModeLeavesErrorsToTheApplication: in a writeback-mode tree,
// a file whose writeback fails (a FUSE server answering its WRITE with
// ENOSPC or EIO: the kernel records the error and drops the pages; here
// the daemon's open writes the file, as a FUSE open without keep_cache
// does, and its close returns the error) is reported as failed: listed
// by flusherd dirty, counted in writeback_errors and failed_files, none of
// its bytes in BdiWritten, and the shutdown does not say every file is
// clean. The error stays the application's all the same: a later open and
// fsync of the file reports it. (The daemon reads neither the file's error
// state, which would mark it seen for a descriptor opened after, nor
// anything an application's fsync reads: its close's flush and the
// filesystem's error cursor, syncfs.)
func TestWritebackModeLeavesErrorsToTheApplication(t *testing.T) {
	t.Parallel()
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EIO} {
		t.Run(unix.ErrnoName(errno), func(t *testing.T) {
			t.Parallel()
			ffs := faultfs.MountT(t)
			tree := filepath.Join(ffs.Dir, "tree")
			mkdirs(t, tree)
			d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
[[watch]]
path = %q
expire = "200ms"
`, tree))
			ffs.Set(faultfs.Faults{WriteErr: errno})
			p := filepath.Join(tree, "f")
			// Kept open: a FUSE close flushes the file itself (FLUSH), and
			// the daemon's writeback is what is under test.
			w, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if _, err := w.Write(make([]byte, 8<<10)); err != nil {
				t.Fatal(err)
			}
			// Polled on the writer's descriptor: a close of another
			// (cachestat by path) would flush the file itself.
			if !poll(5*time.Second, func() bool { n, err := fdDirty(w); return err == nil && n == 0 }) {
				t.Fatalf("%s not written back", p)
			}
			// Reported at once when the daemon's close fails, else (the
			// kernel wrote the file first: FUSE's strict dirty limit)
			// when the filesystem's error cursor is read, 30 s (bdi's
			// verifyBound) after the attempt at the latest.
			listed := waitListedFailed(t, d, p)
			if !strings.Contains(listed, " failed ") || !strings.Contains(listed, unix.ErrnoName(errno)) {
				t.Errorf("flusherd dirty: %q, want %s listed as failed with %s", listed, p, unix.ErrnoName(errno))
			}
			paths, _ := filepath.Glob(filepath.Join(d.statsDir, "bdi", "*", "stats"))
			if len(paths) != 1 {
				t.Fatalf("stats files %v, want one", paths)
			}
			st := statsWhen(t, paths[0], 3*time.Second, func(s map[string]int64) bool { return s["failed_files"] == 1 })
			if st["failed_files"] != 1 || st["writeback_errors"] < 1 || st["BdiWritten"] != 0 {
				t.Errorf("failed_files %d, writeback_errors %d, BdiWritten %d kB; want 1, at least 1, 0",
					st["failed_files"], st["writeback_errors"], st["BdiWritten"])
			}
			if log := d.log.String(); !strings.Contains(log, "data lost") && !strings.Contains(log, "writeback failed") && !strings.Contains(log, "writeback may have failed") {
				t.Errorf("no log line of the failed writeback:\n%s", log)
			}
			if fi, err := os.Stat(filepath.Join(ffs.Backing, "tree", "f")); err != nil || fi.Size() != 0 {
				t.Errorf("the backing file: %v, %v; want 0 bytes (the fault held)", fi, err)
			}
			ffs.Set(faultfs.Faults{})
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Sync(); !errors.Is(err, errno) {
				t.Errorf("the application's fsync after the daemon's writeback: %v, want %v (the failed writeback's error, unseen until then)", err, errno)
			}
			d.stop(t)
			if log := d.log.String(); strings.Contains(log, "every tracked file is clean") {
				t.Errorf("the shutdown says every tracked file is clean, with %s failed:\n%s", p, log)
			}
		})
	}
}

// TestWritebackModeThinDeviceFull: the second way a writeback fails after
// it started, on a block filesystem: ext4 on a loop device whose sparse
// image lies on a tmpfs that is full (thin provisioning run out), so the
// writeback flusherd starts with sync_file_range (which returns 0) fails
// in the loop device with ENOSPC, the kernel drops the pages and records
// EIO on the file and its filesystem. The daemon must not count the write
// in BdiWritten nor forget the file as clean: the read of the
// filesystem's error cursor (syncfs) reports it failed, in flusherd dirty,
// failed_files, writeback_errors and the log, and the shutdown does not
// say clean; the application's fsync still gets the error. In the case
// dir-removed, the directory of the last file written (where the cursor
// is opened) is removed before the read: it is read at a mount point of
// the filesystem, not skipped (which counted every write as written).
func TestWritebackModeThinDeviceFull(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "mounts a tmpfs and an ext4 on a loop device")
	for _, c := range []string{"file", "dir-removed"} {
		t.Run(c, func(t *testing.T) {
			t.Parallel()
			testThinDeviceFull(t, c == "dir-removed")
		})
	}
}

func testThinDeviceFull(t *testing.T, dirRemoved bool) {
	if dirRemoved {
		// Something dirty elsewhere, so that the cursor is read 30 s
		// after the write, not as soon as the device is idle: after the
		// directory is removed.
		other := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
		writeDirty(t, filepath.Join(other.Dir, "dirty"), 1<<20)
	}
	thin := t.TempDir()
	if err := unix.Mount("tmpfs", thin, "tmpfs", 0, "size=24m"); err != nil {
		testfs.Missing(t, "mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(thin, unix.MNT_DETACH) })
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 128, ImageDir: thin})
	tree := filepath.Join(mnt.Dir, "w")
	mkdirs(t, tree)
	// This filesystem's own data on its image (syncfs, not sync(2): a
	// machine-wide sync would write the files of the tests running beside
	// this one).
	if fd, err := unix.Open(mnt.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		unix.Syncfs(fd)
		unix.Close(fd)
	}
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
[[watch]]
path = %q
expire = "200ms"
`, tree))
	// The tmpfs filled: the image's holes can no longer be allocated.
	filler, err := os.Create(filepath.Join(thin, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := filler.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	filler.Close()
	p := filepath.Join(tree, "f")
	w, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(make([]byte, 256<<10)); err != nil {
		t.Fatal(err)
	}
	if dirRemoved {
		waitAllClean(t, 5*time.Second, p)
		sub := filepath.Join(tree, "sub")
		mkdirs(t, sub)
		q := filepath.Join(sub, "q")
		writeDirty(t, q, 4<<10)
		waitAllClean(t, 5*time.Second, q)
		if err := os.RemoveAll(sub); err != nil {
			t.Fatal(err)
		}
	}
	// Reported when the filesystem's error cursor is read: at once if
	// nothing else in the system is dirty, else 30 s (bdi's verifyBound)
	// after the write.
	listed := waitListedFailed(t, d, p)
	if !strings.Contains(listed, " failed ") {
		t.Errorf("flusherd dirty: %q, want %s listed as failed", listed, p)
	}
	stats := filepath.Join(d.statsDir, "bdi", mnt.MajMin, "stats")
	st := statsWhen(t, stats, 3*time.Second, func(s map[string]int64) bool { return s["failed_files"] >= 1 })
	if st["failed_files"] < 1 || st["writeback_errors"] < 1 || st["BdiWritten"] != 0 {
		t.Errorf("failed_files %d, writeback_errors %d, BdiWritten %d kB; want at least 1, at least 1, 0",
			st["failed_files"], st["writeback_errors"], st["BdiWritten"])
	}
	if log := d.log.String(); !strings.Contains(log, "writeback may have failed") && !strings.Contains(log, "data lost") {
		t.Errorf("no log line of the failed writeback:\n%s", log)
	}
	if err := w.Sync(); err == nil {
		t.Errorf("the application's fsync after the daemon's writeback returned no error")
	}
	d.stop(t)
	if log := d.log.String(); strings.Contains(log, "every tracked file is clean") {
		t.Errorf("the shutdown says every tracked file is clean, with %s failed:\n%s", p, log)
	}
}

// TestReloadWithDeadTree: a reload while one watched filesystem is dead
// (an xfs shut down: a stat of its root fails with EIO) applies the rest
// of the configuration and keeps that tree as it runs; it was rejected
// whole, so no other tree could be changed until the daemon was
// restarted, which then refused to start.
func TestReloadWithDeadTree(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "mounts an xfs and an ext4 on loop devices")
	dead, deadTree := mountTree(t, "xfs")
	_, tree := mountTree(t, "ext4")
	conf := func(expire string) string {
		return fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"200ms\"\n[[watch]]\npath = %q\nexpire = %q\n[[watch]]\npath = %q\nexpire = \"1h\"\n",
			tree, expire, deadTree)
	}
	d := startDaemon(t, conf("1h"))
	shutDownFS(t, dead.Dir) // as after a metadata I/O error
	if _, err := os.Stat(deadTree); !errors.Is(err, unix.EIO) {
		t.Fatalf("stat of the shut-down xfs's tree: %v, want EIO", err)
	}
	f := filepath.Join(tree, "f")
	writeDirty(t, f, 64<<10)
	if !poll(5*time.Second, func() bool { return strings.Contains(dirtyList(t, d), f) }) {
		t.Fatalf("%s is not tracked:\n%s", f, dirtyList(t, d))
	}
	d.reload(t, conf("1s"))
	if !poll(5*time.Second, func() bool {
		l := d.log.String()
		return strings.Contains(l, "configuration reloaded") || strings.Contains(l, "reload rejected")
	}) {
		t.Fatalf("the reload did not end:\n%s", d.log.String())
	}
	l := d.log.String()
	if strings.Contains(l, "reload rejected") || !strings.Contains(l, "root cannot be reached; the tree is kept") {
		t.Fatalf("the reload with a dead tree: want it applied, the dead tree kept and said so; log:\n%s", l)
	}
	// The other tree's new expire applies to its tracked file.
	waitAllClean(t, 5*time.Second, f)
	var out, errb bytes.Buffer
	if code := Main([]string{"status", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
		t.Fatalf("flusherd status: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), strconv.Quote(deadTree)) {
		t.Errorf("status no longer lists the dead tree:\n%s", out.String())
	}
}
