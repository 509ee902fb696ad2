package watch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
)

// batchSink is a BatchSink and ClosedSink that records each batch and
// refuses the inodes in fail with their error.
type batchSink struct {
	nopSink
	closed  int
	batches [][]bdi.Mark
	fail    map[uint64]error // by inode number
}

func (s *batchSink) MarkInodeClosed(string, inode.Key, inode.Handle, bdi.Tree) error {
	s.closed++
	return nil
}

func (s *batchSink) MarkInodesDirty(ms []bdi.Mark) {
	s.batches = append(s.batches, slices.Clone(ms))
	for i := range ms {
		ms[i].Err = s.fail[ms[i].Key.Ino]
	}
}

// TestFanotifyBatchReports: with a BatchSink, the file reports of one read
// reach the sink in batches of at most pendingMax, in the order of the
// events, each with its path, key, handle and tree, a close with no write
// marked Closed, and none one by one; a report refused for want of
// resources (EMFILE) makes the scan incomplete (rescans follow), another
// refusal is logged with the file's path.
func TestFanotifyBatchReports(t *testing.T) {
	fsid := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	s := &batchSink{fail: map[uint64]error{
		3: fmt.Errorf("bdi: naming the device: %w", unix.EMFILE),
		5: errors.New("bdi: shutting down"),
	}}
	core, logs := observer.New(zap.InfoLevel)
	fa := &Fanotify{fsids: map[[8]byte]uint64{fsid: 42}, mounts: map[uint64]bool{},
		dirs: map[string]*fanotifyDir{}, files: map[string]*fanotifyTarget{}}
	tree := Tree{Root: "/srv/data", Recursive: true, Tree: bdi.Tree{Expire: time.Minute}}
	fa.init([]Tree{tree}, s, Options{Log: zap.New(core), RetryMin: time.Hour, RetryMax: time.Hour})
	const files = pendingMax + 44
	var buf []byte
	dirH := []byte("dirhandl")
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	fa.dirs[string(fa.cacheKey(fsid[:], typ, dirH))] = &fanotifyDir{path: "/srv/data/d", prefix: "/srv/data/d/", tree: fa.list()[0]}
	for i := range files {
		fh := binary.NativeEndian.AppendUint64(nil, uint64(i))
		ev := fanEvent(fsid, dirH, fh, fmt.Sprintf("f%d", i))
		if i == 7 {
			binary.NativeEndian.PutUint64(ev[8:], unix.FAN_CLOSE_WRITE) // closed, no write
		}
		buf = append(buf, ev...)
		fa.files[string(fa.cacheKey(fsid[:], typ, fh))] = &fanotifyTarget{key: inode.Key{Dev: 42, Ino: uint64(i)}, regular: true, handle: inode.MakeHandle(1, fh)}
	}
	if !fa.events(context.Background(), buf) {
		t.Error("events in a tree reported as not relevant")
	}
	if s.n != 0 || s.closed != 0 {
		t.Errorf("%d writes and %d closes reported one by one, want none", s.n, s.closed)
	}
	if len(s.batches) != 2 || len(s.batches[0]) != pendingMax {
		t.Fatalf("batches of %d reports, want %d then %d", lens(s.batches), pendingMax, files-pendingMax)
	}
	all := slices.Concat(s.batches...)
	if len(all) != files {
		t.Fatalf("%d reports, want %d", len(all), files)
	}
	for i, m := range all {
		want := bdi.Mark{Path: fmt.Sprintf("/srv/data/d/f%d", i), Key: inode.Key{Dev: 42, Ino: uint64(i)},
			Handle: inode.MakeHandle(1, binary.NativeEndian.AppendUint64(nil, uint64(i))), Tree: tree.Tree, Closed: i == 7}
		if m != want {
			t.Errorf("report %d: %+v, want %+v", i, m, want)
		}
	}
	if n := fa.retry.failures.Load(); n != 1 || !fa.retry.due.Load() {
		t.Errorf("after a report refused with EMFILE: %d incomplete scans, rescan due %v; want 1, true", n, fa.retry.due.Load())
	}
	refused := logs.FilterMessage("cannot track file").All()
	if len(refused) != 1 || refused[0].ContextMap()["path"] != `"/srv/data/d/f5"` {
		t.Errorf("refusals logged: %+v, want one for /srv/data/d/f5", refused)
	}
	if len(fa.pending) != 0 {
		t.Errorf("%d reports still pending after the read", len(fa.pending))
	}
}

func lens(b [][]bdi.Mark) []int {
	var out []int
	for _, x := range b {
		out = append(out, len(x))
	}
	return out
}

// TestFanotifyLastDirCleared: the directory of the last event (lastDir)
// serves the next event in it only until the directory cache is cleared
// (a directory moved, a tree added or removed): an event after that gets
// the directory's path as the cache then holds it, not the stale one.
func TestFanotifyLastDirCleared(t *testing.T) {
	fsid := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	s := &batchSink{}
	fa := &Fanotify{fsids: map[[8]byte]uint64{fsid: 42}, mounts: map[uint64]bool{},
		dirs: map[string]*fanotifyDir{}, files: map[string]*fanotifyTarget{}}
	fa.init([]Tree{{Root: "/srv/data", Recursive: true}}, s, Options{})
	dirH, fh := []byte("dirhandl"), []byte("filehndl")
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	ev := fanEvent(fsid, dirH, fh, "f")
	setDir := func(p string) {
		fa.cmu.Lock()
		fa.dirs[string(fa.cacheKey(fsid[:], typ, dirH))] = &fanotifyDir{path: p, prefix: p + "/", tree: fa.list()[0]}
		fa.cmu.Unlock()
	}
	setTarget := func() {
		fa.cmu.Lock()
		fa.files[string(fa.cacheKey(fsid[:], typ, fh))] = &fanotifyTarget{key: inode.Key{Dev: 42, Ino: 9}, regular: true, handle: inode.MakeHandle(1, fh)}
		fa.cmu.Unlock()
	}
	setDir("/srv/data/old")
	setTarget()
	fa.events(context.Background(), ev)
	fa.events(context.Background(), ev) // from lastDir
	fa.clearCaches()                    // as after a directory moved
	setDir("/srv/data/new")
	setTarget()
	fa.events(context.Background(), ev)
	var got []string
	for _, b := range s.batches {
		for _, m := range b {
			got = append(got, m.Path)
		}
	}
	want := []string{"/srv/data/old/f", "/srv/data/old/f", "/srv/data/new/f"}
	if !slices.Equal(got, want) {
		t.Errorf("paths reported %q, want %q", got, want)
	}
}

// TestFanotifyDevOfRemapped: devOf's remembered answer stands only until
// the fsid is mapped again (a filesystem with the same fsid mounted from
// another device after the first was unmounted); an unknown fsid is not
// taken for the last one.
func TestFanotifyDevOfRemapped(t *testing.T) {
	fsid, other := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}, [8]byte{9}
	fa := &Fanotify{fsids: map[[8]byte]uint64{}}
	fa.setFsid(fsid, 42)
	for range 2 {
		if dev, ok := fa.devOf(fsid[:]); dev != 42 || !ok {
			t.Fatalf("devOf = %d, %v; want 42", dev, ok)
		}
	}
	if dev, ok := fa.devOf(other[:]); ok {
		t.Errorf("an unmarked fsid: devOf = %d, true", dev)
	}
	fa.setFsid(fsid, 43)
	if dev, ok := fa.devOf(fsid[:]); dev != 43 || !ok {
		t.Errorf("after the fsid was mapped again: devOf = %d, %v; want 43", dev, ok)
	}
}
