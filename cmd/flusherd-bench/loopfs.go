package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
)

// benchFS makes and mounts a filesystem for the bench with testfs (the
// tests' own loop-mount helper); Close undoes it.
func benchFS(opt testfs.Options) (*testfs.FS, error) { return testfs.New(opt) }

// newBenchLoop makes an fstype filesystem of sizeMB with its image in base,
// with room for at least inodes files (0: mkfs's default), on a buffered
// loop device (no direct I/O: the bench never measures I/O, and what is
// written to the image stays in the host's page cache and is dropped with
// the image), with testfs. On error nothing is left behind.
func newBenchLoop(base, fstype string, sizeMB int64, inodes int) (*testfs.FS, error) {
	opt := testfs.Options{Type: fstype, SizeMB: int(sizeMB), ImageDir: base}
	if fstype == "ext4" {
		opt.MkfsArgs = []string{"-m", "0"}
		if inodes > 0 {
			opt.MkfsArgs = append(opt.MkfsArgs, "-N", strconv.Itoa(inodes))
		}
		// No cache flushes: nothing here needs durability, and a flush
		// on a buffered loop device is an fsync of the image.
		opt.Data = "barrier=0"
	}
	return testfs.New(opt)
}

// closeFS unmounts a bench filesystem and reports what went wrong.
func closeFS(fs *testfs.FS, who string) {
	if err := fs.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "flusherd-bench %s: %v\n", who, err)
	}
}

// syncAndDrop cleans the filesystem and drops the page cache.
func syncAndDrop(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	unix.Syncfs(fd)
	unix.Close(fd)
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}

func syncfs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}
