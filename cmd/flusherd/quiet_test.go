package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"flusherd/internal/testfs"
)

// TestHotFileQuieted: with fanotify, on a device without background
// checks (range_bytes = "0"), a file written again and again is
// quieted (its writes stop making events: watch/stats counts it under
// quieted, and far fewer events than writes), its data is still written
// back within the expiry when the writes stop, and a single write made
// after that writeback is seen and written back too: the writeback
// attempt, or the engine forgetting the clean file, removed the ignore
// mark. (TestEndToEnd's app.log, written every 100 ms for seconds, is
// quieted too, with its data's deadline checked.)
func TestHotFileQuieted(t *testing.T) {
	testfs.SkipShort(t, "the daemon quieting a hot file on loop-mounted ext4")
	_, tree := mountTree(t, "ext4")
	d := startDaemon(t, fmt.Sprintf(`
[watcher]
backend = "fanotify"
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "500ms"
range_bytes = "0"
[[watch]]
path = %q
`, tree))
	watchStats := filepath.Join(d.statsDir, "watch", "stats")
	p := filepath.Join(tree, "hot")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st0 := statsWhen(t, watchStats, 3*time.Second, func(st map[string]int64) bool { return st != nil })
	// A write every 2 ms: each one would make an event of its own (the
	// daemon reads every millisecond or so), which fanotify would not
	// merge with the last.
	const writes = 400
	page := make([]byte, 4096)
	for i := range writes {
		if _, err := f.WriteAt(page, int64(i%64)*4096); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	const bound = 4 * time.Second // expire + interval + a loaded machine's slack
	clean := func() bool { dt, wbp, err := cachestat(p, 0, 0); return err == nil && dt == 0 && wbp == 0 }
	if !poll(bound, clean) {
		t.Fatalf("the hot file still holds dirty or writeback pages %v after its last write", bound)
	}
	st := statsWhen(t, watchStats, 3*time.Second, func(st map[string]int64) bool { return st["quieted"] > st0["quieted"] })
	events := st["events"] - st0["events"]
	if st["quieted"] <= st0["quieted"] || events >= writes/2 {
		t.Fatalf("%d writes made %d events, %d files quieted; want fewer than %d events and the file quieted",
			writes, events, st["quieted"]-st0["quieted"], writes/2)
	}
	t.Logf("%d writes: %d events, quieted %d times", writes, events, st["quieted"]-st0["quieted"])

	// Its writes are reported again: one more is written back.
	time.Sleep(300 * time.Millisecond)
	if _, err := f.WriteAt(page, 0); err != nil {
		t.Fatal(err)
	}
	if dt, _, _ := cachestat(p, 0, 0); dt == 0 {
		t.Fatal("the write left no dirty page (written back by someone else?)")
	}
	if !poll(bound, clean) {
		t.Fatalf("a write after the hot file's writeback is still dirty %v later: it went unreported", bound)
	}
}
