package inode

import (
	"strings"
	"testing"
	"unsafe"
)

// TestInodeSize: an Inode is one allocation of the 64-byte size class (a
// daemon may track millions). A field that makes it larger moves it to the
// 80-byte class: 16 more bytes for every tracked file.
func TestInodeSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the size is checked on 64-bit platforms")
	}
	if got := unsafe.Sizeof(Inode{}); got != 64 {
		t.Errorf("unsafe.Sizeof(Inode{}) = %d bytes, want 64", got)
	}
}

// TestInodeNames: the name, handle and other path share one string; each
// accessor sees its own part whatever the others hold.
func TestInodeNames(t *testing.T) {
	long := strings.Repeat("n", 300) // a name whose length takes 2 bytes
	h := MakeHandle(1, []byte{0, 1, 2, 3, '/', 0x80, 0xff, 7})
	for _, p := range []string{"/a/b/f012345", "/top", "/d/" + long, "/a/b c (deleted)/d"} {
		var in Inode
		in.SetPath(p)
		if in.Path() != p || !in.HasPath(p) || in.Handle() != "" || in.OtherPath() != "" {
			t.Fatalf("%q: Path %q, Handle %q, OtherPath %q", p, in.Path(), in.Handle(), in.OtherPath())
		}
		in.SetOtherPath("/old/" + long)
		if in.Path() != p || in.OtherPath() != "/old/"+long || in.Handle() != "" {
			t.Errorf("%q with other path: Path %q, OtherPath %q, Handle %q", p, in.Path(), in.OtherPath(), in.Handle())
		}
		in.SetPath("/x/y")
		if in.Path() != "/x/y" || in.OtherPath() != "/old/"+long {
			t.Errorf("%q renamed: Path %q, OtherPath %q", p, in.Path(), in.OtherPath())
		}
		in.SetOtherPath("")
		if in.Path() != "/x/y" || in.OtherPath() != "" {
			t.Errorf("%q other path cleared: Path %q, OtherPath %q", p, in.Path(), in.OtherPath())
		}
		in.SetHandle(h)
		if in.Path() != "/x/y" || in.Handle() != h || in.OtherPath() != "" {
			t.Errorf("%q with handle: Path %q, Handle %q, OtherPath %q", p, in.Path(), in.Handle(), in.OtherPath())
		}
		in.SetOtherPath("/ignored") // a handle is kept
		in.SetHandle("")            // no handle: nothing changes
		in.SetPath(p)
		if in.Path() != p || in.Handle() != h || in.OtherPath() != "" || !in.InDir("/") {
			t.Errorf("%q with handle, moved back: Path %q, Handle %q, OtherPath %q", p, in.Path(), in.Handle(), in.OtherPath())
		}
	}
	var in Inode
	if in.Path() != "" || in.Handle() != "" || in.OtherPath() != "" {
		t.Errorf("zero Inode: Path %q, Handle %q, OtherPath %q", in.Path(), in.Handle(), in.OtherPath())
	}
	in.SetOtherPath("/other")
	if in.Path() != "" || in.OtherPath() != "/other" {
		t.Errorf("no path, other path: Path %q, OtherPath %q", in.Path(), in.OtherPath())
	}
}

// TestInodeNamesAllocs: the accessors that do not build a path allocate
// nothing (HasPath runs for every write event), and a setter makes one
// string.
func TestInodeNamesAllocs(t *testing.T) {
	var in Inode
	in.SetPath("/srv/data/d0001/f012345")
	in.SetHandle(MakeHandle(1, make([]byte, 8)))
	if n := testing.AllocsPerRun(100, func() {
		_ = in.HasPath("/srv/data/d0001/f012345") && in.InDir("/srv") && in.Handle() != "" && in.OtherPath() == ""
	}); n != 0 {
		t.Errorf("HasPath, InDir, Handle, OtherPath: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { in.SetPath("/srv/data/d0001/f012346") }); n != 1 {
		t.Errorf("SetPath of an interned directory: %v allocations, want 1", n)
	}
}

// TestInodeKey: an inode keeps its Key, device included, whatever its
// path; inodes of one directory on two devices are told apart.
func TestInodeKey(t *testing.T) {
	a, b := New(Key{Dev: 7, Ino: 12}), New(Key{Dev: 8, Ino: 12})
	for _, p := range []string{"/srv/f", "/srv/g", "rel", "/"} {
		a.SetPath(p)
		b.SetPath(p)
		if a.Key() != (Key{Dev: 7, Ino: 12}) || b.Key() != (Key{Dev: 8, Ino: 12}) || a.Path() != b.Path() {
			t.Errorf("SetPath(%q): Keys %v and %v, paths %q and %q", p, a.Key(), b.Key(), a.Path(), b.Path())
		}
	}
	var z Inode
	if z.Key() != (Key{}) || z.Dir() != "" || z.Path() != "" {
		t.Errorf("zero Inode: Key %v, Dir %q, Path %q", z.Key(), z.Dir(), z.Path())
	}
}
