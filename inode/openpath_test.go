package inode

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// refuseOpenat2 makes openat2 answer ENOSYS, as systemd's
// RestrictSUIDSGID=yes seccomp filter does, until the test ends.
func refuseOpenat2(t *testing.T) {
	t.Helper()
	calls := 0
	openat2 = func(int, string, *unix.OpenHow) (int, error) {
		calls++
		return -1, unix.ENOSYS
	}
	openat2State.Store(0)
	t.Cleanup(func() {
		openat2 = unix.Openat2
		openat2State.Store(0)
		if calls != 1 {
			t.Errorf("openat2 tried %d times after ENOSYS, want once", calls)
		}
	})
}

// TestOpenPath checks that openat2 and the walk that replaces it where
// openat2 is refused agree on every kind of path: same inode opened, same
// errno refused.
func TestOpenPath(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "a", "b", "f"), []byte("x"), 0o644))
	must(os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "dirlink")))
	must(os.Symlink(filepath.Join(dir, "a", "b", "f"), filepath.Join(dir, "filelink")))
	must(os.Symlink("/etc", filepath.Join(dir, "a", "out")))
	must(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	t.Chdir(dir)

	cases := []struct {
		name, path string
		want       error // nil: opened
	}{
		{"regular file", filepath.Join(dir, "a", "b", "f"), nil},
		{"directory", filepath.Join(dir, "a", "b"), nil},
		{"directory, trailing slash", filepath.Join(dir, "a") + "/", nil},
		{"root", "/", nil},
		{"relative", "a/b/f", nil},
		{"relative with dot-dot", "a/b/../b/f", nil},
		{"FIFO (O_PATH, no block)", filepath.Join(dir, "fifo"), nil},
		{"symlink last (the link itself)", filepath.Join(dir, "filelink"), nil},
		{"symlink in the middle", filepath.Join(dir, "dirlink", "b", "f"), syscall.ELOOP},
		{"symlink out of the tree", filepath.Join(dir, "a", "out", "passwd"), syscall.ELOOP},
		{"symlink with trailing slash", filepath.Join(dir, "dirlink") + "/", syscall.ELOOP},
		{"missing", filepath.Join(dir, "a", "nope"), syscall.ENOENT},
		{"file as a directory", filepath.Join(dir, "a", "b", "f", "x"), syscall.ENOTDIR},
		{"empty", "", syscall.ENOENT},
		{"dot", ".", nil},
		{"dot slash dot", ".//.", nil},
		{"longer than PATH_MAX", "/" + strings.Repeat("a/", unix.PathMax/2), syscall.ENAMETOOLONG},
	}
	for _, mode := range []string{"openat2", "walk"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "walk" {
				refuseOpenat2(t)
			}
			for _, c := range cases {
				fd, err := OpenPath(c.path)
				if c.want != nil {
					if !errors.Is(err, c.want) {
						t.Errorf("%s: OpenPath(%q) = %v, want %v", c.name, c.path, err, c.want)
					}
					if err == nil {
						unix.Close(fd)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: OpenPath(%q): %v", c.name, c.path, err)
					continue
				}
				var got, want unix.Stat_t
				if err := unix.Fstat(fd, &got); err != nil {
					t.Fatal(err)
				}
				unix.Close(fd)
				if err := unix.Lstat(c.path, &want); err != nil {
					t.Fatal(err)
				}
				if got.Dev != want.Dev || got.Ino != want.Ino {
					t.Errorf("%s: OpenPath(%q) opened inode %d, want %d", c.name, c.path, got.Ino, want.Ino)
				}
			}
			wantProbe := error(nil)
			if mode == "walk" {
				wantProbe = unix.ENOSYS
			}
			if err := ProbeOpenat2(); !errors.Is(err, wantProbe) && err != wantProbe {
				t.Errorf("ProbeOpenat2() = %v, want %v", err, wantProbe)
			}
		})
	}
}

// TestOpenWithoutOpenat2 checks that the writeback open and the handle
// look-up work where openat2 is refused, and still refuse symlinks.
func TestOpenWithoutOpenat2(t *testing.T) {
	refuseOpenat2(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(p, filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	f, err := (OS{}).Open(p, Key{Dev: st.Dev, Ino: st.Ino})
	if err != nil {
		t.Fatalf("Open without openat2: %v", err)
	}
	if size, err := f.Size(); err != nil || size != 4 {
		t.Errorf("Size = %d, %v; want 4", size, err)
	}
	f.Close()
	if _, err := (OS{}).Open(filepath.Join(dir, "l"), Key{}); !errors.Is(err, ErrNotRegular) {
		t.Errorf("Open of a symlink without openat2: %v, want ErrNotRegular", err)
	}
	if _, err := (OS{}).Open(filepath.Join(dir, "l", "x"), Key{}); !errors.Is(err, syscall.ELOOP) && !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("Open through a symlink without openat2: %v, want ELOOP", err)
	}
	got, err := StatPath(p)
	if err != nil || got.Ino != st.Ino {
		t.Errorf("StatPath = ino %d, %v; want %d", got.Ino, err, st.Ino)
	}
}

// TestStatOpenDirNoSymlinks: Stat and OpenDir, with openat2 and without,
// refuse a path through a symlink (a directory swapped for one) with
// ELOOP; Stat of a symlink is the symlink's, OpenDir of one is refused.
func TestStatOpenDirNoSymlinks(t *testing.T) {
	for _, withOpenat2 := range []bool{true, false} {
		t.Run(map[bool]string{true: "openat2", false: "walk"}[withOpenat2], func(t *testing.T) {
			if !withOpenat2 {
				refuseOpenat2(t)
			}
			dir := t.TempDir()
			outside := filepath.Join(dir, "outside")
			if err := os.MkdirAll(filepath.Join(outside, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, "f"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(dir, "d")
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			if _, _, err := Stat(filepath.Join(link, "f")); !errors.Is(err, unix.ELOOP) {
				t.Errorf("Stat through a symlinked directory: %v, want ELOOP", err)
			}
			var lst unix.Stat_t
			if err := unix.Lstat(link, &lst); err != nil {
				t.Fatal(err)
			}
			if key, regular, err := Stat(link); err != nil || regular || key != (Key{Dev: lst.Dev, Ino: lst.Ino}) {
				t.Errorf("Stat of a symlink: %v, %v, %v; want the symlink's own key, not regular", key, regular, err)
			}
			if fd, err := OpenDir(filepath.Join(link, "sub")); !errors.Is(err, unix.ELOOP) {
				unix.Close(fd)
				t.Errorf("OpenDir through a symlinked directory: %v, want ELOOP", err)
			}
			if fd, err := OpenDir(link); err == nil {
				unix.Close(fd)
				t.Error("OpenDir of a symlink to a directory opened it")
			}
			fd, err := OpenDir(outside)
			if err != nil {
				t.Fatalf("OpenDir of a directory: %v", err)
			}
			defer unix.Close(fd)
			if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_PATH != 0 {
				t.Errorf("OpenDir's descriptor: flags %#x, %v; want one opened for reading", fl, err)
			}
		})
	}
}
