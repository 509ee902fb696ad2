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

	"flusherd/bdi"
	"flusherd/inode"
)

// gateSink is a BatchSink whose reports, once armed, wait in the sink
// until released: a report in flight while a tree is removed.
type gateSink struct {
	nopSink
	mu      sync.Mutex
	paths   []string
	armed   bool
	entered chan struct{} // closed when an armed report entered the sink
	release chan struct{} // an armed report returns once this is closed
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

func (s *gateSink) MarkInodeDirty(path string, _ inode.Key, _ inode.Handle, _ bdi.Tree) error {
	s.wait()
	s.record(path)
	return nil
}

func (s *gateSink) MarkInodesDirty(ms []bdi.Mark) {
	s.wait()
	for _, m := range ms {
		s.record(m.Path)
	}
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

// twoTreeFanotify is fakeFanotify with trees /srv/a and /srv/b, a directory
// cached in each, and files f0... cached, f<i> in /srv/a/d if i is even and
// in /srv/b/d if odd; it returns one parsed FAN_MODIFY event for each.
func twoTreeFanotify(s Sink, n int) (*Fanotify, []event) {
	fa := fakeFanotify(42, []Tree{{Root: "/srv/a", Recursive: true}, {Root: "/srv/b", Recursive: true}}, s, Options{})
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	for i, tr := range fa.list() {
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
// meanwhile are dropped there (the reload has the sink let that tree's
// files go), the others reach the sink in their order. A removal while a
// batch is in the sink returns only once that batch is in.
func TestFanotifyRemovedTreeReports(t *testing.T) {
	ctx := context.Background()
	s := newGateSink()
	fa, evs := twoTreeFanotify(s, 6)
	for i := range evs {
		fa.handle(ctx, &evs[i])
	}
	if !fa.RemoveTree("/srv/a") {
		t.Fatal("RemoveTree found no tree at /srv/a")
	}
	fa.flushMarks()
	if got, want := s.got(), []string{"/srv/b/d/f1", "/srv/b/d/f3", "/srv/b/d/f5"}; !slices.Equal(got, want) {
		t.Errorf("reports that reached the sink: %q, want %q", got, want)
	}
	if len(fa.pending) != 0 || len(fa.pendingTrees) != 0 {
		t.Errorf("%d reports (%d trees) still pending after the flush", len(fa.pending), len(fa.pendingTrees))
	}

	// A batch in the sink when the tree is removed.
	s = newGateSink()
	fa, evs = twoTreeFanotify(s, 4)
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
// with a tree that is no longer served (removed by a reload, or its root
// gone) does not reach the sink, and the tree's end waits for one in the
// sink; both backends.
func TestReportRemovedTree(t *testing.T) {
	for _, c := range []struct{ kind, how string }{
		{"fanotify", "removed"}, {"inotify", "removed"}, {"fanotify", "root gone"}, {"inotify", "root gone"},
	} {
		t.Run(c.kind+"/"+c.how, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			path := filepath.Join(root, "f")
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			key, _, err := inode.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			tr := Tree{Root: root, Recursive: true}
			s := newGateSink()
			var b *base
			var remove func()
			if c.kind == "fanotify" {
				fa := fakeFanotify(key.Dev, []Tree{tr}, s, Options{})
				b, remove = &fa.base, func() { fa.RemoveTree(root) }
			} else {
				w := &Watcher{dirs: map[string]struct{}{}, unwatched: map[string]Tree{}}
				w.init([]Tree{tr}, s, Options{})
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
			if got := s.got(); !slices.Equal(got, []string{path}) {
				t.Errorf("reports that reached the sink: %q, want the one made before the tree's end only", got)
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
// one), or a name that another file has taken since.
func TestScanStaleName(t *testing.T) {
	dir := t.TempDir()
	cur, other := filepath.Join(dir, "new"), filepath.Join(dir, "other")
	for _, p := range []string{cur, other} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	key, _, err := inode.Stat(cur)
	if err != nil {
		t.Fatal(err)
	}
	s := &staleNameSink{gateSink: *newGateSink(), key: key}
	tr := Tree{Root: dir, Recursive: true}
	fa := fakeFanotify(key.Dev, []Tree{tr}, s, Options{})
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
}
