package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// freezeCgroup puts pid in a cgroup of its own under the freezer (cgroup
// v2's cgroup.freeze, or v1's freezer.state) and returns functions that
// freeze and thaw it, each returning once the kernel says it is done.
func freezeCgroup(t *testing.T, pid int) (freeze, thaw func()) {
	t.Helper()
	name := fmt.Sprintf("flusherd-freeze-%d", pid)
	if v1 := "/sys/fs/cgroup/freezer"; dirExists(v1) {
		dir := filepath.Join(v1, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			testfs.Missing(t, "freezer cgroup: %v", err)
		}
		t.Cleanup(func() {
			os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
			if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
				for _, p := range strings.Fields(string(b)) {
					os.WriteFile("/sys/fs/cgroup/freezer/cgroup.procs", []byte(p), 0)
				}
			}
			os.Remove(dir)
		})
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			t.Fatalf("move the daemon into %s: %v", dir, err)
		}
		set := func(state string) {
			if err := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte(state), 0); err != nil {
				t.Fatalf("freezer.state %s: %v", state, err)
			}
			testwait.For(t, "freezer.state "+state, 5*time.Second, func() bool {
				b, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
				return strings.TrimSpace(string(b)) == state
			})
		}
		return func() { set("FROZEN") }, func() { set("THAWED") }
	}
	root := "/sys/fs/cgroup"
	if !dirExists(filepath.Join(root, "cgroup.freeze")) && !fileExists(filepath.Join(root, "cgroup.controllers")) {
		testfs.Missing(t, "no cgroup freezer (v1 freezer or v2 cgroup.freeze)")
	}
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		testfs.Missing(t, "cgroup v2: %v", err)
	}
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, p := range strings.Fields(string(b)) {
				os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(p), 0)
			}
		}
		os.Remove(dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("move the daemon into %s: %v", dir, err)
	}
	set := func(v string) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(v), 0); err != nil {
			t.Fatalf("cgroup.freeze %s: %v", v, err)
		}
		testwait.For(t, "cgroup.events frozen "+v, 5*time.Second, func() bool {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.events"))
			return strings.Contains(string(b), "frozen "+v)
		})
	}
	return func() { set("1") }, func() { set("0") }
}

func dirExists(p string) bool  { fi, err := os.Stat(p); return err == nil && fi.IsDir() }
func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestFrozenDaemon: a daemon frozen by the cgroup freezer for longer than
// its watchdog interval (WATCHDOG_USEC 2 s) and its attempt_timeout (1 s),
// five times, while a writer keeps its device busy, does not take its own
// thaw for a wedged device or a stuck call: no "no sign of life" line, no
// wedged STATUS=, no call counted past attempt_timeout, the watchdog pinged
// again within a second of each thaw, and the files written meanwhile
// written back.
func TestFrozenDaemon(t *testing.T) {
	testfs.SkipShort(t, "freezes the daemon's cgroup for 15 s")
	mnt, tree := mountTree(t, "ext4")
	sd := newFakeSystemd(t)
	d := runDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "100ms"
attempt_timeout = "1s"
[[watch]]
path = %q
expire = "100ms"
`, tree), daemonOpts{env: sd.env("WATCHDOG_USEC=2000000")})
	testwait.For(t, "watchdog pings", 3*time.Second, func() bool { return sd.count("WATCHDOG=1", 0) >= 2 })
	freeze, thaw := freezeCgroup(t, d.pid())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var written []string
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := filepath.Join(tree, fmt.Sprintf("f%03d", i%200))
			if os.WriteFile(p, make([]byte, 128<<10), 0o644) == nil && i < 200 {
				mu.Lock()
				written = append(written, p)
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(time.Second)
	for range 5 {
		freeze()
		time.Sleep(3 * time.Second)
		from := sd.len()
		thaw()
		if !poll(time.Second, func() bool { return sd.count("WATCHDOG=1", from) >= 1 }) {
			t.Errorf("no watchdog ping within 1 s of the thaw")
		}
		time.Sleep(500 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	mu.Lock()
	files := written
	mu.Unlock()
	waitAllClean(t, 10*time.Second, files...)
	log := d.log.String()
	for _, bad := range []string{"no sign of life", "timed-out writeback call", "past attempt_timeout"} {
		if strings.Contains(log, bad) {
			t.Errorf("after the thaws the log says %q:\n%s", bad, log)
		}
	}
	if n := sd.count("wedged", 0); n > 0 {
		t.Errorf("%d STATUS= messages call a device wedged", n)
	}
	if s := readStats(t, d.devStats(mnt.MajMin)); s["stuck_calls"] != 0 {
		t.Errorf("stuck_calls %d after the thaws", s["stuck_calls"])
	}
	d.stop(t)
}
