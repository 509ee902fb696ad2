package watch

import (
	"context"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

// openSink is a batchSink that records the open and close reports.
type openSink struct {
	batchSink
	opens []bdi.Open
}

func (s *openSink) InodesOpened(os []bdi.Open) { s.opens = append(s.opens, slices.Clone(os)...) }

// withPid sets the pid of each event of buf.
func withPid(buf []byte, pid int32) []byte {
	for b := buf; len(b) > 0; b = b[binary.NativeEndian.Uint32(b):] {
		binary.NativeEndian.PutUint32(b[20:], uint32(pid))
	}
	return buf
}

// withMask sets the mask of each event of buf.
func withMask(buf []byte, mask uint64) []byte {
	for b := buf; len(b) > 0; b = b[binary.NativeEndian.Uint32(b):] {
		binary.NativeEndian.PutUint64(b[8:], mask)
	}
	return buf
}

// TestFanotifyOpens: with Options.Opens, the opens and closes of a tree's
// files by another process reach the sink (InodesOpened) with the file's
// path, key, handle and tree and which of open and close the event
// carries, and an open or close-without-write is not taken for a write; a
// close after writing is both a close and a write. The daemon's own
// events (its pid) are not reported, nor events outside the trees, nor
// anything without Options.Opens.
func TestFanotifyOpens(t *testing.T) {
	const daemon, other = 100, 200
	tr := tree.Tree{Root: "/srv/data", Recursive: true, Expire: time.Minute}
	for _, c := range []struct {
		name       string
		opens      bool
		pid        int32
		mask       uint64
		wantOpen   bool
		wantCloses int
		reported   bool
		writes     int
	}{
		{"open", true, other, unix.FAN_OPEN, true, 0, true, 0},
		{"close-nowrite", true, other, unix.FAN_CLOSE_NOWRITE, false, 1, true, 0},
		{"close-write", true, other, unix.FAN_CLOSE_WRITE, false, 1, true, 1},
		{"open-and-close merged", true, other, unix.FAN_OPEN | unix.FAN_CLOSE_NOWRITE, true, 1, true, 0},
		{"both closes merged", true, other, unix.FAN_CLOSE_WRITE | unix.FAN_OPEN | unix.FAN_CLOSE_NOWRITE, true, 2, true, 1},
		{"own open", true, daemon, unix.FAN_OPEN | unix.FAN_CLOSE_NOWRITE, false, 0, false, 0},
		{"own close-write", true, daemon, unix.FAN_CLOSE_WRITE, false, 0, false, 1},
		{"opens off", false, other, unix.FAN_OPEN, false, 0, false, 0},
		{"modify", true, other, unix.FAN_MODIFY, false, 0, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &openSink{}
			fa := fakeFanotify(42, []tree.Tree{tr}, s, Options{Opens: c.opens})
			fa.opens, fa.pid = c.opens, daemon
			buf := withPid(withMask(fa.knownFiles(42, 0, 3, 1), c.mask), c.pid)
			fa.events(context.Background(), buf)
			writes := len(slices.Concat(s.batches...))
			if writes != 3*c.writes {
				t.Errorf("%d write reports, want %d", writes, 3*c.writes)
			}
			if !c.reported {
				if len(s.opens) != 0 {
					t.Errorf("open reports %+v, want none", s.opens)
				}
				return
			}
			if len(s.opens) != 3 {
				t.Fatalf("%d open reports, want 3: %+v", len(s.opens), s.opens)
			}
			for i, o := range s.opens {
				want := bdi.Open{Path: "/srv/data/d0/f" + string(rune('0'+i)), Key: inode.Key{Dev: 42, Ino: uint64(i)},
					Handle: inode.MakeHandle(1, binary.NativeEndian.AppendUint64(nil, uint64(i))), Tree: tr,
					Open: c.wantOpen, Closes: c.wantCloses}
				if o != want {
					t.Errorf("report %d: %+v, want %+v", i, o, want)
				}
			}
			if len(fa.pendingOpens) != 0 {
				t.Errorf("%d open reports still pending after the read", len(fa.pendingOpens))
			}
		})
	}
	// Outside the trees (the directory cache holds no tree for its
	// directory, as dirOf caches one outside them): nothing.
	s := &openSink{}
	fa := fakeFanotify(42, []tree.Tree{tr}, s, Options{Opens: true})
	fa.opens, fa.pid = true, daemon
	buf := withPid(withMask(fa.knownFiles(42, 0, 3, 1), unix.FAN_OPEN), other)
	for _, d := range fa.dirs {
		d.tree = nil
	}
	fa.events(context.Background(), buf)
	if len(s.opens) != 0 {
		t.Errorf("opens outside the trees reported: %+v", s.opens)
	}
}

// TestFanotifyOpensMask: with Options.Opens the marks ask for FAN_OPEN and
// FAN_CLOSE_NOWRITE, and the quieted files' ignore marks drop FAN_MODIFY
// only (a dropped close would leave an open count too high for good).
func TestFanotifyOpensMask(t *testing.T) {
	fa := &Fanotify{}
	fsMask, mntMask := fa.masks()
	if fsMask&opensMask != 0 || mntMask&opensMask != 0 {
		t.Errorf("without opens: masks %#x, %#x ask for opens", fsMask, mntMask)
	}
	fa.opens = true
	fsMask, mntMask = fa.masks()
	if fsMask&opensMask != opensMask || mntMask&opensMask != opensMask || fsMask&fanotifyMask != fanotifyMask {
		t.Errorf("with opens: masks %#x, %#x", fsMask, mntMask)
	}
	if quietMaskOpens&(unix.FAN_CLOSE_WRITE|unix.FAN_OPEN|unix.FAN_CLOSE_NOWRITE) != 0 {
		t.Errorf("quietMaskOpens %#x drops opens or closes", quietMaskOpens)
	}
}
