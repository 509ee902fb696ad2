package bdi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"flusherd/inode"
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
