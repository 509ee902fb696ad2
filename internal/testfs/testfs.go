// Package testfs gives tests a real, loop-mounted filesystem (ext4 or xfs)
// and always tears it down again.
//
// Mount needs root. It creates a sparse image file in t.TempDir(), runs
// mkfs on it, attaches it to a free loop device with
// "losetup --find --show" (find+attach is atomic in util-linux, so parallel
// tests do not collide) and mounts it with mount(2). A t.Cleanup registered
// before anything is attached undoes exactly those steps in reverse order,
// even if the test fails or Mount itself fails half-way.
package testfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testwait"
)

// T is what Mount needs of its caller: a *testing.T or *testing.B, or the
// runner of New for programs that are not tests (the bench).
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Missing reports that something a test needs (a tool, a device, a kernel
// feature) is not there. Under CI (CI=true) as root it fails the test,
// naming what is missing, since CI installs everything the tests need and
// a skip there would hide a check that never ran; elsewhere it skips.
func Missing(t T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" && os.Geteuid() == 0 {
		t.Fatalf("missing under CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// SkipShort skips a slow test in the short lane (go test -short), saying
// why it is slow. The full lane (no -short) runs it; unlike Missing, this
// skip hides nothing under CI, which runs both lanes.
func SkipShort(t T, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("slow, left to the full lane (skipped with -short): %s", why)
	}
}

// Options selects the filesystem to create.
type Options struct {
	Type     string // "ext4" (default), "xfs" or "btrfs"
	SizeMB   int    // image size, default 256 (300 for xfs, the mkfs.xfs minimum)
	DirectIO bool   // losetup --direct-io=on (so "written back" reaches the image file, not only the host page cache)
	// ImageDir, when set, is the directory the image file is made in
	// (a slow filesystem under the loop device, such as a paced faultfs);
	// the image is removed at cleanup, after the detach. Default: the
	// test's temporary directory.
	ImageDir string
	// MkfsArgs are added to mkfs's arguments (e.g. "-N", "100000" for
	// ext4's inode count).
	MkfsArgs []string
	// Data is mount(2)'s data: the filesystem's options (e.g.
	// "barrier=0").
	Data string
	// Allocated writes the whole image (zeros, then fsync) before mkfs,
	// and keeps mkfs from discarding it: every block of the image is then
	// allocated in the host filesystem, as a disk's are, and a direct-I/O
	// write through the loop device is a plain overwrite there, not an
	// allocation that the next cache flush (an fsync of the image) must
	// commit. ext4 only.
	Allocated bool
}

// FS is a mounted test filesystem.
type FS struct {
	Dir    string // mount point
	Device string // e.g. /dev/loop3
	Image  string // backing file path
	Dev    uint64 // st_dev of the mounted root (unix.Mkdev form, as in Stat_t.Dev)
	MajMin string // "7:3"

	fstype string
	td     *teardown
	r      *runner // set by New
}

const (
	defaultSizeMB    = 256
	defaultXFSSizeMB = 300 // mkfs.xfs >= 5.19 refuses anything smaller

	// How long cleanup keeps retrying a umount that fails with EBUSY
	// before falling back to a lazy (MNT_DETACH) umount.
	umountRetryBudget = time.Second
	// How long cleanup waits for a detached loop device to let go of the image.
	detachWait = 2 * time.Second
)

// teardown records what Mount has done so far, so cleanup undoes exactly that.
type teardown struct {
	image       string
	dir         string
	attachTried bool   // losetup was run (it may have attached even if it failed)
	device      string // loop device we attached, once known
	mounted     bool   // mount(2) succeeded
	lazy        bool   // cleanup had to fall back to MNT_DETACH
}

// Mount creates an image in t.TempDir(), makes the filesystem, attaches a
// loop device and mounts it. It skips the test when not running as root or
// when the needed tools (mkfs.<type>, losetup) are missing, or when
// DirectIO was requested but the loop driver would not enable it.
func Mount(t T, opt Options) *FS {
	t.Helper()

	if euid := os.Geteuid(); euid != 0 {
		t.Skipf("testfs: needs root to attach loop devices and mount (euid=%d)", euid)
	}
	typ, mkfsArgs, size := mkfsFor(t, opt)
	mkfs, err := exec.LookPath("mkfs." + typ)
	if err != nil {
		Missing(t, "testfs: cannot make a %s filesystem: mkfs.%s not found (%v)", typ, typ, err)
	}
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		Missing(t, "testfs: losetup (util-linux) not found: %v", err)
	}

	// The lock's cleanup is registered first, so it runs last: after the
	// umount and detach (cleanups run last-in, first-out).
	HoldMounts(t)
	// TempDir registers its RemoveAll cleanup before ours, so it runs after
	// the umount/detach below.
	base := t.TempDir()
	td := &teardown{
		image: filepath.Join(base, typ+".img"),
		dir:   filepath.Join(base, "mnt"),
	}
	if opt.ImageDir != "" {
		td.image = filepath.Join(opt.ImageDir, filepath.Base(base)+"-"+typ+".img")
		t.Cleanup(func() {
			if err := os.Remove(td.image); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("testfs: remove image %s: %v", td.image, err)
			}
		})
	}
	t.Cleanup(func() { td.run(t) })

	if opt.Allocated {
		if typ != "ext4" {
			t.Fatalf("testfs: Allocated is for ext4 images, not %s", typ)
		}
		mkfsArgs[len(mkfsArgs)-1] += ",nodiscard" // ext4's last argument is -E's list
	}
	makeImage(t, td.image, size, opt.Allocated, mkfs, append(mkfsArgs, opt.MkfsArgs...))
	attach(t, td, losetup, opt.DirectIO)
	st := mountAt(t, td, typ, opt.Data)
	return &FS{
		Dir:    td.dir,
		Device: td.device,
		Image:  td.image,
		Dev:    uint64(st.Dev),
		MajMin: fmt.Sprintf("%d:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev))),
		fstype: typ,
		td:     td,
	}
}

// mkfsFor returns the filesystem type of opt (ext4 by default), its mkfs
// arguments and the image's size in MiB.
func mkfsFor(t T, opt Options) (typ string, args []string, size int) {
	t.Helper()
	typ, size = opt.Type, opt.SizeMB
	if typ == "" {
		typ = "ext4"
	}
	switch typ {
	case "ext4":
		// Initialise inode tables and the journal now, so that the
		// ext4lazyinit thread does not write in the background during tests.
		args = []string{"-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"}
		if size == 0 {
			size = defaultSizeMB
		}
	case "xfs":
		args = []string{"-q", "-f"}
		if size == 0 {
			size = defaultXFSSizeMB
		}
	case "btrfs":
		args = []string{"-q", "-f"}
		if size == 0 {
			size = defaultSizeMB
		}
	default:
		t.Fatalf("testfs: unsupported filesystem type %q (want \"ext4\", \"xfs\" or \"btrfs\")", typ)
	}
	if size < 0 {
		t.Fatalf("testfs: negative SizeMB %d", size)
	}
	return typ, args, size
}

// makeImage creates image, sizeMB MiB (written with zeros and synced if
// allocated, sparse if not), and makes a filesystem on it.
func makeImage(t T, image string, sizeMB int, allocated bool, mkfs string, args []string) {
	t.Helper()
	img, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatalf("testfs: create image: %v", err)
	}
	if allocated {
		err = fillZeros(img, int64(sizeMB)<<20)
	} else {
		err = img.Truncate(int64(sizeMB) << 20)
	}
	if cerr := img.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("testfs: size image %s to %d MiB: %v", image, sizeMB, err)
	}
	if out, err := exec.Command(mkfs, append(args, image)...).CombinedOutput(); err != nil {
		t.Fatalf("testfs: %s %s %s: %v\n%s", mkfs, strings.Join(args, " "), image, err, out)
	}
}

// fillZeros writes size bytes of zeros to f from offset 0 and syncs it,
// with O_DIRECT where the host filesystem takes it: buffered, the
// gigabytes written would be the host disk's recent writeout, and the
// kernel, which shares a device's background threshold among devices by
// their recent writeout (wb_calc_thresh), would give the loop device a
// small share for the next seconds and write a burst on it back itself.
func fillZeros(f *os.File, size int64) error {
	const chunk = 8 << 20
	fd, err := unix.Open(f.Name(), unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil || size%4096 != 0 {
		return fillZerosBuffered(f, size)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS) // page-aligned
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	for off := int64(0); off < size; {
		n, err := unix.Pwrite(fd, buf[:min(int64(chunk), size-off)], off)
		if err != nil {
			return err
		}
		off += int64(n)
	}
	return unix.Fsync(fd)
}

// fillZerosBuffered is fillZeros through the page cache.
func fillZerosBuffered(f *os.File, size int64) error {
	buf := make([]byte, 8<<20)
	for off := int64(0); off < size; {
		n, err := f.WriteAt(buf[:min(int64(len(buf)), size-off)], off)
		if err != nil {
			return err
		}
		off += int64(n)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	// Written and synced: the host's cache of it is of no further use.
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// attach attaches td's image to a free loop device (with direct I/O if
// asked, which must then be on) and records it in td, for the teardown,
// as soon as it is known.
func attach(t T, td *teardown, losetup string, directIO bool) {
	t.Helper()
	image := td.image
	loArgs := []string{"--find", "--show"}
	if directIO {
		loArgs = append(loArgs, "--direct-io=on")
	}
	loArgs = append(loArgs, image)
	td.attachTried = true
	var stderr bytes.Buffer
	cmd := exec.Command(losetup, loArgs...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	dev := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(dev, "/dev/loop") || strings.ContainsAny(dev, " \n") {
		t.Fatalf("testfs: losetup %s: err=%v stdout=%q stderr=%q", strings.Join(loArgs, " "), err, out, stderr.String())
	}
	td.device = dev
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("testfs: losetup: %s", s)
	}
	if got, err := backingFile(dev); err != nil || got != image {
		t.Fatalf("testfs: %s: backing file %q (err %v), want %q", dev, got, err, image)
	}
	if directIO {
		dio, err := os.ReadFile(filepath.Join(sysLoopDir(dev), "dio"))
		if err != nil {
			t.Fatalf("testfs: %s: reading dio state: %v", dev, err)
		}
		if strings.TrimSpace(string(dio)) != "1" {
			Missing(t, "testfs: %s: direct I/O requested but the loop driver did not enable it (backing filesystem of %s lacks O_DIRECT support?)", dev, image)
		}
	}
}

// mountAt mounts td's device on td.dir, marks the device autoclear, and
// returns the mounted root's stat, checked to be on the device.
func mountAt(t T, td *teardown, typ, data string) unix.Stat_t {
	t.Helper()
	dev := td.device
	if err := os.Mkdir(td.dir, 0o755); err != nil {
		t.Fatalf("testfs: mkdir mount point: %v", err)
	}
	if err := unix.Mount(dev, td.dir, typ, 0, data); err != nil {
		t.Fatalf("testfs: mount -t %s -o %q %s %s: %v", typ, data, dev, td.dir, err)
	}
	td.mounted = true

	// Now that the filesystem holds the device open, mark it autoclear, so
	// that the kernel detaches it by itself as soon as the filesystem is
	// released. This covers what t.Cleanup cannot: if the test binary dies
	// (test timeout panic, SIGKILL) the mount is left behind, but unmounting
	// it by hand then also frees the loop device. Cleanup still detaches
	// explicitly and checks.
	if err := setAutoclear(dev); err != nil {
		t.Fatalf("testfs: %s: set autoclear: %v", dev, err)
	}

	var st, dst unix.Stat_t
	if err := unix.Stat(td.dir, &st); err != nil {
		t.Fatalf("testfs: stat %s: %v", td.dir, err)
	}
	if err := unix.Stat(dev, &dst); err != nil {
		t.Fatalf("testfs: stat %s: %v", dev, err)
	}
	// btrfs gives its trees anonymous device numbers (0:N), not the
	// block device's.
	if typ != "btrfs" && uint64(st.Dev) != uint64(dst.Rdev) {
		t.Fatalf("testfs: %s: st_dev %d:%d of mounted root is not the loop device %s (%d:%d)",
			td.dir, unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)),
			dev, unix.Major(uint64(dst.Rdev)), unix.Minor(uint64(dst.Rdev)))
	}
	return st
}

// Unmount unmounts the filesystem before the test ends, retrying for a
// while (umountRetryBudget) if it is busy. On success the cleanup skips
// the umount; the loop device, marked autoclear, detaches by itself once
// the filesystem is released, and cleanup still checks that it did. On
// failure (e.g. EBUSY: something still holds a file open on it) the
// filesystem stays mounted and cleanup unmounts it as usual. It is not
// safe for concurrent use with itself or the cleanup.
func (f *FS) Unmount() error {
	if !f.td.mounted {
		return fmt.Errorf("testfs: umount %s: already unmounted", f.Dir)
	}
	if err := umountRetry(f.Dir); err != nil {
		return fmt.Errorf("testfs: umount %s: %w", f.Dir, err)
	}
	f.td.mounted = false
	return nil
}

// UnmountLazy detaches the filesystem from its mount point at once
// (umount -l, MNT_DETACH): it lives on until its last user lets go, then
// the loop device, marked autoclear, detaches (Attached). Cleanup skips the
// umount and still checks the detach.
func (f *FS) UnmountLazy() error {
	if !f.td.mounted {
		return fmt.Errorf("testfs: umount -l %s: already unmounted", f.Dir)
	}
	if err := unix.Unmount(f.Dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("testfs: umount -l %s: %w", f.Dir, err)
	}
	f.td.mounted = false
	return nil
}

// Attached reports whether the loop device still holds the image: after
// an unmount, until the filesystem's last user has let go.
func (f *FS) Attached() bool {
	bf, err := backingFile(f.Device)
	return err == nil && bf == f.Image
}

// RemountRO remounts the filesystem read-only (mount -o remount,ro).
// It fails the test if the kernel refuses, e.g. with EBUSY while a file is
// open for writing.
func (f *FS) RemountRO(t T) {
	t.Helper()
	if err := unix.Mount(f.Device, f.Dir, f.fstype, unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("testfs: remount,ro %s: %v", f.Dir, err)
	}
}

// RemountRW remounts the filesystem read-write (mount -o remount,rw).
func (f *FS) RemountRW(t T) {
	t.Helper()
	if err := unix.Mount(f.Device, f.Dir, f.fstype, unix.MS_REMOUNT, ""); err != nil {
		t.Fatalf("testfs: remount,rw %s: %v", f.Dir, err)
	}
}

// DropCaches syncs this filesystem (syncfs(2)) and then writes 3 to
// /proc/sys/vm/drop_caches, dropping clean page cache, dentries and inodes
// system-wide. Meant for benchmarks that want cold-cache runs. It skips the
// test if /proc/sys/vm/drop_caches is not writable (e.g. in a container).
func (f *FS) DropCaches(t T) {
	t.Helper()
	fd, err := unix.Open(f.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("testfs: open %s: %v", f.Dir, err)
	}
	err = unix.Syncfs(fd)
	unix.Close(fd)
	if err != nil {
		t.Fatalf("testfs: syncfs %s: %v", f.Dir, err)
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		if errors.Is(err, unix.EROFS) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			t.Skipf("testfs: cannot drop caches: %v", err)
		}
		t.Fatalf("testfs: drop caches: %v", err)
	}
}

// run undoes what Mount did: umount, then detach the loop device.
func (td *teardown) run(t T) {
	t.Helper()
	if td.mounted {
		td.unmount(t)
	}
	if td.attachTried {
		td.detach(t)
	}
}

// umountRetry unmounts dir, retrying on EBUSY for umountRetryBudget.
// UnmountRetry unmounts dir, retrying for a second while it is busy
// (EBUSY) and at once after EINTR; it returns the last error.
func UnmountRetry(dir string) error {
	return umountRetry(dir)
}

func umountRetry(dir string) error {
	deadline := time.Now().Add(umountRetryBudget)
	delay := 5 * time.Millisecond
	for {
		err := unix.Unmount(dir, 0)
		if err == nil {
			return nil
		}
		if err == unix.EINTR {
			continue
		}
		if err != unix.EBUSY || time.Now().After(deadline) {
			return err
		}
		time.Sleep(delay)
		if delay < 200*time.Millisecond {
			delay *= 2
		}
	}
}

func (td *teardown) unmount(t T) {
	t.Helper()
	err := umountRetry(td.dir)
	if err == nil {
		return
	}
	if err == unix.EINVAL {
		// Not a mount point any more: the test unmounted it itself.
		t.Logf("testfs: %s was no longer mounted at cleanup", td.dir)
		return
	}
	if lerr := unix.Unmount(td.dir, unix.MNT_DETACH); lerr != nil {
		t.Errorf("testfs: umount %s: %v; lazy umount failed too: %v", td.dir, err, lerr)
		return
	}
	td.lazy = true
	t.Errorf("testfs: umount %s: %v (still busy after %v: a test left a file, cwd or process open on it); "+
		"fell back to lazy umount (MNT_DETACH), the filesystem lives on until its last user goes away",
		td.dir, err, umountRetryBudget)
}

func (td *teardown) detach(t T) {
	t.Helper()
	devs := []string{td.device}
	if td.device == "" {
		// losetup failed or its output was unusable, yet it may have attached
		// the image. The image path is unique to this test, so any device
		// backed by it is ours.
		devs = devicesFor(t, td.image)
	}
	for _, dev := range devs {
		if err := detachIfOurs(dev, td.image); err != nil {
			t.Errorf("testfs: detach %s (%s): %v", dev, td.image, err)
			continue
		}
		// LOOP_CLR_FD on a device that is still open (e.g. by a lazily
		// unmounted filesystem) only sets autoclear; check it really let go.
		if td.lazy {
			if bf, err := backingFile(dev); err == nil && bf == td.image {
				t.Logf("testfs: %s stays attached to %s (marked autoclear) until the lazily unmounted filesystem is released", dev, td.image)
			}
			continue
		}
		// Detached, and maybe already reused by someone else.
		detached := func() bool { bf, err := backingFile(dev); return err != nil || bf != td.image }
		if !testwait.Poll(detachWait, detached) {
			t.Errorf("testfs: %s is still attached to %s after detach; "+
				"it is marked autoclear and goes away once its last user closes it", dev, td.image)
		}
	}
}

// detachIfOurs detaches dev (LOOP_CLR_FD) if, and only if, it is backed by
// image. A device that is no longer bound, or bound to some other file
// (reused by a parallel test), is left alone.
func detachIfOurs(dev, image string) error {
	var ist unix.Stat_t
	if err := unix.Stat(image, &ist); err != nil {
		return fmt.Errorf("stat image: %w", err)
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err == unix.ENXIO {
		return nil // not bound any more
	}
	if err != nil {
		return fmt.Errorf("LOOP_GET_STATUS64: %w", err)
	}
	if info.Inode != ist.Ino || info.Device != uint64(ist.Dev) {
		return nil // bound to somebody else's file
	}
	for i := 0; ; i++ {
		err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		if err == nil || err == unix.ENXIO {
			return nil
		}
		if (err != unix.EBUSY && err != unix.EAGAIN) || i >= 20 {
			return fmt.Errorf("LOOP_CLR_FD: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func setAutoclear(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return fmt.Errorf("LOOP_GET_STATUS64: %w", err)
	}
	info.Flags |= unix.LO_FLAGS_AUTOCLEAR
	if err := unix.IoctlLoopSetStatus64(fd, info); err != nil {
		return fmt.Errorf("LOOP_SET_STATUS64: %w", err)
	}
	return nil
}

// devicesFor lists the loop devices backed by image, via losetup -j.
func devicesFor(t T, image string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "-n", "-O", "NAME", "-j", image).Output()
	if err != nil {
		t.Errorf("testfs: losetup -j %s: %v", image, err)
		return nil
	}
	return strings.Fields(string(out))
}

func sysLoopDir(dev string) string {
	return filepath.Join("/sys/block", filepath.Base(dev), "loop")
}

// backingFile returns the backing file of an attached loop device, or an
// error if it is not attached.
func backingFile(dev string) (string, error) {
	b, err := os.ReadFile(filepath.Join(sysLoopDir(dev), "backing_file"))
	if err != nil {
		return "", err
	}
	// The kernel appends " (deleted)" once the image has been unlinked.
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)"), nil
}
