package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"flusherd/control"
	"flusherd/internal/cli"
	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
)

// TestDirtyCommand: `flusherd dirty` on a real loop filesystem lists the
// tracked files oldest first, with their ages, lists, pages and last
// error: two files on ext4 waiting on b_dirty (expire 1h), and one on a
// FUSE filesystem whose opens fail with EAGAIN, on b_more_io_wait.
func TestDirtyCommand(t *testing.T) {
	testfs.SkipShort(t, "the daemon on loop-mounted ext4 and FUSE")
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	ffs := faultfs.MountT(t)
	tree := filepath.Join(mnt.Dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
min_pause = "50ms"
max_pause = "200ms"
[[watch]]
path = %q
expire = "1h"
[[watch]]
path = %q
expire = "100ms"
`, tree, ffs.Dir))
	older := filepath.Join(tree, "older")
	writeDirty(t, older, 16<<10)
	time.Sleep(1200 * time.Millisecond)
	newer := filepath.Join(tree, "newer")
	writeDirty(t, newer, 8<<10)
	blocked := filepath.Join(ffs.Dir, "blocked")
	ffs.Set(faultfs.Faults{OpenErr: syscall.EAGAIN})
	writeDirty(t, blocked, 4<<10)

	var files []control.DirtyFile
	if !poll(10*time.Second, func() bool {
		var out, errb bytes.Buffer
		code := Main([]string{"dirty", "--json", "--top", "0", "--stats-dir", d.statsDir}, &out, &errb)
		if code != 0 {
			t.Fatalf("flusherd dirty: exit %d: %s", code, errb.String())
		}
		files = nil
		if err := json.Unmarshal(out.Bytes(), &files); err != nil {
			t.Fatalf("flusherd dirty --json: %v\n%s", err, out.String())
		}
		i := pathIndex(files, blocked)
		return len(files) == 3 && i >= 0 && files[i].List == "b_more_io_wait" && files[i].LastError == "EAGAIN"
	}) {
		t.Fatalf("want 3 files with the blocked one on b_more_io_wait (EAGAIN), got %+v", files)
	}
	t.Logf("%+v", files)
	// Oldest first. The blocked file, written last, is on another
	// filesystem, whose events another backend reads (FUSE: inotify):
	// its event may be handled a moment before newer's, so its place
	// is by the age it got, not by the order of the writes.
	for i := 1; i < len(files); i++ {
		if files[i].AgeSeconds > files[i-1].AgeSeconds {
			t.Errorf("not oldest first: %q (%.3fs) after %q (%.3fs)", files[i].Path, files[i].AgeSeconds, files[i-1].Path, files[i-1].AgeSeconds)
		}
	}
	if string(files[0].Path) != older || pathIndex(files, newer) < 0 {
		t.Fatalf("paths %q %q %q: want older first, and newer", files[0].Path, files[1].Path, files[2].Path)
	}
	bl := files[pathIndex(files, blocked)]
	files = []control.DirtyFile{files[0], files[pathIndex(files, newer)], bl}
	if files[0].List != "b_dirty" || files[1].List != "b_dirty" {
		t.Errorf("lists %s %s, want b_dirty (expire 1h)", files[0].List, files[1].List)
	}
	// Written 1.2 s apart; each age counts from when the daemon handled
	// the file's event, which a loaded machine may delay by a moment.
	if a0, a1 := files[0].AgeSeconds, files[1].AgeSeconds; a0-a1 < 0.6 || a1 < 0 {
		t.Errorf("ages %.2fs and %.2fs: want the older at least 0.6s older (written 1.2s before)", a0, a1)
	}
	if files[0].DirtyPages != 4 || files[1].DirtyPages != 2 {
		t.Errorf("dirty pages %d and %d, want 4 and 2 (cachestat)", files[0].DirtyPages, files[1].DirtyPages)
	}
	// The blocked file was never opened: its pages are unknown, not 0.
	if files[0].PagesUnknown || files[1].PagesUnknown || !files[2].PagesUnknown {
		t.Errorf("pages_unknown %v %v %v, want false false true (the blocked file never opened)",
			files[0].PagesUnknown, files[1].PagesUnknown, files[2].PagesUnknown)
	}
	if files[2].Retries < 1 || files[2].Errors < 1 {
		t.Errorf("blocked file: retries %d errors %d, want both >= 1", files[2].Retries, files[2].Errors)
	}
	if files[0].Bdi != mnt.MajMin {
		t.Errorf("bdi %q, want %q", files[0].Bdi, mnt.MajMin)
	}
	// The table: a header and the oldest file first; --top limits it.
	var out, errb bytes.Buffer
	if code := Main([]string{"dirty", "--top", "1", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
		t.Fatalf("flusherd dirty: exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "AGE") || !strings.Contains(lines[1], older) {
		t.Errorf("flusherd dirty --top 1:\n%s", out.String())
	}
	if !strings.Contains(errb.String(), "2 more tracked files not shown (the oldest is;") {
		t.Errorf("flusherd dirty --top 1 of 3: stderr %q, want the 2 left out counted", errb.String())
	}
	// The whole table: the blocked file's pages shown as unknown.
	out.Reset()
	if code := Main([]string{"dirty", "--top", "0", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
		t.Fatalf("flusherd dirty: exit %d: %s", code, errb.String())
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, strconv.Quote(blocked)) && !strings.Contains(l, "  ?  ") {
			t.Errorf("the blocked file's line does not show its pages as unknown (?): %q", l)
		}
	}
	// Live stats of one device: the stats file's layout, thresholds
	// included, and only that device.
	out.Reset()
	if code := Main([]string{"stats", "--stats-dir", d.statsDir, mnt.MajMin}, &out, &out); code != 0 {
		t.Fatalf("flusherd stats %s: exit %d: %s", mnt.MajMin, code, out.String())
	}
	live := out.String()
	if !strings.HasPrefix(live, "==> bdi/"+mnt.MajMin+" <==\n") || strings.Count(live, "==>") != 1 ||
		!strings.Contains(live, "b_dirty:                     2") || strings.Contains(live, "DirtyThresh:                 0 kB") {
		t.Errorf("flusherd stats %s (live):\n%s", mnt.MajMin, live)
	}
	out.Reset()
	if code := Main([]string{"stats", "--stats-dir", d.statsDir, "99:99"}, &out, &out); code != cli.ExitFailed {
		t.Errorf("flusherd stats of an unknown device: exit %d, want 1: %s", code, out.String())
	}
	if !strings.Contains(out.String(), strconv.Quote(mnt.MajMin)) {
		t.Errorf("flusherd stats of an unknown device does not name the devices it has (%s): %s", mnt.MajMin, out.String())
	}
	ffs.Set(faultfs.Faults{})
	d.stop(t)
}

// TestDirtyUnreachable: with no daemon, `flusherd dirty` and `flusherd
// sync` exit 3 and say where they looked and what to check.
func TestDirtyUnreachable(t *testing.T) {
	dir := t.TempDir()
	for _, cmd := range []string{"dirty", "sync"} {
		var out bytes.Buffer
		if code := Main([]string{cmd, "--stats-dir", dir}, &out, &out); code != cli.ExitUnreachable {
			t.Errorf("%s: exit %d, want %d: %s", cmd, code, cli.ExitUnreachable, out.String())
		}
		for _, want := range []string{"is the daemon running", strconv.Quote(dir), "--stats-dir"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s: the message lacks %q: %s", cmd, want, out.String())
			}
		}
	}
}

// TestNamesNotUTF8: file names that are not UTF-8 keep every byte through
// the control socket: `flusherd dirty --json` gives each back exactly
// (as {"base64": ...}), the table quotes them so that they can be told
// apart and typed back, and `flusherd sync` of one writes that file, not
// another whose name looks the same once the bytes are replaced.
func TestNamesNotUTF8(t *testing.T) {
	t.Parallel()
	_, tree := mountTree(t, "ext4")
	d := startDaemon(t, fmt.Sprintf("[writeback]\ndirty_expire_interval = \"1h\"\n[[watch]]\npath = %q\n", tree))
	e9, e8, repl := filepath.Join(tree, "caf\xe9.txt"), filepath.Join(tree, "caf\xe8.txt"), filepath.Join(tree, "caf\ufffd.txt")
	for _, p := range []string{e9, e8, repl} {
		writeDirty(t, p, 8192)
	}
	want := map[string]bool{e9: true, e8: true, repl: true}
	var got map[string]bool
	if !poll(10*time.Second, func() bool {
		var out, errb bytes.Buffer
		if code := Main([]string{"dirty", "--json", "--top", "0", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
			t.Fatalf("flusherd dirty --json: exit %d: %s", code, errb.String())
		}
		var files []control.DirtyFile
		if err := json.Unmarshal(out.Bytes(), &files); err != nil {
			t.Fatalf("flusherd dirty --json: %v\n%s", err, out.String())
		}
		got = map[string]bool{}
		for _, f := range files {
			got[string(f.Path)] = true
		}
		return len(got) == 3
	}) {
		t.Fatalf("dirty --json names: %v, want %v", got, want)
	}
	for p := range want {
		if !got[p] {
			t.Errorf("%q missing from dirty --json (got %v)", p, got)
		}
	}
	var out bytes.Buffer
	if code := Main([]string{"dirty", "--stats-dir", d.statsDir}, &out, &out); code != 0 {
		t.Fatalf("flusherd dirty: %s", out.String())
	}
	for _, q := range []string{`"` + tree + `/caf\xe9.txt"`, `"` + tree + `/caf\xe8.txt"`} {
		if !strings.Contains(out.String(), q) {
			t.Errorf("the table lacks %s:\n%s", q, out.String())
		}
	}
	mustBeDirty(t, e9)
	mustBeDirty(t, repl)
	if code, o := runSync(t, d, e9); code != 0 {
		t.Fatalf("sync %q: exit %d: %s", e9, code, o)
	}
	if dirty, wb, _ := cachestat(e9, 0, 0); dirty+wb != 0 {
		t.Errorf("%q still dirty after flusherd sync of it", e9)
	}
	if dirty, _, _ := cachestat(repl, 0, 0); dirty == 0 {
		t.Errorf("flusherd sync of %q wrote %q instead", e9, repl)
	}
}

// TestLostDataConsumedElsewhere: in an integrity tree, a writeback error
// that another process's fsync took first (coreutils sync FILE) is still
// seen: the file's data left the page cache without flusherd writing it,
// the filesystem's own error cursor (held since the tree was added) shows
// an error since, so the file is reported failed (flusherd dirty, stats),
// not dropped as clean; written again, it is written back and forgotten.
func TestLostDataConsumedElsewhere(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon on FUSE failing writeback")
	ffs := faultfs.MountT(t)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "2s"
[[watch]]
path = %q
mode = "integrity"
`, ffs.Dir))
	p := filepath.Join(ffs.Dir, "badB")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 8192)); err != nil {
		t.Fatal(err)
	}
	stats := d.devStats("0:" + fmt.Sprint(minorOf(t, ffs.Dir)))
	ffs.Set(faultfs.Faults{WriteErr: syscall.EIO})
	out, err := exec.Command("sync", p).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Input/output error") {
		t.Fatalf("precondition: sync %s should fail with EIO: %v %s", p, err, out)
	}
	ffs.Set(faultfs.Faults{})
	listOf := func() string {
		for _, f := range dirtyFiles(t, d) {
			if string(f.Path) == p {
				return f.List + " " + f.LastError
			}
		}
		return ""
	}
	var got string
	if !poll(8*time.Second, func() bool { got = listOf(); return strings.HasPrefix(got, "failed") }) {
		t.Fatalf("badB is %q in flusherd dirty, want on the list failed; log:\n%s", got, d.log.String())
	}
	if s := statsWhen(t, stats, 3*time.Second, func(s map[string]int64) bool { return s["failed_files"] == 1 }); s["failed_files"] != 1 {
		t.Errorf("failed_files = %d, want 1", s["failed_files"])
	}
	// The list is published under the device's lock; the log line is
	// written just after it, so it may trail by a moment.
	if !poll(2*time.Second, func() bool { return strings.Contains(d.log.String(), "data lost") }) {
		t.Errorf("the loss is not logged:\n%s", d.log.String())
	}
	// Written again, without the fault: written back and forgotten.
	if _, err := f.WriteAt(make([]byte, 8192), 0); err != nil {
		t.Fatal(err)
	}
	waitClean(t, p, 8*time.Second)
	if !poll(5*time.Second, func() bool { return listOf() == "" }) {
		t.Errorf("badB still listed after it was written again: %q", listOf())
	}
}

// TestLostThenReadOnly: in an integrity tree, files whose fdatasync failed
// with EIO (the kernel dropped their pages) on a filesystem that then
// turns read-only (every later fsync EROFS) are reported lost, with the
// EIO they were lost to, not retried as EROFS for ever; the shutdown names
// them and does not say that every file is clean.
func TestLostThenReadOnly(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon on FUSE failing writeback, then read-only")
	ffs := faultfs.MountT(t)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "500ms"
min_pause = "100ms"
max_pause = "3s"
[[watch]]
path = %q
mode = "integrity"
`, ffs.Dir))
	stats := d.devStats("0:" + fmt.Sprint(minorOf(t, ffs.Dir)))
	ffs.Set(faultfs.Faults{WriteErr: syscall.EIO})
	var files []string
	for i := range 5 {
		p := filepath.Join(ffs.Dir, fmt.Sprintf("f%d", i))
		writeHeld(t, p, 8192) // (a close would flush, and meet the EIO)
		files = append(files, p)
	}
	list := func() map[string]control.DirtyFile {
		m := map[string]control.DirtyFile{}
		for _, f := range dirtyFiles(t, d) {
			m[string(f.Path)] = f
		}
		return m
	}
	// Each file's fdatasync has met the EIO; their retries come
	// max_pause after it.
	if !poll(8*time.Second, func() bool {
		m := list()
		for _, p := range files {
			if m[p].LastError != "EIO" || m[p].List == "failed" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the files' writeback did not fail with EIO: %+v\n%s", list(), d.log.String())
	}
	ffs.Set(faultfs.Faults{WriteErr: syscall.EROFS, FsyncErr: syscall.EROFS})
	var m map[string]control.DirtyFile
	if !poll(8*time.Second, func() bool {
		m = list()
		for _, p := range files {
			if m[p].List != "failed" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("files lost to EIO on a filesystem now read-only are not reported failed: %+v\n%s", m, d.log.String())
	}
	for _, p := range files {
		if m[p].LastError != "EIO" {
			t.Errorf("%s: failed with %q, want the EIO its data was lost to", p, m[p].LastError)
		}
	}
	if s := statsWhen(t, stats, 3*time.Second, func(s map[string]int64) bool { return s["failed_files"] == 5 }); s["failed_files"] != 5 {
		t.Errorf("failed_files = %d, want 5", s["failed_files"])
	}
	if !poll(2*time.Second, func() bool { return strings.Count(d.log.String(), "data lost") == 5 }) {
		t.Errorf("want one data-lost line a file:\n%s", d.log.String())
	}
	d.stop(t)
	log := d.log.String()
	if strings.Contains(log, "every tracked file is clean") || !strings.Contains(log, "data was lost to a failed writeback") ||
		!strings.Contains(log, `"data_lost": 5`) || strings.Contains(log, "ended_by") {
		t.Errorf("the shutdown does not report the lost files as lost (or blames a timeout):\n%s", log)
	}
	for _, p := range files {
		if !strings.Contains(log, strconv.Quote(strconv.Quote(p))[1:]) && !strings.Contains(log, p) {
			t.Errorf("the shutdown log does not name %s", p)
		}
	}
}

// minorOf returns the minor number of the filesystem of dir (a FUSE
// filesystem's bdi is 0:minor).
func minorOf(t *testing.T, dir string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	return uint32(st.Dev&0xff) | uint32((st.Dev>>12)&0xfff00)
}

// TestDirtyTopSaysMore: when the daemon tracks more files than --top
// lists, flusherd dirty says how many more on standard error, for the
// table and for --json (whose standard output stays a JSON array); when
// it lists them all, it says nothing more.
func TestDirtyTopSaysMore(t *testing.T) {
	dir := t.TempDir()
	var total atomic.Int64
	total.Store(5)
	srv, err := control.Listen(control.SocketPath(dir), func(_ context.Context, req control.Request) control.Response {
		files := []control.DirtyFile{{Path: "/t/a", Bdi: "7:0", List: "b_dirty"}, {Path: "/t/b", Bdi: "7:0", List: "b_dirty"}}
		return control.Response{OK: true, Dirty: files, DirtyTotal: int(total.Load())}
	}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); srv.Close(); <-done })
	for _, args := range [][]string{{"dirty", "--top", "2"}, {"dirty", "--top", "2", "--json"}} {
		var out, errb bytes.Buffer
		if code := Main(append(args, "--stats-dir", dir), &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		if want := "3 more tracked files not shown (the 2 oldest are;"; !strings.Contains(errb.String(), want) {
			t.Errorf("%v: stderr %q, want %q", args, errb.String(), want)
		}
		if strings.Contains(out.String(), "more tracked") {
			t.Errorf("%v: the note is on standard output: %q", args, out.String())
		}
	}
	total.Store(2)
	var out, errb bytes.Buffer
	if code := Main([]string{"dirty", "--stats-dir", dir}, &out, &errb); code != 0 || errb.Len() != 0 {
		t.Errorf("every file listed: exit %d, stderr %q, want 0 and nothing", code, errb.String())
	}
}

// pathIndex returns the index of the file listed under path, or -1.
func pathIndex(files []control.DirtyFile, path string) int {
	for i, f := range files {
		if string(f.Path) == path {
			return i
		}
	}
	return -1
}
