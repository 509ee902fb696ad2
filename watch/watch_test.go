package watch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
	"flusherd/tree"
)

type sink struct {
	mu   sync.Mutex
	seen map[string]int
}

func (s *sink) MarkInodeDirty(path string, key inode.Key, _ inode.Handle, t tree.Tree) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[path]++
	return nil
}

func (s *sink) Tracks(inode.Key, string) bool                               { return false }
func (s *sink) Rescanned(dev uint64)                                        {}
func (s *sink) TreeGone(root string, dev uint64, lastOnDev, unmounted bool) {}

func (s *sink) has(path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[path] > 0
}

// backends are the watch backends the tests run on: "fanotify-by-name" is
// fanotify without FAN_REPORT_TARGET_FID (a file made or moved in is
// looked up by name, as on kernels before 5.17).
var backends = []string{"inotify", "fanotify", "fanotify-by-name"}

func start(t *testing.T, root, backend string) (Backend, *sink) {
	t.Helper()
	s := &sink{seen: map[string]int{}}
	return startWith(t, root, backend, s), s
}

// startWith starts a backend on one recursive tree at root, reporting to
// s, and stops it when the test ends.
func startWith(t *testing.T, root, backend string, s partialSink) Backend {
	t.Helper()
	return startTrees(t, []tree.Tree{{Root: root, Recursive: true}}, backend, s)
}

// startTrees is startWith for any trees.
func startTrees(t *testing.T, trees []tree.Tree, backend string, s partialSink) Backend {
	t.Helper()
	return startOpts(t, trees, s, Options{Backend: backend})
}

// startOpts is startTrees with options (Opener and Handles are set to a
// new inode.Handles).
func startOpts(t *testing.T, trees []tree.Tree, s partialSink, opt Options) Backend {
	t.Helper()
	testfs.HoldWatchers(t) // see testfs.ExcludeWatchers
	if opt.Backend == "fanotify-by-name" {
		opt.Backend, opt.noTargetFID = "fanotify", true
	}
	if opt.Backend == "fanotify" && os.Geteuid() != 0 {
		t.Skip("fanotify needs root")
	}
	h := inode.NewHandles()
	t.Cleanup(h.Close)
	opt.Opener, opt.Handles = h, h
	w, err := New(trees, sinkOf(s), opt)
	if err != nil {
		t.Fatal(err)
	}
	if fa, ok := w.(*Fanotify); ok && !opt.noTargetFID && kernelAtLeast(t, 5, 17) && !fa.targetFID {
		t.Error("fanotify without FAN_REPORT_TARGET_FID on a kernel that has it")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); w.Close(); <-done })
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	testwait.For(t, what, 10*time.Second, ok)
}

// TestNewSubdirectoryRace: files written in directories made after the
// watch started, before their own watch could be added, are still seen
// (the new directory is scanned after its watch is added).
func TestNewSubdirectoryRace(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { testNewSubdirectoryRace(t, b) })
	}
}

func testNewSubdirectoryRace(t *testing.T, backend string) {
	root := t.TempDir()
	_, s := start(t, root, backend)
	var files []string
	for i := range 20 {
		dir := filepath.Join(root, "a", string(rune('a'+i)), "deep")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	for _, p := range files {
		eventually(t, p, func() bool { return s.has(p) })
	}
	// And later writes in those directories come as events.
	late := filepath.Join(root, "a", "b", "deep", "late")
	if err := os.WriteFile(late, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, late, func() bool { return s.has(late) })
}

// TestStartupScanAndSpecialFiles: the start-up scan reports files with
// dirty pages only, and never a FIFO or a symlink.
func TestStartupScanAndSpecialFiles(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { testStartupScanAndSpecialFiles(t, b) })
	}
}

func testStartupScanAndSpecialFiles(t *testing.T, backend string) {
	root := t.TempDir()
	dirty := filepath.Join(root, "dirty")
	if err := os.WriteFile(dirty, make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	clean := filepath.Join(root, "clean")
	if err := os.WriteFile(clean, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(clean)
	unix.Fsync(int(f.Fd()))
	f.Close()
	fifo := filepath.Join(root, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(dirty, link); err != nil {
		t.Fatal(err)
	}
	w, s := start(t, root, backend)
	if !s.has(dirty) {
		t.Fatal("the start-up scan did not report the dirty file (if the host's flusher wrote it back first, the machine was under memory pressure)")
	}
	if s.has(clean) {
		t.Errorf("clean file reported by the start-up scan")
	}
	// Writes to the FIFO and a new symlink make events, not reports.
	go func() {
		if f, err := os.OpenFile(fifo, os.O_RDWR, 0); err == nil {
			f.Write([]byte("x"))
			f.Close()
		}
	}()
	os.Symlink(clean, filepath.Join(root, "link2"))
	// A sentinel written after them: events are handled in order, so
	// once it is reported, theirs have been handled too.
	sentinel := filepath.Join(root, "sentinel")
	if err := os.WriteFile(sentinel, []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !testwait.Poll(5*time.Second, func() bool { return s.has(sentinel) }) {
		t.Fatalf("the sentinel written after the FIFO and the symlink was not reported")
	}
	for _, p := range []string{fifo, link, filepath.Join(root, "link2")} {
		if s.has(p) {
			t.Errorf("%s reported", p)
		}
	}
	if w.Counters().Events.Load() == 0 {
		t.Errorf("no events seen at all")
	}
}

// TestRenameInto: a file written outside the tree (same filesystem) and
// renamed into it is reported under its new name.
func TestRenameInto(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			base := t.TempDir()
			root := filepath.Join(base, "tree")
			os.Mkdir(root, 0o755)
			_, s := start(t, root, b)
			out := filepath.Join(base, "outside")
			if err := os.WriteFile(out, []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			in := filepath.Join(root, "in")
			if err := os.Rename(out, in); err != nil {
				t.Fatal(err)
			}
			eventually(t, in, func() bool { return s.has(in) })
		})
	}
}

// TestOddDirectoryName: a directory whose name ends in " (deleted)" (what
// readlink of /proc/self/fd shows for a deleted one) is served like any
// other.
func TestOddDirectoryName(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			root := t.TempDir()
			_, s := start(t, root, b)
			dir := filepath.Join(root, "d (deleted)")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "f")
			if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, p, func() bool { return s.has(p) })
		})
	}
}

// TestFanotifyRunEnds: Close alone ends a running Run (it waits in poll,
// which closing a descriptor would not wake), after which the group is
// closed; a Run started after Close returns at once; a burst of writes
// while Run reads is seen whole.
func TestFanotifyRunEnds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fanotify needs root")
	}
	root := testfs.Mount(t, testfs.Options{Type: "ext4"}).Dir
	s := &sink{seen: map[string]int{}}
	h := inode.NewHandles()
	t.Cleanup(h.Close)
	fa, err := NewFanotify([]tree.Tree{{Root: root, Recursive: true}}, sinkOf(s), Options{Opener: h, Handles: h})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); fa.Run(context.Background()) }()
	if err := fa.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every file of the burst reported", func() bool {
		for i := range n {
			if !s.has(filepath.Join(root, fmt.Sprintf("f%d", i))) {
				return false
			}
		}
		return true
	})
	fd := fa.fd
	if err := fa.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("the fanotify descriptor is still open after Close and Run's end (fcntl: %v)", err)
	}
	if err := fa.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	again := make(chan struct{})
	go func() { defer close(again); fa.Run(context.Background()) }()
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		t.Fatal("Run after Close did not return")
	}
}

// closedSink records MarkInodeClosed apart from MarkInodeDirty.
type closedSink struct {
	sink
	closed map[string]int
}

func (s *closedSink) MarkInodeClosed(path string, key inode.Key, _ inode.Handle, t tree.Tree) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed[path]++
	return nil
}

// TestFanotifyClosedApart: fanotify reports a close that comes alone (its
// write was read before) with MarkInodeClosed, and a write with
// MarkInodeDirty, to a sink that tells them apart (it has
// MarkInodeClosed, which sinkOf hands a batch's closes).
func TestFanotifyClosedApart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fanotify needs root")
	}
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 32})
	// Made before the watch: its creation is no report, so the first
	// report is the write's.
	p := filepath.Join(mnt.Dir, "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &closedSink{sink: sink{seen: map[string]int{}}, closed: map[string]int{}}
	startWith(t, mnt.Dir, "fanotify", s)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the write reported", func() bool { return s.has(p) })
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the close reported", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed[p] > 0
	})
}

// TestSharedFsid: two filesystems with one fsid (ext4 made with the same
// UUID, as a copied image is) cannot both be served by fanotify, whose
// events name a filesystem by fsid: with backend auto the second is served
// by inotify, and writes in both trees are reported under their own paths.
func TestSharedFsid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fanotify needs root")
	}
	uuid := []string{"-U", "6f1e3a52-9b8c-4d7e-a1f0-2c3b4d5e6f70"}
	a := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 32, MkfsArgs: uuid})
	b := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 32, MkfsArgs: uuid})
	var sa, sb unix.Statfs_t
	if err := unix.Statfs(a.Dir, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(b.Dir, &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Fsid != sb.Fsid {
		t.Fatalf("fsids %v and %v differ: the test shows nothing", sa.Fsid, sb.Fsid)
	}
	s := &sink{seen: map[string]int{}}
	w := startTrees(t, []tree.Tree{{Root: a.Dir, Recursive: true}, {Root: b.Dir, Recursive: true}}, "auto", s)
	backends := map[string]string{}
	for _, u := range w.Trees() {
		backends[u.Root] = u.Backend
	}
	if backends[a.Dir] != "fanotify" || backends[b.Dir] != "inotify" {
		t.Errorf("backends %v, want the first fanotify and the second inotify", backends)
	}
	pa, pb := filepath.Join(a.Dir, "f"), filepath.Join(b.Dir, "f")
	for _, p := range []string{pa, pb} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both writes reported", func() bool { return s.has(pa) && s.has(pb) })
}

// keyTrackerSink tracks one inode (under another name).
type keyTrackerSink struct {
	sink
	key inode.Key
}

func (s *keyTrackerSink) TracksKey(key inode.Key) bool { return key == s.key }

// TestMovedDirReportsTrackedFiles: a directory renamed within the trees
// (fanotify reports the rename, and its files are scanned) has a file
// that is tracked under its old name reported under the new one even when
// it is clean, so that the tree it moved to reaches it (an integrity
// tree, while an attempt in another mode was in flight); a clean file
// that is not tracked is not reported.
func TestMovedDirReportsTrackedFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fanotify needs root")
	}
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 32})
	src, dst := filepath.Join(mnt.Dir, "a", "d"), filepath.Join(mnt.Dir, "b")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	tracked, other := filepath.Join(src, "tracked"), filepath.Join(src, "other")
	for _, p := range []string{tracked, other} {
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Write([]byte("x"))
		if err == nil {
			err = f.Sync() // clean (this file only: other tests' files stay as they are)
		}
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	key, _, err := inode.Stat(tracked)
	if err != nil {
		t.Fatal(err)
	}
	s := &keyTrackerSink{sink: sink{seen: map[string]int{}}, key: key}
	startWith(t, mnt.Dir, "fanotify", s)
	if err := os.Rename(src, filepath.Join(dst, "d")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the tracked file reported under its new name", func() bool { return s.has(filepath.Join(dst, "d", "tracked")) })
	if s.has(filepath.Join(dst, "d", "other")) {
		t.Errorf("a clean file that is not tracked was reported")
	}
}

// treeSink records the expire of the tree each path was reported under.
type treeSink struct {
	sink
	expire map[string]time.Duration
}

func (s *treeSink) MarkInodeDirty(path string, key inode.Key, h inode.Handle, t tree.Tree) error {
	s.mu.Lock()
	s.expire[path] = t.Expire
	s.mu.Unlock()
	return s.sink.MarkInodeDirty(path, key, h, t)
}

func (s *treeSink) expireOf(path string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expire[path]
}

// TestNonRecursiveTreeInRecursive: a non-recursive tree nested in a
// recursive one holds the files directly in its root; the directories
// below that root are the outer tree's, and their files are found by the
// start-up scan and reported when written, in directories there before
// the start and made after it, under the outer tree's settings (they were
// walked and watched by no tree).
func TestNonRecursiveTreeInRecursive(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			root := t.TempDir()
			inner := filepath.Join(root, "inner")
			deep := filepath.Join(inner, "deep", "er")
			if err := os.MkdirAll(deep, 0o755); err != nil {
				t.Fatal(err)
			}
			pre, own := filepath.Join(deep, "pre"), filepath.Join(inner, "own")
			for _, p := range []string{pre, own} {
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			s := &treeSink{sink: sink{seen: map[string]int{}}, expire: map[string]time.Duration{}}
			startTrees(t, []tree.Tree{
				{Root: root, Recursive: true, Expire: time.Hour},
				{Root: inner, Recursive: false, Expire: time.Minute},
			}, b, s)
			eventually(t, "the start-up scan's report of "+pre, func() bool { return s.has(pre) })
			eventually(t, "the start-up scan's report of "+own, func() bool { return s.has(own) })
			later := filepath.Join(deep, "later")
			newDir := filepath.Join(inner, "new")
			if err := os.Mkdir(newDir, 0o755); err != nil {
				t.Fatal(err)
			}
			inNew := filepath.Join(newDir, "n")
			for _, p := range []string{later, inNew} {
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the report of "+p, func() bool { return s.has(p) })
			}
			// A write after the directory's watch is in place.
			late := filepath.Join(newDir, "late")
			if err := os.WriteFile(late, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the report of "+late, func() bool { return s.has(late) })
			for p, want := range map[string]time.Duration{pre: time.Hour, later: time.Hour, inNew: time.Hour, late: time.Hour, own: time.Minute} {
				if got := s.expireOf(p); got != want {
					t.Errorf("%s reported under the tree of expire %v, want %v", p, got, want)
				}
			}
		})
	}
}

// goneSink records the roots reported gone.
type goneSink struct {
	sink
	gone []string
}

func (s *goneSink) TreeGone(root string, dev uint64, lastOnDev, unmounted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = append(s.gone, root)
}

func (s *goneSink) isGone(root string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.gone, root)
}

// TestRootParentRenamed: a directory above a tree's root renamed is the
// root gone (reported, logged), not a tree watched on under its old name:
// inotify's watches go on reporting the moved files under the old path,
// where a new directory and file of that name were not in the tree (a
// file there was reported, and opened, in the moved one's place).
func TestRootParentRenamed(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			base := t.TempDir()
			root := filepath.Join(base, "g", "root")
			if err := os.MkdirAll(root, 0o755); err != nil {
				t.Fatal(err)
			}
			s := &goneSink{sink: sink{seen: map[string]int{}}}
			w := startTrees(t, []tree.Tree{{Root: root, Recursive: true}}, b, s)
			a := filepath.Join(root, "a")
			if err := os.WriteFile(a, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the report of "+a, func() bool { return s.has(a) })
			if err := os.Rename(filepath.Join(base, "g"), filepath.Join(base, "g2")); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(root, 0o755); err != nil {
				t.Fatal(err)
			}
			decoy := filepath.Join(root, "d")
			if err := os.WriteFile(decoy, []byte("decoy"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(base, "g2", "root", "d"), []byte("moved"), 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the root reported gone", func() bool { return s.isGone(root) })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			w.Quiesce(ctx)
			if s.has(decoy) {
				t.Errorf("%s, made after the tree moved away, was reported in the tree", decoy)
			}
		})
	}
}

// TestGoneRootInWatchStats: a root removed is marked gone in watch/stats
// without any later event to rewrite it (it was rewritten only by events
// in trees, so a tree gone stayed listed as served).
func TestGoneRootInWatchStats(t *testing.T) {
	testfs.SkipShort(t, "waits for the stats of each backend's removed root")
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			statsDir := t.TempDir()
			startOpts(t, []tree.Tree{{Root: root, Recursive: true}}, &sink{seen: map[string]int{}}, Options{Backend: b, StatsDir: statsDir})
			if err := os.Remove(root); err != nil {
				t.Fatal(err)
			}
			want := strconv.Quote(root) + " gone\n"
			eventually(t, "watch/stats marking the root gone", func() bool {
				text, _ := os.ReadFile(filepath.Join(statsDir, "watch", "stats"))
				return strings.Contains(string(text), want)
			})
		})
	}
}

// TestCoveredBy: an unwatched directory below another unwatched one of
// the same recursive tree is covered by that one's walk; one in another
// tree, below a non-recursive one, or a tree's root is not.
func TestCoveredBy(t *testing.T) {
	rec := tree.Tree{Root: "/t", Recursive: true}
	flat := tree.Tree{Root: "/f"}
	other := tree.Tree{Root: "/t/o", Recursive: true}
	dirs := map[string]tree.Tree{
		"/t": rec, "/t/a": rec, "/t/a/b/c": rec, "/t/x": rec,
		"/f":   flat,
		"/t/o": other, "/t/o/p": other,
	}
	for dir, want := range map[string]bool{
		"/t": false, "/t/a": true, "/t/a/b/c": true, "/t/x": true,
		"/f":   false,
		"/t/o": false, "/t/o/p": true,
	} {
		if got := coveredBy(dirs, dir); got != want {
			t.Errorf("coveredBy(%s) = %v, want %v", dir, got, want)
		}
	}
	delete(dirs, "/t")
	if coveredBy(dirs, "/t/a") || !coveredBy(dirs, "/t/a/b/c") {
		t.Errorf("without the root: /t/a covered %v (want false), /t/a/b/c %v (want true)", coveredBy(dirs, "/t/a"), coveredBy(dirs, "/t/a/b/c"))
	}
}

// kernelAtLeast reports whether the running kernel's release is at least
// major.minor (uname(2)).
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", unix.ByteSliceToString(u.Release[:]), err)
	}
	return ma > major || (ma == major && mi >= minor)
}

// nameUnlinkSink records the reports and the deletions told, by name
// (Sink.NameUnlinked) or by handle (Sink.InodeUnlinked, without a path),
// in order.
type nameUnlinkSink struct {
	sink
	log []string
}

func (s *nameUnlinkSink) MarkInodeDirty(path string, key inode.Key, h inode.Handle, t tree.Tree) error {
	s.mu.Lock()
	s.log = append(s.log, fmt.Sprintf("mark %s %d", path, key.Ino))
	s.mu.Unlock()
	return s.sink.MarkInodeDirty(path, key, h, t)
}

func (s *nameUnlinkSink) NameUnlinked(key inode.Key, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, unlinkEntry(key, path))
}

func (s *nameUnlinkSink) InodeUnlinked(key inode.Key, _ inode.Handle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, unlinkEntry(key, ""))
}

func (s *nameUnlinkSink) entries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// unlinks returns the deletions told, in order.
func (s *nameUnlinkSink) unlinks() []string {
	var got []string
	for _, e := range s.entries() {
		if strings.HasPrefix(e, "unlinked ") {
			got = append(got, e)
		}
	}
	return got
}

// unlinkEntry is the log entry of the deletion of key's name path.
func unlinkEntry(key inode.Key, path string) string {
	return fmt.Sprintf("unlinked %d:%d %s", key.Dev, key.Ino, path)
}

// removeFiles removes the files paths and returns the log entries of
// their deletions (unlinkEntry), in order.
func removeFiles(t *testing.T, paths ...string) []string {
	t.Helper()
	var entries []string
	for _, p := range paths {
		k := keyOf(t, p)
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, unlinkEntry(k, p))
	}
	return entries
}

// expectUnlinks waits for as many deletions as want holds, quiesces w and
// checks that the deletions told are want, in order.
func expectUnlinks(t *testing.T, w Backend, s *nameUnlinkSink, want []string) {
	t.Helper()
	eventually(t, "the deletions", func() bool { return len(s.unlinks()) >= len(want) })
	w.Quiesce(context.Background())
	if got := s.unlinks(); !slices.Equal(got, want) {
		t.Errorf("deletions told %q, want %q", got, want)
	}
}

// TestInotifyNameUnlinked: with inotify, the deletion of a file's name
// (IN_DELETE) is told to the sink with the key the file had under that
// name, after the file's reports: a file written and deleted, a file made
// and deleted unwritten, one name of a file with two, a file replaced by a
// rename over its name (at the rename), and the file that replaced it (at
// its deletion); a file renamed away is not told of (it still exists). A
// directory made meanwhile does not make the reader forget the names.
func TestInotifyNameUnlinked(t *testing.T) {
	root := t.TempDir()
	s := &nameUnlinkSink{sink: sink{seen: map[string]int{}}}
	w := startWith(t, root, "inotify", s)
	p := func(name string) string { return filepath.Join(root, name) }
	keyOf := func(name string) inode.Key {
		t.Helper()
		k, _, err := inode.Stat(p(name))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name string) {
		t.Helper()
		if err := os.WriteFile(p(name), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("written")
	write("two")
	if err := os.Link(p("two"), p("two-b")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p("made"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	write("moved")
	write("replaced")
	kOrig := keyOf("replaced")
	// The rename over it waits for the report of the file it replaces,
	// whose name it takes.
	eventually(t, "the report of replaced", func() bool { return s.has(p("replaced")) })
	write("new")
	if err := os.Rename(p("new"), p("replaced")); err != nil {
		t.Fatal(err)
	}
	keys := map[string]inode.Key{}
	for _, name := range []string{"written", "two-b", "made", "moved", "replaced"} {
		keys[name] = keyOf(name)
	}
	// Each name is deleted once the event that made it (for "replaced",
	// the rename over it) has been handled.
	eventually(t, "the reports", func() bool {
		marks := map[string]bool{}
		for _, e := range s.entries() {
			marks[e] = true
		}
		for name, k := range keys {
			if !marks[fmt.Sprintf("mark %s %d", p(name), k.Ino)] {
				return false
			}
		}
		return true
	})
	// A directory made elsewhere in the tree leaves the names the
	// reader knows as they are (its files' names are new).
	if err := os.Mkdir(p("newdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("newdir/f")
	eventually(t, "the report of newdir/f", func() bool { return s.has(p("newdir/f")) })
	for _, name := range []string{"written", "two-b", "made", "replaced"} {
		if err := os.Remove(p(name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(p("moved"), filepath.Join(t.TempDir(), "away")); err != nil {
		t.Fatal(err)
	}
	want := []string{unlinkEntry(kOrig, p("replaced"))}
	for _, name := range []string{"written", "two-b", "made", "replaced"} {
		want = append(want, unlinkEntry(keys[name], p(name)))
	}
	expectUnlinks(t, w, s, want)
}

// TestInotifyNameUnlinkedScanned: the files of a directory that appears in
// a tree (here moved in, so that no event named them) are found by its
// scan, and the deletion of their names is told to the sink as a deletion
// of a name the reader saw made would be, with the keys the scan found, so
// that a file written and deleted in a directory made a moment before is
// not listed under its gone name until its expiry.
func TestInotifyNameUnlinkedScanned(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	src := filepath.Join(outside, "d")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{"d/a", "d/sub/b"}
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(outside, name), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := &nameUnlinkSink{sink: sink{seen: map[string]int{}}}
	w := startWith(t, root, "inotify", s)
	if err := os.Rename(src, filepath.Join(root, "d")); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range names {
		p := filepath.Join(root, name)
		eventually(t, "the scan's report of "+name, func() bool { return s.has(p) })
		want = append(want, removeFiles(t, p)...)
	}
	expectUnlinks(t, w, s, want)
}

// TestInotifyRenamedDeleted: files reported below a directory that is
// renamed, and renamed again below, faster than the reader walks the new
// names, then deleted, and files renamed twice and deleted as fast: each
// file's deletion is told to the sink under the name the sink last had it
// by (the looks found some under a name between, or none), not left
// listed under a name that no longer leads to it until its expiry. A
// directory renamed once, its files still in it, and a file renamed once
// tell of no deletion.
func TestInotifyRenamedDeleted(t *testing.T) {
	root := t.TempDir()
	s := &nameUnlinkSink{sink: sink{seen: map[string]int{}}}
	w := startWith(t, root, "inotify", s)
	p := func(name string) string { return filepath.Join(root, name) }
	if err := os.MkdirAll(p("a/b/c"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"kept", "s", "s2"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var files, kept []string
	for i := range 20 {
		files = append(files, p(fmt.Sprintf("a/b/c/f%d", i)), p(fmt.Sprintf("s/g%d", i)))
		kept = append(kept, p(fmt.Sprintf("kept/f%d", i)))
	}
	kept = append(kept, p("s/k"))
	for _, f := range append(slices.Clone(files), kept...) {
		if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	keys := map[inode.Key]bool{}
	for _, f := range files {
		keys[keyOf(t, f)] = true
		eventually(t, "the report of "+f, func() bool { return s.has(f) })
	}
	for _, f := range kept {
		eventually(t, "the report of "+f, func() bool { return s.has(f) })
	}
	// The scans of the new directories report their files before the
	// reader caches their names (takeScanned); one taken after the
	// renames would be told unlinked under its old name, which the sink
	// no longer lists it by.
	w.Quiesce(context.Background())
	moves := [][2]string{{"kept", "kept2"}, {"s/k", "s/k2"}, {"a", "x"}, {"x/b", "x/y"}, {"x/y/c", "x/z"}, {"x/z", "w"}}
	for i := range 20 {
		moves = append(moves, [2]string{fmt.Sprintf("s/g%d", i), fmt.Sprintf("s/h%d", i)}, [2]string{fmt.Sprintf("s/h%d", i), fmt.Sprintf("s2/g%d", i)})
	}
	for _, mv := range moves {
		if err := os.Rename(p(mv[0]), p(mv[1])); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		for _, f := range []string{fmt.Sprintf("w/f%d", i), fmt.Sprintf("s2/g%d", i)} {
			if err := os.Remove(p(f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// told reports the files whose deletion was told under the name of
	// their last report before it.
	told := func() map[inode.Key]bool {
		last := map[uint64]string{}
		done := map[inode.Key]bool{}
		for _, e := range s.entries() {
			var path string
			var ino uint64
			var k inode.Key
			switch {
			case strings.HasPrefix(e, "mark "):
				fmt.Sscanf(e, "mark %s %d", &path, &ino)
				last[ino] = path
			case strings.HasPrefix(e, "unlinked "):
				fmt.Sscanf(e, "unlinked %d:%d %s", &k.Dev, &k.Ino, &path)
				if keys[k] && last[k.Ino] == path {
					done[k] = true
				}
			}
		}
		return done
	}
	eventually(t, "the deletions told under the names last reported", func() bool { return len(told()) == len(keys) })
	w.Quiesce(context.Background())
	for _, e := range s.unlinks() {
		if strings.Contains(e, "/kept") || strings.Contains(e, "/s/k") {
			t.Errorf("a file renamed once, or one of a directory renamed once, was told deleted: %s", e)
		}
	}
	for _, f := range kept {
		f = strings.Replace(strings.Replace(f, "/kept/", "/kept2/", 1), "/s/k", "/s/k2", 1)
		if !s.has(f) {
			t.Errorf("%s not reported under its new name", f)
		}
	}
}

// TestInotifyNameUnlinkedRescanned: the names of the files a scan running
// beside the event reader leaves tracked are known to the reader, so that
// their deletion is told to the sink: dirty files found by the scan at
// start, and tracked files after a queue overflow, which empties the
// reader's cache (its rescan skips a file tracked under its name, and
// looks at the others with cachestat).
func TestInotifyNameUnlinkedRescanned(t *testing.T) {
	for _, c := range []string{"start", "overflow"} {
		t.Run(c, func(t *testing.T) {
			root := t.TempDir()
			names := []string{"a", "sub/b", "sub/c"}
			paths := make([]string, len(names))
			for i, name := range names {
				paths[i] = filepath.Join(root, name)
			}
			write := func() {
				t.Helper()
				for _, p := range paths {
					if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			s := &trackingUnlinkSink{nameUnlinkSink: nameUnlinkSink{sink: sink{seen: map[string]int{}}}}
			if c == "start" {
				write()
			}
			w := startWith(t, root, "inotify", s)
			if c == "overflow" {
				write()
			}
			for _, p := range paths {
				eventually(t, "the report of "+p, func() bool { return s.has(p) })
			}
			iw := w.(*Watcher)
			// taken waits for the reader to have taken the names the
			// scans noted (a name deleted before then stays unknown).
			taken := func(after uint64) {
				t.Helper()
				eventually(t, "the scan's names taken", func() bool {
					return iw.scannedTaken.Load() > after && !iw.scannedAny.Load()
				})
			}
			if c == "start" {
				taken(0)
			}
			if c == "overflow" {
				// Tracked: "a" under its name, the others not (their
				// rescan looks at them with cachestat).
				s.track(paths[0])
				w.Quiesce(context.Background())
				before := iw.scannedTaken.Load()
				if !iw.w.sendError(errEventOverflow) {
					t.Fatal("the watcher is closed")
				}
				eventually(t, "the overflow's rescan", func() bool {
					return iw.ctr.Rescans.Load() > 0 && !iw.rescanBusy()
				})
				taken(before)
			}
			expectUnlinks(t, w, &s.nameUnlinkSink, removeFiles(t, paths...))
		})
	}
}

// trackingUnlinkSink is a nameUnlinkSink that tracks the file at one
// path (Tracks), once set.
type trackingUnlinkSink struct {
	nameUnlinkSink
	tracked string
}

func (s *trackingUnlinkSink) track(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tracked = path
}

func (s *trackingUnlinkSink) Tracks(_ inode.Key, path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return path == s.tracked
}

// TestWriteThroughRemovedName: a writer holds a file open by a name; the
// file gets a second name in another directory and the first is removed.
// Its writes, which the kernel keeps reporting under the removed name
// (inotify's watch descriptor and name; fanotify's directory and name),
// are reported under the name the file still has, whether or not the
// writer wrote between the link and the removal.
func TestWriteThroughRemovedName(t *testing.T) {
	for _, b := range []string{"inotify", "fanotify"} {
		for _, between := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/between=%v", b, between), func(t *testing.T) { testWriteThroughRemovedName(t, b, between) })
		}
	}
}

func testWriteThroughRemovedName(t *testing.T, backend string, between bool) {
	root := t.TempDir()
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := &nameUnlinkSink{sink: sink{seen: map[string]int{}}}
	w := startWith(t, root, backend, s)
	a, b := filepath.Join(root, "a", "A"), filepath.Join(root, "b", "B")
	f, err := os.OpenFile(a, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(what string) {
		t.Helper()
		if _, err := f.Write([]byte(what)); err != nil {
			t.Fatal(err)
		}
	}
	write("before")
	k, _, err := inode.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	markA, markB := fmt.Sprintf("mark %s %d", a, k.Ino), fmt.Sprintf("mark %s %d", b, k.Ino)
	eventually(t, "the report of a/A", func() bool { return slices.Contains(s.entries(), markA) })
	if err := os.Link(a, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the report of b/B", func() bool { return slices.Contains(s.entries(), markB) })
	if between {
		n := len(s.entries())
		write("between")
		eventually(t, "the write between reported under a/A", func() bool { return slices.Contains(s.entries()[n:], markA) })
	}
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	unlinked := unlinkEntry(k, a)
	if backend == "fanotify" {
		unlinked = unlinkEntry(k, "") // (told by handle)
	}
	eventually(t, "the removal of a/A", func() bool { return slices.Contains(s.entries(), unlinked) })
	write("after")
	after := func() bool {
		log := s.entries()
		i := slices.Index(log, unlinked)
		return i >= 0 && slices.Contains(log[i+1:], markB)
	}
	eventually(t, "the write after the removal reported under b/B", after)
	w.Quiesce(context.Background())
	log := s.entries()
	for _, e := range log[slices.Index(log, unlinked)+1:] {
		if strings.HasPrefix(e, "mark "+a+" ") {
			t.Errorf("a write reported under the removed name: %q", e)
		}
	}
}

// TestInotifyTakeScanned: the reader caches a name a scan noted only if
// the cache knows nothing of it, the name was not deleted since (gone),
// and it still leads to the file the scan found; a name that no longer
// does (renamed over, deleted) is told to the sink as unlinked from the
// file the scan found.
func TestInotifyTakeScanned(t *testing.T) {
	root := t.TempDir()
	s := &nameUnlinkSink{sink: sink{seen: map[string]int{}}}
	w, err := NewInotify([]tree.Tree{{Root: root, Recursive: true}}, sinkOf(s), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	p := func(name string) string { return filepath.Join(root, name) }
	for _, name := range []string{"same", "replaced", "known", "gone", "other"} {
		if err := os.WriteFile(p(name), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	other := keyOf(t, p("other"))
	cached := inode.Key{Dev: other.Dev, Ino: 1}
	w.cacheKey(p("known"), cached)
	w.gone[p("gone")] = &goneName{key: cached}
	w.noteScanned(p("same"), keyOf(t, p("same")))
	w.noteScanned(p("replaced"), other) // (the scan's look came before a rename over it)
	w.noteScanned(p("known"), keyOf(t, p("known")))
	w.noteScanned(p("gone"), keyOf(t, p("gone")))
	w.noteScanned(p("deleted"), other)
	w.takeScanned()
	want := map[string]inode.Key{p("same"): keyOf(t, p("same")), p("known"): cached}
	if !maps.Equal(w.keys, want) {
		t.Errorf("cache %v, want %v", w.keys, want)
	}
	if w.scannedAny.Load() || len(w.scannedNames) != 0 {
		t.Error("names left after takeScanned")
	}
	if got, want := s.unlinks(), []string{unlinkEntry(other, p("replaced")), unlinkEntry(other, p("deleted"))}; !slices.Equal(got, want) {
		t.Errorf("deletions told %q, want %q", got, want)
	}
}

// TestWriteThroughLostName: a writer holds a file open by a name (a/A) the
// file then loses while it keeps another in the tree; the writer's later
// writes, which the kernel reports under the lost name, are reported under
// the file's live name and under no other, however the name was lost.
func TestWriteThroughLostName(t *testing.T) {
	for _, c := range []struct {
		name  string
		steps []string // shell-like steps, run in the tree
		live  string
	}{
		{"second name removed", []string{"ln a/A b/B", "ln a/A b/C", "rm a/A", "rm b/C"}, "b/B"},
		{"temporary link", []string{"ln a/A b/B", "rm a/A", "ln b/B b/tmp", "rm b/tmp"}, "b/B"},
		{"renamed over", []string{"ln a/A b/B", "mv a/X a/A"}, "b/B"},
		{"made again", []string{"ln a/A b/B", "rm a/A", "new a/A"}, "b/B"},
		{"its directory renamed", []string{"ln a/A b/B", "rm a/A", "mv a c"}, "b/B"},
		{"the live name's directory renamed", []string{"ln a/A b/B", "rm a/A", "mv b d"}, "d/B"},
	} {
		for _, backend := range []string{"inotify", "fanotify"} {
			t.Run(backend+"/"+c.name, func(t *testing.T) { testWriteThroughLostName(t, backend, c.steps, c.live) })
		}
	}
}

func testWriteThroughLostName(t *testing.T, backend string, steps []string, live string) {
	root := t.TempDir()
	p := func(name string) string { return filepath.Join(root, name) }
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(p(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(p("a/X"), []byte("other"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &nameUnlinkSink{sink: sink{seen: map[string]int{}}}
	w := startWith(t, root, backend, s)
	f, err := os.OpenFile(p("a/A"), os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	k := keyOf(t, p("a/A"))
	write := func() {
		t.Helper()
		if _, err := f.Write([]byte("data")); err != nil {
			t.Fatal(err)
		}
	}
	fence := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Fence(ctx); err != nil {
			t.Fatal(err)
		}
	}
	write()
	fence()
	for _, step := range steps {
		var err error
		switch f := strings.Fields(step); f[0] {
		case "ln":
			err = os.Link(p(f[1]), p(f[2]))
		case "rm":
			err = os.Remove(p(f[1]))
		case "mv":
			err = os.Rename(p(f[1]), p(f[2]))
		case "new":
			err = os.WriteFile(p(f[1]), []byte("new"), 0o644)
		}
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		fence()
	}
	n := len(s.entries())
	write()
	fence()
	want := fmt.Sprintf("mark %s %d", p(live), k.Ino)
	got := s.entries()[n:]
	if !slices.Contains(got, want) {
		t.Errorf("the write after %q: reports %q, want %q among them", steps, got, want)
	}
	for _, e := range got {
		if strings.HasPrefix(e, "mark ") && strings.HasSuffix(e, fmt.Sprintf(" %d", k.Ino)) && e != want {
			t.Errorf("the write after %q reported under a name the file does not have: %q", steps, e)
		}
	}
}

// TestInotifyKeyNames: keyNames counts the cached names of each file
// through caching, replacing, dropping and emptying.
func TestInotifyKeyNames(t *testing.T) {
	w, err := NewInotify([]tree.Tree{{Root: t.TempDir(), Recursive: true}}, sinkOf(&sink{seen: map[string]int{}}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	a, b := inode.Key{Dev: 1, Ino: 1}, inode.Key{Dev: 1, Ino: 2}
	check := func(when string) {
		t.Helper()
		want := map[inode.Key]int32{}
		for _, k := range w.keys {
			want[k]++
		}
		if !maps.Equal(w.keyNames, want) {
			t.Errorf("%s: keyNames %v, want %v", when, w.keyNames, want)
		}
	}
	w.cacheKey("/t/x", a)
	w.cacheKey("/t/y", a)
	w.cacheKey("/t/d/z", b)
	w.cacheKey("/t/y", a)
	check("cached")
	w.cacheKey("/t/y", b)
	check("replaced")
	w.dropKey("/t/x")
	w.dropKey("/t/none")
	check("dropped")
	w.forgetKeysUnder("/t/d")
	check("below a directory")
	w.clearKeys()
	check("emptied")
}

// madeSink records, by path, whether a report said the file's directory
// entry was made (bdi.Mark.Made).
type madeSink struct {
	sink
	made map[string]bool
}

func (s *madeSink) MarkInodesDirty(ms []bdi.Mark) {
	s.mu.Lock()
	for _, m := range ms {
		s.made[m.Path] = s.made[m.Path] || m.Made
		s.seen[m.Path]++
	}
	s.mu.Unlock()
}

func (s *madeSink) wasMade(path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.made[path]
}

// TestInotifyCreateReportedMade: with inotify, a file made (created,
// linked or moved in) is reported as made, so that the registry can tell
// a new file that took the number of a tracked one deleted unseen from
// that one (it takes the new file's handle); a write is not.
func TestInotifyCreateReportedMade(t *testing.T) {
	root := t.TempDir()
	old := filepath.Join(root, "old")
	if err := os.WriteFile(old, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &madeSink{sink: sink{seen: map[string]int{}}, made: map[string]bool{}}
	startWith(t, root, "inotify", s)
	made, linked := filepath.Join(root, "made"), filepath.Join(root, "linked")
	if err := os.WriteFile(made, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(made, linked); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{made, linked, old} {
		eventually(t, "the report of "+p, func() bool { return s.has(p) })
	}
	if !s.wasMade(made) || !s.wasMade(linked) {
		t.Errorf("a file made or linked not reported as made: %v", s.made)
	}
	if s.wasMade(old) {
		t.Error("a write to a file made before reported as made")
	}
}

// TestOnDevice: OnDevice says whether a served tree's root, or a
// filesystem mounted inside a tree and served, is on an st_dev; a tree
// removed no longer counts.
func TestOnDevice(t *testing.T) {
	for _, b := range backends[:2] {
		t.Run(b, func(t *testing.T) {
			root := t.TempDir()
			w, _ := start(t, root, b)
			dev := keyOf(t, root).Dev
			if !w.OnDevice(dev) || w.OnDevice(dev+1) {
				t.Errorf("OnDevice: %v for the root's st_dev, %v for another; want true, false", w.OnDevice(dev), w.OnDevice(dev+1))
			}
			var bs *base
			switch x := w.(type) {
			case *Watcher:
				bs = &x.base
			case *Fanotify:
				bs = &x.base
			default:
				t.Fatalf("backend %T", w)
			}
			bs.mountsMu.Lock()
			if bs.mountsMet == nil {
				bs.mountsMet = map[int]*nestedMount{}
			}
			bs.mountsMet[-1] = &nestedMount{mountpoint: filepath.Join(root, "mnt"), dev: dev + 1}
			bs.mountsMu.Unlock()
			if !w.OnDevice(dev + 1) {
				t.Error("OnDevice is false for a filesystem served inside the tree")
			}
			if !w.RemoveTree(root) {
				t.Fatal("RemoveTree: not removed")
			}
			if w.OnDevice(dev) {
				t.Error("OnDevice is true for the root of a removed tree")
			}
		})
	}
}
