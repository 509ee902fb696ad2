package faultfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDirtyPagesAndFaults: writes through the mount leave dirty pages
// (writeback cache), sync_file_range cleans them, and injected faults reach
// open(2) and fdatasync(2) as errnos.
func TestDirtyPagesAndFaults(t *testing.T) {
	f := MountT(t)
	p := filepath.Join(f.Dir, "a")
	w, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(w.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
		t.Fatal(err)
	}
	if cs.Dirty == 0 {
		t.Fatalf("no dirty pages after a write through the mount: %+v (writeback cache off?)", cs)
	}
	f.Set(Faults{OpenErr: syscall.EAGAIN, FsyncErr: syscall.EIO})
	if _, err := os.Open(p); !errors.Is(err, syscall.EAGAIN) {
		t.Errorf("open with OpenErr=EAGAIN: %v", err)
	}
	if err := unix.Fdatasync(int(w.Fd())); !errors.Is(err, syscall.EIO) {
		t.Errorf("fdatasync with FsyncErr=EIO: %v", err)
	}
	f.Set(Faults{})
	if err := unix.SyncFileRange(int(w.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER); err != nil {
		t.Fatal(err)
	}
	if err := unix.Cachestat(uint(w.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
		t.Fatal(err)
	}
	if cs.Dirty != 0 || cs.Writeback != 0 {
		t.Errorf("after sync_file_range: %+v", cs)
	}
	if f.Count("open") == 0 || f.Count("fsync") == 0 {
		t.Errorf("counts: open %d fsync %d", f.Count("open"), f.Count("fsync"))
	}
}

// TestAbort: a call waiting on a server that never answers (an fdatasync
// stalled for an hour) fails once the connection is aborted, and the
// mount's cleanup still takes it down.
func TestAbort(t *testing.T) {
	f := MountT(t)
	w, err := os.Create(filepath.Join(f.Dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	f.Set(Faults{FsyncDelay: time.Hour})
	done := make(chan error, 1)
	go func() { done <- unix.Fdatasync(int(w.Fd())) }()
	select {
	case err := <-done:
		t.Fatalf("fdatasync returned (%v) before the abort; the stall did not hold it", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := f.Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("fdatasync succeeded on an aborted connection")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("fdatasync still waiting 10 s after the abort")
	}
}
