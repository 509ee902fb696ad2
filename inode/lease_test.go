package inode

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHeldForWrite: a file is held for writing while a descriptor open
// for writing, or a shared writable mapping made from one and outliving
// it, exists; not while only readers hold it, nor once all are gone.
func TestHeldForWrite(t *testing.T) {
	p, key := leaseFile(t)
	want := func(step string, held bool) {
		t.Helper()
		got, err := HeldForWrite(p, key)
		if errors.Is(err, unix.EINVAL) {
			t.Skipf("no leases on the filesystem of %s: %v", p, err)
		}
		if err != nil || got != held {
			t.Fatalf("%s: HeldForWrite = %v, %v; want %v", step, got, err, held)
		}
	}
	want("nobody", false)
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	want("a reader", false)
	w, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	want("a writer and a reader", true)
	m, err := syscall.Mmap(int(w.Fd()), 0, 8192, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	r.Close()
	want("a shared mapping whose descriptor is closed", true)
	m[0] = 'x'
	if err := syscall.Munmap(m); err != nil {
		t.Fatal(err)
	}
	want("unmapped", false)
	if _, err := HeldForWrite(p, Key{Dev: key.Dev, Ino: key.Ino + 1}); !errors.Is(err, ErrReplaced) {
		t.Errorf("another identity: %v, want ErrReplaced", err)
	}
}

// BenchmarkHeldForWrite: a probe for writers (open, F_SETLEASE twice,
// close), side by side with the sweep's look (open, cachestat, close).
func BenchmarkHeldForWrite(b *testing.B) {
	p, key := leaseFile(b)
	b.Run("probe", func(b *testing.B) {
		for b.Loop() {
			if _, err := HeldForWrite(p, key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("look", func(b *testing.B) {
		for b.Loop() {
			f, err := OS{}.Open(p, key)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := f.Cachestat(0, 0); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
}

// leaseFile makes an 8 KiB file in a temporary directory and returns its
// path and key.
func leaseFile(tb testing.TB) (string, Key) {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 8192), 0o644); err != nil {
		tb.Fatal(err)
	}
	key, _, err := Stat(p)
	if err != nil {
		tb.Fatal(err)
	}
	return p, key
}
