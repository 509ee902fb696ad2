package inode

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testwait"
)

func key(t *testing.T, p string) Key {
	t.Helper()
	k, _, err := Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestOpenRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// A directory symlink in the middle of a path must not be followed either.
	if err := os.Symlink(filepath.Dir(secret), filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := (OS{}).Open(fifo, Key{}); !errors.Is(err, ErrNotRegular) {
			t.Errorf("fifo: err = %v, want ErrNotRegular", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("opening a FIFO blocked")
	}
	// O_PATH|O_NOFOLLOW opens the link itself, which fstat shows is no
	// regular file: the target is never reached.
	if _, err := (OS{}).Open(link, Key{}); !errors.Is(err, ErrNotRegular) {
		t.Errorf("symlink: err = %v, want ErrNotRegular", err)
	}
	if _, err := (OS{}).Open(filepath.Join(dir, "dirlink", "secret"), Key{}); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("path through a symlinked dir: err = %v, want ELOOP", err)
	}
	if _, err := (OS{}).Open(sub, Key{}); !errors.Is(err, ErrNotRegular) {
		t.Errorf("dir: err = %v, want ErrNotRegular", err)
	}
	if _, err := (OS{}).Open(filepath.Join(dir, "missing"), Key{}); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("missing: err = %v, want ENOENT", err)
	}
}

func TestOpenDetectsReplacement(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := key(t, p)
	tmp := filepath.Join(dir, "f.tmp")
	if err := os.WriteFile(tmp, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	_, err := (OS{}).Open(p, old)
	if !errors.Is(err, ErrReplaced) || !errors.Is(err, syscall.ESTALE) {
		t.Fatalf("err = %v, want ErrReplaced wrapping ESTALE", err)
	}
	f, err := (OS{}).Open(p, key(t, p))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// TestWritebackSyscalls checks cachestat, sync_file_range and fdatasync on
// the file system under t.TempDir: dirty pages are seen, and after a started
// writeback they drain to zero.
func TestWritebackSyscalls(t *testing.T) {
	p := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := (OS{}).Open(p, key(t, p))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if size, err := f.Size(); err != nil || size != 1<<20 {
		t.Fatalf("size %d, %v", size, err)
	}
	dirty, _, err := f.Cachestat(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if dirty == 0 {
		t.Fatal("precondition: the file is clean right after it was written (the host's flusher wrote it first, under memory pressure?)")
	}
	if err := f.StartWriteback(0, 0); err != nil {
		t.Fatal(err)
	}
	var d, wb uint64
	clean := testwait.Poll(30*time.Second, func() bool {
		d, wb, err = f.Cachestat(0, 0)
		return err != nil || d == 0 && wb == 0
	})
	if err != nil {
		t.Fatal(err)
	}
	if !clean {
		t.Fatalf("still dirty=%d writeback=%d", d, wb)
	}
	if err := f.DataSync(); err != nil {
		t.Fatal(err)
	}
}

func TestInodePath(t *testing.T) {
	for _, p := range []string{"/a/b/c", "/top", "/a/b c (deleted)/d"} {
		var in Inode
		in.SetPath(p)
		if in.Path() != p || !in.HasPath(p) || in.HasPath(p+"x") || in.HasPath("/other"+p) {
			t.Errorf("%q: Path %q, HasPath wrong", p, in.Path())
		}
	}
	var in Inode
	in.SetPath("/a/b/c")
	for dir, want := range map[string]bool{"/a": true, "/a/b": true, "/": true, "/a/b/c": false, "/a/bb": false} {
		if in.InDir(dir) != want {
			t.Errorf("InDir(%q) = %v, want %v", dir, !want, want)
		}
	}
}
