package bdi

import (
	"encoding/binary"
	"errors"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"flusherd/inode"
	"flusherd/policy"
	"flusherd/tree"
)

// memOpener is an inode.HandleOpener for BenchmarkTrackedInodeMemory: it
// gives every file an ext4-shaped handle (4 bytes of handle_type, then 8
// bytes of f_handle: the inode number and a generation), made fresh at each
// call as Handles.HandleOf makes it. Nothing is opened.
type memOpener struct{}

func (memOpener) Open(string, inode.Key) (inode.File, error) {
	return nil, errors.New("memOpener opens nothing")
}

func (memOpener) HandleOf(_ string, key inode.Key) (inode.Handle, error) {
	var fh [8]byte
	binary.NativeEndian.PutUint32(fh[:4], uint32(key.Ino))
	binary.NativeEndian.PutUint32(fh[4:], 0x5eed)
	return inode.MakeHandle(1, fh[:]), nil // FILEID_INO32_GEN
}

func (memOpener) OpenHandle(inode.Handle, inode.Key) (inode.File, error) {
	return nil, errors.New("memOpener opens nothing")
}

// liveHeap returns the heap's live bytes and objects after a full
// collection.
func liveHeap() (bytes, objects uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.HeapObjects
}

// BenchmarkTrackedInodeMemory measures the live heap a Writeback keeps per
// tracked inode: n files (directories of 1,000 files named like
// "f012345", under /srv/data) are marked dirty through MarkInodeDirty as
// an inotify event marks them (no handle from the event: the opener's
// HandleOf gives a 12-byte ext4-shaped one), then the heap is collected
// and measured. B/inode is the heap's growth per inode (the Inode, its
// name and handle, its share of the inodes map and of the interned
// directory paths); objects/inode the growth in live heap objects per
// inode; B/struct is unsafe.Sizeof(inode.Inode{}) (the allocation is that
// rounded up to a size class). The Writeback's goroutine is not run: every
// inode stays on b_dirty, as files waiting for their expiry do.
//
// Run it with: go test ./bdi -run '^$' -bench TrackedInodeMemory -benchtime 1x
func BenchmarkTrackedInodeMemory(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var perInode, objs float64
			for range b.N {
				perInode, objs = trackedInodeMemory(n)
			}
			b.ReportMetric(perInode, "B/inode")
			b.ReportMetric(objs, "objects/inode")
			b.ReportMetric(float64(unsafe.Sizeof(inode.Inode{})), "B/struct")
		})
	}
}

// trackedInodeMemory tracks n inodes in a new Writeback and returns the
// live heap bytes and objects per inode.
func trackedInodeMemory(n int) (bytesPer, objectsPer float64) {
	epoch := time.Now()
	now := func() time.Duration { return time.Since(epoch) }
	b0, o0 := liveHeap()
	wb := New("8:0", testConfig(), now, Files{Opener: memOpener{}, Handles: memOpener{}}, nil, nil)
	tr := tree.Tree{Expire: 30 * time.Second}
	buf := make([]byte, 0, 64)
	for i := range n {
		buf = append(buf[:0], "/srv/data/d"...)
		buf = appendPadded(buf, i/1000, 4)
		buf = append(buf, "/f"...)
		buf = appendPadded(buf, i, 6)
		wb.MarkInodeDirty(inode.Key{Dev: 8<<8 | 1, Ino: uint64(1000 + i)}, string(buf), "", tr)
	}
	buf = nil
	b1, o1 := liveHeap()
	if got := wb.Tracked(); got != n {
		panic("tracked " + strconv.Itoa(got) + " inodes, want " + strconv.Itoa(n))
	}
	runtime.KeepAlive(wb)
	return float64(int64(b1)-int64(b0)) / float64(n), float64(int64(o1)-int64(o0)) / float64(n)
}

// appendPadded appends v in decimal, zero-padded to width digits.
func appendPadded(buf []byte, v, width int) []byte {
	s := strconv.Itoa(v)
	for range width - len(s) {
		buf = append(buf, '0')
	}
	return append(buf, s...)
}

// BenchmarkCandidateMemory reports the live heap per candidate of the
// sweep (Opened), each with its own path and a 12-byte file handle, as
// the watcher reports them.
func BenchmarkCandidateMemory(b *testing.B) {
	const n = 100_000
	var per float64
	for range b.N {
		epoch := time.Now()
		now := func() time.Duration { return time.Since(epoch) }
		cfg := testConfig()
		cfg.SweepInterval = policy.SweepAuto
		b0, _ := liveHeap()
		wb := New("8:0", cfg, now, Files{Opener: memOpener{}, Handles: memOpener{}}, nil, nil)
		tr := tree.Tree{Root: "/srv/data", Expire: 30 * time.Second}
		buf := make([]byte, 0, 64)
		reports := make([]Open, 1)
		for i := range n {
			buf = append(buf[:0], "/srv/data/d"...)
			buf = appendPadded(buf, i/1000, 4)
			buf = append(buf, "/f"...)
			buf = appendPadded(buf, i, 6)
			h := inode.MakeHandle(1, binary.NativeEndian.AppendUint64(binary.NativeEndian.AppendUint32(nil, uint32(i)), uint64(i)))
			reports[0] = Open{Path: string(buf), Key: inode.Key{Dev: 8<<8 | 1, Ino: uint64(1000 + i)}, Handle: h, Tree: tr, Open: true}
			wb.Opened(reports)
		}
		reports = nil
		b1, _ := liveHeap()
		if got := wb.Candidates(); got != n {
			b.Fatalf("%d candidates, want %d", got, n)
		}
		runtime.KeepAlive(wb)
		per = float64(int64(b1)-int64(b0)) / n
	}
	b.ReportMetric(per, "B/candidate")
}
