package watch

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/testfs"
)

// TestWatchStaysInsideTree swaps a directory of a tree with a symlink to a
// directory outside it (renameat2 RENAME_EXCHANGE), over and over, while
// subdirectories appear in the tree's directory and in the outside one
// under the same names, and files are written in both: no watch or mark
// may land on a directory or file outside (the watches of this process's
// inotify and fanotify instances, from /proc/self/fdinfo), no file
// outside may be reported, and the tree's directory stays served.
func TestWatchStaysInsideTree(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { testWatchStaysInsideTree(t, b) })
	}
}

func testWatchStaysInsideTree(t *testing.T, backend string) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "tree"), filepath.Join(base, "outside")
	d, l := filepath.Join(root, "d"), filepath.Join(root, "l")
	for _, p := range []string{d, outside} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, l); err != nil {
		t.Fatal(err)
	}
	s := &keySink{sink: sink{seen: map[string]int{}}, keys: map[inode.Key]string{}}
	w := startWith(t, root, backend, s)

	// The tree's directory and the outside one, by descriptor: what is
	// made in each lands there whatever its name leads to.
	dfd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	ofd, err := unix.Open(outside, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ofd)
	var st unix.Stat_t
	if err := unix.Fstat(ofd, &st); err != nil {
		t.Fatal(err)
	}
	dev := st.Dev
	outsideInos := map[uint64]string{st.Ino: outside}
	var mu sync.Mutex // guards outsideInos
	mkdirWrite := func(dir int, name string) (dirIno, fileIno uint64) {
		if err := unix.Mkdirat(dir, name, 0o755); err != nil {
			t.Error(err)
			return
		}
		var st unix.Stat_t
		unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		dirIno = st.Ino
		fd, err := unix.Openat(dir, name+"/f", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Error(err)
			return
		}
		unix.Write(fd, make([]byte, 8192))
		unix.Fstat(fd, &st)
		unix.Close(fd)
		return dirIno, st.Ino
	}

	stopSwaps := testfs.Exchange(t, 50*time.Microsecond, 1, [2]string{d, l})
	const n = 200
	for i := range n {
		name := "s" + strconv.Itoa(i)
		// Outside first: the tree's event for the name finds a
		// directory of that name behind the symlink.
		od, of := mkdirWrite(ofd, name)
		mu.Lock()
		outsideInos[od], outsideInos[of] = filepath.Join(outside, name), filepath.Join(outside, name, "f")
		mu.Unlock()
		mkdirWrite(dfd, name)
		if i%20 == 0 {
			time.Sleep(time.Millisecond) // let the events be read mid-swap
		}
	}
	time.Sleep(200 * time.Millisecond)
	swaps := stopSwaps()
	if swaps < 100 {
		t.Fatalf("only %d swaps: the race was not exercised", swaps)
	}
	w.Quiesce(t.Context())

	marks, err := testfs.MarkedInodes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var landed []string
	for k, kind := range marks {
		if k.Dev != testfs.KernelDev(dev) {
			continue
		}
		if p, ok := outsideInos[k.Ino]; ok {
			landed = append(landed, fmt.Sprintf("%s (%s)", p, kind))
		}
	}
	if len(landed) > 0 {
		t.Errorf("%d of %d watches or marks of this process are outside the tree, e.g. %q", len(landed), len(marks), landed[:min(5, len(landed))])
	}
	s.mu.Lock()
	for k, p := range s.keys {
		if k.Dev == dev && outsideInos[k.Ino] != "" {
			t.Errorf("a file outside the tree (%s) was reported as %q", outsideInos[k.Ino], p)
		}
	}
	s.mu.Unlock()

	// The tree's directory, under whichever name it has now, is served.
	if err := unix.Mkdirat(dfd, "after", 0o755); err != nil {
		t.Fatal(err)
	}
	var after unix.Stat_t
	eventually(t, "a file written in a new directory of the swapped directory is reported", func() bool {
		fd, err := unix.Openat(dfd, "after/f", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		unix.Write(fd, []byte("x"))
		unix.Fstat(fd, &after)
		unix.Close(fd)
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.keys[inode.Key{Dev: after.Dev, Ino: after.Ino}]
		return ok
	})
	s.mu.Lock()
	t.Logf("%d swaps; %d watches and marks; %d keys reported", swaps, len(marks), len(s.keys))
	s.mu.Unlock()
}
