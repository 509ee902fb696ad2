package watch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
	"flusherd/tree"
)

// keySink records the keys and paths reported.
type keySink struct {
	sink
	keys map[inode.Key]string
}

func (s *keySink) MarkInodeDirty(path string, key inode.Key, h inode.Handle, t tree.Tree) error {
	s.mu.Lock()
	s.keys[key] = path
	s.mu.Unlock()
	return s.sink.MarkInodeDirty(path, key, h, t)
}

func newScanner(t *testing.T, root string, s partialSink, open inode.Opener) *base {
	t.Helper()
	b := &base{}
	b.init([]tree.Tree{{Root: root, Recursive: true}}, sinkOf(s), Options{Opener: open})
	return b
}

func keyOf(t *testing.T, p string) inode.Key {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return inode.Key{Dev: st.Dev, Ino: st.Ino}
}

// TestScanStaysInsideTree swaps a directory of the tree with a symlink to
// a directory outside it (renameat2 RENAME_EXCHANGE) while the tree is
// scanned over and over: no scan may list, stat or report anything of the
// outside directory, and the directory's own file must still be found.
func TestScanStaysInsideTree(t *testing.T) {
	base := t.TempDir()
	dir, outside := filepath.Join(base, "tree"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(dir, "x"), filepath.Join(outside, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(dir, "x", "inside"), filepath.Join(outside, "secret"), filepath.Join(outside, "sub", "deep")} {
		if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "y")); err != nil {
		t.Fatal(err)
	}
	secret, deep := keyOf(t, filepath.Join(outside, "secret")), keyOf(t, filepath.Join(outside, "sub", "deep"))
	inside := keyOf(t, filepath.Join(dir, "x", "inside"))

	ks := &keySink{sink: sink{seen: map[string]int{}}, keys: map[inode.Key]string{}}
	b := newScanner(t, dir, ks, inode.OS{})
	var dirs sync.Map
	stopSwaps := testfs.Exchange(t, 0, 1, [2]string{filepath.Join(dir, "x"), filepath.Join(dir, "y")})
	for range 2000 {
		b.scanDir(context.Background(), tree.Tree{Root: dir, Recursive: true}, dir, false, func(p string, _ int) { dirs.Store(p, true) })
	}
	swaps := stopSwaps()
	if swaps < 100 {
		t.Fatalf("only %d swaps during the scans: the race was not exercised", swaps)
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	for _, k := range []inode.Key{secret, deep} {
		if p, ok := ks.keys[k]; ok {
			t.Errorf("a file outside the tree was reported as %q", p)
		}
	}
	dirs.Range(func(k, _ any) bool {
		if strings.HasSuffix(k.(string), "/sub") {
			t.Errorf("the outside directory's subdirectory was walked as %q", k)
		}
		return true
	})
	if _, ok := ks.keys[inside]; !ok {
		t.Error("the tree's own file was never found")
	}
	t.Logf("%d swaps during 2000 scans; %d keys reported", swaps, len(ks.keys))
}

// failOpener opens nothing: every Open fails with err.
type failOpener struct{ err error }

func (o failOpener) Open(string, inode.Key) (inode.File, error) { return nil, o.err }

// TestScanUnknownIsTracked: a file whose dirtiness cannot be checked for
// want of a resource, or for an I/O error, is tracked (the writeback
// attempt decides); a file that is gone, or that the daemon may not open
// at all, is not.
func TestScanUnknownIsTracked(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{unix.EMFILE, true},
		{unix.ENFILE, true},
		{unix.ENOMEM, true},
		{unix.EIO, true},
		{unix.EACCES, false}, // the daemon may never open it: not served
		{unix.EPERM, false},
		{unix.ENOENT, false},
		{unix.ESTALE, false},
		{inode.ErrNotRegular, false},
	} {
		s := &sink{seen: map[string]int{}}
		b := newScanner(t, root, s, failOpener{&os.PathError{Op: "open", Path: p, Err: c.err}})
		b.retry.min, b.retry.max = time.Hour, time.Hour // no rescan while the test runs
		b.scanDir(context.Background(), tree.Tree{Root: root, Recursive: true}, root, true, nil)
		if got := s.has(p); got != c.want {
			t.Errorf("open fails with %v: tracked = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestScanRetriedAfterShortage: a directory that cannot be opened for
// want of descriptors makes the scan incomplete; rescans follow, with
// backoff, until one completes, and then the file below it is tracked and
// the backoff is reset. The rescans' timers run on synctest's virtual
// clock, so the test does not depend on the machine's speed.
func TestScanRetriedAfterShortage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		root := t.TempDir()
		p := deepFile(t, root)
		s := &sink{seen: map[string]int{}}
		b := newScanner(t, root, s, failOpener{unix.EMFILE})
		b.retry.min, b.retry.max = 20*time.Millisecond, 80*time.Millisecond

		// Hold the descriptor limit at what is open now: the walk cannot
		// open the root's subdirectories.
		restore := holdFDLimit(t)
		b.scanDir(context.Background(), tree.Tree{Root: root, Recursive: true}, root, true, nil)
		first := s.has(p)
		failures := b.retry.failures.Load()
		// Rescans run at 20, 60 and 140 ms (the delay doubles up to max);
		// the first two fail while the limit holds.
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		stillFailing := b.retry.failures.Load()
		restore()
		if first {
			t.Fatal("the file was found although its directory could not be opened: the shortage was not exercised")
		}
		if failures == 0 {
			t.Fatal("the incomplete scan was not noted")
		}
		if stillFailing < failures+2 {
			t.Errorf("rescans did not run while the shortage lasted (failures %d, then %d; want 2 more)", failures, stillFailing)
		}
		if !b.retry.due.Load() {
			t.Error("no rescan is scheduled while the scans are incomplete")
		}

		// The third rescan, at 140 ms, completes.
		time.Sleep(b.retry.max)
		synctest.Wait()
		if !s.has(p) {
			t.Fatal("the file below the unreadable directory was not tracked after the limit was restored")
		}
		if got := b.retry.failures.Load(); got != stillFailing {
			t.Errorf("a rescan failed after the limit was restored (failures %d, then %d)", stillFailing, got)
		}
		if b.retry.due.Load() {
			t.Error("a rescan is still scheduled after one completed")
		}
		if d := b.retry.delay.Load(); d != 0 {
			t.Errorf("backoff not reset after a complete rescan: next delay %s", time.Duration(d))
		}
	})
}

// TestTreeOfDeepest: a path in nested trees belongs to the deepest one (its
// expire and mode apply), a non-recursive tree holds only its own entries,
// and a removed tree holds nothing.
func TestTreeOfDeepest(t *testing.T) {
	b := &base{}
	outer := tree.Tree{Root: "/a", Recursive: true, Expire: time.Second}
	inner := tree.Tree{Root: "/a/b", Recursive: true, Expire: time.Minute, Mode: tree.ModeIntegrity}
	flat := tree.Tree{Root: "/c", Recursive: false, Expire: time.Hour}
	b.init([]tree.Tree{outer, inner, flat}, sinkOf(&sink{seen: map[string]int{}}), Options{})
	for _, c := range []struct {
		path string
		want tree.Tree
		ok   bool
	}{
		{"/a/f", outer, true},
		{"/a/b/f", inner, true},
		{"/a/b/c/d/f", inner, true},
		{"/a/bb/f", outer, true}, // a sibling with a common prefix
		{"/c/f", flat, true},
		{"/c/d/f", tree.Tree{}, false}, // below a non-recursive tree
		{"/x/f", tree.Tree{}, false},
	} {
		got, ok := b.TreeOf(c.path)
		if ok != c.ok || got != c.want {
			t.Errorf("TreeOf(%q) = %+v, %v; want %+v, %v", c.path, got, ok, c.want, c.ok)
		}
	}
}

// TestSettle: a rescan scheduled by an incomplete scan (here: the
// descriptor limit held at what is open) is run at once by Settle (as the
// shutdown does), not after its delay (an hour here): while the shortage
// lasts Settle reports ErrUnsettled and the file is not found; once it is
// over Settle finds the file and reports nil.
func TestSettle(t *testing.T) {
	root := t.TempDir()
	p := deepFile(t, root)
	s := &sink{seen: map[string]int{}}
	b := newScanner(t, root, s, failOpener{unix.EMFILE})
	b.retry.min, b.retry.max = time.Hour, time.Hour
	if err := b.Settle(context.Background()); err != nil {
		t.Fatalf("Settle with nothing due: %v", err)
	}
	restore := holdFDLimit(t)
	b.scanDir(context.Background(), tree.Tree{Root: root, Recursive: true}, root, true, nil)
	if s.has(p) || !b.retry.due.Load() {
		t.Fatalf("the shortage was not exercised: found %v, rescan due %v", s.has(p), b.retry.due.Load())
	}
	if err := b.Settle(context.Background()); !errors.Is(err, ErrUnsettled) {
		t.Errorf("Settle while the shortage lasts: %v, want ErrUnsettled", err)
	}
	restore()
	if err := b.Settle(context.Background()); err != nil {
		t.Errorf("Settle after the shortage: %v", err)
	}
	if !s.has(p) {
		t.Error("Settle did not find the file its rescan was for")
	}
	if b.retry.due.Load() {
		t.Error("a rescan is still due after Settle completed one")
	}
}

// holdFDLimit sets this process's descriptor limit to one above what is
// open now (ReadDir's own descriptor is listed): a walk opens the root and
// one directory below it, and no more. The returned function restores the
// limit (also at cleanup; once).
func holdFDLimit(t *testing.T) (restore func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// The lowest free descriptor number (dup returns it), so that the
	// limit leaves exactly one free below it: a count of the open ones
	// would leave more wherever earlier tests closed descriptors below
	// ones still open (in a second run of the package, -count=2).
	low, err := unix.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(low)
	lim := old
	lim.Cur = uint64(low + 1)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore = func() {
		if !restored {
			restored = true
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(restore)
	return restore
}

// deepFile writes a dirty file at root/a/b/c/f, three directories down
// (below what holdFDLimit lets a walk open), and returns its path.
func deepFile(t *testing.T, root string) string {
	t.Helper()
	deep := filepath.Join(root, "a", "b", "c")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(deep, "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestScanDeepTree: a chain of 5,000 nested directories (twice as deep as
// a path of PATH_MAX allows) is scanned without recursion: the daemon
// neither overflows its stack, nor goes beyond PATH_MAX, nor holds a
// descriptor per level (a hard RLIMIT_NOFILE of 1,024 must not stop a
// scan of a legal depth). Files up to PATH_MAX are reported; those beyond
// are not, and that is logged once. Every descriptor the walk opened is
// closed.
func TestScanDeepTree(t *testing.T) {
	testfs.SkipShort(t, "makes and scans 5,000 nested directories")
	root := t.TempDir()
	const depth = 5000
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Made relative to each level's descriptor: the paths pass PATH_MAX.
	files := map[int]inode.Key{}
	path := root
	for i := range depth {
		if i == 10 || i == 1500 || i == 4000 {
			ffd, err := unix.Openat(fd, "f", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			unix.Fstat(ffd, &st)
			unix.Close(ffd)
			files[i] = inode.Key{Dev: st.Dev, Ino: st.Ino}
		}
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		cfd, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = cfd
		path += "/d"
	}
	unix.Close(fd)
	fdsBefore := openFDs(t)

	core, logs := observer.New(zap.WarnLevel)
	ks := &keySink{sink: sink{seen: map[string]int{}}, keys: map[inode.Key]string{}}
	b := &base{}
	b.init([]tree.Tree{{Root: root, Recursive: true}}, sinkOf(ks), Options{Opener: inode.OS{}, Log: zap.New(core)})
	var dirs atomic.Int64
	maxFDs := 0
	b.scanDir(context.Background(), b.list()[0].Tree, root, false, func(string, int) {
		if dirs.Add(1)%50 == 0 {
			maxFDs = max(maxFDs, openFDs(t))
		}
	})

	for _, i := range []int{10, 1500} {
		if _, ok := ks.keys[files[i]]; !ok {
			t.Errorf("the file at depth %d (path %d bytes) was not reported", i, len(root)+2*i+2)
		}
	}
	if p, ok := ks.keys[files[4000]]; ok {
		t.Errorf("the file at depth 4000, beyond PATH_MAX, was reported as %d bytes of path", len(p))
	}
	if n := dirs.Load(); n < 1500 || n > unix.PathMax/2 {
		t.Errorf("%d directories entered; want those whose path is under PATH_MAX (about %d)", n, (unix.PathMax-len(root))/2)
	}
	if n := logs.FilterMessageSnippet("longer than PATH_MAX").Len(); n != 1 {
		t.Errorf("%d warnings about PATH_MAX, want 1: %v", n, logs.All())
	}
	// The walk holds the descriptors of its first heldLevels levels and of
	// one level in heldLevels below (about 31 at 2,000), plus a few.
	if held := maxFDs - fdsBefore; held > heldLevels+40 {
		t.Errorf("the walk held %d descriptors at once; want at most about %d", held, heldLevels+32)
	}
	if after := openFDs(t); after != fdsBefore {
		t.Errorf("%d descriptors open after the walk, %d before", after, fdsBefore)
	}
}

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestLogOverflowThrottled: a burst of queue overflows gives one warning;
// the next, once overflowLogEvery has passed, counts those in between.
func TestLogOverflowThrottled(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	b := &base{}
	b.init(nil, sinkOf(&sink{seen: map[string]int{}}), Options{Log: zap.New(core)})
	for range 17 {
		b.logOverflow("inotify")
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d warnings for a burst of 17 overflows, want 1", n)
	}
	b.rmu.Lock()
	b.overflowLogged = b.overflowLogged.Add(-overflowLogEvery)
	b.rmu.Unlock()
	b.logOverflow("inotify")
	all := logs.All()
	if len(all) != 2 || all[1].ContextMap()["overflows"] != int64(17) {
		t.Errorf("second warning: %v, want one counting the 16 held back and this one (17)", all)
	}
}

// TestRescanSkipsTrackedEntries: a scan for dirty files looks at a file
// tracked already under its name by its directory entry's inode number
// alone, with no fstatat, on the filesystems whose entries carry it (ext4,
// xfs); a file whose number is tracked under another name, and an
// untracked one, are looked at and reported when dirty. On FUSE, where
// the server chooses d_ino, every entry is looked at.
func TestRescanSkipsTrackedEntries(t *testing.T) {
	for _, fsType := range []string{"ext4", "xfs", "fuse"} {
		t.Run(fsType, func(t *testing.T) {
			var root string
			direct := true
			if fsType == "fuse" {
				root, direct = faultfs.MountT(t).Dir, false
			} else {
				root = testfs.Mount(t, testfs.Options{Type: fsType}).Dir
			}
			s := &trackedSink{sink: sink{seen: map[string]int{}}, names: map[inode.Key]string{}}
			const n = 20
			for _, d := range []string{root, filepath.Join(root, "a")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					p := filepath.Join(d, fmt.Sprintf("f%d", i))
					if err := os.WriteFile(p, []byte("dirty"), 0o644); err != nil {
						t.Fatal(err)
					}
					s.names[keyOf(t, p)] = p
				}
			}
			// Untracked and dirty; and one whose number is tracked under
			// another name (a hard link made after it was tracked).
			// Both are written through descriptors held open until the
			// end: FUSE writes a file's cached pages back when it is
			// closed.
			untracked := filepath.Join(root, "a", "new")
			link := filepath.Join(root, "link")
			if err := os.Link(filepath.Join(root, "f0"), link); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{untracked, link} {
				f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				if _, err := f.Write([]byte("dirty again")); err != nil {
					t.Fatal(err)
				}
			}
			b := newScanner(t, root, s, inode.OS{})
			b.scanDir(context.Background(), tree.Tree{Root: root, Recursive: true}, root, true, nil)

			// (On FUSE the scan's own open writes the file's cached
			// pages back: without FOPEN_KEEP_CACHE, fuse_open
			// invalidates the page cache. Found clean, it is not
			// reported.)
			for _, p := range []string{untracked, link} {
				if fsType != "fuse" && !s.has(p) {
					t.Errorf("%s (dirty, not tracked under that name) was not reported", p)
				}
			}
			for _, p := range s.names {
				if s.has(p) {
					t.Errorf("%s, tracked already, was reported again", p)
				}
			}
			want := uint64(2*n + 2) // every regular file
			if direct {
				want = 2 // the two not tracked under their names
			}
			if got := b.entriesStatted.Load(); got != want {
				t.Errorf("entries looked at with fstatat: %d, want %d", got, want)
			}
		})
	}
}

// TestRescanBindMountedFile: a file bind-mounted over an entry of a tree
// hides the file the entry names, whose number the entry still carries.
// A scan looks at the mount point with fstatat and reports the mounted
// file even though the hidden one is tracked under that name; and a file
// mounted while a walk ran is looked at after it (lookAtNewMounts).
func TestRescanBindMountedFile(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4"})
	root, out := filepath.Join(mnt.Dir, "tree"), filepath.Join(mnt.Dir, "out")
	for _, d := range []string{root, out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	entry, mounted := filepath.Join(root, "a"), filepath.Join(out, "m")
	for _, p := range []string{entry, mounted} {
		if err := os.WriteFile(p, []byte("dirty"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hidden := keyOf(t, entry)
	if err := unix.Mount(mounted, entry, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(entry, 0); err != nil {
			t.Errorf("unmounting the bind mount: %v", err)
		}
	})
	if keyOf(t, entry) == hidden {
		t.Fatal("the bind mount did not take")
	}
	tr := tree.Tree{Root: root, Recursive: true}

	s := &trackedSink{sink: sink{seen: map[string]int{}}, names: map[inode.Key]string{hidden: entry}}
	b := newScanner(t, root, s, inode.OS{})
	b.scanDir(context.Background(), tr, root, true, nil)
	if !s.has(entry) {
		t.Error("the file mounted over a tracked entry was not reported by the scan")
	}

	s2 := &trackedSink{sink: sink{seen: map[string]int{}}, names: map[inode.Key]string{hidden: entry}}
	b2 := newScanner(t, root, s2, inode.OS{})
	b2.lookAtNewMounts(tr, root, map[string]bool{})
	if !s2.has(entry) {
		t.Error("a file mounted during a walk was not looked at after it")
	}
}
