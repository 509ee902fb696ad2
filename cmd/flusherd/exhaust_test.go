package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
)

// TestDescriptorExhaustion: with the daemon's RLIMIT_NOFILE lowered, once
// it is idle, to one less than it holds (not one descriptor can be opened,
// not even the filesystem's directory for opens by handle, which is closed
// after 200 ms unused), files written into a tree cannot be resolved,
// scanned or opened; nothing of them may be forgotten: once the limit is
// restored they are clean within max_pause + 1.5 s, both backends. (Some
// may be written back before: a descriptor the daemon closes meanwhile
// lets one attempt through; most are held back, and at least one must
// be.) This was once lost for good with fanotify: the failed reopen of the
// handle directory was reported as ENODEV (filesystem gone) and the events
// were dropped without a word. (A limit that strikes while the handle
// directory is open, so that the files' own opens fail:
// TestFaultSuite/fd-exhaustion, and bdi.TestRealOutcomes.)
func TestDescriptorExhaustion(t *testing.T) {
	testfs.SkipShort(t, "the daemon under a lowered descriptor limit, each backend")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts, fanotify")
	}
	for _, backend := range []string{"fanotify", "inotify"} {
		t.Run(backend, func(t *testing.T) {
			_, tree := mountTree(t, "ext4")
			d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "1s"
min_pause = "10ms"
max_pause = "1s"
[watcher]
backend = %q
[[watch]]
path = %q
`, backend, tree))
			pid := d.pid()
			time.Sleep(time.Second) // 5 × the handle directory's idle time
			ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			if err != nil {
				t.Fatal(err)
			}
			var old unix.Rlimit
			// Three under the descriptors open now: a descriptor or two
			// the daemon closes meanwhile (a stats write, an idle
			// directory) do not let its attempts through.
			lim := unix.Rlimit{Cur: uint64(len(ents) - 3), Max: uint64(len(ents))}
			if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
				t.Fatal(err)
			}
			restore := func() {
				if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
					t.Fatalf("restore RLIMIT_NOFILE: %v", err)
				}
			}
			lim.Max = old.Max // keep the hard limit, so it can be raised again
			if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
				t.Fatal(err)
			}
			restored := false
			t.Cleanup(func() {
				if !restored {
					restore()
				}
			})
			var files []string
			for i := range 20 {
				p := filepath.Join(tree, fmt.Sprintf("f%02d", i))
				writeDirty(t, p, 64<<10)
				files = append(files, p)
			}
			// Twice the 1.2 s a file takes to be written (expiry and
			// interval).
			time.Sleep(2500 * time.Millisecond)
			// The daemon's descriptors come and go (the stats file's
			// write, the handle directory closed when idle), so an
			// attempt may find one free and write its file: the files
			// still dirty now are those the shortage held back, and
			// there must be some, or nothing here was tested.
			held := 0
			for _, p := range files {
				d, wb, err := cachestat(p, 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				if d > 0 || wb > 0 {
					held++
				}
			}
			if held == 0 {
				t.Fatalf("precondition: none of the %d files is dirty after 2.5 s under the lowered limit: the shortage held nothing back", len(files))
			}
			t.Logf("%d of %d files dirty under the lowered limit", held, len(files))
			restore()
			restored = true
			waitAllClean(t, time.Second+1500*time.Millisecond, files...)
			if !strings.Contains(d.log.String(), "want of resources") && !strings.Contains(d.log.String(), "too many open files") {
				t.Errorf("the shortage was not logged:\n%s", d.log.String())
			}
		})
	}
}
