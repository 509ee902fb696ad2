package watch

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// readsOf is the number of reads of w's event queue that returned events.
func readsOf(t *testing.T, w Backend) uint64 {
	switch w := w.(type) {
	case *Fanotify:
		return w.readBatches.Load()
	case *Watcher:
		return w.w.reads.Load()
	}
	t.Fatalf("no read count for %T", w)
	return 0
}

// maxReadsPerSecond bounds the reads of a busy event queue: each read
// wakes the daemon, and each wake-up costs more than its events.
const maxReadsPerSecond = 120

// TestReadsCoalesce: a writer that makes and writes a new file in the tree
// about every millisecond for a second (a thousand files, two or three
// events each) has its events read in batches, at most
// maxReadsPerSecond, not a read for every few events, with both backends.
func TestReadsCoalesce(t *testing.T) {
	for _, b := range []string{"inotify", "fanotify"} {
		t.Run(b, func(t *testing.T) {
			root := t.TempDir()
			w, s := start(t, root, b)
			const span = time.Second
			before := readsOf(t, w)
			var last string
			files := 0
			for start := time.Now(); time.Since(start) < span; files++ {
				last = filepath.Join(root, fmt.Sprint("f", files))
				if err := os.WriteFile(last, []byte("data"), 0o644); err != nil {
					t.Fatal(err)
				}
				time.Sleep(500 * time.Microsecond)
			}
			eventually(t, "the last file seen", func() bool { return s.has(last) })
			reads := readsOf(t, w) - before
			t.Logf("%d files made and written in %s: events read in %d batches", files, span, reads)
			if reads > maxReadsPerSecond*uint64(span/time.Second)+5 {
				t.Errorf("%d files in %s: events read in %d batches, want at most %d a second", files, span, reads, maxReadsPerSecond)
			}
		})
	}
}
