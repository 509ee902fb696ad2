package bdi

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"flusherd/inode"
	"flusherd/internal/testfs"
)

// BenchmarkSampleReal measures what a background check costs per file
// written (runSample: an open, cachestat, a close) on a loop-mounted ext4,
// the files opened by path and by handle (fanotify's, open_by_handle_at):
// 2,000 files of 12 KiB, dirty. It reports ns/file; maxSample files are
// sampled per check, one check per backgroundCheckInterval at most.
func BenchmarkSampleReal(b *testing.B) {
	mnt := testfs.Mount(b, testfs.Options{Type: "ext4", SizeMB: 256})
	const n = 2000
	hs := inode.NewHandles()
	defer hs.Close()
	if _, err := hs.AddMount(mnt.Dir); err != nil {
		b.Fatal(err)
	}
	type file struct {
		path string
		key  inode.Key
		h    inode.Handle
	}
	files := make([]file, n)
	for i := range files {
		p := filepath.Join(mnt.Dir, fmt.Sprintf("d%02d", i%20), fmt.Sprint(i))
		if i < 20 {
			if err := os.Mkdir(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(p, make([]byte, 12<<10), 0o644); err != nil {
			b.Fatal(err)
		}
		key, _, err := inode.Stat(p)
		if err != nil {
			b.Fatal(err)
		}
		h, err := hs.HandleOf(p, key)
		if err != nil {
			b.Fatal(err)
		}
		files[i] = file{p, key, h}
	}
	for _, byHandle := range []bool{false, true} {
		b.Run(map[bool]string{false: "path", true: "handle"}[byHandle], func(b *testing.B) {
			wb := New("test", testConfig(), func() time.Duration { return 0 }, Files{Opener: inode.OS{}, Handles: hs}, nil, nil)
			probes := make([]sampleProbe, n)
			for i, f := range files {
				in := inode.New(f.key)
				in.SetPath(f.path)
				probes[i] = sampleProbe{in: in, key: f.key, path: in.PathRef()}
				if byHandle {
					probes[i].handle = f.h
				}
			}
			res := make([]sampleResult, n)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for i := range res {
					res[i] = sampleResult{sampleProbe: probes[i]}
				}
				for _, r := range wb.runSample(res, wb.cfg, 4<<20) {
					if !r.ok {
						b.Fatalf("%s: not counted", r.path.String())
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/file")
		})
	}
}
