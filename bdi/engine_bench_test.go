package bdi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"flusherd/inode"
	"flusherd/lists"
	"flusherd/policy"
	"flusherd/tree"
)

// nopOpener opens nopFiles: files of four dirty pages that one
// StartWriteback cleans, with no system call at all.
type nopOpener struct{}

func (nopOpener) Open(path string, key inode.Key) (inode.File, error) {
	return &nopFile{dirty: 4}, nil
}

type nopFile struct{ dirty uint64 }

func (f *nopFile) Cachestat(off, n int64) (uint64, uint64, error) { return f.dirty, 0, nil }
func (f *nopFile) StartWriteback(off, n int64) error              { f.dirty = 0; return nil }
func (f *nopFile) DataSync() error                                { f.dirty = 0; return nil }
func (f *nopFile) Size() (int64, error)                           { return 4 * pg, nil }
func (f *nopFile) Close() error                                   { return nil }

// BenchmarkDrainOverhead measures the writeback engine's own cost per
// file, with files that need no system call (nopOpener): a Drain of
// 20,000 dirty inodes through the plug, as flusherd-bench plug's method
// (a) does on a real filesystem. It reports ns/file and allocs/file of
// the Drain alone (marking is not timed); everything above this is the
// kernel's (open, cachestat, sync_file_range, close).
func BenchmarkDrainOverhead(b *testing.B) {
	const n = 20000
	reg := NewRegistry(Options{
		Config: Config{
			DirtyWritebackInterval: time.Hour,
			MinPause:               time.Millisecond,
			MaxPause:               100 * time.Millisecond,
			WriteChunk:             4 << 20,
			Requeue:                policy.IOWait,
			PlugEnabled:            true,
			MaxPending:             256,
			QueueDepth:             8,
			AttemptTimeout:         time.Minute,
		},
		Resolve: func(dev uint64, path string) (string, error) { return "7:0", nil },
		Opener:  nopOpener{},
	})
	defer reg.Stop()
	paths := make([]string, n)
	for i := range paths {
		paths[i] = fmt.Sprintf("/bench/f%06d", i)
	}
	var files int
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		for i, p := range paths {
			if err := reg.MarkInodeDirty(p, inode.Key{Dev: 7, Ino: uint64(i + 1)}, "", tree.Tree{Expire: time.Hour}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		for _, wb := range reg.Devices() {
			if err := wb.Drain(context.Background(), "bench"); err != nil {
				b.Fatal(err)
			}
			if left := wb.Snapshot().BIO + wb.Snapshot().BDirty; left != 0 {
				b.Fatalf("%d inodes left after the drain", left)
			}
		}
		files += n
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(files), "ns/file")
}

// BenchmarkCheckNames measures CheckNames (after a rescan: one lstat(2) of
// each tracked file's name) over 10,000 tracked files that are all still
// there, real files in a temporary directory. It reports ns/file.
func BenchmarkCheckNames(b *testing.B) {
	const n = 10000
	dir := b.TempDir()
	reg := NewRegistry(Options{
		Config:  Config{DirtyWritebackInterval: time.Hour, MinPause: time.Millisecond, MaxPause: 100 * time.Millisecond, WriteChunk: 4 << 20, MaxPending: 256, QueueDepth: 1},
		Resolve: func(dev uint64, path string) (string, error) { return "0:0", nil },
		Opener:  nopOpener{},
	})
	defer reg.Stop()
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%100), fmt.Sprint(i))
		if i < 100 {
			if err := os.Mkdir(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			b.Fatal(err)
		}
		key, _, err := inode.Stat(p)
		if err != nil {
			b.Fatal(err)
		}
		if err := reg.MarkInodeDirty(p, key, "", tree.Tree{Expire: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	wbs := reg.Devices()
	if len(wbs) != 1 {
		b.Fatalf("%d devices", len(wbs))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if m := wbs[0].CheckNames(dir); m != 0 {
			b.Fatalf("%d requeued, want 0", m)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/file")
}

// BenchmarkRestrictUnder measures a reload that shortens a tree's expire
// (RestrictUnder) over 20,000 inodes tracked on b_dirty under the old,
// longer one: "batch" as the reload does it, one walk of b_dirty for all
// of them, against "perInode", stricterTreeLocked for each, which walks
// its class's list each time. It reports ms per reload; the list lock is
// held throughout either way.
func BenchmarkRestrictUnder(b *testing.B) {
	const n = 20000
	for _, mode := range []string{"batch", "perInode"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				reg := NewRegistry(Options{
					Config:  Config{DirtyWritebackInterval: time.Hour, MinPause: time.Millisecond, MaxPause: time.Second, WriteChunk: 4 << 20, Requeue: policy.IOWait, AttemptTimeout: time.Minute},
					Resolve: func(dev uint64, path string) (string, error) { return "7:0", nil },
					Opener:  nopOpener{},
				})
				for i := range n {
					if err := reg.MarkInodeDirty(fmt.Sprintf("/bench/f%06d", i), inode.Key{Dev: 7, Ino: uint64(i + 1)}, "", tree.Tree{Root: "/bench", Expire: 10 * time.Minute}); err != nil {
						b.Fatal(err)
					}
				}
				t := tree.Tree{Root: "/bench", Expire: time.Second}
				wb := reg.Devices()[0]
				var ins []*inode.Inode
				for _, c := range wb.under("/bench") {
					ins = append(ins, c.in)
				}
				b.StartTimer()
				switch mode {
				case "batch":
					if got := wb.RestrictUnder("/bench", t, func(string) bool { return true }); got != n {
						b.Fatalf("RestrictUnder looked at %d files, want %d", got, n)
					}
				case "perInode":
					wb.mu.Lock()
					for _, in := range ins {
						wb.stricterTreeLocked(in, t)
					}
					wb.mu.Unlock()
				}
				b.StopTimer()
				wb.mu.Lock()
				for _, in := range ins {
					if wb.bDirty.classes[in.Class].expire != time.Second {
						b.Fatalf("%v: class expire %v after the reload, want 1s", in.Key(), wb.bDirty.classes[in.Class].expire)
					}
				}
				if got := wb.bDirty.classes[ins[0].Class].list.Len(); got != n {
					b.Fatalf("%d inodes on the 1 s class's b_dirty, want %d", got, n)
				}
				wb.mu.Unlock()
				reg.Stop()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/reload")
		})
	}
}

// TestRestrictUnderBatch: a reload that shortens the expire of a tree of
// 500 files, marked in a shuffled order of names (so not in the order
// under returns them) and some taken off b_dirty onto b_io, moves every
// one to the shorter class: those on b_dirty onto its FIFO in dirtiedWhen
// order, the others left where they are with the new class.
func TestRestrictUnderBatch(t *testing.T) {
	const n = 500
	reg := NewRegistry(Options{
		Config:  Config{DirtyWritebackInterval: time.Hour, MinPause: time.Millisecond, MaxPause: time.Second, WriteChunk: 4 << 20, Requeue: policy.IOWait, AttemptTimeout: time.Minute},
		Resolve: func(dev uint64, path string) (string, error) { return "7:0", nil },
		Opener:  nopOpener{},
	})
	defer reg.Stop()
	for i := range n {
		j := (i * 7919) % n
		if err := reg.MarkInodeDirty(fmt.Sprintf("/t/f%04d", j), inode.Key{Dev: 7, Ino: uint64(j + 1)}, "", tree.Tree{Root: "/t", Expire: 10 * time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	wb := reg.Devices()[0]
	wb.mu.Lock()
	var off []*inode.Inode
	for x := range wb.bDirty.classes[wb.inodes.Get(inode.Key{Dev: 7, Ino: 1}).Class].list.All {
		if len(off) == 10 {
			break
		}
		off = append(off, x)
	}
	for _, x := range off {
		lists.Remove(x)
		wb.BIO.PushBack(x)
	}
	wb.mu.Unlock()
	if got := wb.RestrictUnder("/t", tree.Tree{Root: "/t", Expire: time.Second}, func(string) bool { return true }); got != n {
		t.Fatalf("RestrictUnder looked at %d files, want %d", got, n)
	}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	for i := range n {
		in := wb.inodes.Get(inode.Key{Dev: 7, Ino: uint64(i + 1)})
		if in == nil || wb.bDirty.classes[in.Class].expire != time.Second {
			t.Fatalf("file %d: %+v, want the 1 s class", i, in)
		}
	}
	c := wb.inodes.Get(inode.Key{Dev: 7, Ino: 1}).Class
	var prev time.Duration
	k := 0
	for x := range wb.bDirty.classes[c].list.All {
		if x.DirtiedWhen < prev {
			t.Fatalf("the 1 s class's FIFO is out of dirtiedWhen order at its entry %d", k)
		}
		prev = x.DirtiedWhen
		k++
	}
	if k != n-len(off) {
		t.Errorf("%d on the 1 s class's FIFO, want %d (the %d on b_io stay there)", k, n-len(off), len(off))
	}
	if got := wb.BIO.Len(); got != len(off) {
		t.Errorf("b_io holds %d, want %d", got, len(off))
	}
}
