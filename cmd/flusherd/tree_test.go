package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/control"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

const (
	// The daemon's intervals in these tests.
	treeWritebackInterval = "200ms"
	treeExpireInterval    = "1s"
	// cleanBound is how long data written into a tree (or moved into
	// one) may stay dirty: the 1s expiry, the 200ms interval and ample
	// slack for a loaded machine. It is far below the kernel's own
	// vm.dirty_expire_centisecs (30s by default), so a file that is clean
	// within it was written back by flusherd.
	cleanBound = 5 * time.Second
	// stayDirtyWindow is how long a file that flusherd must not write back
	// is watched to stay dirty: over twice the 1.2s a tracked file takes
	// to be written (expiry and interval), well under the kernel's expiry.
	stayDirtyWindow = 3 * time.Second
	// bigDirEntries is the size of the directory of the 100k case.
	bigDirEntries = 100_000
)

// TestTreeChanges runs the daemon, once per watcher backend, against
// changes to the watched trees on a loop-mounted ext4: new subdirectories,
// renames within, into and out of a tree, atomic saves, hard links,
// truncation, deletion, a tree's root removed or unmounted, hostile
// entries (FIFOs, sockets, device nodes, symlinks, names that are not
// UTF-8), a directory of 100,000 entries and a file the daemon may not
// read. Each case has its own directory and its own daemon (so its stats
// file counts only its files); each backend's filesystem is shared by its
// cases. Outcomes are checked with cachestat and the daemon's stats file,
// within bounds of a few seconds that the kernel's own flusher (30s)
// cannot meet. Under inotify, the cases whose events package watch checks
// on a real filesystem for each backend are left out (treeCases).
func TestTreeChanges(t *testing.T) {
	testfs.SkipShort(t, "the daemon through about 20 tree changes, each backend")
	if euid := os.Geteuid(); euid != 0 {
		t.Skipf("needs root: loop-mounted filesystems, fanotify, device nodes (euid=%d)", euid)
	}
	for _, backend := range []string{"inotify", "fanotify"} {
		t.Run(backend, func(t *testing.T) { testTreeChanges(t, backend) })
	}
}

// treeCase is a case of TestTreeChanges.
type treeCase struct {
	name string
	run  func(*treeSuite, *testing.T)
	// on names the one backend the case runs under ("": both).
	on string
}

// treeCases are the cases that run in parallel. Under inotify, four are
// left to package watch, whose tests run on a loop-mounted ext4 under
// inotify, fanotify and fanotify without FAN_REPORT_TARGET_FID:
// new subdirectories (TestNewSubdirectoryRace), a file renamed into the
// tree (TestRenameInto), a file deleted (TestInotifyNameUnlinked; the
// daemon's drop and count, bdi.TestRealGone and, under both backends,
// case 17) and a root removed (TestGoneRootInWatchStats).
var treeCases = []treeCase{
	{"01-new-subdirs", (*treeSuite).newSubdirs, "fanotify"},
	{"02-rename-within", (*treeSuite).renameWithin, ""},
	{"03-rename-into", (*treeSuite).renameInto, "fanotify"},
	{"04-rename-out", (*treeSuite).renameOut, ""},
	{"05-atomic-save", (*treeSuite).atomicSave, ""},
	{"06-hard-links", (*treeSuite).hardLinks, ""},
	{"07-truncate", (*treeSuite).truncate, ""},
	{"08-delete-queued", (*treeSuite).deleteQueued, "fanotify"},
	{"09-root-removed", (*treeSuite).rootRemoved, "fanotify"},
	{"10-root-unmounted", (*treeSuite).rootUnmounted, ""},
	{"11-hostile", (*treeSuite).hostile, ""},
	// Only inotify: the daemon runs as nobody, which the fanotify
	// backend cannot (fanotify_init and filesystem marks need
	// CAP_SYS_ADMIN; opening by handle needs CAP_DAC_READ_SEARCH, which
	// would also let it read the file).
	{"13-unreadable", (*treeSuite).unreadable, "inotify"},
	{"14-inode-reuse", (*treeSuite).inodeReuse, ""},
	{"15-root-remounted", (*treeSuite).rootRemounted, ""},
	{"16-write-then-rename", (*treeSuite).writeThenRename, ""},
	{"17-deleted-long-expire", (*treeSuite).deletedLongExpire, ""},
}

// treeSuite is one backend's run: the shared filesystem.
type treeSuite struct {
	backend string
	mnt     *testfs.FS
	// kernelExpire is vm.dirty_expire_centisecs: after that long the
	// kernel's flusher writes dirty data back by itself.
	kernelExpire time.Duration
}

func testTreeChanges(t *testing.T, backend string) {
	// mke2fs gives a filesystem under 512 MiB one inode per 4 KiB: about
	// 128,000 here, room for the 100,000-entry directory.
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 500})
	// ext4's auto_da_alloc starts writeback by itself of a file renamed
	// over another and of one truncated to 0 and rewritten; without it,
	// only flusherd (or the kernel's flusher, after 30s) writes such data
	// back, so the atomic-save and truncation cases test flusherd.
	if err := unix.Mount(mnt.Device, mnt.Dir, "ext4", unix.MS_REMOUNT, "noauto_da_alloc"); err != nil {
		t.Fatalf("remount %s with noauto_da_alloc: %v", mnt.Dir, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(mnt.Dir, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Ffree < bigDirEntries+10_000 {
		t.Fatalf("%s has %d free inodes; the 100k-entry case needs more", mnt.Dir, sfs.Ffree)
	}
	s := &treeSuite{backend: backend, mnt: mnt, kernelExpire: kernelDirtyExpire(t)}

	// The 100k-entry case loads the machine: it runs on its own, first,
	// under inotify only (bigDir). The others wait mostly for the
	// expiry: they run in parallel, with the other backend's.
	if backend == "inotify" {
		t.Run("12-100k-entries", s.bigDir)
	}
	t.Parallel()
	for _, c := range treeCases {
		if c.on == "" || c.on == backend {
			t.Run(c.name, func(t *testing.T) { c.run(s, t) })
		}
	}
}

// kernelDirtyExpire reads vm.dirty_expire_centisecs.
func kernelDirtyExpire(t *testing.T) time.Duration {
	b, err := os.ReadFile("/proc/sys/vm/dirty_expire_centisecs")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("vm.dirty_expire_centisecs: %v", err)
	}
	return time.Duration(cs) * 10 * time.Millisecond
}

// canCheckStaysDirty says whether "stays dirty for stayDirtyWindow" can be
// told apart from the kernel's own writeback.
func (s *treeSuite) canCheckStaysDirty(t *testing.T) bool {
	if s.kernelExpire < stayDirtyWindow+10*time.Second {
		t.Logf("vm.dirty_expire_centisecs is %v: too short to check that a file stays dirty for %v; not checked", s.kernelExpire, stayDirtyWindow)
		return false
	}
	return true
}

// dir makes a new directory for a case on the shared filesystem.
func (s *treeSuite) dir(t *testing.T, parts ...string) string {
	t.Helper()
	p := filepath.Join(append([]string{s.mnt.Dir}, parts...)...)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// treeWatch is one [[watch]] entry.
type treeWatch struct {
	path   string
	expire string // "": the dirty_expire_interval
}

// treeOpts are the settings a case changes.
type treeOpts struct {
	cred            *syscall.Credential // run as this user (nil: root)
	logLevel        string              // "": info
	shutdownTimeout string              // "": 10s
}

func (s *treeSuite) config(o treeOpts, watches []treeWatch) string {
	var b strings.Builder
	shutdown := cmp.Or(o.shutdownTimeout, "10s")
	fmt.Fprintf(&b, "[writeback]\ndirty_writeback_interval = %q\ndirty_expire_interval = %q\nshutdown_timeout = %q\n",
		treeWritebackInterval, treeExpireInterval, shutdown)
	fmt.Fprintf(&b, "[watcher]\nbackend = %q\n", s.backend)
	fmt.Fprintf(&b, "[log]\nlevel = %q\n", cmp.Or(o.logLevel, "info"))
	for _, w := range watches {
		fmt.Fprintf(&b, "[[watch]]\npath = %q\n", w.path)
		if w.expire != "" {
			fmt.Fprintf(&b, "expire = %q\n", w.expire)
		}
	}
	return b.String()
}

// treeDaemon is a case's daemon.
type treeDaemon struct {
	*flusherdProc
	stats string // the shared filesystem's stats file
}

// start runs a daemon with this backend on the watches; at cleanup, if the
// test failed, its stats file is logged (startDaemon logs its log).
func (s *treeSuite) start(t *testing.T, o treeOpts, watches ...treeWatch) *treeDaemon {
	t.Helper()
	p := runDaemon(t, s.config(o, watches), daemonOpts{cred: o.cred})
	d := &treeDaemon{flusherdProc: p, stats: filepath.Join(p.statsDir, "bdi", s.mnt.MajMin, "stats")}
	t.Cleanup(func() {
		if t.Failed() {
			b, err := os.ReadFile(d.stats)
			t.Logf("stats file %s (read error: %v):\n%s", d.stats, err, b)
		}
	})
	return d
}

// tracked is the number of inodes on a stats file's lists.
func tracked(s map[string]int64) int64 {
	return s["b_dirty"] + s["b_io"] + s["b_more_io"] + s["b_more_io_wait"]
}

func drained(s map[string]int64) bool { return s != nil && tracked(s) == 0 }

// brief is the stats lines the tests look at, on one line.
func brief(s map[string]int64) string {
	if s == nil {
		return "no stats file"
	}
	return fmt.Sprintf("b_dirty=%d b_io=%d b_more_io=%d b_more_io_wait=%d inodes_gone=%d writeback_errors=%d",
		s["b_dirty"], s["b_io"], s["b_more_io"], s["b_more_io_wait"], s["inodes_gone"], s["writeback_errors"])
}

// poll is testwait.Poll: it calls cond until it returns true, and reports
// whether it did within limit.
func poll(limit time.Duration, cond func() bool) bool {
	return testwait.Poll(limit, cond)
}

// waitStats polls the stats file until ok holds; after limit it fails the
// test, naming what was awaited.
func (d *treeDaemon) waitStats(t *testing.T, limit time.Duration, what string, ok func(map[string]int64) bool) map[string]int64 {
	t.Helper()
	var s map[string]int64
	if !poll(limit, func() bool { s = readStats(t, d.stats); return ok(s) || d.exited() }) || !ok(s) {
		d.mustRun(t)
		t.Fatalf("%s: not within %v; stats: %s", what, limit, brief(s))
	}
	return s
}

// waitDrained waits until the stats file shows no tracked inode.
func (d *treeDaemon) waitDrained(t *testing.T, limit time.Duration) map[string]int64 {
	t.Helper()
	return d.waitStats(t, limit, "lists drain to 0", drained)
}

// waitAllClean waits until every path is clean, limit counting from now for
// the whole set.
func waitAllClean(t *testing.T, limit time.Duration, paths ...string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for _, p := range paths {
		waitClean(t, p, max(0, time.Until(deadline)))
	}
}

// cleanWithin is waitClean that reports instead of failing.
func cleanWithin(path string, limit time.Duration) (ok bool, dirty, wb uint64, err error) {
	ok = poll(limit, func() bool {
		dirty, wb, err = cachestat(path, 0, 0)
		return err == nil && dirty == 0 && wb == 0
	})
	return ok, dirty, wb, err
}

// mustBeDirty checks a precondition: path holds dirty pages right after it
// was written.
func mustBeDirty(t *testing.T, path string) {
	t.Helper()
	d, wb, err := cachestat(path, 0, 0)
	if err != nil || d == 0 {
		t.Fatalf("precondition: %q should be dirty right after the write (dirty=%d writeback=%d err=%v)", path, d, wb, err)
	}
}

// appendDirty appends n bytes to an existing file without syncing.
func appendDirty(t *testing.T, path string, n int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(bytes.Repeat([]byte{'a'}, n)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func rename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

// 1. Nested directories made at once (mkdir -p) and written to at once,
// deepest first: the watcher must not miss a file written before the
// watch on its new directory existed.
func (s *treeSuite) newSubdirs(t *testing.T) {
	t.Parallel()
	tree := s.dir(t, "new-subdirs")
	d := s.start(t, treeOpts{}, treeWatch{path: tree})
	var files []string
	for i := range 10 {
		top := filepath.Join(tree, fmt.Sprintf("n%d", i))
		leaf := filepath.Join(top, "a", "b", "c")
		mkdirs(t, leaf)
		for dir := leaf; ; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, "f")
			writeDirty(t, p, 16<<10)
			files = append(files, p)
			if dir == top {
				break
			}
		}
	}
	waitAllClean(t, cleanBound, files...)
	d.waitDrained(t, cleanBound)
}

// 2. A dirty file renamed within the tree, and a directory holding a dirty
// file renamed within the tree: written back under the new names.
func (s *treeSuite) renameWithin(t *testing.T) {
	t.Parallel()
	tree := s.dir(t, "rename-within")
	mkdirs(t, filepath.Join(tree, "src"), filepath.Join(tree, "dst"), filepath.Join(tree, "dirA"))
	d := s.start(t, treeOpts{}, treeWatch{path: tree})
	src, dst := filepath.Join(tree, "src", "f"), filepath.Join(tree, "dst", "g")
	writeDirty(t, src, 64<<10)
	inDir := filepath.Join(tree, "dirA", "h")
	writeDirty(t, inDir, 32<<10)
	rename(t, src, dst)
	rename(t, filepath.Join(tree, "dirA"), filepath.Join(tree, "dirB"))
	moved := filepath.Join(tree, "dirB", "h")
	mustBeDirty(t, dst)
	mustBeDirty(t, moved)
	waitAllClean(t, cleanBound, dst, moved)
	d.waitDrained(t, cleanBound)
}

// 3. A dirty file, and a directory holding one, renamed into the tree from
// a directory outside it on the same filesystem: written back.
func (s *treeSuite) renameInto(t *testing.T) {
	t.Parallel()
	base := s.dir(t, "rename-into")
	tree, outside := filepath.Join(base, "tree"), filepath.Join(base, "outside")
	mkdirs(t, tree, filepath.Join(outside, "dir"))
	d := s.start(t, treeOpts{}, treeWatch{path: tree})
	f := filepath.Join(outside, "f")
	writeDirty(t, f, 64<<10)
	writeDirty(t, filepath.Join(outside, "dir", "h"), 32<<10)
	rename(t, f, filepath.Join(tree, "f"))
	rename(t, filepath.Join(outside, "dir"), filepath.Join(tree, "dir"))
	in, inDir := filepath.Join(tree, "f"), filepath.Join(tree, "dir", "h")
	mustBeDirty(t, in)
	mustBeDirty(t, inDir)
	waitAllClean(t, cleanBound, in, inDir)
	d.waitDrained(t, cleanBound)
}

// 4. A dirty file renamed out of the tree before it expires: the write
// was seen in the tree, so it is written back once, at its new place, and
// then forgotten: the next write there is none of flusherd's business.
func (s *treeSuite) renameOut(t *testing.T) {
	t.Parallel()
	base := s.dir(t, "rename-out")
	tree, outside := filepath.Join(base, "tree"), filepath.Join(base, "outside")
	mkdirs(t, tree, outside)
	// An expiry of 2s leaves the file dirty well after the daemon has
	// seen the write (a stats file rewritten every 200 ms says so), on
	// a loaded machine too.
	d := s.start(t, treeOpts{}, treeWatch{path: tree, expire: "2s"})
	in, out := filepath.Join(tree, "f"), filepath.Join(outside, "f")
	writeDirty(t, in, 64<<10)
	// Let the daemon see the write before the rename (an event for a
	// name already gone may be dropped), well before the expiry.
	d.waitStats(t, cleanBound, "the file written in the tree is tracked", func(s map[string]int64) bool { return tracked(s) >= 1 })
	rename(t, in, out)
	mustBeDirty(t, out)
	if ok, dirty, wb, err := cleanWithin(out, cleanBound); !ok {
		t.Errorf("file renamed out of the tree while dirty: not written back within %v at its new place (dirty=%d writeback=%d err=%v); stats: %s",
			cleanBound, dirty, wb, err, brief(readStats(t, d.stats)))
	}
	d.waitDrained(t, cleanBound)

	// Written again outside the tree: flusherd must leave it alone.
	appendDirty(t, out, 16<<10)
	mustBeDirty(t, out)
	if !s.canCheckStaysDirty(t) {
		return
	}
	written := time.Now()
	maxTracked := int64(0)
	for time.Since(written) < stayDirtyWindow {
		st := readStats(t, d.stats)
		maxTracked = max(maxTracked, tracked(st))
		d.mustRun(t)
		time.Sleep(50 * time.Millisecond)
	}
	if maxTracked > 0 {
		t.Errorf("after a write outside the tree to the file renamed out of it, the stats showed %d tracked inode(s): the daemon did not forget it", maxTracked)
	}
	if dirty, wb, err := cachestat(out, 0, 0); err != nil || dirty == 0 {
		t.Errorf("file renamed out of the tree and written again there was written back within %v (dirty=%d writeback=%d err=%v): the daemon did not forget it",
			stayDirtyWindow, dirty, wb, err)
	}
}

// 16. Files written and renamed at once, within the tree and from a
// second tree into the first, then the second tree removed: each is
// tracked under its new name, so a sync of the new names writes them all
// back, and the second tree's going drops none of them. (fanotify reads
// the write and the rename in one batch of events; were the write
// reported after the rename, the file would be back under its old name.)
func (s *treeSuite) writeThenRename(t *testing.T) {
	t.Parallel()
	base := s.dir(t, "write-then-rename")
	tree, other := filepath.Join(base, "tree"), filepath.Join(base, "other")
	src, dst := filepath.Join(tree, "src"), filepath.Join(tree, "dst")
	mkdirs(t, src, dst, other)
	d := s.start(t, treeOpts{}, treeWatch{path: tree, expire: "1h"}, treeWatch{path: other, expire: "1h"})
	const n = 20
	var files []string
	for i := range n {
		from, to := filepath.Join(src, fmt.Sprintf("a%d", i)), filepath.Join(dst, fmt.Sprintf("b%d", i))
		if i%2 == 1 {
			from = filepath.Join(other, fmt.Sprintf("a%d", i))
		}
		writeDirty(t, from, 16<<10)
		rename(t, from, to)
		files = append(files, to)
	}
	d.waitStats(t, cleanBound, fmt.Sprintf("%d files tracked", n), func(s map[string]int64) bool { return tracked(s) >= n })
	from := len(d.log.String())
	if err := os.RemoveAll(other); err != nil {
		t.Fatal(err)
	}
	if !poll(cleanBound, func() bool { _, ok := d.logLineSince(from, "root", other); return ok }) {
		t.Errorf("the removal of the tree %s was not logged within %v; log since: %q", other, cleanBound, d.log.String()[from:])
	}
	for _, f := range files {
		mustBeDirty(t, f)
	}
	if code, out := runSync(t, d.flusherdProc, dst); code != 0 || !strings.Contains(out, fmt.Sprintf("%d files written back", n)) {
		t.Errorf("sync %s: exit %d, %q; want exit 0 and %d files written back", dst, code, out, n)
	}
	for _, f := range files {
		if dirty, wb, err := cachestat(f, 0, 0); err != nil || dirty+wb != 0 {
			t.Errorf("%s after the sync of its directory: dirty=%d writeback=%d err=%v", f, dirty, wb, err)
		}
	}
}

// 5. Atomic save: a temporary file written and renamed over the old,
// dirty, name. The new content is written back; the old inode is dropped.
func (s *treeSuite) atomicSave(t *testing.T) {
	t.Parallel()
	tree := s.dir(t, "atomic-save")
	d := s.start(t, treeOpts{}, treeWatch{path: tree})
	doc, tmp := filepath.Join(tree, "doc"), filepath.Join(tree, ".doc.tmp")
	writeDirty(t, doc, 32<<10)
	d.waitStats(t, cleanBound, "the old file is tracked", func(s map[string]int64) bool { return tracked(s) >= 1 })
	content := bytes.Repeat([]byte("new content\n"), 4096)
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		t.Fatal(err)
	}
	rename(t, tmp, doc)
	mustBeDirty(t, doc) // (with auto_da_alloc, ext4 would have started its writeback)
	waitClean(t, doc, cleanBound)
	if got, err := os.ReadFile(doc); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("%s does not hold the new content (%d bytes, err %v)", doc, len(got), err)
	}
	st := d.waitDrained(t, cleanBound)
	t.Logf("after the save: %s", brief(st))
}

// 6. A file with two names in the tree, written through both: written
// back, and tracked as one inode (sampled while waiting).
func (s *treeSuite) hardLinks(t *testing.T) {
	t.Parallel()
	tree := s.dir(t, "hard-links")
	mkdirs(t, filepath.Join(tree, "x"), filepath.Join(tree, "y"))
	a, b := filepath.Join(tree, "x", "a"), filepath.Join(tree, "y", "b")
	if err := os.WriteFile(a, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(a, b); err != nil {
		t.Fatal(err)
	}
	d := s.start(t, treeOpts{}, treeWatch{path: tree})
	appendDirty(t, a, 16<<10)
	appendDirty(t, b, 16<<10)
	appendDirty(t, a, 16<<10)
	appendDirty(t, b, 16<<10)
	mustBeDirty(t, a)
	maxTracked, samples := int64(0), 0
	sample := func() {
		st := readStats(t, d.stats)
		if st != nil {
			samples++
			maxTracked = max(maxTracked, tracked(st))
		}
	}
	ok := poll(cleanBound, func() bool {
		sample()
		dirty, wb, err := cachestat(a, 0, 0)
		return err == nil && dirty == 0 && wb == 0
	})
	if !ok {
		dirty, wb, err := cachestat(a, 0, 0)
		t.Errorf("hard-linked file written through both names: not clean within %v (dirty=%d writeback=%d err=%v)", cleanBound, dirty, wb, err)
	}
	poll(cleanBound, func() bool { sample(); return drained(readStats(t, d.stats)) })
	st := readStats(t, d.stats)
	if !drained(st) {
		t.Errorf("lists did not drain within %v: %s", cleanBound, brief(st))
	}
	if maxTracked > 1 {
		t.Errorf("the one dirty inode, with two names, was tracked %d times at once (stats sampled %d times)", maxTracked, samples)
	}
	if samples == 0 {
		t.Errorf("no stats file seen while the file was dirty")
	}
	t.Logf("stats sampled %d times, at most %d tracked", samples, maxTracked)
}

// 7. Truncation: a dirty file truncated to 0, one truncated to a smaller
// size (dirty pages below the new size remain), and one truncated to 0
// through an open descriptor and rewritten. All end clean; lists drain.
func (s *treeSuite) truncate(t *testing.T) {
	t.Parallel()
	tree := s.dir(t, "truncate")
	// An expiry of 2s: the files are still dirty when they are
	// truncated, however late the stats file shows them tracked.
	d := s.start(t, treeOpts{}, treeWatch{path: tree, expire: "2s"})
	zero, smaller, rewritten := filepath.Join(tree, "zero"), filepath.Join(tree, "smaller"), filepath.Join(tree, "rewritten")
	for _, p := range []string{zero, smaller} {
		writeDirty(t, p, 64<<10)
	}
	f, err := os.OpenFile(rewritten, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	d.waitStats(t, cleanBound, "the three files are tracked", func(s map[string]int64) bool { return tracked(s) >= 3 })
	if err := os.Truncate(zero, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(smaller, 20000); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{'r'}, 16<<10), 0); err != nil {
		t.Fatal(err)
	}
	mustBeDirty(t, smaller)
	mustBeDirty(t, rewritten)
	waitAllClean(t, cleanBound, zero, smaller, rewritten)
	d.waitDrained(t, cleanBound)
	for p, want := range map[string]int64{zero: 0, smaller: 20000, rewritten: 16 << 10} {
		if fi, err := os.Stat(p); err != nil || fi.Size() != want {
			t.Errorf("%s: size %v (err %v), want %d", p, fi.Size(), err, want)
		}
	}
}

// 8. A file deleted while it waits on b_dirty: dropped and counted in
// inodes_gone; the lists drain. (The tree's expiry is 2s, so the file is
// deleted well before its attempt.)
func (s *treeSuite) deleteQueued(t *testing.T) {
	t.Parallel()
	tree := s.dir(t, "delete-queued")
	d := s.start(t, treeOpts{}, treeWatch{path: tree, expire: "2s"})
	doomed := filepath.Join(tree, "doomed")
	writeDirty(t, doomed, 16<<10)
	before := d.waitStats(t, cleanBound, "the new file shows on b_dirty", func(s map[string]int64) bool { return s["b_dirty"] >= 1 })
	if err := os.Remove(doomed); err != nil {
		t.Fatal(err)
	}
	d.waitStats(t, cleanBound, fmt.Sprintf("inodes_gone above %d and lists drained", before["inodes_gone"]), func(s map[string]int64) bool {
		return drained(s) && s["inodes_gone"] > before["inodes_gone"]
	})
}

// 9. A watched tree's root removed (rm -rf) while its files are dirty and
// queued: the daemon logs it, keeps running, drops the files, and still
// serves the other tree on the same filesystem.
func (s *treeSuite) rootRemoved(t *testing.T) {
	t.Parallel()
	base := s.dir(t, "root-removed")
	doomed, other := filepath.Join(base, "doomed"), filepath.Join(base, "other")
	mkdirs(t, filepath.Join(doomed, "sub"), other)
	d := s.start(t, treeOpts{}, treeWatch{path: doomed, expire: "2s"}, treeWatch{path: other})
	for _, p := range []string{filepath.Join(doomed, "f1"), filepath.Join(doomed, "sub", "f2"), filepath.Join(doomed, "sub", "f3")} {
		writeDirty(t, p, 16<<10)
	}
	d.waitStats(t, cleanBound, "the doomed tree's 3 files are tracked", func(s map[string]int64) bool { return tracked(s) >= 3 })
	from := len(d.log.String())
	if err := os.RemoveAll(doomed); err != nil {
		t.Fatal(err)
	}
	if !poll(cleanBound, func() bool { _, ok := d.logLineSince(from, "root", doomed); return ok }) {
		t.Errorf("no log message containing \"root\" and the root's path within %v of the removal of the tree's root; log since: %q", cleanBound, d.log.String()[from:])
	}
	// status still shows the gone tree's settings.
	var out, errb bytes.Buffer
	if code := Main([]string{"status", "--json", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
		t.Fatalf("flusherd status: exit %d: %s", code, errb.String())
	}
	var st control.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(st.Trees, func(ts control.TreeStatus) bool { return string(ts.Root) == doomed })
	if i < 0 || st.Trees[i].Served || st.Trees[i].Mode != "writeback" || st.Trees[i].ExpireSeconds != 2 {
		t.Errorf("status of the gone tree %s: %+v; want it not served, mode writeback, expire 2 s", doomed, st.Trees)
	}
	d.mustRun(t)
	d.waitDrained(t, cleanBound)
	f := filepath.Join(other, "f")
	writeDirty(t, f, 16<<10)
	waitClean(t, f, cleanBound)
	d.mustRun(t)
	d.stop(t)
}

// 10. A watched tree's root unmounted (its own filesystem, a second [[watch]]
// tree, once its files are clean): the daemon keeps running, logs it,
// removes that device's stats file, and still serves the other tree.
func (s *treeSuite) rootUnmounted(t *testing.T) {
	t.Parallel()
	main := s.dir(t, "root-unmounted")
	mnt2 := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 32})
	mkdirs(t, filepath.Join(mnt2.Dir, "sub"))
	d := s.start(t, treeOpts{}, treeWatch{path: main}, treeWatch{path: mnt2.Dir})
	stats2 := filepath.Join(d.statsDir, "bdi", mnt2.MajMin, "stats")
	f1, f2 := filepath.Join(mnt2.Dir, "f1"), filepath.Join(mnt2.Dir, "sub", "f2")
	writeDirty(t, f1, 32<<10)
	writeDirty(t, f2, 32<<10)
	waitAllClean(t, cleanBound, f1, f2)
	var st2 map[string]int64
	if !poll(cleanBound, func() bool { st2 = readStats(t, stats2); return drained(st2) }) {
		t.Fatalf("%s: lists of the second filesystem did not drain within %v: %s", stats2, cleanBound, brief(st2))
	}
	from := len(d.log.String())
	if err := mnt2.Unmount(); err != nil {
		t.Fatalf("unmounting the watched filesystem with its files clean: %v (flusherd holds something open on it?)", err)
	}
	d.mustRun(t)
	// Both outcomes are awaited together.
	gone := func() bool { _, err := os.Stat(stats2); return os.IsNotExist(err) }
	logged, wentAway := false, false
	poll(cleanBound, func() bool {
		_, logged = d.logLineSince(from, "root", mnt2.Dir)
		wentAway = wentAway || gone()
		return logged && wentAway
	})
	if !logged {
		t.Errorf("no log message containing \"root\" and the root's path within %v of unmounting the tree's root; log since: %q", cleanBound, d.log.String()[from:])
	}
	if !wentAway {
		t.Errorf("the stats file of the unmounted filesystem, %s, is still there %v after the umount: %s", stats2, cleanBound, brief(readStats(t, stats2)))
	}
	d.mustRun(t)
	f := filepath.Join(main, "f")
	writeDirty(t, f, 16<<10)
	waitClean(t, f, cleanBound)
	if wentAway && !gone() {
		t.Errorf("the stats file of the unmounted filesystem, %s, came back", stats2)
	}
	d.mustRun(t)
	d.stop(t)
}

// 15. A watched tree on its own filesystem, unmounted (its root gone) and
// mounted again, then a reload (SIGHUP, configuration unchanged), as
// docs/limitations.md asks: the tree is served again, and a file written in it after
// the reload is written back by flusherd. (The filesystem comes back with
// a new superblock and the same fsid: a fanotify mark of the old one died
// with it, and the reload must mark the new one.)
func (s *treeSuite) rootRemounted(t *testing.T) {
	t.Parallel()
	mnt2 := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 32})
	tree := filepath.Join(mnt2.Dir, "tree")
	mkdirs(t, tree)
	// An open descriptor keeps the (autoclear) loop device attached
	// across the umount; it is closed after the second umount, and
	// testfs's cleanup checks that the device then went away. (This
	// cleanup runs after the daemon's, which stops it.)
	dev, err := os.Open(mnt2.Device)
	if err != nil {
		t.Fatal(err)
	}
	remounted := false
	t.Cleanup(func() {
		if remounted {
			if err := unix.Unmount(mnt2.Dir, 0); err != nil {
				t.Errorf("umount %s: %v", mnt2.Dir, err)
			}
		}
		dev.Close()
	})
	d := s.start(t, treeOpts{}, treeWatch{path: tree})
	f1 := filepath.Join(tree, "f1")
	writeDirty(t, f1, 16<<10)
	waitClean(t, f1, cleanBound)
	from := len(d.log.String())
	if err := mnt2.Unmount(); err != nil {
		t.Fatalf("unmounting the watched filesystem with its files clean: %v", err)
	}
	if !poll(cleanBound, func() bool { return strings.Contains(d.log.String()[from:], "root is gone") }) {
		t.Fatalf("the unmount of the tree's filesystem was not logged within %v; log since: %q", cleanBound, d.log.String()[from:])
	}
	if err := unix.Mount(mnt2.Device, mnt2.Dir, "ext4", 0, ""); err != nil {
		t.Fatalf("mounting %s again on %s: %v", mnt2.Device, mnt2.Dir, err)
	}
	remounted = true
	from = len(d.log.String())
	d.signal(syscall.SIGHUP)
	if !poll(cleanBound, func() bool { return strings.Contains(d.log.String()[from:], "configuration reloaded") }) {
		t.Fatalf("no reload within %v; log since: %q", cleanBound, d.log.String()[from:])
	}
	if !strings.Contains(d.log.String()[from:], "watch root served again (it was gone)") {
		t.Errorf("the reload did not say the root is served again; log since: %q", d.log.String()[from:])
	}
	d.mustRun(t)
	f2 := filepath.Join(tree, "f2")
	writeDirty(t, f2, 16<<10)
	waitClean(t, f2, cleanBound)
	d.stop(t)
}

// logRecord is the start of a line of the daemon's log (zap's console
// encoder: a timestamp unless under systemd, then the level). A line that
// does not start so is the rest of a record split by a raw newline.
var logRecord = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2}T\S+\t)?(DEBUG|INFO|WARN|ERROR|DPANIC|PANIC|FATAL)\t`)

// 11. Hostile entries, present at start (the start-up scan) and made while
// running: FIFOs (one with a writer blocked in open), a unix socket, a
// character device, symlinks to a dirty file outside the tree (never
// followed: it stays dirty), files whose names are not UTF-8 and hold a
// newline (written back; logged escaped). A regular file is written back
// all the same, and the daemon stops cleanly.
func (s *treeSuite) hostile(t *testing.T) {
	t.Parallel()
	base := s.dir(t, "hostile")
	// The file outside is on a filesystem of its own: the other cases,
	// run meanwhile on the suite's, sync theirs (integrity trees'
	// syncfs), which would write it back.
	tree, outside := filepath.Join(base, "tree"), filepath.Join(testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 16}).Dir, "outside")
	mkdirs(t, tree, outside)
	secret := hostileEntries(t, tree, outside)
	// Names with invalid UTF-8 and a newline: one written before the
	// daemon starts, one after, and one deleted while queued (so that the
	// daemon has reason to log its name: debug level).
	badAtStart := filepath.Join(tree, "start-\xff\xfe-name\ntail-of-start.bin")
	badLater := filepath.Join(tree, "later-\xff\xfe-name\ntail-of-later.bin")
	badDropped := filepath.Join(tree, "dropped-\xff\xfe-name\ntail-of-dropped.bin")
	writeDirty(t, badAtStart, 32<<10)

	d := s.start(t, treeOpts{logLevel: "debug"}, treeWatch{path: tree, expire: "2s"})

	// Through the symlink, appending (the file is not truncated).
	appendDirty(t, filepath.Join(tree, "link"), 100)
	linkWritten := time.Now()
	if err := os.Symlink(secret, filepath.Join(tree, "link2")); err != nil {
		t.Fatal(err)
	}
	fifo2 := filepath.Join(tree, "fifo2")
	writerDone := fifoWithWriter(t, fifo2)

	// The file found by the start-up scan is written back; then, with
	// nothing else tracked, one is deleted while queued (the tree's 2s
	// expiry leaves time to see it tracked first).
	waitClean(t, badAtStart, cleanBound)
	d.waitDrained(t, cleanBound)
	writeDirty(t, badDropped, 16<<10)
	d.waitStats(t, cleanBound, "the file to be deleted is tracked", func(s map[string]int64) bool { return tracked(s) >= 1 })
	if err := os.Remove(badDropped); err != nil {
		t.Fatal(err)
	}
	d.waitStats(t, cleanBound, "the deleted file is dropped (inodes_gone >= 1, lists drained)", func(s map[string]int64) bool {
		return drained(s) && s["inodes_gone"] >= 1
	})

	regular := filepath.Join(tree, "sub", "regular")
	mkdirs(t, filepath.Dir(regular))
	writeDirty(t, regular, 128<<10)
	writeDirty(t, badLater, 32<<10)
	waitAllClean(t, cleanBound, regular, badLater)
	d.waitDrained(t, cleanBound)

	// Give flusherd every chance to (wrongly) write the outside file.
	if s.canCheckStaysDirty(t) {
		for time.Since(linkWritten) < stayDirtyWindow {
			d.mustRun(t)
			time.Sleep(100 * time.Millisecond)
		}
		if dirty, _, err := cachestat(secret, 0, 0); err != nil || dirty == 0 {
			t.Errorf("the file outside the tree, written through a symlink in it, was written back within %v (dirty=%d, err=%v): a symlink was followed", stayDirtyWindow, dirty, err)
		}
	}
	select {
	case err := <-writerDone:
		t.Errorf("the FIFO's writer was released (err=%v): something opened it for reading", err)
	default:
	}
	d.mustRun(t)
	d.stop(t)

	log := d.log.String()
	for i, line := range strings.Split(strings.TrimSuffix(log, "\n"), "\n") {
		if !logRecord.MatchString(line) {
			t.Errorf("daemon log line %d does not start a record (a raw newline inside a record?): %q", i+1, line)
		}
	}
	for _, tail := range []string{"tail-of-start", "tail-of-later", "tail-of-dropped"} {
		if strings.Contains(log, "\n"+tail) {
			t.Errorf("the daemon log holds a file name with its newline unescaped (%q)", "\\n"+tail)
		}
	}
	if strings.Contains(log, "\xff") || strings.Contains(log, "\xfe") {
		t.Errorf("the daemon log holds raw bytes of a name that is not UTF-8")
	}
	// The dropped file's name, escaped: the newline as a backslash
	// escape (any number of backslashes: quoting may be nested).
	if escaped := regexp.MustCompile(`dropped-[^\n"]*-name\\+ntail-of-dropped\.bin`); !escaped.MatchString(log) {
		t.Errorf("the daemon log never names the file deleted while queued with its name escaped (want a match of %q)", escaped)
	} else {
		m := escaped.FindString(log)
		t.Logf("escaped name in the log: %s", m)
		// Lossless: the invalid bytes as \xNN escapes, never U+FFFD,
		// so the name can be recovered from the log.
		if strings.Contains(m, `\ufffd`) || strings.Contains(m, "\ufffd") {
			t.Errorf("the name's invalid bytes are logged as U+FFFD; the name cannot be recovered from the log: %s", m)
		}
	}
}

// 12. 100,000 entries in one directory, made while the daemon runs, then
// 100 of them dirtied: the daemon does not hang (they get clean within
// ~10s) and stops on SIGTERM. Under inotify only, the slower of the two
// here; fanotify's reader meets a flood of new files in TestEndToEnd (a
// source tree copied in), and both backends' overflows and rescans are
// TestOverflow's.
func (s *treeSuite) bigDir(t *testing.T) {
	tree := s.dir(t, "big")
	big := filepath.Join(tree, "dir")
	mkdirs(t, big)
	d := s.start(t, treeOpts{}, treeWatch{path: tree})
	began := time.Now()
	name := func(i int) string { return filepath.Join(big, fmt.Sprintf("entry-%06d", i)) }
	for i := range bigDirEntries {
		fd, err := unix.Open(name(i), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatalf("creating entry %d: %v", i, err)
		}
		unix.Close(fd)
	}
	t.Logf("%d empty files made in %v", bigDirEntries, time.Since(began).Round(time.Millisecond))
	var dirty []string
	for i := 0; i < bigDirEntries; i += bigDirEntries / 100 {
		dirty = append(dirty, name(i))
		writeDirty(t, name(i), 8<<10)
	}
	written := time.Now()
	waitAllClean(t, 10*time.Second, dirty...)
	t.Logf("the 100 dirtied files clean %v after the last write", time.Since(written).Round(time.Millisecond))
	d.mustRun(t)
	stopAt := time.Now()
	d.stop(t)
	t.Logf("SIGTERM to exit: %v", time.Since(stopAt).Round(time.Millisecond))
}

// 13. A root-owned 0600 dirty file in the tree, with the daemon running as
// nobody, so that it cannot open it: the daemon neither crashes nor hangs,
// other files written before and after it get clean, and it stops on
// SIGTERM (within its shutdown_timeout, the file being still dirty).
func (s *treeSuite) unreadable(t *testing.T) {
	t.Parallel()
	cred := nobodyCred(t)
	tree := s.dir(t, "unreadable")
	if err := makeSearchable(tree); err != nil {
		testfs.Missing(t, "the tree cannot be made reachable for nobody: %v", err)
	}
	d := s.start(t, treeOpts{cred: cred, shutdownTimeout: "2s"}, treeWatch{path: tree})
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.pid())); err != nil ||
		!regexp.MustCompile(fmt.Sprintf(`(?m)^Uid:\s+%d\s`, cred.Uid)).Match(status) {
		t.Fatalf("precondition: the daemon does not run as nobody (uid %d): %v\n%s", cred.Uid, err, status)
	}
	secret := filepath.Join(tree, "secret")
	if err := os.WriteFile(secret, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	// The other files belong to nobody: cachestat(2) on this kernel
	// refuses (EPERM) a caller that neither owns the file nor may write
	// to it, as mincore(2) does, even on a descriptor open for reading.
	writeOwned := func(p string) {
		t.Helper()
		writeDirty(t, p, 32<<10)
		if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	ok1 := filepath.Join(tree, "ok1")
	writeOwned(ok1)
	waitClean(t, ok1, cleanBound)
	// The unreadable file has been retried meanwhile; a file written now
	// must still get through.
	time.Sleep(time.Second)
	d.mustRun(t)
	ok2 := filepath.Join(tree, "ok2")
	writeOwned(ok2)
	waitClean(t, ok2, cleanBound)
	d.mustRun(t)
	st := d.waitStats(t, cleanBound, "at most the unreadable file stays tracked", func(s map[string]int64) bool { return s != nil && tracked(s) <= 1 })
	dirty, _, _ := cachestat(secret, 0, 0)
	t.Logf("unreadable file: %d dirty pages; stats: %s", dirty, brief(st))
	d.stop(t)
}

// 14. (st_dev, st_ino) is not an identity: ext4 gives a deleted file's
// inode number to the next file at once. A file that takes the number of a
// tracked, deleted one is a new file and is written back within the bound;
// so is every survivor of a spool that writes m$i and deletes m$(i-5); and
// the shutdown's "every tracked file is clean" is true by cachestat.
func (s *treeSuite) inodeReuse(t *testing.T) {
	t.Parallel()
	tree := s.dir(t, "inode-reuse")
	d := s.start(t, treeOpts{}, treeWatch{path: tree})
	ino := func(p string) uint64 {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	// Other cases create files on the same filesystem in parallel and may
	// take the freed number first: try until b gets a's number.
	reused := false
	for i := 0; i < 20 && !reused; i++ {
		a, b := filepath.Join(tree, fmt.Sprintf("a%d", i)), filepath.Join(tree, fmt.Sprintf("b%d", i))
		writeDirty(t, a, 50000)
		n := ino(a)
		d.waitStats(t, cleanBound, "a is tracked", func(s map[string]int64) bool { return tracked(s) >= 1 })
		if err := os.Remove(a); err != nil {
			t.Fatal(err)
		}
		writeDirty(t, b, 50000)
		if ino(b) != n {
			waitClean(t, b, cleanBound)
			continue
		}
		reused = true
		mustBeDirty(t, b)
		waitClean(t, b, cleanBound)
	}
	if !reused {
		t.Fatal("precondition: no new file got a deleted file's inode number in 20 tries")
	}
	var survivors []string
	for i := range 300 {
		writeDirty(t, filepath.Join(tree, fmt.Sprintf("m%d", i)), 8192)
		if i >= 5 {
			if err := os.Remove(filepath.Join(tree, fmt.Sprintf("m%d", i-5))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 295; i < 300; i++ {
		survivors = append(survivors, filepath.Join(tree, fmt.Sprintf("m%d", i)))
	}
	waitAllClean(t, cleanBound, survivors...)
	// Files dirtied just before the stop are written by the shutdown.
	for i := range 5 {
		p := filepath.Join(tree, fmt.Sprintf("late%d", i))
		writeDirty(t, p, 8192)
		survivors = append(survivors, p)
	}
	from := len(d.log.String())
	d.stop(t)
	if _, ok := d.logLineSince(from, "every tracked file is clean"); !ok {
		t.Errorf("shutdown did not say every tracked file is clean: %q", d.log.String()[from:])
	}
	for _, p := range survivors {
		if dirty, wb, err := cachestat(p, 0, 0); err != nil || dirty+wb != 0 {
			t.Errorf("%s: %d dirty, %d writeback pages after the shutdown said every file is clean (err %v)", p, dirty, wb, err)
		}
	}
}

// TestMovedIntoIntegrityTree: a dirty file renamed from a writeback tree
// (expiry an hour) into an integrity tree (expiry 1s) on the same ext4, as
// a temporary file renamed into place, is written back within the
// integrity tree's bound, counted from when it was dirtied (the engine's
// TestStricterTreeHolds checks that it is written with fdatasync); a file
// left in the writeback tree stays dirty.
func TestMovedIntoIntegrityTree(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon until a moved file expires")
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	wbTree, intTree := filepath.Join(mnt.Dir, "wb"), filepath.Join(mnt.Dir, "int")
	mkdirs(t, wbTree, intTree)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
[[watch]]
path = %q
expire = "1h"
[[watch]]
path = %q
mode = "integrity"
expire = "1s"
`, wbTree, intTree))
	tmp, stays := filepath.Join(wbTree, "file.tmp"), filepath.Join(wbTree, "stays")
	writeDirty(t, tmp, 64<<10)
	writeDirty(t, stays, 64<<10)
	time.Sleep(500 * time.Millisecond) // tracked under the writeback tree
	final := filepath.Join(intTree, "file")
	if err := os.Rename(tmp, final); err != nil {
		t.Fatal(err)
	}
	took := waitClean(t, final, 5*time.Second)
	t.Logf("clean %v after the rename", took)
	if dirty, _, err := cachestat(stays, 0, 0); err != nil || dirty == 0 {
		t.Errorf("the file left in the writeback tree (expiry 1h): %d dirty pages, %v; want still dirty", dirty, err)
	}
	d.stop(t)
}

// TestIntegrityRootLazilyUnmounted: the filesystem of an integrity tree,
// whose root the daemon holds open for its error cursor (a plain umount
// fails with EBUSY), unmounted lazily (umount -l): once the daemon finds
// the root gone it lets go of it, and the filesystem is released (its loop
// device detaches) while the daemon runs on.
func TestIntegrityRootLazilyUnmounted(t *testing.T) {
	t.Parallel()
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 32})
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
[[watch]]
path = %q
mode = "integrity"
expire = "200ms"
`, mnt.Dir))
	f := filepath.Join(mnt.Dir, "f")
	writeDirty(t, f, 16<<10)
	waitClean(t, f, 5*time.Second)
	from := len(d.log.String())
	if err := mnt.UnmountLazy(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the root found gone", 5*time.Second, func() bool {
		_, ok := d.logLineSince(from, "root", mnt.Dir)
		return ok
	})
	testwait.For(t, "the filesystem released (its loop device detached)", 5*time.Second, func() bool { return !mnt.Attached() })
	d.mustRun(t)
	d.stop(t)
}

// TestReloadStricterAppliesToTracked: a reload that shortens a tree's
// expire (and makes it an integrity tree) applies to the files it tracks
// already: they keep their age, and one older than the new expire is
// written at the next pass. A file tracked under an expire of an hour was
// left dirty for that hour after the operator asked for 1 s.
func TestReloadStricterAppliesToTracked(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon reloaded until a file expires")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	_, tree := mountTree(t, "ext4")
	conf := func(expire, mode string) string {
		return fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"200ms\"\n[[watch]]\npath = %q\nexpire = %q\nmode = %q\n", tree, expire, mode)
	}
	d := startDaemon(t, conf("1h", "writeback"))
	f := filepath.Join(tree, "f")
	writeDirty(t, f, 64<<10)
	if !poll(5*time.Second, func() bool { return strings.Contains(dirtyList(t, d), f) }) {
		t.Fatalf("%s is not tracked:\n%s", f, dirtyList(t, d))
	}
	time.Sleep(1200 * time.Millisecond) // older than the new expire
	d.reload(t, conf("1s", "integrity"))
	if !poll(5*time.Second, func() bool { return strings.Contains(d.log.String(), `"tracked_files": 1,`) }) {
		t.Fatalf("the reload did not apply the settings to the tracked file:\n%s", d.log.String())
	}
	waitAllClean(t, 3*time.Second, f)
	if !poll(3*time.Second, func() bool { return !strings.Contains(dirtyList(t, d), f) }) {
		t.Errorf("%s is still listed after its writeback:\n%s", f, dirtyList(t, d))
	}
}

// TestReloadNestingAppliesToTracked: a file tracked under a tree of an
// hour is held, after a reload, by a stricter tree (1 s), and is written
// within that: a tree added inside the first (the file in its root), and
// an inner tree made non-recursive (the file in its subdirectory, which
// the stricter tree around it holds now). Both had kept the hour.
func TestReloadNestingAppliesToTracked(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon reloaded over nested trees")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	type tr struct {
		rel, expire, mode string
		recursive         bool
	}
	for _, c := range []struct {
		name          string
		before, after []tr
		file          string
	}{
		{"tree added inside", []tr{{"", "1h", "writeback", true}},
			[]tr{{"", "1h", "writeback", true}, {"in", "1s", "integrity", false}}, "in/x"},
		{"inner made non-recursive", []tr{{"", "1s", "integrity", true}, {"in", "1h", "writeback", true}},
			[]tr{{"", "1s", "integrity", true}, {"in", "1h", "writeback", false}}, "in/d/z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, tree := mountTree(t, "ext4")
			mkdirs(t, filepath.Join(tree, "in", "d"))
			conf := func(trees []tr) string {
				s := "[writeback]\ndirty_writeback_interval = \"200ms\"\n"
				for _, x := range trees {
					s += fmt.Sprintf("[[watch]]\npath = %q\nexpire = %q\nmode = %q\nrecursive = %v\n", filepath.Join(tree, x.rel), x.expire, x.mode, x.recursive)
				}
				return s
			}
			d := startDaemon(t, conf(c.before))
			f := filepath.Join(tree, c.file)
			writeDirty(t, f, 64<<10)
			if !poll(5*time.Second, func() bool { return strings.Contains(dirtyList(t, d), f) }) {
				t.Fatalf("%s is not tracked:\n%s", f, dirtyList(t, d))
			}
			d.reload(t, conf(c.after))
			waitAllClean(t, 4*time.Second, f)
		})
	}
}

// 17. Files deleted in a tree whose expiry is an hour away are not kept
// until then: the next pass looks for them (fanotify: FAN_DELETE with the
// file's handle, FAN_DELETE_SELF; inotify: IN_DELETE and IN_MOVED_TO of a
// name whose file the event reader knows), finds them gone (inodes_gone)
// and forgets them: 40 reported by events and a file replaced by a rename
// over its name (no FAN_DELETE: its FAN_DELETE_SELF); with fanotify also
// 20 written before the daemon started and found by its scan (whose
// handles the event reader never saw) and a file deleted while the test
// holds it open, written again, then closed (FAN_DELETE_SELF at the
// close). (With inotify, those two wait for their expiry: a scan's files
// are not among the names the reader knows, and no event comes at a
// deleted file's last close.) A file with one of its two names
// deleted, and the open file right after its deletion, are still there:
// they are written back early (cachestat: clean); with inotify only the
// open file: the name deleted of the other is not the one it was last
// reported under (the link made after it), and a name not its own
// changes nothing. Both were checked dirty
// before the deletions, so it is the deletion that brought their attempt
// forward, not an expiry; the file saved over the replaced one is new and
// waits for its expiry, though it takes the number of a deleted file (the
// shared filesystem is mounted noauto_da_alloc, so ext4 does not start
// its writeback at the rename).
func (s *treeSuite) deletedLongExpire(t *testing.T) {
	t.Parallel()
	tree := s.dir(t, "deleted-long-expire")
	fan := s.backend == "fanotify"
	var doomed []string
	for i := range 20 {
		if !fan {
			break
		}
		p := filepath.Join(tree, fmt.Sprintf("pre%02d", i))
		writeDirty(t, p, 16<<10)
		doomed = append(doomed, p)
	}
	d := s.start(t, treeOpts{}, treeWatch{path: tree, expire: "1h"})
	for i := range 40 {
		p := filepath.Join(tree, fmt.Sprintf("f%02d", i))
		writeDirty(t, p, 16<<10)
		doomed = append(doomed, p)
	}
	linked, kept := filepath.Join(tree, "linked"), filepath.Join(tree, "kept")
	writeDirty(t, linked, 16<<10)
	if err := os.Link(linked, kept); err != nil {
		t.Fatal(err)
	}
	saved, tmp := filepath.Join(tree, "saved"), filepath.Join(tree, "saved.tmp")
	writeDirty(t, saved, 16<<10)
	heldPath := filepath.Join(tree, "held")
	held, err := os.OpenFile(heldPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.Write(make([]byte, 16<<10)); err != nil {
		t.Fatal(err)
	}
	files := int64(len(doomed) + 3)
	before := d.waitStats(t, cleanBound, fmt.Sprintf("the %d files are tracked", files), func(s map[string]int64) bool { return tracked(s) >= files })
	mustBeDirty(t, kept)
	heldDirty := func() (uint64, uint64) {
		t.Helper()
		dirty, wb, err := cachestatFd(int(held.Fd()), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return dirty, wb
	}
	if dirty, _ := heldDirty(); dirty == 0 {
		t.Fatalf("precondition: %s should be dirty right after the write", heldPath)
	}
	for _, p := range append(doomed, linked, heldPath) {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	// Written after the deletions: on ext4 it takes the number of a
	// deleted file, whose entry is on its way to the next pass; it is
	// tracked afresh all the same.
	writeDirty(t, tmp, 8<<10)
	if err := os.Rename(tmp, saved); err != nil {
		t.Fatal(err)
	}
	mustBeDirty(t, saved)
	// The held file, deleted and still open: written back early.
	if !poll(cleanBound, func() bool { dirty, wb := heldDirty(); return dirty == 0 && wb == 0 }) {
		dirty, wb := heldDirty()
		t.Fatalf("%s (deleted, held open): dirty=%d writeback=%d %v after its deletion, want clean", heldPath, dirty, wb, cleanBound)
	}
	want := before["inodes_gone"] + int64(len(doomed)) + 1 // and the replaced file
	if fan {
		// Written again, then closed: the close frees it.
		if _, err := held.Write(make([]byte, 8<<10)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // its write reported
		want++
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	left, leftWhat := int64(1), "the saved file"
	if !fan {
		left, leftWhat = 2, "the saved file and the linked one"
	}
	d.waitStats(t, cleanBound, fmt.Sprintf("inodes_gone at least %d and only %s tracked", want, leftWhat), func(s map[string]int64) bool {
		return tracked(s) == left && s["inodes_gone"] >= want
	})
	if dirty, wb, err := cachestat(kept, 0, 0); fan && (err != nil || dirty != 0 || wb != 0) {
		t.Errorf("%s: dirty=%d writeback=%d err=%v after its other name's deletion, want clean", kept, dirty, wb, err)
	}
	mustBeDirty(t, saved)
	d.mustRun(t)
}

// TestReloadRetiresDevice: a reload that takes out the last tree on a
// filesystem writes its dirty files back once more, then retires the
// device: its stats directory goes, and `flusherd status` no longer
// lists it. The device of the tree that stays is kept, as is one whose
// tree a reload replaces (a changed expire).
func TestReloadRetiresDevice(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon reloaded without the tree of a loop-mounted ext4")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	mntA, treeA := mountTree(t, "ext4")
	mntB, treeB := mountTree(t, "ext4")
	conf := func(expireB string, trees ...string) string {
		c := "[writeback]\ndirty_writeback_interval = \"200ms\"\n"
		for _, tr := range trees {
			expire := "1s"
			if tr == treeB {
				expire = expireB
			}
			c += fmt.Sprintf("[[watch]]\npath = %q\nexpire = %q\n", tr, expire)
		}
		return c
	}
	d := startDaemon(t, conf("1s", treeA, treeB))
	for _, tr := range []string{treeA, treeB} {
		writeDirty(t, filepath.Join(tr, "first"), 64<<10)
	}
	waitAllClean(t, 5*time.Second, filepath.Join(treeA, "first"), filepath.Join(treeB, "first"))
	for _, m := range []*testfs.FS{mntA, mntB} {
		if _, err := os.Stat(d.devStats(m.MajMin)); err != nil {
			t.Fatalf("device %s: %v", m.MajMin, err)
		}
	}
	// A file still dirty when the reload takes its tree out: written
	// back once more, then the device goes.
	d.reload(t, conf("1h", treeA, treeB))
	if !poll(5*time.Second, func() bool { return strings.Count(d.log.String(), "configuration reloaded") == 1 }) {
		t.Fatalf("the first reload did not complete:\n%s", d.log.String())
	}
	last := filepath.Join(treeB, "last")
	writeDirty(t, last, 64<<10)
	if !poll(5*time.Second, func() bool { return strings.Contains(dirtyList(t, d), last) }) {
		t.Fatalf("%s is not tracked:\n%s", last, dirtyList(t, d))
	}
	d.reload(t, conf("1h", treeA))
	waitAllClean(t, 5*time.Second, last)
	statusDevs := func() string {
		var out, errb bytes.Buffer
		if code := Main([]string{"status", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
			t.Fatalf("flusherd status: exit %d: %s", code, errb.String())
		}
		return out.String()
	}
	gone := func() bool {
		_, err := os.Stat(filepath.Dir(d.devStats(mntB.MajMin)))
		return os.IsNotExist(err) && !strings.Contains(statusDevs(), mntB.MajMin+" ")
	}
	if !poll(5*time.Second, gone) {
		t.Fatalf("device %s of the tree the reload took out is still there:\n%s\nlog:\n%s", mntB.MajMin, statusDevs(), d.log.String())
	}
	if _, err := os.Stat(d.devStats(mntA.MajMin)); err != nil {
		t.Errorf("the device of the tree that stays: %v", err)
	}
	if !strings.Contains(statusDevs(), mntA.MajMin+" ") {
		t.Errorf("status no longer lists %s, whose tree stays:\n%s", mntA.MajMin, statusDevs())
	}
	// The filesystem served again: a new device, which writes.
	d.reload(t, conf("1s", treeA, treeB))
	again := filepath.Join(treeB, "again")
	writeDirty(t, again, 64<<10)
	waitAllClean(t, 5*time.Second, again)
	if !poll(3*time.Second, func() bool { return readStats(t, d.devStats(mntB.MajMin))["BdiDirtied"] > 0 }) {
		t.Errorf("device %s, served again, has no stats of its writeback", mntB.MajMin)
	}
}
