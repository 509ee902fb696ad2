package watch

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

// gateSink is a sink whose batches of reports, once armed, wait in the sink
// until released: a report in flight while a tree is removed.
type gateSink struct {
	nopSink
	mu         sync.Mutex
	paths      []string
	withExpire bool // reports are recorded as "path expire"
	withKeep   bool // batched reports with KeepName are recorded as "path keep"
	armed      bool
	entered    chan struct{} // closed when an armed report entered the sink
	release    chan struct{} // an armed report returns once this is closed
}

func newGateSink() *gateSink {
	return &gateSink{entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *gateSink) wait() {
	s.mu.Lock()
	armed := s.armed
	s.armed = false
	s.mu.Unlock()
	if armed {
		close(s.entered)
		<-s.release
	}
}

func (s *gateSink) record(ps ...string) {
	s.mu.Lock()
	s.paths = append(s.paths, ps...)
	s.mu.Unlock()
}

func (s *gateSink) MarkInodeDirty(path string, _ inode.Key, _ inode.Handle, t tree.Tree) error {
	s.wait()
	s.recordMark(path, t, false)
	return nil
}

func (s *gateSink) MarkInodesDirty(ms []bdi.Mark) {
	s.wait()
	for _, m := range ms {
		if s.withKeep && m.KeepName {
			m.Path += " keep"
		}
		s.recordMark(m.Path, m.Tree, m.Leaving)
	}
}

// recordMark records a report, "path[ expire][ leaving]".
func (s *gateSink) recordMark(path string, t tree.Tree, leaving bool) {
	if s.withExpire {
		path += " " + t.Expire.String()
	}
	if leaving {
		path += " leaving"
	}
	s.record(path)
}

func (s *gateSink) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.paths)
}

// waitsFor runs remove, which must not return before release is called
// (a report in flight in the sink), and must return after.
func waitsFor(t *testing.T, s *gateSink, remove func()) {
	t.Helper()
	<-s.entered
	done := make(chan struct{})
	go func() {
		remove()
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("the tree's removal returned while a report made with it was still on its way to the sink")
	case <-time.After(100 * time.Millisecond):
	}
	close(s.release)
	<-done
}

// twoTreeFanotify is fakeFanotify with trees /srv/a (expire 1m), /srv/b
// (2m) and more, a directory cached in each of the first two, and files
// f0... cached, f<i> in /srv/a/d if i is even and in /srv/b/d if odd; it
// returns one parsed FAN_MODIFY event for each.
func twoTreeFanotify(s partialSink, n int, more ...tree.Tree) (*Fanotify, []event) {
	trees := append([]tree.Tree{{Root: "/srv/a", Recursive: true, Expire: time.Minute},
		{Root: "/srv/b", Recursive: true, Expire: 2 * time.Minute}}, more...)
	fa := fakeFanotify(42, trees, s, Options{})
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	for i, tr := range fa.list()[:2] {
		p := tr.Root + "/d"
		fa.dirs[string(fa.cacheKey(testFsid[:], typ, fmt.Appendf(nil, "dir%d", i)))] = &fanotifyDir{path: p, prefix: p + "/", tree: tr}
	}
	var evs []event
	for i := range n {
		fh := binary.NativeEndian.AppendUint64(nil, uint64(i))
		fa.files[string(fa.cacheKey(testFsid[:], typ, fh))] = &fanotifyTarget{key: inode.Key{Dev: 42, Ino: uint64(i)}, regular: true, handle: inode.MakeHandle(1, fh)}
		var ev event
		_, ok := parseEvent(fanEvent(testFsid, fmt.Appendf(nil, "dir%d", i%2), fh, fmt.Sprintf("f%d", i)), &ev)
		if !ok {
			panic("malformed test event")
		}
		evs = append(evs, ev)
	}
	return fa, evs
}

// TestFanotifyRemovedTreeReports: the reports of a read are handed to the
// sink at the read's end; those made with a tree that a reload removed
// meanwhile go to the tree that holds their files now (a tree around it,
// or the same root with new settings), or, if none does, are made as
// leaving (written once more and forgotten, as the reload does with the
// tree's tracked files), not as files of a tree that is gone. All reach
// the sink in their order. A removal while a batch is in the sink returns
// only once that batch is in.
func TestFanotifyRemovedTreeReports(t *testing.T) {
	ctx := context.Background()
	a, b := "/srv/a/d/f", "/srv/b/d/f"
	for _, c := range []struct {
		name string
		more []tree.Tree // trees beside /srv/a and /srv/b
		add  *tree.Tree  // added after /srv/a is removed
		want []string
	}{
		{"no other tree", nil, nil, []string{a + "0 1m0s leaving", b + "1 2m0s", a + "2 1m0s leaving", b + "3 2m0s", a + "4 1m0s leaving", b + "5 2m0s"}},
		{"a tree around it", []tree.Tree{{Root: "/srv", Recursive: true, Expire: 3 * time.Minute}}, nil,
			[]string{a + "0 3m0s", b + "1 2m0s", a + "2 3m0s", b + "3 2m0s", a + "4 3m0s", b + "5 2m0s"}},
		{"replaced", nil, &tree.Tree{Root: "/srv/a", Recursive: true, Expire: 4 * time.Minute},
			[]string{a + "0 4m0s", b + "1 2m0s", a + "2 4m0s", b + "3 2m0s", a + "4 4m0s", b + "5 2m0s"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newGateSink()
			s.withExpire = true
			fa, evs := twoTreeFanotify(s, 6, c.more...)
			for i := range evs {
				fa.handle(ctx, &evs[i])
			}
			if !fa.RemoveTree("/srv/a") {
				t.Fatal("RemoveTree found no tree at /srv/a")
			}
			if c.add != nil { // (as addTree, without its lstat of the root)
				fa.mu.Lock()
				fa.listTreeLocked(&watchedTree{Tree: *c.add})
				fa.mu.Unlock()
			}
			fa.flushMarks()
			if got := s.got(); !slices.Equal(got, c.want) {
				t.Errorf("reports that reached the sink (path, tree's expire): %q, want %q", got, c.want)
			}
			if len(fa.pending) != 0 || len(fa.pendingTrees) != 0 {
				t.Errorf("%d reports (%d trees) still pending after the flush", len(fa.pending), len(fa.pendingTrees))
			}
		})
	}

	// A batch in the sink when the tree is removed.
	s := newGateSink()
	fa, evs := twoTreeFanotify(s, 4)
	for i := range evs {
		fa.handle(ctx, &evs[i])
	}
	s.armed = true
	flushed := make(chan struct{})
	go func() {
		fa.flushMarks()
		close(flushed)
	}()
	waitsFor(t, s, func() { fa.RemoveTree("/srv/a") })
	<-flushed
	if got := s.got(); len(got) != 4 {
		t.Errorf("the batch in flight delivered %q, want its 4 reports", got)
	}
}

// TestReportRemovedTree: a report by path (a rescan's, or inotify's) made
// with a tree that is no longer served goes to a tree around it if one
// holds the file, else is made as leaving (removed by a reload) or does
// not reach the sink (its root gone), and the tree's end waits for a
// report in the sink; both backends.
func TestReportRemovedTree(t *testing.T) {
	for _, c := range []struct {
		kind, how string
		around    bool // a tree around the root holds the file
	}{
		{"fanotify", "removed", false}, {"inotify", "removed", false}, {"fanotify", "root gone", false}, {"inotify", "root gone", false},
		{"fanotify", "removed", true}, {"inotify", "removed", true},
	} {
		name := c.kind + "/" + c.how
		if c.around {
			name += "/a tree around it"
		}
		t.Run(name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			path := filepath.Join(root, "f")
			key := dirtyFile(t, path)
			tr := tree.Tree{Root: root, Recursive: true, Expire: time.Minute}
			trees := []tree.Tree{tr}
			want := []string{path + " 1m0s"}
			switch {
			case c.around:
				trees = append(trees, tree.Tree{Root: filepath.Dir(root), Recursive: true, Expire: 3 * time.Minute})
				want = append(want, path+" 3m0s")
			case c.how == "removed":
				want = append(want, path+" 1m0s leaving")
			}
			s := newGateSink()
			s.withExpire = true
			var b *base
			var remove func()
			if c.kind == "fanotify" {
				fa := fakeFanotify(key.Dev, trees, s, Options{})
				b, remove = &fa.base, func() { fa.RemoveTree(root) }
			} else {
				w := &Watcher{dirs: map[string]inode.Key{}, unwatched: map[string]tree.Tree{}}
				w.init(trees, sinkOf(s), Options{})
				b, remove = &w.base, func() { w.RemoveTree(root) }
			}
			if err := b.recordRoots(); err != nil {
				t.Fatal(err)
			}
			if c.how == "root gone" {
				remove = func() {
					if err := os.RemoveAll(root); err != nil {
						t.Error(err)
					}
					b.checkRoots()
				}
			}
			b.devWritesBack.Store(key.Dev, true) // (t.TempDir may be on tmpfs)
			s.armed = true
			reported := make(chan struct{})
			go func() {
				b.report(tr, path, key, false)
				close(reported)
			}()
			waitsFor(t, s, remove)
			<-reported
			b.report(tr, path, key, false)
			if got := s.got(); !slices.Equal(got, want) {
				t.Errorf("reports that reached the sink (path, tree's expire): %q, want %q", got, want)
			}
		})
	}
}

// staleNameSink tracks one inode, under a name other than any a test
// reports.
type staleNameSink struct {
	gateSink
	key inode.Key
}

func (s *staleNameSink) TracksKey(key inode.Key) bool { return key == s.key }

// TestScanStaleName: a scan's report of a file tracked under another name
// (a directory moved into the tree) gives it that name only if the name
// is still the file's: a rescan running beside the event reader may hold
// a name read before the file was renamed (the reader has reported the new
// one), or a name that another file has taken since. A scan's report of
// a dirty file it found untracked asks the sink to keep the name of the
// file if it is tracked by then (KeepName).
func TestScanStaleName(t *testing.T) {
	dir := t.TempDir()
	cur, other, fresh := filepath.Join(dir, "new"), filepath.Join(dir, "other"), filepath.Join(dir, "fresh")
	for _, p := range []string{cur, other, fresh} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	key, _, err := inode.Stat(cur)
	if err != nil {
		t.Fatal(err)
	}
	s := &staleNameSink{gateSink: *newGateSink(), key: key}
	tr := tree.Tree{Root: dir, Recursive: true}
	fa := fakeFanotify(key.Dev, []tree.Tree{tr}, s, Options{})
	fa.devWritesBack.Store(key.Dev, true)
	fa.report(tr, filepath.Join(dir, "old"), key, true) // renamed from since
	fa.report(tr, other, key, true)                     // the name is another file's now
	if got := s.got(); len(got) != 0 {
		t.Errorf("stale names reported: %q", got)
	}
	fa.report(tr, cur, key, true)
	if got := s.got(); !slices.Equal(got, []string{cur}) {
		t.Errorf("reports %q, want the file's current name %q", got, cur)
	}
	freshKey, _, err := inode.Stat(fresh)
	if err != nil {
		t.Fatal(err)
	}
	s.withKeep = true
	fa.report(tr, fresh, freshKey, true) // dirty (just written), untracked
	if got, want := s.got(), []string{cur, fresh + " keep"}; !slices.Equal(got, want) {
		t.Errorf("reports %q, want %q", got, want)
	}
}

// TestUnmountedReportsDropped: once a filesystem mounted inside a tree is
// unmounted (and mounted nowhere else), a report of one of its files that
// was on its way (read before the unmount) does not reach the sink: its
// files could not be opened any more, and would be retried for good.
// Reports of other filesystems' files still do, and once the filesystem is
// in a tree again its files are reported again. A dropped report's file
// is not left quiet.
func TestUnmountedReportsDropped(t *testing.T) {
	dir := t.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	nested, other := st.Dev, st.Dev+1
	s := newGateSink()
	tr := tree.Tree{Root: "/srv", Recursive: true}
	fa := fakeFanotify(other, []tree.Tree{tr}, s, Options{})
	fa.devWritesBack.Store(nested, true)
	fa.mountsMet = map[int]*nestedMount{7: {mountpoint: "/srv/mnt", dev: nested}}
	for i, dev := range []uint64{nested, other, nested} {
		fa.pending = append(fa.pending, bdi.Mark{Path: fmt.Sprintf("/srv/mnt/f%d", i), Key: inode.Key{Dev: dev, Ino: uint64(i)}, Tree: tr})
		fa.pendingTrees = append(fa.pendingTrees, fa.list()[0])
	}
	// f0 was quieted (an ignore mark on its inode): dropped, it must not
	// stay quiet.
	fa.quiet.fd, fa.quiet.keys = -1, map[inode.Key]struct{}{{Dev: nested, Ino: 0}: {}}
	fa.quiet.n.Store(1)
	fa.forgetUnmounted(map[int]bool{}, map[uint64]string{})
	fa.flushMarks()
	if fa.quiet.n.Load() != 0 {
		t.Error("a quieted file whose report was dropped is still quiet")
	}
	fa.report(tr, "/srv/mnt/g", inode.Key{Dev: nested, Ino: 9}, false)
	if got, want := s.got(), []string{"/srv/mnt/f1"}; !slices.Equal(got, want) {
		t.Errorf("reports that reached the sink: %q, want %q", got, want)
	}
	// Mounted in a tree again.
	if _, err := fa.addTree(tree.Tree{Root: dir, Recursive: true}); err != nil {
		t.Fatal(err)
	}
	fa.report(tr, "/srv/mnt/g", inode.Key{Dev: nested, Ino: 9}, false)
	if got, want := s.got(), []string{"/srv/mnt/f1", "/srv/mnt/g"}; !slices.Equal(got, want) {
		t.Errorf("after the filesystem is in a tree again: reports %q, want %q", got, want)
	}
}

// TestRemovedTreeFinalScan: a tree removed while events may have been lost
// (a rescan after a shortage is due, or an overflow's rescan runs) is
// scanned once more, and its dirty files that were not tracked are
// reported as leaving, so that the reload writes them back; a tree removed
// with no event lost is not scanned. Both backends.
func TestRemovedTreeFinalScan(t *testing.T) {
	for _, kind := range []string{"fanotify", "inotify"} {
		for _, lost := range []string{"none", "retry due", "rescan running"} {
			t.Run(kind+"/"+lost, func(t *testing.T) {
				root := filepath.Join(t.TempDir(), "root")
				path := filepath.Join(root, "d", "f")
				key := dirtyFile(t, path)
				tr := tree.Tree{Root: root, Recursive: true, Expire: time.Hour}
				s := newGateSink()
				s.withExpire = true
				var b *base
				var remove func() bool
				if kind == "fanotify" {
					fa := fakeFanotify(key.Dev, []tree.Tree{tr}, s, Options{})
					b, remove = &fa.base, func() bool { return fa.RemoveTree(root) }
				} else {
					w := &Watcher{dirs: map[string]inode.Key{}, unwatched: map[string]tree.Tree{}}
					w.init([]tree.Tree{tr}, sinkOf(s), Options{})
					b, remove = &w.base, func() bool { return w.RemoveTree(root) }
				}
				b.devWritesBack.Store(key.Dev, true) // (t.TempDir may be on tmpfs)
				switch lost {
				case "retry due":
					b.retry.due.Store(true)
				case "rescan running":
					setRescanning(b, true)
				}
				if !remove() {
					t.Fatal("no tree removed")
				}
				setRescanning(b, false)
				eventually(t, "the final scan's end", func() bool { return !b.rescanBusy() })
				var want []string
				if lost != "none" {
					want = []string{path + " 1h0m0s leaving"}
				}
				if got := s.got(); !slices.Equal(got, want) {
					t.Errorf("reports: %q, want %q", got, want)
				}
			})
		}
	}
}

// dirtyFile makes path's directory and writes path (its page dirty, the
// file untracked), and returns its key.
func dirtyFile(t *testing.T, path string) inode.Key {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	key, _, err := inode.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// removedTreeSetup makes a tree root with one dirty file in it (untracked),
// and a fake fanotify backend serving it whose reports go to a gateSink
// that records their tree's expire; it returns the backend, the sink and
// the file's path.
func removedTreeSetup(t *testing.T) (*Fanotify, *gateSink, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	path := filepath.Join(root, "f")
	key := dirtyFile(t, path)
	s := newGateSink()
	s.withExpire = true
	fa := fakeFanotify(key.Dev, []tree.Tree{{Root: root, Recursive: true, Expire: time.Hour}}, s, Options{})
	fa.devWritesBack.Store(key.Dev, true) // (t.TempDir may be on tmpfs)
	return fa, s, path
}

// overflowEvent is a FAN_Q_OVERFLOW event as read from the group.
func overflowEvent() []byte {
	meta := make([]byte, unix.FAN_EVENT_METADATA_LEN)
	binary.NativeEndian.PutUint32(meta[0:], uint32(len(meta)))
	meta[4] = unix.FANOTIFY_METADATA_VERSION
	binary.NativeEndian.PutUint16(meta[6:], unix.FAN_EVENT_METADATA_LEN)
	binary.NativeEndian.PutUint64(meta[8:], unix.FAN_Q_OVERFLOW)
	binary.NativeEndian.PutUint32(meta[16:], uint32(0xffffffff)) // FAN_NOFD
	return meta
}

// TestOverflowAfterRemoval: an overflow read after a tree's removal may
// have lost writes made in the tree before it (the reload came while the
// overflow was still in the queue): the overflow's rescan covers the
// removed tree, and its dirty files are reported as leaving; once a read
// has emptied the queue after the removal (and no rescan was running then,
// whose list might not have been taken yet), a later overflow lost nothing
// of the tree's, and it is not scanned.
func TestOverflowAfterRemoval(t *testing.T) {
	for _, between := range []string{"nothing", "a read that emptied the queue", "the same while a rescan runs"} {
		t.Run(between, func(t *testing.T) {
			fa, s, path := removedTreeSetup(t)
			root := filepath.Dir(path)
			if !fa.RemoveTree(root) {
				t.Fatal("no tree removed")
			}
			if fa.rescanBusy() {
				t.Fatal("a tree removed with no event lost was scanned at once")
			}
			switch between {
			case "a read that emptied the queue":
				fa.forgetRemovedUpTo(fa.removeSeqNow())
			case "the same while a rescan runs":
				setRescanning(&fa.base, true)
				fa.forgetRemovedUpTo(fa.removeSeqNow())
				setRescanning(&fa.base, false)
			}
			ctx := context.Background()
			fa.events(ctx, overflowEvent())
			eventually(t, "the scans' end", func() bool { return !fa.rescanBusy() })
			var want []string
			if between != "a read that emptied the queue" {
				want = []string{path + " 1h0m0s leaving"}
			}
			if got := s.got(); !slices.Equal(got, want) {
				t.Errorf("reports: %q, want %q", got, want)
			}
		})
	}
}

// TestRescanCoversRemovedTree: an overflow's rescan covers the trees that
// were served when it was asked for: one removed by a reload while it
// runs is scanned all the same (its dirty files reported as leaving), and
// its directories get no watch; one whose root is gone is not scanned.
func TestRescanCoversRemovedTree(t *testing.T) {
	fa, s, path := removedTreeSetup(t)
	root := filepath.Dir(path)
	trees := fa.list()
	fa.RemoveTree(root)
	var watched []string
	fa.rescanTrees(context.Background(), trees, func(_ tree.Tree, p string, _ int) { watched = append(watched, p) })
	if got, want := s.got(), []string{path + " 1h0m0s leaving"}; !slices.Equal(got, want) {
		t.Errorf("reports: %q, want %q", got, want)
	}
	if len(watched) != 0 {
		t.Errorf("directories of a removed tree handed to onDir (watched): %q", watched)
	}

	fa, s, _ = removedTreeSetup(t)
	trees = fa.list()
	fa.mu.Lock()
	trees[0].gone = true // its root gone (checkRoots), not removed
	fa.mu.Unlock()
	fa.rescanTrees(context.Background(), trees, nil)
	if got := s.got(); len(got) != 0 {
		t.Errorf("a tree whose root is gone was scanned: %q", got)
	}
}

// setRescanning sets whether b's overflow rescan runs (rescanBusy).
func setRescanning(b *base, v bool) {
	b.rmu.Lock()
	b.rescanning = v
	b.rmu.Unlock()
}
