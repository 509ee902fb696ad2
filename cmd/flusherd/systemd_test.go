package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// fakeSystemd is a unixgram socket standing in for systemd's notify
// socket: it records every message.
type fakeSystemd struct {
	path string
	mu   sync.Mutex
	msgs []string
	at   []time.Time // when each message came
}

func newFakeSystemd(t *testing.T) *fakeSystemd {
	t.Helper()
	f := &fakeSystemd{path: filepath.Join(t.TempDir(), "notify")}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: f.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			f.mu.Lock()
			f.msgs = append(f.msgs, string(buf[:n]))
			f.at = append(f.at, time.Now())
			f.mu.Unlock()
		}
	}()
	return f
}

// env is a daemon's environment under this systemd: NOTIFY_SOCKET, and
// extra ("WATCHDOG_USEC=...").
func (f *fakeSystemd) env(extra ...string) []string {
	return append([]string{"NOTIFY_SOCKET=" + f.path}, extra...)
}

// count returns how many messages contain s, from index from on.
func (f *fakeSystemd) count(s string, from int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, m := range f.msgs[min(from, len(f.msgs)):] {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// maxGap returns the longest time between two messages that contain s,
// from index from on, and between the last of them and now.
func (f *fakeSystemd) maxGap(s string, from int) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last time.Time
	var gap time.Duration
	for i := min(from, len(f.msgs)); i < len(f.msgs); i++ {
		if !strings.Contains(f.msgs[i], s) {
			continue
		}
		if !last.IsZero() {
			gap = max(gap, f.at[i].Sub(last))
		}
		last = f.at[i]
	}
	if !last.IsZero() {
		gap = max(gap, time.Since(last))
	}
	return gap
}

func (f *fakeSystemd) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.msgs)
}

func (f *fakeSystemd) all() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.msgs, " | ")
}

// TestExtendTimeoutDaemon runs the daemon binary over a real notify
// socket with three trees whose set-up is slow: their filesystem (faultfs)
// takes 1.4 s to open a root, and start-up opens each root twice (set-up,
// then the watcher's fanotify offer): 8.4 s, ticks at 2, 4, 6 and 8 s.
// While start-up moves, EXTEND_TIMEOUT_USEC goes out every 2 s before
// READY=1, never twice with the same STATUS=, the last one counting the
// watcher's steps too. (A start-up stuck on one open sends none:
// service.TestExtendWhile, in virtual time.)
func TestExtendTimeoutDaemon(t *testing.T) {
	testfs.SkipShort(t, "a start-up slowed to 8 s on FUSE")
	const roots, delay = 3, 1400 * time.Millisecond
	ffs := faultfs.MountT(t)
	var conf strings.Builder
	conf.WriteString("[writeback]\ndirty_writeback_interval = \"200ms\"\ndirty_expire_interval = \"1s\"\n")
	for i := range roots {
		r := filepath.Join(ffs.Dir, fmt.Sprint("t", i))
		if err := os.Mkdir(r, 0o755); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&conf, "[[watch]]\npath = %q\n", r)
	}
	sd := newFakeSystemd(t)
	ffs.Set(faultfs.Faults{OpendirDelay: delay})
	opens := ffs.Count("opendir")
	// Up to READY=1: the initial scan after it would open each root once
	// more.
	runDaemon(t, conf.String(), daemonOpts{env: sd.env(), readyLine: "every root is watched"})
	ffs.Set(faultfs.Faults{})
	if n := ffs.Count("opendir") - opens; n < 2*roots {
		t.Fatalf("precondition: %d OPENDIR during start-up, want at least %d (two per root)", n, 2*roots)
	}
	testwait.For(t, "READY=1", 5*time.Second, func() bool { return sd.count("READY=1", 0) == 1 })
	const ext = "EXTEND_TIMEOUT_USEC=6000000\nSTATUS="
	sd.mu.Lock()
	var got []string
	for _, m := range sd.msgs {
		if strings.Contains(m, "READY=1") {
			break
		}
		if strings.HasPrefix(m, ext) {
			got = append(got, strings.TrimPrefix(m, ext))
		}
	}
	sd.mu.Unlock()
	t.Logf("extensions before READY=1: %q", got)
	if len(got) < 3 || len(got) > 4 {
		t.Fatalf("%d extensions before READY=1, want 3 to 4: %q", len(got), got)
	}
	for i := 1; i < len(got); i++ {
		if got[i] == got[i-1] {
			t.Errorf("extension %d says %q again: sent without progress (%q)", i, got[i], got)
		}
	}
	if !strings.Contains(got[len(got)-1], fmt.Sprintf("%d of %d trees set up, ", roots, roots)) {
		t.Errorf("the last extension does not count the watcher's steps: %q", got)
	}
}

// TestNotifyAndReload runs the daemon with $NOTIFY_SOCKET and a watchdog:
// READY=1 and STATUS= at start-up, WATCHDOG=1 pings; SIGHUP with a new
// configuration sends RELOADING=1 with MONOTONIC_USEC, then READY=1, and
// applies it (a new root is served, the removed root's files are written
// back once more, a large one in as many chunks as it takes, and
// forgotten; the new interval is used); a bad configuration
// is rejected with its key and line, and the old one keeps running.
func TestNotifyAndReload(t *testing.T) {
	testfs.SkipShort(t, "the daemon under a fake systemd, reloaded")
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	a, b := filepath.Join(mnt.Dir, "a"), filepath.Join(mnt.Dir, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sd := newFakeSystemd(t)
	conf := func(interval, expire string, roots ...string) string {
		s := fmt.Sprintf("[writeback]\ndirty_writeback_interval = %q\ndirty_expire_interval = %q\n", interval, expire)
		for _, r := range roots {
			s += fmt.Sprintf("[[watch]]\npath = %q\n", r)
		}
		return s
	}
	d := runDaemon(t, conf("1h", "1h", a), daemonOpts{env: sd.env("WATCHDOG_USEC=300000")})
	testwait.For(t, "READY=1", 5*time.Second, func() bool { return sd.count("READY=1", 0) == 1 })
	testwait.For(t, "READY=1 in the log", 5*time.Second, func() bool {
		return strings.Contains(d.log.String(), "every root is watched; READY=1 (the initial scan goes on)")
	})
	testwait.For(t, "STATUS=", 5*time.Second, func() bool { return sd.count("STATUS=watching 1 tree (", 0) >= 1 })
	testwait.For(t, "watchdog pings", 5*time.Second, func() bool { return sd.count("WATCHDOG=1", 0) >= 3 })

	// Files in a: tracked, and not due for an hour. big holds six
	// write_chunks (4 MiB) of dirty data.
	fa := filepath.Join(a, "f")
	writeDirty(t, fa, 16<<10)
	big := filepath.Join(a, "big")
	writeDirty(t, big, 24<<20)
	statsPath := d.devStats(mnt.MajMin)
	testwait.For(t, "a/f and a/big tracked", 5*time.Second, func() bool { return readStats(t, statsPath)["b_dirty"] == 2 })

	// Reload: a is removed, b is added, the interval is 200ms and the
	// expiry 1s.
	cfgPath := d.cfgPath
	if err := os.WriteFile(cfgPath, []byte(conf("200ms", "1s", b)), 0o644); err != nil {
		t.Fatal(err)
	}
	from := sd.len()
	d.signal(syscall.SIGHUP)
	testwait.For(t, "RELOADING=1 then READY=1", 5*time.Second, func() bool {
		return sd.count("RELOADING=1\nMONOTONIC_USEC=", from) == 1 && sd.count("READY=1", from) == 1
	})
	// watch/stats names the trees served now, before any event in b.
	watchStats := filepath.Join(d.statsDir, "watch", "stats")
	testwait.For(t, "watch/stats naming b, not a", time.Second, func() bool {
		data, _ := os.ReadFile(watchStats)
		return strings.Contains(string(data), strconv.Quote(b)) && !strings.Contains(string(data), strconv.Quote(a))
	})
	// a's files are written back once more (the removed root), big
	// one write_chunk at a time until none of it is dirty, and
	// forgotten.
	waitClean(t, fa, 5*time.Second)
	waitClean(t, big, 10*time.Second)
	testwait.For(t, "a/f forgotten", 5*time.Second, func() bool {
		s := readStats(t, statsPath)
		return s["b_dirty"]+s["b_io"]+s["b_more_io"]+s["b_more_io_wait"] == 0
	})
	// b is served with the new interval and expiry: its file is written
	// back within about 1.2s (under the old 1h interval it would wait).
	fb := filepath.Join(b, "f")
	writeDirty(t, fb, 16<<10)
	waitClean(t, fb, 5*time.Second)
	if !strings.Contains(d.log.String(), "configuration reloaded") {
		t.Errorf("no reload in the log:\n%s", d.log.String())
	}
	// A file written in a now is not tracked (the daemon's list, once
	// its event was handled).
	g := filepath.Join(a, "g")
	writeDirty(t, g, 4096)
	settleEvents()
	if l := dirtyList(t, d); strings.Contains(l, strconv.Quote(g)) {
		t.Errorf("a file in the removed root is tracked:\n%s", l)
	}

	// A bad configuration: rejected with key and line; b still served.
	bad := "[writeback]\ndirty_writeback_interval = \"200ms\"\nmin_pause = \"10\"\n[[watch]]\npath = \"" + b + "\"\n"
	if err := os.WriteFile(cfgPath, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	from = sd.len()
	d.signal(syscall.SIGHUP)
	testwait.For(t, "READY=1 after a rejected reload", 5*time.Second, func() bool { return sd.count("READY=1", from) == 1 })
	testwait.For(t, "the rejection in the log", 5*time.Second, func() bool {
		return strings.Contains(d.log.String(), "configuration reload rejected") && strings.Contains(d.log.String(), "flusherd.toml:3: writeback.min_pause")
	})
	fb2 := filepath.Join(b, "f2")
	writeDirty(t, fb2, 4096)
	waitClean(t, fb2, 5*time.Second) // the running configuration: 1s expiry

	// The root removed and made again: after a reload (same good
	// configuration), it is served again. The reload also changes a key
	// read at start only: that is logged, with both values.
	if err := os.WriteFile(cfgPath, []byte(conf("200ms", "1s", b)+"[watcher]\nrescan_interval = \"10s\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	from = len(d.log.String())
	if err := os.RemoveAll(b); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the removal logged", 5*time.Second, func() bool { return strings.Contains(d.log.String()[from:], "root is gone") })
	if err := os.Mkdir(b, 0o755); err != nil {
		t.Fatal(err)
	}
	from2 := sd.len()
	d.signal(syscall.SIGHUP)
	testwait.For(t, "READY=1 after the reload", 5*time.Second, func() bool { return sd.count("READY=1", from2) == 1 })
	fb3 := filepath.Join(b, "f3")
	writeDirty(t, fb3, 4096)
	waitClean(t, fb3, 5*time.Second)
	if l := d.log.String()[from:]; !strings.Contains(l, `this setting changes at the next start, not on reload	{"key": "watcher.rescan_interval", "running": "30s", "configured": "10s"}`) {
		t.Errorf("no warning that watcher.rescan_interval changes at the next start:\n%s", l)
	}

	// A configuration with no tree left: accepted, and the daemon says it
	// is now idle (a warning, as at start-up).
	if err := os.WriteFile(cfgPath, []byte("[writeback]\ndirty_writeback_interval = \"200ms\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	from = len(d.log.String())
	d.signal(syscall.SIGHUP)
	testwait.For(t, "the idle warning after a reload to no tree", 5*time.Second, func() bool {
		return strings.Contains(d.log.String()[from:], "WARN\tthe reloaded configuration leaves no tree watched")
	})
	d.stop(t)
	// With the stop's budget (shutdown_timeout 30 s + 17 s), which
	// extends TimeoutStopSec=.
	if sd.count("STOPPING=1\nEXTEND_TIMEOUT_USEC=47000000", 0) != 1 {
		t.Errorf("no STOPPING=1 with EXTEND_TIMEOUT_USEC=47000000: %s", sd.all())
	}
}
