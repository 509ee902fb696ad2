package inode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// recFile records the writeback calls made on it and fails them as told.
type recFile struct {
	calls                  []string
	syncErr, startErr, csE error
	dirty, writeback       uint64
}

func (f *recFile) Cachestat(off, n int64) (uint64, uint64, error) {
	f.calls = append(f.calls, "cachestat")
	return f.dirty, f.writeback, f.csE
}
func (f *recFile) StartWriteback(off, n int64) error {
	f.calls = append(f.calls, "start "+strconv.FormatInt(off, 10)+"+"+strconv.FormatInt(n, 10))
	return f.startErr
}
func (f *recFile) DataSync() error      { f.calls = append(f.calls, "fdatasync"); return f.syncErr }
func (f *recFile) Size() (int64, error) { return 0, nil }
func (f *recFile) Close() error         { return nil }

// TestWriteDo: each kind of write makes exactly its calls, in order, and
// reports what it left; errors stop it and are returned as they are.
func TestWriteDo(t *testing.T) {
	eio := unix.EIO
	for _, tc := range []struct {
		name  string
		w     Write
		f     recFile
		calls []string
		want  Written
		err   error
	}{
		{"whole file", Write{}, recFile{}, []string{"start 0+0"}, Written{Started: true}, nil},
		{"windows in order", Write{Windows: []Window{{Off: 8192, Len: 4096}, {Off: 0, Len: 4096}}}, recFile{},
			[]string{"start 8192+4096", "start 0+4096"}, Written{Started: true}, nil},
		{"a window fails: the rest are not started", Write{Windows: []Window{{Off: 0, Len: 4096}, {Off: 8192, Len: 4096}}}, recFile{startErr: unix.EINVAL},
			[]string{"start 0+4096"}, Written{Started: true}, unix.EINVAL},
		{"sync: the counts after", Write{Sync: true}, recFile{dirty: 1, writeback: 2},
			[]string{"fdatasync", "cachestat"}, Written{Dirty: 1, Writeback: 2, AfterKnown: true}, nil},
		{"synced by a syncfs: only the counts", Write{Sync: true, Synced: true}, recFile{},
			[]string{"cachestat"}, Written{AfterKnown: true}, nil},
		{"fdatasync fails: no count", Write{Sync: true}, recFile{syncErr: eio},
			[]string{"fdatasync"}, Written{}, eio},
		{"the count after fails", Write{Sync: true}, recFile{csE: unix.EAGAIN},
			[]string{"fdatasync", "cachestat"}, Written{}, unix.EAGAIN},
	} {
		f := tc.f
		got, err := tc.w.Do(&f)
		if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.err)
		}
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		if !slices.Equal(f.calls, tc.calls) {
			t.Errorf("%s: calls %q, want %q", tc.name, f.calls, tc.calls)
		}
	}
}

// TestWriteDoReal: on a real file, a sync leaves no dirty and no
// writeback pages, read at once; a started window is clean once the
// device is done.
func TestWriteDoReal(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	write := func(name string) File {
		t.Helper()
		p := filepath.Join(mnt.Dir, name)
		if err := os.WriteFile(p, make([]byte, 256<<10), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := (OS{}).Open(p, key(t, p))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if d, _, err := f.Cachestat(0, 0); err != nil || d == 0 {
			t.Fatalf("precondition: %s has %d dirty pages (%v) right after its write", name, d, err)
		}
		return f
	}
	f := write("synced")
	out, err := Write{Sync: true}.Do(f)
	if err != nil || !out.AfterKnown || out.Dirty != 0 || out.Writeback != 0 {
		t.Errorf("sync: %+v, %v; want clean and known", out, err)
	}
	g := write("started")
	out, err = Write{Windows: []Window{{Off: 0, Len: 128 << 10}}}.Do(g)
	if err != nil || !out.Started || out.AfterKnown {
		t.Fatalf("start of the first half: %+v, %v", out, err)
	}
	// (The filesystem may write more than the range: ext4 maps whole
	// delayed-allocation extents. Which windows are started is
	// TestWriteDo's.)
	var d, wbp uint64
	if !testwait.Poll(10*time.Second, func() bool { d, wbp, _ = g.Cachestat(0, 128<<10); return d == 0 && wbp == 0 }) {
		t.Errorf("10 s after starting the first half: %d dirty, %d writeback pages in it", d, wbp)
	}
}

// TestOpenTracked: by path without a handle or without handles; by handle
// after a rename; a filesystem not registered for handles by path; a
// deleted file whose number a new file took is opened by the new file's
// handle, returned as renewed; a deleted file with no file at its path
// fails with ESTALE.
func TestOpenTracked(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	h := NewHandles()
	defer h.Close()
	if _, err := h.AddMount(mnt.Dir); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(mnt.Dir, "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := key(t, p)
	hd, err := h.HandleOf(p, k)
	if err != nil || hd == "" {
		t.Fatalf("HandleOf: %q, %v", hd, err)
	}
	open := func(path string, hs HandleOpener, hd Handle) (Handle, error) {
		t.Helper()
		f, renewed, err := OpenTracked(OS{}, hs, path, k, hd)
		if err == nil {
			f.Close()
		}
		// OpenTrackedRef, the path given as a ref, does the same.
		in := New(k)
		in.SetPath(path)
		f2, renewed2, err2 := OpenTrackedRef(OS{}, hs, in.PathRef(), k, hd)
		if err2 == nil {
			f2.Close()
		}
		if renewed2 != renewed || fmt.Sprint(err2) != fmt.Sprint(err) {
			t.Errorf("OpenTrackedRef(%s): renewed %q, %v; OpenTracked: %q, %v", path, renewed2, err2, renewed, err)
		}
		return renewed, err
	}
	if r, err := open(p, nil, hd); err != nil || r != "" {
		t.Errorf("no handles: renewed %q, %v", r, err)
	}
	moved := filepath.Join(mnt.Dir, "g")
	if err := os.Rename(p, moved); err != nil {
		t.Fatal(err)
	}
	if r, err := open(p, h, hd); err != nil || r != "" {
		t.Errorf("by handle after a rename: renewed %q, %v", r, err)
	}
	if _, err := open(p, nil, hd); !errors.Is(err, unix.ENOENT) {
		t.Errorf("by the old path without handles: %v, want ENOENT", err)
	}
	// The file deleted, and a new one given its number at its path
	// (ext4 reuses a freed number at once; retried until it does).
	var renewed Handle
	for i := 0; i < 50 && renewed == ""; i++ {
		os.Remove(moved)
		if err := os.WriteFile(moved, []byte("y"), 0o644); err != nil {
			t.Fatal(err)
		}
		if nk := key(t, moved); nk != k {
			continue
		}
		r, err := open(moved, h, hd)
		if err != nil {
			t.Fatalf("a new file with the number: %v", err)
		}
		renewed = r
	}
	if renewed == "" || renewed == hd {
		t.Fatalf("no new file took the number, or it was not renewed (%q)", renewed)
	}
	os.Remove(moved)
	if _, err := open(moved, h, renewed); !errors.Is(err, unix.ESTALE) {
		t.Errorf("deleted, nothing at its path: %v, want ESTALE", err)
	}
}

// TestOpenTrackedRefBuildsNoPath: a file that opens by its handle costs
// OpenTrackedRef no more allocations than OpenHandle itself: its path is
// not built.
func TestOpenTrackedRefBuildsNoPath(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	h := NewHandles()
	defer h.Close()
	if _, err := h.AddMount(mnt.Dir); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(mnt.Dir, "a-directory-name", "a-file-name")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := key(t, p)
	hd, err := h.HandleOf(p, k)
	if err != nil {
		t.Fatal(err)
	}
	in := New(k)
	in.SetPath(p)
	ref := in.PathRef()
	byHandle := testing.AllocsPerRun(100, func() {
		f, err := h.OpenHandle(hd, k)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	})
	byRef := testing.AllocsPerRun(100, func() {
		f, _, err := OpenTrackedRef(OS{}, h, ref, k, hd)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	})
	if byRef > byHandle {
		t.Errorf("OpenTrackedRef: %.0f allocations, OpenHandle %.0f: the path was built", byRef, byHandle)
	}
}

// TestOpenTrackedFilesystemGone: a file whose handle no directory of its
// filesystem opens any more (ENODEV) is looked for at its path: a file of
// a deleted btrfs subvolume, or of an unmounted filesystem, is gone
// (ENOENT), not its filesystem unavailable.
func TestOpenTrackedFilesystemGone(t *testing.T) {
	if _, err := exec.LookPath("btrfs"); err != nil {
		testfs.Missing(t, "btrfs (btrfs-progs) not found: %v", err)
	}
	for _, c := range []string{"subvolume deleted", "unmounted"} {
		t.Run(c, func(t *testing.T) {
			mnt := testfs.Mount(t, testfs.Options{Type: "btrfs"})
			dir := filepath.Join(mnt.Dir, "sv")
			if out, err := exec.Command("btrfs", "subvolume", "create", dir).CombinedOutput(); err != nil {
				t.Fatalf("btrfs subvolume create: %v\n%s", err, out)
			}
			if c == "unmounted" {
				dir = mnt.Dir
			}
			f := filepath.Join(dir, "f")
			if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			h := NewHandles()
			defer h.Close()
			if _, err := h.AddMount(dir); err != nil {
				t.Fatal(err)
			}
			k, hd := handleOf(t, h, f)
			if c == "unmounted" {
				if err := mnt.Unmount(); err != nil {
					t.Fatal(err)
				}
			} else if out, err := exec.Command("btrfs", "subvolume", "delete", dir).CombinedOutput(); err != nil {
				t.Fatalf("btrfs subvolume delete: %v\n%s", err, out)
			}
			// Once the held directory idles out (200 ms), the handle
			// opens through none.
			testwait.For(t, "the handle to fail with ENODEV", 5*time.Second, func() bool {
				file, err := h.OpenHandle(hd, k)
				if err == nil {
					file.Close()
				}
				return errors.Is(err, unix.ENODEV)
			})
			file, renewed, err := OpenTracked(OS{}, h, f, k, hd)
			if err == nil {
				file.Close()
			}
			if !errors.Is(err, unix.ENOENT) || renewed != "" {
				t.Errorf("OpenTracked: renewed %q, %v; want ENOENT", renewed, err)
			}
		})
	}
}
