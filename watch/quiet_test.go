package watch

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"flusherd/inode"
	"flusherd/internal/testfs"
	"flusherd/tree"
)

// handleSink records, per path, the reports and the last key and handle.
type handleSink struct {
	sink
	mu      sync.Mutex
	key     map[string]inode.Key
	handle  map[string]inode.Handle
	checked atomic.Bool
}

func (s *handleSink) MarkInodeDirty(path string, key inode.Key, h inode.Handle, t tree.Tree) error {
	s.mu.Lock()
	s.key[path], s.handle[path] = key, h
	s.mu.Unlock()
	return s.sink.MarkInodeDirty(path, key, h, t)
}

// Unchecked: the device makes background checks once checked is set.
func (s *handleSink) Unchecked(uint64) bool { return !s.checked.Load() }

func (s *handleSink) count(path string) int {
	s.sink.mu.Lock()
	defer s.sink.mu.Unlock()
	return s.seen[path]
}

// TestQuietHotFile: on a loop-mounted ext4, a file that keeps being
// written is quieted after hotEvents reports (its writes make no events),
// and is loud again as soon as the engine opens it for writeback (the
// ignore mark is removed before the attempt reads its state) or forgets
// it; a quieted file that could not be reported is not left quiet.
func TestQuietHotFile(t *testing.T) {
	root := testfs.Mount(t, testfs.Options{Type: "ext4"}).Dir
	h := inode.NewHandles()
	t.Cleanup(h.Close)
	s := &handleSink{sink: sink{seen: map[string]int{}}, key: map[string]inode.Key{}, handle: map[string]inode.Handle{}}
	w, err := New([]tree.Tree{{Root: root, Recursive: true}}, sinkOf(s), Options{Backend: "fanotify", Opener: h, Handles: h})
	if err != nil {
		t.Fatal(err)
	}
	fa := w.(*Fanotify)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); w.Close(); <-done })
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}

	p := filepath.Join(root, "hot")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// write writes n times, each time waiting until its event (if any)
	// is handled: fanotify merges the events of one file while they are
	// queued.
	write := func(n int) {
		t.Helper()
		for i := range n {
			if _, err := f.WriteAt([]byte{'x'}, int64(i)); err != nil {
				t.Fatal(err)
			}
			w.Quiesce(ctx)
		}
	}
	w.Quiesce(ctx)
	created := s.count(p) // its creation
	write(2 * hotEvents)
	n := s.count(p)
	want := hotEvents
	if fa.targetFID {
		want-- // the creation, reported by handle, was the file's first event
	}
	if n-created != want || fa.ctr.Quieted.Load() != 1 {
		t.Fatalf("after %d writes: %d reports, %d files quieted; want %d reports and a quieted file",
			2*hotEvents, n-created, fa.ctr.Quieted.Load(), want)
	}
	write(2 * hotEvents)
	if got := s.count(p); got != n {
		t.Fatalf("quieted file: %d more reports after %d writes, want none", got-n, 2*hotEvents)
	}
	// A file that is not hot is reported at each write meanwhile.
	cold := filepath.Join(root, "cold")
	if err := os.WriteFile(cold, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cold file reported", func() bool { return s.has(cold) })

	// The engine opens it for writeback: from then on its writes are
	// reported again.
	s.mu.Lock()
	key, hd := s.key[p], s.handle[p]
	s.mu.Unlock()
	wf, err := h.OpenHandle(hd, key)
	if err != nil {
		t.Fatal(err)
	}
	if fa.quiet.n.Load() != 1 {
		t.Errorf("an open that is not an attempt's (a sample's): %d quieted, want 1", fa.quiet.n.Load())
	}
	fa.Opened(key, wf) // as an attempt does, before it reads the state
	wf.Close()
	if fa.quiet.n.Load() != 0 {
		t.Errorf("after the engine opened the only quieted file: %d quieted, want 0", fa.quiet.n.Load())
	}
	n = s.count(p)
	write(1)
	eventually(t, "a write after the writeback open reported", func() bool { return s.count(p) > n })

	// Quieted again; then the engine forgets it without opening it.
	write(2 * hotEvents)
	if fa.quiet.n.Load() != 1 {
		t.Fatalf("written again: %d files quieted, want 1", fa.quiet.n.Load())
	}
	n = s.count(p)
	fa.Forgotten(inode.Key{Dev: key.Dev, Ino: key.Ino + 1000}) // another inode: nothing changes
	write(hotEvents / 2)
	if got := s.count(p); got != n {
		t.Fatalf("after another inode was forgotten: %d more reports, want none", got-n)
	}
	fa.Forgotten(key)
	write(1)
	eventually(t, "a write after the engine forgot the file reported", func() bool { return s.count(p) > n })

	// A background check makes every file loud again.
	write(2 * hotEvents)
	if fa.quiet.n.Load() != 1 {
		t.Fatalf("written again: %d files quieted, want 1", fa.quiet.n.Load())
	}
	fa.Checking()
	if fa.quiet.n.Load() != 0 {
		t.Errorf("after a background check: %d files quieted, want 0", fa.quiet.n.Load())
	}
	n = s.count(p)
	write(1)
	eventually(t, "a write after a background check reported", func() bool { return s.count(p) > n })

	// An attempt's open on no descriptor (another inode.File) removes
	// every mark.
	write(2 * hotEvents)
	if fa.quiet.n.Load() != 1 {
		t.Fatalf("written again: %d files quieted, want 1", fa.quiet.n.Load())
	}
	fa.Opened(key, struct{ inode.File }{})
	if fa.quiet.n.Load() != 0 {
		t.Errorf("after an open on no descriptor: %d files quieted, want 0", fa.quiet.n.Load())
	}
	n = s.count(p)
	write(1)
	eventually(t, "a write after an open on no descriptor reported", func() bool { return s.count(p) > n })

	// A file on a device that makes background checks is not quieted.
	s.checked.Store(true)
	n = s.count(p)
	write(2 * hotEvents)
	if got := s.count(p) - n; got != 2*hotEvents || fa.quiet.n.Load() != 0 {
		t.Errorf("on a device with background checks, %d writes: %d reports and %d files quieted, want %d and 0",
			2*hotEvents, got, fa.quiet.n.Load(), 2*hotEvents)
	}

	// A closed group quiets nothing, and what the engine tells it does nothing.
	w.Close()
	cancel()
	<-done
	fa.Forgotten(key)
	if fa.quiet.n.Load() != 0 {
		t.Errorf("closed group: %d files quieted, want 0", fa.quiet.n.Load())
	}
}
