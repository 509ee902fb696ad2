package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// writeDirty writes n bytes to path without syncing, so they stay dirty.
func writeDirty(t *testing.T, path string, n int) {
	t.Helper()
	if err := os.WriteFile(path, make([]byte, n), 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitClean polls cachestat until path has no dirty or writeback pages, and
// returns how long that took; it fails the test after limit.
func waitClean(t *testing.T, path string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var d, wb uint64
	var err error
	clean := testwait.Poll(limit, func() bool {
		d, wb, err = cachestat(path, 0, 0)
		return err != nil || d == 0 && wb == 0
	})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("cachestat %q: %v", path, err)
	}
	if !clean {
		t.Fatalf("%q still has %d dirty, %d writeback pages after %v", path, d, wb, limit)
	}
	return took
}

// hostileEntries puts in tree a FIFO (no reader or writer), a listening
// unix socket (closed at cleanup), a character device node (1:3), a
// symlink "link" to a dirty file outside/secret, and a symlink "dirlink"
// to outside; it returns the secret file's path.
func hostileEntries(t *testing.T, tree, outside string) (secret string) {
	t.Helper()
	if err := unix.Mkfifo(filepath.Join(tree, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(tree, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := unix.Mknod(filepath.Join(tree, "null"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	secret = filepath.Join(outside, "secret")
	writeDirty(t, secret, 64<<10)
	if err := os.Symlink(secret, filepath.Join(tree, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(tree, "dirlink")); err != nil {
		t.Fatal(err)
	}
	return secret
}

// fifoWithWriter makes a FIFO at path with a writer blocked in open(2)
// until something opens it for reading (flusherd must never be that
// reader); the writer's open result arrives on the channel. The writer is
// released at cleanup, before the filesystem is unmounted.
func fifoWithWriter(t *testing.T, path string) <-chan error {
	t.Helper()
	if err := unix.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	writerDone := make(chan error, 1)
	released := make(chan error, 1)
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			<-released
			f.Close()
		}
	})
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		writerDone <- err
		released <- err
	}()
	return writerDone
}

// TestHostileTree: a watched tree holding a FIFO (with no reader or writer),
// a unix socket, a device node, a symlink to a dirty file outside the tree
// and a file name that is not UTF-8. The daemon must not hang, open or
// follow any of them, and still write back the regular files; the file
// outside the tree stays dirty. A file deleted while queued is dropped and
// counted.
func TestHostileTree(t *testing.T) {
	testfs.SkipShort(t, "the daemon on a hostile tree on loop-mounted ext4")
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 256})
	tree := filepath.Join(mnt.Dir, "tree")
	outside := filepath.Join(mnt.Dir, "outside")
	// A tree inside the tree whose files expire later: the file deleted
	// while queued must still be queued when the test, having seen it
	// on b_dirty, deletes it.
	slow := filepath.Join(tree, "slow")
	for _, d := range []string{tree, outside, slow} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Present before the daemon starts, so the start-up scan meets them.
	secret := hostileEntries(t, tree, outside)
	badName := filepath.Join(tree, "bad-\xff\xfe-name\n.bin")
	writeDirty(t, badName, 32<<10)

	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "1s"
[[watch]]
path = %q
[[watch]]
path = %q
expire = "4s"
`, tree, slow))
	bound := time.Second + 200*time.Millisecond + 1500*time.Millisecond

	// Created while running: a second symlink, a new FIFO with a writer
	// blocked in open, and writes through the first symlink.
	if err := os.Symlink(secret, filepath.Join(tree, "link2")); err != nil {
		t.Fatal(err)
	}
	fifo2 := filepath.Join(tree, "fifo2")
	writerDone := fifoWithWriter(t, fifo2)
	// Append (not truncate: ext4's auto_da_alloc starts writeback of a
	// file truncated to zero and rewritten, on close).
	lf, err := os.OpenFile(filepath.Join(tree, "link"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lf.WriteString("through the link"); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	linkWritten := time.Now()
	regular := filepath.Join(tree, "sub", "regular")
	if err := os.Mkdir(filepath.Dir(regular), 0o755); err != nil {
		t.Fatal(err)
	}
	writeDirty(t, regular, 128<<10)

	took := waitClean(t, regular, bound)
	t.Logf("regular file clean after %v", took)
	waitClean(t, badName, bound)

	// Give flusherd every chance to (wrongly) write the outside file.
	time.Sleep(time.Until(linkWritten.Add(bound)))
	// The outside file is not flusherd's: it is still dirty (the kernel's
	// own flusher waits vm.dirty_expire_centisecs, 30s by default).
	if dirty, _, err := cachestat(secret, 0, 0); err != nil || dirty == 0 {
		t.Errorf("file outside the tree was written back (dirty=%d, err=%v): a symlink was followed", dirty, err)
	}
	select {
	case err := <-writerDone:
		t.Errorf("the FIFO's writer was released (err=%v): something opened it for reading", err)
	default:
	}

	// A file deleted while queued: once the stats show it on b_dirty
	// (it expires 4s after the write), delete it.
	statsPath := d.devStats(mnt.MajMin)
	drained := func(s map[string]int64) bool {
		return s != nil && s["b_dirty"]+s["b_io"]+s["b_more_io"]+s["b_more_io_wait"] == 0
	}
	if !testwait.Poll(5*time.Second, func() bool { return drained(readStats(t, statsPath)) }) {
		t.Fatalf("lists did not drain: %v", readStats(t, statsPath))
	}
	doomed := filepath.Join(slow, "doomed")
	writeDirty(t, doomed, 16<<10)
	if !testwait.Poll(4*time.Second, func() bool { return readStats(t, statsPath)["b_dirty"] != 0 }) {
		t.Fatalf("the new file never showed on b_dirty: %v", readStats(t, statsPath))
	}
	if err := os.Remove(doomed); err != nil {
		t.Fatal(err)
	}
	var s map[string]int64
	if !testwait.Poll(8*time.Second, func() bool { s = readStats(t, statsPath); return s["inodes_gone"] >= 1 && drained(s) }) {
		t.Fatalf("want the deleted file counted in inodes_gone and the lists drained: %v", s)
	}
	d.stop(t)
}
