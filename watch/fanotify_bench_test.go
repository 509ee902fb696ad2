package watch

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

type nopSink struct{ n int }

func (s *nopSink) MarkInodeDirty(string, inode.Key, inode.Handle, tree.Tree) error {
	s.n++
	return nil
}
func (s *nopSink) Tracks(inode.Key, string) bool       { return false }
func (s *nopSink) Rescanned(uint64)                    {}
func (s *nopSink) TreeGone(string, uint64, bool, bool) {}

// fanEvent encodes one FAN_MODIFY event as the kernel reports it with
// FAN_REPORT_DFID_NAME|FAN_REPORT_FID: metadata, a DFID_NAME record and a
// FID record, each padded to 4 bytes.
func fanEvent(fsid [8]byte, dir, file []byte, name string) []byte {
	return fanEventMask(fsid, dir, file, name, unix.FAN_MODIFY)
}

// fanEventMask is fanEvent with the mask given; a nil file leaves the FID
// record out, as in a directory-entry event (FAN_CREATE, FAN_MOVED_TO).
func fanEventMask(fsid [8]byte, dir, file []byte, name string, mask uint64) []byte {
	rec := func(typ byte, h []byte, name string) []byte {
		body := append([]byte{}, fsid[:]...)
		body = binary.NativeEndian.AppendUint32(body, uint32(len(h)))
		body = binary.NativeEndian.AppendUint32(body, 1) // handle_type
		body = append(body, h...)
		if typ == unix.FAN_EVENT_INFO_TYPE_DFID_NAME {
			body = append(append(body, name...), 0)
		}
		for (4+len(body))%4 != 0 {
			body = append(body, 0)
		}
		hdr := []byte{typ, 0, 0, 0}
		binary.NativeEndian.PutUint16(hdr[2:], uint16(4+len(body)))
		return append(hdr, body...)
	}
	info := rec(unix.FAN_EVENT_INFO_TYPE_DFID_NAME, dir, name)
	if file != nil {
		info = append(info, rec(unix.FAN_EVENT_INFO_TYPE_FID, file, "")...)
	}
	meta := make([]byte, unix.FAN_EVENT_METADATA_LEN)
	binary.NativeEndian.PutUint32(meta[0:], uint32(len(meta)+len(info)))
	meta[4] = unix.FANOTIFY_METADATA_VERSION
	binary.NativeEndian.PutUint16(meta[6:], unix.FAN_EVENT_METADATA_LEN)
	binary.NativeEndian.PutUint64(meta[8:], mask)
	binary.NativeEndian.PutUint32(meta[16:], uint32(0xffffffff)) // FAN_NOFD
	return append(meta, info...)
}

// testFsid is the filesystem id of fakeFanotify's one filesystem.
var testFsid = [8]byte{1, 2, 3, 4, 5, 6, 7, 8}

// fakeFanotify returns a Fanotify without a group, for tests of its event
// path: one marked filesystem (testFsid, on st_dev dev), the trees, and
// the sink s.
func fakeFanotify(dev uint64, trees []tree.Tree, s partialSink, opt Options) *Fanotify {
	fa := &Fanotify{fsids: map[[8]byte]uint64{testFsid: dev}, mounts: map[uint64]bool{},
		dirs: map[string]*fanotifyDir{}, files: map[string]*fanotifyTarget{}}
	fa.init(trees, sinkOf(s), opt)
	return fa
}

// knownFiles puts n files of st_dev dev (inode numbers first, first+1...)
// in fa's caches, file i named f<i> in directory /srv/data/d<i%ndirs> of
// the first tree, and returns one FAN_MODIFY event for each, in order.
func (fa *Fanotify) knownFiles(dev, first uint64, n, ndirs int) []byte {
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	var buf []byte
	for i := range n {
		fh := binary.NativeEndian.AppendUint64(nil, uint64(i))
		dirH := fmt.Appendf(nil, "dir%05d", i%ndirs)
		buf = append(buf, fanEvent(testFsid, dirH, fh, fmt.Sprintf("f%d", i))...)
		fa.files[string(fa.cacheKey(testFsid[:], typ, fh))] = &fanotifyTarget{key: inode.Key{Dev: dev, Ino: first + uint64(i)}, regular: true, handle: inode.MakeHandle(1, fh)}
		if i < ndirs {
			p := fmt.Sprintf("/srv/data/d%d", i)
			fa.dirs[string(fa.cacheKey(testFsid[:], typ, dirH))] = &fanotifyDir{path: p, prefix: p + "/", tree: fa.list()[0]}
		}
	}
	return buf
}

// benchEvents times fa.events over buf, which holds n events, after one
// untimed pass (the files' paths are built, and reported files tracked),
// and reports ns/event.
func benchEvents(b *testing.B, fa *Fanotify, buf []byte, n int) {
	ctx := context.Background()
	fa.events(ctx, buf)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		fa.events(ctx, buf)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}

// BenchmarkFanotifyEvents measures the daemon's side of an event on a file
// it already knows (directory and file handles cached): parsing, the tree
// check and the report to the sink, with the 1,000 files in one directory
// ("dirs=1": consecutive events in one directory, as lastDir serves) and
// each in its own ("dirs=1000": every event in another directory than the
// one before). The figure to read is ns/event, and allocs/op, which must
// be 0.
func BenchmarkFanotifyEvents(b *testing.B) {
	for _, ndirs := range []int{1, 1000} {
		b.Run(fmt.Sprintf("dirs=%d", ndirs), func(b *testing.B) {
			s := &nopSink{}
			fa := fakeFanotify(42, []tree.Tree{{Root: "/srv/data", Recursive: true}}, s, Options{})
			const files = 1000
			buf := fa.knownFiles(42, 0, files, ndirs)
			benchEvents(b, fa, buf, files)
			if s.n != (b.N+1)*files {
				b.Fatalf("sink saw %d events, want %d", s.n, (b.N+1)*files)
			}
		})
	}
}

// singleSink hands a batch to the Registry one report at a time, as the
// fanotify backend reported each event before batches.
type singleSink struct{ *bdi.Registry }

func (s singleSink) MarkInodesDirty(ms []bdi.Mark) {
	for i := range ms {
		m := &ms[i]
		mark := s.MarkInodeDirty
		if m.Closed {
			mark = s.MarkInodeClosed
		}
		m.Err = mark(m.Path, m.Key, m.Handle, m.Tree)
	}
}

// BenchmarkFanotifyEventsRegistry is BenchmarkFanotifyEvents with a real
// bdi.Registry as the sink (files already tracked and dirty, the usual
// case under a stream of writes), the reports handed over in batches
// ("batch", bdi.Registry.MarkInodesDirty) and one by one ("single").
func BenchmarkFanotifyEventsRegistry(b *testing.B) {
	for _, mode := range []string{"batch", "single"} {
		b.Run(mode, func(b *testing.B) {
			reg := bdi.NewRegistry(bdi.Options{
				Config: bdi.Config{DirtyWritebackInterval: time.Hour, MinPause: time.Millisecond,
					MaxPause: 100 * time.Millisecond, QueueDepth: 1, AttemptTimeout: time.Minute},
				Resolve: func(uint64, string) (string, error) { return "7:0", nil },
			})
			defer reg.Stop()
			var sink Sink = reg
			if mode == "single" {
				sink = singleSink{reg}
			}
			fa := fakeFanotify(7, []tree.Tree{{Root: "/srv/data", Recursive: true, Expire: time.Hour}}, sink, Options{})
			const files = 1000
			buf := fa.knownFiles(7, 1, files, 1)
			benchEvents(b, fa, buf, files)
			if n := reg.Devices()[0].Tracked(); n != files {
				b.Fatalf("%d files tracked, want %d", n, files)
			}
		})
	}
}

// BenchmarkFanotifyDirOutsideTrees measures a directory removed outside
// every tree (FAN_DELETE|FAN_ONDIR, its parent's path cached), with 10,
// 1,000 and 10,000 trees whose roots exist: the figure, ns/event, must not
// grow with the number of trees.
func BenchmarkFanotifyDirOutsideTrees(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("trees=%d", n), func(b *testing.B) {
			dir := b.TempDir()
			trees := make([]tree.Tree, n)
			for i := range trees {
				trees[i] = tree.Tree{Root: filepath.Join(dir, fmt.Sprintf("t%05d", i)), Recursive: true}
				if err := os.Mkdir(trees[i].Root, 0o755); err != nil {
					b.Fatal(err)
				}
			}
			fa := fakeFanotify(42, trees, &nopSink{}, Options{})
			if err := fa.recordRoots(); err != nil {
				b.Fatal(err)
			}
			typ := binary.NativeEndian.AppendUint32(nil, 1)
			out := filepath.Join(dir, "outside")
			dirKey := string(fa.cacheKey(testFsid[:], typ, []byte("out")))
			ev := fanEventMask(testFsid, []byte("out"), nil, "d", unix.FAN_DELETE|unix.FAN_ONDIR)
			ctx := context.Background()
			b.ResetTimer()
			for b.Loop() {
				if _, ok := fa.dirs[dirKey]; !ok {
					fa.dirs[dirKey] = &fanotifyDir{path: out, prefix: out + "/"}
				}
				fa.events(ctx, ev)
			}
			b.StopTimer()
			for _, t := range fa.list() {
				if t.gone {
					b.Fatalf("the tree %s was found gone", t.Root)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/event")
		})
	}
}
