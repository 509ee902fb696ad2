package watch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

// batchSink is a sink with MarkInodesDirty and MarkInodeClosed that
// records each batch and refuses the inodes in fail with their error.
type batchSink struct {
	nopSink
	closed  int
	batches [][]bdi.Mark
	fail    map[uint64]error // by inode number
}

func (s *batchSink) MarkInodeClosed(string, inode.Key, inode.Handle, tree.Tree) error {
	s.closed++
	return nil
}

func (s *batchSink) MarkInodesDirty(ms []bdi.Mark) {
	s.batches = append(s.batches, slices.Clone(ms))
	for i := range ms {
		ms[i].Err = s.fail[ms[i].Key.Ino]
	}
}

// TestFanotifyBatchReports: the file reports of one read reach the sink
// in batches of at most pendingMax, in the order of the events, each with
// its path, key, handle and tree, a close with no write marked Closed,
// and none one by one; a report refused for want of
// resources (EMFILE) makes the scan incomplete (rescans follow), another
// refusal is logged with the file's path.
func TestFanotifyBatchReports(t *testing.T) {
	s := &batchSink{fail: map[uint64]error{
		3: fmt.Errorf("bdi: naming the device: %w", unix.EMFILE),
		5: errors.New("bdi: shutting down"),
	}}
	core, logs := observer.New(zap.InfoLevel)
	tr := tree.Tree{Root: "/srv/data", Recursive: true, Expire: time.Minute}
	fa := fakeFanotify(42, []tree.Tree{tr}, s, Options{Log: zap.New(core), RetryMin: time.Hour, RetryMax: time.Hour})
	const files = pendingMax + 44
	buf := fa.knownFiles(42, 0, files, 1)
	// The eighth event: a close with no write.
	for i, b := 0, buf; ; i++ {
		if i == 7 {
			binary.NativeEndian.PutUint64(b[8:], unix.FAN_CLOSE_WRITE)
			break
		}
		b = b[binary.NativeEndian.Uint32(b):]
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
		want := bdi.Mark{Path: fmt.Sprintf("/srv/data/d0/f%d", i), Key: inode.Key{Dev: 42, Ino: uint64(i)},
			Handle: inode.MakeHandle(1, binary.NativeEndian.AppendUint64(nil, uint64(i))), Tree: tr, Closed: i == 7}
		if m != want {
			t.Errorf("report %d: %+v, want %+v", i, m, want)
		}
	}
	if n := fa.retry.failures.Load(); n != 1 || !fa.retry.due.Load() {
		t.Errorf("after a report refused with EMFILE: %d incomplete scans, rescan due %v; want 1, true", n, fa.retry.due.Load())
	}
	refused := logs.FilterMessage("cannot track file").All()
	if len(refused) != 1 || refused[0].ContextMap()["path"] != "/srv/data/d0/f5" {
		t.Errorf("refusals logged: %+v, want one for /srv/data/d0/f5", refused)
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
	fsid := testFsid
	s := &batchSink{}
	fa := fakeFanotify(42, []tree.Tree{{Root: "/srv/data", Recursive: true}}, s, Options{})
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

// orderSink records every report in the order the sink got it, one by
// one ("now") or in a batch ("batch").
type orderSink struct {
	nopSink
	log []string
}

func (s *orderSink) MarkInodeDirty(path string, _ inode.Key, _ inode.Handle, _ tree.Tree) error {
	s.log = append(s.log, "now "+path)
	return nil
}

func (s *orderSink) MarkInodesDirty(ms []bdi.Mark) {
	for _, m := range ms {
		s.log = append(s.log, "batch "+m.Path)
	}
}

// TestFanotifyReportOrder: the reports of one read reach the sink in the
// order of their events, batched or not: a write, then the file renamed
// (a directory-entry event, reported by name at once), then written again
// under its new name. Were the write held back past the rename, the file
// would end under its old name, which no longer exists (a sync of the new
// one would miss it, and a tree that held the old one would drop it when
// it went).
func TestFanotifyReportOrder(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	newPath := filepath.Join(root, "b", "g")
	if err := os.WriteFile(newPath, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	key := keyOf(t, newPath)
	s := &orderSink{}
	fa := fakeFanotify(key.Dev, []tree.Tree{{Root: root, Recursive: true}}, s, Options{})
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	dirA, dirB, fh := []byte("dirA...."), []byte("dirB...."), []byte("filehndl")
	for h, p := range map[string]string{string(dirA): filepath.Join(root, "a"), string(dirB): filepath.Join(root, "b")} {
		fa.dirs[string(fa.cacheKey(testFsid[:], typ, []byte(h)))] = &fanotifyDir{path: p, prefix: p + "/", tree: fa.list()[0]}
	}
	fa.files[string(fa.cacheKey(testFsid[:], typ, fh))] = &fanotifyTarget{key: key, regular: true, handle: inode.MakeHandle(1, fh)}
	buf := slices.Concat(
		fanEvent(testFsid, dirA, fh, "f"),
		fanEventMask(testFsid, dirB, nil, "g", unix.FAN_MOVED_TO),
		fanEvent(testFsid, dirB, fh, "g"),
	)
	fa.events(context.Background(), buf)
	want := []string{"batch " + filepath.Join(root, "a", "f"), "now " + newPath, "batch " + newPath}
	if !slices.Equal(s.log, want) {
		t.Errorf("reports in the order %q, want %q", s.log, want)
	}
}

// TestFanotifyTargetFID: with FAN_REPORT_TARGET_FID, the events of a
// directory entry made (a file created, or moved in) carry the file's
// handle: they are reported by handle with the read's other reports, in
// their order and not as closes, with no look-up by name (none is made one
// by one); a rename's report gives the file its new name.
func TestFanotifyTargetFID(t *testing.T) {
	s := &batchSink{}
	tr := tree.Tree{Root: "/srv/data", Recursive: true}
	fa := fakeFanotify(42, []tree.Tree{tr}, s, Options{})
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	dir, fh := []byte("dirhandl"), []byte("filehndl")
	fa.dirs[string(fa.cacheKey(testFsid[:], typ, dir))] = &fanotifyDir{path: "/srv/data/d", prefix: "/srv/data/d/", tree: fa.list()[0]}
	fa.files[string(fa.cacheKey(testFsid[:], typ, fh))] = &fanotifyTarget{key: inode.Key{Dev: 42, Ino: 7}, regular: true, handle: inode.MakeHandle(1, fh)}
	buf := slices.Concat(
		fanEventMask(testFsid, dir, fh, "c", unix.FAN_CREATE),
		fanEvent(testFsid, dir, fh, "c"),
		fanEventMask(testFsid, dir, fh, "c", unix.FAN_CLOSE_WRITE),
		fanEventMask(testFsid, dir, fh, "n", unix.FAN_MOVED_TO),
	)
	fa.events(context.Background(), buf)
	if s.n != 0 || s.closed != 0 {
		t.Errorf("%d writes and %d closes reported one by one, want none", s.n, s.closed)
	}
	var got []string
	for _, b := range s.batches {
		for _, m := range b {
			got = append(got, fmt.Sprintf("%s closed=%v", m.Path, m.Closed))
		}
	}
	want := []string{"/srv/data/d/c closed=false", "/srv/data/d/c closed=false", "/srv/data/d/c closed=true", "/srv/data/d/n closed=false"}
	if len(s.batches) != 1 || !slices.Equal(got, want) {
		t.Errorf("%d batches: %q, want one: %q", len(s.batches), got, want)
	}
}

// fanEventSelf is an event on an object itself (FAN_DELETE_SELF): its
// handle only, no directory and name, as FAN_REPORT_FID gives it.
func fanEventSelf(fsid [8]byte, file []byte, mask uint64) []byte {
	ev := fanEventMask(fsid, []byte{}, file, "", mask)
	// Cut the DFID_NAME record (the first) out.
	info := ev[unix.FAN_EVENT_METADATA_LEN:]
	rec := int(binary.NativeEndian.Uint16(info[2:]))
	out := append(slices.Clone(ev[:unix.FAN_EVENT_METADATA_LEN]), info[rec:]...)
	binary.NativeEndian.PutUint32(out, uint32(len(out)))
	return out
}

// unlinkOrderSink is an orderSink told of deleted names ("unlinked").
type unlinkOrderSink struct{ orderSink }

func (s *unlinkOrderSink) InodeUnlinked(key inode.Key, h inode.Handle) {
	s.log = append(s.log, fmt.Sprintf("unlinked %d:%d %s", key.Dev, key.Ino, h))
}

// TestFanotifyUnlinked: a file's name deleted, with the file's own handle
// (FAN_DELETE under FAN_REPORT_TARGET_FID), is told to the sink
// (InodeUnlinked) with the file's key and handle, after the reports read
// before it, and after the write the kernel merged into the same event;
// the handle leaves the cache. A file no event reported (its handle not
// cached: found by a scan, or the cache emptied) is told of by the inode
// number its handle begins with (inode.HandleIno). A deletion whose handle
// has no number to read, of a directory, or without the file's handle
// tells nothing. A file deleted itself (FAN_DELETE_SELF, which a file
// replaced by a rename over its name and a file deleted while open make,
// the latter at its last close) is told of alike.
func TestFanotifyUnlinked(t *testing.T) {
	s := &unlinkOrderSink{}
	tr := tree.Tree{Root: "/srv/data", Recursive: true}
	fa := fakeFanotify(42, []tree.Tree{tr}, s, Options{})
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	dir, fh, gh, sub, unknown, short, victim := []byte("dirhandl"), []byte("filehndl"), []byte("fileg..."), []byte("subdir.."), []byte("unknown."), []byte("shrt"), []byte("victim..")
	fa.dirs[string(fa.cacheKey(testFsid[:], typ, dir))] = &fanotifyDir{path: "/srv/data/d", prefix: "/srv/data/d/", tree: fa.list()[0]}
	fa.files[string(fa.cacheKey(testFsid[:], typ, fh))] = &fanotifyTarget{key: inode.Key{Dev: 42, Ino: 7}, regular: true, handle: inode.MakeHandle(1, fh)}
	fa.files[string(fa.cacheKey(testFsid[:], typ, gh))] = &fanotifyTarget{key: inode.Key{Dev: 42, Ino: 8}, regular: true, handle: inode.MakeHandle(1, gh)}
	fa.files[string(fa.cacheKey(testFsid[:], typ, sub))] = &fanotifyTarget{key: inode.Key{Dev: 42, Ino: 9}, regular: true, handle: inode.MakeHandle(1, sub)}
	buf := slices.Concat(
		fanEvent(testFsid, dir, fh, "f"),
		fanEventMask(testFsid, dir, fh, "f", unix.FAN_DELETE),
		fanEventMask(testFsid, dir, gh, "g", unix.FAN_MODIFY|unix.FAN_DELETE),
		fanEventMask(testFsid, dir, unknown, "u", unix.FAN_DELETE),
		fanEventMask(testFsid, dir, short, "s", unix.FAN_DELETE),
		fanEventMask(testFsid, dir, nil, "n", unix.FAN_DELETE),
		fanEventMask(testFsid, dir, sub, "sub", unix.FAN_DELETE|unix.FAN_ONDIR),
		fanEventSelf(testFsid, victim, unix.FAN_DELETE_SELF),
	)
	fa.events(context.Background(), buf)
	want := []string{
		"batch /srv/data/d/f", "unlinked 42:7 " + string(inode.MakeHandle(1, fh)),
		"batch /srv/data/d/g", "unlinked 42:8 " + string(inode.MakeHandle(1, gh)),
		fmt.Sprintf("unlinked 42:%d %s", binary.NativeEndian.Uint32(unknown), inode.MakeHandle(1, unknown)),
		fmt.Sprintf("unlinked 42:%d %s", binary.NativeEndian.Uint32(victim), inode.MakeHandle(1, victim)),
	}
	if !slices.Equal(s.log, want) {
		t.Errorf("the sink was told %q, want %q", s.log, want)
	}
	for _, h := range [][]byte{fh, gh} {
		if _, ok := fa.files[string(fa.cacheKey(testFsid[:], typ, h))]; ok {
			t.Errorf("handle %q still cached after its file's deletion", h)
		}
	}
	if _, ok := fa.files[string(fa.cacheKey(testFsid[:], typ, sub))]; !ok {
		t.Errorf("a directory's deletion took handle %q out of the cache", sub)
	}
}
