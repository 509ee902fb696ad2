package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
)

// TestSymlinkSwapped: on a loop-mounted ext4, a directory of a tree and a
// file of it are each swapped, over and over, with a symlink to a
// directory (a file) outside the tree (renameat2(RENAME_EXCHANGE)), while
// the directory's file is written, subdirectories with files appear in
// it and, under the same names, outside, and the outside files are
// written too. The daemon must watch and mark nothing outside (its
// inotify and fanotify instances' fdinfo) and write back nothing outside
// (every outside file stays dirty, under a kernel expiry of 30 s), while
// the tree's own files, under whichever name they have at the end, are
// written back within the bound. Both backends.
func TestSymlinkSwapped(t *testing.T) {
	testfs.SkipShort(t, "the daemon on a tree whose entries are swapped with symlinks, on loop-mounted ext4")
	if kernelDirtyExpire(t) < 20*time.Second {
		t.Skip("vm.dirty_expire_centisecs is under 20 s: the kernel's flusher would write the outside files during the check")
	}
	forBackends(t, []string{"inotify", "fanotify"}, testSymlinkSwapped, "d")
}

func testSymlinkSwapped(t *testing.T, backend string, mnt *testfs.FS, tree string) {
	outside := filepath.Join(mnt.Dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	d, l := filepath.Join(tree, "d"), filepath.Join(tree, "l")
	g, gl := filepath.Join(tree, "g"), filepath.Join(tree, "gl")
	secret := filepath.Join(outside, "g")
	writeDirty(t, g, 16<<10)
	writeDirty(t, filepath.Join(d, "f"), 16<<10)
	if err := os.Symlink(outside, l); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, gl); err != nil {
		t.Fatal(err)
	}
	dm := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "1s"
[watcher]
backend = %q
[[watch]]
path = %q
`, backend, tree))
	bound := time.Second + 200*time.Millisecond + 1500*time.Millisecond

	open := func(p string, flags int) int {
		fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	dfd, ofd := open(d, unix.O_RDONLY|unix.O_DIRECTORY), open(outside, unix.O_RDONLY|unix.O_DIRECTORY)
	ffd, gfd := open(filepath.Join(d, "f"), unix.O_WRONLY|unix.O_APPEND), open(g, unix.O_WRONLY|unix.O_APPEND)
	var outsideFiles []string
	var outsideIno = map[uint64]string{}
	var st unix.Stat_t
	if err := unix.Fstat(ofd, &st); err != nil {
		t.Fatal(err)
	}
	outsideIno[st.Ino] = outside
	dev := st.Dev
	made := func(dir int, path, name string, file, out bool) {
		if file {
			fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Write(fd, make([]byte, 8192))
			unix.Fstat(fd, &st)
			unix.Close(fd)
		} else {
			if err := unix.Mkdirat(dir, name, 0o755); err != nil {
				t.Fatal(err)
			}
			unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		}
		if out {
			outsideIno[st.Ino] = filepath.Join(path, name)
			if file {
				outsideFiles = append(outsideFiles, filepath.Join(path, name))
			}
		}
	}
	made(ofd, outside, "f", true, true) // outside/f, as the tree's d/f
	made(ofd, outside, "g", true, true) // the secret, behind gl

	// Nothing outside is watched or marked, at any time: the daemon's
	// fdinfo is looked at during the swaps and after.
	landed := map[string]string{}
	var marks map[testfs.Marked]string
	landedOutside := func() {
		var err error
		if marks, err = testfs.MarkedInodes(dm.pid()); err != nil {
			t.Fatal(err)
		}
		for m, kind := range marks {
			if p, ok := outsideIno[m.Ino]; ok && m.Dev == testfs.KernelDev(dev) {
				landed[p] = kind
			}
		}
	}

	stopSwaps := testfs.Exchange(t, 100*time.Microsecond, 8, [2]string{d, l}, [2]string{g, gl})
	for i := range 300 {
		name := "s" + strconv.Itoa(i)
		made(ofd, outside, name, false, true)
		made(dfd, d, name, false, false)
		sfd, err := unix.Openat(ofd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		made(sfd, filepath.Join(outside, name), "f", true, true)
		unix.Close(sfd)
		sfd, err = unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		made(sfd, filepath.Join(d, name), "f", true, false)
		unix.Close(sfd)
		// The tree's files, and the outside ones of the same names.
		for _, fd := range []int{ffd, gfd} {
			unix.Write(fd, make([]byte, 4096))
		}
		for _, p := range []string{filepath.Join(outside, "f"), secret} {
			appendDirty(t, p, 4096)
		}
		if i%10 == 0 {
			time.Sleep(5 * time.Millisecond) // let the daemon read events mid-swap
			landedOutside()
		}
	}
	swaps := stopSwaps()
	ended := time.Now()
	if swaps < 100 {
		t.Fatalf("only %d swaps: the race was not exercised", swaps)
	}

	// The tree's files, under their names now, are written back.
	var tracked []string
	for _, p := range []string{d, l} {
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			tracked = append(tracked, filepath.Join(p, "f"), filepath.Join(p, "s299", "f"))
		}
	}
	for _, p := range []string{g, gl} {
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			tracked = append(tracked, p)
		}
	}
	if len(tracked) != 3 {
		t.Fatalf("the tree's own directory and file were not found at the end: %q", tracked)
	}
	for _, p := range tracked {
		if ok, dirty, wb, err := cleanWithin(p, bound+2*time.Second); !ok {
			t.Errorf("%s, the tree's own file, not written back within %v of the swaps' end (dirty=%d writeback=%d err=%v)", p, bound+2*time.Second, dirty, wb, err)
		}
	}
	landedOutside()
	if len(landed) > 0 {
		t.Errorf("the daemon had a watch or mark on %d directories or files outside the tree: %v", len(landed), landed)
	}
	// Nothing outside is written back: each outside file stays dirty for
	// the bound after the last swap (the kernel's flusher waits 30 s).
	time.Sleep(time.Until(ended.Add(bound)))
	written := 0
	for _, p := range outsideFiles {
		if dirty, _, err := cachestat(p, 0, 0); err != nil || dirty == 0 {
			written++
			if written <= 5 {
				t.Errorf("%s, outside the tree, was written back (dirty=%d, err=%v)", p, dirty, err)
			}
		}
	}
	t.Logf("%d swaps; %d watches and marks of the daemon; %d outside files, %d written back", swaps, len(marks), len(outsideFiles), written)
	dm.stop(t)
}
