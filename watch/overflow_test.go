package watch

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"flusherd/inode"
	"flusherd/internal/testwait"
	"flusherd/tree"
)

// TestOverflowRescan: the rescan after an overflow runs beside the caller
// (which goes on reading its queue); overflows during it ask for exactly
// one more, and rescanBusy holds until the last is done.
func TestOverflowRescan(t *testing.T) {
	var b base
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	rescan := func() {
		runs.Add(1)
		started <- struct{}{}
		<-release
	}
	ctx := context.Background()
	b.overflowRescan(ctx, rescan) // returns at once
	<-started
	if !b.rescanBusy() {
		t.Fatal("rescanBusy false while a rescan runs")
	}
	// Three more overflows while it runs: one more rescan, not three.
	for range 3 {
		b.overflowRescan(ctx, rescan)
	}
	release <- struct{}{}
	<-started
	release <- struct{}{}
	if !testwait.Poll(10*time.Second, func() bool { return !b.rescanBusy() }) {
		t.Fatal("rescanBusy still true 10s after the last rescan")
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("%d rescans, want 2 (the first and one for the overflows during it)", n)
	}
	// A later overflow starts a new one.
	b.overflowRescan(ctx, rescan)
	<-started
	release <- struct{}{}
	if !testwait.Poll(10*time.Second, func() bool { return !b.rescanBusy() }) {
		t.Fatal("rescanBusy still true 10s after the later rescan")
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("%d rescans after a later overflow, want 3", n)
	}
}

// lastKeySink records the key of the last report of each path.
type lastKeySink struct {
	sink
	last map[string]inode.Key
}

func (s *lastKeySink) MarkInodeDirty(path string, key inode.Key, h inode.Handle, t tree.Tree) error {
	s.mu.Lock()
	s.last[path] = key
	s.mu.Unlock()
	return s.sink.MarkInodeDirty(path, key, h, t)
}

// TestInotifyKeyCache: a Write event for a path seen before costs no
// lstat (Watcher.keys), yet the key reported last is always that of the
// file now at the path: after the name was replaced by a rename over it,
// and after its directory was moved away and another made in its place.
// (Each step's last event is a Write, reported from the cache when the
// cache is kept.)
func TestInotifyKeyCache(t *testing.T) {
	root := t.TempDir()
	s := &lastKeySink{sink: sink{seen: map[string]int{}}, last: map[string]inode.Key{}}
	w := startWith(t, root, "inotify", s)
	write := func(p string) {
		t.Helper()
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	// settled waits for the watcher to have handled every event so far,
	// then says whether p's last report has the key of the file at p.
	settled := func(p string) bool {
		t.Helper()
		qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
		w.Quiesce(qctx)
		qcancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.last[p] == keyOf(t, p)
	}
	a := filepath.Join(root, "a")
	write(a)
	write(a) // (from the cache)
	if !settled(a) {
		t.Fatal("a: the last report does not have a's key")
	}

	// Replaced by a rename over it, then written.
	b := filepath.Join(root, "b")
	write(b)
	if err := os.Rename(b, a); err != nil {
		t.Fatal(err)
	}
	write(a)
	if !settled(a) {
		t.Error("a renamed over: the last report has the old file's key")
	}

	// Its directory moved away, another made under the same name.
	d := filepath.Join(root, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(d, "f")
	eventually(t, "d watched", func() bool { write(f); return settled(f) })
	if err := os.Rename(d, filepath.Join(root, "e")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	g := filepath.Join(d, "g")
	eventually(t, "the new d/g reported", func() bool { write(g); return settled(g) })
	write(f) // a new d/f: its Create, then a Write
	write(f)
	if !settled(f) {
		t.Error("d moved and made again: the last report of d/f has the old file's key")
	}
}

// TestInotifySwapRemove: a directory moved onto a watched name and added
// by that name while the name's old watch is still registered (a rescan
// ahead of the event queue): forgetting both names must not panic, and the
// name can be watched again.
func TestInotifySwapRemove(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := &sink{seen: map[string]int{}}
	iw, err := NewInotify([]tree.Tree{{Root: root, Recursive: true}}, sinkOf(s), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { iw.Close() })
	if err := iw.add(a); err != nil {
		t.Fatal(err)
	}
	if err := iw.add(b); err != nil {
		t.Fatal(err)
	}
	// Swap: a's directory away, b's onto the name a; then the name a is
	// added again (as a rescan would) before any event is handled.
	if err := os.Rename(a, filepath.Join(root, "a.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(b, a); err != nil {
		t.Fatal(err)
	}
	if err := iw.add(a); err != nil {
		t.Fatal(err)
	}
	iw.forget(a)
	iw.forget(b)
	if err := iw.add(a); err != nil {
		t.Fatalf("watching a again: %v", err)
	}
}

// trackedSink tracks each key under one name (Tracks as bdi's).
type trackedSink struct {
	sink
	names map[inode.Key]string
}

func (s *trackedSink) Tracks(key inode.Key, path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[key] == path
}

// TestRescanNumberReused: a rescan skips the files tracked under their own
// name, but not a dirty file whose number is tracked under another name
// (a new file that took a deleted file's number): it is reported.
func TestRescanNumberReused(t *testing.T) {
	root := t.TempDir()
	known, reused := filepath.Join(root, "known"), filepath.Join(root, "new")
	for _, p := range []string{known, reused} {
		if err := os.WriteFile(p, make([]byte, 8192), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := &trackedSink{sink: sink{seen: map[string]int{}}, names: map[inode.Key]string{
		keyOf(t, known):  known,
		keyOf(t, reused): filepath.Join(root, "deleted"), // its number, under a gone name
	}}
	b := newScanner(t, root, s, inode.OS{})
	b.rescan(context.Background(), nil)
	if s.has(known) {
		t.Error("the file tracked under its own name was reported again")
	}
	if !s.has(reused) {
		t.Error("the dirty file whose number is tracked under another name was not reported")
	}
}
